package aware

// Stage 2a, the single-node choice: for a job one node can hold, each
// fitting node's best subset of free GPUs (pick) and the one-node
// candidates ranked by level, fit and the cost model (singleNode). After
// the candidate walk (candidates.go); next, the judge (judge.go) and the
// local search (search.go). The multi-node choice (multi.go) reuses pick
// for each node's share.
//
// Flow (place.go): candidates → single node or multi-node → judge →
// local search → judge again.

import (
	"cmp"
	"math"
	"slices"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/internal/collective"
	"github.com/toposched/toposched/internal/store"
	"github.com/toposched/toposched/internal/topology"
)

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
	freeIn := p.counts
	// Pool: the free GPUs of the smallest domain that fits.
	level, poolDom, poolFree := 3, "", len(c.free)
	for _, dc := range freeIn {
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
	if k == 1 {
		level = 0
	}
	// Bandwidth between pool GPUs (none read for one GPU).
	m := len(pool)
	var bw []float64 // bw[a*m+b]
	if k > 1 {
		pos := make([]int, len(c.free))
		for i, g := range c.free {
			pos[i] = nt.pos[g.Index]
		}
		bwOf := func(a, b int) float64 {
			return nt.topo.Path(pos[a], pos[b], p.e.bw).BandwidthGBps
		}
		bw = make([]float64, m*m)
		for a := range m {
			for b := range m {
				if a != b {
					bw[a*m+b] = bwOf(pool[a], pool[b])
				}
			}
		}
	}
	best := inNode{c: c, level: level, minBW: -1, fit: len(c.free) - k}
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
		if k == 1 {
			minBW = 0
		}
		if bestSet == nil || better(minBW, sumBW, holes) {
			best.minBW, best.sumBW, best.holes = minBW, sumBW, holes
			bestSet = slices.Clone(set)
		}
	}
	// Rank order: a chain of best links from the first GPU.
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

// singleNode lists the one-node candidates, the favourite first: by
// level (island, PCIe group, NUMA node, node) and fit, each node's best
// subset, the first Options.Candidates scored by the cost model (the
// fastest wins, ties within 0.5% going to the better fit). Nil when no node
// has room.
func (p *placer) singleNode(cands []*candNode) []*cand {
	k := p.n
	type quick struct {
		c     *candNode
		level int
		fit   int
	}
	qs := make([]quick, 0, len(cands))
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
		qs = append(qs, quick{c, level, len(c.free) - k})
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
	if len(qs) == 0 {
		return nil
	}
	// Subsets for the most promising nodes; keep enough that distinct
	// shapes get a look. Where the best fit within a tolerance may win
	// (bestFitWithin), the tightest-fitting nodes are kept too, whatever
	// their level.
	limit := singleLimit
	if k == 1 {
		limit = oneGPULimit
	}
	var tight []quick
	if p.fitRule() && len(qs) > limit {
		tight = slices.Clone(qs)
		slices.SortStableFunc(tight, func(a, b quick) int { return cmp.Compare(a.fit, b.fit) })
		tight = tight[:limit]
	}
	slices.SortStableFunc(qs, func(a, b quick) int { return cmp.Or(cmp.Compare(a.level, b.level), cmp.Compare(a.fit, b.fit)) })
	if len(qs) > limit {
		qs = qs[:limit]
		for _, q := range tight {
			if !slices.ContainsFunc(qs[:limit], func(o quick) bool { return o.c == q.c }) {
				qs = append(qs, q)
			}
		}
	}
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
		picks = picks[:min(len(picks), max(p.limit(), maxJudged))]
	} else {
		slices.SortStableFunc(picks, func(a, b inNode) int {
			return cmp.Or(cmp.Compare(a.level, b.level), cmp.Compare(b.minBW, a.minBW), cmp.Compare(b.sumBW, a.sumBW),
				cmp.Compare(a.holes, b.holes), cmp.Compare(a.fit, b.fit))
		})
	}
	// The candidates and their keys in two slabs, not two objects each
	// (a 1-GPU job has up to 256).
	out := make([]*cand, len(picks))
	slab := make([]cand, len(picks))
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
	if k == 1 {
		return out
	}
	// The exact choice on the nodes scored, where it is affordable: it can
	// only be as fast as the heuristic's subset or faster, since that
	// subset and its order are among the ones it tries.
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
	bestI, bestT := -1, inf
	for i := range min(p.limit(), len(out)) {
		t := p.score(out[i])
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

// toFront moves out[i] to the front, the others keeping their order.
func toFront(out []*cand, i int) {
	first := out[i]
	copy(out[1:i+1], out[:i])
	out[0] = first
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
	comp := p.e.comp
	bound := (comp + p.score(out[fav])) * (1 + fitTolerance(p.opts))
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
			if t := comp + p.score(out[r.i]); t <= bound && t < bestT {
				best, bestT = r.i, t
			}
		}
		if best >= 0 {
			return best
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

// exactInNode is the node-level optimum: of every choice of len(start) of
// the node's free GPUs and every rank order on them, the one the cost
// model scores fastest, start (the heuristic's choice, of cost t0) unless
// another is faster by more than 0.5%, or as fast and taking GPUs from
// more broken domains (fewer holes), so that whole NVLink pairs and
// islands, PCIe switches and NUMA nodes stay whole for the next job.
//
// GPUs that are twins (the same link to every other free GPU, and the
// same hole) give the same cost in either place, so of the orders that
// differ only by swapping twins one is scored: the one whose twins appear
// in index order. And ranks the cost cannot tell apart are tried in one
// order: inside a node the cost model runs each group over the ring NCCL
// would search, so a group's cost depends on its GPUs, not on its ranks'
// order, and a job whose groups are the blocks and columns of a grid of
// ranks (gridOf: TP x DP, or one group of all) costs the same when its
// blocks are permuted, or the positions inside every block alike. Of the
// two reductions the one leaving fewer choices is used. The choices left
// are counted first; the search is tried only when they fit in what is
// left of *budget, which it then spends, and ok is false when they do not,
// when all the free GPUs are alike (an NVSwitch node: one choice), or when
// nothing beat start. settled says that no choice on the node is faster
// than start at all: its free GPUs are alike, or there is one order; the
// local search (refine) then has nothing to try on it.
func (p *placer) exactInNode(c *candNode, start []store.GPUKey, t0 float64, budget *int) (gpus []store.GPUKey, cost float64, ok, settled bool) {
	f, k := len(c.free), len(start)
	if k < 2 || k > f {
		return nil, 0, false, false
	}
	nt, err := p.e.res.node(c.node.Name)
	if err != nil {
		return nil, 0, false, false // nothing known
	}
	if alike(nt, c.free) {
		return nil, 0, false, true // one choice (an NVSwitch node)
	}
	hole := p.holes(c)
	class, sizes := twins(nt, c.free, hole)
	count := canonicalOrders(sizes, k)
	inner, grid := gridOf(p.e.groups, k)
	if grid {
		if g := gridOrders(f, k, inner); g < count {
			count = g
		} else {
			grid = false
		}
	}
	if count <= 1 || count > float64(*budget) {
		return nil, 0, false, count <= 1
	}
	*budget -= int(count)
	holeOf := func(key store.GPUKey) int {
		for i, g := range c.free {
			if g.Index == key.Index {
				return hole[i]
			}
		}
		return 0
	}
	bestT, bestHoles := t0, 0
	for _, key := range start {
		bestHoles += holeOf(key)
	}
	var best []store.GPUKey
	sel := make([]store.GPUKey, 0, k)
	holes := 0
	try := func() {
		t := p.e.cost(sel)
		if t < bestT*(1-0.005) || (t <= bestT*(1+0.005) && holes < bestHoles) {
			best, bestT, bestHoles = append(best[:0], sel...), t, holes
		}
	}
	if grid {
		eachGridOrder(f, k, inner, func(at []int) {
			sel, holes = sel[:0], 0
			for _, i := range at {
				sel, holes = append(sel, c.free[i].Key()), holes+hole[i]
			}
			try()
		})
		return best, bestT, best != nil, false
	}
	eachTwinOrder(class, k, func(at []int) {
		sel, holes = sel[:0], 0
		for _, i := range at {
			sel, holes = append(sel, c.free[i].Key()), holes+hole[i]
		}
		try()
	})
	return best, bestT, best != nil, false
}

// eachTwinOrder calls visit with every order of k of the GPUs of the
// given classes (class[i] of GPU i; at is reused) in which twins, GPUs of
// one class, appear in index order: one order of each that the cost can
// tell apart (canonicalOrders counts them).
func eachTwinOrder(class []int, k int, visit func(at []int)) {
	f := len(class)
	used := make([]bool, f)
	at := make([]int, 0, k)
	var rec func()
	rec = func() {
		if len(at) == k {
			visit(at)
			return
		}
	next:
		for i := range f {
			if used[i] {
				continue
			}
			for j := range i { // a twin before it still unused: its turn first
				if class[j] == class[i] && !used[j] {
					continue next
				}
			}
			used[i] = true
			at = append(at, i)
			rec()
			at = at[:len(at)-1]
			used[i] = false
		}
	}
	rec()
}

// gridOf finds the ranks the cost cannot tell apart inside a node: inner
// is the size of the job's blocks of consecutive ranks when every group
// of k ranks is such a block, a column (one rank of each block, at one
// position) or all k ranks, and no collective depends on the ranks'
// order (send/recv between stages; a broadcast is scored as an
// all-gather); inner is k when
// every group holds all ranks. ok is false for any other job.
func gridOf(groups []commGroup, k int) (inner int, ok bool) {
	for _, g := range groups {
		if g.coll == collective.SendRecv {
			return 0, false
		}
	}
	// The blocks' size is one of the groups' (a TP group of 4 with DP
	// pairs across two blocks: inner 4, columns of 2); every group holds
	// all ranks: inner k.
	sizes := []int{k}
	for _, g := range groups {
		if s := len(g.ranks); s > 1 && s < k && k%s == 0 && !slices.Contains(sizes, s) {
			sizes = append(sizes, s)
		}
	}
	slices.Sort(sizes)
	for _, inner := range sizes {
		if isGrid(groups, k, inner) {
			return inner, true
		}
	}
	return 0, false
}

// isGrid reports whether every group of k ranks is a block of inner
// consecutive ranks, a column (one rank of each block, at one position),
// all k ranks, or one rank.
func isGrid(groups []commGroup, k, inner int) bool {
	blocks := k / inner
	for _, g := range groups {
		r := slices.Sorted(slices.Values(g.ranks))
		block, column, all := len(r) == inner, len(r) == blocks, len(r) == k
		for i, x := range r {
			block = block && x == r[0]+i && r[0]%inner == 0
			column = column && x == r[0]+i*inner && r[0] < inner
			all = all && x == i
		}
		if !block && !column && !all && len(r) > 1 {
			return false
		}
	}
	return true
}

// eachGridOrder calls visit with one order of every gridOf class of k of
// f GPUs (positions 0..f-1 by rank; at is reused): the blocks ordered by
// their smallest GPU (each of a block's GPUs above the block before's
// smallest), the first block's GPUs ascending.
func eachGridOrder(f, k, inner int, visit func(at []int)) {
	used := make([]bool, f)
	at := make([]int, 0, k)
	prevMin := -1 // smallest GPU of the block before the current one
	var rec func(blockMin int)
	rec = func(blockMin int) {
		pos := len(at)
		if pos == k {
			visit(at)
			return
		}
		b, j := pos/inner, pos%inner
		floor := prevMin
		if j == 0 && b > 0 {
			floor = blockMin // the block before, just finished
		}
		for i := range f {
			if used[i] || i < floor || (b == 0 && j > 0 && i < at[pos-1]) {
				continue
			}
			used[i] = true
			at = append(at, i)
			if j == 0 && b > 0 {
				saved := prevMin
				prevMin = blockMin
				rec(i)
				prevMin = saved
			} else {
				rec(min(blockMin, i))
			}
			at = at[:pos]
			used[i] = false
		}
	}
	rec(f)
}

// gridOrders counts gridOf's classes of k of f GPUs: every order,
// f!/(f-k)!, over the blocks' orders and the positions' orders.
func gridOrders(f, k, inner int) float64 {
	n := 1.0
	for i := range k {
		n *= float64(f - i)
	}
	for i := 2; i <= k/inner; i++ {
		n /= float64(i)
	}
	for i := 2; i <= inner; i++ {
		n /= float64(i)
	}
	return n
}

// alike reports whether every pair of the free GPUs has the same link, so
// that no choice among them can be faster than another.
func alike(nt *nodeTopo, free []store.FreeGPU) bool {
	if len(nt.topo.GPUPaths) == 0 {
		return true // a node reported without paths
	}
	if len(free) < 2 {
		return true
	}
	first := nt.topo.GPUPaths[nt.pos[free[0].Index]][nt.pos[free[1].Index]]
	for i, a := range free {
		for _, b := range free[i+1:] {
			if nt.topo.GPUPaths[nt.pos[a.Index]][nt.pos[b.Index]] != first {
				return false
			}
		}
	}
	return true
}

// twins numbers the free GPUs by class: two GPUs are in one class when
// their links to every other free GPU are the same and so are their holes.
// sizes counts each class's GPUs. The node has paths (alike says so).
func twins(nt *nodeTopo, free []store.FreeGPU, hole []int) (class, sizes []int) {
	f := len(free)
	link := func(a, b int) topology.Link {
		return nt.topo.GPUPaths[nt.pos[free[a].Index]][nt.pos[free[b].Index]]
	}
	twin := func(a, b int) bool {
		if hole[a] != hole[b] {
			return false
		}
		for x := range f {
			if x != a && x != b && link(a, x) != link(b, x) {
				return false
			}
		}
		return true
	}
	return classify(f, twin)
}

// classify numbers n items by class, same telling whether two are of one
// (an equivalence); sizes counts each class's items.
func classify(n int, same func(a, b int) bool) (class, sizes []int) {
	class = make([]int, n)
	for i := range n {
		class[i] = -1
		for j := range i {
			if same(i, j) {
				class[i] = class[j]
				break
			}
		}
		if class[i] < 0 {
			class[i] = len(sizes)
			sizes = append(sizes, 0)
		}
		sizes[class[i]]++
	}
	return class, sizes
}

// canonicalOrders counts the orders of k GPUs drawn from classes of the
// given sizes, twins of a class in index order: the sum, over how many of
// each class are drawn, of the multinomial k! / (m1! m2! ...).
func canonicalOrders(sizes []int, k int) float64 {
	ways := make([]float64, k+1) // ways[j]: orders of j GPUs from the classes so far
	ways[0] = 1
	for _, size := range sizes {
		next := make([]float64, k+1)
		for j, w := range ways {
			if w == 0 {
				continue
			}
			choose := 1.0 // C(j+m, m)
			for m := 0; m <= size && j+m <= k; m++ {
				if m > 0 {
					choose = choose * float64(j+m) / float64(m)
				}
				next[j+m] += w * choose
			}
		}
		ways = next
	}
	return ways[k]
}

// indices are the GPU indices of keys on one node.
func indices(keys []store.GPUKey) []int {
	out := make([]int, len(keys))
	for i, k := range keys {
		out[i] = k.Index
	}
	return out
}
