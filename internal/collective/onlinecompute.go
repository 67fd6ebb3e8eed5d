package collective

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"time"

	"github.com/toposched/toposched/internal/gpuspeed"
)

// OnlineCompute moves the GPU models' compute factors (Calibration.Compute)
// from what running jobs measure (telemetry's compute time per step):
//
//   - An observation is one job's measured compute per step on GPUs of one
//     model over what the speed table predicts for it there, the model's
//     factor as that job sees it, filed under the table's name for the
//     model. The caller leaves out what says nothing of the model's speed
//     (see services/optimizer's calibrate.go).
//   - A job counts once per model: its latest observation replaces its
//     earlier ones, so a job that reports every few steps weighs what one
//     that reports rarely does, and one misbehaving job is one vote.
//   - A factor beyond [1/Outlier, Outlier] is refused as a misreport; an
//     observation older than MaxAge is forgotten, and a model keeps its
//     latest Window jobs' only (the machine may have changed: a driver, a
//     clock, a cooling fault mended).
//   - The estimate is the median of the jobs kept: a minority of slowed or
//     misreporting jobs does not move it. A model moves toward it once
//     MinJobs jobs observed it since its last step (a move a batch of
//     jobs, not one a telemetry message), by at most
//     MaxStep of its factor, and never outside [MinComputeFactor,
//     MaxComputeFactor]: a wrong batch costs a bounded step, and a model
//     that is consistently slower than the table says is still learnt.
//   - A move smaller than MinMove is not worth a new version of the set.
//
// The zero value is not usable; NewOnlineCompute has the defaults.
type OnlineCompute struct {
	MinJobs int
	// Window is how many jobs' observations a model keeps, the latest.
	Window  int
	MaxStep float64
	Outlier float64
	MinMove float64
	MaxAge  time.Duration

	obs map[string][]ComputeObservation
	// batch counts each model's steps.
	batch map[string]int
}

// ComputeObservation is one job's measured compute on GPUs of one model
// over the speed table's prediction for it: the model's factor as the job
// measures it.
type ComputeObservation struct {
	// Model is the GPU model, in any spelling the speed table knows.
	Model  string
	Job    string
	Factor float64
	At     time.Time
	// Source says where it was measured (job and step).
	Source string

	// batch is the model's step count when it was filed: the jobs of the
	// current batch are the model's fresh ones.
	batch int
}

// Defaults of NewOnlineCompute. Eight jobs is the smallest batch whose
// median one or two slowed jobs cannot decide; the median of the latest
// 32 is within 6% of the truth where a fifth of the jobs run slowed and
// a tenth misreport (TestOnlineComputeConverges); a step of at most 20% learns a
// model the table has 2x wrong in four batches.
const (
	OnlineComputeMinJobs = 8
	OnlineComputeWindow  = 32
	OnlineComputeMaxStep = 0.2
	OnlineComputeOutlier = MaxComputeFactor
	OnlineComputeMinMove = 0.01
	OnlineComputeMaxAge  = 24 * time.Hour
)

// NewOnlineCompute is an OnlineCompute with the defaults.
func NewOnlineCompute() *OnlineCompute {
	return &OnlineCompute{MinJobs: OnlineComputeMinJobs, Window: OnlineComputeWindow, MaxStep: OnlineComputeMaxStep,
		Outlier: OnlineComputeOutlier, MinMove: OnlineComputeMinMove, MaxAge: OnlineComputeMaxAge}
}

// Observe files an observation; it reports false, keeping nothing, for a
// model the speed table does not know, no job, or a factor that is not a
// positive number within the outlier bounds.
func (o *OnlineCompute) Observe(ob ComputeObservation) bool {
	s, ok := gpuspeed.Lookup(ob.Model)
	if !ok || ob.Job == "" || !(ob.Factor > 0) || ob.Factor > o.Outlier || ob.Factor < 1/o.Outlier {
		return false
	}
	ob.Model, ob.batch = s.Name, o.batch[s.Name]
	if o.obs == nil {
		o.obs, o.batch = map[string][]ComputeObservation{}, map[string]int{}
	}
	l := slices.DeleteFunc(o.obs[s.Name], func(p ComputeObservation) bool { return p.Job == ob.Job })
	l = append(l, ob)
	if len(l) > o.Window {
		l = l[len(l)-o.Window:]
	}
	o.obs[s.Name] = l
	return true
}

// fresh is how many jobs observed model since its last step.
func (o *OnlineCompute) fresh(model string) int {
	n := 0
	for _, ob := range o.obs[model] {
		if ob.batch == o.batch[model] {
			n++
		}
	}
	return n
}

// Pending is how many jobs' observations each model (by the table's name)
// keeps.
func (o *OnlineCompute) Pending() map[string]int {
	out := map[string]int{}
	for k, l := range o.obs {
		out[k] = len(l)
	}
	return out
}

// Step returns c (nil: the defaults) with the factors of the models due a
// move (see OnlineCompute) moved, named name, or nil when no model moved
// by MinMove. now ages the observations out.
func (o *OnlineCompute) Step(c *Calibration, name string, now time.Time) *Calibration {
	due := false
	for model := range o.obs {
		due = due || o.fresh(model) >= o.MinJobs
	}
	if !due {
		return nil // called on every telemetry: most calls end here
	}
	cur := map[string]ComputeFit{}
	if c != nil {
		for _, f := range c.Compute {
			if s, ok := gpuspeed.Lookup(f.Model); ok {
				f.Model = s.Name
				cur[s.Name] = f
			}
		}
	}
	var moved []ComputeFit
	for _, model := range slices.Sorted(maps.Keys(o.obs)) {
		l := slices.DeleteFunc(o.obs[model], func(ob ComputeObservation) bool { return now.Sub(ob.At) > o.MaxAge })
		o.obs[model] = l
		if len(l) == 0 {
			delete(o.obs, model)
		}
		if o.fresh(model) < o.MinJobs {
			continue
		}
		o.batch[model]++
		factors := make([]float64, len(l))
		sources := make([]string, 0, 5)
		for i, ob := range l {
			factors[i] = ob.Factor
			if ob.Source != "" && len(sources) < 4 {
				sources = append(sources, ob.Source)
			}
		}
		if len(sources) > 0 && len(l) > len(sources) {
			sources = append(sources, fmt.Sprintf("and %d more", len(l)-len(sources)))
		}
		med, _ := medianMax(factors)
		f, had := cur[model]
		if !had {
			f = ComputeFit{Model: model, Factor: 1}
		}
		step := min(max(med/f.Factor, 1/(1+o.MaxStep)), 1+o.MaxStep)
		v := min(max(f.Factor*step, MinComputeFactor), MaxComputeFactor)
		if math.Abs(v/f.Factor-1) < o.MinMove {
			continue
		}
		moved = append(moved, ComputeFit{Model: model, Factor: v, Samples: len(l), Ratio: med / f.Factor, Sources: sources})
	}
	if len(moved) == 0 {
		return nil
	}
	out := c.successor(name)
	for _, f := range moved {
		cur[f.Model] = f
	}
	out.Compute = nil
	for _, model := range slices.Sorted(maps.Keys(cur)) {
		out.Compute = append(out.Compute, cur[model])
	}
	return out
}
