package collective

// Flows: the phases of an algorithm (concurrent flows, bytes per link),
// how a flow between two ranks is routed onto links, and a phase's time,
// its most loaded link's bytes over that link's capacity.

import "github.com/toposched/toposched/internal/topology"

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
	lat := m.bw.LatencyUS[l.Class] + m.stepOverheadUS()
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
	lat += m.stepOverheadUS() + NetStepOverheadUS
	m.netLat[key] = lat
	return lat
}
