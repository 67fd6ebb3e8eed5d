package aware

import (
	"fmt"
	"math"
	"slices"

	"github.com/toposched/toposched/internal/placer/blind"
	"github.com/toposched/toposched/internal/placer/engine"
	"github.com/toposched/toposched/internal/placer/outcome"
	"github.com/toposched/toposched/internal/store"
)

// ExhaustiveLimit is the most cost-model evaluations Exhaustive makes:
// C(free, n) · n! (every subset of the candidate GPUs, every rank order on
// it).
const ExhaustiveLimit = 200_000

// ExhaustiveCount returns how many evaluations Exhaustive would make for n
// ranks among free candidate GPUs: C(free, n) · n!.
func ExhaustiveCount(free, n int) float64 {
	if n > free || n < 0 {
		return 0
	}
	c := 1.0
	for i := range n {
		c *= float64(free - i) // C(free,n)·n! = free!/(free-n)!
	}
	return c
}

// Exhaustive returns the optimum under the cost model: of every subset of
// the free GPUs (of the model, on nodes the filter accepts, gpus_per_node
// on each node used when given) and every rank order on it, the one with
// the least predicted comm time per step (the first found on ties, in
// enumeration order). Jobs blind refuses or cannot fit get blind's
// verdict. It returns an error, and makes no evaluation, when the count
// exceeds ExhaustiveLimit.
func Exhaustive(req engine.Request) (outcome.Result, error) {
	snap, job, opts := req.Snap, req.Job, req.Options
	base := blind.Place(snap, job)
	if base.Verdict != outcome.Placed {
		return base, nil
	}
	n, gpn, model := job.Job.GPUs, job.Job.GPUsPerNode, job.Job.GPUModel
	cands, total, _ := candidates(snap, model, opts.Filter)
	if wait, ok := filterWait(cands, total, n, gpn, model); ok {
		return wait, nil
	}
	if cnt := ExhaustiveCount(total, n); cnt > ExhaustiveLimit {
		return outcome.Result{}, fmt.Errorf("exhaustive: %.0f candidates exceed the limit of %d; use %s", cnt, ExhaustiveLimit, Name)
	}
	var all []store.GPUKey
	for _, c := range cands {
		for _, g := range c.free {
			all = append(all, g.Key())
		}
	}
	e := newEvaluator(snap, job, n, opts)
	var best []store.GPUKey
	bestT := math.Inf(1)
	sub := make([]store.GPUKey, 0, n)
	perm := make([]store.GPUKey, n)
	var rec func(start int)
	rec = func(start int) {
		if len(sub) == n {
			if gpn > 0 && !perNode(sub, gpn) {
				return
			}
			copy(perm, sub)
			if len(e.groups) == 0 {
				if best == nil {
					best, bestT = slices.Clone(perm), 0
				}
				return
			}
			heap(perm, func(p []store.GPUKey) {
				if t := e.cost(p); t < bestT {
					best, bestT = slices.Clone(p), t
				}
			})
			return
		}
		for i := start; i <= len(all)-(n-len(sub)); i++ {
			sub = append(sub, all[i])
			rec(i + 1)
			sub = sub[:len(sub)-1]
		}
	}
	rec(0)
	if best == nil {
		return waitReason(n, gpn, model, total, 0), nil
	}
	return outcome.Result{Verdict: outcome.Placed, GPUs: best}, nil
}

func perNode(gpus []store.GPUKey, gpn int) bool {
	cnt := map[string]int{}
	for _, g := range gpus {
		cnt[g.Node]++
	}
	for _, c := range cnt {
		if c != gpn {
			return false
		}
	}
	return true
}

// heap calls fn with every permutation of a (Heap's algorithm, iterative).
func heap(a []store.GPUKey, fn func([]store.GPUKey)) {
	c := make([]int, len(a))
	fn(a)
	for i := 0; i < len(a); {
		if c[i] < i {
			if i%2 == 0 {
				a[0], a[i] = a[i], a[0]
			} else {
				a[c[i]], a[i] = a[i], a[c[i]]
			}
			fn(a)
			c[i]++
			i = 0
		} else {
			c[i] = 0
			i++
		}
	}
}
