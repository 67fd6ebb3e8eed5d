package ncclxml

import (
	"cmp"
	"fmt"
	"math"
	"slices"
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
	names := map[string]int{}
	for _, r := range refs {
		if prev, dup := names[r.net.name]; dup {
			return b.errf(r.net.line, "<net name=%q>: the same name is already at line %d", r.net.name, prev)
		}
		names[r.net.name] = r.net.line
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

// fillNVLink puts the file's NVLinks over the PCIe classes; where the file
// has none, it adds what the options say, with a warning either way.
func (b *builder) fillNVLink() error {
	n := b.n
	g := len(b.gpus)
	byBus := map[busID]int{}
	for i, e := range b.gpus {
		byBus[e.busID] = i
	}
	nvswitchPCI := map[busID]bool{}
	for _, e := range b.t.pcis {
		if e.kind == kindNVSwitch {
			nvswitchPCI[e.busID] = true
		}
	}
	switches := map[busID]bool{}
	for id := range nvswitchPCI {
		switches[id] = true
	}
	direct := make([][]int, g) // direct[i][j]: links GPU i lists to GPU j
	for i := range direct {
		direct[i] = make([]int, g)
	}
	toSwitch := make([]int, g)
	hasNVLink := false
	var selfLinks []string
	for i, e := range b.gpus {
		if e.gpu == nil {
			continue
		}
		for _, l := range e.gpu.nvlinks {
			j, isGPU := byBus[l.target]
			var targetKind kind
			switch {
			case l.tclass == "0x068000":
				targetKind = kindNVSwitch
			case l.tclass == "0x068001":
				targetKind = kindCPU
			case strings.HasPrefix(l.tclass, "0x03"):
				targetKind = kindGPU
			case l.tclass != "":
				return b.errf(l.line, "<nvlink target=%q tclass=%q>: expected tclass 0x03xxxx (GPU), 0x068000 (NVSwitch) or 0x068001 (CPU)",
					l.target, l.tclass)
			case isGPU:
				targetKind = kindGPU
			case nvswitchPCI[l.target] || l.target.placeholder:
				targetKind = kindNVSwitch
			default:
				return b.errf(l.line, "<nvlink target=%q> of GPU %s: the target is no GPU of this file and no NVSwitch; expected a GPU's bus id or tclass=\"0x068000\"",
					l.target, e.busID)
			}
			switch targetKind {
			case kindNVSwitch:
				hasNVLink = true
				toSwitch[i] += l.count
				if !l.target.placeholder {
					switches[l.target] = true
				}
			case kindCPU:
				hasNVLink = true
				b.t.warnf("GPU %s (line %d): NVLink to the CPU ignored", e.busID, l.line)
			case kindGPU:
				switch {
				case isGPU && j == i:
					selfLinks = append(selfLinks, fmt.Sprintf("GPU %s (line %d, count %d)", e.busID, l.line, l.count))
				case isGPU:
					hasNVLink = true
					direct[i][j] += l.count
				default:
					// NCCL lists links to GPUs it was not given (a
					// CUDA_VISIBLE_DEVICES subset) and ignores them too.
					hasNVLink = true
					b.t.warnf("GPU %s (line %d): NVLink to %s, which is not a GPU of this file: ignored", e.busID, l.line, l.target)
				}
			}
		}
	}
	if len(selfLinks) > 0 {
		b.t.warnf("<nvlink> of a GPU to itself ignored: %s", strings.Join(selfLinks, ", "))
	}
	n.NVSwitches = len(switches)

	nv := make([][]int, g)
	for i := range nv {
		nv[i] = make([]int, g)
	}
	anyNV := false
	for i := range g {
		for j := i + 1; j < g; j++ {
			d := max(direct[i][j], direct[j][i])
			if direct[i][j] > 0 && direct[j][i] > 0 && direct[i][j] != direct[j][i] {
				d = min(direct[i][j], direct[j][i])
				b.t.warnf("GPU %s lists %d NVLinks to GPU %s, which lists %d back: took %d",
					b.gpus[i].busID, direct[i][j], b.gpus[j].busID, direct[j][i], d)
			}
			s := 0
			if toSwitch[i] > 0 && toSwitch[j] > 0 {
				s = min(toSwitch[i], toSwitch[j])
			}
			c := max(d, s)
			if c > 64 {
				return b.errf(b.gpus[i].line, "GPUs %s and %s have %d NVLinks between them: expected at most 64", b.gpus[i].busID, b.gpus[j].busID, c)
			}
			nv[i][j], nv[j][i] = c, c
			anyNV = anyNV || c > 0
		}
	}

	modelGen := 0
	if !hasNVLink && g >= 2 {
		what := "no NVLink in file"
		if len(selfLinks) > 0 {
			what = "no NVLink between GPUs in file (only links of GPUs to themselves)"
		}
		links := 0
		switch {
		case b.opts.NVLinks > 0:
			links = b.opts.NVLinks
			b.t.warnf("%s: NVLink taken from --nvlinks=%d: NV%d between all %d GPUs, as on an NVSwitch machine", what, links, links, g)
		case b.opts.NVLinkFromModel:
			model, from := b.opts.GPUModel, "GPU model"
			if model == "" {
				model, from = b.modelFromPCI()
			}
			m, ok := nvlinkOfModel(model)
			switch {
			case model == "":
				b.t.warnf("%s; %s: pass the GPU model or --nvlinks to add it", what, from)
			case !ok:
				b.t.warnf("%s; %s %q is not in the NVLink table: pass --nvlinks to add it", what, from, model)
			case m.links == 0:
				b.t.warnf("%s; %s %q is %s: none added (pass --nvlinks to add it)", what, from, model, m.note)
			default:
				links, modelGen = m.links, m.gen
				b.t.warnf("%s: NVLink taken from %s %q (%s): NV%d between all %d GPUs", what, from, model, m.note, links, g)
			}
		default:
			b.t.warnf("%s; pass the GPU model or --nvlinks to add it (NCCL detects NVLink at run time, and such files often leave it out)", what)
		}
		if links > 0 {
			for i := range g {
				for j := range g {
					if i != j {
						nv[i][j] = links
					}
				}
			}
			anyNV = true
		}
	} else if hasNVLink && (b.opts.NVLinks > 0 || b.opts.NVLinkFromModel) {
		b.t.warnf("the file gives NVLink: the NVLink options are ignored")
	}

	for i := range g {
		for j := range g {
			if i != j && nv[i][j] > 0 {
				n.GPUPaths[i][j] = topology.Link{Class: topology.NV, NVLinks: nv[i][j]}
			}
		}
	}
	// NVB: no NVLink of their own, but both have NVLink to a third GPU, as
	// NCCL routes through it.
	for i := range g {
		for j := range g {
			if i == j || nv[i][j] > 0 {
				continue
			}
			for k := range g {
				if k != i && k != j && nv[i][k] > 0 && nv[k][j] > 0 {
					n.GPUPaths[i][j] = topology.Link{Class: topology.NVB}
					break
				}
			}
		}
	}
	if anyNV {
		n.NVLinkGen = b.smGen()
		if n.NVLinkGen == 0 {
			n.NVLinkGen = modelGen
		}
	}
	return nil
}

// smGen is the NVLink generation from the GPUs' sm, when they agree.
func (b *builder) smGen() int {
	gen := -1
	for _, e := range b.gpus {
		g := 0
		if e.gpu != nil {
			g = nvlinkGenOfSM(e.gpu.sm)
		}
		if gen >= 0 && g != gen {
			return 0
		}
		gen = g
	}
	return max(gen, 0)
}

// modelFromPCI names the GPUs' model from their PCI device id, when every
// GPU gives the same known one.
func (b *builder) modelFromPCI() (model, from string) {
	dev := ""
	for _, e := range b.gpus {
		if e.device == "" || (dev != "" && e.device != dev) {
			return "", "the file gives no single PCI device id for its GPUs"
		}
		dev = e.device
	}
	m, ok := pciDeviceModels[dev]
	if !ok {
		return "", fmt.Sprintf("PCI device %s is not in the model table", dev)
	}
	return m, fmt.Sprintf("GPU model (PCI device %s)", dev)
}

// mbps is a rate in Gb/s as NCCL's speed attribute (Mb/s).
func mbps(gbps float64) int64 { return int64(math.Round(gbps * 1000)) }
