package collective

import (
	"cmp"
	"math"
	"math/bits"
	"slices"

	"github.com/toposched/toposched/internal/topology"
)

// applies says whether algorithm a can run collective c on the model's
// ranks.
func (m *model) applies(c Collective, a Algorithm) bool {
	n := len(m.ranks)
	switch a {
	case Ring:
		return c == AllReduce || c == AllGather || c == ReduceScatter
	case Tree:
		return c == AllReduce
	case HalvingDoubling:
		return (c == AllReduce || c == AllGather || c == ReduceScatter) && n >= 2 && n&(n-1) == 0
	case NVLS:
		if !m.tuning.NVLS || c != AllReduce && c != AllGather && c != ReduceScatter || len(m.nodes) != 1 || n < 2 {
			return false
		}
		return m.nvlsNode(0)
	case NVLSTree:
		if !m.tuning.NVLSTree || c != AllReduce || len(m.nodes) < 2 || m.overTCP() {
			return false
		}
		for i := range m.nodes {
			if !m.nvlsNode(int32(i)) {
				return false
			}
		}
		return true
	case Hierarchical:
		if c != AllReduce || len(m.nodes) < 2 {
			return false
		}
		g := len(m.nodes[0].ranks)
		for _, nd := range m.nodes {
			if len(nd.ranks) != g {
				return false
			}
		}
		return g >= 2
	case PointToPoint:
		return c == SendRecv
	case Direct:
		return c == AllToAll
	}
	return false
}

// nvlsNode reports whether a node's ranks can reduce in the switch: an
// NVSwitch of NVLink 4 or later, every pair of ranks on NVLink.
func (m *model) nvlsNode(i int32) bool {
	nd := m.nodes[i]
	return nd.nvSwitch && nd.n.NVLinkGen >= NVLSMinGen && len(nd.ranks) >= 2 && m.allNV(i)
}

// allNV reports whether every pair of the node's ranks is on NVLink.
func (m *model) allNV(node int32) bool {
	nd := m.nodes[node]
	if nd.n.GPUPaths == nil {
		return false
	}
	for _, i := range nd.ranks {
		for _, j := range nd.ranks {
			if i != j && !nd.n.GPUPaths[m.ranks[i].gpu][m.ranks[j].gpu].Class.NVLink() {
				return false
			}
		}
	}
	return true
}

// build adds the flows of calls runs of collective c (S bytes) by
// algorithm a to ps, phase by phase.
func (m *model) build(ps *phases, c Collective, S float64, a Algorithm, calls int) {
	n := len(m.ranks)
	cf := float64(calls)
	if n == 1 {
		ps.at(0)
		return
	}
	fn := float64(n)
	switch a {
	case Ring:
		f, steps := (fn-1)/fn, n-1
		if c == AllReduce {
			f, steps = 2*f, 2*(n-1)
		}
		m.ring(ps, ps.at(0), nil, f*S*cf, steps*calls)
	case Tree:
		m.tree(ps, ps.at(0), S, calls)
	case HalvingDoubling:
		// Reduce-scatter by recursive halving (partner at distance n/2,
		// then n/4, ...), all-gather by recursive doubling (the reverse).
		k := 0
		var rs, ag []int
		for d := n / 2; d >= 1; d /= 2 {
			rs = append(rs, d)
		}
		for d := 1; d < n; d *= 2 {
			ag = append(ag, d)
		}
		var ds []int
		switch c {
		case AllReduce:
			ds = append(rs, ag...)
		case ReduceScatter:
			ds = rs
		default:
			ds = ag
		}
		for _, d := range ds {
			// Bytes exchanged at distance d: the share of the buffer still
			// being halved (S/2 at the first halving step).
			b := S * float64(d) / fn
			ph := ps.at(k)
			var lat hop
			for i := range n {
				lat = later(lat, m.route(ph, i, i^d, b*cf))
			}
			ps.step(ph, calls, lat)
			k++
		}
	case NVLS:
		f := 1.0
		if c != AllReduce {
			f = (fn - 1) / fn
		}
		ph := ps.at(0)
		m.nvls(ph, f*S*cf)
		ps.step(ph, 2*calls, hop{hwNVLink: m.bw.LatencyUS[topology.NV] + m.nvlsOverheadUS()})
		if c == AllReduce {
			// Scatter, reduce and multicast, gather: three stages on the
			// GPUs' NVLink ports (ramp.go).
			nd, g := m.nodes[0], m.ranks[0].gpu
			from := len(ph.pipeIDs)
			ph.pipeIDs = append(ph.pipeIDs, nd.port(kNVLS, g, tx), nd.port(kNVLS, g, tx), nd.port(kNVLS, g, rx))
			ch := nvlsChunking(ps.trueBytes(S), m.nvlsChannels(), len(nd.ranks), 0, false)
			ps.addPipe(ph, from, max(1, ps.trueBytes(S)/ch.LoopBytes))
		}
	case NVLSTree:
		// In-switch reduction inside each node and a double binary tree
		// between the nodes over slices of it, pipelined: one phase's
		// links; the steps of both.
		ph := ps.at(0)
		m.nvls(ph, S*cf)
		net := m.treeAcross(ph, S*cf)
		ps.step(ph, 2*calls, hop{hwNVLink: m.bw.LatencyUS[topology.NV] + m.nvlsOverheadUS()})
		ps.step(ps.at(1), 2*2*bits.Len(uint(len(m.nodes)))*calls, net)
		// Scatter and reduce in the node, up the network tree and down,
		// multicast and gather (ramp.go).
		nd, g := m.nodes[0], m.ranks[0].gpu
		from := len(ph.pipeIDs)
		ph.pipeIDs = append(ph.pipeIDs, nd.port(kNVLS, g, tx), nd.port(kNVLS, g, tx))
		ph.pipeIDs = m.appendNetStages(ph.pipeIDs)
		ph.pipeIDs = append(ph.pipeIDs, nd.port(kNVLS, g, rx), nd.port(kNVLS, g, rx))
		ch := nvlsChunking(ps.trueBytes(S), m.nvlsChannels(), len(nd.ranks), m.nvlsTreeChunk(), true)
		ps.addPipe(ph, from, max(1, ps.trueBytes(S)/ch.LoopBytes))
	case Hierarchical:
		g := len(m.nodes[0].ranks)
		fg := float64(g)
		// 1. reduce-scatter inside each node.
		p1 := ps.at(0)
		for _, nd := range m.nodes {
			m.ring(ps, p1, nd.ranks, (fg-1)/fg*S*cf, (g-1)*calls)
		}
		// 2. all-reduce of S/g across nodes, one ring per local index (each
		// rank through its own nearest NIC).
		p2 := ps.at(1)
		nn := len(m.nodes)
		fm := float64(nn)
		for l := range g {
			ring := make([]int, nn)
			for k, nd := range m.nodes {
				ring[k] = nd.ranks[l]
			}
			m.ring(ps, p2, ring, 2*(fm-1)/fm*S/fg*cf, 2*(nn-1)*calls)
		}
		// 3. all-gather inside each node.
		p3 := ps.at(2)
		for _, nd := range m.nodes {
			m.ring(ps, p3, nd.ranks, (fg-1)/fg*S*cf, (g-1)*calls)
		}
	case PointToPoint:
		ph := ps.at(0)
		var lat hop
		for i := range n {
			lat = later(lat, m.route(ph, i, (i+1)%n, S*cf))
		}
		ps.step(ph, calls, lat)
	case Direct:
		ph := ps.at(0)
		var lat hop
		for i := range n {
			for j := range n {
				if i != j {
					lat = later(lat, m.route(ph, i, j, S/fn*cf))
				}
			}
		}
		ps.step(ph, (n-1)*calls, lat)
	}
}

// ring adds a ring over ranks (in that order; nil: all the model's, in
// rank order) whose every edge carries b bytes. Edges inside a node are routed onto the GPUs' links; an edge
// between nodes is spread over the NICs of both nodes, as NCCL's channels
// enter and leave a node through different GPU-NIC pairs.
func (m *model) ring(ps *phases, ph *phase, ranks []int, b float64, steps int) {
	n := len(ranks)
	at := func(i int) int { return ranks[i] }
	if ranks == nil {
		n = len(m.ranks)
		at = func(i int) int { return i }
	}
	if n < 2 {
		return
	}
	if n > 2 {
		// Inside a node NCCL searches its own ring over the GPUs, whatever
		// the ranks' order: the same GPUs give one ring. Across nodes the
		// ring visits the nodes in the order of their first rank, each
		// through its searched chain.
		rs := take(&m.root().sc.ints, n)
		for i := range n {
			rs[i] = at(i)
		}
		if order := m.searchedRing(rs); order != nil {
			at = func(i int) int { return order[i] }
		}
	}
	// A step moves every chunk one hop: the ring's steps cost its hops'
	// mean latency each (NCCL's tuning counts intra- and inter-node steps
	// apart the same way).
	var lat hop
	for i := range n {
		r, next := at(i), at((i+1)%n)
		if m.ranks[r].node == m.ranks[next].node {
			lat = lat.plus(m.route(ph, r, next, b))
		} else {
			lat = lat.plus(m.nodeXfer(ph, m.ranks[r].node, m.ranks[next].node, b))
		}
	}
	fn := float64(n)
	ps.step(ph, steps, hop{lat[0] / fn, lat[1] / fn, lat[2] / fn})
}

// tree adds calls runs of NCCL's all-reduce tree of S bytes: a chain
// through the ranks of each node (reduce up, broadcast down: S each way
// on every edge), and between nodes (in order of first rank) a double
// binary tree, each tree taking half the data, reduce and broadcast
// pipelined.
func (m *model) tree(ps *phases, ph *phase, S float64, calls int) {
	var lat hop
	depth := 0
	total := S * float64(calls)
	var longest []int // the longest chain, for the pipeline's stages
	for _, nd := range m.nodes {
		chain := nd.ranks
		if order, ok := m.nodeRing(chain); ok {
			// NCCL's chain inside a node is its searched ring, opened at
			// the ring's weakest edge.
			chain = order
		}
		for k := 0; k+1 < len(chain); k++ {
			lat = later(lat, m.route(ph, chain[k], chain[k+1], total))
			lat = later(lat, m.route(ph, chain[k+1], chain[k], total))
		}
		depth = max(depth, len(nd.ranks)-1)
		if len(chain) > len(longest) {
			longest = chain
		}
	}
	if nn := len(m.nodes); nn > 1 {
		lat = later(lat, m.treeAcross(ph, total))
		depth += 2 * bits.Len(uint(nn))
	}
	ps.step(ph, 2*depth*calls, lat)

	// A chunk's path (ramp.go): up the longest chain, up the network tree
	// and down it, down the chain.
	from := len(ph.pipeIDs)
	for k := len(longest) - 1; k > 0; k-- {
		ph.pipeIDs = append(ph.pipeIDs, m.localLink(longest[k], longest[k-1]))
	}
	ph.pipeIDs = m.appendNetStages(ph.pipeIDs)
	for k := 0; k+1 < len(longest); k++ {
		ph.pipeIDs = append(ph.pipeIDs, m.localLink(longest[k], longest[k+1]))
	}
	b := ps.trueBytes(S)
	ch := treeChunking(b, m.treeChannels(), treeDepth(len(m.ranks), len(m.nodes)))
	ps.addPipe(ph, from, max(1, b/ch.LoopBytes))
}

// appendNetStages appends the links of a chunk's way up the double
// binary tree between the nodes and down again (a NIC of the first
// node's, then of the second's: the trees load them alike); none on one
// node.
func (m *model) appendNetStages(ids []int32) []int32 {
	nn := len(m.nodes)
	if nn < 2 || len(m.nodes[0].nics) == 0 || len(m.nodes[1].nics) == 0 {
		return ids
	}
	levels := bits.Len(uint(nn - 1))
	up, down := m.nodes[0].nic(m.nodes[0].nics[0], tx), m.nodes[1].nic(m.nodes[1].nics[0], tx)
	for range levels {
		ids = append(ids, up)
	}
	for range levels {
		ids = append(ids, down)
	}
	return ids
}

// treeAcross adds NCCL's double binary tree between the nodes (in order
// of first rank), each tree taking half of S up and down every edge, and
// returns a step's latency over it.
func (m *model) treeAcross(ph *phase, S float64) hop {
	var lat hop
	nn := len(m.nodes)
	for t := range 2 {
		for r := range nn {
			up := dtreeParent(nn, r, t)
			if up < 0 {
				continue
			}
			lat = later(lat, m.nodeXfer(ph, int32(r), int32(up), S/2))
			lat = later(lat, m.nodeXfer(ph, int32(up), int32(r), S/2))
		}
	}
	return lat
}

// nvlsOverheadUS is the slowest node's per-step overhead.
func (m *model) nvlsOverheadUS() float64 {
	var us float64
	for _, nd := range m.nodes {
		us = max(us, m.stepOverheadUS(nd.nodeInfo))
	}
	return us
}

// nvls adds in-switch reduction's flows: b bytes into and out of every
// rank's NVLink port.
func (m *model) nvls(ph *phase, b float64) {
	for _, r := range m.ranks {
		nd := m.nodes[r.node]
		ph.add(nd.port(kNVLS, r.gpu, tx), b)
		ph.add(nd.port(kNVLS, r.gpu, rx), b)
	}
}

// btreeParent is NCCL's binary tree (src/graph/trees.cc ncclGetBtree):
// the parent of rank r among n, -1 for the root.
func btreeParent(n, r int) int {
	if r == 0 {
		return -1
	}
	bit := 1
	for ; bit < n; bit <<= 1 {
		if bit&r != 0 {
			break
		}
	}
	up := (r ^ bit) | (bit << 1)
	if up >= n {
		up = r ^ bit
	}
	return up
}

// dtreeParent is NCCL's double binary tree (ncclGetDtree): tree 0 is the
// binary tree, tree 1 its mirror (even n) or its shift by one (odd n).
func dtreeParent(n, r, t int) int {
	if t == 0 {
		return btreeParent(n, r)
	}
	if n%2 == 1 {
		s := (r - 1 + n) % n
		u := btreeParent(n, s)
		if u < 0 {
			return -1
		}
		return (u + 1) % n
	}
	u := btreeParent(n, n-1-r)
	if u < 0 {
		return -1
	}
	return n - 1 - u
}

// searchedRing is ranks in the order NCCL's rings take them: one node's
// its searched ring (nodeRing); several nodes' by node in the order of
// their first rank, each node's ranks as the chain of its searched ring.
// Nil when no node's order changes.
func (m *model) searchedRing(ranks []int) []int {
	// The common case, at no cost: each node's ranks together, on nodes
	// whose GPUs are all alike (NVSwitch): nothing to reorder.
	plain := true
	for i, r := range ranks {
		nd := m.ranks[r].node
		if !m.nodes[nd].alike || (i > 0 && nd < m.ranks[ranks[i-1]].node) {
			plain = false
			break
		}
	}
	if plain {
		return nil
	}
	if order, ok := m.nodeRing(ranks); ok {
		return order
	}
	var nodes []int32
	byNode := map[int32][]int{}
	for _, r := range ranks {
		nd := m.ranks[r].node
		if _, seen := byNode[nd]; !seen {
			nodes = append(nodes, nd)
		}
		byNode[nd] = append(byNode[nd], r)
	}
	if len(nodes) < 2 {
		return nil
	}
	out := make([]int, 0, len(ranks))
	changed := false
	for _, nd := range nodes {
		seg := byNode[nd]
		if chain, ok := m.nodeRing(seg); ok {
			seg, changed = chain, true
		}
		out = append(out, seg...)
	}
	if !changed && !slices.Equal(out, ranks) {
		changed = true // the nodes' ranks were interleaved
	}
	if !changed {
		return nil
	}
	return out
}

// nodeRing is the ring NCCL's search would find over ranks, all on one
// node, as it depends on the GPUs alone, not on the ranks' order: from
// each GPU in turn (by position), the nearest-neighbour ring by the
// links' bandwidth (ties to the lower latency, then the lower position),
// the best by its weakest link, then by its total bandwidth, then by its
// total latency; it starts after its weakest link, so that a chain cut
// from it drops that link. ok is false when ranks span nodes, are fewer
// than three, or every pair's link is alike (every order is one ring).
func (m *model) nodeRing(ranks []int) ([]int, bool) {
	n := len(ranks)
	if n < 3 {
		return nil, false
	}
	node := m.ranks[ranks[0]].node
	for _, r := range ranks[1:] {
		if m.ranks[r].node != node {
			return nil, false
		}
	}
	if m.nodes[node].alike {
		return nil, false
	}
	topo := m.nodes[node].n
	byGPU := slices.Clone(ranks)
	slices.SortFunc(byGPU, func(a, b int) int { return cmp.Compare(m.ranks[a].gpu, m.ranks[b].gpu) })
	bw := make([][]float64, n)
	lat := make([][]float64, n)
	uniform := true
	for i := range n {
		bw[i], lat[i] = make([]float64, n), make([]float64, n)
		for j := range n {
			if i != j {
				p := topo.Path(m.ranks[byGPU[i]].gpu, m.ranks[byGPU[j]].gpu, m.bw)
				bw[i][j], lat[i][j] = p.BandwidthGBps, p.LatencyUS
				uniform = uniform && bw[i][j] == bw[0][1] && lat[i][j] == lat[0][1]
			}
		}
	}
	if uniform {
		if topo.GPUPaths == nil || topo.GPUPaths[m.ranks[byGPU[0]].gpu][m.ranks[byGPU[1]].gpu].Class != topology.SYS {
			return nil, false
		}
		// Every pair crosses the inter-socket link, whose two directions
		// (lower GPU to higher, and back) the ring's order loads: up the
		// even positions and down the odd ones loads both alike, as
		// NCCL's search, which sees each direction's bandwidth, would.
		out := make([]int, 0, n)
		for i := 0; i < n; i += 2 {
			out = append(out, byGPU[i])
		}
		for i := n - 1 - n%2; i > 0; i -= 2 {
			out = append(out, byGPU[i])
		}
		return out, true
	}
	closer := func(from, a, b int) bool { // a before b as the next GPU
		return bw[from][a] > bw[from][b] || bw[from][a] == bw[from][b] && lat[from][a] < lat[from][b]
	}
	var best []int
	bestMin, bestSum, bestLat := -1.0, -1.0, 0.0
	used := make([]bool, n)
	cyc := make([]int, 0, n)
	for s := range n {
		clear(used)
		cyc = append(cyc[:0], s)
		used[s] = true
		for len(cyc) < n {
			last, next := cyc[len(cyc)-1], -1
			for j := range n {
				if !used[j] && (next < 0 || closer(last, j, next)) {
					next = j
				}
			}
			cyc = append(cyc, next)
			used[next] = true
		}
		lo, sum, sumLat, weakest := math.Inf(1), 0.0, 0.0, 0
		for i := range n {
			a, b := cyc[i], cyc[(i+1)%n]
			sum += bw[a][b]
			sumLat += lat[a][b]
			if bw[a][b] < lo {
				lo, weakest = bw[a][b], i
			}
		}
		if lo > bestMin || lo == bestMin && (sum > bestSum || sum == bestSum && sumLat < bestLat) {
			bestMin, bestSum, bestLat = lo, sum, sumLat
			best = best[:0]
			for i := range n {
				best = append(best, byGPU[cyc[(weakest+1+i)%n]])
			}
		}
	}
	return best, true
}
