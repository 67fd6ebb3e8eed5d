package aware

// Stage 3, the local search: the candidate the judge chose (judge.go)
// among the single-node (single.go) or multi-node (multi.go) ones, refined
// on the predicted comm time. Next, place (place.go) has the result judged
// again and keeps it only if allowed.
//
// Flow (place.go): candidates → single node or multi-node → judge →
// local search → judge again.

import (
	"slices"
	"time"

	"github.com/toposched/toposched/internal/store"
)

// localSearch refines the rank order and the GPUs inside nodes on the
// predicted comm time, within the evaluation and time budgets.
func (p *placer) localSearch(gpus []store.GPUKey, cands []*candNode) []store.GPUKey {
	maxEvals := p.opts.maxEvals()
	if maxEvals == 0 || len(p.e.groups) == 0 || len(gpus) < 2 {
		return gpus
	}
	deadline := time.Now().Add(p.opts.budget())
	start := p.e.evals
	cur := slices.Clone(gpus)
	curT := p.e.cost(cur)
	out := func() bool { return p.e.evals-start >= maxEvals || time.Now().After(deadline) }
	// Free GPUs not taken, per node.
	spare := map[string][]int{}
	taken := map[store.GPUKey]bool{}
	for _, g := range cur {
		taken[g] = true
	}
	onNode := map[string]bool{}
	for _, g := range cur {
		onNode[g.Node] = true
	}
	for _, c := range cands {
		if !onNode[c.node.Name] {
			continue
		}
		for _, g := range c.free {
			if !taken[g.Key()] {
				spare[c.node.Name] = append(spare[c.node.Name], g.Index)
			}
		}
	}
	try := func(next []store.GPUKey) bool {
		t := p.e.cost(next)
		if t < curT*(1-1e-9) {
			cur, curT = next, t
			return true
		}
		return false
	}
	crossOK := len(cur) <= 16
	for improved := true; improved && !out(); {
		improved = false
		// (a) and (c): rank swaps.
		for i := 0; i < len(cur) && !out(); i++ {
			for j := i + 1; j < len(cur) && !out(); j++ {
				if cur[i].Node != cur[j].Node && !crossOK {
					continue
				}
				next := slices.Clone(cur)
				next[i], next[j] = next[j], next[i]
				if try(next) {
					improved = true
				}
			}
		}
		// (b): a taken GPU for a spare one of its node.
		for i := 0; i < len(cur) && !out(); i++ {
			sp := spare[cur[i].Node]
			for si := 0; si < len(sp) && !out(); si++ {
				next := slices.Clone(cur)
				old := next[i].Index
				next[i].Index = sp[si]
				if try(next) {
					sp[si] = old
					improved = true
				}
			}
		}
	}
	return cur
}
