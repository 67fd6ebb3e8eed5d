//go:build nvml && cgo

package nvml

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh200"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/internal/topology"
)

// noAncestor fails the test if NVML's common ancestor is asked for: on an
// NVLink machine every pair must come out NV# without it.
func noAncestor(t *testing.T) func(i, j int) (nvml.GpuTopologyLevel, nvml.Return) {
	return func(i, j int) (nvml.GpuTopologyLevel, nvml.Return) {
		t.Errorf("common ancestor of GPU%d and GPU%d asked for", i, j)
		return nvml.TOPOLOGY_SYSTEM, nvml.SUCCESS
	}
}

func discover(t *testing.T, srv *server.Server, f *fakeSys) *topology.Node {
	t.Helper()
	n, err := Discover(srv, Options{NodeName: "n1", SysfsRoot: f.root})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Validate(); err != nil {
		t.Fatal(err)
	}
	return n
}

// checkGPUs checks what every mock gives: count, UUIDs, bus ids, model.
func checkGPUs(t *testing.T, n *topology.Node, srv *server.Server, model string, mib int) {
	t.Helper()
	if n.Name != "n1" || n.Source != "nvml" {
		t.Errorf("name %q source %q", n.Name, n.Source)
	}
	if len(n.GPUs) != 8 {
		t.Fatalf("%d GPUs, want 8", len(n.GPUs))
	}
	for i, g := range n.GPUs {
		dev := srv.Devices[i].(*server.Device)
		if g.Index != i || g.UUID != dev.UUID || !strings.HasPrefix(g.UUID, "GPU-") {
			t.Errorf("GPU%d: index %d uuid %q, want %q", i, g.Index, g.UUID, dev.UUID)
		}
		if g.BusID != gpuBus(i) {
			t.Errorf("GPU%d: bus id %q, want %q", i, g.BusID, gpuBus(i))
		}
		if g.Model != model || g.MemoryMiB != mib {
			t.Errorf("GPU%d: %q %d MiB, want %q %d MiB", i, g.Model, g.MemoryMiB, model, mib)
		}
		if want := i / 4; g.NUMA != want {
			t.Errorf("GPU%d: NUMA %d, want %d", i, g.NUMA, want)
		}
		if want := cpuList(i / 4); g.CPUAffinity != want {
			t.Errorf("GPU%d: CPU affinity %q, want %q", i, g.CPUAffinity, want)
		}
	}
}

// checkGPUPaths checks every GPU pair against want(i, j).
func checkGPUPaths(t *testing.T, n *topology.Node, want func(i, j int) string) {
	t.Helper()
	for i, row := range n.GPUPaths {
		for j, l := range row {
			w := "X"
			if i != j {
				w = want(i, j)
			}
			if l.String() != w {
				t.Errorf("GPU%d-GPU%d = %s, want %s", i, j, l, w)
			}
		}
	}
}

// checkNICs checks the fake host's NICs, their paths, and each GPU's
// nearest NIC.
func checkNICs(t *testing.T, n *topology.Node, rate float64) {
	t.Helper()
	want := []topology.NIC{
		{Index: 0, Name: "mlx5_0", BusID: "0000:05:00.0", RateGbps: rate, RDMA: true, NUMA: 0},
		{Index: 1, Name: "mlx5_1", BusID: "0000:25:00.0", RateGbps: rate, RDMA: true, NUMA: 0},
		{Index: 2, Name: "mlx5_2", BusID: "0000:85:00.0", RateGbps: rate, RDMA: true, NUMA: 1},
		{Index: 3, Name: "mlx5_3", BusID: "0000:a5:00.0", RateGbps: rate, RDMA: true, NUMA: 1},
		{Index: 4, Name: "mlx5_4", BusID: "0000:08:00.0", RateGbps: 100, RDMA: true, NUMA: 0},
		{Index: 5, Name: "mlx5_5", BusID: "0000:09:00.0", RateGbps: 25, RDMA: true, NUMA: 0},
	}
	if len(n.NICs) != len(want) {
		t.Fatalf("NICs %+v", n.NICs)
	}
	for k := range want {
		if n.NICs[k] != want[k] {
			t.Errorf("NIC%d = %+v, want %+v", k, n.NICs[k], want[k])
		}
	}
	for i, row := range n.NICPaths {
		var got []string
		for _, l := range row {
			got = append(got, l.String())
		}
		if s := strings.Join(got, " "); s != hostNICPaths[i/2] {
			t.Errorf("GPU%d NICs: %s, want %s", i, s, hostNICPaths[i/2])
		}
		if k := n.NearestNIC(i); k != i/2 {
			t.Errorf("GPU%d: nearest NIC %d, want %d", i, k, i/2)
		}
	}
}

// A DGX A100: each GPU's 12 NVLinks run to 6 NVSwitches, two to each;
// NVML types the far ends as switches and reports NVLink 3.0.
func TestDiscoverDGXA100(t *testing.T) {
	t.Parallel()
	srv := dgxa100.New()
	wire(srv, fabric{
		links: 12,
		link: func(i, l int) link {
			return link{up: true, remote: fmt.Sprintf("0000:%02x:00.0", 0xc4+l/2), typ: nvml.NVLINK_DEVICE_TYPE_SWITCH, typed: true, version: uint32(nvml.NVLINK_VERSION_3_0)}
		},
		ancestor: noAncestor(t),
		numa:     func(i int) int { return i / 4 },
		affinity: func(i int) []uint { return cpuMask(i / 4) },
	})
	srv.Devices[5].(*server.Device).MigMode = nvml.DEVICE_MIG_ENABLE
	n := discover(t, srv, host(t, false, "200 Gb/sec (4X HDR)"))

	checkGPUs(t, n, srv, "Mock NVIDIA A100-SXM4-40GB", 40960)
	checkGPUPaths(t, n, func(i, j int) string { return "NV12" })
	checkNICs(t, n, 200)
	if n.NVSwitches != 6 || n.NVLinkGen != 3 {
		t.Errorf("NVSwitches %d NVLinkGen %d, want 6 and 3", n.NVSwitches, n.NVLinkGen)
	}
	for i, g := range n.GPUs {
		if g.MIG != (i == 5) {
			t.Errorf("GPU%d: MIG %v", i, g.MIG)
		}
	}
	if p := n.Path(0, 7, nil); p.BandwidthGBps != 300 {
		t.Errorf("GPU0-GPU7: %v GB/s, want 300 (12 NVLink 3 links)", p.BandwidthGBps)
	}
	if len(n.Warnings) != 0 {
		t.Errorf("warnings: %q", n.Warnings)
	}
	var buf bytes.Buffer
	if err := topology.WriteMatrix(&buf, n, nil); err != nil {
		t.Fatal(err)
	}
	t.Logf("\n%s", buf.String())
	for _, want := range []string{"GPU0  X     NV12", "GPU7: NUMA 1, nearest NIC mlx5_3 (NIC3, PIX)"} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("matrix lacks %q", want)
		}
	}
}

// An HGX H100/H200: 18 NVLinks per GPU to 4 NVSwitches (5+4+4+5); this
// NVML types no far end and gives no NVLink version, NUMA node or CPU
// affinity, so the switches are known as "not a GPU of this node", the
// generation comes from the architecture, and NUMA and CPUs from sysfs.
func TestDiscoverHGXH100(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		srv   *server.Server
		model string
		mib   int
	}{
		{"dgxh100", dgxh100.New(), "NVIDIA H100 80GB HBM3", 81920},
		{"dgxh200", dgxh200.New(), "NVIDIA H200 141GB HBM3e", 144384},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			switchOf := []int{0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 3}
			wire(tc.srv, fabric{
				links: 18,
				link: func(i, l int) link {
					return link{up: true, remote: fmt.Sprintf("0000:%02x:00.0", 0xe0+switchOf[l])}
				},
				ancestor: noAncestor(t),
			})
			n := discover(t, tc.srv, host(t, true, "400 Gb/sec (4X NDR)"))

			checkGPUs(t, n, tc.srv, tc.model, tc.mib)
			checkGPUPaths(t, n, func(i, j int) string { return "NV18" })
			checkNICs(t, n, 400)
			if n.NVSwitches != 4 || n.NVLinkGen != 4 {
				t.Errorf("NVSwitches %d NVLinkGen %d, want 4 and 4", n.NVSwitches, n.NVLinkGen)
			}
			if p := n.Path(2, 5, nil); p.BandwidthGBps != 450 {
				t.Errorf("GPU2-GPU5: %v GB/s, want 450", p.BandwidthGBps)
			}
		})
	}
}

// A PCIe-only box: no NVLink; NVML's common ancestors give the classes,
// and where it has none (GPU0-GPU2) sysfs does.
func TestDiscoverPCIeOnly(t *testing.T) {
	t.Parallel()
	srv := dgxa100.New()
	wire(srv, fabric{
		ancestor: func(i, j int) (nvml.GpuTopologyLevel, nvml.Return) {
			switch {
			case i == 0 && j == 2:
				return 0, nvml.ERROR_NOT_SUPPORTED
			case i/2 == j/2:
				return nvml.TOPOLOGY_SINGLE, nvml.SUCCESS
			case i/4 == j/4:
				return nvml.TOPOLOGY_MULTIPLE, nvml.SUCCESS
			}
			return nvml.TOPOLOGY_SYSTEM, nvml.SUCCESS
		},
		numa:     func(i int) int { return i / 4 },
		affinity: func(i int) []uint { return cpuMask(i / 4) },
	})
	n := discover(t, srv, host(t, false, "200 Gb/sec (4X HDR)"))

	checkGPUs(t, n, srv, "Mock NVIDIA A100-SXM4-40GB", 40960)
	checkGPUPaths(t, n, func(i, j int) string {
		switch {
		case min(i, j) == 0 && max(i, j) == 2:
			return "NODE" // from sysfs: root complexes 00 and 20, NUMA 0
		case i/2 == j/2:
			return "PIX"
		case i/4 == j/4:
			return "PXB"
		}
		return "SYS"
	})
	checkNICs(t, n, 200)
	if n.NVSwitches != 0 || n.NVLinkGen != 0 {
		t.Errorf("NVSwitches %d NVLinkGen %d, want 0 and 0", n.NVSwitches, n.NVLinkGen)
	}
	if len(n.Warnings) != 1 || !strings.Contains(n.Warnings[0], "no common ancestor for (ERROR_NOT_SUPPORTED), classified from the PCI tree") {
		t.Errorf("warnings: %q", n.Warnings)
	}
}

// NVML's P2P statuses, read and write, make the P2P matrix as
// nvidia-smi topo -p2p prints it: consumer cards with P2P only under each
// switch, a pair whose write status alone is off, a pair NVML does not
// answer for. Without GetP2PStatus the matrix is nil (TestDiscoverStockMock).
func TestDiscoverP2PStatus(t *testing.T) {
	t.Parallel()
	srv := dgxa100.New()
	wire(srv, fabric{
		ancestor: func(i, j int) (nvml.GpuTopologyLevel, nvml.Return) {
			if i/2 == j/2 {
				return nvml.TOPOLOGY_SINGLE, nvml.SUCCESS
			}
			return nvml.TOPOLOGY_SYSTEM, nvml.SUCCESS
		},
		numa:     func(i int) int { return i / 4 },
		affinity: func(i int) []uint { return cpuMask(i / 4) },
		p2p: func(i, j int, idx nvml.GpuP2PCapsIndex) (nvml.GpuP2PStatus, nvml.Return) {
			switch {
			case min(i, j) == 6 && max(i, j) == 7:
				return 0, nvml.ERROR_NOT_SUPPORTED
			case min(i, j) == 4 && max(i, j) == 5 && idx == nvml.P2P_CAPS_INDEX_WRITE:
				return nvml.P2P_STATUS_DISABLED_BY_REGKEY, nvml.SUCCESS
			case i/2 == j/2:
				return nvml.P2P_STATUS_OK, nvml.SUCCESS
			case i/4 != j/4:
				return nvml.P2P_STATUS_IOH_TOPOLOGY_NOT_SUPPORTED, nvml.SUCCESS
			}
			return nvml.P2P_STATUS_NOT_SUPPORTED, nvml.SUCCESS
		},
	})
	n := discover(t, srv, host(t, false, "200 Gb/sec (4X HDR)"))
	for i := range 8 {
		for j := range 8 {
			want := topology.P2PNotSupported
			switch {
			case i == j:
				want = topology.P2PSelf
			case i/2 == 3 && j/2 == 3:
				want = topology.P2PUnknown
			case i/2 == 2 && j/2 == 2:
				want = topology.P2PDisabledByRegkey
			case i/2 == j/2:
				want = topology.P2POK
			case i/4 != j/4:
				want = topology.P2PTopologyNotSupported
			}
			if got := n.P2P[i][j]; got != want {
				t.Errorf("GPU%d-GPU%d: %s, want %s", i, j, got, want)
			}
		}
	}
}

// NVLink bridges, no switch: GPUs 2k and 2k+1 share 4 direct links (links
// 4-11 are down); the other pairs go over PCIe.
func TestDiscoverNVLinkBridges(t *testing.T) {
	t.Parallel()
	srv := dgxa100.New()
	wire(srv, fabric{
		links: 12,
		link: func(i, l int) link {
			return link{up: l < 4, remote: gpuBus(i ^ 1), typ: nvml.NVLINK_DEVICE_TYPE_GPU, typed: true}
		},
		ancestor: func(i, j int) (nvml.GpuTopologyLevel, nvml.Return) {
			if i/2 == j/2 {
				t.Errorf("common ancestor of NVLink peers GPU%d and GPU%d asked for", i, j)
			}
			if i/4 == j/4 {
				return nvml.TOPOLOGY_NODE, nvml.SUCCESS
			}
			return nvml.TOPOLOGY_SYSTEM, nvml.SUCCESS
		},
		numa:     func(i int) int { return i / 4 },
		affinity: func(i int) []uint { return cpuMask(i / 4) },
	})
	n := discover(t, srv, host(t, false, "200 Gb/sec (4X HDR)"))

	checkGPUPaths(t, n, func(i, j int) string {
		switch {
		case i/2 == j/2:
			return "NV4"
		case i/4 == j/4:
			return "NODE"
		}
		return "SYS"
	})
	if n.NVSwitches != 0 || n.NVLinkGen != 3 {
		t.Errorf("NVSwitches %d NVLinkGen %d, want 0 and 3 (Ampere)", n.NVSwitches, n.NVLinkGen)
	}
	if p := n.Path(0, 1, nil); p.BandwidthGBps != 100 {
		t.Errorf("GPU0-GPU1: %v GB/s, want 100", p.BandwidthGBps)
	}
}

// go-nvml's mock as it comes: no bus ids, no fabric. Discover must not
// panic on the unset mock methods, and must say what it lacks.
func TestDiscoverStockMock(t *testing.T) {
	t.Parallel()
	srv := dgxa100.New()
	n, err := Discover(srv, Options{NodeName: "n1", SysfsRoot: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Validate(); err != nil {
		t.Fatal(err)
	}
	if len(n.GPUs) != 8 || n.GPUs[0].NUMA != -1 || n.GPUs[0].BusID != "" {
		t.Errorf("GPUs %+v", n.GPUs)
	}
	if n.GPUPaths[0][1].Class != topology.Unknown || len(n.NICs) != 0 || n.NICPaths != nil || n.P2P != nil {
		t.Errorf("paths %v NICs %v %v P2P %v", n.GPUPaths[0], n.NICs, n.NICPaths, n.P2P)
	}
	all := strings.Join(n.Warnings, "\n")
	for _, want := range []string{"GPU0: NVML gives no PCI bus id", "left unknown", "no RDMA NICs"} {
		if !strings.Contains(all, want) {
			t.Errorf("warnings lack %q:\n%s", want, all)
		}
	}
}

func TestNoLibrary(t *testing.T) {
	t.Parallel()
	lib := nvml.New(nvml.WithLibraryPath("/nonexistent/libnvidia-ml.so.1"))
	_, err := Discover(lib, Options{})
	if !errors.Is(err, ErrNVMLNotAvailable) {
		t.Fatalf("Discover: %v", err)
	}
	if want := "NVML not available: libnvidia-ml.so.1 not found; this node has no NVIDIA driver"; err.Error() != want {
		t.Errorf("error %q, want %q", err, want)
	}
	if err := WatchHealth(t.Context(), lib, &topology.Node{}, func(events.TopologyHealth) {}); !errors.Is(err, ErrNVMLNotAvailable) {
		t.Errorf("WatchHealth: %v", err)
	}
	// The system library: missing here, where a driver is it must work.
	if _, err := Discover(Library(), Options{}); err != nil && !errors.Is(err, ErrNVMLNotAvailable) {
		t.Errorf("Discover(Library()): %v", err)
	}
}
