package topology

// Paths through a Fabric: where two nodes' routes up the tree meet, and
// the hops, bandwidth and latency of the path between them (Common,
// NetPath, RailPath); GPUPath, the best path between two GPUs of any two
// nodes. The tree they walk is built in fabric.go.

import "cmp"

// Fabric latencies and the default link rate, used by NetPath and GPUPath.
// They are round figures of the order vendors quote, not measurements of
// any one fabric:
//
//   - FabricSwitchLatencyUS, per switch a message crosses: InfiniBand switch
//     ASICs quote 0.1 to 0.4 µs port to port (Mellanox Switch-IB 2 about
//     90 ns, NVIDIA Quantum HDR/NDR data sheets a few hundred ns), Ethernet
//     switches for RoCE (NVIDIA Spectrum, Broadcom Tomahawk) 0.3 to 1 µs;
//     0.5 µs covers cut-through forwarding plus cables and SerDes for
//     either.
//   - FabricNICLatencyUS, for the two NICs of a path together: ConnectX
//     data sheets quote about 0.6 µs end to end per adapter, and
//     osu_latency between two hosts on one InfiniBand switch measures 1 to
//     2 µs for small messages; 1.5 µs is what is left of that once the one
//     switch is counted.
//   - FabricDefaultNICGbps, the rate of a NIC-to-leaf link when neither the
//     NIC nor the leaf says: 100 Gb/s (EDR InfiniBand, 100GbE), the floor
//     of current GPU cluster fabrics.
//
// A path between two nodes on one leaf thus takes 2.0 µs, one through a
// spine 3.0 µs and one through a core 4.0 µs; GPUPath adds each GPU's PCIe
// leg to its NIC from Bandwidths.LatencyUS (1.0 to 2.5 µs), which brings a
// GPU pair to the 5 µs Bandwidths gives NET.
const (
	FabricSwitchLatencyUS float64 = 0.5
	FabricNICLatencyUS    float64 = 1.5
	FabricDefaultNICGbps  float64 = 100
)

// NetPath is the network path between two nodes: the lowest switch they
// share and what the path gives.
type NetPath struct {
	// Switch is the lowest common switch, "" when there is none.
	Switch string `json:"switch,omitempty"`
	// Tier is the common switch's tier, TierNone when there is none.
	Tier string `json:"tier"`
	// Hops counts the links of the path: 2 between two nodes of one leaf
	// (node, leaf, node), 4 through a spine, 0 when there is no path.
	Hops int `json:"hops"`
	// BandwidthGBps is the path's share per direction in GB/s (0: no path).
	BandwidthGBps float64 `json:"bandwidth_gbps"`
	// LatencyUS is the one-way latency of a small message.
	LatencyUS float64 `json:"latency_us"`
}

// meet finds the lowest common switch of leaves x and y, and the route up
// to it from each.
func (f *Fabric) meet(x, y int32) (int32, side, side, bool) {
	sa, sb := startSide(), startSide()
	if f.dag {
		found := int32(-1)
		best := 0
		for _, a := range f.up[x] {
			if found >= 0 && a.side.hops > best {
				break
			}
			for _, b := range f.up[y] {
				if a.sw != b.sw {
					continue
				}
				h := a.side.hops + b.side.hops
				if found < 0 || h < best || h == best && max(a.side.over, b.side.over) < max(sa.over, sb.over) {
					found, best, sa, sb = a.sw, h, a.side, b.side
				}
			}
		}
		return found, sa, sb, found >= 0
	}
	sw := f.switches
	if sw[x].root != sw[y].root {
		return -1, sa, sb, false
	}
	for sw[x].depth > sw[y].depth {
		sa, x = f.cross(sa, x, sw[x].parent), sw[x].parent
	}
	for sw[y].depth > sw[x].depth {
		sb, y = f.cross(sb, y, sw[y].parent), sw[y].parent
	}
	for x != y {
		sa, x = f.cross(sa, x, sw[x].parent), sw[x].parent
		sb, y = f.cross(sb, y, sw[y].parent), sw[y].parent
	}
	return x, sa, sb, true
}

// leafOn returns the node's leaf on a rail: that rail's leaf, or for rail
// -1, a node without rails or (when lenient) a rail the node has no leaf
// for, its first leaf.
func (nl nodeLeaves) leafOn(rail int, lenient bool) (int32, bool) {
	if rail < 0 || nl.rails == nil {
		return nl.leaf, true
	}
	for _, r := range nl.rails {
		if int(r.rail) == rail {
			return r.leaf, true
		}
	}
	return nl.leaf, lenient
}

// LeafOf returns the leaf a node hangs from: for rail -1 or a node not on
// rail leaves, its leaf (in a rail-optimized fabric, that of its lowest
// rail); otherwise the leaf of that rail. It reports false for a node the
// fabric does not list, and for a rail the node has no leaf for.
func (f *Fabric) LeafOf(node string, rail int) (string, bool) {
	nl, ok := f.nodes[node]
	if !ok {
		return "", false
	}
	l, ok := nl.leafOn(rail, false)
	if !ok {
		return "", false
	}
	return f.switches[l].name, true
}

// leaves picks the leaves a path between nodes a and b starts and ends
// on. A rail of -1 on a node with rails takes the other side's rail where
// the node has it; on both sides, the lowest rail the two nodes share (the
// same rail is the shortest path in a rail-optimized fabric). A rail the
// node has no leaf for falls back to its first leaf.
func (f *Fabric) leaves(a string, railA int, b string, railB int) (int32, int32, bool) {
	na, okA := f.nodes[a]
	nb, okB := f.nodes[b]
	if !okA || !okB {
		return -1, -1, false
	}
	switch {
	case railA < 0 && railB < 0 && na.rails != nil && nb.rails != nil:
		i, j := 0, 0
		for i < len(na.rails) && j < len(nb.rails) {
			switch ra, rb := na.rails[i].rail, nb.rails[j].rail; {
			case ra == rb:
				railA, railB = int(ra), int(rb)
				i = len(na.rails)
			case ra < rb:
				i++
			default:
				j++
			}
		}
	case railA < 0 && na.rails != nil:
		railA = railB
	case railB < 0 && nb.rails != nil:
		railB = railA
	}
	la, _ := na.leafOn(railA, true)
	lb, _ := nb.leafOn(railB, true)
	return la, lb, true
}

// Common returns the lowest switch that nodes a and b share, its tier and
// the hops (links) of the path through it: two nodes of one leaf are 2
// hops apart, nodes whose leaves share a spine 4. Nodes in different trees
// (islands), or a node the fabric does not list, share none: "", TierNone,
// 0. In a rail-optimized fabric the nodes meet on the lowest rail they
// share; RailPath chooses the rails.
func (f *Fabric) Common(a, b string) (sw string, tier string, hops int) {
	p := f.RailPath(a, -1, b, -1, 0, 0)
	return p.Switch, p.Tier, p.Hops
}

// NetPath returns the network path between nodes a and b whose NICs run at
// nicGbpsA and nicGbpsB (Gb/s, as NIC.RateGbps; 0 when unknown). See
// RailPath, which it calls with no rail.
func (f *Fabric) NetPath(a, b string, nicGbpsA, nicGbpsB float64) NetPath {
	return f.RailPath(a, -1, b, -1, nicGbpsA, nicGbpsB)
}

// RailPath returns the network path from NIC rail railA of node a to NIC
// rail railB of node b (-1: no rail, see leaves), the NICs running at
// nicGbpsA and nicGbpsB Gb/s (0: unknown).
//
// Bandwidth, per direction: each side's leaf link (link_gbps of its leaf;
// the NIC's rate when the leaf does not say, FabricDefaultNICGbps when
// neither does) is divided by the oversubscription of every switch whose
// uplink the path crosses on that side, and capped by the rate of each of
// those uplinks (one flow rides one uplink); the path gets the least of
// the two sides' shares and the two NIC rates, converted to GB/s. A path
// that stays on one leaf crosses no uplink and gets min(NIC A, NIC B, leaf
// link). The share is what the path keeps when every link below each
// crossed switch runs at full rate: a leaf with oversubscription 2 leaves
// half its link to a path that goes above it.
//
// Latency: FabricNICLatencyUS plus FabricSwitchLatencyUS for each switch
// crossed (hops - 1). Nodes with no common switch get TierNone, 0 hops,
// bandwidth 0 and latency 0.
func (f *Fabric) RailPath(a string, railA int, b string, railB int, nicGbpsA, nicGbpsB float64) NetPath {
	la, lb, ok := f.leaves(a, railA, b, railB)
	if !ok {
		return NetPath{Tier: TierNone}
	}
	top, sa, sb, ok := f.meet(la, lb)
	if !ok {
		return NetPath{Tier: TierNone}
	}
	gbps := min(f.share(la, nicGbpsA, sa), f.share(lb, nicGbpsB, sb))
	for _, nic := range []float64{nicGbpsA, nicGbpsB} {
		if nic > 0 {
			gbps = min(gbps, nic)
		}
	}
	hops := sa.hops + sb.hops + 2
	return NetPath{
		Switch:        f.switches[top].name,
		Tier:          f.switches[top].tier,
		Hops:          hops,
		BandwidthGBps: gbps / 8,
		LatencyUS:     FabricNICLatencyUS + FabricSwitchLatencyUS*float64(hops-1),
	}
}

// share is what one side of a path keeps of its leaf link, in Gb/s.
func (f *Fabric) share(leaf int32, nicGbps float64, s side) float64 {
	link := cmp.Or(f.switches[leaf].linkGbps, nicGbps, FabricDefaultNICGbps)
	return min(link/s.over, s.capGbps)
}

// GPUPath returns the best path between GPU ga of node na and GPU gb of
// node nb (by position). On one node it is the node's own path (na.Path;
// a node without a matrix, such as a plain cluster-file entry, gives PHB,
// as placement treats it). Between nodes it is Class NET: each GPU reaches
// the network through its nearest NIC, whose position k is also its rail
// (NIC k goes to the leaf of rail k in a rail-optimized fabric, so two
// GPUs on different rails cross a spine even within one pod; a NIC with no
// leaf of its rail uses the node's first leaf). The bandwidth is the
// fabric's RailPath with each NIC's rate, further capped, for a GPU whose
// NIC is across the host bridge (PHB, NODE) or the SMP interconnect
// (SYS), by that leg's PCIe or SMP bandwidth from bw (a GPU whose NIC is
// PIX or PXB reaches it through PCIe switches at the NIC's rate, as
// GPUDirect RDMA does). The latency sums each GPU's leg to its NIC (from
// bw) and the network path. A GPU with no known nearest NIC adds no leg.
//
// With f nil (no fabric described) the nodes are taken to share one
// non-blocking leaf. Nodes with no common switch give NET with bandwidth
// and latency 0.
func GPUPath(f *Fabric, na *Node, ga int, nb *Node, gb int, bw *Bandwidths) Path {
	bw = orDefaults(bw)
	if na == nb || (na.Name != "" && na.Name == nb.Name) {
		if na.GPUPaths == nil {
			gbps, lat := bw.Of(Link{Class: PHB}, na.NVLinkGen, na.PCIeGen)
			if ga == gb {
				return Path{Link: Link{Class: Self}}
			}
			return Path{Link: Link{Class: PHB}, BandwidthGBps: gbps, LatencyUS: lat}
		}
		return na.Path(ga, gb, bw)
	}
	if f != nil {
		if da, ok := f.nvl[na.Name]; ok && f.nvl[nb.Name] == da {
			// One NVLink domain: NVLink through its switches, as in a node.
			l := Link{Class: NV, NVLinks: cmp.Or(da.nvlinks, 18)}
			gbps, lat := bw.Of(l, max(na.NVLinkGen, nb.NVLinkGen), na.PCIeGen)
			return Path{Link: l, BandwidthGBps: gbps, LatencyUS: lat + FabricSwitchLatencyUS}
		}
	}
	ea, eb := endpointOf(na, ga, bw), endpointOf(nb, gb, bw)
	var net NetPath
	if f == nil {
		link := cmp.Or(min0(ea.nicGbps, eb.nicGbps), FabricDefaultNICGbps)
		net = NetPath{Tier: TierLeaf, Hops: 2, BandwidthGBps: link / 8, LatencyUS: FabricNICLatencyUS + FabricSwitchLatencyUS}
	} else {
		net = f.RailPath(na.Name, ea.rail, nb.Name, eb.rail, ea.nicGbps, eb.nicGbps)
	}
	p := Path{Link: Link{Class: NET}}
	if net.Tier == TierNone {
		return p
	}
	p.BandwidthGBps, p.LatencyUS = net.BandwidthGBps, net.LatencyUS+ea.latencyUS+eb.latencyUS
	for _, c := range []float64{ea.capGBps, eb.capGBps} {
		if c > 0 {
			p.BandwidthGBps = min(p.BandwidthGBps, c)
		}
	}
	return p
}

// min0 is the least of the known (positive) rates, 0 if none is.
func min0(a, b float64) float64 {
	switch {
	case a <= 0:
		return max(b, 0)
	case b <= 0:
		return a
	}
	return min(a, b)
}

// endpoint is a GPU's way into the network.
type endpoint struct {
	rail      int     // its NIC's position, -1 when unknown
	nicGbps   float64 // its NIC's rate, 0 when unknown
	capGBps   float64 // bound of its leg to the NIC, 0 when none
	latencyUS float64 // its leg to the NIC
}

func endpointOf(n *Node, g int, bw *Bandwidths) endpoint {
	k := n.NearestNIC(g)
	if k < 0 {
		return endpoint{rail: -1}
	}
	l := n.NICPaths[g][k]
	gbps, lat := bw.Of(l, n.NVLinkGen, n.PCIeGen)
	e := endpoint{rail: k, nicGbps: n.NICs[k].RateGbps, latencyUS: lat}
	switch l.Class {
	case PHB, NODE, SYS:
		e.capGBps = gbps
	}
	return e
}
