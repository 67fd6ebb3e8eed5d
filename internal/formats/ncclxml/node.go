package ncclxml

// Parse and its builder, which turns the element tree (parse.go) into a
// topology.Node: what each pci element is, the GPUs and NICs in order, and
// the PCIe class of every path. NVLink goes over the PCIe classes in
// nvlink.go.

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/toposched/toposched/internal/topology"
)

// Options say what to add where the file is silent.
type Options struct {
	// NVLinkFromModel takes NVLink from the GPU model when the file has no
	// <nvlink> at all: GPUModel, or else the PCI device id the file gives
	// for its GPUs. Only models whose board has the same NVLinks between
	// every GPU pair (NVSwitch boards) add any.
	NVLinkFromModel bool
	// GPUModel names the GPUs ("NVIDIA H100 80GB HBM3"); it is also
	// recorded as each GPU's Model.
	GPUModel string
	// NVLinks, when above 0 and the file has no <nvlink>, makes every GPU
	// pair NV<NVLinks>, as on an NVSwitch machine. It wins over the model.
	NVLinks int
}

// Parse reads an NCCL topology XML file (NCCL_TOPO_FILE,
// NCCL_TOPO_DUMP_FILE) into a node. file names the input in errors and in
// Node.Source. See the package documentation for how paths are classified.
func Parse(file string, data []byte, opts Options) (*topology.Node, error) {
	if opts.NVLinks < 0 || opts.NVLinks > 64 {
		return nil, fmt.Errorf("%s: NVLinks option %d: expected 0 to 64", file, opts.NVLinks)
	}
	t, err := parseTree(file, data)
	if err != nil {
		return nil, err
	}
	b := &builder{t: t, opts: opts}
	n, err := b.build()
	if err != nil {
		return nil, err
	}
	if err := n.Validate(); err != nil {
		// The builder makes square, symmetric matrices; this is a bug.
		return nil, fmt.Errorf("%s: internal error: %w", file, err)
	}
	return n, nil
}

type builder struct {
	t    *tree
	opts Options
	n    *topology.Node

	gpus []*elem  // in node order
	nics []nicRef // in node order
}

// nicRef is one NIC of the node and where it hangs.
type nicRef struct {
	net    netElem
	attach *elem // its pci, or its cpu for a <nic> right under a <cpu>
}

func (b *builder) errf(line int, format string, args ...any) error {
	return fmt.Errorf("%s:%d: %s", b.t.file, line, fmt.Sprintf(format, args...))
}

func (b *builder) build() (*topology.Node, error) {
	b.n = &topology.Node{Source: b.t.file}
	// One host has one kind of CPU: the first cpu that names its arch.
	for _, c := range b.t.cpus {
		if c.proc.Arch != "" {
			b.n.CPU = c.proc
			break
		}
	}
	b.classify()
	if err := b.collectGPUs(); err != nil {
		return nil, err
	}
	if err := b.collectNICs(); err != nil {
		return nil, err
	}
	b.fillPCIePaths()
	if err := b.fillNVLink(); err != nil {
		return nil, err
	}
	b.n.Warnings = append(b.n.Warnings, b.t.warnings...)
	return b.n, nil
}

// classify decides what each pci element is, as NCCL does: a <gpu> child
// makes a GPU, a <nic> child a NIC; without them the class decides (files
// written for NCCL_TOPO_FILE often leave the devices bare for NCCL to fill
// in); an element holding others is a bridge.
func (b *builder) classify() {
	for _, e := range b.t.pcis {
		switch {
		case e.gpu != nil:
			e.kind = kindGPU
		case e.nic != nil:
			e.kind = kindNIC
		case len(e.children) > 0:
			e.kind = kindBridge
			if strings.HasPrefix(e.class, "0x0600") {
				e.kind = kindHostBridge
			}
		case strings.HasPrefix(e.class, "0x03"):
			if e.vendor == "" || e.vendor == "0x10de" {
				e.kind = kindGPU
			} else {
				b.t.warnf("pci %s (line %d): display device of vendor %s, not an NVIDIA GPU: ignored", e.busID, e.line, e.vendor)
			}
		case strings.HasPrefix(e.class, "0x02"):
			e.kind = kindNIC
		case e.class == "0x068000":
			e.kind = kindNVSwitch
		}
	}
}

func (b *builder) collectGPUs() error {
	allDev := true
	devs := map[int]*elem{}
	for _, e := range b.t.pcis {
		if e.kind != kindGPU {
			continue
		}
		if len(b.gpus) == maxGPUs {
			return b.errf(e.line, "more than %d GPUs: expected one node's GPUs", maxGPUs)
		}
		b.gpus = append(b.gpus, e)
		if e.gpu == nil || !e.gpu.hasDev {
			allDev = false
			continue
		}
		if prev, dup := devs[e.gpu.dev]; dup {
			return b.errf(e.gpu.line, "<gpu dev=\"%d\"> of pci %s: dev %d is also the GPU of pci %s (line %d)",
				e.gpu.dev, e.busID, e.gpu.dev, prev.busID, prev.line)
		}
		devs[e.gpu.dev] = e
	}
	if allDev {
		slices.SortStableFunc(b.gpus, func(x, y *elem) int { return cmp.Compare(x.gpu.dev, y.gpu.dev) })
	} else {
		slices.SortStableFunc(b.gpus, func(x, y *elem) int {
			if x.busID.less(y.busID) {
				return -1
			}
			if y.busID.less(x.busID) {
				return 1
			}
			return 0
		})
	}
	if len(b.gpus) == 0 {
		b.t.warnf("no GPU in file")
	}
	gen := 0
	for i, e := range b.gpus {
		g := topology.GPU{Index: i, BusID: e.busID.String(), Model: b.opts.GPUModel, NUMA: e.cpu.numa, CPUAffinity: e.cpu.affinity}
		b.n.GPUs = append(b.n.GPUs, g)
		if lg := pcieGenOfSpeed(e.linkSpeed); lg > 0 && (gen == 0 || lg < gen) {
			gen = lg
		}
	}
	b.n.PCIeGen = gen
	return nil
}

// pcieGenOfSpeed reads a link speed as Linux prints it ("16.0 GT/s PCIe",
// "8 GT/s"); 0 when it is not one.
func pcieGenOfSpeed(s string) int {
	f := strings.Fields(s)
	if len(f) < 2 || f[1] != "GT/s" {
		return 0
	}
	switch f[0] {
	case "2.5":
		return 1
	case "5", "5.0":
		return 2
	case "8", "8.0":
		return 3
	case "16", "16.0":
		return 4
	case "32", "32.0":
		return 5
	case "64", "64.0":
		return 6
	}
	return 0
}

// speedOfPCIeGen is the inverse of pcieGenOfSpeed, in the kernel's form.
func speedOfPCIeGen(gen int) string {
	switch gen {
	case 1:
		return "2.5 GT/s PCIe"
	case 2:
		return "5.0 GT/s PCIe"
	case 3:
		return "8.0 GT/s PCIe"
	case 4:
		return "16.0 GT/s PCIe"
	case 5:
		return "32.0 GT/s PCIe"
	case 6:
		return "64.0 GT/s PCIe"
	}
	return ""
}

// rdmaNamePrefixes are the kernel's RDMA (InfiniBand verbs) device names.
var rdmaNamePrefixes = []string{"mlx4_", "mlx5_", "bnxt_re", "irdma", "efa_", "efa", "hfi1_", "qedr", "erdma", "ionic_", "rxe", "siw"}

func rdmaName(name string) bool {
	for _, p := range rdmaNamePrefixes {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

func (b *builder) collectNICs() error {
	var refs []nicRef
	var unnamed []*elem
	for _, c := range b.t.cpus {
		for _, nic := range c.cpuNICs {
			for _, net := range nic.nets {
				refs = append(refs, nicRef{net: net, attach: c})
			}
		}
	}
	for _, e := range b.t.pcis {
		if e.kind != kindNIC {
			continue
		}
		if e.nic == nil || len(e.nic.nets) == 0 {
			unnamed = append(unnamed, e)
			continue
		}
		for _, net := range e.nic.nets {
			refs = append(refs, nicRef{net: net, attach: e})
		}
	}
	if len(refs)+len(unnamed) > maxNICs {
		return b.errf(1, "%d NICs: expected at most %d", len(refs)+len(unnamed), maxNICs)
	}
	// A host interface NCCL sees through no PCI device (a socket NIC: a
	// bridge, a tunnel, a container network's veth) is written under every
	// CPU it could serve: a dump from a host running Docker and Calico
	// lists tunl0, br-… and cali… once per NUMA node. It is one interface:
	// kept once, at its first <nic>, with a warning. A name repeated on
	// PCI devices is two devices claiming one name: refused.
	names := map[string]int{}
	atCPU := map[string]bool{}
	repeated := map[string][]int{}
	var order []string
	kept := refs[:0]
	for _, r := range refs {
		cpu := r.attach.kind == kindCPU
		if prev, dup := names[r.net.name]; dup {
			if !cpu || !atCPU[r.net.name] {
				return b.errf(r.net.line, "<net name=%q>: the same name is already at line %d", r.net.name, prev)
			}
			if repeated[r.net.name] == nil {
				order = append(order, r.net.name)
			}
			repeated[r.net.name] = append(repeated[r.net.name], r.net.line)
			continue
		}
		names[r.net.name], atCPU[r.net.name] = r.net.line, cpu
		kept = append(kept, r)
	}
	refs = kept
	for _, name := range order {
		lines := make([]string, len(repeated[name]))
		for i, l := range repeated[name] {
			lines[i] = strconv.Itoa(l)
		}
		b.t.warnf("<net name=%q> is listed under %d CPUs (lines %d, %s): one host interface without a PCI device of its own (a bridge, tunnel or container network); kept once, at line %d",
			name, len(lines)+1, names[name], strings.Join(lines, ", "), names[name])
	}
	// A NIC that NCCL is left to fill in gets a name in bus id order, as the
	// kernel would number the devices of one driver.
	if len(unnamed) > 0 {
		slices.SortFunc(unnamed, func(x, y *elem) int { return cmpBusID(x.busID, y.busID) })
		var made []string
		next := map[string]int{}
		for _, e := range unnamed {
			prefix := "nic"
			if strings.HasPrefix(e.class, "0x0207") || e.vendor == "0x15b3" {
				prefix = "mlx5_"
			}
			var name string
			for {
				name = fmt.Sprintf("%s%d", prefix, next[prefix])
				next[prefix]++
				if _, used := names[name]; !used {
					break
				}
			}
			names[name] = e.line
			made = append(made, name)
			refs = append(refs, nicRef{net: netElem{line: e.line, name: name}, attach: e})
		}
		b.t.warnf("%d NIC(s) without <net> in file (NCCL fills them in at run time): named %s in bus id order; the names on the machine may differ",
			len(unnamed), strings.Join(made, ", "))
	}
	// Order: by NCCL's net dev when every NIC has a distinct one, else by
	// bus id (NICs right under a cpu last), then by line.
	allDev := true
	devs := map[int]bool{}
	for _, r := range refs {
		if !r.net.hasDev || devs[r.net.dev] {
			allDev = false
			break
		}
		devs[r.net.dev] = true
	}
	slices.SortStableFunc(refs, func(x, y nicRef) int {
		if allDev {
			return cmp.Compare(x.net.dev, y.net.dev)
		}
		xc, yc := x.attach.kind == kindCPU, y.attach.kind == kindCPU
		switch {
		case xc != yc:
			if xc {
				return 1
			}
			return -1
		case !xc:
			if c := cmpBusID(x.attach.busID, y.attach.busID); c != 0 {
				return c
			}
		}
		return cmp.Compare(x.net.line, y.net.line)
	})
	b.nics = refs
	for k, r := range refs {
		nic := topology.NIC{Index: k, Name: r.net.name, NUMA: r.attach.cpu.numa,
			RateGbps: float64(r.net.speedMbps) / 1000}
		nic.RDMA = r.net.gdr || rdmaName(r.net.name)
		if r.attach.kind != kindCPU {
			nic.BusID = r.attach.busID.String()
			nic.RDMA = nic.RDMA || strings.HasPrefix(r.attach.class, "0x0207") || r.attach.vendor == "0x15b3"
		}
		b.n.NICs = append(b.n.NICs, nic)
	}
	return nil
}

func cmpBusID(x, y busID) int {
	switch {
	case x.less(y):
		return -1
	case y.less(x):
		return 1
	}
	return 0
}

// pathClass is the PCIe class of the path between two devices, given as
// their attachments (a GPU's or NIC's pci element, or a cpu for a NIC right
// under it). The rules are in the package documentation.
func pathClass(a, b *elem) topology.Class {
	switch {
	case a.cpu != b.cpu:
		return topology.SYS
	case a == b:
		return topology.PIX // two ports of one NIC
	case a.kind == kindCPU || b.kind == kindCPU:
		return topology.PHB
	}
	// Walk both up to their lowest common ancestor, collecting the elements
	// strictly between them.
	var interior []*elem
	x, y := a.parent, b.parent
	for x.depth > y.depth {
		interior = append(interior, x)
		x = x.parent
	}
	for y.depth > x.depth {
		interior = append(interior, y)
		y = y.parent
	}
	for x != y {
		interior = append(interior, x, y)
		x, y = x.parent, y.parent
	}
	if x.kind == kindCPU {
		if top(a).busID.rootKey() == top(b).busID.rootKey() {
			return topology.PHB
		}
		return topology.NODE
	}
	interior = append(interior, x)
	for _, e := range interior {
		if e.kind == kindHostBridge {
			return topology.PHB
		}
	}
	if len(interior) <= 1 {
		return topology.PIX
	}
	return topology.PXB
}

// top is the ancestor of a pci element right under its cpu.
func top(e *elem) *elem {
	for e.parent.kind != kindCPU {
		e = e.parent
	}
	return e
}

func (b *builder) fillPCIePaths() {
	n := b.n
	n.GPUPaths = make([][]topology.Link, len(b.gpus))
	for i := range b.gpus {
		n.GPUPaths[i] = make([]topology.Link, len(b.gpus))
		for j := range b.gpus {
			if i == j {
				n.GPUPaths[i][j] = topology.Link{Class: topology.Self}
				continue
			}
			n.GPUPaths[i][j] = topology.Link{Class: pathClass(b.gpus[i], b.gpus[j])}
		}
	}
	if len(b.nics) == 0 {
		return
	}
	n.NICPaths = make([][]topology.Link, len(b.gpus))
	for i := range b.gpus {
		n.NICPaths[i] = make([]topology.Link, len(b.nics))
		for k, r := range b.nics {
			n.NICPaths[i][k] = topology.Link{Class: pathClass(b.gpus[i], r.attach)}
		}
	}
}

// mbps is a rate in Gb/s as NCCL's speed attribute (Mb/s).
func mbps(gbps float64) int64 { return int64(math.Round(gbps * 1000)) }
