package collective

import (
	"cmp"
	"fmt"
	"math"

	"github.com/toposched/toposched/internal/topology"
)

// Link kinds.
const (
	kNVPort uint8 = iota // a GPU's NVLink port to the NVSwitches (a: gpu, b: dir)
	kNVPair              // direct NVLinks between two GPUs (a: from, b: to)
	kNVLS                // a GPU's port as used by in-switch reduction (a: gpu, b: dir)
	kPCIe                // a GPU's PCIe link (a: gpu, b: dir)
	kSMP                 // the inter-socket link of a node (b: dir)
	kNIC                 // a NIC's link to its leaf (a: NIC position or -1, b: dir)
	kUplink              // a leaf's uplinks (node: -1, a: leaf, b: dir)
)

const (
	tx = 0 // out of the GPU / node / leaf
	rx = 1 // into it
)

type linkKey struct {
	kind uint8
	node int32
	a, b int32
}

func (k linkKey) less(o linkKey) bool {
	switch {
	case k.kind != o.kind:
		return k.kind < o.kind
	case k.node != o.node:
		return k.node < o.node
	case k.a != o.a:
		return k.a < o.a
	}
	return k.b < o.b
}

// nodeView is one node of a model: the node as its root describes it
// (shared by every sub-model of the root), and this model's ranks on it
// and the NICs they use.
type nodeView struct {
	*nodeInfo
	ranks  []int   // rank positions on this node, in rank order
	nics   []int   // NIC positions the model's GPUs reach (nearest), sorted
	nicSum float64 // nicGBps summed over nics, in their order
}

// nodeInfo is what a root model keeps of one node of the placement.
type nodeInfo struct {
	n        *topology.Node
	name     string
	nvSwitch bool
	perLink  float64   // NVLink GB/s per link and direction
	nvPort   []float64 // aggregate NVLink GB/s per GPU (line rate)
	pcie     float64
	smp      float64
	nicGBps  []float64 // by NIC position + 1 (0: the virtual NIC -1)
	leaf     int32     // -1: no fabric or not listed
	// localNICs is each GPU's nearest NIC (valid where the root has a
	// rank on the GPU); rankAt the root's rank on each GPU (-1: none).
	localNICs []int
	rankAt    []int
	ranksBuf  []int // room for the root's ranks on the node
	// gi is the node's position in the root model (link keys' node);
	// off the first link id of each kind of link of the node.
	gi   int32
	off  [kUplink]int32
	size [kUplink]int32
}

type model struct {
	bw     *topology.Bandwidths
	fabric *topology.Fabric
	ranks  []rankRef
	nodes  []*nodeView
	// order is the nodes in order of their first rank.
	leafNames []string
	upGBps    []float64
	contByNm  Contention
	netLat    map[[2]int32]float64
	parent    *model
	// Root only: the node positions by node, the link id space (ids
	// follow linkKey order), the capacities of the links seen so far,
	// and phases free for reuse.
	index     map[*topology.Node]int32
	nLinks    int32
	kindStart [kUplink + 2]int32 // first id of each kind; [kUplink+1]: nLinks
	offUp     int32
	capv      []float64
	capKnown  []uint64
	free      []*phase
	localIdx  []int32 // scratch for sub: root node -> sub node, -1
}

// root is the model whose nodes and links a (sub-)model's flows land on.
func (m *model) root() *model {
	if m.parent != nil {
		return m.parent
	}
	return m
}

// g is node position i in link keys.
func (m *model) g(i int32) int32 { return m.nodes[i].gi }

type rankRef struct {
	node int32
	gpu  int
}

func newModel(p Placement, cont Contention) (*model, error) {
	if len(p.Ranks) == 0 {
		return nil, ErrNoRanks
	}
	m := newRoot(p.Fabric, p.Bandwidths, cont, len(p.Ranks))
	for i, r := range p.Ranks {
		if _, err := m.addRank(i, r, false); err != nil {
			return nil, err
		}
	}
	m.finish()
	return m, nil
}

func newRoot(f *topology.Fabric, bw *topology.Bandwidths, cont Contention, hint int) *model {
	m := &model{bw: bw, fabric: f, ranks: make([]rankRef, 0, hint), contByNm: cont,
		netLat: map[[2]int32]float64{}, index: map[*topology.Node]int32{}}
	if m.bw == nil {
		m.bw = topology.DefaultBandwidths()
	}
	return m
}

// addRank adds rank r as rank i (which must be len(m.ranks)). With
// dedupe, a rank already held is skipped (false) instead of an error.
func (m *model) addRank(i int, r Rank, dedupe bool) (bool, error) {
	if r.Node == nil {
		return false, fmt.Errorf("collective: rank %d: no node", i)
	}
	ni, ok := m.index[r.Node]
	if ok && r.GPU >= 0 && r.GPU < len(r.Node.GPUs) && m.nodes[ni].rankAt[r.GPU] >= 0 {
		if dedupe {
			return false, nil
		}
		return false, fmt.Errorf("collective: rank %d: GPU %d of node %q already holds a rank", i, r.GPU, r.Node.Name)
	}
	if r.GPU < 0 || r.GPU >= len(r.Node.GPUs) {
		return false, fmt.Errorf("collective: rank %d: GPU %d: node %q has %d GPUs", i, r.GPU, r.Node.Name, len(r.Node.GPUs))
	}
	if !ok {
		ni = int32(len(m.nodes))
		m.index[r.Node] = ni
		nd := m.describe(r.Node)
		if nd.name == "" {
			nd.name = fmt.Sprintf("node%d", ni)
		}
		nd.gi = ni
		m.nodes = append(m.nodes, &nodeView{nodeInfo: nd, ranks: nd.ranksBuf})
	}
	nd := m.nodes[ni]
	nd.rankAt[r.GPU] = len(m.ranks)
	m.ranks = append(m.ranks, rankRef{node: ni, gpu: r.GPU})
	nd.ranks = append(nd.ranks, len(m.ranks)-1)
	return true, nil
}

// finish completes a root model once its ranks are in.
func (m *model) finish() {
	for _, nd := range m.nodes {
		m.nicsOf(nd)
	}
	m.leaves()
	m.layout()
	m.capv = make([]float64, m.nLinks)
	m.capKnown = make([]uint64, (m.nLinks+63)/64)
	if m.contByNm == nil {
		// No link names to look up: every capacity now, cheaply.
		for kind := kNVPort; kind < kUplink; kind++ {
			for _, nd := range m.nodes {
				for off := range nd.size[kind] {
					m.capv[nd.off[kind]+off] = m.capacity(nd.keyAt(kind, off))
				}
			}
		}
		for off := range m.kindStart[kUplink+1] - m.offUp {
			m.capv[m.offUp+off] = m.capacity(linkKey{kUplink, -1, off / 2, off % 2})
		}
		for i := range m.capKnown {
			m.capKnown[i] = ^uint64(0)
		}
	}
}

// layout numbers the links: kind by kind, node by node, then a and b,
// so that ids compare as their keys do (linkKey.less).
func (m *model) layout() {
	var id int32
	for kind := kNVPort; kind < kUplink; kind++ {
		m.kindStart[kind] = id
		for _, nd := range m.nodes {
			nd.off[kind] = id
			nd.size[kind] = nd.blockSize(kind)
			id += nd.size[kind]
		}
	}
	m.kindStart[kUplink] = id
	m.offUp = id
	id += 2 * int32(len(m.leafNames))
	m.kindStart[kUplink+1] = id
	m.nLinks = id
}

// blockSize is the number of links of a kind a node has.
func (nd *nodeInfo) blockSize(kind uint8) int32 {
	g := int32(len(nd.n.GPUs))
	switch kind {
	case kNVPort, kPCIe:
		return 2 * g
	case kNVLS:
		if nd.nvSwitch {
			return 2 * g
		}
	case kNVPair:
		if nd.n.GPUPaths != nil {
			for i := range nd.n.GPUs {
				for j := range nd.n.GPUs {
					if i == j {
						continue
					}
					c := nd.n.GPUPaths[i][j].Class
					if c == topology.NVB || c == topology.NV && !nd.nvSwitch {
						return g * g
					}
				}
			}
		}
	case kSMP:
		return 2
	case kNIC:
		return 2 * int32(len(nd.nicGBps))
	}
	return 0
}

// key is the link of an id (see layout).
func (m *model) key(id int32) linkKey {
	kind := uint8(0)
	for kind+1 <= kUplink && m.kindStart[kind+1] <= id {
		kind++
	}
	if kind == kUplink {
		off := id - m.offUp
		return linkKey{kUplink, -1, off / 2, off % 2}
	}
	// The first node whose block of this kind ends after id.
	lo, hi := 0, len(m.nodes)
	for lo < hi {
		h := (lo + hi) / 2
		if m.nodes[h].off[kind]+m.nodes[h].size[kind] > id {
			hi = h
		} else {
			lo = h + 1
		}
	}
	return m.nodes[lo].keyAt(kind, id-m.nodes[lo].off[kind])
}

// keyAt is the link at offset off in the node's block of a kind.
func (nd *nodeInfo) keyAt(kind uint8, off int32) linkKey {
	switch kind {
	case kNVPair:
		g := int32(len(nd.n.GPUs))
		return linkKey{kind, nd.gi, off / g, off % g}
	case kSMP:
		return linkKey{kind, nd.gi, 0, off}
	case kNIC:
		return linkKey{kind, nd.gi, off/2 - 1, off % 2}
	}
	return linkKey{kind, nd.gi, off / 2, off % 2}
}

// cap is a link's effective bandwidth, computed once per root.
func (m *model) capOf(id int32) float64 {
	w, bit := id/64, uint64(1)<<(id%64)
	if m.capKnown[w]&bit == 0 {
		m.capv[id] = m.capacity(m.key(id))
		m.capKnown[w] |= bit
	}
	return m.capv[id]
}

func (m *model) describe(n *topology.Node) *nodeInfo {
	nd := &nodeInfo{n: n, name: n.Name, leaf: -1}
	nv := m.bw.NVLinkPerLink[n.NVLinkGen]
	if nv == 0 {
		nv = m.bw.NVLinkPerLink[m.bw.DefaultNVLinkGen]
	}
	nd.perLink = nv
	nd.pcie, _ = m.bw.Of(topology.Link{Class: topology.PIX}, n.NVLinkGen, n.PCIeGen)
	nd.smp = m.bw.SMP
	// One allocation for the per-GPU and per-NIC figures each.
	G := len(n.GPUs)
	fs := make([]float64, G+len(n.NICs)+1)
	is := make([]int, 3*G)
	nd.nvPort, nd.nicGBps = fs[:G:G], fs[G:]
	nd.localNICs, nd.rankAt, nd.ranksBuf = is[:G:G], is[G:2*G:2*G], is[2*G:2*G:3*G]
	allNV, first := len(n.GPUs) > 1 && n.GPUPaths != nil, 0
	for i := range n.GPUs {
		mx, sum := 0, 0
		for j := range n.GPUs {
			if i == j || n.GPUPaths == nil {
				continue
			}
			l := n.GPUPaths[i][j]
			if l.Class != topology.NV {
				allNV = false
				continue
			}
			if first == 0 {
				first = l.NVLinks
			} else if l.NVLinks != first {
				allNV = false
			}
			mx = max(mx, l.NVLinks)
			sum += l.NVLinks
		}
		nd.nvPort[i] = float64(sum) * nv
		if n.NVSwitches > 0 {
			nd.nvPort[i] = float64(mx) * nv
		}
	}
	// An NVSwitch node: the source says so, or every pair has the same
	// NVLink count (NV12 on A100, NV18 on H100: each GPU's links all go to
	// the switches, and any one pair can use them all).
	nd.nvSwitch = n.NVSwitches > 0 || allNV
	if nd.nvSwitch {
		for i := range nd.nvPort {
			if allNV {
				nd.nvPort[i] = float64(first) * nv
			}
		}
	}
	for k := -1; k < len(n.NICs); k++ {
		rate := 0.0
		if k >= 0 {
			rate = n.NICs[k].RateGbps
		}
		nd.nicGBps[k+1] = cmp.Or(rate, topology.FabricDefaultNICGbps) / 8
	}
	for g := range nd.rankAt {
		nd.rankAt[g] = -1
	}
	return nd
}

// nicsOf finds the NICs the model's GPUs on a node use: each GPU's
// nearest. A node with no NIC described gets one virtual NIC (-1) at the
// fabric's default rate.
func (m *model) nicsOf(nd *nodeView) {
	var buf [64]bool
	var set []bool
	if len(nd.nicGBps) <= len(buf) {
		set = buf[:len(nd.nicGBps)]
	} else {
		set = make([]bool, len(nd.nicGBps))
	}
	for _, r := range nd.ranks {
		g := m.ranks[r].gpu
		if m.parent == nil {
			nd.localNICs[g] = nd.n.NearestNIC(g)
		}
		set[nd.localNICs[g]+1] = true
	}
	nd.nics = nd.nics[:0]
	for i, ok := range set {
		if ok {
			nd.nics = append(nd.nics, i-1)
		}
	}
	nd.nicSum = 0
	for _, k := range nd.nics {
		nd.nicSum += nd.nicGBps[k+1]
	}
}

// leaves places the nodes under their leaves and sizes each leaf's
// uplink as the sum of the shares of the job's nodes below it: for each
// node, what the fabric's RailPath leaves a NIC of it towards a node of
// the job under another leaf (its leaf link divided by the
// oversubscription of the switches crossed, capped by their uplinks),
// times the NICs the node uses. Rails are not told apart: a node is under
// its first leaf.
func (m *model) leaves() {
	if m.fabric == nil {
		return
	}
	idx := map[string]int32{}
	for _, nd := range m.nodes {
		l, ok := m.fabric.LeafOf(nd.name, -1)
		if !ok {
			continue
		}
		li, ok := idx[l]
		if !ok {
			li = int32(len(m.leafNames))
			idx[l] = li
			m.leafNames = append(m.leafNames, l)
			m.upGBps = append(m.upGBps, 0)
		}
		nd.leaf = li
	}
	if len(m.leafNames) < 2 {
		return
	}
	// One node of the job under each leaf, to measure the others against.
	rep := make([]*nodeView, len(m.leafNames))
	for _, nd := range m.nodes {
		if nd.leaf >= 0 && rep[nd.leaf] == nil {
			rep[nd.leaf] = nd
		}
	}
	for _, nd := range m.nodes {
		if nd.leaf < 0 {
			continue
		}
		var other *nodeView
		for l, r := range rep {
			if int32(l) != nd.leaf && r != nil {
				other = r
				break
			}
		}
		rate := nd.nicGBps[nd.nics[0]+1] * 8
		p := m.fabric.RailPath(nd.name, -1, other.name, -1, rate, 0)
		share := p.BandwidthGBps
		if share <= 0 {
			share = rate / 8
		}
		m.upGBps[nd.leaf] += share * float64(len(nd.nics))
	}
}

// capacity is a link's effective bandwidth in GB/s.
func (m *model) capacity(k linkKey) float64 {
	if m.parent != nil {
		return m.parent.capacity(k)
	}
	var c float64
	switch k.kind {
	case kNVPort:
		c = m.nodes[k.node].nvPort[k.a] * EffNVLink
	case kNVLS:
		c = m.nodes[k.node].nvPort[k.a] * EffNVLS
	case kNVPair:
		nd := m.nodes[k.node]
		l := nd.n.GPUPaths[k.a][k.b]
		n := max(l.NVLinks, 1)
		c = float64(n) * nd.perLink * EffNVLink
	case kPCIe:
		c = m.nodes[k.node].pcie * EffPCIe
	case kSMP:
		c = m.nodes[k.node].smp * EffPCIe
	case kNIC:
		c = m.nodes[k.node].nicGBps[k.a+1] * EffNet
	case kUplink:
		c = m.upGBps[k.a] * EffNet
	}
	if m.contByNm != nil {
		if f := m.contByNm[m.linkName(k)]; f > 0 {
			c *= math.Max(1-f, 1e-3)
		}
	}
	return c
}

// LinkName renders a link as Contention keys it.
func (m *model) linkName(k linkKey) string {
	if m.parent != nil {
		return m.parent.linkName(k)
	}
	dir := [2]string{"tx", "rx"}[k.b&1]
	switch k.kind {
	case kNVPort, kNVLS:
		return fmt.Sprintf("nvport:%s:%d:%s", m.nodes[k.node].name, k.a, dir)
	case kNVPair:
		return fmt.Sprintf("nvlink:%s:%d:%d", m.nodes[k.node].name, k.a, k.b)
	case kPCIe:
		return fmt.Sprintf("pcie:%s:%d:%s", m.nodes[k.node].name, k.a, dir)
	case kSMP:
		return fmt.Sprintf("smp:%s:%s", m.nodes[k.node].name, dir)
	case kNIC:
		return fmt.Sprintf("nic:%s:%d:%s", m.nodes[k.node].name, k.a, dir)
	case kUplink:
		return fmt.Sprintf("uplink:%s:%s", m.leafNames[k.a], [2]string{"up", "down"}[k.b&1])
	}
	return "?"
}

// phase is a set of concurrent flows: bytes per link (by link id, see
// layout), and the sequential steps it takes with the slowest step's
// latency.
type phase struct {
	load  []float64 // by link id
	seen  []uint64  // links with a flow
	ids   []int32   // links with a flow, in the order of their first
	steps int
	lat   float64 // µs per step
}

// phases are the phases of a build; their links are root's.
type phases struct {
	list []*phase
	root *model
}

func (ps *phases) at(i int) *phase {
	for len(ps.list) <= i {
		r := ps.root
		var ph *phase
		if n := len(r.free); n > 0 {
			ph, r.free = r.free[n-1], r.free[:n-1]
		} else {
			ph = &phase{load: make([]float64, r.nLinks), seen: make([]uint64, (r.nLinks+63)/64)}
		}
		ps.list = append(ps.list, ph)
	}
	return ps.list[i]
}

// release clears the phases and keeps them for reuse.
func (ps *phases) release() {
	for _, ph := range ps.list {
		for _, id := range ph.ids {
			ph.load[id] = 0
			ph.seen[id/64] = 0
		}
		ph.ids = ph.ids[:0]
		ph.steps, ph.lat = 0, 0
		ps.root.free = append(ps.root.free, ph)
	}
	ps.list = nil
}

func (ph *phase) add(id int32, b float64) {
	w, bit := id/64, uint64(1)<<(id%64)
	if ph.seen[w]&bit == 0 {
		ph.seen[w] |= bit
		ph.ids = append(ph.ids, id)
	}
	ph.load[id] += b
}

func (ph *phase) step(n int, lat float64) {
	ph.steps = max(ph.steps, n)
	ph.lat = max(ph.lat, lat)
}

// time sums the phases: the most loaded link's bytes over its capacity,
// plus steps times latency, plus one operation latency.
func (m *model) time(ps *phases) (float64, string) {
	r := m.root()
	t := OpLatencyUS * 1e-6
	var worst float64
	var bn int32
	found := false
	for _, ph := range ps.list {
		var mx float64
		for _, id := range ph.ids {
			c := r.capOf(id)
			if c <= 0 {
				continue
			}
			s := ph.load[id] / (c * 1e9)
			mx = max(mx, s)
			// Ties (symmetric loads) name the first link in key order (ids
			// are in key order), so that the answer does not depend on the
			// order flows were added in.
			if s > worst || found && s == worst && id < bn {
				worst, bn, found = s, id, true
			}
		}
		t += mx + float64(ph.steps)*ph.lat*1e-6
	}
	if !found {
		return t, ""
	}
	return t, r.linkName(r.key(bn))
}

// Link ids of a node's links.
func (nd *nodeInfo) port(kind uint8, gpu int, dir int32) int32 {
	return nd.off[kind] + 2*int32(gpu) + dir
}

func (nd *nodeInfo) pair(a, b int) int32 {
	return nd.off[kNVPair] + int32(a)*int32(len(nd.n.GPUs)) + int32(b)
}

func (nd *nodeInfo) nic(k int, dir int32) int32 { return nd.off[kNIC] + 2*int32(k+1) + dir }

// route adds a flow of b bytes from rank i to rank j and returns the
// latency of a step over it (µs).
func (m *model) route(ph *phase, i, j int, b float64) float64 {
	ri, rj := m.ranks[i], m.ranks[j]
	if ri.node == rj.node {
		return m.routeLocal(ph, ri.node, ri.gpu, rj.gpu, b)
	}
	na, nb := m.nodes[ri.node], m.nodes[rj.node]
	ph.add(na.port(kPCIe, ri.gpu, tx), b)
	ph.add(na.nic(na.localNICs[ri.gpu], tx), b)
	m.crossLeaves(ph, na, nb, b)
	ph.add(nb.nic(nb.localNICs[rj.gpu], rx), b)
	ph.add(nb.port(kPCIe, rj.gpu, rx), b)
	return m.netLatency(ri.node, rj.node)
}

func (m *model) routeLocal(ph *phase, node int32, ga, gb int, b float64) float64 {
	nd := m.nodes[node]
	if ga == gb {
		return 0
	}
	l := topology.Link{Class: topology.PHB}
	if nd.n.GPUPaths != nil {
		l = nd.n.GPUPaths[ga][gb]
	}
	lat := m.bw.LatencyUS[l.Class] + StepOverheadUS
	switch l.Class {
	case topology.NV:
		if nd.nvSwitch {
			ph.add(nd.port(kNVPort, ga, tx), b)
			ph.add(nd.port(kNVPort, gb, rx), b)
		} else {
			ph.add(nd.pair(ga, gb), b)
		}
	case topology.NVB:
		ph.add(nd.pair(ga, gb), b)
	default:
		ph.add(nd.port(kPCIe, ga, tx), b)
		ph.add(nd.port(kPCIe, gb, rx), b)
		if l.Class == topology.SYS {
			d := int32(tx)
			if ga > gb {
				d = rx
			}
			ph.add(nd.off[kSMP]+d, b)
		}
	}
	return lat
}

// nodeXfer adds b bytes from node a to node b spread over the NICs each
// uses (NCCL's channels each take a different NIC) and returns the
// latency of a step over the network.
func (m *model) nodeXfer(ph *phase, a, b int32, bytes float64) float64 {
	na, nb := m.nodes[a], m.nodes[b]
	for _, k := range na.nics {
		ph.add(na.nic(k, tx), bytes*na.nicGBps[k+1]/na.nicSum)
	}
	for _, k := range nb.nics {
		ph.add(nb.nic(k, rx), bytes*nb.nicGBps[k+1]/nb.nicSum)
	}
	m.crossLeaves(ph, na, nb, bytes)
	return m.netLatency(a, b)
}

func (m *model) crossLeaves(ph *phase, na, nb *nodeView, b float64) {
	if na.leaf < 0 || nb.leaf < 0 || na.leaf == nb.leaf {
		return
	}
	up := m.root().offUp
	ph.add(up+2*na.leaf+tx, b)
	ph.add(up+2*nb.leaf+rx, b)
}

// netLatency is a step's latency between two nodes (µs): the GPU path's
// latency from the fabric plus the protocol's step overheads.
func (m *model) netLatency(a, b int32) float64 {
	ga, gb := m.g(a), m.g(b)
	key := [2]int32{min(ga, gb), max(ga, gb)}
	if l, ok := m.netLat[key]; ok {
		return l
	}
	na, nb := m.nodes[a], m.nodes[b]
	p := topology.GPUPath(m.fabric, na.n, m.ranks[na.ranks[0]].gpu, nb.n, m.ranks[nb.ranks[0]].gpu, m.bw)
	lat := p.LatencyUS
	if lat <= 0 {
		lat = m.bw.LatencyUS[topology.NET]
	}
	lat += StepOverheadUS + NetStepOverheadUS
	m.netLat[key] = lat
	return lat
}
