package aware

// Compute by GPU model (engine.Options.ComputeReference): a candidate's
// predicted step time is the job's compute on the slowest GPU model it
// takes plus its communication, so that a tighter fit on a slower box is
// weighed with what it costs the job's compute, not its communication
// alone. A compute correction in force (topology.Bandwidths.Compute, the
// optimizer's online compute calibration) multiplies a time the speed
// table scaled onto a model by the model's measured factor, and divides
// out the factor of the model the time was scaled from: a job's own time
// on a model is that model's measured speed already.

import (
	"math"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/internal/gpuspeed"
	"github.com/toposched/toposched/internal/store"
	"github.com/toposched/toposched/internal/topology"
)

// modelCompute prices one job's compute per step on each GPU model.
type modelCompute struct {
	snap *store.Snapshot
	job  events.JobSubmitted
	ref  string
	bw   *topology.Bandwidths
	// base is the job's compute on the reference model (StepCompute; NaN
	// when unknown).
	base float64
	// byNode caches each node's answer, byModel each model's.
	byNode  map[string]float64
	byModel map[string]float64
}

func newModelCompute(snap *store.Snapshot, job events.JobSubmitted, ref string, bw *topology.Bandwidths) *modelCompute {
	return &modelCompute{snap: snap, job: job, ref: ref, bw: bw, base: StepCompute(job), byNode: map[string]float64{}, byModel: map[string]float64{}}
}

// onReference is the job's compute on the reference model: StepCompute,
// else from its own per-model times; 0 when unknown.
func (m *modelCompute) onReference() float64 {
	t := m.onModel(m.ref)
	if math.IsNaN(t) {
		return 0
	}
	return t
}

// onModel is the job's compute per step on GPUs of model (NaN when
// unknown): gpuspeed.JobCompute, a model the table does not know taken
// at the reference's pace.
func (m *modelCompute) onModel(model string) float64 {
	if t, ok := m.byModel[model]; ok {
		return t
	}
	t, from, ok := gpuspeed.JobComputeFrom(m.job.StepComputeSecondsByModel, m.base, model, m.ref)
	if !ok {
		t = m.base
	} else {
		t *= m.correction(model, from)
	}
	if !(t > 0) || math.IsInf(t, 0) {
		t = math.NaN()
	}
	m.byModel[model] = t
	return t
}

// correction is the factor the compute corrections in force put on a time
// scaled from the model the table names from onto model: model's factor
// over from's (1 where neither has one, or the time is model's own).
func (m *modelCompute) correction(model, from string) float64 {
	on, _ := gpuspeed.Lookup(model)
	if on.Name == from {
		return 1
	}
	f := 1.0
	if c, ok := m.bw.ComputeOf(on.Name); ok {
		f = c.Factor
	}
	if c, ok := m.bw.ComputeOf(from); ok {
		f /= c.Factor
	}
	return f
}

// onNode is onModel for a node's GPUs.
func (m *modelCompute) onNode(name string) float64 {
	if t, ok := m.byNode[name]; ok {
		return t
	}
	model := ""
	if n, ok := m.snap.Node(name); ok {
		model = n.GPUModel
	}
	t := m.onModel(model)
	m.byNode[name] = t
	return t
}

// compOn is the job's compute per step on gpus: e.comp where compute is
// blind to the model, else the slowest of its nodes' (a synchronous step
// waits for its slowest rank); e.comp where that is unknown.
func (e *evaluator) compOn(gpus []store.GPUKey) float64 {
	if e.byModel == nil {
		return e.comp
	}
	worst, last := math.NaN(), ""
	for _, g := range gpus {
		if g.Node == last {
			continue
		}
		last = g.Node
		if t := e.byModel.onNode(g.Node); !math.IsNaN(t) && !(t <= worst) {
			worst = t
		}
	}
	if math.IsNaN(worst) {
		return e.comp
	}
	return worst
}

// stepOn is a candidate's predicted step time, compute on its models plus
// its communication, where compute is weighed by model.
func (p *placer) stepOn(c *cand) float64 {
	return p.e.compOn(c.gpus) + p.score(c)
}

// fastEnoughFirst orders a one-GPU job's picks (best fit first) where
// compute is weighed by model and the job's compute is known: the picks
// whose compute is within the fit tolerance of the fastest pick's go
// first, in their order, on a busy cluster (bestFitWithin's rule: best
// fit among those fast enough); elsewhere the fastest model's picks. A
// one-GPU job communicates nothing, so its compute is its step.
func (p *placer) fastEnoughFirst(picks []inNode) []inNode {
	if p.e.byModel == nil || len(picks) < 2 {
		return picks
	}
	comp := make([]float64, len(picks))
	fastest := math.Inf(1)
	for i, pk := range picks {
		comp[i] = p.e.byModel.onModel(pk.c.node.GPUModel) // the pick's row: no lookup by name
		if comp[i] < fastest {
			fastest = comp[i]
		}
	}
	if math.IsInf(fastest, 1) {
		return picks // no compute time known
	}
	bound := fastest * (1 + 1e-9)
	if p.busy && fitTolerance(p.opts) > 0 {
		bound = fastest * (1 + fitTolerance(p.opts))
	}
	out := make([]inNode, 0, len(picks))
	for i, pk := range picks {
		if comp[i] <= bound {
			out = append(out, pk)
		}
	}
	for i, pk := range picks {
		if !(comp[i] <= bound) {
			out = append(out, pk)
		}
	}
	return out
}

// ComputeEstimate is a job's predicted compute per step on a placement,
// where compute is weighed by GPU model, and what it was predicted from.
type ComputeEstimate struct {
	Seconds float64
	// Model is the GPU model that sets it, the slowest of the
	// placement's, as its node reports it.
	Model string
	// From is the speed table's name of the model the job's time was
	// measured on (or taken as measured on, for its step_compute_seconds):
	// Model's own where the job gave its time there; "" where the table
	// knows Model not.
	From string
	// Estimated is whether the job gave no compute time at all: it was
	// estimated from the size of its model (StepCompute).
	Estimated bool
	// Factor is what the compute corrections in force multiplied the
	// table's time by (1: none), and Correction Model's own correction
	// (Factor 0: none).
	Factor     float64
	Correction topology.ComputeCorrection
}

// EstimateCompute is job's compute per step on gpus where compute is
// weighed by GPU model with the reference ref, under the compute
// corrections of bw (nil: none): what placement's compute term charges.
// ok is false where the job's compute is not known.
func EstimateCompute(snap *store.Snapshot, job events.JobAnalyzed, gpus []store.GPUKey, ref string, bw *topology.Bandwidths) (ComputeEstimate, bool) {
	// compOn's rule, without the evaluator's communication groups, which
	// compute does not need (the optimizer asks on every telemetry).
	m := newModelCompute(snap, job.Job, ref, bw)
	est := ComputeEstimate{Seconds: math.NaN(), Factor: 1}
	last := ""
	for _, g := range gpus {
		if g.Node == last {
			continue
		}
		last = g.Node
		if t := m.onNode(g.Node); !math.IsNaN(t) && !(t <= est.Seconds) {
			est.Seconds = t
			if n, ok := snap.Node(g.Node); ok {
				est.Model = n.GPUModel
			}
		}
	}
	if math.IsNaN(est.Seconds) {
		est.Seconds = m.base
		if math.IsNaN(est.Seconds) {
			est.Seconds = m.onReference()
		}
	}
	if !(est.Seconds > 0) {
		return ComputeEstimate{}, false
	}
	sub := job.Job
	measured := false
	for k, v := range sub.StepComputeSecondsByModel {
		if _, known := gpuspeed.Lookup(k); (known || k == est.Model) && v > 0 {
			measured = true
		}
	}
	est.Estimated = !measured && !(sub.StepComputeSeconds > 0)
	if _, from, ok := gpuspeed.JobComputeFrom(sub.StepComputeSecondsByModel, m.base, est.Model, ref); ok {
		est.From = from
		est.Factor = m.correction(est.Model, from)
		on, _ := gpuspeed.Lookup(est.Model)
		est.Correction, _ = bw.ComputeOf(on.Name)
	}
	return est, true
}
