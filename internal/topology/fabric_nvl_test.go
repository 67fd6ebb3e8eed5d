package topology

import (
	"slices"
	"strings"
	"testing"

	"github.com/toposched/toposched/events"
)

// A GB200 NVL72-style rack: trays in one NVLink domain reach each other
// over NVLink; a tray of another rack goes over the network.
func TestNVLinkDomain(t *testing.T) {
	t.Parallel()
	ev := events.TopologyFabric{Cluster: "gb", Switches: []events.Switch{
		{Name: "rack-1", Tier: TierNVLink, NVLinks: 18, Nodes: []string{"t1", "t2"}},
		{Name: "rack-2", Tier: TierNVLink, NVLinks: 18, Nodes: []string{"t3"}},
		{Name: "leaf", Tier: TierLeaf, LinkGbps: 400, Nodes: []string{"t1", "t2", "t3"}},
	}}
	f, err := NewFabric(ev)
	if err != nil {
		t.Fatal(err)
	}
	tray := func(name string) *Node {
		n := &Node{Name: name, NVLinkGen: 5, GPUs: []GPU{{Index: 0, NUMA: 0}, {Index: 1, NUMA: 0}}}
		n.GPUPaths = [][]Link{{{Class: Self}, {Class: NV, NVLinks: 18}}, {{Class: NV, NVLinks: 18}, {Class: Self}}}
		return n
	}
	t1, t2, t3 := tray("t1"), tray("t2"), tray("t3")
	if p := GPUPath(f, t1, 0, t2, 1, nil); p.Class != NV || p.NVLinks != 18 || p.BandwidthGBps != 900 {
		t.Errorf("t1-t2 in one rack: %+v, want NV18 at 900 GB/s", p)
	}
	if p := GPUPath(f, t1, 0, t3, 0, nil); p.Class != NET {
		t.Errorf("t1-t3 across racks: %+v, want NET", p)
	}
	if d, ok := f.NVLinkDomain("t2"); !ok || d != "rack-1" {
		t.Errorf("NVLinkDomain(t2) = %q, %v", d, ok)
	}
	if got := f.Domains("t1"); !slices.Equal(got, []string{"nvl:rack-1", "leaf:leaf"}) {
		t.Errorf("Domains(t1) = %q", got)
	}
	bad := events.TopologyFabric{Switches: []events.Switch{
		{Name: "r1", Tier: TierNVLink, Nodes: []string{"a"}},
		{Name: "r2", Tier: TierNVLink, Nodes: []string{"a"}, Switches: []string{"r1"}},
	}}
	_, err = NewFabric(bad)
	if err == nil || !strings.Contains(err.Error(), `node "a" is already in NVLink domain "r1"`) ||
		!strings.Contains(err.Error(), "an NVLink domain holds nodes") {
		t.Errorf("NewFabric(bad) = %v", err)
	}
}
