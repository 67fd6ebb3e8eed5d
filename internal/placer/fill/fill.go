// Package fill takes a job's GPUs from nodes in the order a peer strategy
// ranks them (binpack, spread, random, go-gpuallocator's best effort):
// the node order and the choice inside a node are the strategy's, the
// rules of gpus and gpus_per_node are the same for all of them.
package fill

import (
	"fmt"
	"iter"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/internal/placer/blind"
	"github.com/toposched/toposched/internal/placer/engine"
	"github.com/toposched/toposched/internal/placer/outcome"
	"github.com/toposched/toposched/internal/store"
)

// Pick chooses k of a node's free GPUs (sorted by index, len(free) >= k).
type Pick func(node *store.Node, free []store.FreeGPU, k int) []store.FreeGPU

// First picks the first k free GPUs by index, as blind first fit does.
func First(_ *store.Node, free []store.FreeGPU, k int) []store.FreeGPU { return free[:k] }

// Place decides for job with the nodes in the order nodes yields them
// (each with its free GPUs of the job's model, by index) and pick's choice
// inside each node. Whether the job can ever fit or must wait is blind
// first fit's answer on the same snapshot (the rules do not depend on the
// order), so every peer strategy waits and rejects exactly when blind does.
//
// With gpus_per_node k the job takes k GPUs from each of the first
// gpus/k nodes that have k free; without, it takes every node's free GPUs
// (up to what is still missing) until it has them all. Nodes keep does not
// keep are passed over (nil keeps all), and blind's verdict is the one on
// the kept nodes (blind.PlaceOn).
//
// With unit above 1 the GPUs are taken unit at a time, each unit on one
// node: a job of tensor-parallel groups run as one pod (or Slurm task) a
// group, as Kubernetes and Slurm users run them, whose scheduler fits each
// pod on a node without knowing what joins the GPUs. Without
// gpus_per_node a node then gives the most whole units it has free, up to
// what is still missing; with it, gpus_per_node must be a multiple of unit
// (each node's share is whole units already). Ranks follow the order
// taken, so groups of unit consecutive ranks land on one node each. Where
// the free GPUs are enough but not in whole units, the job waits.
func Place(snap *store.Snapshot, job events.JobAnalyzed, nodes iter.Seq2[*store.Node, []store.FreeGPU], pick Pick, keep engine.Keep, unit int) outcome.Result {
	r := blind.PlaceOn(snap, job, keep)
	if r.Verdict != outcome.Placed {
		return r
	}
	n, gpn := job.Job.GPUs, job.Job.GPUsPerNode
	unit = max(unit, 1)
	if n%unit != 0 || (gpn > 0 && gpn%unit != 0) {
		return outcome.Result{Verdict: outcome.Never, Reasons: []events.Reason{{Code: outcome.CodeGPUsPerNodeNotDivisor,
			Field: outcome.FieldGPUsPerNode, Message: fmt.Sprintf("groups of %d GPUs do not divide gpus %d and gpus_per_node %d", unit, n, gpn)}}}
	}
	taken := make([]store.GPUKey, 0, n)
	for node, free := range nodes {
		k := min(len(free), n-len(taken)) / unit * unit
		if gpn > 0 {
			if len(free) < gpn {
				continue
			}
			k = gpn
		}
		if k == 0 || (keep != nil && !keep(node, free)) {
			continue
		}
		for _, g := range pick(node, free, k) {
			taken = append(taken, g.Key())
		}
		if len(taken) == n {
			return outcome.Result{Verdict: outcome.Placed, GPUs: taken}
		}
	}
	if unit > 1 {
		return outcome.Result{Verdict: outcome.Wait, Reasons: []events.Reason{{Code: outcome.CodeInsufficientFreeGPUs, Field: outcome.FieldGPUs,
			Message: fmt.Sprintf("needs %d groups of %d free GPUs on one node each, %d such groups free now", n/unit, unit, len(taken)/unit)}}}
	}
	// Blind found room on the same snapshot, so an order that misses it
	// is the strategy's bug: wait rather than place wrong.
	return outcome.Result{Verdict: outcome.Wait, Reasons: []events.Reason{{Code: outcome.CodeInsufficientFreeGPUs,
		Field: outcome.FieldGPUs, Message: "the strategy's node order found fewer free GPUs than first fit"}}}
}
