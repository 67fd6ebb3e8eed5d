package aware

// Stage 3, the local search: the candidate the judge chose (judge.go)
// among the single-node (single.go) or multi-node (multi.go) ones, refined
// on the predicted comm time. Next, place (place.go) has the result judged
// again and keeps it only if allowed.
//
// Flow (place.go): candidates → single node or multi-node → judge →
// local search → judge again.

import (
	"cmp"
	"math"
	"slices"
	"time"

	"github.com/toposched/toposched/internal/store"
)

// localSearch refines the rank order and the GPUs inside nodes on the
// predicted comm time, within the evaluation and time budgets. With
// across, a job of at most 16 GPUs may also trade GPUs across nodes (d):
// a taken GPU for a spare one of another node it uses, or for one of a
// node it does not use yet (the nearest of cands, best fit first, up to
// searchOtherNodes of them), the latter kept only when faster by 0.5%, so
// that a node more is taken only for a real gain.
//
// curT is the predicted comm time of gpus, when known (else NaN); the
// result's is returned with it (NaN when the search did not run).
func (p *placer) localSearch(gpus []store.GPUKey, cands []*candNode, across bool, curT float64) ([]store.GPUKey, float64) {
	maxEvals := searchEvals(p.opts)
	if maxEvals == 0 || len(p.e.groups) == 0 || len(gpus) < 2 {
		return gpus, curT
	}
	began := time.Now()
	if !p.since.IsZero() {
		began, p.since = p.since, time.Time{}
	}
	budget := searchBudget(p.opts)
	deadline := began.Add(budget)
	start := p.e.evals
	cur := slices.Clone(gpus)
	if math.IsNaN(curT) {
		curT = p.e.cost(cur)
	}
	out := func() bool { return p.e.evals-start >= maxEvals || (budget > 0 && time.Now().After(deadline)) }
	// Free GPUs not taken, per node.
	spare := map[string][]int{}
	taken := map[store.GPUKey]bool{}
	for _, g := range cur {
		taken[g] = true
	}
	onNode := map[string]bool{}
	var nodes []string // the nodes used, in order of first rank, then those (d) adds
	for _, g := range cur {
		if !onNode[g.Node] {
			onNode[g.Node] = true
			nodes = append(nodes, g.Node)
		}
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
	var others []*candNode // nodes the job does not use, for (d)
	if across = across && crossOK; across {
		others = p.otherNodes(cur, cands, onNode)
	}
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
		if !across {
			continue
		}
		// (d): a taken GPU for a spare one of another node the job uses.
		for i := 0; i < len(cur) && !out(); i++ {
			for _, node := range nodes {
				sp := spare[node]
				if node == cur[i].Node {
					continue
				}
				for si := 0; si < len(sp) && !out(); si++ {
					next := slices.Clone(cur)
					old := next[i]
					next[i] = store.GPUKey{Node: node, Index: sp[si]}
					if try(next) {
						sp[si] = -1
						spare[node] = slices.DeleteFunc(sp, func(x int) bool { return x < 0 })
						spare[old.Node] = append(spare[old.Node], old.Index)
						improved = true
						break
					}
				}
			}
		}
		// (d): a taken GPU for the best-fit GPU of a node the job does not
		// use, kept only when faster by 0.5%; that node's other free GPUs
		// become spares.
		for i := 0; i < len(cur) && !out(); i++ {
			for oi := 0; oi < len(others) && !out(); oi++ {
				c := others[oi]
				if c == nil {
					continue
				}
				in, err := p.pick(c, 1)
				if err != nil {
					continue
				}
				next := slices.Clone(cur)
				old := next[i]
				next[i] = store.GPUKey{Node: c.node.Name, Index: in.gpus[0]}
				if t := p.e.cost(next); t < curT*(1-0.005) {
					cur, curT = next, t
					others[oi] = nil
					nodes = append(nodes, c.node.Name)
					for _, g := range c.free {
						if g.Index != in.gpus[0] {
							spare[c.node.Name] = append(spare[c.node.Name], g.Index)
						}
					}
					spare[old.Node] = append(spare[old.Node], old.Index)
					improved = true
				}
			}
		}
	}
	return cur, curT
}

// searchOtherNodes bounds the nodes the job does not use that the local
// search's move (d) tries.
const searchOtherNodes = 8

// otherNodes lists up to searchOtherNodes of cands the job (on gpus, its
// nodes in used) does not use: those sharing the smallest fabric domain
// with its first node first, then the fewest free GPUs (best fit), then
// the candidates' order.
func (p *placer) otherNodes(gpus []store.GPUKey, cands []*candNode, used map[string]bool) []*candNode {
	var first *candNode
	for _, c := range cands {
		if c.node.Name == gpus[0].Node {
			first = c
			break
		}
	}
	shared := func(c *candNode) int {
		if first == nil {
			return 0
		}
		for l, d := range first.fabric {
			if slices.Contains(c.fabric, d) {
				return l
			}
		}
		return len(first.fabric)
	}
	var out []*candNode
	for _, c := range cands {
		if !used[c.node.Name] && len(c.free) > 0 {
			out = append(out, c)
		}
	}
	slices.SortStableFunc(out, func(a, b *candNode) int {
		return cmp.Or(cmp.Compare(shared(a), shared(b)), cmp.Compare(len(a.free), len(b.free)))
	})
	return out[:min(len(out), searchOtherNodes)]
}
