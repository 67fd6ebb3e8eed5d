package collective

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"slices"
	"strconv"
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
	// Models are efficiencies fitted on nodes of one GPU model (model
	// calibrate --model), by model name: on nodes of that model they
	// replace Efficiency's, which stays for the others (a cluster of
	// several node models holds one entry each).
	Models map[string]topology.Efficiency `json:"models,omitempty"`
	// Fits say what each efficiency came from, Latency what the per-step
	// overhead came from (nil: the default's).
	Fits    []Fit       `json:"fits,omitempty"`
	Latency *LatencyFit `json:"latency,omitempty"`
	// ModelLatency is the per-step overhead fitted per GPU model (the
	// value in force is Models[model].StepOverheadUS).
	ModelLatency []LatencyFit `json:"model_latency,omitempty"`
}

// LatencyFit is the fitted per-step overhead and its evidence: the
// median of the overheads that make each small message's prediction meet
// its measurement.
type LatencyFit struct {
	// Model is the GPU model whose nodes it was fitted on ("": the
	// cluster's).
	Model          string   `json:"model,omitempty"`
	StepOverheadUS float64  `json:"step_overhead_us"`
	Samples        int      `json:"samples"`
	Sources        []string `json:"sources"`
}

// CalibrationVersion is the file format's version.
const CalibrationVersion = 1

// Fit is one kind of link's fitted efficiency and its evidence.
type Fit struct {
	Kind string `json:"kind"` // a LinkKinds entry
	// Model is the GPU model it was fitted on, for a fit of Models.
	Model      string  `json:"model,omitempty"`
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
		bw.ByModel = nil
		for model, e := range c.Models {
			if bw.ByModel == nil {
				bw.ByModel = map[string]topology.Efficiency{}
			}
			bw.ByModel[topology.ModelKey(model)] = e
		}
	}
	return bw
}

// CalibrationError is one reason a calibration is refused: the file (or
// KV entry) and line it is about, 0 when no line is to blame.
type CalibrationError struct {
	File string
	Line int
	// Field is the JSON path of the value refused (efficiency.nvlink);
	// empty for the file as a whole.
	Field string
	Msg   string
}

func (e CalibrationError) Error() string {
	where := e.File
	if e.Line > 0 {
		where += ":" + strconv.Itoa(e.Line)
	}
	if e.Field != "" {
		return where + ": " + e.Field + ": " + e.Msg
	}
	return where + ": " + e.Msg
}

// CalibrationErrors are every reason a calibration is refused, in line
// order.
type CalibrationErrors []CalibrationError

func (es CalibrationErrors) Error() string {
	parts := make([]string, len(es))
	for i, e := range es {
		parts[i] = e.Error()
	}
	return strings.Join(parts, "; ")
}

// LinkKinds are the kinds of link a calibration fits, in its files' order:
// NVLink, NVLink SHARP, PCIe and the inter-socket link, the network over
// InfiniBand or RoCE (NICs and leaf uplinks), and NICs of the EFA and TCP
// transports (topology.NIC.Transport).
var LinkKinds = []string{"nvlink", "nvls", "pcie", "net", topology.TransportEFA, topology.TransportTCP}

// shares are an efficiency's values by LinkKinds.
func shares(e *topology.Efficiency) []*float64 {
	return []*float64{&e.NVLink, &e.NVLS, &e.PCIe, &e.Net, &e.EFA, &e.TCP}
}

// problem is one refused field, before it is given a file and line.
type problem struct{ field, msg string }

// problems checks every value; none is nil.
func (c *Calibration) problems() []problem {
	var out []problem
	if c.Version != CalibrationVersion {
		out = append(out, problem{"version", fmt.Sprintf("%d: expected %d", c.Version, CalibrationVersion)})
	}
	e := c.Efficiency
	for i, p := range shares(&e) {
		if v := *p; v < 0 || v > 1 || math.IsNaN(v) {
			out = append(out, problem{"efficiency." + LinkKinds[i],
				fmt.Sprintf("%g: expected a share of line rate, above 0 and at most 1 (0: the default)", *p)})
		}
	}
	if e.StepOverheadUS < 0 || e.StepOverheadUS > 1000 || math.IsNaN(e.StepOverheadUS) {
		out = append(out, problem{"efficiency.step_overhead_us", fmt.Sprintf("%g: expected 0 to 1000", e.StepOverheadUS)})
	}
	for _, model := range slices.Sorted(maps.Keys(c.Models)) {
		me := c.Models[model]
		field := "models." + model
		if topology.ModelKey(model) == "" {
			out = append(out, problem{field, "a model needs a name"})
		}
		for i, p := range shares(&me) {
			if v := *p; v < 0 || v > 1 || math.IsNaN(v) {
				out = append(out, problem{field + "." + LinkKinds[i],
					fmt.Sprintf("%g: expected a share of line rate, above 0 and at most 1 (0: the cluster's)", v)})
			}
		}
		if me.StepOverheadUS < 0 || me.StepOverheadUS > 1000 || math.IsNaN(me.StepOverheadUS) {
			out = append(out, problem{field + ".step_overhead_us", fmt.Sprintf("%g: expected 0 to 1000 (0: the cluster's)", me.StepOverheadUS)})
		}
	}
	for i, f := range c.Fits {
		field := fmt.Sprintf("fits[%d]", i)
		if !slices.Contains(LinkKinds, f.Kind) {
			out = append(out, problem{field + ".kind", fmt.Sprintf("%q: expected one of %s", f.Kind, strings.Join(LinkKinds, ", "))})
		}
		if f.Efficiency <= 0 || f.Efficiency > 1 || math.IsNaN(f.Efficiency) {
			out = append(out, problem{field + ".efficiency", fmt.Sprintf("%g: expected above 0 and at most 1", f.Efficiency)})
		}
		if f.Samples < 0 || f.Ratio < 0 || math.IsNaN(f.Ratio) || math.IsInf(f.Ratio, 0) {
			out = append(out, problem{field, fmt.Sprintf("samples %d, ratio %g: expected non-negative numbers", f.Samples, f.Ratio)})
		}
	}
	return out
}

// Validate checks a calibration built in memory (ParseCalibration checks a
// file and names its lines).
func (c *Calibration) Validate() error {
	var errs []error
	for _, p := range c.problems() {
		errs = append(errs, fmt.Errorf("%s = %s", p.field, p.msg))
	}
	return errors.Join(errs...)
}

// MaxCalibrationSize bounds a calibration file or pushed value: a set is
// four efficiencies and the evidence of their fits.
const MaxCalibrationSize = 1 << 20

// ParseCalibration reads a calibration file; file names it in errors,
// which are a CalibrationErrors naming the line of each refused value.
func ParseCalibration(file string, data []byte) (*Calibration, error) {
	fail := func(line int, field, msg string) (*Calibration, error) {
		return nil, CalibrationErrors{{File: file, Line: line, Field: field, Msg: msg}}
	}
	if len(data) > MaxCalibrationSize {
		return fail(0, "", fmt.Sprintf("%d bytes, more than the %d a calibration may hold", len(data), MaxCalibrationSize))
	}
	if len(strings.TrimSpace(string(data))) == 0 {
		return fail(0, "", "empty: expected a calibration set (toposched model calibrate writes one)")
	}
	var c Calibration
	d := json.NewDecoder(strings.NewReader(string(data)))
	d.DisallowUnknownFields()
	if err := d.Decode(&c); err != nil {
		var se *json.SyntaxError
		var te *json.UnmarshalTypeError
		switch {
		case errors.As(err, &se):
			return fail(lineOf(data, se.Offset), "", err.Error())
		case errors.As(err, &te):
			return fail(lineOf(data, te.Offset), te.Field, fmt.Sprintf("%s: expected %s", te.Value, te.Type))
		case errors.Is(err, io.ErrUnexpectedEOF):
			return fail(lineOf(data, int64(len(data))), "", "cut off: the JSON object does not end")
		}
		// Unknown fields and the like: encoding/json names the field but
		// not the offset.
		line := 0
		if _, name, ok := strings.Cut(err.Error(), "unknown field "); ok {
			line = lineOfKey(data, strings.Trim(name, `"`))
		}
		return fail(line, "", err.Error())
	}
	if d.More() {
		return fail(lineOf(data, d.InputOffset()), "", "data after the JSON object")
	}
	var errs CalibrationErrors
	for _, p := range c.problems() {
		errs = append(errs, CalibrationError{File: file, Line: lineOfField(data, p.field), Field: p.field, Msg: p.msg})
	}
	if len(errs) > 0 {
		slices.SortStableFunc(errs, func(a, b CalibrationError) int { return a.Line - b.Line })
		return nil, errs
	}
	return &c, nil
}

func lineOf(data []byte, off int64) int {
	return 1 + strings.Count(string(data[:min(max(int(off), 0), len(data))]), "\n")
}

// lineOfField is the line of a JSON path's last key (efficiency.nvlink,
// fits[1].kind), looked for after its parents' keys; 0 when not found (a
// value left out).
func lineOfField(data []byte, field string) int {
	off := 0
	for _, part := range strings.Split(field, ".") {
		key, idx, hasIdx := strings.Cut(part, "[")
		i := strings.Index(string(data[off:]), `"`+key+`"`)
		if i < 0 {
			return 0
		}
		off += i + len(key) + 2
		if hasIdx {
			// The n-th object of the array: count the objects' openings.
			n, _ := strconv.Atoi(strings.TrimSuffix(idx, "]"))
			for range n + 1 {
				j := strings.Index(string(data[off:]), "{")
				if j < 0 {
					return 0
				}
				off += j + 1
			}
		}
	}
	return lineOf(data, int64(off))
}

func lineOfKey(data []byte, key string) int {
	if i := strings.Index(string(data), `"`+key+`"`); i >= 0 {
		return lineOf(data, int64(i))
	}
	return 0
}

// ForModel moves c's fit (link efficiencies and per-step overhead) under
// Models[model] and merges it into into (nil: a new set): the set to write
// for a fit on nodes of one model. The cluster's figures stay into's.
func (c *Calibration) ForModel(model string, into *Calibration) *Calibration {
	out := into
	if out == nil {
		out = &Calibration{Version: CalibrationVersion, Name: c.Name}
	}
	if out.Models == nil {
		out.Models = map[string]topology.Efficiency{}
	}
	out.Models[model] = c.Efficiency
	out.Fits = slices.DeleteFunc(out.Fits, func(f Fit) bool { return f.Model == model })
	for _, f := range c.Fits {
		f.Model = model
		out.Fits = append(out.Fits, f)
	}
	out.ModelLatency = slices.DeleteFunc(out.ModelLatency, func(l LatencyFit) bool { return l.Model == model })
	if c.Latency != nil {
		l := *c.Latency
		l.Model = model
		out.ModelLatency = append(out.ModelLatency, l)
	}
	return out
}

// Resolved is the efficiency of every kind of link, the defaults where
// the calibration (nil: none) leaves one at 0.
func (c *Calibration) Resolved() topology.Efficiency {
	e := topology.Efficiency{}
	if c != nil {
		e = c.Efficiency
	}
	or := func(v, d float64) float64 {
		if v == 0 {
			return d
		}
		return v
	}
	net := or(e.Net, EffNet)
	return topology.Efficiency{NVLink: or(e.NVLink, EffNVLink), NVLS: or(e.NVLS, EffNVLS), PCIe: or(e.PCIe, EffPCIe),
		Net: net, EFA: or(e.EFA, net), TCP: or(e.TCP, net), StepOverheadUS: or(e.StepOverheadUS, StepOverheadUS)}
}

// LinkKind is the kind of link a bottleneck's name (LinkName) is, for an
// algorithm: nvlink, nvls, pcie or net; "" for none.
func LinkKind(bottleneck string, a Algorithm) string {
	prefix, _, _ := strings.Cut(bottleneck, ":")
	switch prefix {
	case "nvport":
		if a == NVLS || a == NVLSTree {
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
	line := (&Calibration{Efficiency: topology.Efficiency{NVLink: 1, NVLS: 1, PCIe: 1, Net: 1, EFA: 1, TCP: 1}}).Bandwidths(base)
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
		// A transport no sample is bound by stays at 0: Net's.
		c.Efficiency = topology.Efficiency{NVLink: eff["nvlink"], NVLS: eff["nvls"], PCIe: eff["pcie"], Net: eff["net"],
			EFA: eff[topology.TransportEFA], TCP: eff[topology.TransportTCP]}
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
			k := r.BottleneckKind
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
			cur := eff[k]
			if cur == 0 { // a transport, at Net's until now
				cur = eff["net"]
			}
			eff[k] = min(1, cur*med)
		}
		set()
	}
	for _, k := range LinkKinds {
		if f := fits[k]; f != nil {
			f.Efficiency = eff[k]
			c.Fits = append(c.Fits, *f)
		}
	}
	return c, fitLatency(c, samples, base)
}

// FitLatencyMaxBytes is the largest message the per-step overhead is
// fitted from: at and below it the latency term, not bandwidth, decides.
const FitLatencyMaxBytes = 4 << 20

// fitLatency fits the per-step overhead to the samples of at most
// FitLatencyMaxBytes, with the fitted efficiencies in place: for each, the
// overhead (0.01 to 1000 µs) at which the prediction meets the
// measurement, by bisection (more overhead, less bandwidth); the median of
// them. Without such samples the default stays.
func fitLatency(c *Calibration, samples []Sample, base *topology.Bandwidths) error {
	var overheads []float64
	var sources []string
	for _, s := range samples {
		if s.Bytes > FitLatencyMaxBytes {
			continue
		}
		at := func(us float64) (float64, error) {
			e := *c
			e.Efficiency.StepOverheadUS = us
			r, err := predictWith(s, e.Bandwidths(base))
			return r.BusBWGBps, err
		}
		lo, hi := 0.01, 1000.0
		blo, err := at(lo)
		if err != nil {
			return fmt.Errorf("%s: %w", s.Source, err)
		}
		bhi, err := at(hi)
		if err != nil {
			return fmt.Errorf("%s: %w", s.Source, err)
		}
		var us float64
		switch {
		case s.BusBWGBps >= blo:
			us = lo // faster than any overhead: the bandwidth term's own
		case s.BusBWGBps <= bhi:
			us = hi
		default:
			for range 50 {
				mid := math.Sqrt(lo * hi)
				b, err := at(mid)
				if err != nil {
					return fmt.Errorf("%s: %w", s.Source, err)
				}
				if b > s.BusBWGBps {
					lo = mid
				} else {
					hi = mid
				}
			}
			us = math.Sqrt(lo * hi)
		}
		overheads = append(overheads, us)
		sources = append(sources, s.Source)
	}
	if len(overheads) == 0 {
		return nil
	}
	med, _ := medianMax(overheads)
	c.Efficiency.StepOverheadUS = med
	c.Latency = &LatencyFit{StepOverheadUS: med, Samples: len(overheads), Sources: sources}
	return nil
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
