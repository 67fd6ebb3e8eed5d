package topology

import "testing"

func TestSameLinks(t *testing.T) {
	t.Parallel()
	node := func(edit func(*Node)) *Node {
		n := &Node{
			Name: "a", Source: "nvidia-smi",
			GPUs: []GPU{{Index: 0, UUID: "GPU-a0", Model: "A100", NUMA: 0}, {Index: 1, UUID: "GPU-a1", Model: "A100", NUMA: 1}},
			NICs: []NIC{{Index: 0, Name: "mlx5_0", RateGbps: 200, RDMA: true, NUMA: 0}},
			GPUPaths: [][]Link{
				{{Class: Self}, {Class: NV, NVLinks: 12}},
				{{Class: NV, NVLinks: 12}, {Class: Self}},
			},
			NICPaths: [][]Link{{{Class: PIX}}, {{Class: SYS}}},
		}
		if edit != nil {
			edit(n)
		}
		return n
	}
	a := node(nil)
	for _, tc := range []struct {
		name string
		b    *Node
		want bool
	}{
		{"itself", a, true},
		{"another node's report: names, UUIDs, source", node(func(n *Node) {
			n.Name, n.Source, n.GPUs[0].UUID, n.GPUs[1].BusID = "b", "nvml", "GPU-b0", "0000:17:00.0"
		}), true},
		{"fewer NVLinks", node(func(n *Node) { n.GPUPaths[0][1].NVLinks, n.GPUPaths[1][0].NVLinks = 4, 4 }), false},
		{"a GPU on another NUMA node", node(func(n *Node) { n.GPUs[1].NUMA = 0 }), false},
		{"another model", node(func(n *Node) { n.GPUs[0].Model = "H100" }), false},
		{"a slower NIC", node(func(n *Node) { n.NICs[0].RateGbps = 100 }), false},
		{"the NIC elsewhere", node(func(n *Node) { n.NICPaths[1][0] = Link{Class: PXB} }), false},
		{"no NIC paths", node(func(n *Node) { n.NICPaths = nil }), false},
		{"nil", nil, false},
	} {
		if got := a.SameLinks(tc.b); got != tc.want {
			t.Errorf("%s: SameLinks = %v, want %v", tc.name, got, tc.want)
		}
		if got := tc.b.SameLinks(a); got != tc.want {
			t.Errorf("%s, the other way: SameLinks = %v, want %v", tc.name, got, tc.want)
		}
	}
	if !(*Node)(nil).SameLinks(nil) {
		t.Error("two nil nodes differ")
	}
}
