package topology

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/toposched/toposched/events"
)

func railPtr(k int) *int { return &k }

// podTree is a 2-pod leaf/spine/core tree, leaves oversubscribed 2:1,
// plus a leaf of its own (an island):
//
//	core (400)
//	├── pod-a (spine, 400, non-blocking)
//	│   ├── leaf-a1 (200, os 2): a1 a2
//	│   └── leaf-a2 (200, os 2): a3
//	└── pod-b (spine, 400, os 2)
//	    ├── leaf-b1 (200, os 2): b1
//	    ├── leaf-b2 (200, non-blocking, 50 Gb/s uplinks): b2
//	    └── plain (no rates): p1 p2
//	lone (leaf, no parent): x1
func podTree() events.TopologyFabric {
	return events.TopologyFabric{Cluster: "two-pods", Switches: []events.Switch{
		{Name: "core", Tier: "core", Switches: []string{"pod-a", "pod-b"}, LinkGbps: 400},
		{Name: "pod-a", Tier: "spine", Switches: []string{"leaf-a1", "leaf-a2"}, LinkGbps: 400},
		{Name: "pod-b", Tier: "spine", Switches: []string{"leaf-b1", "leaf-b2", "plain"}, LinkGbps: 400, Oversubscription: 2},
		{Name: "leaf-a1", Tier: "leaf", Nodes: []string{"a1", "a2"}, LinkGbps: 200, Oversubscription: 2, Uplinks: 1, UplinkGbps: 200},
		{Name: "leaf-a2", Tier: "leaf", Nodes: []string{"a3"}, LinkGbps: 200, Oversubscription: 2},
		{Name: "leaf-b1", Tier: "leaf", Nodes: []string{"b1"}, LinkGbps: 200, Oversubscription: 2},
		{Name: "leaf-b2", Tier: "leaf", Nodes: []string{"b2"}, LinkGbps: 200, UplinkGbps: 50},
		{Name: "plain", Tier: "leaf", Nodes: []string{"p1", "p2"}},
		{Name: "lone", Tier: "leaf", Nodes: []string{"x1"}},
	}}
}

// railFabric is a rail-optimized fabric: two pods of rails leaves (rail k
// of pod p is "p<p>-r<k>"), the first pod with nodes perPod nodes, under a
// core; plus a plain leaf "misc" under pod 2 for nodes without rails.
func railFabric(rails int, pod1, pod2, misc []string) events.TopologyFabric {
	ev := events.TopologyFabric{Cluster: "rails", Switches: []events.Switch{
		{Name: "core", Tier: "core", Switches: []string{"pod-1", "pod-2"}, LinkGbps: 400},
	}}
	leaves := map[int][]string{}
	for p, nodes := range map[int][]string{1: pod1, 2: pod2} {
		for k := range rails {
			name := fmt.Sprintf("p%d-r%d", p, k)
			leaves[p] = append(leaves[p], name)
			ev.Switches = append(ev.Switches, events.Switch{Name: name, Tier: "leaf", Nodes: nodes,
				LinkGbps: 200, Oversubscription: 2, Uplinks: 2, UplinkGbps: 200, Rail: railPtr(k)})
		}
	}
	ev.Switches = append(ev.Switches,
		events.Switch{Name: "pod-1", Tier: "spine", Switches: leaves[1], LinkGbps: 200},
		events.Switch{Name: "pod-2", Tier: "spine", Switches: append(leaves[2], "misc"), LinkGbps: 400},
		events.Switch{Name: "misc", Tier: "leaf", Nodes: misc, LinkGbps: 400})
	return ev
}

func mustFabric(t testing.TB, ev events.TopologyFabric) *Fabric {
	t.Helper()
	f, err := NewFabric(ev)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func TestNewFabricErrors(t *testing.T) {
	t.Parallel()
	leaf := func(name string, nodes ...string) events.Switch {
		return events.Switch{Name: name, Tier: "leaf", Nodes: nodes}
	}
	railLeaf := func(name string, rail int, nodes ...string) events.Switch {
		s := leaf(name, nodes...)
		s.Rail = railPtr(rail)
		return s
	}
	up := func(name, tier string, children ...string) events.Switch {
		return events.Switch{Name: name, Tier: tier, Switches: children}
	}
	tests := []struct {
		name     string
		switches []events.Switch
		want     []string
	}{
		{"unknown child", []events.Switch{leaf("l1", "n1"), up("s", "spine", "l1", "l9")},
			[]string{`fabric: switch "s": unknown child switch "l9"`}},
		{"child twice", []events.Switch{leaf("l1", "n1"), up("s", "spine", "l1", "l1")},
			[]string{`switch "s": child switch "l1" listed twice`}},
		{"cycle", []events.Switch{leaf("l1", "n1"), up("a", "core", "b", "l1"), up("b", "core", "c"), up("c", "core", "a")},
			[]string{`cycle a -> b -> c -> a`}},
		{"self cycle", []events.Switch{up("c", "core", "c")}, []string{`switch "c": cycle c -> c`}},
		{"leaf with switches", []events.Switch{leaf("l1", "n1"), up("l2", "leaf", "l1")},
			[]string{`switch "l2": tier inconsistent: a leaf holds nodes, got switches ["l1"]`}},
		{"spine with nodes", []events.Switch{{Name: "s", Tier: "spine", Nodes: []string{"n1"}}},
			[]string{`switch "s": tier inconsistent: a spine holds switches, got nodes ["n1"]`}},
		{"spine under spine", []events.Switch{leaf("l1", "n1"), up("s1", "spine", "l1"), up("s2", "spine", "s1")},
			[]string{`switch "s2": tier inconsistent: spine "s1" is below spine "s2"`}},
		{"core under spine", []events.Switch{leaf("l1", "n1"), up("c", "core", "l1"), up("s", "spine", "c")},
			[]string{`tier inconsistent: core "c" is below spine "s"`}},
		{"rail on a spine", []events.Switch{leaf("l1", "n1"), {Name: "s", Tier: "spine", Switches: []string{"l1"}, Rail: railPtr(0)}},
			[]string{`switch "s": tier inconsistent: only a leaf serves a rail, got rail 0 on a spine`}},
		{"unknown tier", []events.Switch{{Name: "t", Tier: "tor", Nodes: []string{"n1"}}},
			[]string{`switch "t": tier "tor": expected leaf, spine or core`}},
		{"duplicate name", []events.Switch{leaf("l1", "n1"), leaf("l1", "n2")}, []string{`switch "l1": defined twice`}},
		{"no name", []events.Switch{leaf("", "n1")}, []string{`fabric: switch 0: no name`}},
		{"bad numbers", []events.Switch{{Name: "l", Tier: "leaf", LinkGbps: -1, UplinkGbps: math.NaN(), Uplinks: -2, Oversubscription: 0.5}},
			[]string{`link_gbps: expected a rate of at least 0, got -1`, `uplink_gbps: expected a rate of at least 0, got NaN`,
				`uplinks: expected at least 0, got -2`, `oversubscription: expected 0 (not given) or at least 1, got 0.5`}},
		{"negative rail", []events.Switch{railLeaf("r", -1, "n1")}, []string{`switch "r": rail: expected at least 0, got -1`}},
		{"node under two leaves", []events.Switch{leaf("l1", "n1", "n2"), leaf("l2", "n2")},
			[]string{`switch "l2": node "n2" below both "l1" and "l2": a node is below one leaf, or one leaf per rail`}},
		{"node twice on a leaf", []events.Switch{leaf("l1", "n1", "n1")}, []string{`switch "l1": node "n1" listed twice`}},
		{"node on a rail and a plain leaf", []events.Switch{railLeaf("r0", 0, "n1"), leaf("l1", "n1")},
			[]string{`switch "l1": node "n1" below both "r0" and "l1"`}},
		{"two leaves of one rail", []events.Switch{railLeaf("a", 0, "n1"), railLeaf("b", 1, "n1"), railLeaf("c", 0, "n1")},
			[]string{`switch "c": node "n1" below both "a" and "c", both of rail 0`}},
		{"every problem", []events.Switch{up("s", "spine", "nope"), {Name: "t", Tier: "tor"}},
			[]string{`unknown child switch "nope"`, `tier "tor"`}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f, err := NewFabric(events.TopologyFabric{Cluster: "c", Switches: tc.switches})
			if err == nil {
				t.Fatalf("no error; fabric %+v", f)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error\n%v\ndoes not contain %q", err, w)
				}
			}
		})
	}
}

func TestNewFabricAccepts(t *testing.T) {
	t.Parallel()
	for name, ev := range map[string]events.TopologyFabric{
		"empty":       {Cluster: "c"},
		"two pods":    podTree(),
		"rails":       railFabric(8, []string{"n1", "n2"}, []string{"n3"}, []string{"m1"}),
		"core chain":  {Switches: []events.Switch{{Name: "top", Tier: "core", Switches: []string{"c"}}, {Name: "c", Tier: "core", Switches: []string{"s", "l2"}}, {Name: "s", Tier: "spine", Switches: []string{"l1"}}, {Name: "l1", Tier: "leaf", Nodes: []string{"n1"}}, {Name: "l2", Tier: "leaf", Nodes: []string{"n2"}}}},
		"empty leaf":  {Switches: []events.Switch{{Name: "l", Tier: "leaf"}, {Name: "s", Tier: "spine", Switches: []string{"l"}}}},
		"exact ratio": {Switches: []events.Switch{{Name: "l", Tier: "leaf", Nodes: []string{"n"}, Oversubscription: 1}}},
	} {
		if _, err := NewFabric(ev); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	f := mustFabric(t, events.TopologyFabric{Cluster: "c"})
	if sw, tier, hops := f.Common("a", "b"); sw != "" || tier != TierNone || hops != 0 {
		t.Errorf("empty fabric: Common = %q %q %d", sw, tier, hops)
	}
	if f.Cluster() != "c" {
		t.Errorf("Cluster() = %q", f.Cluster())
	}
}

func TestFabricLeafOfAndCommon(t *testing.T) {
	t.Parallel()
	f := mustFabric(t, podTree())
	for _, tc := range []struct {
		node, leaf string
		ok         bool
	}{{"a1", "leaf-a1", true}, {"a3", "leaf-a2", true}, {"x1", "lone", true}, {"nope", "", false}} {
		for _, rail := range []int{-1, 0, 3} { // no rails: the rail is ignored
			if leaf, ok := f.LeafOf(tc.node, rail); leaf != tc.leaf || ok != tc.ok {
				t.Errorf("LeafOf(%s, %d) = %q, %v; want %q, %v", tc.node, rail, leaf, ok, tc.leaf, tc.ok)
			}
		}
	}
	tests := []struct {
		a, b, sw, tier string
		hops           int
	}{
		{"a1", "a2", "leaf-a1", "leaf", 2},
		{"a1", "a1", "leaf-a1", "leaf", 2},
		{"a1", "a3", "pod-a", "spine", 4},
		{"a2", "b1", "core", "core", 6},
		{"b1", "p2", "pod-b", "spine", 4},
		{"a1", "x1", "", "none", 0},
		{"x1", "x1", "lone", "leaf", 2},
		{"a1", "nope", "", "none", 0},
	}
	for _, tc := range tests {
		for _, pair := range [][2]string{{tc.a, tc.b}, {tc.b, tc.a}} {
			sw, tier, hops := f.Common(pair[0], pair[1])
			if sw != tc.sw || tier != tc.tier || hops != tc.hops {
				t.Errorf("Common(%s, %s) = %q %q %d; want %q %q %d", pair[0], pair[1], sw, tier, hops, tc.sw, tc.tier, tc.hops)
			}
		}
	}
}

func TestFabricNetPath(t *testing.T) {
	t.Parallel()
	f := mustFabric(t, podTree())
	tests := []struct {
		name       string
		a, b       string
		nicA, nicB float64
		want       NetPath
	}{
		{"one leaf: the leaf link", "a1", "a2", 200, 200, NetPath{"leaf-a1", "leaf", 2, 25, 2.0}},
		{"one leaf: the slower NIC", "a1", "a2", 100, 200, NetPath{"leaf-a1", "leaf", 2, 12.5, 2.0}},
		{"one leaf: NICs unknown", "a1", "a2", 0, 0, NetPath{"leaf-a1", "leaf", 2, 25, 2.0}},
		{"NIC faster than the leaf", "a1", "a2", 400, 400, NetPath{"leaf-a1", "leaf", 2, 25, 2.0}},
		// Above the leaf: its uplinks are shared 2:1, half the link.
		{"spine: leaf oversubscription", "a1", "a3", 200, 200, NetPath{"pod-a", "spine", 4, 12.5, 3.0}},
		// A 100 Gb/s NIC on a 200 Gb/s link keeps its rate: the leaf's
		// uplinks carry half of 200 for each down link.
		{"spine: slow NIC not oversubscribed", "a1", "a3", 100, 100, NetPath{"pod-a", "spine", 4, 12.5, 3.0}},
		// b1's side crosses leaf-b1 (2) and pod-b (2): a quarter.
		{"core: oversubscription multiplies", "a1", "b1", 200, 200, NetPath{"core", "core", 6, 6.25, 4.0}},
		// b2's leaf is non-blocking but its 50 Gb/s uplink caps a flow.
		{"uplink rate caps", "b2", "b1", 200, 200, NetPath{"pod-b", "spine", 4, 6.25, 3.0}},
		{"uplink rate caps, same leaf free", "b2", "b2", 200, 200, NetPath{"leaf-b2", "leaf", 2, 25, 2.0}},
		// A leaf without rates: the NIC's rate, else the default 100 Gb/s.
		{"no rates: the NICs", "p1", "p2", 200, 200, NetPath{"plain", "leaf", 2, 25, 2.0}},
		{"no rates, a NIC unknown: the default", "p1", "p2", 200, 0, NetPath{"plain", "leaf", 2, FabricDefaultNICGbps / 8, 2.0}},
		{"no rates at all: the default", "p1", "p2", 0, 0, NetPath{"plain", "leaf", 2, FabricDefaultNICGbps / 8, 2.0}},
		{"island", "a1", "x1", 200, 200, NetPath{Tier: "none"}},
		{"unknown node", "zz", "a1", 200, 200, NetPath{Tier: "none"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := f.NetPath(tc.a, tc.b, tc.nicA, tc.nicB); got != tc.want {
				t.Errorf("NetPath(%s, %s, %v, %v) = %+v, want %+v", tc.a, tc.b, tc.nicA, tc.nicB, got, tc.want)
			}
			if got := f.NetPath(tc.b, tc.a, tc.nicB, tc.nicA); got != tc.want {
				t.Errorf("NetPath(%s, %s) reversed = %+v, want %+v", tc.b, tc.a, got, tc.want)
			}
		})
	}
}

func TestFabricRails(t *testing.T) {
	t.Parallel()
	f := mustFabric(t, railFabric(2, []string{"n1", "n2"}, []string{"n3"}, []string{"m1"}))
	for _, tc := range []struct {
		node string
		rail int
		leaf string
		ok   bool
	}{
		{"n1", -1, "p1-r0", true}, {"n1", 0, "p1-r0", true}, {"n1", 1, "p1-r1", true}, {"n1", 5, "", false},
		{"n3", 1, "p2-r1", true}, {"m1", -1, "misc", true}, {"m1", 1, "misc", true}, {"zz", 0, "", false},
	} {
		if leaf, ok := f.LeafOf(tc.node, tc.rail); leaf != tc.leaf || ok != tc.ok {
			t.Errorf("LeafOf(%s, %d) = %q, %v; want %q, %v", tc.node, tc.rail, leaf, ok, tc.leaf, tc.ok)
		}
	}
	tests := []struct {
		a             string
		railA         int
		b             string
		railB         int
		sw, tier      string
		hops          int
		gbps, latency float64
	}{
		{"n1", 0, "n2", 0, "p1-r0", "leaf", 2, 25, 2.0},
		{"n1", 1, "n2", 1, "p1-r1", "leaf", 2, 25, 2.0},
		// Different rails cross the pod's spine, within one pod.
		{"n1", 0, "n2", 1, "pod-1", "spine", 4, 12.5, 3.0},
		{"n1", -1, "n2", 1, "p1-r1", "leaf", 2, 25, 2.0}, // no rail: the other side's
		{"n1", -1, "n2", -1, "p1-r0", "leaf", 2, 25, 2.0},
		{"n1", 0, "n3", 0, "core", "core", 6, 12.5, 4.0},
		{"n1", 1, "m1", -1, "core", "core", 6, 12.5, 4.0},
		{"n1", 5, "n2", 5, "p1-r0", "leaf", 2, 25, 2.0}, // a rail without a leaf: the first leaf
		{"n3", 1, "m1", 0, "pod-2", "spine", 4, 12.5, 3.0},
	}
	for _, tc := range tests {
		got := f.RailPath(tc.a, tc.railA, tc.b, tc.railB, 200, 200)
		want := NetPath{tc.sw, tc.tier, tc.hops, tc.gbps, tc.latency}
		if got != want {
			t.Errorf("RailPath(%s/%d, %s/%d) = %+v, want %+v", tc.a, tc.railA, tc.b, tc.railB, got, want)
		}
		if back := f.RailPath(tc.b, tc.railB, tc.a, tc.railA, 200, 200); back != want {
			t.Errorf("RailPath(%s/%d, %s/%d) = %+v, want %+v", tc.b, tc.railB, tc.a, tc.railA, back, want)
		}
	}
	if sw, tier, hops := f.Common("n1", "n2"); sw != "p1-r0" || tier != "leaf" || hops != 2 {
		t.Errorf("Common(n1, n2) = %q %q %d, want the shared rail-0 leaf", sw, tier, hops)
	}
	for node, want := range map[string][]string{
		"n1": {"leaf:p1-r0", "pod:pod-1", "core:core"},
		"m1": {"leaf:misc", "pod:pod-2", "core:core"},
		"zz": nil,
	} {
		if got := f.Domains(node); !slices.Equal(got, want) {
			t.Errorf("Domains(%s) = %q, want %q", node, got, want)
		}
	}
}

func TestFabricDomainsTree(t *testing.T) {
	t.Parallel()
	f := mustFabric(t, podTree())
	for node, want := range map[string][]string{
		"a1": {"leaf:leaf-a1", "pod:pod-a", "core:core"},
		"x1": {"leaf:lone"},
	} {
		if got := f.Domains(node); !slices.Equal(got, want) {
			t.Errorf("Domains(%s) = %q, want %q", node, got, want)
		}
	}
}

// A Clos fabric where a spine sits under two cores: s1 under c1 and c2, s2
// under c2 only. Nodes below s1 and s2 meet on c2 (the first parent of s1,
// c1, is no ancestor of s2).
func TestFabricSeveralParents(t *testing.T) {
	t.Parallel()
	f := mustFabric(t, events.TopologyFabric{Switches: []events.Switch{
		{Name: "c1", Tier: "core", Switches: []string{"s1", "s3"}},
		{Name: "c2", Tier: "core", Switches: []string{"s1", "s2"}},
		{Name: "s1", Tier: "spine", Switches: []string{"l1", "l1b"}, Oversubscription: 4},
		{Name: "s2", Tier: "spine", Switches: []string{"l2"}},
		{Name: "s3", Tier: "spine", Switches: []string{"l3"}},
		{Name: "l1", Tier: "leaf", Nodes: []string{"n1"}, LinkGbps: 200},
		{Name: "l1b", Tier: "leaf", Nodes: []string{"n1b"}, LinkGbps: 200},
		{Name: "l2", Tier: "leaf", Nodes: []string{"n2"}, LinkGbps: 200},
		{Name: "l3", Tier: "leaf", Nodes: []string{"n3"}, LinkGbps: 200},
	}})
	tests := []struct {
		a, b string
		want NetPath
	}{
		{"n1", "n1b", NetPath{"s1", "spine", 4, 25, 3.0}},
		{"n1", "n2", NetPath{"c2", "core", 6, 6.25, 4.0}},
		{"n1", "n3", NetPath{"c1", "core", 6, 6.25, 4.0}},
		// Up s2 to c2, never down to s1 and up again: no common switch.
		{"n2", "n3", NetPath{Tier: "none"}},
	}
	for _, tc := range tests {
		if got := f.NetPath(tc.a, tc.b, 200, 200); got != tc.want {
			t.Errorf("NetPath(%s, %s) = %+v, want %+v", tc.a, tc.b, got, tc.want)
		}
		if got := f.NetPath(tc.b, tc.a, 200, 200); got != tc.want {
			t.Errorf("NetPath(%s, %s) = %+v, want %+v", tc.b, tc.a, got, tc.want)
		}
	}
	if got, want := f.Domains("n1"), []string{"leaf:l1", "pod:s1", "core:c1", "core:c2"}; !slices.Equal(got, want) {
		t.Errorf("Domains(n1) = %q, want %q", got, want)
	}
}

// dgxA100 is a small copy of the built-in dgx-a100 model (which lives in
// package discovery): 8 GPUs on NVSwitch (NV12), 8 HDR NICs at 200 Gb/s,
// two GPUs and two NICs per PCIe switch complex (PXB).
func dgxA100(name string) *Node {
	n := &Node{Name: name, NVLinkGen: 3, PCIeGen: 4, NVSwitches: 6}
	for g := range 8 {
		n.GPUs = append(n.GPUs, GPU{Index: g, NUMA: []int{3, 3, 1, 1, 7, 7, 5, 5}[g]})
		n.NICs = append(n.NICs, NIC{Index: g, Name: fmt.Sprintf("mlx5_%d", g), RateGbps: 200, RDMA: true, NUMA: -1})
	}
	for i := range 8 {
		row, nics := make([]Link, 8), make([]Link, 8)
		for j := range 8 {
			row[j] = Link{Class: NV, NVLinks: 12}
			if i == j {
				row[j] = Link{Class: Self}
			}
			nics[j] = Link{Class: SYS}
			if i/2 == j/2 {
				nics[j] = Link{Class: PXB}
			}
		}
		n.GPUPaths, n.NICPaths = append(n.GPUPaths, row), append(n.NICPaths, nics)
	}
	return n
}

// hostBridge is a 2-GPU PCIe node with one 400 Gb/s NIC: GPU0 reaches it
// across the host bridges of its socket (NODE), GPU1 across the sockets
// (SYS).
func hostBridge(name string) *Node {
	return &Node{Name: name, PCIeGen: 4,
		GPUs:     []GPU{{Index: 0, NUMA: 0}, {Index: 1, NUMA: 1}},
		NICs:     []NIC{{Index: 0, Name: "mlx5_0", RateGbps: 400, NUMA: 0}},
		GPUPaths: [][]Link{{{Class: Self}, {Class: SYS}}, {{Class: SYS}, {Class: Self}}},
		NICPaths: [][]Link{{{Class: NODE}}, {{Class: SYS}}},
	}
}

func TestGPUPath(t *testing.T) {
	t.Parallel()
	f := mustFabric(t, railFabric(8, []string{"d1", "d2"}, []string{"d3"}, []string{"h1", "h2", "plain"}))
	d1, d2, d3 := dgxA100("d1"), dgxA100("d2"), dgxA100("d3")
	h1, h2 := hostBridge("h1"), hostBridge("h2")
	plain := &Node{Name: "plain", GPUs: []GPU{{Index: 0}, {Index: 1}}}
	stray := dgxA100("stray") // on no switch
	bw := DefaultBandwidths()
	pxb, sys, node := bw.LatencyUS[PXB], bw.LatencyUS[SYS], bw.LatencyUS[NODE]
	net := func(gbps, lat float64) Path { return Path{Link: Link{Class: NET}, BandwidthGBps: gbps, LatencyUS: lat} }
	tests := []struct {
		name string
		f    *Fabric
		na   *Node
		ga   int
		nb   *Node
		gb   int
		want Path
	}{
		{"same node: NVSwitch", f, d1, 0, d1, 5, Path{Link: Link{Class: NV, NVLinks: 12}, BandwidthGBps: 300, LatencyUS: 0.6}},
		{"same node by name", f, d1, 2, dgxA100("d1"), 3, Path{Link: Link{Class: NV, NVLinks: 12}, BandwidthGBps: 300, LatencyUS: 0.6}},
		{"same node without a matrix", f, plain, 0, plain, 1, Path{Link: Link{Class: PHB}, BandwidthGBps: 31.5, LatencyUS: 1.5}},
		// GPU g's nearest NIC is NIC g: rail g.
		{"same rail, one leaf", f, d1, 0, d2, 0, net(25, pxb+2.0+pxb)},
		{"same rail 3, one leaf", f, d1, 3, d2, 3, net(25, pxb+2.0+pxb)},
		{"different rails cross the pod spine", f, d1, 0, d2, 1, net(12.5, pxb+3.0+pxb)},
		{"other pod: the core", f, d1, 4, d3, 4, net(12.5, pxb+4.0+pxb)},
		// Across the host bridge, the 50 GB/s NICs are held to PCIe gen 4
		// (31.5); across the sockets to the SMP link (20.8).
		{"NIC across the host bridges", f, h1, 0, h2, 0, net(31.5, node+2.0+node)},
		{"NIC across the sockets", f, h1, 1, h2, 0, net(20.8, sys+2.0+node)},
		{"PXB to a plain leaf", f, d1, 0, h1, 0, net(12.5, pxb+4.0+node)},
		// plain's side: rate unknown, misc's 400 Gb/s link; d3's leaf is 2:1.
		{"no NIC paths: no leg", f, d3, 0, plain, 0, net(12.5, pxb+3.0)},
		{"not on the fabric", f, d1, 0, stray, 0, net(0, 0)},
		{"no fabric: one switch", nil, d1, 0, d3, 7, net(25, pxb+2.0+pxb)},
		{"no fabric, across sockets", nil, h1, 1, h2, 1, net(20.8, sys+2.0+sys)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := GPUPath(tc.f, tc.na, tc.ga, tc.nb, tc.gb, bw)
			if !pathNear(got, tc.want) {
				t.Errorf("GPUPath(%s/%d, %s/%d) = %+v, want %+v", tc.na.Name, tc.ga, tc.nb.Name, tc.gb, got, tc.want)
			}
			if back := GPUPath(tc.f, tc.nb, tc.gb, tc.na, tc.ga, nil); !pathNear(back, tc.want) {
				t.Errorf("GPUPath(%s/%d, %s/%d) = %+v, want %+v", tc.nb.Name, tc.gb, tc.na.Name, tc.ga, back, tc.want)
			}
		})
	}
}

func pathNear(a, b Path) bool {
	return a.Link == b.Link && math.Abs(a.BandwidthGBps-b.BandwidthGBps) < 1e-9 && math.Abs(a.LatencyUS-b.LatencyUS) < 1e-9
}

// TestFabricSchemaExamples builds a Fabric from every example of the
// topology.fabric schema: the valid ones are accepted, the invalid ones
// refused here too.
func TestFabricSchemaExamples(t *testing.T) {
	t.Parallel()
	dir := filepath.Join("..", "..", "schemas", "v1", "examples", "topology.fabric")
	for _, pattern := range []string{"*.json", "invalid/*.json"} {
		files, err := filepath.Glob(filepath.Join(dir, pattern))
		if err != nil || len(files) == 0 {
			t.Fatalf("no examples %s in %s: %v", pattern, dir, err)
		}
		for _, file := range files {
			data, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			var ev events.TopologyFabric
			if err := json.Unmarshal(data, &ev); err != nil {
				t.Fatalf("%s: %v", file, err)
			}
			_, err = NewFabric(ev)
			if valid := pattern == "*.json"; valid != (err == nil) {
				t.Errorf("%s: NewFabric error %v", file, err)
			}
		}
	}
	data, err := os.ReadFile(filepath.Join(dir, "rail-optimized.json"))
	if err != nil {
		t.Fatal(err)
	}
	var ev events.TopologyFabric
	if err := json.Unmarshal(data, &ev); err != nil {
		t.Fatal(err)
	}
	f := mustFabric(t, ev)
	for _, tc := range []struct {
		a             string
		railA         int
		b             string
		railB         int
		tier          string
		gbps, latency float64
	}{
		{"dgx-h100-001", 3, "dgx-h100-004", 3, "leaf", 50, 2.0},
		{"dgx-h100-001", 3, "dgx-h100-004", 4, "spine", 25, 3.0},
		{"dgx-h100-001", 0, "dgx-h100-008", 0, "core", 25, 4.0},
	} {
		if p := f.RailPath(tc.a, tc.railA, tc.b, tc.railB, 400, 400); p.Tier != tc.tier || p.BandwidthGBps != tc.gbps || p.LatencyUS != tc.latency {
			t.Errorf("RailPath(%s/%d, %s/%d) = %+v", tc.a, tc.railA, tc.b, tc.railB, p)
		}
	}
}

// FuzzNewFabric checks that NewFabric never panics, and that on any fabric
// it accepts, paths are symmetric and every listed node has domains.
func FuzzNewFabric(f *testing.F) {
	for _, ev := range []events.TopologyFabric{podTree(), railFabric(2, []string{"n1", "n2"}, []string{"n3"}, []string{"m1"})} {
		b, err := json.Marshal(ev)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte(`{"switches":[{"name":"c1","tier":"core","switches":["s1"]},{"name":"c2","tier":"core","switches":["s1","s2"]},{"name":"s1","tier":"spine","switches":["l1"]},{"name":"s2","tier":"spine","switches":["l2"]},{"name":"l1","tier":"leaf","nodes":["a"]},{"name":"l2","tier":"leaf","nodes":["b"]}]}`))
	f.Add([]byte(`{"switches":[{"name":"a","tier":"core","switches":["b"]},{"name":"b","tier":"core","switches":["a"]}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		var ev events.TopologyFabric
		if json.Unmarshal(data, &ev) != nil {
			return
		}
		fab, err := NewFabric(ev)
		if err != nil {
			return
		}
		var nodes []string
		for _, s := range ev.Switches {
			nodes = append(nodes, s.Nodes...)
		}
		nodes = nodes[:min(len(nodes), 20)]
		for _, a := range nodes {
			if len(fab.Domains(a)) == 0 {
				t.Fatalf("node %q listed but without domains", a)
			}
			for _, b := range nodes {
				for _, rails := range [][2]int{{-1, -1}, {0, 1}, {1, 1}} {
					p, q := fab.RailPath(a, rails[0], b, rails[1], 100, 200), fab.RailPath(b, rails[1], a, rails[0], 200, 100)
					if p.Tier != q.Tier || p.Hops != q.Hops || p.BandwidthGBps != q.BandwidthGBps || p.BandwidthGBps < 0 {
						t.Fatalf("%s-%s %v: %+v but reversed %+v", a, b, rails, p, q)
					}
					if (p.Tier == TierNone) != (p.Hops == 0) || p.Tier != TierNone && p.BandwidthGBps <= 0 {
						t.Fatalf("%s-%s %v: %+v", a, b, rails, p)
					}
				}
			}
		}
	})
}
