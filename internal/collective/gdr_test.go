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
