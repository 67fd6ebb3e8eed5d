package replay

// How long a job runs on the placement it got (see the package doc, "Run
// time"): the cost model's step time there against its step time on an
// ideal placement of the same size.

import (
	"fmt"
	"math"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/internal/formats/clusterfile"
	"github.com/toposched/toposched/internal/gpuspeed"
	"github.com/toposched/toposched/internal/pattern"
	"github.com/toposched/toposched/internal/placer"
	"github.com/toposched/toposched/internal/placer/aware"
	"github.com/toposched/toposched/internal/placer/engine"
	"github.com/toposched/toposched/internal/placer/outcome"
	"github.com/toposched/toposched/internal/store"
	"github.com/toposched/toposched/internal/topology"
)

// ReferenceFLOPS is the training throughput of one GPU, FLOP/s: an A100's
// bf16 peak (312 TFLOP/s) at 40% model FLOPs utilisation. It is the same
// for every GPU model: a trace's durations already include the GPUs that
// ran them, and only communication is scaled by placement. Set, with
// ComputeShare, before any replay figure was seen. It is the placer's
// (aware.StepCompute), so that the compute a replay charges is the one
// topology-aware weighs a slower link against.
const ReferenceFLOPS = aware.ReferenceFLOPS

// ComputeShare is the share of a step a job of gpus GPUs spends computing
// on an ideal placement, for jobs whose model gives no size (ComputeSeconds
// falls back to it; no public trace gives compute times). It follows the
// seed chapters' 8-GPU job (18% of its step communicating when placed
// well), with larger jobs spending more of their step in collectives.
func ComputeShare(gpus int) float64 {
	switch {
	case gpus <= 1:
		return 1
	case gpus <= 8:
		return 0.8
	case gpus <= 64:
		return 0.7
	}
	return 0.6
}

// ComputeSeconds is a training step's compute time for sub: its own
// step_compute_seconds when it gives one; else 6 FLOPs per parameter and
// token (forward and backward, Kaplan et al. 2020) over the step's tokens
// (global batch × sequence), shared by its GPUs at ReferenceFLOPS; else,
// with no model size, what ComputeShare makes of the ideal placement's
// communication. NaN when none applies.
func ComputeSeconds(sub events.JobSubmitted, ideal float64) float64 {
	if c := aware.StepCompute(sub); !math.IsNaN(c) {
		return c
	}
	if share := ComputeShare(sub.GPUs); share < 1 && ideal > 0 {
		return ideal * share / (1 - share)
	}
	return math.NaN()
}

// Stretch is the factor a job's trace duration is multiplied by: its step
// time on a placement predicted to communicate comm seconds per step over
// its step time on an ideal placement of the same size, which
// communicates ideal seconds ((compute + comm) / (compute + ideal); the
// cost model counts no overlap). ok is false, and the stretch 1, when
// something is unknown: no prediction, no ideal placement, no compute
// time.
func Stretch(compute, comm, ideal float64) (float64, bool) {
	if !(compute > 0) || !finite(compute) || !finite(comm) || comm < 0 || !finite(ideal) || ideal < 0 {
		return 1, false
	}
	return (compute + comm) / (compute + ideal), true
}

// StretchOn is Stretch where compute is charged by GPU model: the job
// computes computeOn seconds per step on the model it landed on against
// compute on the reference model its trace duration was measured on,
// ((computeOn + comm) / (compute + ideal)). A job of one GPU communicates
// nothing, with or without a prediction. Where computeOn is unknown (a
// model the table does not know) it is Stretch.
func StretchOn(compute, computeOn, comm, ideal float64, gpus int) (float64, bool) {
	if gpus <= 1 {
		comm, ideal = 0, 0
	}
	s, ok := Stretch(compute, comm, ideal)
	if !ok || !(computeOn > 0) || !finite(computeOn) {
		return s, ok
	}
	return (computeOn + comm) / (compute + ideal), true
}

// computeOn is job i's compute per step on the nodes it was given, at the
// pace of the slowest of their GPU models (a synchronous step waits for
// its slowest rank): its own time for a model where it gives one, else
// its compute on the reference model scaled by the models' speeds
// (gpuspeed.JobCompute). NaN when a model is unknown to the table.
func (r *runner) computeOn(i int, nodes []events.NodePlacement) float64 {
	sub, ref := r.subs[i], r.cfg.ComputeReference
	worst := math.NaN()
	for _, n := range nodes {
		k, ok := r.cfg.Inventory.index[n.Node]
		if !ok {
			return math.NaN()
		}
		t, ok := gpuspeed.JobCompute(sub.StepComputeSecondsByModel, r.jobs[i].compute, r.cfg.Inventory.Nodes[k].Model, ref)
		if !ok || !finite(t) {
			return math.NaN()
		}
		if math.IsNaN(worst) || t > worst {
			worst = t
		}
	}
	return worst
}

// computeNote says how compute was charged, for the summary's notes.
func computeNote(ref string, jobs []jobState) string {
	unknown := 0
	for _, j := range jobs {
		if j.state == stPlaced && math.IsNaN(j.computeOn) {
			unknown++
		}
	}
	spec, _ := gpuspeed.Lookup(ref)
	return fmt.Sprintf("compute charged per GPU model: the trace's durations taken as measured on %s, a job's compute scaled to the slowest "+
		"GPU model it lands on by sqrt(bf16 TFLOPS × memory GB/s) (internal/gpuspeed); %d placed jobs (a model not in the table, or no "+
		"compute time) keep the reference model's compute", spec.Name, unknown)
}

func nanZero(f float64) float64 {
	if math.IsNaN(f) {
		return 0
	}
	return f
}

// idealModel finds a job's communication per step on an ideal placement
// of its size: the least the cost model predicts among the placements
// every strategy the placement service runs chooses on the empty cluster.
// Jobs of the same shape share one answer.
type idealModel struct {
	snap   *store.Snapshot
	fabric *topology.Fabric
	cache  map[string]float64
}

func newIdealModel(clusterFile string) (*idealModel, error) {
	c, err := clusterfile.LoadCluster(clusterFile)
	if err != nil {
		return nil, err
	}
	st, err := store.New()
	if err != nil {
		return nil, fmt.Errorf("ideal placements: %w", err)
	}
	for _, n := range c.Nodes {
		if err := st.UpsertNode(n); err != nil {
			return nil, fmt.Errorf("ideal placements: node %s: %w", n.Name, err)
		}
	}
	m := &idealModel{cache: map[string]float64{}}
	if len(c.Fabric.Switches) > 0 {
		if m.fabric, err = st.ApplyFabric(c.Fabric); err != nil {
			return nil, fmt.Errorf("ideal placements: fabric: %w", err)
		}
	}
	m.snap = st.Snapshot()
	return m, nil
}

// comm is the ideal communication per step of sub (NaN when no strategy
// places it on the empty cluster, or the cost model cannot score it).
func (m *idealModel) comm(sub events.JobSubmitted) float64 {
	key := fmt.Sprintf("%d/%d/%s/%s/%v/%s", sub.GPUs, sub.GPUsPerNode, sub.GPUModel, sub.Strategy, *sub.Parallelism, sub.Labels["replay.model"])
	if v, ok := m.cache[key]; ok {
		return v
	}
	best := math.NaN()
	job, reasons := pattern.Analyze(sub)
	if len(reasons) == 0 {
		for _, name := range placer.Names(true) {
			s, err := placer.Lookup(name, true)
			if err != nil {
				continue
			}
			r, _, err := s.Place(engine.Request{Snap: m.snap, Job: job, Options: engine.Options{Fabric: m.fabric}})
			if err != nil || r.Verdict != outcome.Placed {
				continue
			}
			p, err := placer.Prediction(m.snap, job, r.GPUs, m.fabric, nil, name)
			if err != nil {
				continue
			}
			if math.IsNaN(best) || p.CommSecondsPerStep < best {
				best = p.CommSecondsPerStep
			}
		}
	}
	m.cache[key] = best
	return best
}
