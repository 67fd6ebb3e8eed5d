package collective

// Links: the kinds of link a flow crosses, their ids (one dense space per
// root model, in key order), their names as Contention keys them, and
// their effective capacities.

import (
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
	// kHost is a node's PCIe uplink to host memory as NCCL's SHM transport
	// uses it between GPUs under one PCIe switch that it does not join by
	// P2P (b: dir, tx into host memory); only nodes with such pairs have
	// it, so the links of every other node keep their ids.
	kHost
	kUplink // a leaf's uplinks (node: -1, a: leaf, b: dir)
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
	case kHost:
		if nd.hostLink {
			return 2
		}
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
	case kSMP, kHost:
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

// capacity is a link's effective bandwidth in GB/s.
func (m *model) capacity(k linkKey) float64 {
	if m.parent != nil {
		return m.parent.capacity(k)
	}
	var c float64
	switch k.kind {
	case kNVPort:
		c = m.nodes[k.node].nvPort[k.a] * m.effOf(m.nodes[k.node].eff.NVLink, EffNVLink)
	case kNVLS:
		c = m.nodes[k.node].nvPort[k.a] * m.effOf(m.nodes[k.node].eff.NVLS, EffNVLS)
	case kNVPair:
		nd := m.nodes[k.node]
		l := nd.n.GPUPaths[k.a][k.b]
		n := max(l.NVLinks, 1)
		c = float64(n) * nd.perLink * m.effOf(nd.eff.NVLink, EffNVLink)
	case kPCIe:
		c = m.nodes[k.node].pcie * m.effOf(m.nodes[k.node].eff.PCIe, EffPCIe)
	case kSMP:
		c = m.nodes[k.node].smp * m.effOf(m.nodes[k.node].eff.PCIe, EffPCIe)
	case kHost:
		c = m.nodes[k.node].pcie * m.effOf(m.nodes[k.node].eff.PCIe, EffPCIe) * SHMShare
	case kNIC:
		nd := m.nodes[k.node]
		c = nd.nicGBps[k.a+1] * m.netEff(&nd.eff, nd.nicKind[k.a+1])
	case kUplink:
		c = m.upGBps[k.a] * m.effOf(m.bw.Efficiency.Net, EffNet)
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
	case kHost:
		return fmt.Sprintf("host:%s:%s", m.nodes[k.node].name, dir)
	case kNIC:
		return fmt.Sprintf("nic:%s:%d:%s", m.nodes[k.node].name, k.a, dir)
	case kUplink:
		return fmt.Sprintf("uplink:%s:%s", m.leafNames[k.a], [2]string{"up", "down"}[k.b&1])
	}
	return "?"
}

// Link ids of a node's links.
func (nd *nodeInfo) port(kind uint8, gpu int, dir int32) int32 {
	return nd.off[kind] + 2*int32(gpu) + dir
}

func (nd *nodeInfo) pair(a, b int) int32 {
	return nd.off[kNVPair] + int32(a)*int32(len(nd.n.GPUs)) + int32(b)
}

func (nd *nodeInfo) nic(k int, dir int32) int32 { return nd.off[kNIC] + 2*int32(k+1) + dir }

// effOf is a calibrated efficiency where one is set, else the default.
func (m *model) effOf(calibrated, def float64) float64 {
	if calibrated > 0 {
		return calibrated
	}
	return def
}

// netEff is the efficiency (a node's, e) of a NIC of a kind: net
// (InfiniBand, RoCE), or a transport's, which is Net's until calibrated.
func (m *model) netEff(e *topology.Efficiency, kind string) float64 {
	net := m.effOf(e.Net, EffNet)
	switch kind {
	case topology.TransportEFA:
		return m.effOf(e.EFA, net)
	case topology.TransportTCP:
		return m.effOf(e.TCP, net)
	}
	return net
}

// opOverheadUS is a call's calibrated overhead (topology.Efficiency's
// OpOverheadUS), the largest of its nodes': a collective ends when its
// slowest rank's launch does. It is the same for every algorithm and
// protocol, so it moves a prediction, never a choice.
func (m *model) opOverheadUS() float64 {
	var us float64
	for _, nd := range m.nodes {
		us = max(us, nd.eff.OpOverheadUS)
	}
	return us
}

// stepOverheadUS is the per-step overhead on a node, calibrated (for its
// GPU model, or the cluster) or the default.
func (m *model) stepOverheadUS(nd *nodeInfo) float64 {
	return m.effOf(nd.eff.StepOverheadUS, StepOverheadUS)
}
