package collective

import (
	"math"
	"testing"

	"github.com/toposched/toposched/internal/topology"
)

// A NIC's traffic through its GPU's PCIe link (GPUDirect RDMA, addGDR) is
// priced at the network's efficiency, not at the GPU peer traffic's: a
// machine calibrated for PCIe peer-to-peer does not move a multi-node
// prediction, and where that link binds, a calibration fits the NIC's kind.
func TestGDRPricedApart(t *testing.T) {
	t.Parallel()
	pair := func(spec NodeSpec) Placement {
		a, b := spec, spec
		a.Name, b.Name = spec.Name+"1", spec.Name+"2"
		return Placement{Ranks: NodesRanks([]*topology.Node{BuildNode(a), BuildNode(b)}, spec.GPUs)}
	}
	// H100 nodes: each GPU's PCIe Gen5 x16 (63 GB/s) above its 400 Gb/s
	// NIC (50), as in the HGX reference design.
	h100 := pair(NodeSpec{Name: "h", GPUs: 8, Model: "H100", NVLinks: 18, NVLinkGen: 4, PCIeGen: 5, NICs: 8, NICGbps: 400})
	// A Gen4 GPU (31.5 GB/s) with a 400 Gb/s NIC: the GPU's link binds.
	narrow := pair(NodeSpec{Name: "n", GPUs: 8, Model: "A100", NVLinks: 12, NVLinkGen: 3, PCIeGen: 4, NICs: 8, NICGbps: 400})
	for _, tc := range []struct {
		name     string
		p        Placement
		c        Collective
		pcieEff  float64 // a PCIe calibration that must not move the prediction
		wantKind string
		wantBN   string // the bottleneck's prefix
	}{
		{"H100 pair alltoall: NIC-bound", h100, AllToAll, 0.6, "net", "nic:"},
		{"H100 pair sendrecv: NIC-bound", h100, SendRecv, 0.6, "net", "nic:"},
		{"Gen4 GPU, 400G NIC: the GPU's PCIe link binds, at the NIC's efficiency", narrow, AllToAll, 0.5, "net", "pcie:"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			def, err := Predict(tc.p, tc.c, 1<<30, Options{Candidates: NCCLAlgorithms})
			if err != nil {
				t.Fatal(err)
			}
			q := tc.p
			q.Bandwidths = (&Calibration{Efficiency: topology.Efficiency{PCIe: tc.pcieEff}}).Bandwidths(nil)
			cal, err := Predict(q, tc.c, 1<<30, Options{Candidates: NCCLAlgorithms})
			if err != nil {
				t.Fatal(err)
			}
			if def.BottleneckKind != tc.wantKind || def.Bottleneck[:len(tc.wantBN)] != tc.wantBN {
				t.Errorf("bottleneck %s (%s), want %s... (%s)", def.Bottleneck, def.BottleneckKind, tc.wantBN, tc.wantKind)
			}
			if math.Abs(cal.BusBWGBps-def.BusBWGBps) > 1e-9*def.BusBWGBps {
				t.Errorf("pcie %g moved busbw %.3f -> %.3f GB/s (bottleneck %s): the NIC's traffic is not GPU peer traffic",
					tc.pcieEff, def.BusBWGBps, cal.BusBWGBps, cal.Bottleneck)
			}
		})
	}

	// The network's fit recovers its efficiency where the NIC's traffic
	// binds at the GPU's PCIe link, and leaves PCIe's at the default.
	samples := truth(t, narrow, topology.Efficiency{Net: 0.7}, AllToAll, 256<<20, 1<<30, 4<<30)
	fit, err := FitCalibration("test", samples, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(fit.Fits) != 1 || fit.Fits[0].Kind != "net" || math.Abs(fit.Fits[0].Efficiency-0.7) > 0.007 {
		t.Errorf("fits %+v, want net 0.7", fit.Fits)
	}
	if fit.Resolved().PCIe != EffPCIe {
		t.Errorf("pcie %g, want the default %g", fit.Resolved().PCIe, EffPCIe)
	}
}

// A GPU's PCIe link that carries both its peers' traffic and its NIC's is
// one link: on PCIe-only nodes over the network, slowing either kind of
// traffic slows the collective where that link binds.
func TestGDRSharesTheLink(t *testing.T) {
	t.Parallel()
	spec := NodeSpec{GPUs: 4, Model: "L40S", PCIeGen: 4, NICs: 4, NICGbps: 400}
	a, b := spec, spec
	a.Name, b.Name = "p1", "p2"
	p := Placement{Ranks: NodesRanks([]*topology.Node{BuildNode(a), BuildNode(b)}, 4)}
	at := func(e topology.Efficiency) Result {
		q := p
		q.Bandwidths = (&Calibration{Efficiency: e}).Bandwidths(nil)
		r, err := Predict(q, AllToAll, 1<<30, Options{Candidates: NCCLAlgorithms})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	def := at(topology.Efficiency{})
	if def.Bottleneck[:5] != "pcie:" {
		t.Fatalf("bottleneck %s, want a GPU's PCIe link", def.Bottleneck)
	}
	for _, e := range []topology.Efficiency{{PCIe: 0.6}, {Net: 0.7}} {
		if r := at(e); !(r.BusBWGBps < 0.99*def.BusBWGBps) {
			t.Errorf("%+v: busbw %.3f GB/s, want below the defaults' %.3f: the link carries both kinds of traffic", e, r.BusBWGBps, def.BusBWGBps)
		}
	}
}

// NCCL uses GPUDirect RDMA as ncclTopoCheckGdr decides: a NIC no farther
// than a PCIe switch (PXB), and for sends, a GPU with an NVLink peer or,
// from 2.19, of compute capability 8.0 on.
func TestUsesGDR(t *testing.T) {
	t.Parallel()
	node := func(spec NodeSpec, nicPath topology.Class) *topology.Node {
		n := BuildNode(spec)
		for g := range n.NICPaths {
			for k := range n.NICPaths[g] {
				n.NICPaths[g][k] = topology.Link{Class: topology.SYS}
			}
			n.NICPaths[g][g*len(n.NICs)/len(n.GPUs)] = topology.Link{Class: nicPath}
		}
		return n
	}
	v100pcie := NodeSpec{Name: "v", GPUs: 4, Model: "Tesla V100-PCIE-32GB", PCIeGen: 3, NICs: 2, NICGbps: 100}
	v100sxm := NodeSpec{Name: "vs", GPUs: 8, Model: "Tesla V100-SXM2-32GB", NVLinks: 6, NVLinkGen: 2, PCIeGen: 3, NICs: 4, NICGbps: 100}
	l40s := NodeSpec{Name: "l", GPUs: 8, Model: "NVIDIA L40S", PCIeGen: 4, NICs: 4, NICGbps: 200}
	tun218, err := TuningFor("2.18.3")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name       string
		n          *topology.Node
		tun        *Tuning
		send, recv bool
	}{
		{"L40S, NIC under its switch", node(l40s, topology.PIX), nil, true, true},
		{"L40S, NIC behind two switches", node(l40s, topology.PXB), nil, true, true},
		{"L40S, NIC on the host bridge", node(l40s, topology.PHB), nil, false, false},
		{"L40S, NIC on the other socket", node(l40s, topology.SYS), nil, false, false},
		{"L40S on 2.18: no GDR read without NVLink", node(l40s, topology.PIX), tun218, false, true},
		{"V100 PCIe: no GDR read without NVLink", node(v100pcie, topology.PIX), nil, false, true},
		{"V100 SXM2: NVLink peers, GDR read", node(v100sxm, topology.PIX), nil, true, true},
		{"V100 SXM2 on 2.18", node(v100sxm, topology.PIX), tun218, true, true},
		{"V100 PCIe alone on its node", node(NodeSpec{Name: "one", GPUs: 1, Model: "Tesla V100-PCIE-32GB", PCIeGen: 3, NICs: 1, NICGbps: 100}, topology.PIX), nil, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			m, err := newModel(Placement{Ranks: NodeRanks(tc.n)}, nil, tc.tun)
			if err != nil {
				t.Fatal(err)
			}
			nd := m.nodes[0]
			for g := range tc.n.GPUs {
				if got := m.usesGDR(nd, g, tx); got != tc.send {
					t.Errorf("GPU %d send: GDR %v, want %v", g, got, tc.send)
				}
				if got := m.usesGDR(nd, g, rx); got != tc.recv {
					t.Errorf("GPU %d receive: GDR %v, want %v", g, got, tc.recv)
				}
			}
		})
	}

	// Without GDR the GPU's threads copy through host memory across its
	// PCIe link: peer traffic's price and kind, which a PCIe calibration
	// moves. One GPU of each node, so that the link carries the NIC's
	// bytes alone.
	spec := NodeSpec{GPUs: 8, Model: "NVIDIA L40S", PCIeGen: 4, NICs: 8, NICGbps: 400}
	a, b := spec, spec
	a.Name, b.Name = "s1", "s2"
	p := Placement{Ranks: NodesRanks([]*topology.Node{node(a, topology.SYS), node(b, topology.SYS)}, 1)}
	def, err := Predict(p, SendRecv, 1<<30, Options{Candidates: NCCLAlgorithms})
	if err != nil {
		t.Fatal(err)
	}
	if def.BottleneckKind != "pcie" || def.Bottleneck[:5] != "pcie:" {
		t.Errorf("NIC across the sockets: bottleneck %s (%s), want the GPU's PCIe link as pcie", def.Bottleneck, def.BottleneckKind)
	}
	p.Bandwidths = (&Calibration{Efficiency: topology.Efficiency{PCIe: 0.6}}).Bandwidths(nil)
	cal, err := Predict(p, SendRecv, 1<<30, Options{Candidates: NCCLAlgorithms})
	if err != nil {
		t.Fatal(err)
	}
	if want := def.BusBWGBps * 0.6 / EffPCIe; math.Abs(cal.BusBWGBps-want) > 0.01*want {
		t.Errorf("pcie 0.6: busbw %.3f GB/s, want %.3f: bytes staged through host memory are PCIe traffic", cal.BusBWGBps, want)
	}
}
