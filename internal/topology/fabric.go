package topology

// The switch tree of a cluster: the Fabric type, NewFabric's checks and
// the indexes it builds (parents, depths, ancestors), and what a node
// belongs to (NVLinkDomain, Domains). The paths through the tree are in
// fabricpath.go.

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/toposched/toposched/events"
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
