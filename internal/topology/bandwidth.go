package topology

import "strings"

// Bandwidths are the per-direction bandwidths (GB/s) and latencies (µs)
// paths are scored with. The defaults are public hardware figures; a
// cluster file may override any of them.
//
//	NVLink per link and direction: gen 1 (P100) 20, gen 2 (V100) 25,
//	  gen 3 (A100) 25 (12 links: 300), gen 4 (H100/H200) 25 (18 links: 450),
//	  gen 5 (B200/GB200) 50 (18 links: 900) — NVIDIA product pages.
//	PCIe x16 per direction: gen 3 15.75, gen 4 31.5, gen 5 63 — PCI-SIG.
//	SMP interconnect between sockets: 20.8 (one Intel UPI link at
//	  10.4 GT/s); P2P traffic across it is usually further limited by the
//	  root complexes, which the cost model's calibration accounts for.
//
// Latencies are small-message one-way figures of the order NCCL's tuning
// tables use: NVLink 0.6, PCIe within a switch 1.0, through the host
// bridge 1.5, across host bridges 2.0, across sockets 2.5, network 5.0.
type Bandwidths struct {
	NVLinkPerLink map[int]float64 `json:"nvlink_per_link_gbps"` // by generation
	PCIe          map[int]float64 `json:"pcie_x16_gbps"`        // by generation
	SMP           float64         `json:"smp_gbps"`
	// Unknown generations fall back to these.
	DefaultNVLinkGen int `json:"default_nvlink_gen"`
	DefaultPCIeGen   int `json:"default_pcie_gen"`

	LatencyUS map[Class]float64 `json:"-"`

	// Efficiency, where a calibration sets it, replaces the cost model's
	// documented share of line rate per kind of link
	// (internal/collective's Eff* constants) and its per-step overhead.
	Efficiency Efficiency `json:"efficiency,omitzero"`
	// ByModel overrides Efficiency on nodes whose GPUs are of a model
	// (keys as ModelKey has them), where a calibration was fitted per
	// node model; its zero values leave Efficiency's.
	ByModel map[string]Efficiency `json:"by_model,omitempty"`
	// Compute corrects the compute speed internal/gpuspeed's table gives
	// a GPU model, by the table's name for it, where a calibration
	// measured the model (the optimizer's online compute calibration): a
	// step's compute scaled by the table onto the model is multiplied by
	// its Factor.
	Compute map[string]ComputeCorrection `json:"compute,omitempty"`
}

// ComputeCorrection is a GPU model's measured compute time over what the
// speed table predicts, and its evidence.
type ComputeCorrection struct {
	Factor float64 `json:"factor"`
	// Samples are the runs it was measured from, Set the calibration set
	// that carries it (online: the optimizer's).
	Samples int    `json:"samples"`
	Set     string `json:"set,omitempty"`
}

// ComputeOf is the correction in force for the GPU model the speed table
// names name; ok is false (b nil included) where none is.
func (b *Bandwidths) ComputeOf(name string) (ComputeCorrection, bool) {
	if b == nil {
		return ComputeCorrection{}, false
	}
	c, ok := b.Compute[name]
	return c, ok && c.Factor > 0
}

// ModelKey is how a GPU model names a calibration's entry: lower case,
// without the vendor ("NVIDIA A100-SXM4-80GB" and "A100-SXM4-80GB" are
// one model).
func ModelKey(model string) string {
	m := strings.ToLower(strings.TrimSpace(model))
	return strings.TrimSpace(strings.TrimPrefix(m, "nvidia"))
}

// EfficiencyOf is the efficiency on a node whose GPUs are of model:
// Efficiency, with ByModel's non-zero values for the model over it.
func (b *Bandwidths) EfficiencyOf(model string) Efficiency {
	e := b.Efficiency
	o, ok := b.ByModel[ModelKey(model)]
	if !ok {
		return e
	}
	for _, f := range []struct {
		dst *float64
		v   float64
	}{
		{&e.NVLink, o.NVLink}, {&e.NVLS, o.NVLS}, {&e.PCIe, o.PCIe}, {&e.Net, o.Net}, {&e.EFA, o.EFA}, {&e.TCP, o.TCP},
		{&e.StepOverheadUS, o.StepOverheadUS}, {&e.OpOverheadUS, o.OpOverheadUS},
	} {
		if f.v > 0 {
			*f.dst = f.v
		}
	}
	return e
}

// Efficiency is what a calibration fits: the share of line rate a large
// NCCL transfer achieves on each kind of link, and the overhead of one
// step of an algorithm; 0 leaves the model's default.
type Efficiency struct {
	NVLink float64 `json:"nvlink,omitempty"`
	NVLS   float64 `json:"nvls,omitempty"`
	PCIe   float64 `json:"pcie,omitempty"`
	Net    float64 `json:"net,omitempty"`
	// EFA and TCP are the NICs of those transports (NIC.Transport); 0
	// leaves them at Net's.
	EFA            float64 `json:"efa,omitempty"`
	TCP            float64 `json:"tcp,omitempty"`
	StepOverheadUS float64 `json:"step_overhead_us,omitempty"`
	// OpOverheadUS is the time a collective call takes beyond the
	// model's own (its launch and steps), once a call: where the host's
	// launch path, not the links, sets a floor. Calibration fits it from
	// small messages; 0: none.
	OpOverheadUS float64 `json:"op_overhead_us,omitempty"`
}

// defaults is the shared, never modified table that a nil *Bandwidths
// means: building one allocates maps, and paths are asked for in hot loops.
var defaults = DefaultBandwidths()

// orDefaults returns b, or the shared defaults when b is nil.
func orDefaults(b *Bandwidths) *Bandwidths {
	if b == nil {
		return defaults
	}
	return b
}

// DefaultBandwidths returns the documented defaults.
func DefaultBandwidths() *Bandwidths {
	return &Bandwidths{
		NVLinkPerLink:    map[int]float64{1: 20, 2: 25, 3: 25, 4: 25, 5: 50},
		PCIe:             map[int]float64{3: 15.75, 4: 31.5, 5: 63},
		SMP:              20.8,
		DefaultNVLinkGen: 3,
		DefaultPCIeGen:   4,
		LatencyUS: map[Class]float64{
			Self: 0, NV: 0.6, NVB: 1.2, PIX: 1.0, PXB: 1.2, PHB: 1.5, NODE: 2.0, SYS: 2.5, NET: 5.0,
		},
	}
}

// Of returns the bandwidth and latency of a link on a node of the given
// NVLink and PCIe generations (0: unknown, the defaults apply).
func (b *Bandwidths) Of(l Link, nvlinkGen, pcieGen int) (gbps, latencyUS float64) {
	nv := b.NVLinkPerLink[nvlinkGen]
	if nv == 0 {
		nv = b.NVLinkPerLink[b.DefaultNVLinkGen]
	}
	pcie := b.PCIe[pcieGen]
	if pcie == 0 {
		pcie = b.PCIe[b.DefaultPCIeGen]
	}
	latencyUS = b.LatencyUS[l.Class]
	switch l.Class {
	case NV:
		return nv * float64(l.NVLinks), latencyUS
	case NVB:
		// Two NVLink hops through a GPU: a single link is the bottleneck.
		return nv, latencyUS
	case PIX, PXB, PHB, NODE:
		return pcie, latencyUS
	case SYS:
		return min(pcie, b.SMP), latencyUS
	}
	return 0, latencyUS
}
