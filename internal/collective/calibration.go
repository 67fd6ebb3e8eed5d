package collective

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/toposched/toposched/internal/gpuspeed"
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
	// Fits say what each efficiency came from, Latency what the fitted
	// overhead (of a call, or of a step) came from (nil: none fitted).
	Fits    []Fit       `json:"fits,omitempty"`
	Latency *LatencyFit `json:"latency,omitempty"`
	// ModelLatency is the overhead fitted per GPU model (the value in
	// force is Models[model]'s field of the same name).
	ModelLatency []LatencyFit `json:"model_latency,omitempty"`
	// Compute are GPU models measured to compute slower or faster than
	// internal/gpuspeed's table says, one entry a model: the optimizer's
	// online compute calibration writes them. Placement multiplies a
	// step's compute scaled onto the model by the entry's factor.
	Compute []ComputeFit `json:"compute,omitempty"`
}

// ComputeFit is one GPU model's compute factor and its evidence.
type ComputeFit struct {
	// Model is the GPU model as internal/gpuspeed's table names it ("T4",
	// "H100 SXM"); another spelling the table knows is taken for it.
	Model string `json:"model"`
	// Factor is the model's measured compute time over the table's
	// prediction, within [MinComputeFactor, MaxComputeFactor].
	Factor float64 `json:"factor"`
	// Samples are the jobs whose measurements its last move was computed
	// from (OnlineCompute: their median); Ratio that median over the
	// factor before the move; Sources where some of them were read (job
	// and step).
	Samples int      `json:"samples"`
	Ratio   float64  `json:"ratio"`
	Sources []string `json:"sources,omitempty"`
}

// Bounds of a compute factor. The table's rule (the geometric mean of
// tensor peak and memory bandwidth) puts the models it knows within 5.5×
// of an A100 and is a peak-to-peak comparison; a model measured more than
// 5 times slower, or faster, than its peak figures say is not the model
// (a misreported GPU name, a throttled or broken part, a unit slip in the
// telemetry), and scaling every job's compute on it by so much would send
// them all elsewhere on one wrong set.
const (
	MinComputeFactor = 0.2
	MaxComputeFactor = 5
)

// LatencyFit is a fitted overhead (of a call, or of a step) and its
// evidence: the median of the overheads that make each small message's
// prediction meet its measurement.
type LatencyFit struct {
	// Model is the GPU model whose nodes it was fitted on ("": the
	// cluster's).
	Model string `json:"model,omitempty"`
	// OpOverheadUS is the fitted overhead of a call (fitLatency);
	// StepOverheadUS the fitted per-step overhead, where the machine is
	// faster than the model's own latency (and in every set written
	// before calls were fitted, read as written). One of the two is set,
	// and its value is the efficiency's field of the same name.
	OpOverheadUS   float64  `json:"op_overhead_us,omitempty"`
	StepOverheadUS float64  `json:"step_overhead_us,omitempty"`
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
	// AboveLineRate is, for a fit stopped at line rate (efficiency 1), the
	// share of line rate its measurements asked for: more than the links
	// can carry, so the model's path for them is slower than the
	// machine's. 0: the fit is within line rate.
	AboveLineRate float64 `json:"above_line_rate,omitempty"`
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

// ErrNoMeasurement is a fit refused because no sample is FitMinBytes or
// larger: a log of small messages says nothing of bandwidth.
var ErrNoMeasurement = errors.New("no measurement")

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
		bw.Compute = nil
		for _, f := range c.Compute {
			s, ok := gpuspeed.Lookup(f.Model)
			if !ok {
				continue // refused by Validate; a set in memory may be unchecked
			}
			if bw.Compute == nil {
				bw.Compute = map[string]topology.ComputeCorrection{}
			}
			bw.Compute[s.Name] = topology.ComputeCorrection{Factor: f.Factor, Samples: f.Samples, Set: c.Name}
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

// Plausibility. A set's efficiencies are shares of line rate, at most 1,
// and at least a floor per kind of link: a value no real machine fits to
// (a typo, a unit slip, a measurement of something else) would make every
// prediction absurd (net 1e-300 predicted 10^297 s a step) and is refused
// by ParseCalibration and Validate, so by topoctl calibration push and by
// every replica. Each floor is an order of magnitude or so below the lowest
// value a real measurement fits (model calibrate on the files of
// testdata/ and of the shared tree's nccl-tests/, whose README names their
// sources):
//
//   - nvlink 0.05: the lowest fit is 0.65 (sendrecv on 8 A100 over
//     NVSwitch, li-plus playground: p2p runs on fewer channels); 0.80 to
//     0.82 for collectives (Azure ND A100 v4, ND GB200 v6, GCP A3 Mega). At
//     0.05 an A100's twelve NVLinks carry 15 GB/s, less than its PCIe Gen4
//     x16: NCCL would not use such an NVLink.
//   - nvls 0.05: fits 0.59 to 0.61 (8 H200 torch benchmark, Azure ND H200
//     v5, AWS p5).
//   - pcie 0.03: the lowest fit is 0.56 (8 Quadro RTX 6000 on PCIe Gen3
//     across two switches, au25-cse599o-hw2), 0.69 on 2 and 4 of them; an
//     NCCL maintainer puts 8 RTX 5090 on Gen5 at 28 GB/s busbw, set by the
//     CPU (NVIDIA/nccl#1639, about 0.44).
//   - net, efa, tcp 0.001: healthy fits are 0.85 to 0.99 (AWS p4de EFA,
//     GB200 partitions over InfiniBand); the lowest is 0.011, a real but
//     broken cluster (NVIDIA/nccl#1453: 5 GB/s busbw from 64 MiB on 3 nodes
//     of 8 H100 with eight 400 Gb/s NICs each). At 0.001 a 400 Gb/s NIC
//     carries 50 MB/s, less than 1 Gb Ethernet. No file in either tree has
//     TCP at its bottleneck (GCP A3 Mega's TCPXO run is bound by NVLink), so
//     TCP takes the network's floor.
//
// Every floor is at most MinEfficiency, the lowest share an online step
// moves a kind to, so the optimizer's online moves never write a set the
// replicas refuse.
var EfficiencyFloors = map[string]float64{
	"nvlink": 0.05, "nvls": 0.05, "pcie": 0.03,
	"net": 0.001, topology.TransportEFA: 0.001, topology.TransportTCP: 0.001,
}

// WarnFactor is how far from its documented default (DefaultEfficiency) an
// efficiency may be before Warnings names it. The real measurements' fits
// are within 1.42 of the defaults (0.56 against PCIe's 0.80 for 8 Quadro
// RTX 6000; about 1.8 for the RTX 5090 statement), the broken cluster of
// NVIDIA/nccl#1453 87 times below: a factor of 3 passes every healthy
// machine with room and still names a fit that is probably a degraded
// link, another topology or the wrong --nodes. A set beyond it is still
// valid: the machine may really be that slow.
const WarnFactor = 3

// Agreement: a fit's efficiency and the efficiency in force for its kind
// say one thing twice (and a latency fit's overhead and the efficiency's
// step_overhead_us), so they must agree to what model calibrate and
// topoctl calibration show print (3 decimals of a share, 2 of a
// microsecond); a set where they differ more was edited on one side only,
// and which side is meant cannot be known.
const (
	EfficiencyAgreement = 0.0005
	OverheadAgreementUS = 0.005
)

// DefaultEfficiency is the documented efficiency of a LinkKinds entry (the
// EFA and TCP transports follow the network's).
func DefaultEfficiency(kind string) float64 {
	switch kind {
	case "nvlink":
		return EffNVLink
	case "nvls":
		return EffNVLS
	case "pcie":
		return EffPCIe
	}
	return EffNet
}

// problem is one refused field, before it is given a file and line.
type problem struct{ field, msg string }

// shareProblem is what is wrong with v as kind's share of line rate ("":
// nothing); zero says what 0 means where it is allowed ("": it is not).
func shareProblem(kind string, v float64, zero string) string {
	expected := "expected a share of line rate, above 0 and at most 1"
	if zero != "" {
		expected += " (0: " + zero + ")"
	}
	switch {
	case math.IsNaN(v) || math.IsInf(v, 0) || v < 0 || v > 1 || (v == 0 && zero == ""):
		return fmt.Sprintf("%g: %s", v, expected)
	case v == 0:
		return ""
	case v < EfficiencyFloors[kind]:
		return fmt.Sprintf("%g: below the floor %g of line rate for %s links, %.3g times under the documented %g: no real measurement fits so low (see docs/cost-model.md, Calibration floors)",
			v, EfficiencyFloors[kind], kind, DefaultEfficiency(kind)/v, DefaultEfficiency(kind))
	}
	return ""
}

// problems checks every value; none is nil.
func (c *Calibration) problems() []problem {
	var out []problem
	if c.Version != CalibrationVersion {
		out = append(out, problem{"version", fmt.Sprintf("%d: expected %d", c.Version, CalibrationVersion)})
	}
	e := c.Efficiency
	for i, p := range shares(&e) {
		if msg := shareProblem(LinkKinds[i], *p, "the default"); msg != "" {
			out = append(out, problem{"efficiency." + LinkKinds[i], msg})
		}
	}
	for _, o := range overheads(&e) {
		if *o.v < 0 || *o.v > 1000 || math.IsNaN(*o.v) {
			out = append(out, problem{"efficiency." + o.field, fmt.Sprintf("%g: expected 0 to 1000", *o.v)})
		}
	}
	for _, model := range slices.Sorted(maps.Keys(c.Models)) {
		me := c.Models[model]
		field := "models." + model
		if topology.ModelKey(model) == "" {
			out = append(out, problem{field, "a model needs a name"})
		}
		for i, p := range shares(&me) {
			if msg := shareProblem(LinkKinds[i], *p, "the cluster's"); msg != "" {
				out = append(out, problem{field + "." + LinkKinds[i], msg})
			}
		}
		for _, o := range overheads(&me) {
			if *o.v < 0 || *o.v > 1000 || math.IsNaN(*o.v) {
				out = append(out, problem{field + "." + o.field, fmt.Sprintf("%g: expected 0 to 1000 (0: the cluster's)", *o.v)})
			}
		}
	}
	disagree := func(v float64, field string, zero bool) string {
		msg := fmt.Sprintf("disagrees with %s = %g", field, v)
		switch {
		case zero && strings.HasPrefix(field, "models."):
			msg += " (0: the cluster's)"
		case zero:
			msg += " (0: the default)"
		}
		return msg + ", the value in force: a fit is that value's evidence, so the two must agree (edit both or neither)"
	}
	for i, f := range c.Fits {
		field := fmt.Sprintf("fits[%d]", i)
		known := slices.Contains(LinkKinds, f.Kind)
		if !known {
			out = append(out, problem{field + ".kind", fmt.Sprintf("%q: expected one of %s", f.Kind, strings.Join(LinkKinds, ", "))})
		}
		msg := ""
		if known {
			msg = shareProblem(f.Kind, f.Efficiency, "")
		} else if !(f.Efficiency > 0 && f.Efficiency <= 1) {
			msg = fmt.Sprintf("%g: expected above 0 and at most 1", f.Efficiency)
		}
		if msg != "" {
			out = append(out, problem{field + ".efficiency", msg})
		}
		if f.Samples < 0 || f.Ratio < 0 || math.IsNaN(f.Ratio) || math.IsInf(f.Ratio, 0) {
			out = append(out, problem{field, fmt.Sprintf("samples %d, ratio %g: expected non-negative numbers", f.Samples, f.Ratio)})
		}
		switch a := f.AboveLineRate; {
		case a != 0 && !(a > 1 && !math.IsInf(a, 0)):
			out = append(out, problem{field + ".above_line_rate", fmt.Sprintf("%g: expected above 1, the share of line rate asked for (0: within line rate)", a)})
		case a != 0 && msg == "" && f.Efficiency != 1:
			out = append(out, problem{field + ".above_line_rate", fmt.Sprintf("%g with efficiency %g: a fit stopped at line rate has efficiency 1", a, f.Efficiency)})
		}
		if !known || msg != "" {
			continue
		}
		v, in, zero, ok := c.inForce(f.Model, f.Kind)
		switch {
		case !ok:
			out = append(out, problem{field + ".model", fmt.Sprintf("%q: no models entry holds the efficiency it fitted", f.Model)})
		case math.Abs(v-f.Efficiency) > EfficiencyAgreement:
			out = append(out, problem{field + ".efficiency", fmt.Sprintf("%g: %s", f.Efficiency, disagree(v, in, zero))})
		}
	}
	latency := func(field string, l LatencyFit) {
		us, kind, name := l.OpOverheadUS, opKind, "op_overhead_us"
		if us == 0 {
			us, kind, name = l.StepOverheadUS, stepKind, "step_overhead_us"
		}
		switch {
		case l.OpOverheadUS != 0 && l.StepOverheadUS != 0:
			out = append(out, problem{field, fmt.Sprintf("op_overhead_us %g and step_overhead_us %g: a fit is of one of them", l.OpOverheadUS, l.StepOverheadUS)})
			return
		case math.IsNaN(us) || us <= 0 || us > 1000 || l.Samples < 0:
			out = append(out, problem{field + "." + name, fmt.Sprintf("%g from %d samples: expected above 0 and at most 1000", us, l.Samples)})
			return
		}
		v, in, zero, ok := c.inForce(l.Model, kind)
		switch {
		case !ok:
			out = append(out, problem{field + ".model", fmt.Sprintf("%q: no models entry holds the overhead it fitted", l.Model)})
		case math.Abs(v-us) > OverheadAgreementUS:
			out = append(out, problem{field + "." + name, fmt.Sprintf("%g: %s", us, disagree(v, in, zero))})
		}
	}
	if c.Latency != nil {
		latency("latency", *c.Latency)
	}
	for i, l := range c.ModelLatency {
		latency(fmt.Sprintf("model_latency[%d]", i), l)
	}
	return append(out, c.computeProblems()...)
}

// computeProblems checks the compute factors.
func (c *Calibration) computeProblems() []problem {
	var out []problem
	seen := map[string]int{}
	for i, f := range c.Compute {
		field := fmt.Sprintf("compute[%d]", i)
		s, ok := gpuspeed.Lookup(f.Model)
		switch j, dup := seen[s.Name]; {
		case !ok:
			out = append(out, problem{field + ".model", fmt.Sprintf("%q: not a GPU model the speed table knows (internal/gpuspeed: such as T4, A100, H100)", f.Model)})
		case dup:
			out = append(out, problem{field + ".model", fmt.Sprintf("%q: the model of compute[%d] (%s): a set holds one factor a model", f.Model, j, s.Name)})
		default:
			seen[s.Name] = i
		}
		if v := f.Factor; math.IsNaN(v) || v < MinComputeFactor || v > MaxComputeFactor {
			out = append(out, problem{field + ".factor", fmt.Sprintf("%g: expected a measured over predicted compute time from %g to %g: a model so far from its peak figures is not that model (a misreported GPU name, a broken part, a unit slip)",
				v, float64(MinComputeFactor), float64(MaxComputeFactor))})
		}
		if f.Samples < 0 || f.Ratio < 0 || math.IsNaN(f.Ratio) || math.IsInf(f.Ratio, 0) {
			out = append(out, problem{field, fmt.Sprintf("samples %d, ratio %g: expected non-negative numbers", f.Samples, f.Ratio)})
		}
	}
	return out
}

// Pseudo-kinds of inForce: the overhead of a step and of a call.
const (
	stepKind = "step_overhead"
	opKind   = "op_overhead"
)

// overheadField is one of an efficiency's overheads and its JSON name.
type overheadField struct {
	field string
	v     *float64
}

// overheads are an efficiency's two overheads.
func overheads(e *topology.Efficiency) []overheadField {
	return []overheadField{{"step_overhead_us", &e.StepOverheadUS}, {"op_overhead_us", &e.OpOverheadUS}}
}

// inForce is the value of a kind of link (or of an overhead: stepKind,
// opKind) in force on nodes of model ("": the cluster's), the field that
// sets it, and whether that field is 0 (a default); ok is false for a
// model the set has no entry for.
func (c *Calibration) inForce(model, kind string) (v float64, field string, zero, ok bool) {
	e, field, stored := c.Efficiency, "efficiency", c.Efficiency
	if model != "" {
		bw := c.Bandwidths(nil)
		if stored, ok = bw.ByModel[topology.ModelKey(model)]; !ok {
			return 0, "", false, false
		}
		e, field = bw.EfficiencyOf(model), "models."+model
	}
	r := (&Calibration{Efficiency: e}).Resolved()
	switch kind {
	case stepKind:
		return r.StepOverheadUS, field + ".step_overhead_us", stored.StepOverheadUS == 0, true
	case opKind:
		return r.OpOverheadUS, field + ".op_overhead_us", stored.OpOverheadUS == 0, true
	}
	i := slices.Index(LinkKinds, kind)
	return *shares(&r)[i], field + "." + kind, *shares(&stored)[i] == 0, true
}

// agrees is whether a fit's efficiency is the one in force for its kind
// (see EfficiencyAgreement).
func (c *Calibration) agrees(f Fit) bool {
	v, _, _, ok := c.inForce(f.Model, f.Kind)
	return ok && math.Abs(v-f.Efficiency) <= EfficiencyAgreement
}

// Warnings are what is valid but probably wrong in a set, one sentence
// each: an efficiency more than WarnFactor from its documented default,
// with the measurements it was fitted from, and a source named by an
// absolute path (model calibrate stores them relative or as base names,
// since a set is read by everyone who reads the bucket). model calibrate,
// topoctl calibration push and show print them.
func (c *Calibration) Warnings() []string {
	var out []string
	check := func(field, model string, e topology.Efficiency) {
		for i, p := range shares(&e) {
			v, kind := *p, LinkKinds[i]
			if !(v > 0) {
				continue
			}
			def := DefaultEfficiency(kind)
			factor, way := def/v, "below"
			if v > def {
				factor, way = v/def, "above"
			}
			if !(factor > WarnFactor) {
				continue
			}
			w := fmt.Sprintf("%s.%s = %.3g: %.1f× %s the documented %g (beyond %d×): a degraded link, a measurement of another topology or the wrong --nodes? check before pushing",
				field, kind, v, factor, way, def, WarnFactor)
			for _, f := range c.Fits {
				if f.Kind == kind && topology.ModelKey(f.Model) == topology.ModelKey(model) {
					w += fmt.Sprintf("; fitted from %d measurements: %s", f.Samples, strings.Join(f.Sources[:min(len(f.Sources), 4)], ", "))
					if len(f.Sources) > 4 {
						w += ", ..."
					}
					break
				}
			}
			out = append(out, w)
		}
	}
	check("efficiency", "", c.Efficiency)
	for _, model := range slices.Sorted(maps.Keys(c.Models)) {
		check("models."+model, model, c.Models[model])
	}
	var abs []string
	sources := func(field string, srcs []string) {
		for _, s := range srcs {
			if isAbsSource(s) {
				abs = append(abs, fmt.Sprintf("%s.sources: %q", field, s))
				return
			}
		}
	}
	for i, f := range c.Fits {
		sources(fmt.Sprintf("fits[%d]", i), f.Sources)
	}
	if c.Latency != nil {
		sources("latency", c.Latency.Sources)
	}
	for i, l := range c.ModelLatency {
		sources(fmt.Sprintf("model_latency[%d]", i), l.Sources)
	}
	if len(abs) > 0 {
		more := ""
		if len(abs) > 1 {
			more = fmt.Sprintf(" (and %d more fields)", len(abs)-1)
		}
		out = append(out, fmt.Sprintf("%s is an absolute path of the machine that ran model calibrate%s, shown to everyone who reads the set: run model calibrate again, which stores names relative to its working directory or base names",
			abs[0], more))
	}
	return out
}

// AtLineRate says, one sentence per fit, which fits stopped at line rate
// (Fit.AboveLineRate): not a fault of the machine, as Warnings are, but of
// the model, whose path for those measurements is slower than the
// machine's; model calibrate prints them.
func (c *Calibration) AtLineRate() []string {
	var out []string
	for i, f := range c.Fits {
		if !(f.AboveLineRate > 1) {
			continue
		}
		kind := f.Kind
		if f.Model != "" {
			kind = f.Model + " " + kind
		}
		out = append(out, fmt.Sprintf("fits[%d] (%s) stopped at line rate, where its %d measurements asked for %.3f of it: the model's path for them is slower than the machine's (an algorithm or a pipeline it prices too slowly at these sizes, or links the topology leaves out), so predictions from this set are at line rate, below what was measured",
			i, kind, f.Samples, f.AboveLineRate))
	}
	return out
}

// isAbsSource is whether a source (file:line) names its file by an
// absolute path, of this system or another's (C:\...).
func isAbsSource(s string) bool {
	if strings.HasPrefix(s, "/") || strings.HasPrefix(s, `\`) || filepath.IsAbs(s) {
		return true
	}
	return len(s) >= 3 && s[1] == ':' && (s[2] == '\\' || s[2] == '/') && ('a' <= s[0]|0x20 && s[0]|0x20 <= 'z')
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
		Net: net, EFA: or(e.EFA, net), TCP: or(e.TCP, net), StepOverheadUS: or(e.StepOverheadUS, StepOverheadUS), OpOverheadUS: e.OpOverheadUS}
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
	case "pcie", "smp", "host":
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
		return nil, fmt.Errorf("%w of %d bytes or more to fit bandwidth to (%d given)", ErrNoMeasurement, int64(FitMinBytes), len(samples))
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
	asked := map[string]float64{}  // each kind's efficiency before the clamp, last round
	for range 3 {
		bw := c.Bandwidths(base)
		// The round's samples were predicted with these; a kind is scaled
		// from them, not from another kind this round has already moved
		// (a transport still at Net's would be, in map order).
		was := maps.Clone(eff)
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
			cur := was[k]
			if cur == 0 { // a transport, at Net's until now
				cur = was["net"]
			}
			asked[k] = cur * med
			eff[k] = min(1, asked[k])
		}
		set()
	}
	for _, k := range LinkKinds {
		if f := fits[k]; f != nil {
			f.Efficiency = eff[k]
			if asked[k] > 1 {
				// A share above line rate cannot be: the fit stops at 1 and
				// says so (Warnings), rather than pass for a measured 1.
				f.AboveLineRate = asked[k]
			}
			c.Fits = append(c.Fits, *f)
		}
	}
	return c, fitLatency(c, samples, base)
}

// FitLatencyMaxBytes is the largest message the per-step overhead is
// fitted from: at and below it the latency term, not bandwidth, decides.
const FitLatencyMaxBytes = 4 << 20

// fitLatency fits the overhead of a call to the samples of at most
// FitLatencyMaxBytes, with the fitted efficiencies in place: for each, the
// overhead (0.01 to 1000 µs) at which the prediction meets the
// measurement, by bisection (more overhead, less bandwidth); the median of
// them. Without such samples none is fitted.
//
// The offset a sweep's small messages show is fitted once a call, not
// once a step: within one collective on one rank count the two are the
// same offset, but the machines measured with several collectives show
// one offset a call whatever the collective's steps (a Together AI H100
// node: every operation at least ~35 µs up to 512 KiB, its 7-step
// all_gather and 14-step all_reduce alike; model validate's
// cross-collective section: 15.7% by step, 6.9% by call), the host's
// launch of each call rather than the links' steps. A machine faster
// than the model's own latency (the median sample faster with no
// overhead at all) has no call overhead to fit: there the per-step
// overhead, NCCL's tables' order by default, is fitted down instead, as
// it was for every machine before.
func fitLatency(c *Calibration, samples []Sample, base *topology.Bandwidths) error {
	fitted, sources, err := fitOverhead(c, samples, base, func(e *topology.Efficiency) *float64 { return &e.OpOverheadUS })
	if err != nil || len(fitted) == 0 {
		return err
	}
	med, _ := medianMax(fitted)
	if med > overheadLow {
		c.Efficiency.OpOverheadUS = med
		c.Latency = &LatencyFit{OpOverheadUS: med, Samples: len(fitted), Sources: sources}
		return nil
	}
	fitted, sources, err = fitOverhead(c, samples, base, func(e *topology.Efficiency) *float64 { return &e.StepOverheadUS })
	if err != nil {
		return err
	}
	med, _ = medianMax(fitted)
	c.Efficiency.StepOverheadUS = med
	c.Latency = &LatencyFit{StepOverheadUS: med, Samples: len(fitted), Sources: sources}
	return nil
}

// overheadLow is the least overhead fitOverhead fits (its bisection's low
// end): a sample at it is as fast as the model with none, or faster.
const overheadLow = 0.01

// fitOverhead is, for each sample of at most FitLatencyMaxBytes, the
// overhead (the field of c's efficiency that field names, from
// overheadLow to 1000 µs) at which its prediction meets its measurement,
// by bisection (more overhead, less bandwidth), and the samples'
// sources.
func fitOverhead(c *Calibration, samples []Sample, base *topology.Bandwidths, field func(*topology.Efficiency) *float64) ([]float64, []string, error) {
	var fitted []float64
	var sources []string
	for _, s := range samples {
		if s.Bytes > FitLatencyMaxBytes {
			continue
		}
		at := func(us float64) (float64, error) {
			e := *c
			*field(&e.Efficiency) = us
			r, err := predictWith(s, e.Bandwidths(base))
			return r.BusBWGBps, err
		}
		lo, hi := overheadLow, 1000.0
		blo, err := at(lo)
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", s.Source, err)
		}
		bhi, err := at(hi)
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", s.Source, err)
		}
		var us float64
		switch {
		case s.BusBWGBps >= blo:
			us = lo // as fast as no overhead, or faster
		case s.BusBWGBps <= bhi:
			us = hi
		default:
			for range 50 {
				mid := math.Sqrt(lo * hi)
				b, err := at(mid)
				if err != nil {
					return nil, nil, fmt.Errorf("%s: %w", s.Source, err)
				}
				if b > s.BusBWGBps {
					lo = mid
				} else {
					hi = mid
				}
			}
			us = math.Sqrt(lo * hi)
		}
		fitted = append(fitted, us)
		sources = append(sources, s.Source)
	}
	return fitted, sources, nil
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
