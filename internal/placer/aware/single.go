package aware

// Stage 2, the single-node exact choice (singleStage): for a job one node
// can hold, each fitting node's best subset of free GPUs (pick), the
// one-node candidates ranked by level, fit and the cost model
// (singleNode), the exact choice on the nodes scored (exactInNode) and
// the best fit within a tolerance (bestFitWithin). In: walked.fit; out: a
// shortlist, the favourite first. The multi-node stage (multi.go) reuses
// pick for each node's share.
//
// Flow (place.go): walk → single-node exact choice → multi-node →
// judge → local search; see internal/placer/README.md.

import (
	"cmp"
	"math"
	"slices"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/internal/store"
)

// shortlist is what the single-node and multi-node stages hand the
// judge: the candidates, the favourite first, and the local search's
// reach.
type shortlist struct {
	list []*cand
	// more lists further candidates, for a judge that denies list; nil
	// when there are none.
	more func() []*cand
	// across lets the local search trade GPUs across nodes, over the
	// whole cluster's candidates (p.cands).
	across bool
	// alt says list[0] is an alternative grouping or spread, faster than
	// the favourite it displaced (list[1]).
	alt bool
	// elsewhere lists the job's spreads in the other fabric domains that
	// hold it, for when Options.Compact keeps the chosen one waiting
	// (judgeStage); nil for a job one node holds.
	elsewhere func() []*cand
}

// singleStage is the single-node exact choice for a job one node can
// hold (w.fit non-empty): the one-node candidates (singleNode), walked on
// to maxJudged when the judge denies a one-GPU job's favourite, and, for
// a job without gpus_per_node, the spreads over nodes for when every
// one-node candidate is denied.
func (p *placer) singleStage(w *walked, job events.JobAnalyzed) shortlist {
	var s shortlist
	x := p.opts.Explain
	levels := 0
	if x != nil {
		levels = len(x.Explanation.Levels)
	}
	s.list = p.singleNode(w.fit)
	if w.longer != nil && len(s.list) > 0 && p.opts.Judge != nil {
		if first := s.list[0]; !p.passes(first) {
			// As if the walk had gone on to maxJudged from the start:
			// its favourite is the same one, judged already.
			w.fit = w.longer()
			p.cands = w.fit
			if x != nil {
				x.Explanation.Levels = x.Explanation.Levels[:levels]
			}
			s.list = p.singleNode(w.fit)
			if len(s.list) > 0 && s.list[0].domain == first.domain && slices.Equal(s.list[0].gpus, first.gpus) {
				s.list[0].j, s.list[0].judged = first.j, true
			}
		}
	}
	if gpn := job.Job.GPUsPerNode; gpn == 0 {
		// Spread over nodes, for when every one-node candidate is
		// denied; those that land on one node were seen already.
		s.more = func() []*cand {
			p.cands = w.full() // holds the nodes of fit too
			return slices.DeleteFunc(p.multiNode(p.cands, job, gpn, p.limit()), func(c *cand) bool {
				return !slices.ContainsFunc(c.gpus, func(g store.GPUKey) bool { return g.Node != c.gpus[0].Node })
			})
		}
	}
	return s
}

// inNode is a chosen subset of one node's free GPUs.
type inNode struct {
	c            *candNode
	gpus         []int // GPU indices, in rank order
	level        int   // 0 island, 1 PCIe group, 2 NUMA, 3 node
	minBW, sumBW float64
	holes        int // sum over the taken GPUs of the free GPUs of their smallest domain
	fit          int // free GPUs the node keeps
}

// domainCount is one node-local domain and its free GPUs; a node has a
// few, so a slice searched in order beats a map.
type domainCount struct {
	id   string
	free int
}

// countLocal adds a node's free GPUs' node-local domains (island, PCIe
// group, NUMA node) to counts, reused, and returns it.
func countLocal(counts []domainCount, free []store.FreeGPU) []domainCount {
	counts = counts[:0]
	for _, g := range free {
		for _, d := range g.Domains {
			if store.LocalLevel(d) == 3 {
				continue
			}
			i := slices.IndexFunc(counts, func(c domainCount) bool { return c.id == d })
			if i < 0 {
				counts = append(counts, domainCount{id: d})
				i = len(counts) - 1
			}
			counts[i].free++
		}
	}
	return counts
}

func freeOf(counts []domainCount, id string) int {
	for _, c := range counts {
		if c.id == id {
			return c.free
		}
	}
	return 0
}

// holes returns, for each of the node's free GPUs, the free GPUs of its
// smallest node-local domain (1: it is alone there; the node's free count
// when it has no smaller domain), and leaves the node's domain counts in
// p.counts.
func (p *placer) holes(c *candNode) []int {
	p.counts = countLocal(p.counts, c.free)
	hole := make([]int, len(c.free))
	for i, g := range c.free {
		hole[i] = len(c.free)
		best := 4
		for _, d := range g.Domains {
			if l := store.LocalLevel(d); l < best {
				best, hole[i] = l, freeOf(p.counts, d)
			}
		}
		if best == 4 || best == 3 {
			hole[i] = len(c.free)
		}
	}
	return hole
}

// pick chooses k of the node's free GPUs: the smallest node-local domain
// with room, then a greedy bandwidth-grown subset, best fit on ties. A
// twin of a node already picked for k GPUs gets that node's pick: the
// same links (its topology), free GPUs and node-local domains make the
// same choice.
func (p *placer) pick(c *candNode, k int) (inNode, error) {
	if t := c.twin; t != nil && t != c && !p.noTwinPicks {
		var kept *inNode
		switch {
		case k == 1:
			kept = t.one // the walk's holesOne keeps it
		case t.picked != nil && t.picked.k == k:
			kept = &t.picked.in
		}
		if kept != nil {
			in := *kept
			in.c, in.gpus = c, slices.Clone(in.gpus)
			return in, nil
		}
	}
	in, err := p.pickOn(c, k)
	if err == nil && c.twin == c && k > 1 {
		c.picked = &twinPick{k: k, in: in}
	}
	return in, err
}

// twinHead is the first node of c's twin class where the walk told twins
// apart on their topology, nil otherwise.
func twinHead(c *candNode) *candNode {
	if c.twin != c || hasPaths(c.node) {
		return c.twin
	}
	return nil
}

// hasPaths reports whether the node was reported with the paths between
// its GPUs.
func hasPaths(n *store.Node) bool { return n.Effective != nil && n.Effective.GPUPaths != nil }

// sameIndices reports whether two lists of GPUs, each on one node, take
// the same GPU indices in the same order.
func sameIndices(a, b []store.GPUKey) bool {
	return slices.EqualFunc(a, b, func(x, y store.GPUKey) bool { return x.Index == y.Index })
}

// toFront moves out[i] to the front, the others keeping their order.
func toFront(out []*cand, i int) {
	first := out[i]
	copy(out[1:i+1], out[:i])
	out[0] = first
}

// pickOn is pick, worked out on the node.
func (p *placer) pickOn(c *candNode, k int) (inNode, error) {
	// One GPU needs no bandwidth, so no topology: the node is in the
	// snapshot (it is a candidate), which is all resolving it checks.
	var nt *nodeTopo
	if k > 1 {
		var err error
		if nt, err = p.e.res.node(c.node.Name); err != nil {
			return inNode{}, err
		}
	}
	hole := p.holes(c)
	// Pool: the free GPUs of the smallest domain that fits.
	level, poolDom, poolFree := 3, "", len(c.free)
	for _, dc := range p.counts {
		d, f := dc.id, dc.free
		l := store.LocalLevel(d)
		if f >= k && (l < level || (l == level && (f < poolFree || (f == poolFree && d < poolDom)))) {
			level, poolDom, poolFree = l, d, f
		}
	}
	if k == 1 {
		// What the seed loop below picks for one GPU, without its
		// slices: the pool's first GPU of the smallest hole (seeds are
		// sorted stably by hole, and a later seed wins only with fewer
		// holes; bandwidths are all zero).
		bi := -1
		for i, g := range c.free {
			if (poolDom == "" || slices.Contains(g.Domains, poolDom)) && (bi < 0 || hole[i] < hole[bi]) {
				bi = i
			}
		}
		return inNode{c: c, level: 0, gpus: []int{c.free[bi].Index}, holes: hole[bi], fit: len(c.free) - 1}, nil
	}
	var pool []int // positions in c.free
	for i, g := range c.free {
		if poolDom == "" || slices.Contains(g.Domains, poolDom) {
			pool = append(pool, i)
		}
	}
	bw := p.poolBandwidths(nt, c, pool)
	best := inNode{c: c, level: level, minBW: -1, fit: len(c.free) - k}
	bestSet := growBest(&best, bw, pool, hole, k)
	// Rank order: a chain of best links from the first GPU.
	m := len(pool)
	best.gpus = make([]int, 0, k)
	last, left := bestSet[0], bestSet[1:] // bestSet is ours to reorder
	best.gpus = append(best.gpus, c.free[pool[last]].Index)
	for len(left) > 0 {
		row := bw[last*m : last*m+m]
		bi := 0
		for i, x := range left {
			if row[x] > row[left[bi]] || (row[x] == row[left[bi]] && c.free[pool[x]].Index < c.free[pool[left[bi]]].Index) {
				bi = i
			}
		}
		last = left[bi]
		left = slices.Delete(left, bi, bi+1)
		best.gpus = append(best.gpus, c.free[pool[last]].Index)
	}
	return best, nil
}

// poolBandwidths is the bandwidth between the pool's GPUs (positions in
// c.free), bw[a*m+b] for m of them.
func (p *placer) poolBandwidths(nt *nodeTopo, c *candNode, pool []int) []float64 {
	pos := make([]int, len(c.free))
	for i, g := range c.free {
		pos[i] = nt.pos[g.Index]
	}
	m := len(pool)
	bw := make([]float64, m*m)
	for a := range m {
		for b := range m {
			if a != b {
				bw[a*m+b] = nt.topo.Path(pos[pool[a]], pos[pool[b]], p.e.bw).BandwidthGBps
			}
		}
	}
	return bw
}

// growBest grows a subset of k of the pool greedily from each of up to
// 16 seeds (the fewest holes first), adding the GPU of most bandwidth to
// those taken (fewest holes on ties), and keeps the best by bottleneck,
// then total bandwidth, then holes: its bandwidths and holes in best, its
// pool positions returned.
func growBest(best *inNode, bw []float64, pool, hole []int, k int) []int {
	m := len(pool)
	bestSet := []int(nil)
	better := func(minBW, sumBW float64, holes int) bool {
		switch {
		case minBW != best.minBW:
			return minBW > best.minBW
		case sumBW != best.sumBW:
			return sumBW > best.sumBW
		}
		return holes < best.holes
	}
	seeds := make([]int, m)
	for i := range seeds {
		seeds[i] = i
	}
	slices.SortStableFunc(seeds, func(a, b int) int { return cmp.Compare(hole[pool[a]], hole[pool[b]]) })
	if len(seeds) > 16 {
		seeds = seeds[:16]
	}
	in := make([]bool, m)
	set := make([]int, 0, k)
	for _, s := range seeds {
		clear(in)
		set = append(set[:0], s)
		in[s] = true
		for len(set) < k {
			cand, cs, ch := -1, -1.0, 0
			for x := range m {
				if in[x] {
					continue
				}
				sum := 0.0
				for _, y := range set {
					sum += bw[x*m+y]
				}
				if sum > cs || (sum == cs && hole[pool[x]] < ch) {
					cand, cs, ch = x, sum, hole[pool[x]]
				}
			}
			set = append(set, cand)
			in[cand] = true
		}
		minBW, sumBW, holes := math.Inf(1), 0.0, 0
		for i, a := range set {
			holes += hole[pool[a]]
			for _, b := range set[i+1:] {
				minBW = min(minBW, bw[a*m+b])
				sumBW += bw[a*m+b]
			}
		}
		if bestSet == nil || better(minBW, sumBW, holes) {
			best.minBW, best.sumBW, best.holes = minBW, sumBW, holes
			bestSet = slices.Clone(set)
		}
	}
	return bestSet
}

// singleNode lists the one-node candidates, the favourite first: by
// level (island, PCIe group, NUMA node, node) and fit, each node's best
// subset, the first Options.Candidates scored by the cost model (the
// fastest wins, ties within 0.5% going to the better fit). Nil when no node
// has room.
func (p *placer) singleNode(cands []*candNode) []*cand {
	qs := p.fitting(cands)
	if len(qs) == 0 {
		return nil
	}
	picks := p.picks(p.promising(qs))
	if len(picks) == 0 {
		return nil
	}
	out, slab := p.candsOf(picks)
	if p.n == 1 {
		return out
	}
	p.exactOnScored(out, slab, picks)
	bestI, bestT := -1, inf
	for i := range min(p.limit(), len(out)) {
		t := p.score(out[i])
		if p.e.byModel != nil {
			t = p.stepOn(out[i])
		}
		if bestI < 0 || t < bestT*(1-0.005) {
			bestI, bestT = i, t
		}
	}
	// The fastest first, then the rest in the heuristic's order; where a
	// tighter fit is within the tolerance (bestFitWithin), it goes before
	// them all.
	fav, w := out[bestI], out[p.bestFitWithin(out, picks, bestI)]
	toFront(out, bestI)
	if w != fav {
		toFront(out, slices.Index(out, w))
		p.byFit = w
	}
	return out
}

// fitNode is a node that holds the job, with the level of its smallest
// node-local domain that does and the free GPUs it would keep.
type fitNode struct {
	c     *candNode
	level int
	fit   int
}

// fitting lists the nodes that hold the job, with their levels, and
// explains how many nodes fit at each level.
func (p *placer) fitting(cands []*candNode) []fitNode {
	k := p.n
	qs := make([]fitNode, 0, len(cands))
	fitting := [4]int{}
	for _, c := range cands {
		if len(c.free) < k {
			continue
		}
		level := 0 // one GPU fits the smallest domain
		if k > 1 {
			level = 3
			p.counts = countLocal(p.counts, c.free)
			for _, dc := range p.counts {
				if dc.free >= k {
					level = min(level, store.LocalLevel(dc.id))
				}
			}
		}
		fitting[level]++
		qs = append(qs, fitNode{c, level, len(c.free) - k})
	}
	if x := p.opts.Explain; x != nil {
		// A node whose best fitting domain is an island also has a
		// fitting PCIe group (or NUMA node) only if it has one; count the
		// nodes whose smallest fitting domain is at each level or below.
		names := [4]string{store.DomainIsland, store.DomainPCIe, store.DomainNUMA, store.DomainNode}
		acc := 0
		for l, name := range names {
			acc += fitting[l]
			domains := len(qs)
			if l == 3 {
				domains = len(cands)
			}
			x.Explanation.Levels = append(x.Explanation.Levels, events.LevelCount{Level: name, Domains: domains, Fitting: acc})
		}
	}
	return qs
}

// promising keeps the nodes worth a subset, by level then fit: enough
// that distinct shapes get a look. Where the best fit within a tolerance
// may win (bestFitWithin), the tightest-fitting nodes are kept too,
// whatever their level.
func (p *placer) promising(qs []fitNode) []fitNode {
	limit := singleLimit
	if p.n == 1 {
		limit = oneGPULimit
	}
	var tight []fitNode
	if p.fitRule() && len(qs) > limit {
		tight = slices.Clone(qs)
		slices.SortStableFunc(tight, func(a, b fitNode) int { return cmp.Compare(a.fit, b.fit) })
		tight = tight[:limit]
	}
	slices.SortStableFunc(qs, func(a, b fitNode) int { return cmp.Or(cmp.Compare(a.level, b.level), cmp.Compare(a.fit, b.fit)) })
	if len(qs) > limit {
		qs = qs[:limit]
		for _, q := range tight {
			if !slices.ContainsFunc(qs[:limit], func(o fitNode) bool { return o.c == q.c }) {
				qs = append(qs, q)
			}
		}
	}
	return qs
}

// picks is each node's best subset (pick), in the order candidates rank.
func (p *placer) picks(qs []fitNode) []inNode {
	k := p.n
	picks := make([]inNode, 0, len(qs))
	for _, q := range qs {
		if k == 1 && q.c.one != nil {
			picks = append(picks, *q.c.one)
			continue
		}
		in, err := p.pick(q.c, k)
		if err != nil {
			continue
		}
		picks = append(picks, in)
	}
	if len(picks) == 0 {
		return nil
	}
	if k == 1 {
		// No communication: the fit decides. The judge reads no further
		// than maxJudged candidates (choose), and nothing else reads a
		// one-GPU list, so the rest are not made.
		slices.SortStableFunc(picks, func(a, b inNode) int { return cmp.Or(cmp.Compare(a.holes, b.holes), cmp.Compare(a.fit, b.fit)) })
		picks = p.fastEnoughFirst(picks)
		return picks[:min(len(picks), max(p.limit(), maxJudged))]
	}
	slices.SortStableFunc(picks, func(a, b inNode) int {
		return cmp.Or(cmp.Compare(a.level, b.level), cmp.Compare(b.minBW, a.minBW), cmp.Compare(b.sumBW, a.sumBW),
			cmp.Compare(a.holes, b.holes), cmp.Compare(a.fit, b.fit))
	})
	return picks
}

// candsOf makes the candidates of the picks, in their order: the
// candidates and their keys in two slabs, not two objects each (a 1-GPU
// job has up to 256). slab is out's backing.
func (p *placer) candsOf(picks []inNode) (out []*cand, slab []cand) {
	k := p.n
	out = make([]*cand, len(picks))
	slab = make([]cand, len(picks))
	keyBuf := make([]store.GPUKey, 0, len(picks)*k)
	for i, pk := range picks {
		at := len(keyBuf)
		for _, x := range pk.gpus {
			keyBuf = append(keyBuf, store.GPUKey{Node: pk.c.node.Name, Index: x})
		}
		slab[i] = cand{domain: pk.domain(), gpus: keyBuf[at:len(keyBuf):len(keyBuf)], comm: math.NaN()}
		out[i] = &slab[i]
		if k == 1 {
			out[i].comm = 0
		}
	}
	return out, slab
}

// exactOnScored makes the exact choice on the nodes scored, where it is
// affordable: it can only be as fast as the heuristic's subset or
// faster, since that subset and its order are among the ones it tries.
func (p *placer) exactOnScored(out []*cand, slab []cand, picks []inNode) {
	budget := nodeExact(p.opts)
	for i := range min(p.limit(), len(out)) {
		// A twin of a node scored before, on the same GPUs, costs the
		// same: the cost model reads the node's links, not its name.
		if h := twinHead(picks[i].c); h != nil && !p.noTwinPicks {
			for j := range i {
				if twinHead(picks[j].c) == h && !math.IsNaN(slab[j].comm) && sameIndices(slab[j].gpus, slab[i].gpus) {
					slab[i].comm = slab[j].comm
					break
				}
			}
		}
		gpus, t, ok, settled := p.exactInNode(picks[i].c, out[i].gpus, p.score(out[i]), &budget)
		if ok {
			slab[i].gpus, slab[i].comm = gpus, t
			slab[i].domain = inNode{c: picks[i].c, gpus: indices(gpus)}.domain()
		}
		slab[i].settled = settled
	}
}

// fitRule reports whether bestFitWithin may choose: a job of more than
// one GPU whose step compute time is known, on a busy cluster, with the
// tolerance on.
func (p *placer) fitRule() bool {
	c := p.e.comp
	return p.n > 1 && p.busy && fitTolerance(p.opts) > 0 && c > 0 && !math.IsInf(c, 0)
}

// bestFitWithin weighs what a one-node placement costs the next jobs
// against what it saves this one. Of the one-node candidates (out, and
// their picks in the same order; out[fav] the fastest the cost model
// found), those whose
// predicted step time (compute + communication) is within
// Options.FitTolerance of the fastest's may be taken instead, and the one
// that leaves the next jobs the most is: the one that leaves its node the
// fewest free GPUs (best fit across nodes, as Volcano's binpack plugin
// scores nodes), on ties the one whose node's free GPUs are
// the less tightly joined (a PCIe box's before a whole NVLink island or
// NVSwitch node), then the faster. So a 2-GPU data-parallel job whose
// step is a few percent slower on a PCIe box's free pair takes it and
// leaves the NVSwitch node whole for a job that needs one, and a job
// whose step would be much slower there (tensor parallel, most of its
// step communicating) keeps the fastest node. It answers fav when
// fitRule is false (without the compute time the step's share that is
// communication is unknown, and so is what a slower link costs) or no
// candidate fits tighter within the tolerance.
//
// The rule applies on a busy cluster, where at most half the GPUs of the
// job's model are free, whether or not whole-node jobs wait now: a
// placement holds its GPUs for the job's life, and the jobs it keeps a
// node for are as likely to arrive after the decision as before it (and
// the placer is not shown the queue). On a cluster more than half free
// a node broken now is very likely to have whole twins free when a job
// needs one, so the rule would cost this job its tolerance for nothing;
// there the fastest wins, as before.
func (p *placer) bestFitWithin(out []*cand, picks []inNode, fav int) int {
	if !p.fitRule() {
		return fav
	}
	bound := p.stepOn(out[fav]) * (1 + fitTolerance(p.opts))
	type ranked struct {
		i, fit, level int
	}
	order := make([]ranked, len(picks))
	for i, pk := range picks {
		order[i] = ranked{i, pk.fit, p.freeLevel(pk.c)}
	}
	// Tightest fit first; on ties the less tightly joined node.
	slices.SortStableFunc(order, func(a, b ranked) int { return cmp.Or(cmp.Compare(a.fit, b.fit), cmp.Compare(b.level, a.level)) })
	for g := 0; g < len(order); {
		// One group of equal fit and level: its fastest within bound.
		end := g
		for end < len(order) && order[end].fit == order[g].fit && order[end].level == order[g].level {
			end++
		}
		best, bestT := -1, inf
		for _, r := range order[g:end] {
			if t := p.stepOn(out[r.i]); t <= bound && t < bestT {
				best, bestT = r.i, t
			}
		}
		if best >= 0 {
			return p.fitTrade(out, picks, fav, best)
		}
		g = end
	}
	return fav
}

// freeLevel is the level of the smallest node-local domain that holds
// all of a node's free GPUs (0 an NVLink island, as an NVSwitch node's;
// 3 the node): how tightly joined what the node offers the next job is.
func (p *placer) freeLevel(c *candNode) int {
	p.counts = countLocal(p.counts, c.free)
	level := 3
	for _, dc := range p.counts {
		if dc.free == len(c.free) {
			level = min(level, store.LocalLevel(dc.id))
		}
	}
	return level
}

// domain names the smallest node-local domain holding the subset.
func (in inNode) domain() string {
	best, bestL := store.DomainNode+":"+in.c.node.Name, 3
	for _, g := range in.c.free {
		if g.Index != in.gpus[0] {
			continue
		}
		for _, d := range g.Domains {
			l := store.LocalLevel(d)
			if l >= bestL {
				continue
			}
			all := true
			for _, idx := range in.gpus[1:] {
				for _, h := range in.c.free {
					if h.Index == idx && !slices.Contains(h.Domains, d) {
						all = false
					}
				}
			}
			if all {
				best, bestL = d, l
			}
		}
	}
	return best
}

// indices are the GPU indices of keys on one node.
func indices(keys []store.GPUKey) []int {
	out := make([]int, len(keys))
	for i, k := range keys {
		out[i] = k.Index
	}
	return out
}
