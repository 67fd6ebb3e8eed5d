package collective

// Flows: the phases of an algorithm (concurrent flows, bytes per link),
// how a flow between two ranks is routed onto links, and a phase's time,
// its most loaded link's bytes over that link's capacity.

import (
	"sync"

	"github.com/toposched/toposched/internal/topology"
)

// phase is a set of concurrent flows: bytes per link (by link id, see
// layout), and the sequential steps it takes with the slowest step's
// latency.
type phase struct {
	load []float64 // by link id
	// gdr is the part of load that NICs move through GPUs' PCIe links
	// (addGDR), by link id: where such a link binds, it says which kind of
	// link a calibration fits.
	gdr   []float64
	seen  []uint64 // links with a flow
	ids   []int32  // links with a flow, in the order of their first
	steps int
	lat   hop     // per step
	mx    float64 // the most loaded link's seconds (measure)
	// pipes are the phase's pipelines of chunks (ramp.go), fill their
	// ramp on the bandwidth term (measure).
	pipes   []pipe
	pipeIDs []int32
	fill    float64
}

// hop is a step's latency (µs) by the kind of hardware it crosses:
// NVLink, PCI (PCIe and the inter-socket link), network; a protocol's
// latency scales each apart (protocols.go).
type hop [3]float64

func (h hop) total() float64 { return h[0] + h[1] + h[2] }

func (h hop) plus(o hop) hop { return hop{h[0] + o[0], h[1] + o[1], h[2] + o[2]} }

// later is the slower of two steps.
func later(a, b hop) hop {
	if b.total() > a.total() {
		return b
	}
	return a
}

// phases are the phases of a build; their links are root's.
type phases struct {
	list []*phase
	root *model
	// sc, where set, scales the steps added (a protocol's, for a job's
	// groups each built with its own), and op is the largest operation
	// latency scale of the groups built.
	sc     scale
	scaled bool
	op     float64
	// bnGDR is whether most of the bottleneck's load (measure) is NICs'
	// traffic through a GPU's PCIe link (addGDR).
	bnGDR bool
}

func (ps *phases) at(i int) *phase {
	for len(ps.list) <= i {
		r := ps.root
		var ph *phase
		if n := len(r.free); n > 0 {
			ph, r.free = r.free[n-1], r.free[:n-1]
		} else {
			ph = newPhase(r.nLinks)
		}
		ps.list = append(ps.list, ph)
	}
	return ps.list[i]
}

// phasePool keeps phases from one evaluation to the next (recycle): a
// placement decision evaluates tens of candidates, and each would
// otherwise make its phases' arrays anew, a quarter of what it allocates.
// A phase in the pool is clear: release zeroes what it loaded.
var phasePool sync.Pool

// newPhase returns a clear phase over nLinks links, from the pool when one
// there has the room (entries past those a phase was used over were never
// written, so they are zero too).
func newPhase(nLinks int32) *phase {
	words := (nLinks + 63) / 64
	if ph, _ := phasePool.Get().(*phase); ph != nil && int32(cap(ph.load)) >= nLinks && int32(cap(ph.gdr)) >= nLinks && int32(cap(ph.seen)) >= words {
		ph.load, ph.gdr, ph.seen = ph.load[:nLinks], ph.gdr[:nLinks], ph.seen[:words]
		return ph
	}
	return &phase{load: make([]float64, nLinks), gdr: make([]float64, nLinks), seen: make([]uint64, words)}
}

// release clears the phases and keeps them for reuse.
func (ps *phases) release() {
	for _, ph := range ps.list {
		for _, id := range ph.ids {
			ph.load[id], ph.gdr[id] = 0, 0
			ph.seen[id/64] = 0
		}
		ph.ids = ph.ids[:0]
		ph.pipes, ph.pipeIDs = ph.pipes[:0], ph.pipeIDs[:0]
		ph.steps, ph.lat, ph.mx, ph.fill = 0, hop{}, 0, 0
		ps.root.free = append(ps.root.free, ph)
	}
	ps.list = nil
	ps.scaled, ps.op, ps.bnGDR = false, 0, false
}

func (ph *phase) add(id int32, b float64) {
	w, bit := id/64, uint64(1)<<(id%64)
	if ph.seen[w]&bit == 0 {
		ph.seen[w] |= bit
		ph.ids = append(ph.ids, id)
	}
	ph.load[id] += b
}

// trueBytes is a build's message size before a job's protocol scaled it
// (EvaluateJob builds each group with its bytes over its protocol's
// share of bandwidth).
func (ps *phases) trueBytes(S float64) float64 {
	if ps.scaled {
		return S * ps.sc.bw
	}
	return S
}

func (ps *phases) step(ph *phase, n int, lat hop) {
	if ps.scaled {
		for i := range lat {
			lat[i] *= ps.sc.step[i]
		}
	}
	ph.steps = max(ph.steps, n)
	ph.lat = later(ph.lat, lat)
}

// measure sets each phase's bandwidth term, its most loaded link's bytes
// over that link's capacity, and returns the most loaded link of all
// (found false: no flow).
func (m *model) measure(ps *phases) (bn int32, found bool) {
	r := m.root()
	var worst float64
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
				ps.bnGDR = ph.gdr[id] > ph.load[id]/2
			}
		}
		ph.mx = mx
		ph.fill = m.fill(ph)
	}
	return bn, found
}

// cost is the measured phases' time under a protocol's scale: one
// operation latency, each phase's bandwidth term over the protocol's
// share of Simple's bandwidth (with its pipeline's fill where the
// protocol has one, ramp.go), and its steps times their latency.
func (ps *phases) cost(s scale) float64 {
	t := OpLatencyUS * 1e-6 * s.op
	for _, ph := range ps.list {
		l := ph.lat
		bw := ph.mx / s.bw
		if s.ramp {
			bw *= 1 + ph.fill
		}
		t += bw + float64(ph.steps)*(l[0]*s.step[0]+l[1]*s.step[1]+l[2]*s.step[2])*1e-6
	}
	return t
}

// bottleneckName names a link found by measure.
func (m *model) bottleneckName(bn int32, found bool) string {
	if !found {
		return ""
	}
	r := m.root()
	return r.linkName(r.key(bn))
}

// route adds a flow of b bytes from rank i to rank j and returns the
// latency of a step over it.
func (m *model) route(ph *phase, i, j int, b float64) hop {
	ri, rj := m.ranks[i], m.ranks[j]
	if ri.node == rj.node {
		return m.routeLocal(ph, ri.node, ri.gpu, rj.gpu, b)
	}
	na, nb := m.nodes[ri.node], m.nodes[rj.node]
	m.addGDR(ph, na, ri.gpu, tx, b)
	ph.add(na.nic(na.localNICs[ri.gpu], tx), b)
	m.crossLeaves(ph, na, nb, b)
	ph.add(nb.nic(nb.localNICs[rj.gpu], rx), b)
	m.addGDR(ph, nb, rj.gpu, rx, b)
	return hop{hwNet: m.netLatency(ri.node, rj.node)}
}

// addGDR adds b bytes that a GPU's NIC moves through the GPU's PCIe link
// in direction dir. That is other traffic than GPU<->GPU peer traffic on
// the same link, and is priced apart. NCCL's net transport
// (src/transport/net.cc) registers the GPU's buffers with the NIC
// (GPUDirect RDMA, where ncclTopoCheckGdr allows it: NIC and GPU within
// NCCL_NET_GDR_LEVEL, a PCIe switch by default), and the NIC's DMA engine
// reads what it sends from GPU memory and writes what it receives into it,
// through the switch or the host bridge, in the NIC's own large requests
// and at the NIC's pace; its proxy thread posts them, the GPU's threads
// only fill and drain the buffer in their own memory. Its P2P transport
// (src/transport/p2p.cc) is the GPUs' own threads storing to (P2P write)
// or loading from (P2P read) the peer's memory across PCIe, in their
// cache-line transactions: that, with the inter-socket link it may cross,
// is what EffPCIe and a pcie calibration describe. A NIC byte is priced
// at the share of line rate its NIC's DMA reaches, the network's
// efficiency (its transport's where calibrated), by costing the link
// EffPCIe/net of a peer byte: the link's capacity is still shared by both
// kinds of traffic, and a machine calibrated for one does not move the
// other's price.
//
// Where NCCL does not use GPUDirect RDMA for the GPU and direction
// (usesGDR), the GPU's own threads copy the bytes to or from host memory
// across the link, and they are priced as peer traffic is.
func (m *model) addGDR(ph *phase, nd *nodeView, gpu int, dir int32, b float64) {
	id := nd.port(kPCIe, gpu, dir)
	if !m.usesGDR(nd, gpu, dir) {
		ph.add(id, b)
		return
	}
	w := b * m.effOf(nd.eff.PCIe, EffPCIe) / m.netEff(&nd.eff, nd.nicKind[nd.localNICs[gpu]+1])
	ph.add(id, w)
	ph.gdr[id] += w
}

// localLink is the link a step from rank i to rank j, both on one node,
// leaves i by (routeLocal's first): its NVLink port, its NVLinks to j,
// or its PCIe link.
func (m *model) localLink(i, j int) int32 {
	ri, rj := m.ranks[i], m.ranks[j]
	nd := m.nodes[ri.node]
	cl := topology.PHB
	if nd.n.GPUPaths != nil {
		cl = nd.n.GPUPaths[ri.gpu][rj.gpu].Class
	}
	switch {
	case nd.n.GPUPaths != nil && nd.usesSHM(ri.gpu, rj.gpu, cl):
		return nd.port(kPCIe, ri.gpu, tx)
	case cl == topology.NV && nd.nvSwitch:
		return nd.port(kNVPort, ri.gpu, tx)
	case cl == topology.NV || cl == topology.NVB:
		return nd.pair(ri.gpu, rj.gpu)
	}
	return nd.port(kPCIe, ri.gpu, tx)
}

func (m *model) routeLocal(ph *phase, node int32, ga, gb int, b float64) hop {
	nd := m.nodes[node]
	if ga == gb {
		return hop{}
	}
	l := topology.Link{Class: topology.PHB}
	if nd.n.GPUPaths != nil {
		l = nd.n.GPUPaths[ga][gb]
	}
	var lat hop
	us := m.bw.LatencyUS[l.Class] + m.stepOverheadUS(nd.nodeInfo)
	if nd.usesSHM(ga, gb, l.Class) {
		return m.routeSHM(ph, nd, l.Class, ga, gb, b, hop{hwPCI: us})
	}
	if l.Class.NVLink() {
		lat[hwNVLink] = us
	} else {
		lat[hwPCI] = us
	}
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

// routeSHM adds a flow between two GPUs of a node that NCCL does not join
// by P2P (transport.go): its SHM transport, through host memory
// (SHMShare). Each byte costs
// the GPUs' PCIe links 1/SHMShare of a P2P byte; GPUs under one PCIe
// switch (PIX, PXB) share its uplink to the host (the node's host link);
// across sockets the copy crosses the inter-socket link as P2P would. A
// step pays at least a hop through the host bridge. Both directions of a
// pair are priced as running at once, as NCCL's send/recv kernel (alltoall)
// runs them; its rings take turns within a channel and measure below that
// on the one such machine measured (CrossMachines, rtx2080ti).
func (m *model) routeSHM(ph *phase, nd *nodeView, cl topology.Class, ga, gb int, b float64, lat hop) hop {
	ph.add(nd.port(kPCIe, ga, tx), b/SHMShare)
	ph.add(nd.port(kPCIe, gb, rx), b/SHMShare)
	switch cl {
	case topology.PIX, topology.PXB:
		ph.add(nd.off[kHost]+tx, b)
		ph.add(nd.off[kHost]+rx, b)
	case topology.SYS:
		d := int32(tx)
		if ga > gb {
			d = rx
		}
		ph.add(nd.off[kSMP]+d, b)
	}
	if host := m.bw.LatencyUS[topology.PHB] + m.stepOverheadUS(nd.nodeInfo); host > lat[hwPCI] {
		lat[hwPCI] = host
	}
	return lat
}

// nodeXfer adds b bytes from node a to node b spread over the NICs each
// uses (NCCL's channels each take a different NIC) and returns the
// latency of a step over the network.
func (m *model) nodeXfer(ph *phase, a, b int32, bytes float64) hop {
	na, nb := m.nodes[a], m.nodes[b]
	for _, k := range na.nics {
		ph.add(na.nic(k, tx), bytes*na.nicGBps[k+1]/na.nicSum)
	}
	for _, k := range nb.nics {
		ph.add(nb.nic(k, rx), bytes*nb.nicGBps[k+1]/nb.nicSum)
	}
	m.crossLeaves(ph, na, nb, bytes)
	return hop{hwNet: m.netLatency(a, b)}
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
	lat += max(m.stepOverheadUS(na.nodeInfo), m.stepOverheadUS(nb.nodeInfo)) + NetStepOverheadUS
	m.netLat[key] = lat
	return lat
}
