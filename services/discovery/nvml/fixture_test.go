//go:build nvml && cgo

package nvml

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
)

// fakeSys builds a sysfs tree under a temporary root, with relative
// symlinks as the kernel makes them.
type fakeSys struct {
	t    *testing.T
	root string
}

func newFakeSys(t *testing.T, numaNodes int) *fakeSys {
	t.Helper()
	f := &fakeSys{t: t, root: t.TempDir()}
	for _, d := range []string{"sys/devices", "sys/bus/pci/devices", "sys/class/infiniband"} {
		f.mkdir(d)
	}
	for n := range numaNodes {
		f.mkdir(fmt.Sprintf("sys/devices/system/node/node%d", n))
	}
	return f
}

func (f *fakeSys) mkdir(rel string) string {
	f.t.Helper()
	p := filepath.Join(f.root, rel)
	if err := os.MkdirAll(p, 0o755); err != nil {
		f.t.Fatal(err)
	}
	return p
}

func (f *fakeSys) write(rel, content string) {
	f.t.Helper()
	p := filepath.Join(f.root, rel)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		f.t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content+"\n"), 0o644); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fakeSys) symlink(target, rel string) {
	f.t.Helper()
	p := filepath.Join(f.root, rel)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		f.t.Fatal(err)
	}
	if err := os.Symlink(target, p); err != nil {
		f.t.Fatal(err)
	}
}

// pci adds a PCI device at path (below /sys/devices, "pci0000:00/0000:00:01.1/...")
// with its NUMA node (numa < -1: no numa_node file) and returns its bus id.
func (f *fakeSys) pci(path string, numa int) string {
	f.t.Helper()
	f.mkdir("sys/devices/" + path)
	bus := filepath.Base(path)
	if numa >= -1 {
		f.write("sys/devices/"+path+"/numa_node", fmt.Sprint(numa))
	}
	f.symlink("../../../devices/"+path, "sys/bus/pci/devices/"+bus)
	return bus
}

// ib adds an RDMA device on the PCI device at path.
func (f *fakeSys) ib(name, path string, numa int, rate string) {
	f.t.Helper()
	bus := f.pci(path, numa)
	dev := "sys/devices/" + path + "/infiniband/" + name
	f.write(dev+"/ports/1/rate", rate)
	f.symlink("../../../"+bus, dev+"/device")
	f.symlink("../../devices/"+path+"/infiniband/"+name, "sys/class/infiniband/"+name)
}

// The fake host: two NUMA nodes, four root complexes (0000:00 and 0000:20
// on node 0, 0000:80 and 0000:a0 on node 1), each with a PCIe switch that
// holds two GPUs and one NIC (mlx5_0..3). Root complex 0000:00 also has
// mlx5_4 two switches down (PXB to GPU0/1) and mlx5_5 on a root port of
// its own (PHB to GPU0/1).
var rootBuses = []int{0x00, 0x20, 0x80, 0xa0}

// gpuBus is the bus id of GPU i on the fake host.
func gpuBus(i int) string {
	return fmt.Sprintf("0000:%02x:00.0", rootBuses[i/2]+3+i%2)
}

func switchPath(rc int) string {
	b := rootBuses[rc]
	return fmt.Sprintf("pci0000:%02x/0000:%02x:01.1/0000:%02x:00.0", b, b, b+1)
}

// host builds the fake host; gpuNUMA says whether the GPUs' numa_node and
// local_cpulist files are there (when not, NVML's answers are used).
func host(t *testing.T, gpuNUMA bool, rate string) *fakeSys {
	f := newFakeSys(t, 2)
	for rc, b := range rootBuses {
		numa := rc / 2
		for k := range 2 {
			n := -1
			if gpuNUMA {
				n = numa
			}
			path := fmt.Sprintf("%s/0000:%02x:%02x.0/%s", switchPath(rc), b+2, k, gpuBus(rc*2+k))
			f.pci(path, n)
			if gpuNUMA {
				f.write("sys/devices/"+path+"/local_cpulist", cpuList(numa))
			}
		}
		f.ib(fmt.Sprintf("mlx5_%d", rc), fmt.Sprintf("%s/0000:%02x:02.0/0000:%02x:00.0", switchPath(rc), b+2, b+5), numa, rate)
	}
	f.ib("mlx5_4", switchPath(0)+"/0000:02:03.0/0000:06:00.0/0000:07:00.0/0000:08:00.0", 0, "100 Gb/sec (4X EDR)")
	f.ib("mlx5_5", "pci0000:00/0000:00:03.1/0000:09:00.0", 0, "25 Gb/sec (1X EDR)")
	return f
}

// cpuList is NUMA node n's CPUs on the fake host: 32 cores, 2 threads each.
func cpuList(n int) string {
	return fmt.Sprintf("%d-%d,%d-%d", n*32, n*32+31, 64+n*32, 64+n*32+31)
}

// cpuMask is cpuList(n) as NVML's mask.
func cpuMask(n int) []uint {
	w := uint(0xFFFFFFFF) << (32 * uint(n))
	return []uint{w, w}
}

// Expected GPU×NIC classes on the fake host, by GPU pair (0-1, 2-3...).
var hostNICPaths = [4]string{
	"PIX NODE SYS SYS PXB PHB",
	"NODE PIX SYS SYS NODE NODE",
	"SYS SYS PIX NODE SYS SYS",
	"SYS SYS NODE PIX SYS SYS",
}

// busInfo is a PciInfo as NVML fills it: 8-digit domain, upper case.
func busInfo(bus string, deviceID uint32) nvml.PciInfo {
	var p nvml.PciInfo
	var dom, b, d, fn uint32
	if _, err := fmt.Sscanf(bus, "%x:%x:%x.%d", &dom, &b, &d, &fn); err != nil {
		panic(err)
	}
	s := strings.ToUpper(fmt.Sprintf("%08x:%02x:%02x.%d", dom, b, d, fn))
	for i := range len(s) {
		p.BusId[i] = int8(s[i])
	}
	legacy := strings.ToUpper(fmt.Sprintf("%04x:%02x:%02x.%d", dom, b, d, fn))
	for i := range len(legacy) {
		p.BusIdLegacy[i] = int8(legacy[i])
	}
	p.Domain, p.Bus, p.Device, p.PciDeviceId = dom, b, d, deviceID
	return p
}

// link is one NVLink's far end as the fake fabric reports it.
type link struct {
	up      bool
	remote  string                   // bus id
	typ     nvml.IntNvLinkDeviceType // reported when typed
	typed   bool
	version uint32 // 0: GetNvLinkVersion left unmocked
}

// fabric is what go-nvml's mock server lacks: how the GPUs are wired.
type fabric struct {
	links    int                 // NVLinks per GPU; 0: NVLink not supported
	link     func(i, l int) link // link l of GPU i
	ancestor func(i, j int) (nvml.GpuTopologyLevel, nvml.Return)
	numa     func(i int) int // nil: GetNumaNodeId left unmocked
	affinity func(i int) []uint
	// p2p is GPU i's P2P status to GPU j (nil: GetP2PStatus unmocked).
	p2p func(i, j int, idx nvml.GpuP2PCapsIndex) (nvml.GpuP2PStatus, nvml.Return)
}

// wire injects the fabric into the mock server's devices, and gives each
// GPU the fake host's bus id.
func wire(srv *server.Server, fab fabric) {
	pos := map[nvml.Device]int{}
	for i, d := range srv.Devices {
		pos[d] = i
	}
	for i, d := range srv.Devices {
		dev := d.(*server.Device)
		dev.PciBusID = gpuBus(i)
		devID := dev.Config.PciDeviceId
		dev.GetPciInfoFunc = func() (nvml.PciInfo, nvml.Return) { return busInfo(gpuBus(i), devID), nvml.SUCCESS }
		dev.GetNvLinkStateFunc = func(l int) (nvml.EnableState, nvml.Return) {
			switch {
			case fab.links == 0:
				return 0, nvml.ERROR_NOT_SUPPORTED
			case l >= fab.links:
				return 0, nvml.ERROR_INVALID_ARGUMENT
			case fab.link(i, l).up:
				return nvml.FEATURE_ENABLED, nvml.SUCCESS
			}
			return nvml.FEATURE_DISABLED, nvml.SUCCESS
		}
		dev.GetNvLinkRemotePciInfoFunc = func(l int) (nvml.PciInfo, nvml.Return) {
			if l >= fab.links {
				return nvml.PciInfo{}, nvml.ERROR_INVALID_ARGUMENT
			}
			return busInfo(fab.link(i, l).remote, 0), nvml.SUCCESS
		}
		if fab.links > 0 && fab.link(i, 0).typed {
			dev.GetNvLinkRemoteDeviceTypeFunc = func(l int) (nvml.IntNvLinkDeviceType, nvml.Return) {
				return fab.link(i, l).typ, nvml.SUCCESS
			}
		}
		if fab.links > 0 && fab.link(i, 0).version != 0 {
			dev.GetNvLinkVersionFunc = func(l int) (uint32, nvml.Return) { return fab.link(i, l).version, nvml.SUCCESS }
		}
		dev.GetTopologyCommonAncestorFunc = func(other nvml.Device) (nvml.GpuTopologyLevel, nvml.Return) {
			return fab.ancestor(i, pos[other])
		}
		if fab.numa != nil {
			dev.GetNumaNodeIdFunc = func() (int, nvml.Return) { return fab.numa(i), nvml.SUCCESS }
		}
		if fab.affinity != nil {
			dev.GetCpuAffinityFunc = func(int) ([]uint, nvml.Return) { return fab.affinity(i), nvml.SUCCESS }
		}
		if fab.p2p != nil {
			dev.GetP2PStatusFunc = func(other nvml.Device, idx nvml.GpuP2PCapsIndex) (nvml.GpuP2PStatus, nvml.Return) {
				return fab.p2p(i, pos[other], idx)
			}
		}
	}
}
