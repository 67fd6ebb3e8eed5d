package collective

// The model of one placement: the root model and its sub-models, the
// nodes and ranks they hold, and what a root learns once of each node (its
// NVLink, PCIe and NIC rates, the NICs its GPUs use, its leaf and the
// leaf's uplink share). The links are numbered in links.go.

import (
	"cmp"
	"fmt"

	"github.com/toposched/toposched/internal/topology"
)

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
	tuning    *Tuning    // NCCL's tuner: which algorithms and protocols run
	protos    []Protocol // ring's and tree's protocols here (protocols), once known
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
	sc        *scratch
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
	// alike: every pair of the node's GPUs has the same link, so every
	// order of its GPUs is one ring (nodeRing has nothing to search).
	alike   bool
	perLink float64   // NVLink GB/s per link and direction
	nvPort  []float64 // aggregate NVLink GB/s per GPU (line rate)
	pcie    float64
	smp     float64
	nicGBps []float64 // by NIC position + 1 (0: the virtual NIC -1)
	// nicKind is the kind of link (LinkKinds) of each NIC, by position
	// + 1: net, or its transport's.
	nicKind []string
	// eff is the calibration's efficiency on this node (its GPU model's
	// where the calibration has one).
	eff topology.Efficiency
	cc  int // compute capability x10 (ComputeCapability)
	// p2pLevel is the farthest path class NCCL joins by P2P on the node
	// (transport.go), hostLink whether the node has a host link (kHost).
	p2pLevel topology.Class
	hostLink bool
	leaf     int32 // -1: no fabric or not listed
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

// newModel is the root model of a placement under NCCL release tun (nil:
// DefaultTuning), which decides the transports the links are laid out
// for.
func newModel(p Placement, cont Contention, tun *Tuning) (*model, error) {
	if len(p.Ranks) == 0 {
		return nil, ErrNoRanks
	}
	m := newRoot(p.Fabric, p.Bandwidths, cont, len(p.Ranks))
	m.tuning = tun.tuning()
	for i, r := range p.Ranks {
		if _, err := m.addRank(i, r, false); err != nil {
			return nil, err
		}
	}
	m.finish()
	return m, nil
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
		v := &take(&m.sc.views, 1)[0]
		*v = nodeView{nodeInfo: nd, ranks: nd.ranksBuf, nics: take(&m.sc.ints, len(nd.nicGBps))[:0]}
		m.nodes = append(m.nodes, v)
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
		m.setTransport(nd)
	}
	m.leaves()
	m.layout()
	m.capv = grown(m.capv, int(m.nLinks))
	m.capKnown = grown(m.capKnown, int(m.nLinks+63)/64)
	m.localIdx = grown(m.localIdx, len(m.nodes))
	for i := range m.localIdx {
		m.localIdx[i] = -1
	}
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

func (m *model) describe(n *topology.Node) *nodeInfo {
	nd := &take(&m.sc.infos, 1)[0]
	*nd = nodeInfo{n: n, name: n.Name, leaf: -1}
	model := ""
	if len(n.GPUs) > 0 {
		model = n.GPUs[0].Model
	}
	nd.eff = m.bw.EfficiencyOf(model)
	nd.cc = ComputeCapability(n)
	nv := m.bw.NVLinkPerLink[n.NVLinkGen]
	if nv == 0 {
		nv = m.bw.NVLinkPerLink[m.bw.DefaultNVLinkGen]
	}
	if r := nvLinkPerLinkOf(model); r > 0 {
		nv = r
	}
	nd.perLink = nv
	nd.pcie, _ = m.bw.Of(topology.Link{Class: topology.PIX}, n.NVLinkGen, n.PCIeGen)
	nd.smp = m.bw.SMP
	if k := n.CPU.Kind(); k.InterSocketLineGBps() > 0 {
		// The platform's published line rate (AMD's xGMI by generation),
		// which the PCIe efficiency scales as it scales the GPUs' links.
		nd.smp = k.InterSocketLineGBps()
	} else if s := k.InterSocketGBps(); s > 0 {
		// NCCL's figure is what a transfer gets; the links hold line
		// rates, which the PCIe efficiency then scales.
		nd.smp = s / EffPCIe
	}
	// One allocation for the per-GPU and per-NIC figures each.
	G := len(n.GPUs)
	fs := take(&m.sc.floats, G+len(n.NICs)+1)
	is := take(&m.sc.ints, 3*G)
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
	nd.alike = n.GPUPaths == nil || alikeLinks(n)
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
	nd.nicKind = take(&m.sc.strs, len(n.NICs)+1)
	for k := -1; k < len(n.NICs); k++ {
		rate, kind := 0.0, "net"
		if k >= 0 {
			rate, kind = n.NICs[k].RateGbps, cmp.Or(n.NICs[k].Transport, kind)
		}
		nd.nicGBps[k+1] = cmp.Or(rate, topology.FabricDefaultNICGbps) / 8
		nd.nicKind[k+1] = kind
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

// alikeLinks reports whether every pair of the node's GPUs has the same
// link, other than SYS: a ring over the inter-socket link loads its two
// directions by the order it takes (nodeRing balances them).
func alikeLinks(n *topology.Node) bool {
	if len(n.GPUs) < 2 {
		return true
	}
	first := n.GPUPaths[0][1]
	if first.Class == topology.SYS {
		return false
	}
	for i, row := range n.GPUPaths {
		for j, l := range row {
			if i != j && l != first {
				return false
			}
		}
	}
	return true
}
