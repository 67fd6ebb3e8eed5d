// Package nodefit holds the node-scoring strategies of Kubernetes-style
// schedulers, blind to the topology inside and between nodes:
//
//   - binpack, as Volcano's binpack plugin: the most allocated node that
//     fits first (fewest free GPUs of the job's model), so that whole
//     nodes stay free for large jobs;
//   - spread, as the Kubernetes scheduler's LeastAllocated score: the
//     least allocated node first (most free GPUs), so that load spreads.
//
// Ties go to enumeration order (the cluster file's); inside a node the
// first free GPUs by index are taken, as a device plugin without topology
// hints hands them out.
package nodefit

import (
	"cmp"
	"iter"
	"slices"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/internal/placer/engine"
	"github.com/toposched/toposched/internal/placer/fill"
	"github.com/toposched/toposched/internal/placer/outcome"
	"github.com/toposched/toposched/internal/store"
)

// Strategy names, as recorded in PlacementDecided.Strategy.
const (
	NameBinpack = "binpack"
	NameSpread  = "spread"
)

// Binpack places job on the fullest nodes that fit, of those keep keeps
// (nil: every node), unit GPUs at a time on a node (fill.Place; 1: any
// number).
func Binpack(snap *store.Snapshot, job events.JobAnalyzed, keep engine.Keep, unit int) outcome.Result {
	return fill.Place(snap, job, snap.EachNodeFreeByFit(job.Job.GPUModel, max(job.Job.GPUsPerNode, unit, 1)), fill.First, keep, unit)
}

// Spread places job on the emptiest nodes, of those keep keeps (nil:
// every node), unit GPUs at a time on a node (fill.Place; 1: any number).
func Spread(snap *store.Snapshot, job events.JobAnalyzed, keep engine.Keep, unit int) outcome.Result {
	type entry struct {
		node *store.Node
		free []store.FreeGPU
	}
	var all []entry
	for n, free := range snap.EachNodeFree(job.Job.GPUModel) {
		all = append(all, entry{n, free})
	}
	// Stable: equal free counts keep enumeration order.
	slices.SortStableFunc(all, func(a, b entry) int { return cmp.Compare(len(b.free), len(a.free)) })
	var order iter.Seq2[*store.Node, []store.FreeGPU] = func(yield func(*store.Node, []store.FreeGPU) bool) {
		for _, e := range all {
			if !yield(e.node, e.free) {
				return
			}
		}
	}
	return fill.Place(snap, job, order, fill.First, keep, unit)
}
