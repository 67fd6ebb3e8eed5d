package topology

import (
	"strings"
	"testing"
)

// node makes a node of g GPUs whose path between i and j is link(i, j).
func node(g int, model string, link func(i, j int) Link) *Node {
	n := &Node{GPUPaths: make([][]Link, g)}
	for i := range g {
		n.GPUs = append(n.GPUs, GPU{Index: i, Model: model, NUMA: -1})
		n.GPUPaths[i] = make([]Link, g)
		for j := range g {
			if i == j {
				n.GPUPaths[i][j] = Link{Class: Self}
			} else {
				n.GPUPaths[i][j] = link(i, j)
			}
		}
	}
	return n
}

func withNICs(n *Node, names ...string) *Node {
	for k, name := range names {
		n.NICs = append(n.NICs, NIC{Index: k, Name: name, NUMA: -1})
	}
	return n
}

func nv(count int) func(i, j int) Link {
	return func(int, int) Link { return Link{Class: NV, NVLinks: count} }
}

func TestInfer(t *testing.T) {
	t.Parallel()
	pairs := func(i, j int) Link {
		if i/2 == j/2 {
			return Link{Class: NV, NVLinks: 4}
		}
		return Link{Class: PHB}
	}
	cube := func(i, j int) Link { // DGX-1: each GPU on NVLink with four others
		if i/4 == j/4 || i%4 == j%4 {
			return Link{Class: NV, NVLinks: 1}
		}
		return Link{Class: SYS}
	}
	for _, tc := range []struct {
		name     string
		n        *Node
		gen      int
		inferred []string // substrings, in order
	}{
		{"NV18 on every pair", node(8, "", nv(18)), 4, []string{"NVLink 4, from NV18", "NVSwitches, from NV18"}},
		{"NV12 on every pair of 8", node(8, "", nv(12)), 3, []string{"NVLink 3, from NV12", "NVSwitches"}},
		{"NV12 on a pair", node(2, "", nv(12)), 0, nil},
		{"NV6 on every pair of 16", node(16, "", nv(6)), 2, []string{"NVLink 2, from NV6 on every pair of 16", "NVSwitches"}},
		{"B200 by name", node(8, "NVIDIA B200", nv(18)), 5, []string{"NVLink 5, from the GPU model NVIDIA B200", "NVSwitches"}},
		{"bridged pairs", node(8, "", pairs), 0, []string{"NVLink bridges, not NVSwitches: each GPU has NVLink to at most 1 other"}},
		{"bridged pairs of A6000s", node(4, "NVIDIA RTX A6000", pairs), 0, []string{"bridges"}},
		{"hybrid cube mesh", node(8, "Tesla V100-SXM2-32GB", cube), 2, []string{"NVLink 2, from the GPU model Tesla V100"}},
		{"no NVLink", node(4, "", func(int, int) Link { return Link{Class: PIX} }), 0, nil},
		{"EFA NICs of a p4d", withNICs(node(8, "NVIDIA A100-SXM4-40GB", nv(12)), "rdmap16s27", "rdmap32s27", "mlx5_0"), 3,
			[]string{"EFA transport, from the NIC names rdmap16s27, rdmap32s27", "NVLink 3, from the GPU model", "NVSwitches"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			Infer(tc.n)
			if tc.n.NVLinkGen != tc.gen {
				t.Errorf("NVLinkGen %d, want %d", tc.n.NVLinkGen, tc.gen)
			}
			if len(tc.n.Inferred) != len(tc.inferred) {
				t.Fatalf("inferred %q, want %d facts", tc.n.Inferred, len(tc.inferred))
			}
			for i, want := range tc.inferred {
				if !strings.Contains(tc.n.Inferred[i], want) {
					t.Errorf("inferred[%d] = %q, want %q", i, tc.n.Inferred[i], want)
				}
			}
		})
	}
	// What the source gave stays.
	n := node(8, "", nv(18))
	n.NVLinkGen, n.NVSwitches = 5, 4
	Infer(n)
	if n.NVLinkGen != 5 || len(n.Inferred) != 0 {
		t.Errorf("read facts changed: gen %d, inferred %q", n.NVLinkGen, n.Inferred)
	}
}
