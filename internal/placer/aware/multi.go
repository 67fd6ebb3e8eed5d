package aware

// Stage 3, the multi-node choice (multiStage): for a job spread over nodes
// (or one whose one-node candidates came to nothing), the fabric domains
// that hold it (leaf, pod, core, then the cluster) and one spread of GPUs
// per domain, each node's share chosen by pick (single.go); then, for a
// job spread over nodes or one whose node's choice crosses sockets, the
// alternatives (other groupings, one socket per node). In: walked and the
// single-node stage's shortlist; out: the shortlist the judge reads.
//
// Flow (place.go): walk → single-node exact choice → multi-node →
// judge → local search; see internal/placer/README.md.

import (
	"cmp"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/internal/placer/engine"
	"github.com/toposched/toposched/internal/store"
	"github.com/toposched/toposched/internal/topology"
)

// multiStage lists the multi-node candidates of a job the single-node
// stage left none (spreads), then widens the list with the alternatives
// where they apply (alternativesFor). False when there is no candidate
// at all.
func (p *placer) multiStage(w *walked, job events.JobAnalyzed, s *shortlist) bool {
	if len(s.list) == 0 {
		p.spreads(w, job, s)
	}
	if len(s.list) == 0 {
		return false
	}
	p.alternativesFor(w, job, s)
	return true
}

// spreads lists a job's spreads over nodes: one per scoped domain, the
// fastest first, with the whole cluster's for a judge that denies them;
// else the cluster's fabric domains' (multiNode).
func (p *placer) spreads(w *walked, job events.JobAnalyzed, s *shortlist) {
	gpn := job.Job.GPUsPerNode
	if w.sets != nil {
		// One spread per domain, the fastest first.
		for _, set := range w.sets {
			p.scope = set.dom
			s.list = append(s.list, p.multiNode(set.cands, job, gpn, 1)...)
		}
		p.scope = ""
		slices.SortStableFunc(s.list, func(a, b *cand) int { return cmp.Compare(p.score(a), p.score(b)) })
		if len(s.list) > 0 {
			// More candidates, for a judge that denies them, come from
			// the whole cluster.
			scopedList := slices.Clone(s.list)
			s.more = func() []*cand {
				p.cands = w.full()
				return slices.DeleteFunc(p.multiNode(p.cands, job, gpn, p.limit()), func(c *cand) bool {
					return slices.ContainsFunc(scopedList, func(s *cand) bool { return slices.Equal(c.gpus, s.gpus) })
				})
			}
		}
	}
	if len(s.list) == 0 {
		p.cands = w.full()
		s.list = p.multiNode(p.cands, job, gpn, 1)
		s.more = func() []*cand { return p.multiNode(p.cands, job, gpn, p.limit())[1:] }
		// The scoped walk above spread the job in each of its domains
		// already; the whole cluster's walk, in the tightest alone.
		s.elsewhere = func() []*cand { return p.multiNode(p.cands, job, gpn, elsewhereDomains) }
	}
}

// elsewhereDomains bounds the fabric domains a job kept waiting by
// Options.Compact is spread in (judgeStage). The favourite is the spread
// in the tightest domain, which is the fastest on a cluster of one kind of
// node; on a mixed one the tightest may be a leaf of nodes without NICs,
// several times as slow as a leaf of others that is free (ITP cluster01 on
// deploy/examples/replay/hetero-512.yaml: two 32-GPU jobs waited a day
// each for a compact placement with 13 A100 nodes free). Offered only to
// a job that would otherwise wait, they leave every placement that starts
// in the tightest domain as it was (BENCHMARKS.md, issue 51).
const elsewhereDomains = 16

// alternativesFor sets whether the local search may trade across nodes
// and puts a faster alternative (alternatives) before the favourite.
//
// A job one node holds may still be faster spread over nodes where its
// node's choice crosses the inter-socket link (SYS), which the cost
// model shares among the node's flows: then the whole cluster is the
// local search's to trade GPUs with. A job spread over nodes trades
// among them. A tighter fit bestFitWithin chose is not spread again:
// keeping the job on that node is what it was chosen for.
func (p *placer) alternativesFor(w *walked, job events.JobAnalyzed, s *shortlist) {
	gpn := job.Job.GPUsPerNode
	s.across = len(w.fit) == 0 && gpn == 0 // gpus_per_node fixes each node's share
	if len(w.fit) > 0 && gpn == 0 && s.list[0] != p.byFit && p.crossesSMP(s.list[0].gpus) {
		p.cands = w.full()
		s.across = true
	}
	if len(w.fit) > 0 && !s.across {
		return
	}
	p.since = time.Now()
	// Other groupings on nodes, and spreads that keep off the
	// inter-socket links, where the cost model finds one faster by 0.5%
	// than the favourite.
	l := p.faster(s.list, p.alternatives(p.cands, job, gpn, s.list[0]))
	if len(l) <= len(s.list) {
		return
	}
	s.alt, s.list = true, l
	if m := s.more; m != nil {
		s.more = func() []*cand { // without the alternative, if it is among them
			return slices.DeleteFunc(m(), func(c *cand) bool { return slices.Equal(c.gpus, l[0].gpus) })
		}
	}
}

// faster puts the fastest of alts at the front of list when it is faster
// than list[0] by more than 0.5%.
func (p *placer) faster(list, alts []*cand) []*cand {
	if len(alts) == 0 {
		return list
	}
	best, bestT := -1, p.score(list[0])
	for i, c := range alts {
		if t := p.score(c); t < bestT*(1-0.005) {
			best, bestT = i, t
		}
	}
	if best < 0 {
		return list
	}
	return append([]*cand{alts[best]}, list...)
}

// crossesSMP reports whether two of the GPUs on one node are joined over
// the inter-socket link (SYS). Nodes without such a link are passed over.
func (p *placer) crossesSMP(gpus []store.GPUKey) bool {
	var onNode map[string][]int // positions of the GPUs of nodes with SYS links
	for _, g := range gpus {
		nt, err := p.e.res.node(g.Node)
		if err != nil || !nt.sys {
			continue
		}
		if onNode == nil {
			onNode = map[string][]int{}
		}
		pos := nt.pos[g.Index]
		for _, q := range onNode[g.Node] {
			if nt.topo.GPUPaths[q][pos].Class == topology.SYS {
				return true
			}
		}
		onNode[g.Node] = append(onNode[g.Node], pos)
	}
	return false
}

// grouping maps a spread's GPUs to ranks: the GPUs, node after node, each
// node's share in the order pick chains it, take the ranks of order in
// turn (nil: 0, 1, 2...), and a node's share is a multiple of unit, so
// that each node holds whole groups of one dimension.
type grouping struct {
	unit  int
	order []int
}

// groupings lists the ways the job's ranks may be grouped on nodes: first
// whole groups of its innermost dimension (unitOf: TP in the default
// layout), then whole groups of each other dimension whose groups
// partition the ranks into blocks of two or more and that moves more
// bytes per rank and step than the first (the synthetic jobs' DP
// all-reduce of 1 GiB against TP's eight of 64 MiB): across nodes, the
// lighter dimension should be the one that crosses the network.
func groupings(job events.JobAnalyzed, n int) []grouping {
	u := engine.Unit(job, n)
	out := []grouping{{unit: u}}
	first := 0.0
	if u > 1 {
		for _, rg := range job.Groups {
			if rg.Dimension == job.Order[0] {
				first = rankBytes(rg)
				break
			}
		}
	}
	for _, rg := range job.Groups {
		if (u > 1 && rg.Dimension == job.Order[0]) || rg.Size < 2 || rg.Size >= n || n%rg.Size != 0 || rankBytes(rg) <= first {
			continue
		}
		order := make([]int, 0, n)
		seen := make([]bool, n)
		ok := len(rg.Members) == n/rg.Size
		for _, m := range rg.Members {
			if len(m) != rg.Size {
				ok = false
				break
			}
			for _, r := range m {
				if r < 0 || r >= n || seen[r] {
					ok = false
					break
				}
				seen[r] = true
				order = append(order, r)
			}
		}
		if ok {
			out = append(out, grouping{unit: rg.Size, order: order})
		}
	}
	return out
}

// rankBytes is what one rank of a group of rg sends per step, by ring
// algorithms: 2(s-1)/s of an all-reduce's bytes, (s-1)/s of an
// all-gather's, reduce-scatter's or all-to-all's, a send/recv's bytes.
func rankBytes(rg events.RankGroups) float64 {
	s := float64(rg.Size)
	total := 0.0
	for _, c := range rg.Collectives {
		f := (s - 1) / s
		switch c.Collective {
		case events.CollectiveAllReduce:
			f *= 2
		case events.CollectiveSendRecv:
			f = 1
		}
		total += f * float64(c.Bytes) * float64(max(c.CallsPerStep, 1))
	}
	return total
}

func keys(node string, idx []int) []store.GPUKey {
	out := make([]store.GPUKey, len(idx))
	for i, x := range idx {
		out[i] = store.GPUKey{Node: node, Index: x}
	}
	return out
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
		if u := engine.Unit(job, n); u > 1 {
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
					name = cmp.Or(p.scope, store.ClusterDomain)
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

// alternatives are the multi-node candidates besides first (the
// favourite, or a one-node candidate that crosses sockets), for each
// grouping of groupings but the first:
//
//   - first's GPUs regrouped (regroup), where first spans nodes and its
//     shares are whole groups of this grouping too (the same unit), or
//     where this grouping's whole groups do not add up over the nodes and
//     the job is larger than 16 GPUs;
//   - otherwise the spread over the nodes' whole offers in multiples of
//     the grouping's unit, or, for a job of at most 16 GPUs whose whole
//     groups do not add up, of single GPUs in the grouping's order (a
//     spread costs a pick per node, which a larger job does not spend
//     here);
//
// and, where first crosses the inter-socket link (SYS) of a node, each
// grouping (the first too) on offers of one socket's free GPUs per node
// (socketOffer), so that the network rather than that link joins the
// parts. Each spread is over the first fabric domain that holds it.
func (p *placer) alternatives(cands []*candNode, job events.JobAnalyzed, gpn int, first *cand) []*cand {
	n := p.n
	gs := groupings(job, n)
	if tpWhole(job, first.gpus) {
		// Tensor-parallel groups are not broken for another dimension
		// where they can be had whole: their collectives sit on the
		// critical path of every layer, while DP's all-reduce overlaps
		// the backward pass, which the cost model does not see (it sums
		// communication), so bytes per rank alone would put TP on the
		// network (DESIGN: TP first). Where first breaks one anyway (too
		// few free GPUs on a node), the regroupings may do better.
		gs = gs[:1]
	}
	sockets := p.crossesSMP(first.gpus)
	var socket map[*candNode]int
	if sockets {
		socket = make(map[*candNode]int, len(cands))
		for _, c := range cands {
			socket[c] = p.socketOffer(c)
		}
	}
	spans := slices.ContainsFunc(first.gpus, func(g store.GPUKey) bool { return g.Node != first.gpus[0].Node })
	var out []*cand
	add := func(c *cand) bool {
		if c != nil {
			out = append(out, c)
		}
		return c != nil
	}
	for gi, g := range gs {
		for _, bySocket := range []bool{false, true} {
			switch {
			case gi == 0 && !bySocket, bySocket && !sockets:
				continue
			case bySocket:
				if !add(p.spreadAs(cands, gpn, g.unit, g.order, socket)) && g.unit > 1 {
					add(p.spreadAs(cands, gpn, 1, g.order, socket))
				}
			case g.unit == gs[0].unit:
				if spans {
					add(regroup(first, g.order))
				}
			case add(p.spreadAs(cands, gpn, g.unit, g.order, nil)):
			case n <= 16:
				add(p.spreadAs(cands, gpn, 1, g.order, nil))
			case spans:
				add(regroup(first, g.order))
			}
		}
	}
	return out
}

// tpWhole reports whether the job has tensor-parallel groups of two or
// more and gpus (by rank) keep each on one node.
func tpWhole(job events.JobAnalyzed, gpus []store.GPUKey) bool {
	for _, rg := range job.Groups {
		if rg.Dimension != "tp" || rg.Size < 2 {
			continue
		}
		for _, m := range rg.Members {
			for _, r := range m {
				if r < 0 || r >= len(gpus) || gpus[r].Node != gpus[m[0]].Node {
					return false
				}
			}
		}
		return true
	}
	return false
}

// regroup is c's GPUs, in c's rank order, taking the ranks of order in
// turn instead.
func regroup(c *cand, order []int) *cand {
	ranked := make([]store.GPUKey, len(order))
	for i, r := range order {
		ranked[r] = c.gpus[i]
	}
	return &cand{domain: c.domain, gpus: ranked, comm: math.NaN()}
}

// spreadAs is the spread over the first fabric domain that holds the job
// when each node offers its free GPUs (or, with socket, the node's
// socketOffer) in multiples of unit, the GPUs then taking the ranks of
// order in turn (nil: 0, 1, 2...). Nil when no domain holds it.
func (p *placer) spreadAs(cands []*candNode, gpn, unit int, order []int, socket map[*candNode]int) *cand {
	n := p.n
	if gpn > 0 && gpn%unit != 0 {
		return nil
	}
	for _, c := range cands {
		free := len(c.free)
		if socket != nil {
			free = socket[c]
		}
		switch {
		case gpn > 0 && free >= gpn:
			c.offer = gpn
		case gpn > 0:
			c.offer = 0
		default:
			c.offer = free / unit * unit
		}
	}
	for _, d := range p.fabricDomains(cands, n, false) {
		gpus := p.spread(cands, n, d)
		if gpus == nil {
			continue
		}
		name := d
		if name == "" {
			name = store.ClusterDomain
		}
		c := &cand{domain: name, gpus: gpus, comm: math.NaN()}
		if order != nil {
			c = regroup(c, order)
		}
		return c
	}
	return nil
}

// socketOffer is the most of the node's free GPUs that no inter-socket
// link (SYS) separates: its largest set of free GPUs joined by faster
// links.
func (p *placer) socketOffer(c *candNode) int {
	nt, err := p.e.res.node(c.node.Name)
	if err != nil || nt.topo.GPUPaths == nil {
		return len(c.free)
	}
	f := len(c.free)
	parent := make([]int, f)
	for i := range parent {
		parent[i] = i
	}
	find := func(i int) int {
		for parent[i] != i {
			parent[i] = parent[parent[i]]
			i = parent[i]
		}
		return i
	}
	for i, a := range c.free {
		for j := i + 1; j < f; j++ {
			if nt.topo.GPUPaths[nt.pos[a.Index]][nt.pos[c.free[j].Index]].Class != topology.SYS {
				parent[find(i)] = find(j)
			}
		}
	}
	size := make([]int, f)
	best := 0
	for i := range f {
		r := find(i)
		size[r]++
		best = max(best, size[r])
	}
	return best
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
	if x := p.opts.Explain; x != nil && explain && !x.HasLevel(store.DomainCluster) {
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
