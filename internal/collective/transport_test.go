package collective

import (
	"math"
	"strings"
	"testing"

	"github.com/toposched/toposched/internal/topology"
)

// CPUs as NCCL's XML writes them.
var (
	cpuUnknown = topology.CPU{}
	cpuBDW     = topology.CPU{Arch: "x86_64", Vendor: "GenuineIntel", Family: 6, Model: 79}
	cpuSKL     = topology.CPU{Arch: "x86_64", Vendor: "GenuineIntel", Family: 6, Model: 85}
	cpuSRP     = topology.CPU{Arch: "x86_64", Vendor: "GenuineIntel", Family: 6, Model: 143}
	cpuAMD     = topology.CPU{Arch: "x86_64", Vendor: "AuthenticAMD", Family: 23, Model: 49}
	cpuTurin   = topology.CPU{Arch: "x86_64", Vendor: "AuthenticAMD", Family: 0x1A, Model: 0x02}
	cpuARM     = topology.CPU{Arch: "arm64"}
	cpuZhaoxin = topology.CPU{Arch: "x86_64", Vendor: "CentaurHauls", Family: 7, Model: 0x3B}
)

// NCCL's P2P level by release, CPU, GPUs of the communicator on the node
// and NCCL_P2P_LEVEL (src/graph/paths.cc at 2.20 and 2.23).
func TestP2PLevel(t *testing.T) {
	t.Parallel()
	t223, err := TuningFor("2.23.4")
	if err != nil {
		t.Fatal(err)
	}
	t220phb, err := DefaultTuning.WithP2PLevel("", "PHB")
	if err != nil {
		t.Fatal(err)
	}
	t223off, err := t223.WithP2PLevel("1", "SYS")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		tun  *Tuning
		cpu  topology.CPU
		gpus int
		want topology.Class
	}{
		{"2.20 unknown cpu", DefaultTuning, cpuUnknown, 8, topology.SYS},
		{"2.20 intel", DefaultTuning, cpuSKL, 2, topology.PXB},
		{"2.20 intel broadwell", DefaultTuning, cpuBDW, 8, topology.PXB},
		{"2.20 amd", DefaultTuning, cpuAMD, 8, topology.SYS},
		{"2.20 arm", DefaultTuning, cpuARM, 2, topology.PXB},
		{"2.20 zhaoxin", DefaultTuning, cpuZhaoxin, 2, topology.PXB},
		{"2.23 unknown cpu", t223, cpuUnknown, 2, topology.PXB},
		{"2.23 intel", t223, cpuSRP, 2, topology.PXB},
		{"2.23 amd two gpus", t223, cpuAMD, 2, topology.SYS},
		{"2.23 amd four gpus", t223, cpuAMD, 4, topology.PXB},
		{"2.23 amd turin two gpus", t223, cpuTurin, 2, topology.SYS},
		{"2.23 amd turin eight gpus", t223, cpuTurin, 8, topology.PXB},
		{"2.20 amd naples", DefaultTuning, topology.CPU{Arch: "x86_64", Vendor: "AuthenticAMD", Family: 0x17, Model: 0x01}, 8, topology.SYS},
		{"NCCL_P2P_LEVEL=PHB on intel", t220phb, cpuSKL, 8, topology.NODE},
		{"NCCL_P2P_DISABLE=1 wins over the level", t223off, cpuAMD, 2, topology.Self},
	} {
		if got := p2pLevel(tc.tun, tc.cpu, tc.gpus); got != tc.want {
			t.Errorf("%s: level %s, want %s", tc.name, got, tc.want)
		}
	}
}

func TestP2PLevelFromEnv(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		disable, level string
		want           topology.Class
		bad            bool
	}{
		{"", "", topology.Unknown, false},
		{"0", "", topology.Unknown, false},
		{"1", "", topology.Self, false},
		{"1", "SYS", topology.Self, false},
		{"", "LOC", topology.Self, false},
		{"", "NVL", topology.NV, false},
		{"", "NVB", topology.NVB, false},
		{"", "PIX", topology.PIX, false},
		{"", "PXB", topology.PXB, false},
		{"", "PXN", topology.PXB, false},
		{"", "PHB", topology.NODE, false},
		{"", "SYS", topology.SYS, false},
		// Old-style numbers: 0 LOC, 1 PIX, 2 PXB, 3 PHB, 4 and 5 SYS, more is 5.
		{"", "0", topology.Self, false},
		{"", "1", topology.PIX, false},
		{"", "3", topology.NODE, false},
		{"", "9", topology.SYS, false},
		{"yes", "", topology.Unknown, true},
		{"", "NODE", topology.Unknown, true},
	} {
		got, err := P2PLevelFromEnv(tc.disable, tc.level)
		if (err != nil) != tc.bad || got != tc.want {
			t.Errorf("disable %q level %q: %s, %v; want %s (error %v)", tc.disable, tc.level, got, err, tc.want, tc.bad)
		}
	}
}

// A pair across the sockets of a PCIe Gen3 server: NCCL joins it by P2P
// or SHM by its CPU, and the inter-socket link gets NCCL's figure for the
// CPU. Hand figures: the GPU link 12.6 GB/s (15.75 x EffPCIe), 9.45 of it
// through host memory (SHMShare); the socket link's figure as it is.
func TestTransportAcrossSockets(t *testing.T) {
	t.Parallel()
	pcie := 15.75 * EffPCIe
	sys := func(a, b int) topology.Class { return topology.SYS }
	for _, tc := range []struct {
		name       string
		cpu        topology.CPU
		busbw      float64
		bottleneck string
	}{
		// No CPU: P2P, the socket link at its UPI default (16.6) is not
		// the bottleneck: the model as before it read CPUs.
		{"unknown cpu: p2p", cpuUnknown, pcie, "pcie:n-0:0:tx"},
		// AMD Rome (2.20: SYS): P2P, socket link 128 at line rate.
		{"amd: p2p", cpuAMD, pcie, "pcie:n-0:0:tx"},
		// Intel Skylake: SHM, socket link 10.
		{"skylake: shm", cpuSKL, pcie * SHMShare, "pcie:n-0:0:tx"},
		// Intel Broadwell: SHM, socket link 6 below the GPU link's 9.45.
		{"broadwell: shm, socket link", cpuBDW, 6, "smp:n-0:tx"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			n := nodes(NodeSpec{Name: "n", GPUs: 2, Model: "Tesla-P100-PCIE", PCIeGen: 3, PCIePath: sys, CPU: tc.cpu}, 1)[0]
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

// fourASocket is the PCIe path of a node of two sockets, four GPUs each.
func fourASocket(a, b int) topology.Class {
	if a/4 != b/4 {
		return topology.SYS
	}
	return topology.NODE
}

// A ring over two sockets of four GPUs each crosses the socket link once
// each way: on Skylake its 10 GB/s each way, not the GPU links' 9.45, are
// what every channel shares, and the ring is as fast as the slower.
func TestRingAcrossSocketLink(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		cpu   topology.CPU
		busbw float64
		link  string // the bottleneck's name starts so
	}{
		{cpuSKL, 15.75 * EffPCIe * SHMShare, "pcie:"}, // SHM everywhere (PXB level), GPU links bound
		{cpuBDW, 6, "smp:"},
		{cpuAMD, 15.75 * EffPCIe, "pcie:"}, // P2P, Rome's socket link 128 at line rate
	} {
		ringBound(t, NodeSpec{Name: "n", GPUs: 8, Model: "Tesla-V100-PCIE", PCIeGen: 3, PCIePath: fourASocket, CPU: tc.cpu}, tc.busbw, tc.link)
	}
}

// ringBound checks an 8 GiB ring all_reduce over the node's GPUs: its
// busbw within 2% of busbw, its bottleneck a link whose name starts with
// link.
func ringBound(t *testing.T, spec NodeSpec, busbw float64, link string) {
	t.Helper()
	n := nodes(spec, 1)[0]
	r, err := Predict(Placement{Ranks: NodeRanks(n)}, AllReduce, 8<<30, Options{Algorithm: Ring})
	if err != nil {
		t.Fatal(err)
	}
	if math.Abs(r.BusBWGBps-busbw)/busbw > 0.02 || !strings.HasPrefix(r.Bottleneck, link) {
		t.Errorf("%s: busbw %.2f GB/s bound by %s, want %.2f by %s*", spec.CPU.Kind(), r.BusBWGBps, r.Bottleneck, busbw, link)
	}
}

// An AMD socket link is priced by its generation's xGMI (line rate, at
// the PCIe efficiency): on Rome/Milan (128 GB/s each way) and Genoa/Turin
// (256) a ring of 8 GPUs, four a socket, is bound by the GPUs' own PCIe
// links, as the 8x RTX 5090 Turin host measures (43.9 GB/s busbw at 128
// MiB, above the 16 GB/s of NCCL's AMD_BW, which priced every AMD CPU
// before). An AMD CPU of no known generation (Naples) keeps NCCL's
// figure: 16 GB/s each way through the socket link bounds the ring.
func TestAMDSocketLinkByGeneration(t *testing.T) {
	t.Parallel()
	amd := func(family, model int) topology.CPU {
		return topology.CPU{Arch: "x86_64", Vendor: "AuthenticAMD", Family: family, Model: model}
	}
	for _, tc := range []struct {
		name  string
		cpu   topology.CPU
		gen   int
		busbw float64
		link  string // the bottleneck's name starts so
	}{
		{"naples gen3", amd(0x17, 0x01), 3, 15.75 * EffPCIe, "pcie:"}, // 12.6 under NCCL's 16
		{"naples gen5", amd(0x17, 0x01), 5, 16, "smp:"},
		{"rome gen4", amd(0x17, 0x31), 4, 31.5 * EffPCIe, "pcie:"},
		{"milan gen4", amd(0x19, 0x01), 4, 31.5 * EffPCIe, "pcie:"},
		{"genoa gen5", amd(0x19, 0x11), 5, 63 * EffPCIe, "pcie:"},
		{"turin gen5", amd(0x1A, 0x02), 5, 63 * EffPCIe, "pcie:"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ringBound(t, NodeSpec{Name: "n", GPUs: 8, Model: "RTX-5090", PCIeGen: tc.gen, PCIePath: fourASocket, CPU: tc.cpu}, tc.busbw, tc.link)
		})
	}
}

// The 8x RTX 5090 Turin host's all_reduce (43.9 GB/s busbw at 128 MiB)
// fits to a calibration: with NCCL's AMD_BW as the socket link's figure
// (35 GB/s at line rate in the ring's links) the fit refused it, busbw
// above what the links could carry.
func TestTurinHostCalibrates(t *testing.T) {
	t.Parallel()
	c, meas := caseLarge(t, "rtx5090-8gpu-2socket-turin")
	p := c.Build()
	cal, err := FitCalibration(c.Name, []Sample{{Placement: p, Collective: c.Collective, Algorithm: c.Algorithm, Bytes: c.Large[0].Bytes, BusBWGBps: meas, Source: c.File}}, nil)
	if err != nil {
		t.Fatalf("refused: %v", err)
	}
	if err := cal.Validate(); err != nil {
		t.Fatalf("the fit is refused: %v", err)
	}
	r, err := Predict(p, c.Collective, c.Large[0].Bytes, Options{Algorithm: c.Algorithm, Candidates: NCCLAlgorithms})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(r.Bottleneck, "pcie:") {
		t.Errorf("predicted %.2f GB/s bound by %s, want the GPUs' PCIe links", r.BusBWGBps, r.Bottleneck)
	}
}

// NCCL_P2P_DISABLE=1 on a PCIe switch pair is the pair without P2P: both
// go through host memory on the switch's uplink.
func TestP2PDisabledIsSHM(t *testing.T) {
	t.Parallel()
	off, err := DefaultTuning.WithP2PLevel("1", "")
	if err != nil {
		t.Fatal(err)
	}
	plain := nodes(NodeSpec{Name: "n", GPUs: 2, Model: "RTX-2080-Ti", PCIeGen: 3}, 1)[0]
	ns := nodes(NodeSpec{Name: "n", GPUs: 2, Model: "RTX-2080-Ti", PCIeGen: 3, NoP2P: true}, 1)[0]
	for _, size := range []float64{1 << 20, 1 << 30} {
		a, err := Predict(Placement{Ranks: NodeRanks(plain)}, AllReduce, size, Options{Tuning: off})
		if err != nil {
			t.Fatal(err)
		}
		b, err := Predict(Placement{Ranks: NodeRanks(ns)}, AllReduce, size, Options{})
		if err != nil {
			t.Fatal(err)
		}
		if a.BusBWGBps != b.BusBWGBps || a.Bottleneck != b.Bottleneck || a.Bottleneck != "host:n-0:tx" {
			t.Errorf("%g B: disabled %.3f GB/s by %s, NS matrix %.3f by %s; want equal, by host:n-0:tx", size, a.BusBWGBps, a.Bottleneck, b.BusBWGBps, b.Bottleneck)
		}
	}
}

// Bridged NVLink: the GA102 boards' four links run at 112.5/8 GB/s each
// way, not NVLink 3's 25.
func TestNVLinkPerLinkOf(t *testing.T) {
	t.Parallel()
	for model, want := range map[string]float64{
		"NVIDIA RTX A6000": 14.0625, "NVIDIA GeForce RTX 3090": 14.0625, "NVIDIA A40": 14.0625,
		"NVIDIA RTX A4000": 0, "NVIDIA A100-PCIE-40GB": 0, "NVIDIA L40S": 0, "NVIDIA H100 PCIe": 0,
	} {
		if got := nvLinkPerLinkOf(model); got != want {
			t.Errorf("%s: %g GB/s per link, want %g", model, got, want)
		}
	}
	nv4 := func(a, b int) topology.Class { return topology.NV }
	n := nodes(NodeSpec{Name: "n", GPUs: 2, Model: "NVIDIA RTX A6000", NVLinkGen: 3, PCIeGen: 4, PCIePath: nv4}, 1)[0]
	for a := range n.GPUPaths {
		for b := range n.GPUPaths[a] {
			if a != b {
				n.GPUPaths[a][b].NVLinks = 4
			}
		}
	}
	r, err := Predict(Placement{Ranks: NodeRanks(n)}, AllReduce, 8<<30, Options{Algorithm: Ring})
	if err != nil {
		t.Fatal(err)
	}
	if want := 4 * 14.0625 * EffNVLink; math.Abs(r.BusBWGBps-want)/want > 0.01 {
		t.Errorf("bridged A6000 pair: busbw %.2f GB/s bound by %s, want %.2f", r.BusBWGBps, r.Bottleneck, want)
	}
}
