package aware

// The exact choice inside a node, for the single-node stage (single.go)
// and, per node's share, for the search (shares.go): every subset of a
// node's free GPUs and every rank order on it, reduced by twins and by
// the ranks the cost cannot tell apart, when those choices are
// affordable.

import (
	"slices"

	"github.com/toposched/toposched/internal/collective"
	"github.com/toposched/toposched/internal/store"
	"github.com/toposched/toposched/internal/topology"
)

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
