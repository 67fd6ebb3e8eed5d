package collective

import (
	"math"
	"testing"

	"github.com/toposched/toposched/internal/topology"
)

// Where P2P is off NCCL goes through host memory (SHM): a pair under one
// PCIe switch shares the switch's uplink at SHMShare of the PCIe rate,
// a pair across sockets pays 1/SHMShare on its GPU links and still crosses
// the inter-socket link, and a node whose P2P matrix is unknown or OK is
// priced as P2P, as before.
func TestSHMPath(t *testing.T) {
	t.Parallel()
	pcie := 15.75 * EffPCIe // Gen3 x16, per direction
	sys := func(a, b int) topology.Class { return topology.SYS }
	for _, tc := range []struct {
		name       string
		spec       NodeSpec
		p2p        topology.P2PStatus // off-diagonal status set on the node; 0: none
		busbw      float64
		bottleneck string
	}{
		{"pix p2p unknown", NodeSpec{GPUs: 2}, 0, pcie, "pcie:n-0:0:tx"},
		{"pix p2p ok", NodeSpec{GPUs: 2}, topology.P2POK, pcie, "pcie:n-0:0:tx"},
		// Both GPUs' copies on one uplink: 2 flows over pcie*SHMShare.
		{"pix p2p off", NodeSpec{GPUs: 2}, topology.P2PNotSupported, pcie * SHMShare / 2, "host:n-0:tx"},
		{"pix p2p chipset off", NodeSpec{GPUs: 2}, topology.P2PChipsetNotSupported, pcie * SHMShare / 2, "host:n-0:tx"},
		// Across sockets: the GPU link at 1/SHMShare, unless the socket link is slower.
		{"sys p2p off", NodeSpec{GPUs: 2, PCIePath: sys}, topology.P2PGPUNotSupported, math.Min(pcie*SHMShare, 20.8*EffPCIe), "pcie:n-0:0:tx"},
		{"sys p2p ok", NodeSpec{GPUs: 2, PCIePath: sys}, topology.P2POK, pcie, "pcie:n-0:0:tx"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := tc.spec
			s.Name, s.Model, s.PCIeGen = "n", "RTX-2080-Ti", 3
			n := nodes(s, 1)[0]
			if tc.p2p != 0 {
				n.P2P = [][]topology.P2PStatus{{topology.P2PSelf, tc.p2p}, {tc.p2p, topology.P2PSelf}}
			}
			r, err := Predict(Placement{Ranks: NodeRanks(n)}, AllReduce, 8<<30, Options{Algorithm: Ring})
			if err != nil {
				t.Fatal(err)
			}
			if math.Abs(r.BusBWGBps-tc.busbw)/tc.busbw > 0.01 || r.Bottleneck != tc.bottleneck {
				t.Errorf("busbw %.2f GB/s bound by %s, want %.2f by %s", r.BusBWGBps, r.Bottleneck, tc.busbw, tc.bottleneck)
			}
		})
	}
}

// Validation tables name the pairs that lack P2P through NodeSpec.NoP2P.
func TestBuildNodeNoP2P(t *testing.T) {
	t.Parallel()
	n := BuildNode(NodeSpec{Name: "n", GPUs: 3, NoP2P: true})
	if err := n.Validate(); err != nil {
		t.Fatal(err)
	}
	if !n.P2POff(0, 2) || n.P2POff(1, 1) || BuildNode(NodeSpec{Name: "n", GPUs: 3}).P2P != nil {
		t.Errorf("p2p %v", n.P2P)
	}
}
