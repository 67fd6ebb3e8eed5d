//go:build nvml && cgo

package nvml

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/toposched/toposched/internal/topology"
)

// Options says where Discover looks besides NVML.
type Options struct {
	// NodeName names the node; empty means the host name.
	NodeName string
	// SysfsRoot is the directory holding sys/: "" or "/" in production, a
	// fake tree in tests. NICs, the GPU×NIC paths, and the NUMA nodes and
	// CPU lists NVML does not give come from it.
	SysfsRoot string
}

// maxCPUs bounds the CPU mask asked of NVML; go-nvml sizes the mask in
// bytes per word rather than bits, so the mask holds 8× as many CPUs.
const maxCPUs = 1024

// gpu is one GPU while the node is being built.
type gpu struct {
	dev   nvml.Device
	info  topology.GPU
	chain []string // place in the PCI tree, nil when sysfs does not say
	arch  nvml.DeviceArchitecture
	pcie  int // max PCIe generation, 0 when unknown

	nvlinks     int         // links up
	direct      map[int]int // GPU position -> links straight to it
	switchLinks int         // links that end on an NVSwitch
	nvlinkGen   int         // from GetNvLinkVersion, 0 when unknown
}

type discoverer struct {
	lib  nvml.Interface
	sys  sysfs
	node *topology.Node
	gpus []*gpu
	// notes collects warnings that repeat (one per GPU pair), by text,
	// with how often they came up.
	notes map[string]int
}

// Discover builds the node's topology from NVML (lib: Library() in
// production, a go-nvml mock in tests) and sysfs. It initialises lib and
// shuts it down before returning; NVML counts initialisations, so the
// caller may hold it open too. Where the library is missing the error wraps
// ErrNVMLNotAvailable. What NVML or sysfs lacks is recorded in the node's
// Warnings, not invented; the node always passes Validate.
func Discover(lib nvml.Interface, opts Options) (*topology.Node, error) {
	if err := initLib(lib); err != nil {
		return nil, err
	}
	defer release(lib.Shutdown)

	root := opts.SysfsRoot
	if root == "" {
		root = "/"
	}
	name := opts.NodeName
	if name == "" {
		name, _ = os.Hostname()
	}
	d := &discoverer{
		lib:   lib,
		sys:   sysfs{root: root},
		node:  &topology.Node{Name: name, Source: "nvml", GPUs: []topology.GPU{}, NICs: []topology.NIC{}},
		notes: map[string]int{},
	}
	if err := d.gpusFromNVML(); err != nil {
		return nil, err
	}
	d.nvlinks()
	d.gpuPaths()
	d.p2p()
	d.nics()
	d.flushNotes()
	if err := d.node.Validate(); err != nil {
		return nil, fmt.Errorf("nvml: built an invalid node: %w", err)
	}
	return d.node, nil
}

func (d *discoverer) warnf(format string, args ...any) {
	d.node.Warnings = append(d.node.Warnings, fmt.Sprintf(format, args...))
}

func (d *discoverer) note(s string) { d.notes[s]++ }

func (d *discoverer) flushNotes() {
	keys := make([]string, 0, len(d.notes))
	for k := range d.notes {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		d.warnf("%s (%d×)", k, d.notes[k])
	}
}

func (d *discoverer) gpusFromNVML() error {
	count, ret := call(d.lib.DeviceGetCount)
	if ret != nvml.SUCCESS {
		return fmt.Errorf("nvml: device count: %w", ret)
	}
	for i := range count {
		dev, ret := call(func() (nvml.Device, nvml.Return) { return d.lib.DeviceGetHandleByIndex(i) })
		if ret != nvml.SUCCESS {
			d.warnf("GPU%d: NVML cannot open it (%v); left out", i, ret)
			continue
		}
		g := &gpu{dev: dev, direct: map[int]int{}, info: topology.GPU{Index: i, NUMA: -1}}
		d.gpuInfo(g)
		d.gpus = append(d.gpus, g)
		d.node.GPUs = append(d.node.GPUs, g.info)
	}
	// The node's PCIe generation is its slowest GPU's.
	for _, g := range d.gpus {
		if g.pcie > 0 && (d.node.PCIeGen == 0 || g.pcie < d.node.PCIeGen) {
			d.node.PCIeGen = g.pcie
		}
	}
	return nil
}

func (d *discoverer) gpuInfo(g *gpu) {
	dev, i := g.dev, g.info.Index
	if s, ret := call(dev.GetUUID); ret == nvml.SUCCESS {
		g.info.UUID = s
	} else {
		d.warnf("GPU%d: no UUID (%v)", i, ret)
	}
	if s, ret := call(dev.GetName); ret == nvml.SUCCESS {
		g.info.Model = s
	}
	if m, ret := call(dev.GetMemoryInfo); ret == nvml.SUCCESS {
		g.info.MemoryMiB = int(m.Total >> 20)
	}
	if p, ret := call(dev.GetPciInfo); ret == nvml.SUCCESS {
		g.info.BusID = pciBusID(p)
	}
	if g.info.BusID == "" {
		d.warnf("GPU%d: NVML gives no PCI bus id; its NVLink peers, NUMA node and NIC paths may be unknown", i)
	}
	if a, ret := call(dev.GetArchitecture); ret == nvml.SUCCESS {
		g.arch = a
	}
	if p, ret := call(dev.GetMaxPcieLinkGeneration); ret == nvml.SUCCESS && p > 0 {
		g.pcie = p
	}
	type mig struct{ current, pending int }
	if m, ret := call(func() (mig, nvml.Return) {
		c, p, r := dev.GetMigMode()
		return mig{c, p}, r
	}); ret == nvml.SUCCESS {
		g.info.MIG = m.current == nvml.DEVICE_MIG_ENABLE
	}

	var devDir string
	if g.info.BusID != "" {
		devDir = d.sys.path("bus", "pci", "devices", g.info.BusID)
		if chain, err := d.sys.pciChain(g.info.BusID); err == nil {
			g.chain = chain
		}
	}
	// NUMA: the PCI device's node in sysfs is the CPU side's, the one the
	// NICs' nodes compare with. NVML's GetNumaNodeId names the GPU's own
	// memory node, and only where GPU memory is a NUMA node (Grace
	// Hopper), so it is only a fallback.
	if devDir != "" {
		g.info.NUMA = d.sys.numaOf(devDir)
	}
	if g.info.NUMA < 0 {
		if n, ret := call(dev.GetNumaNodeId); ret == nvml.SUCCESS && n >= 0 {
			g.info.NUMA = n
		}
	}
	if mask, ret := call(func() ([]uint, nvml.Return) { return dev.GetCpuAffinity(maxCPUs) }); ret == nvml.SUCCESS {
		g.info.CPUAffinity = CPUList(mask)
	}
	if g.info.CPUAffinity == "" && devDir != "" {
		if b, err := os.ReadFile(filepath.Join(devDir, "local_cpulist")); err == nil {
			g.info.CPUAffinity = strings.TrimSpace(string(b))
		}
	}
}

// nvlinkGenOf maps NVML's NvlinkVersion to the NVLink generation.
func nvlinkGenOf(v uint32) int {
	switch nvml.NvlinkVersion(v) {
	case nvml.NVLINK_VERSION_1_0:
		return 1
	case nvml.NVLINK_VERSION_2_0, nvml.NVLINK_VERSION_2_2:
		return 2
	case nvml.NVLINK_VERSION_3_0, nvml.NVLINK_VERSION_3_1:
		return 3
	case nvml.NVLINK_VERSION_4_0:
		return 4
	case nvml.NVLINK_VERSION_5_0:
		return 5
	case nvml.NVLINK_VERSION_6_0:
		return 6
	}
	return 0
}

// archNVLinkGen is the NVLink generation of an architecture's data-centre
// parts, 0 where it has none.
func archNVLinkGen(a nvml.DeviceArchitecture) int {
	switch a {
	case nvml.DEVICE_ARCH_PASCAL:
		return 1
	case nvml.DEVICE_ARCH_VOLTA:
		return 2
	case nvml.DEVICE_ARCH_AMPERE:
		return 3
	case nvml.DEVICE_ARCH_HOPPER:
		return 4
	case nvml.DEVICE_ARCH_BLACKWELL:
		return 5
	}
	return 0
}

// nvlinks walks every GPU's NVLinks and counts, per GPU, the links to each
// other GPU and the links to NVSwitches.
func (d *discoverer) nvlinks() {
	byBus := map[string]int{}
	for p, g := range d.gpus {
		if g.info.BusID == "" {
			continue
		}
		if _, dup := byBus[g.info.BusID]; dup {
			d.warnf("GPUs share PCI bus id %s; NVLink peers cannot be told apart by it", g.info.BusID)
			byBus[g.info.BusID] = -1
			continue
		}
		byBus[g.info.BusID] = p
	}
	switches := map[string]bool{}
	for p, g := range d.gpus {
		for l := range nvml.NVLINK_MAX_LINKS {
			st, ret := call(func() (nvml.EnableState, nvml.Return) { return g.dev.GetNvLinkState(l) })
			if unavailable(ret) {
				break // no NVLink on this GPU, or none past this link
			}
			if ret != nvml.SUCCESS || st != nvml.FEATURE_ENABLED {
				continue
			}
			g.nvlinks++
			if g.nvlinkGen == 0 {
				if v, ret := call(func() (uint32, nvml.Return) { return g.dev.GetNvLinkVersion(l) }); ret == nvml.SUCCESS {
					g.nvlinkGen = nvlinkGenOf(v)
				}
			}
			remote := ""
			pci, pret := call(func() (nvml.PciInfo, nvml.Return) { return g.dev.GetNvLinkRemotePciInfo(l) })
			if pret == nvml.SUCCESS {
				remote = pciBusID(pci)
			}
			typ, tret := call(func() (nvml.IntNvLinkDeviceType, nvml.Return) { return g.dev.GetNvLinkRemoteDeviceType(l) })
			known := tret == nvml.SUCCESS
			peer, isGPU := byBus[remote]
			switch {
			case known && typ == nvml.NVLINK_DEVICE_TYPE_SWITCH:
				g.switchLinks++
				if remote != "" {
					switches[remote] = true
				}
			case known && typ == nvml.NVLINK_DEVICE_TYPE_IBMNPU:
				// NVLink to the CPU (POWER9): not a GPU path.
			case isGPU && peer == p:
				d.note(fmt.Sprintf("GPU%d: an NVLink whose remote end is the GPU itself; ignored", g.info.Index))
			case isGPU && peer >= 0:
				g.direct[peer]++
			case isGPU:
				d.note("NVLinks to a GPU whose bus id is shared; ignored")
			case known && typ == nvml.NVLINK_DEVICE_TYPE_GPU:
				d.note(fmt.Sprintf("NVLinks to a GPU NVML does not list (bus id %q); ignored", remote))
			default:
				// Not a GPU of this node: an NVSwitch.
				g.switchLinks++
				if remote != "" {
					switches[remote] = true
				} else {
					d.note(fmt.Sprintf("NVLinks with no remote PCI info (%v), taken to end on an NVSwitch", pret))
				}
			}
		}
	}
	up := false
	for _, g := range d.gpus {
		if g.nvlinks == 0 {
			continue
		}
		up = true
		gen := g.nvlinkGen
		if gen == 0 {
			gen = archNVLinkGen(g.arch)
		}
		d.node.NVLinkGen = max(d.node.NVLinkGen, gen)
	}
	if up && len(switches) > 0 {
		d.node.NVSwitches = len(switches)
	}
}

// topoClass maps NVML's common ancestor of two GPUs to a path class.
func topoClass(l nvml.GpuTopologyLevel) (topology.Class, bool) {
	switch l {
	case nvml.TOPOLOGY_INTERNAL:
		// Two GPUs of one board (K80, M60...): X is kept for the
		// diagonal, and they share the board's PCIe switch.
		return topology.PIX, true
	case nvml.TOPOLOGY_SINGLE:
		return topology.PIX, true
	case nvml.TOPOLOGY_MULTIPLE:
		return topology.PXB, true
	case nvml.TOPOLOGY_HOSTBRIDGE:
		return topology.PHB, true
	case nvml.TOPOLOGY_NODE:
		return topology.NODE, true
	case nvml.TOPOLOGY_SYSTEM:
		return topology.SYS, true
	}
	return topology.Unknown, false
}

// gpuPaths fills the GPU×GPU matrix.
func (d *discoverer) gpuPaths() {
	n := len(d.gpus)
	numaNodes := d.sys.numaNodes()
	m := make([][]topology.Link, n)
	for i := range m {
		m[i] = make([]topology.Link, n)
		m[i][i] = topology.Link{Class: topology.Self}
	}
	for i := range n {
		for j := i + 1; j < n; j++ {
			a, b := d.gpus[i], d.gpus[j]
			l := d.gpuPair(a, b, j, i, numaNodes)
			m[i][j], m[j][i] = l, l
		}
	}
	d.node.GPUPaths = m
}

// p2p fills the P2P matrix from NVML's GetP2PStatus, read and write, the
// two NCCL checks (src/graph/paths.cc, ncclTopoCheckP2p: a pair whose
// read or write status is not OK gets no P2P, and NCCL moves its data
// through host memory). A pair NVML gives no status for stays unknown
// (P2P assumed, as NCCL assumes it); the matrix stays nil where NVML
// answers for no pair.
func (d *discoverer) p2p() {
	n := len(d.gpus)
	m := make([][]topology.P2PStatus, n)
	known := false
	for i := range m {
		m[i] = make([]topology.P2PStatus, n)
		m[i][i] = topology.P2PSelf
	}
	for i, a := range d.gpus {
		for j, b := range d.gpus {
			if i == j {
				continue
			}
			s := topology.P2POK
			for _, idx := range []nvml.GpuP2PCapsIndex{nvml.P2P_CAPS_INDEX_READ, nvml.P2P_CAPS_INDEX_WRITE} {
				st, ret := call(func() (nvml.GpuP2PStatus, nvml.Return) { return a.dev.GetP2PStatus(b.dev, idx) })
				if ret != nvml.SUCCESS {
					s = topology.P2PUnknown
					continue
				}
				known = true
				if c := p2pStatus(st); c != topology.P2POK {
					s = c
					break
				}
			}
			m[i][j] = s
		}
	}
	if known {
		d.node.P2P = m
	}
}

// p2pStatus is NVML's P2P status as nvidia-smi topo -p2p prints it.
func p2pStatus(s nvml.GpuP2PStatus) topology.P2PStatus {
	switch s {
	case nvml.P2P_STATUS_OK:
		return topology.P2POK
	case nvml.P2P_STATUS_CHIPSET_NOT_SUPPORTED:
		return topology.P2PChipsetNotSupported
	case nvml.P2P_STATUS_GPU_NOT_SUPPORTED:
		return topology.P2PGPUNotSupported
	case nvml.P2P_STATUS_IOH_TOPOLOGY_NOT_SUPPORTED:
		return topology.P2PTopologyNotSupported
	case nvml.P2P_STATUS_DISABLED_BY_REGKEY:
		return topology.P2PDisabledByRegkey
	case nvml.P2P_STATUS_NOT_SUPPORTED:
		return topology.P2PNotSupported
	}
	return topology.P2PUnknown
}

func (d *discoverer) gpuPair(a, b *gpu, bPos, aPos, numaNodes int) topology.Link {
	ab, ba := a.direct[bPos], b.direct[aPos]
	if ab != ba && ab > 0 && ba > 0 {
		d.note("GPU pairs whose two ends count different direct NVLinks; the larger count is used")
	}
	if links := max(ab, ba); links > 0 {
		return topology.Link{Class: topology.NV, NVLinks: links}
	}
	if a.switchLinks > 0 && b.switchLinks > 0 {
		return topology.Link{Class: topology.NV, NVLinks: min(a.switchLinks, b.switchLinks)}
	}
	lvl, ret := call(func() (nvml.GpuTopologyLevel, nvml.Return) { return a.dev.GetTopologyCommonAncestor(b.dev) })
	if ret == nvml.SUCCESS {
		if c, ok := topoClass(lvl); ok {
			return topology.Link{Class: c}
		}
		ret = nvml.ERROR_UNKNOWN
	}
	c, how := d.pciPath(a.chain, b.chain, a.info.NUMA, b.info.NUMA, numaNodes)
	if how == "" {
		how = "classified from the PCI tree in sysfs"
	}
	d.note(fmt.Sprintf("GPU pairs NVML gives no common ancestor for (%v), %s", ret, how))
	return topology.Link{Class: c}
}

// pciPath classifies two devices from sysfs, or failing that from their
// NUMA nodes, and says which it did ("" when from the PCI tree).
func (d *discoverer) pciPath(a, b []string, numaA, numaB, numaNodes int) (topology.Class, string) {
	switch {
	case a != nil && b != nil:
		return pciClass(a, b, numaA, numaB, numaNodes), ""
	case numaA >= 0 && numaB >= 0 && numaA != numaB:
		return topology.SYS, "classified SYS from their NUMA nodes"
	case numaA >= 0 && numaA == numaB:
		return topology.NODE, "estimated NODE (at worst) from their shared NUMA node"
	}
	return topology.Unknown, "left unknown: sysfs does not place them either"
}

// nics reads the RDMA NICs from sysfs and fills the GPU×NIC matrix.
func (d *discoverer) nics() {
	nics, chains, err := d.sys.rdmaNICs()
	if err != nil {
		if os.IsNotExist(err) {
			d.warnf("no RDMA NICs: %s does not exist", d.sys.path("class", "infiniband"))
		} else {
			d.warnf("no RDMA NICs: %v", err)
		}
		return
	}
	if len(nics) == 0 {
		d.warnf("no RDMA NICs under %s", d.sys.path("class", "infiniband"))
		return
	}
	d.node.NICs = nics
	numaNodes := d.sys.numaNodes()
	d.node.NICPaths = make([][]topology.Link, len(d.gpus))
	for i, g := range d.gpus {
		row := make([]topology.Link, len(nics))
		for k, nic := range nics {
			c, how := d.pciPath(g.chain, chains[k], g.info.NUMA, nic.NUMA, numaNodes)
			if how != "" {
				d.note("GPU-NIC pairs sysfs does not place, " + how)
			}
			row[k] = topology.Link{Class: c}
		}
		d.node.NICPaths[i] = row
	}
	for k, c := range chains {
		if c == nil {
			d.warnf("%s: not found in the PCI tree under %s", nics[k].Name, d.sys.path("devices"))
		}
	}
	if slices.ContainsFunc(d.gpus, func(g *gpu) bool { return g.chain == nil }) {
		d.warnf("some GPUs are not in the PCI tree under %s", d.sys.path("devices"))
	}
}
