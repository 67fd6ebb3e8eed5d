package aware

// Stage 5, the local search (searchStage): the candidate the judge chose
// (judge.go), refined on the predicted comm time (localSearch, then
// exactShares, shares.go) and judged again, kept only if allowed; and,
// where an alternative won, the favourite it displaced refined too. In:
// the shortlist and the judge's choice; out: the placement.
//
// Flow (place.go): walk → single-node exact choice → multi-node →
// judge → local search; see internal/placer/README.md.

import (
	"cmp"
	"math"
	"slices"
	"time"

	"github.com/toposched/toposched/internal/store"
)

// searchStage is the local search on the chosen candidate (refine, whose
// result is judged again). When an alternative is the favourite of a job
// of at most 16 GPUs, whose local search trades ranks and GPUs across
// nodes, the choice without it is refined too, and kept unless the
// alternative is still better by 0.5% after the search (fewer nodes,
// groups kept whole). A larger job's search stays inside nodes, which
// changes neither the nodes nor which groups cross them: the comparison
// before it stands. It explains the candidates judged and answers the
// one placed.
func (p *placer) searchStage(s shortlist, chosen *cand, judged []*cand) *cand {
	final := p.refine(chosen, s.across)
	if s.alt && chosen == s.list[0] && p.n <= 16 {
		if other, _ := p.choose(s.list[1:], s.more); other != nil {
			r := p.refine(other, s.across)
			best := min(p.score(final), p.score(r))
			cf, co := 1+chosen.j.Score, 1+other.j.Score
			if best > 0 && !math.IsInf(best, 0) {
				cf, co = p.score(final)/best+chosen.j.Score, p.score(r)/best+other.j.Score
			}
			if !(cf < co-0.005*math.Abs(co)) {
				chosen, final = other, r
				if !slices.Contains(judged, other) {
					judged = append(judged, other)
				}
			}
		}
	}
	*chosen = *final
	p.explain(judged, chosen)
	return chosen
}

// refine is the local search's result on c, each node's share then
// chosen exactly (exactShares), judged again with a Judge and kept only if
// allowed; or c when nothing moved.
func (p *placer) refine(c *cand, across bool) *cand {
	if c.settled && !across {
		// Every swap of its ranks and every exchange for a spare GPU of
		// its node costs the same (exactInNode): nothing to search, and
		// the search's clock starts afresh for the next candidate, as it
		// would after a search.
		p.since = time.Time{}
		p.score(c)
		return c
	}
	gpus, t := p.localSearch(c.gpus, p.cands, across, c.comm)
	if searchEvals(p.opts) != 0 {
		gpus, t = p.exactShares(gpus, t)
	}
	if slices.Equal(gpus, c.gpus) {
		if math.IsNaN(c.comm) {
			c.comm = t
		}
		return c
	}
	refined := &cand{domain: c.domain, gpus: gpus, comm: t, cost: c.cost}
	if p.opts.Judge != nil {
		// The search moved ranks or GPUs: what the policies see may have
		// changed (a TP group's islands), so the result is judged again
		// and kept only if it passes.
		p.judge(refined)
		if refined.j.Deny {
			return c
		}
	}
	return refined
}

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
	s := &search{p: p, cur: slices.Clone(gpus), curT: curT, spare: map[string][]int{}}
	if math.IsNaN(s.curT) {
		s.curT = p.e.cost(s.cur)
	}
	s.out = func() bool { return p.e.evals-start >= maxEvals || (budget > 0 && time.Now().After(deadline)) }
	// Free GPUs not taken, per node.
	taken := map[store.GPUKey]bool{}
	for _, g := range s.cur {
		taken[g] = true
	}
	onNode := map[string]bool{}
	for _, g := range s.cur {
		if !onNode[g.Node] {
			onNode[g.Node] = true
			s.nodes = append(s.nodes, g.Node)
		}
	}
	for _, c := range cands {
		if !onNode[c.node.Name] {
			continue
		}
		for _, g := range c.free {
			if !taken[g.Key()] {
				s.spare[c.node.Name] = append(s.spare[c.node.Name], g.Index)
			}
		}
	}
	s.crossOK = len(s.cur) <= 16
	if across = across && s.crossOK; across {
		s.others = p.otherNodes(s.cur, cands, onNode)
	}
	for improved := true; improved && !s.out(); {
		improved = s.swapRanks()
		improved = s.swapSpares() || improved
		if !across {
			continue
		}
		improved = s.toUsedNodes() || improved
		improved = s.toOtherNodes() || improved
	}
	return s.cur, s.curT
}

// search is one local search's state: the placement so far and its
// predicted comm time, the free GPUs not taken on the nodes it uses
// (spare), those nodes in order of first rank then as (d) adds them, and
// the nodes it does not use that (d) may try (others).
type search struct {
	p       *placer
	cur     []store.GPUKey
	curT    float64
	spare   map[string][]int
	nodes   []string
	others  []*candNode
	crossOK bool        // rank swaps may cross nodes (at most 16 GPUs)
	out     func() bool // the evaluations or the time are spent
}

// try takes next when it is faster than the placement so far.
func (s *search) try(next []store.GPUKey) bool {
	t := s.p.e.cost(next)
	if t < s.curT*(1-1e-9) {
		s.cur, s.curT = next, t
		return true
	}
	return false
}

// swapRanks is moves (a) and (c): rank swaps, inside a node or, for a
// job of at most 16 GPUs, across nodes.
func (s *search) swapRanks() bool {
	improved := false
	for i := 0; i < len(s.cur) && !s.out(); i++ {
		for j := i + 1; j < len(s.cur) && !s.out(); j++ {
			if s.cur[i].Node != s.cur[j].Node && !s.crossOK {
				continue
			}
			next := slices.Clone(s.cur)
			next[i], next[j] = next[j], next[i]
			if s.try(next) {
				improved = true
			}
		}
	}
	return improved
}

// swapSpares is move (b): a taken GPU for a spare one of its node.
func (s *search) swapSpares() bool {
	improved := false
	for i := 0; i < len(s.cur) && !s.out(); i++ {
		sp := s.spare[s.cur[i].Node]
		for si := 0; si < len(sp) && !s.out(); si++ {
			next := slices.Clone(s.cur)
			old := next[i].Index
			next[i].Index = sp[si]
			if s.try(next) {
				sp[si] = old
				improved = true
			}
		}
	}
	return improved
}

// toUsedNodes is move (d): a taken GPU for a spare one of another node
// the job uses.
func (s *search) toUsedNodes() bool {
	improved := false
	for i := 0; i < len(s.cur) && !s.out(); i++ {
		for _, node := range s.nodes {
			sp := s.spare[node]
			if node == s.cur[i].Node {
				continue
			}
			for si := 0; si < len(sp) && !s.out(); si++ {
				next := slices.Clone(s.cur)
				old := next[i]
				next[i] = store.GPUKey{Node: node, Index: sp[si]}
				if s.try(next) {
					sp[si] = -1
					s.spare[node] = slices.DeleteFunc(sp, func(x int) bool { return x < 0 })
					s.spare[old.Node] = append(s.spare[old.Node], old.Index)
					improved = true
					break
				}
			}
		}
	}
	return improved
}

// toOtherNodes is move (d): a taken GPU for the best-fit GPU of a node
// the job does not use, kept only when faster by 0.5%; that node's other
// free GPUs become spares.
func (s *search) toOtherNodes() bool {
	improved := false
	for i := 0; i < len(s.cur) && !s.out(); i++ {
		for oi := 0; oi < len(s.others) && !s.out(); oi++ {
			c := s.others[oi]
			if c == nil {
				continue
			}
			in, err := s.p.pick(c, 1)
			if err != nil {
				continue
			}
			next := slices.Clone(s.cur)
			old := next[i]
			next[i] = store.GPUKey{Node: c.node.Name, Index: in.gpus[0]}
			if t := s.p.e.cost(next); t < s.curT*(1-0.005) {
				s.cur, s.curT = next, t
				s.others[oi] = nil
				s.nodes = append(s.nodes, c.node.Name)
				for _, g := range c.free {
					if g.Index != in.gpus[0] {
						s.spare[c.node.Name] = append(s.spare[c.node.Name], g.Index)
					}
				}
				s.spare[old.Node] = append(s.spare[old.Node], old.Index)
				improved = true
			}
		}
	}
	return improved
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
