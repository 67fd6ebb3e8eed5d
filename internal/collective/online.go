package collective

import (
	"fmt"
	"maps"
	"math"
	"slices"
)

// Online moves a calibration from what running jobs measure (telemetry's
// bus bandwidth per group), in bounded steps that one job cannot drag:
//
//   - An observation is the measured over the predicted bandwidth of one
//     group's call whose time the bandwidth term decides, filed under the
//     kind of link that bounds it (LinkKind).
//   - The caller leaves out what a diagnosis explains (a degraded link,
//     congestion, ranks on the wrong NIC): that is the job's trouble, not
//     the machine's rate. A ratio beyond [1/Outlier, Outlier] is refused
//     as a misreport.
//   - A kind moves once it has MinSamples observations, half the way (in
//     log space) to their median (a minority of slowed or misreported
//     calls does not move it), and by at most MaxStep of its efficiency per step: a wrong batch costs a
//     few percent, not the model, while a machine that is consistently
//     slower than the defaults is still learnt, a few percent a batch.
//     Its observations are then dropped, since they were measured against
//     the old prediction.
//   - A move smaller than MinMove is not worth a new version of the set.
//
// The zero value is not usable; NewOnline has the defaults.
type Online struct {
	MinSamples int
	// Window is how many of a kind's latest observations are kept.
	Window  int
	MaxStep float64
	Outlier float64
	MinMove float64

	obs map[string][]Observation
}

// Observation is one group's measured over predicted bandwidth.
type Observation struct {
	// Kind is the kind of link that bounds it: nvlink, nvls, pcie or net.
	Kind  string
	Ratio float64
	// Source says where it was measured (job and step), for the fit's
	// evidence.
	Source string
}

// Defaults of NewOnline.
const (
	OnlineMinSamples = 32
	OnlineWindow     = 64
	OnlineMaxStep    = 0.05
	OnlineOutlier    = 10
	OnlineMinMove    = 0.01
	// MinEfficiency is the lowest share of line rate a step may move a
	// kind to.
	MinEfficiency = 0.05
)

// NewOnline is an Online with the defaults.
func NewOnline() *Online {
	return &Online{MinSamples: OnlineMinSamples, Window: OnlineWindow, MaxStep: OnlineMaxStep,
		Outlier: OnlineOutlier, MinMove: OnlineMinMove}
}

// Observe files an observation; it reports false, keeping nothing, for an
// unknown kind or a ratio that is not a positive number within the
// outlier bounds.
func (o *Online) Observe(ob Observation) bool {
	if !slices.Contains(LinkKinds, ob.Kind) || !(ob.Ratio > 0) || math.IsInf(ob.Ratio, 0) ||
		ob.Ratio > o.Outlier || ob.Ratio < 1/o.Outlier {
		return false
	}
	if o.obs == nil {
		o.obs = map[string][]Observation{}
	}
	l := append(o.obs[ob.Kind], ob)
	if len(l) > o.Window {
		l = l[len(l)-o.Window:]
	}
	o.obs[ob.Kind] = l
	return true
}

// Pending is how many observations of each kind wait for a step.
func (o *Online) Pending() map[string]int {
	out := map[string]int{}
	for k, l := range o.obs {
		out[k] = len(l)
	}
	return out
}

// Step returns c (nil: the defaults) moved by the kinds that have enough
// observations, named name, or nil when no kind moved by MinMove. Kinds
// that had enough observations start again either way.
func (o *Online) Step(c *Calibration, name string) *Calibration {
	eff := c.Resolved()
	cur := map[string]*float64{}
	for i, p := range shares(&eff) {
		cur[LinkKinds[i]] = p
	}
	var moved []Fit
	for _, k := range LinkKinds {
		l := o.obs[k]
		if len(l) < o.MinSamples {
			continue
		}
		delete(o.obs, k)
		ratios := make([]float64, len(l))
		sources := make([]string, 0, 4)
		for i, ob := range l {
			ratios[i] = ob.Ratio
			if ob.Source != "" && !slices.Contains(sources, ob.Source) && len(sources) < 4 {
				sources = append(sources, ob.Source)
			}
		}
		if len(sources) > 0 && len(l) > len(sources) {
			sources = append(sources, fmt.Sprintf("and %d more", len(l)-len(sources)))
		}
		med, _ := medianMax(ratios)
		// Half the way in log space: a batch's median still carries its
		// noise, and halving each correction averages it out over steps.
		step := min(max(math.Sqrt(med), 1/(1+o.MaxStep)), 1+o.MaxStep)
		v := min(max(*cur[k]*step, MinEfficiency), 1)
		if math.Abs(v / *cur[k] - 1) < o.MinMove {
			continue
		}
		*cur[k] = v
		moved = append(moved, Fit{Kind: k, Efficiency: v, Samples: len(l), Ratio: med, Sources: sources})
	}
	if len(moved) == 0 {
		return nil
	}
	// Kinds that did not move keep what the set said, a default (0)
	// included: a transport left at 0 goes on following Net.
	// The per-model entries, the latency fits and the compute factors stay
	// as they were: the online moves are the cluster's links'.
	out := c.successor(name)
	out.Fits = nil
	set := shares(&out.Efficiency)
	for _, f := range moved {
		*set[slices.Index(LinkKinds, f.Kind)] = f.Efficiency
	}
	if c != nil {
		for _, f := range c.Fits {
			if !slices.ContainsFunc(moved, func(m Fit) bool { return m.Kind == f.Kind }) {
				out.Fits = append(out.Fits, f)
			}
		}
	}
	out.Fits = append(out.Fits, moved...)
	// A fit carried over whose value in force the move changed (a
	// transport or a model's entry left at 0, following what moved) is
	// no longer that value's evidence, and a set must not say two things.
	out.Fits = slices.DeleteFunc(out.Fits, func(f Fit) bool { return !out.agrees(f) })
	slices.SortStableFunc(out.Fits, func(a, b Fit) int {
		return slices.Index(LinkKinds, a.Kind) - slices.Index(LinkKinds, b.Kind)
	})
	return out
}

// successor is a new version of c (nil: the documented defaults) named
// name, keeping all it says: each online step changes its own part of a
// copy, so that a field added to Calibration is carried over by both.
func (c *Calibration) successor(name string) *Calibration {
	out := &Calibration{}
	if c != nil {
		*out = *c
		out.Models = maps.Clone(c.Models)
		out.Fits = slices.Clone(c.Fits)
		out.ModelLatency = slices.Clone(c.ModelLatency)
		out.Compute = slices.Clone(c.Compute)
	}
	out.Version, out.Name = CalibrationVersion, name
	return out
}
