package collective

import (
	"cmp"
	"fmt"
	"math"

	"github.com/toposched/toposched/services/internal/topology"
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

// nodeInfo is what the model keeps of one node of the placement.
type nodeInfo struct {
	n         *topology.Node
	name      string
	nvSwitch  bool
	perLink   float64   // NVLink GB/s per link and direction
	nvPort    []float64 // aggregate NVLink GB/s per GPU (line rate)
	pcie      float64
	smp       float64
	nics      []int // NIC positions the job's GPUs reach (nearest), sorted
	nicGBps   map[int]float64
	leaf      int32 // -1: no fabric or not listed
	ranks     []int // rank positions on this node, in rank order
	localNICs map[int]int
}

type model struct {
	bw     *topology.Bandwidths
	fabric *topology.Fabric
	ranks  []rankRef
	nodes  []*nodeInfo
	// order is the nodes in order of their first rank.
	leafNames []string
	upGBps    []float64
	cont      map[linkKey]float64
	contByNm  Contention
	netLat    map[[2]int32]float64
	// global maps the model's node positions to the job model's (the
	// identity for a placement's own model), so that link keys agree.
	global []int32
	parent *model
}

// g is node position i in link keys.
func (m *model) g(i int32) int32 {
	if m.global == nil {
		return i
	}
	return m.global[i]
}

type rankRef struct {
	node int32
	gpu  int
}

func newModel(p Placement, cont Contention) (*model, error) {
	if len(p.Ranks) == 0 {
		return nil, ErrNoRanks
	}
	m := &model{bw: p.Bandwidths, fabric: p.Fabric, ranks: make([]rankRef, len(p.Ranks)), contByNm: cont,
		netLat: map[[2]int32]float64{}}
	if m.bw == nil {
		m.bw = topology.DefaultBandwidths()
	}
	index := map[*topology.Node]int32{}
	seen := map[[2]int]bool{}
	for i, r := range p.Ranks {
		if r.Node == nil {
			return nil, fmt.Errorf("collective: rank %d: no node", i)
		}
		if r.GPU < 0 || r.GPU >= len(r.Node.GPUs) {
			return nil, fmt.Errorf("collective: rank %d: GPU %d: node %q has %d GPUs", i, r.GPU, r.Node.Name, len(r.Node.GPUs))
		}
		ni, ok := index[r.Node]
		if !ok {
			ni = int32(len(m.nodes))
			index[r.Node] = ni
			nd := m.describe(r.Node)
			if nd.name == "" {
				nd.name = fmt.Sprintf("node%d", ni)
			}
			m.nodes = append(m.nodes, nd)
		}
		if seen[[2]int{int(ni), r.GPU}] {
			return nil, fmt.Errorf("collective: rank %d: GPU %d of node %q already holds a rank", i, r.GPU, r.Node.Name)
		}
		seen[[2]int{int(ni), r.GPU}] = true
		m.ranks[i] = rankRef{node: ni, gpu: r.GPU}
		m.nodes[ni].ranks = append(m.nodes[ni].ranks, i)
	}
	for _, nd := range m.nodes {
		m.nicsOf(nd)
	}
	m.leaves()
	if len(cont) > 0 {
		m.cont = map[linkKey]float64{}
	}
	return m, nil
}

func (m *model) describe(n *topology.Node) *nodeInfo {
	nd := &nodeInfo{n: n, name: n.Name, leaf: -1, nicGBps: map[int]float64{}}
	nv := m.bw.NVLinkPerLink[n.NVLinkGen]
	if nv == 0 {
		nv = m.bw.NVLinkPerLink[m.bw.DefaultNVLinkGen]
	}
	nd.perLink = nv
	nd.pcie, _ = m.bw.Of(topology.Link{Class: topology.PIX}, n.NVLinkGen, n.PCIeGen)
	nd.smp = m.bw.SMP
	nd.nvPort = make([]float64, len(n.GPUs))
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
	return nd
}

// nicsOf finds the NICs the job's GPUs on a node use: each GPU's nearest.
// A node with no NIC described gets one virtual NIC (-1) at the fabric's
// default rate.
func (m *model) nicsOf(nd *nodeInfo) {
	if nd.localNICs == nil {
		nd.localNICs = map[int]int{}
	}
	set := map[int]bool{}
	for _, r := range nd.ranks {
		g := m.ranks[r].gpu
		k, ok := nd.localNICs[g]
		if !ok {
			k = nd.n.NearestNIC(g)
			nd.localNICs[g] = k
		}
		set[k] = true
	}
	for k := range set {
		nd.nics = append(nd.nics, k)
		rate := 0.0
		if k >= 0 {
			rate = nd.n.NICs[k].RateGbps
		}
		nd.nicGBps[k] = cmp.Or(rate, topology.FabricDefaultNICGbps) / 8
	}
	sortInts(nd.nics)
}

func sortInts(s []int) {
	for i := 1; i < len(s); i++ {
		for j := i; j > 0 && s[j] < s[j-1]; j-- {
			s[j], s[j-1] = s[j-1], s[j]
		}
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
	rep := make([]*nodeInfo, len(m.leafNames))
	for _, nd := range m.nodes {
		if nd.leaf >= 0 && rep[nd.leaf] == nil {
			rep[nd.leaf] = nd
		}
	}
	for _, nd := range m.nodes {
		if nd.leaf < 0 {
			continue
		}
		var other *nodeInfo
		for l, r := range rep {
			if int32(l) != nd.leaf && r != nil {
				other = r
				break
			}
		}
		rate := nd.nicGBps[nd.nics[0]] * 8
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
		c = m.nodes[k.node].nicGBps[int(k.a)] * EffNet
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

// phase is a set of concurrent flows: bytes per link, and the sequential
// steps it takes with the slowest step's latency.
type phase struct {
	load  map[linkKey]float64
	steps int
	lat   float64 // µs per step
}

type phases struct{ list []*phase }

func (ps *phases) at(i int) *phase {
	for len(ps.list) <= i {
		ps.list = append(ps.list, &phase{load: map[linkKey]float64{}})
	}
	return ps.list[i]
}

func (ph *phase) add(k linkKey, b float64) { ph.load[k] += b }

func (ph *phase) step(n int, lat float64) {
	ph.steps = max(ph.steps, n)
	ph.lat = max(ph.lat, lat)
}

// time sums the phases: the most loaded link's bytes over its capacity,
// plus steps times latency, plus one operation latency.
func (m *model) time(ps *phases) (float64, string) {
	t := OpLatencyUS * 1e-6
	var worst float64
	var bn linkKey
	found := false
	for _, ph := range ps.list {
		var mx float64
		for k, b := range ph.load {
			c := m.capacity(k)
			if c <= 0 {
				continue
			}
			s := b / (c * 1e9)
			mx = max(mx, s)
			// Ties (symmetric loads) name the first link in key order, so
			// that the answer does not depend on map order.
			if s > worst || found && s == worst && k.less(bn) {
				worst, bn, found = s, k, true
			}
		}
		t += mx + float64(ph.steps)*ph.lat*1e-6
	}
	if !found {
		return t, ""
	}
	return t, m.linkName(bn)
}

// route adds a flow of b bytes from rank i to rank j and returns the
// latency of a step over it (µs).
func (m *model) route(ph *phase, i, j int, b float64) float64 {
	ri, rj := m.ranks[i], m.ranks[j]
	if ri.node == rj.node {
		return m.routeLocal(ph, ri.node, ri.gpu, rj.gpu, b)
	}
	na, nb := m.nodes[ri.node], m.nodes[rj.node]
	ph.add(linkKey{kPCIe, m.g(ri.node), int32(ri.gpu), tx}, b)
	ph.add(linkKey{kNIC, m.g(ri.node), int32(na.localNICs[ri.gpu]), tx}, b)
	m.crossLeaves(ph, na, nb, b)
	ph.add(linkKey{kNIC, m.g(rj.node), int32(nb.localNICs[rj.gpu]), rx}, b)
	ph.add(linkKey{kPCIe, m.g(rj.node), int32(rj.gpu), rx}, b)
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
			ph.add(linkKey{kNVPort, m.g(node), int32(ga), tx}, b)
			ph.add(linkKey{kNVPort, m.g(node), int32(gb), rx}, b)
		} else {
			ph.add(linkKey{kNVPair, m.g(node), int32(ga), int32(gb)}, b)
		}
	case topology.NVB:
		ph.add(linkKey{kNVPair, m.g(node), int32(ga), int32(gb)}, b)
	default:
		ph.add(linkKey{kPCIe, m.g(node), int32(ga), tx}, b)
		ph.add(linkKey{kPCIe, m.g(node), int32(gb), rx}, b)
		if l.Class == topology.SYS {
			d := int32(tx)
			if ga > gb {
				d = rx
			}
			ph.add(linkKey{kSMP, m.g(node), 0, d}, b)
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
		ph.add(linkKey{kNIC, m.g(a), int32(k), tx}, bytes*na.nicGBps[k]/na.nicSum())
	}
	for _, k := range nb.nics {
		ph.add(linkKey{kNIC, m.g(b), int32(k), rx}, bytes*nb.nicGBps[k]/nb.nicSum())
	}
	m.crossLeaves(ph, na, nb, bytes)
	return m.netLatency(a, b)
}

func (nd *nodeInfo) nicSum() float64 {
	s := 0.0
	for _, k := range nd.nics {
		s += nd.nicGBps[k]
	}
	return s
}

func (m *model) crossLeaves(ph *phase, na, nb *nodeInfo, b float64) {
	if na.leaf < 0 || nb.leaf < 0 || na.leaf == nb.leaf {
		return
	}
	ph.add(linkKey{kUplink, -1, na.leaf, tx}, b)
	ph.add(linkKey{kUplink, -1, nb.leaf, rx}, b)
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
