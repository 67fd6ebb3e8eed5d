package placer

import (
	"fmt"
	"math"
	"slices"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/internal/placer/aware"
	"github.com/toposched/toposched/internal/store"
)

// Compact is topology-aware's rule on when a job spread over nodes starts.
//
// # The rule
//
// On a busy cluster a job of more GPUs than a node holds fits, by count,
// as soon as enough GPUs are free anywhere: the leftovers of many nodes.
// Placed there at once, its tensor-parallel groups cross nodes, its run
// is stretched several times, and it holds a share of every node it
// touches, which keeps those nodes from the jobs that need one whole. So
// a topology-aware job whose best placement spans nodes is started only
// where its predicted step time (compute + communication, the cost
// model's) is at most MaxStretch times its step time on an ideal
// placement: the one topology-aware chooses on the same cluster with
// nothing running (Ideal). Otherwise it waits, with the reason
// CodeCompactAwaited, and is tried again as GPUs free, like any waiting
// job.
//
// The wait is bounded by the reservation: once the job is the head of the
// queue and has waited --reserve-after, nodes are held for it, and once
// they hold it the rule no longer applies, so it starts on the first
// placement there is. The nodes held for such a job are ones it would run
// on within MaxStretch, where there are such (see StretchOn), so that
// the placement it starts on once they drain is a fast one. With the
// reservation off the rule is off too.
// Placement makes the hold, and retries the queue, only when a job ends
// or the topology or policies change: on a quiet cluster a head kept
// waiting waits for the next of those (BENCHMARKS.md: on ITP cluster01,
// 6% busy, eight jobs of 32 and 64 GPUs waited 0.6 to 24 h).
// Held nodes drain as their jobs end; a job that never ends on one (a
// service rather than a training run) keeps the hold from ever holding
// the head, which then waits for a compact placement elsewhere. A
// cluster with such jobs on the nodes of large ones turns the rule off
// (--max-stretch 0).
//
// A job whose step compute time is unknown (no step_compute_seconds and
// no model size), one placed on one node, and a job of another strategy
// are placed as before.
type Compact struct {
	// MaxStretch is the longest predicted step time a spread over nodes
	// may have, as a multiple of the ideal one.
	MaxStretch float64
	// Ideal returns the job's communication per step on an ideal
	// placement (NaN when none is known).
	Ideal func(job events.JobAnalyzed) float64
	// IdealOn returns the job's communication per step on
	// topology-aware's choice among the nodes, emptied (NaN when they
	// cannot hold it); nil: the reservation does not ask.
	IdealOn func(job events.JobAnalyzed, nodes map[string]bool) float64
}

// DefaultMaxStretch is Compact.MaxStretch's default: a start that makes
// the job run half as long again as it would on a compact placement.
const DefaultMaxStretch = 1.5

// CodeCompactAwaited is the reason code of a job kept waiting by Compact.
const CodeCompactAwaited = "compact_placement_awaited"

// check returns topology-aware's hook for job (engine.Options.Compact),
// nil where the rule does not apply: no rule, a job whose compute time is
// unknown, or the reserved head once its held nodes hold it.
func (c *Compact) check(snap *store.Snapshot, job events.JobAnalyzed, res *Reservation) func([]store.GPUKey, float64) (events.Reason, bool) {
	if !c.Applies(job) {
		return nil
	}
	if res != nil && res.JobID == job.Job.JobID && holdsNow(snap, job, res.Nodes) {
		return nil
	}
	comp := aware.StepCompute(job.Job)
	return func(gpus []store.GPUKey, comm float64) (events.Reason, bool) {
		if math.IsNaN(comm) || !slices.ContainsFunc(gpus, func(g store.GPUKey) bool { return g.Node != gpus[0].Node }) {
			return events.Reason{}, false // on one node
		}
		nodes := map[string]bool{}
		for _, g := range gpus {
			nodes[g.Node] = true
		}
		ideal := c.Ideal(job)
		if math.IsNaN(ideal) {
			return events.Reason{}, false
		}
		stretch := (comp + comm) / (comp + ideal)
		if stretch <= c.MaxStretch {
			return events.Reason{}, false
		}
		return events.Reason{Code: CodeCompactAwaited, Field: "gpus", Message: fmt.Sprintf(
			"the best placement free now spans %d nodes and is predicted %.2f times as slow per step as an ideal one (at most %.2f): "+
				"the job waits for a more compact one, at the latest until nodes held for it as the head of the queue hold it",
			len(nodes), stretch, c.MaxStretch)}, true
	}
}

// Applies reports whether the rule is on for job: a rule with a bound,
// a job of 2 GPUs or more that one node need not hold, whose step
// compute time is known.
func (c *Compact) Applies(job events.JobAnalyzed) bool {
	if c == nil || c.MaxStretch <= 0 || c.Ideal == nil || job.Job.GPUs < 2 || job.Job.GPUsPerNode == job.Job.GPUs {
		return false
	}
	return aware.StepCompute(job.Job) > 0
}

// StretchOn is the job's predicted step time on topology-aware's choice
// among the nodes, emptied, as a multiple of its step time on an ideal
// placement: +Inf when the nodes cannot hold it or nothing is known. For
// a job the rule applies to.
func (c *Compact) StretchOn(job events.JobAnalyzed, nodes map[string]bool) float64 {
	if c.IdealOn == nil {
		return math.Inf(1)
	}
	comp, ideal, on := aware.StepCompute(job.Job), c.Ideal(job), c.IdealOn(job, nodes)
	if math.IsNaN(ideal) || math.IsNaN(on) {
		return math.Inf(1)
	}
	return (comp + on) / (comp + ideal)
}

// holdsNow reports whether the held nodes' free GPUs of the job's model,
// in whole gpus_per_node blocks, hold the job now.
func holdsNow(snap *store.Snapshot, job events.JobAnalyzed, nodes map[string]bool) bool {
	model, gpn := job.Job.GPUModel, job.Job.GPUsPerNode
	room := 0
	for n := range nodes {
		d, ok := snap.Domain(store.DomainNode + ":" + n)
		if !ok {
			continue
		}
		f := d.FreeOf(model)
		if gpn > 0 {
			f = f / gpn * gpn
		}
		room += f
	}
	return room >= job.Job.GPUs
}
