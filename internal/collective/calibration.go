package collective

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"

	"github.com/toposched/toposched/internal/topology"
)

// Calibration is a cost model fitted to a cluster's own measurements: the
// share of line rate each kind of link achieves there, in place of the
// documented defaults (the Eff* constants). It travels as a JSON file
// (toposched model calibrate writes it, model predict --calibration reads
// it).
type Calibration struct {
	Version    int                 `json:"version"`
	Name       string              `json:"name,omitempty"`
	Efficiency topology.Efficiency `json:"efficiency"`
	// Fits say what each efficiency came from.
	Fits []Fit `json:"fits,omitempty"`
}

// CalibrationVersion is the file format's version.
const CalibrationVersion = 1

// Fit is one kind of link's fitted efficiency and its evidence.
type Fit struct {
	Kind       string  `json:"kind"` // nvlink, nvls, pcie or net
	Efficiency float64 `json:"efficiency"`
	// Samples were the measurements bound by this kind of link; Ratio the
	// median of measured over predicted bus bandwidth before the fit.
	Samples int      `json:"samples"`
	Ratio   float64  `json:"ratio"`
	Sources []string `json:"sources"`
}

// Sample is one measurement to fit to: a collective on a placement, the
// algorithm NCCL ran (Auto: NCCL's own choice), the message size and the
// measured bus bandwidth, and where it was read (file:line).
type Sample struct {
	Placement  Placement
	Collective Collective
	Algorithm  Algorithm
	Bytes      float64
	BusBWGBps  float64
	Source     string
}

// FitMinBytes is the smallest message a bandwidth efficiency is fitted
// from: below it latency, not bandwidth, decides.
const FitMinBytes = 128 << 20

// Bandwidths returns base (nil: the defaults) with the calibration's
// efficiencies.
func (c *Calibration) Bandwidths(base *topology.Bandwidths) *topology.Bandwidths {
	bw := topology.DefaultBandwidths()
	if base != nil {
		cp := *base
		bw = &cp
	}
	if c != nil {
		bw.Efficiency = c.Efficiency
	}
	return bw
}

// Validate checks a calibration read from a file.
func (c *Calibration) Validate() error {
	var errs []error
	if c.Version != CalibrationVersion {
		errs = append(errs, fmt.Errorf("version %d: expected %d", c.Version, CalibrationVersion))
	}
	e := c.Efficiency
	for _, f := range []struct {
		name string
		v    float64
	}{{"nvlink", e.NVLink}, {"nvls", e.NVLS}, {"pcie", e.PCIe}, {"net", e.Net}} {
		if f.v < 0 || f.v > 1 || math.IsNaN(f.v) {
			errs = append(errs, fmt.Errorf("efficiency.%s = %g: expected a share of line rate, above 0 and at most 1 (0: the default)", f.name, f.v))
		}
	}
	if e.StepOverheadUS < 0 || e.StepOverheadUS > 1000 || math.IsNaN(e.StepOverheadUS) {
		errs = append(errs, fmt.Errorf("efficiency.step_overhead_us = %g: expected 0 to 1000", e.StepOverheadUS))
	}
	return errors.Join(errs...)
}

// ParseCalibration reads a calibration file; file names it in errors.
func ParseCalibration(file string, data []byte) (*Calibration, error) {
	var c Calibration
	d := json.NewDecoder(strings.NewReader(string(data)))
	d.DisallowUnknownFields()
	if err := d.Decode(&c); err != nil {
		var se *json.SyntaxError
		if errors.As(err, &se) {
			return nil, fmt.Errorf("%s:%d: %w", file, lineOf(data, se.Offset), err)
		}
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	if err := c.Validate(); err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	return &c, nil
}

func lineOf(data []byte, off int64) int {
	return 1 + strings.Count(string(data[:min(int(off), len(data))]), "\n")
}

// kindOf is the kind of link a bottleneck's name (LinkName) is, for an
// algorithm: nvlink, nvls, pcie or net.
func kindOf(bottleneck string, a Algorithm) string {
	prefix, _, _ := strings.Cut(bottleneck, ":")
	switch prefix {
	case "nvport":
		if a == NVLS {
			return "nvls"
		}
		return "nvlink"
	case "nvlink":
		return "nvlink"
	case "pcie", "smp":
		return "pcie"
	case "nic", "uplink":
		return "net"
	}
	return ""
}

// FitCalibration fits the efficiencies of the kinds of link the samples
// are bound by: each is scaled by the median of measured over predicted
// bus bandwidth of its samples of at least FitMinBytes, three times over
// (a fit can move the bottleneck). A kind no sample is bound by keeps the
// default. A measurement above what the links could carry at their line
// rate (efficiency 1) is refused, naming its source: it is not of this
// topology, or not a bus bandwidth.
func FitCalibration(name string, samples []Sample, base *topology.Bandwidths) (*Calibration, error) {
	line := (&Calibration{Efficiency: topology.Efficiency{NVLink: 1, NVLS: 1, PCIe: 1, Net: 1}}).Bandwidths(base)
	var large []Sample
	for _, s := range samples {
		if s.BusBWGBps <= 0 || s.Bytes <= 0 {
			return nil, fmt.Errorf("%s: busbw %g GB/s at %g bytes: expected positive values", s.Source, s.BusBWGBps, s.Bytes)
		}
		// The bound at any size: the bandwidth at line rate, latency
		// aside (a message so big that it does not count).
		bound := s
		bound.Bytes = 1 << 44
		r, err := predictWith(bound, line)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", s.Source, err)
		}
		if s.BusBWGBps > 1.02*r.BusBWGBps {
			return nil, fmt.Errorf("%s: busbw %.2f GB/s is above the %.2f GB/s the links could carry at line rate (%s): the measurement is not of this topology",
				s.Source, s.BusBWGBps, r.BusBWGBps, orWord(r.Bottleneck))
		}
		if s.Bytes >= FitMinBytes {
			large = append(large, s)
		}
	}
	if len(large) == 0 {
		return nil, fmt.Errorf("no measurement of %d bytes or more to fit bandwidth to (%d given)", int64(FitMinBytes), len(samples))
	}
	c := &Calibration{Version: CalibrationVersion, Name: name}
	eff := map[string]float64{"nvlink": EffNVLink, "nvls": EffNVLS, "pcie": EffPCIe, "net": EffNet}
	set := func() {
		c.Efficiency = topology.Efficiency{NVLink: eff["nvlink"], NVLS: eff["nvls"], PCIe: eff["pcie"], Net: eff["net"]}
	}
	set()
	var fits map[string]*Fit
	before := map[string]float64{} // each kind's median ratio at the defaults
	for range 3 {
		bw := c.Bandwidths(base)
		fits = map[string]*Fit{}
		ratios := map[string][]float64{}
		for _, s := range large {
			r, err := predictWith(s, bw)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", s.Source, err)
			}
			k := kindOf(r.Bottleneck, r.Algorithm)
			if k == "" || r.BusBWGBps <= 0 {
				continue
			}
			ratios[k] = append(ratios[k], s.BusBWGBps/r.BusBWGBps)
			if fits[k] == nil {
				fits[k] = &Fit{Kind: k}
			}
			fits[k].Samples++
			fits[k].Sources = append(fits[k].Sources, s.Source)
		}
		for k, rs := range ratios {
			med, _ := medianMax(rs)
			if _, ok := before[k]; !ok {
				before[k] = med
			}
			fits[k].Ratio = before[k]
			eff[k] = min(1, eff[k]*med)
		}
		set()
	}
	for _, k := range []string{"nvlink", "nvls", "pcie", "net"} {
		if f := fits[k]; f != nil {
			f.Efficiency = eff[k]
			c.Fits = append(c.Fits, *f)
		}
	}
	return c, nil
}

func predictWith(s Sample, bw *topology.Bandwidths) (Result, error) {
	p := s.Placement
	p.Bandwidths = bw
	return Predict(p, s.Collective, s.Bytes, Options{Algorithm: s.Algorithm, Candidates: NCCLAlgorithms})
}

func orWord(s string) string {
	if s == "" {
		return "no link"
	}
	return s
}
