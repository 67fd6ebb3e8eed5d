package topology

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/toposched/toposched/events"
)

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

// Switch tiers of a fabric, as events.Switch spells them, and TierNone for
// nodes that share no switch.
const (
	TierLeaf  = "leaf"
	TierSpine = "spine"
	TierCore  = "core"
	// TierNVLink is a multi-node NVLink domain, such as a GB200 NVL72
	// rack: its nodes' GPUs reach each other over NVLink switches, not the
	// network. It stands beside the leaf/spine tree, not in it.
	TierNVLink = "nvlink"
	// TierNone is the tier of the path between nodes in different trees of
	// the fabric (islands), or of a node the fabric does not list.
	TierNone = "none"
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

// Fabric is the switch tree (or forest) of a cluster, indexed so that
// every query costs a walk up the tree from the nodes' leaves, never a
// matrix over the cluster's nodes.
//
// A switch normally has one parent; a fabric in which some switch has
// several (a Clos spine under several cores, as events.Switch allows) is
// answered from each leaf's ancestors, computed once by NewFabric, and a
// query costs the product of the two leaves' ancestor counts.
//
// A Fabric is immutable and safe for concurrent use.
type Fabric struct {
	cluster  string
	switches []fabricSwitch
	index    map[string]int32
	nodes    map[string]nodeLeaves
	// dag: some switch has several parents; up then holds, per switch, its
	// ancestors (itself first) by hops.
	dag bool
	up  [][]ancestor
	// nvl maps a node to its multi-node NVLink domain.
	nvl map[string]nvlDomain
}

type fabricSwitch struct {
	name, tier, domain string
	parents            []int32
	// parent is the first parent (-1 for a top switch), depth the distance
	// from the top, root the top switch: used when no switch has several
	// parents.
	parent, depth, root int32
	linkGbps            float64
	uplinkGbps          float64
	// over is the oversubscription, at least 1.
	over float64
	rail int32 // -1: no rail
}

// nodeLeaves is where a node hangs: one leaf, or one leaf per rail.
type nodeLeaves struct {
	leaf  int32      // the node's leaf, or that of its lowest rail
	rails []railLeaf // by rail, ascending; nil for a node on one leaf
}

type railLeaf struct{ rail, leaf int32 }

// ancestor is a switch above another with the best route up to it.
type ancestor struct {
	sw   int32
	side side
}

// side sums the uplinks a path crosses between a leaf and the common
// switch.
type side struct {
	hops int
	// over is the product of the oversubscription of every switch whose
	// uplink the route crosses; capGbps the slowest of those uplinks (+Inf
	// when none is known).
	over    float64
	capGbps float64
}

func startSide() side { return side{over: 1, capGbps: math.Inf(1)} }

// better orders routes: fewer hops, then less oversubscription, then
// faster uplinks.
func (s side) better(o side) bool {
	if s.hops != o.hops {
		return s.hops < o.hops
	}
	if s.over != o.over {
		return s.over < o.over
	}
	return s.capGbps > o.capGbps
}

var tierRank = map[string]int{TierLeaf: 0, TierSpine: 1, TierCore: 2}

// NewFabric indexes a topology.fabric event. It checks that every switch
// has a unique name and a known tier, that leaves hold nodes and no
// switches and spines and cores the reverse, that each child is a defined
// switch of a lower tier (a core may sit under a core), that there is no
// cycle, that rates are not negative, that oversubscription is 0 (not
// given) or at least 1, that only leaves have a rail, and that a node is
// below one leaf, or below one leaf per rail, each of a different rail.
// Every problem found is reported.
func NewFabric(ev events.TopologyFabric) (*Fabric, error) {
	// NVLink domains first: they sit beside the tree, so the tree is built
	// from the other switches.
	nvl, tree, nvlErrs := nvlinkDomains(ev.Switches)
	ev.Switches = tree
	f, err := newTree(ev)
	if err := errors.Join(append(nvlErrs, err)...); err != nil {
		return nil, err
	}
	f.nvl = nvl
	return f, nil
}

// nvlDomain is a multi-node NVLink domain.
type nvlDomain struct {
	name    string
	nvlinks int
}

// nvlinkDomains takes the NVLink-domain switches out of a fabric's list.
func nvlinkDomains(all []events.Switch) (map[string]nvlDomain, []events.Switch, []error) {
	var errs []error
	var tree []events.Switch
	var nvl map[string]nvlDomain
	for _, s := range all {
		if s.Tier != TierNVLink {
			tree = append(tree, s)
			continue
		}
		if nvl == nil {
			nvl = map[string]nvlDomain{}
		}
		if len(s.Switches) > 0 {
			errs = append(errs, fmt.Errorf("fabric: switch %q: an NVLink domain holds nodes, got switches %s", s.Name, list(s.Switches)))
		}
		if s.NVLinks < 0 || s.NVLinks > 64 {
			errs = append(errs, fmt.Errorf("fabric: switch %q: nvlinks: expected 0 to 64, got %d", s.Name, s.NVLinks))
		}
		for _, n := range s.Nodes {
			if other, dup := nvl[n]; dup {
				errs = append(errs, fmt.Errorf("fabric: switch %q: node %q is already in NVLink domain %q", s.Name, n, other.name))
				continue
			}
			nvl[n] = nvlDomain{name: s.Name, nvlinks: s.NVLinks}
		}
	}
	return nvl, tree, errs
}

// NVLinkDomain returns the multi-node NVLink domain a node is in.
func (f *Fabric) NVLinkDomain(node string) (string, bool) {
	d, ok := f.nvl[node]
	return d.name, ok
}

func newTree(ev events.TopologyFabric) (*Fabric, error) {
	f := &Fabric{
		cluster:  ev.Cluster,
		switches: make([]fabricSwitch, len(ev.Switches)),
		index:    make(map[string]int32, len(ev.Switches)),
	}
	var errs []error
	bad := func(sw, format string, args ...any) {
		errs = append(errs, fmt.Errorf("fabric: switch %q: %s", sw, fmt.Sprintf(format, args...)))
	}
	nodeCount := 0
	for i, s := range ev.Switches {
		fs := &f.switches[i]
		*fs = fabricSwitch{name: s.Name, tier: s.Tier, parent: -1, root: int32(i), rail: -1,
			linkGbps: s.LinkGbps, uplinkGbps: s.UplinkGbps, over: max(s.Oversubscription, 1)}
		nodeCount += len(s.Nodes)
		if s.Name == "" {
			errs = append(errs, fmt.Errorf("fabric: switch %d: no name", i))
		} else if _, dup := f.index[s.Name]; dup {
			bad(s.Name, "defined twice")
		} else {
			f.index[s.Name] = int32(i)
		}
		switch s.Tier {
		case TierLeaf:
			fs.domain = "leaf:" + s.Name
			if len(s.Switches) > 0 {
				bad(s.Name, "tier inconsistent: a leaf holds nodes, got switches %s", list(s.Switches))
			}
		case TierSpine, TierCore:
			fs.domain = map[string]string{TierSpine: "pod:", TierCore: "core:"}[s.Tier] + s.Name
			if len(s.Nodes) > 0 {
				bad(s.Name, "tier inconsistent: a %s holds switches, got nodes %s", s.Tier, list(s.Nodes))
			}
		default:
			bad(s.Name, "tier %q: expected leaf, spine or core", s.Tier)
		}
		for _, r := range []struct {
			field string
			v     float64
		}{{"link_gbps", s.LinkGbps}, {"uplink_gbps", s.UplinkGbps}} {
			if r.v < 0 || math.IsNaN(r.v) || math.IsInf(r.v, 0) {
				bad(s.Name, "%s: expected a rate of at least 0, got %v", r.field, r.v)
			}
		}
		if s.Uplinks < 0 {
			bad(s.Name, "uplinks: expected at least 0, got %d", s.Uplinks)
		}
		if o := s.Oversubscription; o != 0 && !(o >= 1 && !math.IsInf(o, 0)) {
			bad(s.Name, "oversubscription: expected 0 (not given) or at least 1, got %v", o)
		}
		if s.Rail != nil {
			switch {
			case s.Tier != TierLeaf:
				bad(s.Name, "tier inconsistent: only a leaf serves a rail, got rail %d on a %s", *s.Rail, s.Tier)
			case *s.Rail < 0 || *s.Rail > math.MaxInt32:
				bad(s.Name, "rail: expected at least 0, got %d", *s.Rail)
			default:
				fs.rail = int32(*s.Rail)
			}
		}
	}

	// Children: defined, once, of a lower tier.
	for i, s := range ev.Switches {
		seen := make(map[string]bool, len(s.Switches))
		for _, c := range s.Switches {
			ci, ok := f.index[c]
			switch {
			case !ok:
				bad(s.Name, "unknown child switch %q", c)
				continue
			case seen[c]:
				bad(s.Name, "child switch %q listed twice", c)
				continue
			}
			seen[c] = true
			child := &f.switches[ci]
			pr, pok := tierRank[s.Tier]
			cr, cok := tierRank[child.tier]
			if pok && cok && pr > 0 && cr >= pr && (cr != 2 || pr != 2) { // a core may sit below a core
				bad(s.Name, "tier inconsistent: %s %q is below %s %q", child.tier, c, s.Tier, s.Name)
			}
			child.parents = append(child.parents, int32(i))
		}
	}
	if cyc := f.cycle(); cyc != nil {
		errs = append(errs, fmt.Errorf("fabric: switch %q: cycle %s", cyc[0], strings.Join(cyc, " -> ")))
	}

	// Nodes: one leaf, or one leaf per rail.
	f.nodes = make(map[string]nodeLeaves, nodeCount)
	reported := 0
	for i, s := range ev.Switches {
		if s.Tier != TierLeaf {
			continue
		}
		sw := &f.switches[i]
		for _, n := range s.Nodes {
			nl, ok := f.nodes[n]
			if !ok {
				nl = nodeLeaves{leaf: int32(i)}
				if sw.rail >= 0 {
					nl.rails = []railLeaf{{sw.rail, int32(i)}}
				}
				f.nodes[n] = nl
				continue
			}
			first := &f.switches[nl.leaf]
			var why string
			switch {
			case nl.leaf == int32(i):
				why = "listed twice"
			case sw.rail < 0 || nl.rails == nil:
				why = fmt.Sprintf("below both %q and %q: a node is below one leaf, or one leaf per rail", first.name, s.Name)
			default:
				k, found := slices.BinarySearchFunc(nl.rails, sw.rail, func(r railLeaf, rail int32) int { return cmp.Compare(r.rail, rail) })
				switch {
				case found && nl.rails[k].leaf == int32(i):
					why = "listed twice"
				case found:
					why = fmt.Sprintf("below both %q and %q, both of rail %d", f.switches[nl.rails[k].leaf].name, s.Name, sw.rail)
				}
				if found {
					break
				}
				nl.rails = slices.Insert(nl.rails, k, railLeaf{sw.rail, int32(i)})
				nl.leaf = nl.rails[0].leaf
				f.nodes[n] = nl
				continue
			}
			if reported < 10 {
				bad(s.Name, "node %q %s", n, why)
			}
			reported++
		}
	}
	if reported > 10 {
		errs = append(errs, fmt.Errorf("fabric: and %d more nodes below several leaves", reported-10))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}

	for i := range f.switches {
		if len(f.switches[i].parents) > 1 {
			f.dag = true
		}
	}
	if f.dag {
		f.up = make([][]ancestor, len(f.switches))
		for i := range f.switches {
			f.ancestors(int32(i))
		}
		return f, nil
	}
	// A forest: parent pointers and depth from the top.
	done := make([]bool, len(f.switches))
	var place func(i int32)
	place = func(i int32) {
		if done[i] {
			return
		}
		done[i] = true
		s := &f.switches[i]
		if len(s.parents) == 0 {
			return
		}
		p := s.parents[0]
		place(p)
		s.parent, s.depth, s.root = p, f.switches[p].depth+1, f.switches[p].root
	}
	for i := range f.switches {
		place(int32(i))
	}
	return f, nil
}

// Cluster returns the name of the fabric's cluster.
func (f *Fabric) Cluster() string { return f.cluster }

// list renders names for an error, the first few only.
func list(names []string) string {
	if len(names) > 3 {
		return fmt.Sprintf("%q and %d more", names[:3], len(names)-3)
	}
	return fmt.Sprintf("%q", names)
}

// cycle returns the names round a cycle of child switches (first name
// repeated at the end), or nil.
func (f *Fabric) cycle() []string {
	const (
		unseen = iota
		active
		done
	)
	state := make([]uint8, len(f.switches))
	var stack []int32
	var found []string
	var visit func(i int32) bool
	visit = func(i int32) bool {
		switch state[i] {
		case done:
			return false
		case active:
			at := slices.Index(stack, i)
			for _, s := range stack[at:] {
				found = append(found, f.switches[s].name)
			}
			found = append(found, f.switches[i].name)
			return true
		}
		state[i] = active
		stack = append(stack, i)
		// Walk up: parents are the reverse edges, a cycle either way.
		for _, p := range f.switches[i].parents {
			if visit(p) {
				return true
			}
		}
		stack = stack[:len(stack)-1]
		state[i] = done
		return false
	}
	for i := range f.switches {
		if visit(int32(i)) {
			slices.Reverse(found)
			return found
		}
	}
	return nil
}

// uplinkGbps is the rate of the link from switch c up to parent p: what c
// says of its uplinks, else what p says of its down links, else +Inf.
func (f *Fabric) uplinkGbps(c, p int32) float64 {
	if r := f.switches[c].uplinkGbps; r > 0 {
		return r
	}
	if r := f.switches[p].linkGbps; r > 0 {
		return r
	}
	return math.Inf(1)
}

// cross adds to s the uplink from switch c to its parent p.
func (f *Fabric) cross(s side, c, p int32) side {
	return side{hops: s.hops + 1, over: s.over * f.switches[c].over, capGbps: min(s.capGbps, f.uplinkGbps(c, p))}
}

// ancestors computes, once, switch i's ancestors with the best route up
// to each, ordered by that route (itself first).
func (f *Fabric) ancestors(i int32) []ancestor {
	if f.up[i] != nil {
		return f.up[i]
	}
	best := map[int32]side{i: startSide()}
	for _, p := range f.switches[i].parents {
		for _, a := range f.ancestors(p) {
			s := f.cross(startSide(), i, p)
			s = side{hops: s.hops + a.side.hops, over: s.over * a.side.over, capGbps: min(s.capGbps, a.side.capGbps)}
			if cur, ok := best[a.sw]; !ok || s.better(cur) {
				best[a.sw] = s
			}
		}
	}
	out := make([]ancestor, 0, len(best))
	for sw, s := range best {
		out = append(out, ancestor{sw, s})
	}
	slices.SortFunc(out, func(a, b ancestor) int {
		return cmp.Or(cmp.Compare(a.side.hops, b.side.hops), cmp.Compare(a.sw, b.sw))
	})
	f.up[i] = out
	return out
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

// Domains returns the failure and locality domains a node belongs to, for
// the store's domain indexes: its leaf as "leaf:<name>", then the switches
// above, level by level, as "pod:<name>" for a spine and "core:<name>" for
// a core. In a rail-optimized fabric the node's leaf domain is its
// lowest-rail leaf: the rail leaves of one group of nodes serve the same
// nodes, so one of them names the group, and listing all of them would
// count every GPU once per rail (measured: 3.9 KB to 7.2 KB per GPU in
// the store at 8 rails). The spines above are still every rail's. A node
// the fabric does not list has none.
func (f *Fabric) Domains(node string) []string {
	var out []string
	if d, ok := f.nvl[node]; ok {
		out = append(out, "nvl:"+d.name)
	}
	nl, ok := f.nodes[node]
	if !ok {
		return out
	}
	level := []int32{nl.leaf}
	if nl.rails != nil {
		level = level[:0]
		for _, r := range nl.rails {
			level = append(level, r.leaf)
		}
	}
	first, leafSeen := true, false
	seen := map[int32]bool{}
	for len(level) > 0 {
		var next []int32
		for _, s := range level {
			if seen[s] {
				continue
			}
			seen[s] = true
			if !first || !leafSeen {
				leafSeen = true
				out = append(out, f.switches[s].domain)
			}
			next = append(next, f.switches[s].parents...)
		}
		first = false
		level = next
	}
	return out
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
