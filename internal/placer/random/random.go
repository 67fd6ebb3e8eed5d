// Package random is the random placement strategy: nodes in a random
// order, random free GPUs inside each, the floor any scheduler should
// beat. The draw is seeded by the job's id, so a job gets the same GPUs on
// the same cluster state every time (replays and tests repeat).
package random

import (
	"hash/fnv"
	"iter"
	"math/rand/v2"
	"slices"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/internal/placer/engine"
	"github.com/toposched/toposched/internal/placer/fill"
	"github.com/toposched/toposched/internal/placer/outcome"
	"github.com/toposched/toposched/internal/store"
)

// Name is the strategy's name, as recorded in PlacementDecided.Strategy.
const Name = "random"

// Place places job on random nodes of those keep keeps (nil: every node)
// and random GPUs of them, unit GPUs at a time on a node (fill.Place; 1:
// any number).
func Place(snap *store.Snapshot, job events.JobAnalyzed, keep engine.Keep, unit int) outcome.Result {
	h := fnv.New64a()
	_, _ = h.Write([]byte(job.Job.JobID)) // a hash's Write never fails
	rng := rand.New(rand.NewPCG(h.Sum64(), 0x9e3779b97f4a7c15))
	type entry struct {
		node *store.Node
		free []store.FreeGPU
	}
	var all []entry
	for n, free := range snap.EachNodeFree(job.Job.GPUModel) {
		all = append(all, entry{n, free})
	}
	rng.Shuffle(len(all), func(i, j int) { all[i], all[j] = all[j], all[i] })
	var order iter.Seq2[*store.Node, []store.FreeGPU] = func(yield func(*store.Node, []store.FreeGPU) bool) {
		for _, e := range all {
			if !yield(e.node, e.free) {
				return
			}
		}
	}
	pick := func(_ *store.Node, free []store.FreeGPU, k int) []store.FreeGPU {
		idx := rng.Perm(len(free))[:k]
		slices.Sort(idx) // ranks in index order, as a device plugin lists them
		out := make([]store.FreeGPU, k)
		for i, x := range idx {
			out[i] = free[x]
		}
		return out
	}
	return fill.Place(snap, job, order, pick, keep, unit)
}
