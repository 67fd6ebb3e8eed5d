package aware

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/internal/placer/blind"
	"github.com/toposched/toposched/internal/placer/outcome"
	"github.com/toposched/toposched/internal/store"
	"github.com/toposched/toposched/internal/topology"
)

// Strategy names.
const (
	Name           = "topology-aware"
	NameExhaustive = "exhaustive"
)

// Result is a decision, as blind's: Verdict, the GPUs in rank order when
// Placed, and the reasons of a Wait or Never.
type Result = outcome.Result

// Options tune Place and Exhaustive. The zero value is usable.
type Options struct {
	// Fabric between the nodes (nil: one non-blocking leaf).
	Fabric *topology.Fabric
	// Bandwidths of the links (nil: topology.DefaultBandwidths).
	Bandwidths *topology.Bandwidths
	// Budget bounds the local search's wall time (0: 2 ms).
	Budget time.Duration
	// MaxEvals bounds the local search's cost-model evaluations (0: 200;
	// negative: no local search).
	MaxEvals int
	// Candidates is how many single-node candidates the cost model scores
	// (0: 4).
	Candidates int
	// Filter, when set, keeps only the nodes it accepts (node policies
	// plug in here). It is asked only about nodes with free GPUs of the
	// job's model.
	Filter func(NodeView) bool
	// Judge, when set, judges candidate placements (placement policies
	// plug in here): see judge.go.
	Judge func(Candidate) Judgement
	// Explain, when set, is filled with how the decision was reached.
	Explain *Explain
}

const inf = math.MaxFloat64

func (o Options) budget() time.Duration {
	if o.Budget > 0 {
		return o.Budget
	}
	return 2 * time.Millisecond
}

func (o Options) maxEvals() int {
	switch {
	case o.MaxEvals < 0:
		return 0
	case o.MaxEvals == 0:
		return 200
	}
	return o.MaxEvals
}

// candNode is a node with free GPUs the job may use.
type candNode struct {
	node   store.Node
	free   []store.FreeGPU // free GPUs of the model, by index; the store's: do not modify
	fabric []string        // fabric domains, smallest first
	offer  int             // GPUs it offers a multi-node placement
}

// oneGPULimit is how many nodes a one-GPU job looks at, best fit first:
// holes matter more than the node's fit.
const oneGPULimit = 256

// singleLimit is how many nodes a job of more GPUs that one node can hold
// looks at (the first by level, then fit).
const singleLimit = 32

// bestFitSingle walks the nodes with at least k free GPUs of the model in
// best-fit order (fewest free first, then enumeration order) and returns
// those the filter accepts, up to where the walk can stop without changing
// singleNode's choice: singleNode ranks nodes by level (the smallest
// node-local domain with k free GPUs: island, PCIe group, NUMA node, node)
// then fit, and keeps the first singleLimit (oneGPULimit for one GPU, where
// every node is of level 0). Once that many accepted nodes of level 0 are
// seen, no node further on (same or worse fit, later on ties) can rank
// among them. seen records the filter's answer per node walked.
func bestFitSingle(snap *store.Snapshot, model string, filter func(NodeView) bool, k int) (out []*candNode, seen map[string]bool) {
	limit := singleLimit
	if k == 1 {
		limit = oneGPULimit
	}
	var counts []domainCount
	slab := make([]candNode, 0, limit)
	level0 := 0
	for node, free := range snap.EachNodeFreeByFit(model, k) {
		fabric := fabricDomains(free[0].Domains)
		if filter != nil {
			ok := filter(NodeView{Node: node, Free: len(free), Fabric: fabric})
			if seen == nil {
				seen = map[string]bool{}
			}
			seen[node.Name] = ok
			if !ok {
				continue
			}
		}
		if len(slab) == cap(slab) {
			slab = make([]candNode, 0, limit) // never cut pointers into slab
		}
		slab = append(slab, candNode{node: node, free: free, fabric: fabric})
		out = append(out, &slab[len(slab)-1])
		if k == 1 {
			level0++
		} else {
			counts = countLocal(counts, free)
			for _, dc := range counts {
				if dc.free >= k && levelOfID(dc.id) == 0 {
					level0++
					break
				}
			}
		}
		if level0 >= limit {
			break
		}
	}
	return out, seen
}

// NodeView is what a Filter is told of a node: what the candidate walk
// has at hand, so that filtering costs no store lookups.
type NodeView struct {
	Node store.Node
	// Free counts its free GPUs of the job's model.
	Free int
	// Fabric lists its fabric domains (leaf, pod, core), smallest first.
	Fabric []string
}

// candidates collects the nodes with free GPUs of the job's model that the
// filter accepts. considered counts the nodes with such GPUs before the
// filter.
//
// It reads the store's nodes with free GPUs of the model
// (EachNodeFree): one index step per node with room and no GPU rows; the
// free lists are the store's own, and the candNodes come from one slab
// sized from the store's counts, so a decision allocates a handful of
// objects, not a few per node.
func candidates(snap *store.Snapshot, model string, filter func(NodeView) bool) (out []*candNode, total, considered int) {
	nodes := snap.NodeCounts(model).FreeAtLeast(1)
	if nodes == 0 {
		return nil, 0, 0
	}
	slab := make([]candNode, 0, nodes)
	out = make([]*candNode, 0, nodes)
	for node, free := range snap.EachNodeFree(model) {
		considered++
		fabric := fabricDomains(free[0].Domains)
		if filter != nil && !filter(NodeView{Node: node, Free: len(free), Fabric: fabric}) {
			continue
		}
		if len(slab) == cap(slab) {
			slab = make([]candNode, 0, 16) // counts and walk disagree: never cut pointers into slab
		}
		slab = append(slab, candNode{node: node, free: free, fabric: fabric})
		total += len(free)
		out = append(out, &slab[len(slab)-1])
	}
	return out, total, considered
}

// nodeLocalOrCluster reports whether a domain ID is of a node-local kind
// (island, pcie, numa, node) or the cluster: not a fabric domain.
func nodeLocalOrCluster(d string) bool {
	i := strings.IndexByte(d, ':')
	if i < 0 {
		return false
	}
	switch d[:i] {
	case store.DomainIsland, store.DomainPCIe, store.DomainNUMA, store.DomainNode, store.DomainCluster:
		return true
	}
	return false
}

// fabricDomains returns a GPU's fabric domains (all but the node-local
// ones and the cluster), in order. The store lists them as one run between
// the node and the cluster, so this is a capped window of the GPU's shared
// Domains (appending copies); a list of another shape gets a new slice.
func fabricDomains(ds []string) []string {
	i := 0
	for i < len(ds) && nodeLocalOrCluster(ds[i]) {
		i++
	}
	j := i
	for j < len(ds) && !nodeLocalOrCluster(ds[j]) {
		j++
	}
	k := j
	for k < len(ds) && nodeLocalOrCluster(ds[k]) {
		k++
	}
	if i == j {
		return nil
	}
	if k == len(ds) {
		return ds[i:j:j]
	}
	var out []string
	for _, d := range ds {
		if !nodeLocalOrCluster(d) {
			out = append(out, d)
		}
	}
	return out
}

// Place decides where a job runs, topology-aware (see the package doc).
func Place(snap *store.Snapshot, job events.JobAnalyzed, opts Options) Result {
	ours, _ := PlaceWithBaseline(snap, job, opts)
	return ours
}

// PlaceWithBaseline is Place, also returning what blind first fit decided
// on the same snapshot: Place runs it anyway (for its reasons why a job
// can never fit or must wait), and the decision reports it as the
// baseline, so the cluster is walked once for both.
func PlaceWithBaseline(snap *store.Snapshot, job events.JobAnalyzed, opts Options) (ours, base Result) {
	base = blind.Place(snap, job)
	if base.Verdict != outcome.Placed {
		return base, base
	}
	return placeNotWorse(snap, job, opts, base), base
}

func place(snap *store.Snapshot, job events.JobAnalyzed, opts Options) Result {
	n, gpn, model := job.Job.GPUs, job.Job.GPUsPerNode, job.Job.GPUModel
	x := opts.Explain
	var cands []*candNode
	var total int
	single := gpn == 0 || gpn == n
	// A job one node can hold is placed among the best-fitting nodes
	// only (see bestFitSingle): they are walked and filtered first, and
	// the whole cluster only when no node holds the job, or a Judge asks
	// for more.
	var fit []*candNode
	filter := opts.Filter
	if single && snap.NodeCounts(model).FreeAtLeast(n) > 0 {
		var seen map[string]bool
		fit, seen = bestFitSingle(snap, model, opts.Filter, n)
		if x != nil {
			x.Explanation.NodesConsidered = snap.NodeCounts(model).FreeAtLeast(1)
		}
		if f := opts.Filter; f != nil {
			// The cluster walk, if it comes, asks no node twice.
			filter = func(v NodeView) bool {
				if ok, asked := seen[v.Node.Name]; asked {
					return ok
				}
				return f(v)
			}
		}
	}
	var fullDone bool
	full := func() []*candNode {
		if !fullDone {
			var considered int
			cands, total, considered = candidates(snap, model, filter)
			fullDone = true
			if x != nil {
				x.Explanation.NodesConsidered = considered
			}
		}
		return cands
	}
	if len(fit) == 0 {
		full()
		if wait, ok := filterWait(cands, total, n, gpn, model); ok {
			return wait
		}
	}
	e := newEvaluator(snap, job, n, opts)
	p := &placer{opts: opts, e: e, n: n, cands: fit}
	if len(fit) == 0 {
		p.cands = cands
	}
	var list []*cand
	var more func() []*cand
	if len(fit) > 0 {
		list = p.singleNode(fit)
		if gpn == 0 {
			// Spread over nodes, for when every one-node candidate is
			// denied; those that land on one node were seen already.
			more = func() []*cand {
				p.cands = full() // holds the nodes of fit too
				return slices.DeleteFunc(p.multiNode(p.cands, job, gpn, p.limit()), func(c *cand) bool {
					return !slices.ContainsFunc(c.gpus, func(g store.GPUKey) bool { return g.Node != c.gpus[0].Node })
				})
			}
		}
	}
	if len(list) == 0 {
		p.cands = full()
		list = p.multiNode(p.cands, job, gpn, 1)
		more = func() []*cand { return p.multiNode(p.cands, job, gpn, p.limit())[1:] }
	}
	if len(list) == 0 {
		// Cannot happen when blind placed and the filter left enough; be
		// safe rather than wrong.
		return waitReason(n, gpn, model, total, 0)
	}
	chosen, judged := p.choose(list, more)
	if chosen == nil {
		if x != nil {
			x.PolicyDenied = true
		}
		p.explain(judged, nil)
		return Result{Verdict: outcome.Wait, Reasons: denyReasons(judged[0])}
	}
	if gpus := p.localSearch(chosen.gpus, p.cands); !slices.Equal(gpus, chosen.gpus) {
		refined := &cand{domain: chosen.domain, gpus: gpus, comm: math.NaN(), cost: chosen.cost}
		if p.opts.Judge == nil {
			*chosen = *refined
		} else {
			// The search moved ranks or GPUs: what the policies see may
			// have changed (a TP group's islands), so the result is judged
			// again and kept only if it passes.
			p.judge(refined)
			if !refined.j.Deny {
				*chosen = *refined
			}
		}
	}
	p.explain(judged, chosen)
	return Result{Verdict: outcome.Placed, GPUs: chosen.gpus}
}

func filterWait(cands []*candNode, total, n, gpn int, model string) (Result, bool) {
	if gpn > 0 {
		nodes := 0
		for _, c := range cands {
			if len(c.free) >= gpn {
				nodes++
			}
		}
		if nodes < n/gpn {
			return waitReason(n, gpn, model, total, nodes), true
		}
		return Result{}, false
	}
	if total < n {
		return waitReason(n, gpn, model, total, 0), true
	}
	return Result{}, false
}

func waitReason(n, gpn int, model string, free, freeNodes int) Result {
	of := ""
	if model != "" {
		of = " of model " + model
	}
	if gpn > 0 {
		nodes := fmt.Sprintf("%d nodes", n/gpn)
		if n/gpn == 1 {
			nodes = "1 node"
		}
		return Result{Verdict: outcome.Wait, Reasons: []events.Reason{{Code: outcome.CodeInsufficientFreeNodes, Field: outcome.FieldGPUsPerNode,
			Message: fmt.Sprintf("needs %s with %d free GPUs%s each, %d such nodes now (on nodes the placement policy allows)", nodes, gpn, of, freeNodes)}}}
	}
	return Result{Verdict: outcome.Wait, Reasons: []events.Reason{{Code: outcome.CodeInsufficientFreeGPUs, Field: outcome.FieldGPUs,
		Message: fmt.Sprintf("needs %d free GPUs%s, %d free now (on nodes the placement policy allows)", n, of, free)}}}
}

type placer struct {
	opts   Options
	e      *evaluator
	n      int
	cands  []*candNode
	leaves map[string]string // node → leaf domain, for explanations
	counts []domainCount     // scratch of countLocal, reused node after node
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

func levelOf(kind string) int {
	switch kind {
	case store.DomainIsland:
		return 0
	case store.DomainPCIe:
		return 1
	case store.DomainNUMA:
		return 2
	}
	return 3
}

// levelOfID is levelOf(store.DomainKind(id)) without cutting the string.
func levelOfID(id string) int {
	switch {
	case strings.HasPrefix(id, store.DomainIsland+":"):
		return 0
	case strings.HasPrefix(id, store.DomainPCIe+":"):
		return 1
	case strings.HasPrefix(id, store.DomainNUMA+":"):
		return 2
	}
	return 3
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
			if levelOfID(d) == 3 {
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

// pick chooses k of the node's free GPUs: the smallest node-local domain
// with room, then a greedy bandwidth-grown subset, best fit on ties.
func (p *placer) pick(c *candNode, k int) (inNode, error) {
	// One GPU needs no bandwidth, so no topology: the node is in the
	// snapshot (it is a candidate), which is all resolving it checks.
	var nt *nodeTopo
	if k > 1 {
		var err error
		if nt, err = p.e.res.node(c.node.Name); err != nil {
			return inNode{}, err
		}
	}
	// Free counts of the node-local domains.
	p.counts = countLocal(p.counts, c.free)
	freeIn := p.counts
	// hole of a GPU: free GPUs of its smallest domain (1: alone).
	hole := make([]int, len(c.free))
	for i, g := range c.free {
		hole[i] = len(c.free)
		best := 4
		for _, d := range g.Domains {
			if l := levelOfID(d); l < best {
				best, hole[i] = l, freeOf(freeIn, d)
			}
		}
		if best == 4 || best == 3 {
			hole[i] = len(c.free)
		}
	}
	// Pool: the free GPUs of the smallest domain that fits.
	level, poolDom, poolFree := 3, "", len(c.free)
	for _, dc := range freeIn {
		d, f := dc.id, dc.free
		l := levelOfID(d)
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
	var bw [][]float64
	if k > 1 {
		pos := make([]int, len(c.free))
		for i, g := range c.free {
			pos[i] = nt.pos[g.Index]
		}
		bwOf := func(a, b int) float64 {
			return nt.topo.Path(pos[a], pos[b], p.e.bw).BandwidthGBps
		}
		bw = make([][]float64, m)
		for a := range m {
			bw[a] = make([]float64, m)
			for b := range m {
				if a != b {
					bw[a][b] = bwOf(pool[a], pool[b])
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
	for _, s := range seeds {
		clear(in)
		set := []int{s}
		in[s] = true
		for len(set) < k {
			cand, cs, ch := -1, -1.0, 0
			for x := range m {
				if in[x] {
					continue
				}
				sum := 0.0
				for _, y := range set {
					sum += bw[x][y]
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
				minBW = min(minBW, bw[a][b])
				sumBW += bw[a][b]
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
	order := []int{bestSet[0]}
	left := bestSet[1:]
	for len(left) > 0 {
		last := order[len(order)-1]
		bi := 0
		for i, x := range left {
			if bw[last][x] > bw[last][left[bi]] || (bw[last][x] == bw[last][left[bi]] && c.free[pool[x]].Index < c.free[pool[left[bi]]].Index) {
				bi = i
			}
		}
		order = append(order, left[bi])
		left = slices.Delete(slices.Clone(left), bi, bi+1)
	}
	for _, x := range order {
		best.gpus = append(best.gpus, c.free[pool[x]].Index)
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
	var qs []quick
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
					level = min(level, levelOfID(dc.id))
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
	slices.SortStableFunc(qs, func(a, b quick) int { return cmp.Or(cmp.Compare(a.level, b.level), cmp.Compare(a.fit, b.fit)) })
	// Subsets for the most promising nodes; keep enough that distinct
	// shapes get a look.
	limit := singleLimit
	if k == 1 {
		limit = oneGPULimit
	}
	if len(qs) > limit {
		qs = qs[:limit]
	}
	var picks []inNode
	for _, q := range qs {
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
		// No communication: the fit decides.
		slices.SortStableFunc(picks, func(a, b inNode) int { return cmp.Or(cmp.Compare(a.holes, b.holes), cmp.Compare(a.fit, b.fit)) })
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
	bestI, bestT := -1, inf
	for i := range min(p.limit(), len(out)) {
		t := p.score(out[i])
		if bestI < 0 || t < bestT*(1-0.005) {
			bestI, bestT = i, t
		}
	}
	// The fastest first, then the rest in the heuristic's order.
	first := out[bestI]
	copy(out[1:bestI+1], out[:bestI])
	out[0] = first
	return out
}

// domain names the smallest node-local domain holding the subset.
func (in inNode) domain() string {
	best, bestL := store.DomainNode+":"+in.c.node.Name, 3
	for _, g := range in.c.free {
		if g.Index != in.gpus[0] {
			continue
		}
		for _, d := range g.Domains {
			l := levelOf(store.DomainKind(d))
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

func keys(node string, idx []int) []store.GPUKey {
	out := make([]store.GPUKey, len(idx))
	for i, x := range idx {
		out[i] = store.GPUKey{Node: node, Index: x}
	}
	return out
}

// unitOf is the size of the job's innermost groups when they are blocks of
// consecutive ranks (TP in the default layout), else 1.
func unitOf(job events.JobAnalyzed, n int) int {
	if len(job.Order) == 0 {
		return 1
	}
	for _, rg := range job.Groups {
		if rg.Dimension != job.Order[0] || rg.Size < 2 || n%rg.Size != 0 {
			continue
		}
		for _, m := range rg.Members {
			if len(m) != rg.Size {
				return 1
			}
			for i := 1; i < len(m); i++ {
				if m[i] != m[0]+i || m[0]%rg.Size != 0 {
					return 1
				}
			}
		}
		return rg.Size
	}
	return 1
}

func fabricLevel(d string) int {
	switch store.DomainKind(d) {
	case store.DomainLeaf:
		return 0
	case store.DomainCore:
		return 2
	}
	return 1
}

// multiNode spreads the job over nodes of the smallest fabric domain that
// holds it: up to limit candidates, one per domain, the favourite first
// (the smallest level, then the tightest fit). Nil when the nodes' offers
// do not add up.
func (p *placer) multiNode(cands []*candNode, job events.JobAnalyzed, gpn, limit int) []*cand {
	n := p.n
	units := []int{1}
	if gpn == 0 {
		if u := unitOf(job, n); u > 1 {
			units = []int{u, 1}
		}
	}
	explained := false
	for _, u := range units {
		for _, c := range cands {
			switch {
			case gpn > 0 && len(c.free) >= gpn:
				c.offer = gpn
			case gpn > 0:
				c.offer = 0
			default:
				c.offer = len(c.free) / u * u
			}
		}
		doms := p.fabricDomains(cands, n, !explained)
		explained = true
		var out []*cand
		for _, d := range doms {
			if len(out) == limit {
				break
			}
			if gpus := p.spread(cands, n, d); gpus != nil {
				name := d
				if name == "" {
					name = store.ClusterDomain
				}
				out = append(out, &cand{domain: name, gpus: gpus, comm: math.NaN()})
			}
		}
		if len(out) > 0 {
			return out
		}
	}
	return nil
}

// fabricDomains lists the fabric domains whose nodes offer at least n
// GPUs, by level (leaf, pod, core) then tightest fit then name, and last
// the whole cluster (""), when it offers n. With explain it records the
// levels in the explanation.
func (p *placer) fabricDomains(cands []*candNode, n int, explain bool) []string {
	sum := map[string]int{}
	clusterSum := 0
	for _, c := range cands {
		if c.offer == 0 {
			continue
		}
		clusterSum += c.offer
		for _, d := range c.fabric {
			sum[d] += c.offer
		}
	}
	type dom struct {
		name       string
		level, got int
	}
	var fit []dom
	var domains, fitting [3]int
	for d, got := range sum {
		l := fabricLevel(d)
		domains[l]++
		if got >= n {
			fitting[l]++
			fit = append(fit, dom{d, l, got})
		}
	}
	if x := p.opts.Explain; x != nil && explain && !x.hasLevel(store.DomainCluster) {
		for l, name := range [3]string{store.DomainLeaf, store.DomainPod, store.DomainCore} {
			if domains[l] > 0 {
				x.Explanation.Levels = append(x.Explanation.Levels, events.LevelCount{Level: name, Domains: domains[l], Fitting: fitting[l]})
			}
		}
		lc := events.LevelCount{Level: store.DomainCluster, Domains: 1}
		if clusterSum >= n {
			lc.Fitting = 1
		}
		x.Explanation.Levels = append(x.Explanation.Levels, lc)
	}
	if clusterSum < n {
		return nil
	}
	slices.SortFunc(fit, func(a, b dom) int {
		return cmp.Or(cmp.Compare(a.level, b.level), cmp.Compare(a.got, b.got), strings.Compare(a.name, b.name))
	})
	out := make([]string, 0, len(fit)+1)
	for _, d := range fit {
		out = append(out, d.name)
	}
	return append(out, "")
}

// spread takes n GPUs from the nodes of domain dom ("" for the whole
// cluster): leaf by leaf (fullest first), largest offers first, the rest
// from the node whose offer covers it most tightly.
func (p *placer) spread(cands []*candNode, n int, dom string) []store.GPUKey {
	// The domain's nodes, by leaf (fullest first), largest offers first.
	type leafGroup struct {
		name  string
		total int
		nodes []*candNode
	}
	byLeaf := map[string]*leafGroup{}
	var leaves []*leafGroup
	for _, c := range cands {
		if c.offer == 0 || (dom != "" && !slices.Contains(c.fabric, dom)) {
			continue
		}
		leaf := ""
		if len(c.fabric) > 0 {
			leaf = c.fabric[0]
		}
		g := byLeaf[leaf]
		if g == nil {
			g = &leafGroup{name: leaf}
			byLeaf[leaf] = g
			leaves = append(leaves, g)
		}
		g.total += c.offer
		g.nodes = append(g.nodes, c)
	}
	slices.SortStableFunc(leaves, func(a, b *leafGroup) int {
		return cmp.Or(cmp.Compare(b.total, a.total), strings.Compare(a.name, b.name))
	})
	var out []store.GPUKey
	rem := n
	for _, g := range leaves {
		slices.SortStableFunc(g.nodes, func(a, b *candNode) int {
			return cmp.Or(cmp.Compare(b.offer, a.offer), cmp.Compare(len(a.free), len(b.free)))
		})
		used := make([]bool, len(g.nodes))
		for i := 0; i < len(g.nodes) && rem > 0; i++ {
			if used[i] {
				continue
			}
			c := g.nodes[i]
			take := c.offer
			if take >= rem {
				// The tightest offer in this leaf that covers the rest.
				bi := i
				for j := i + 1; j < len(g.nodes); j++ {
					if !used[j] && g.nodes[j].offer >= rem && g.nodes[j].offer <= g.nodes[bi].offer {
						bi = j
					}
				}
				c, take = g.nodes[bi], rem
				used[bi] = true
			} else {
				used[i] = true
			}
			in, err := p.pick(c, take)
			if err != nil {
				return nil
			}
			out = append(out, keys(c.node.Name, in.gpus)...)
			rem -= take
		}
		if rem == 0 {
			break
		}
	}
	if rem != 0 {
		return nil
	}
	return out
}

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
