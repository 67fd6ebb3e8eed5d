package ncclxml

// Export and its tree: the devices to place, the nested groups the node's
// matrix allows, the made-up bus ids, and the check that the output reads
// back to the node's matrix. The XML is written in exportxml.go.

import (
	"errors"
	"fmt"
	"slices"

	"github.com/toposched/toposched/internal/topology"
)

// Export writes NCCL topology XML for the GPUs at the given positions of n
// (nil: all of them, in order) and all of n's NICs, for NCCL_TOPO_FILE. The
// exported GPUs are numbered (dev) in the order given. The tree is rebuilt
// from the node alone, so any source with PCI bus ids will do; the package
// documentation says how, and what it cannot carry. Export reads its own
// output back and refuses a node whose matrix no PCI tree reproduces.
func Export(n *topology.Node, gpus []int) ([]byte, error) {
	if n == nil {
		return nil, errors.New("export: nil node")
	}
	if err := n.Validate(); err != nil {
		return nil, fmt.Errorf("export: %w", err)
	}
	if gpus == nil {
		gpus = make([]int, len(n.GPUs))
		for i := range gpus {
			gpus[i] = i
		}
	}
	x := &exporter{n: n, sel: gpus, used: map[busID]bool{}}
	if err := x.devices(); err != nil {
		return nil, fmt.Errorf("export: %w", err)
	}
	if err := x.group(); err != nil {
		return nil, fmt.Errorf("export: %w", err)
	}
	out, err := x.write()
	if err != nil {
		return nil, fmt.Errorf("export: %w", err)
	}
	if err := x.check(out); err != nil {
		return nil, fmt.Errorf("export: %w", err)
	}
	return out, nil
}

// device is one thing the exported tree places: a GPU, or the NICs of one
// PCI device (the ports of a multi-port NIC share it).
type device struct {
	gpu      int   // position in the node; -1 for NICs
	nics     []int // NIC positions
	busID    busID
	hasBusID bool
	numa     int
	affinity string // GPUs only
	// onCPU: a NIC without a bus id whose paths are all PHB or SYS, as NCCL
	// writes a <nic> right under a <cpu>.
	onCPU bool
}

type exporter struct {
	n    *topology.Node
	sel  []int
	devs []device
	used map[busID]bool

	// levels[a][b]: the PCIe level of the path the node gives, 0 where it
	// gives none (NVLink hides it, or NIC×NIC).
	levels [][]int
	// part[k][d]: the group of device d at level k (1 PIX .. 4 cpu).
	part [5][]int
}

// level orders the PCIe classes as nested groups: the same PCIe switch,
// the same top-level device under a cpu, the same host bridge, the same cpu.
func level(c topology.Class) int {
	switch c {
	case topology.PIX:
		return 1
	case topology.PXB:
		return 2
	case topology.PHB:
		return 3
	case topology.NODE:
		return 4
	case topology.SYS:
		return 5
	}
	return 0
}

func (x *exporter) devices() error {
	n := x.n
	seen := map[int]bool{}
	for _, g := range x.sel {
		if g < 0 || g >= len(n.GPUs) {
			return fmt.Errorf("GPU position %d: the node has GPUs 0 to %d", g, len(n.GPUs)-1)
		}
		if seen[g] {
			return fmt.Errorf("GPU position %d given twice", g)
		}
		seen[g] = true
		id, ok := parseBusID(n.GPUs[g].BusID)
		if !ok || id.placeholder {
			return fmt.Errorf("GPU%d has no PCI bus id (%q): NCCL matches GPUs by bus id", g, n.GPUs[g].BusID)
		}
		if x.used[id] {
			return fmt.Errorf("GPU%d: bus id %s is another GPU's too", g, id)
		}
		x.used[id] = true
		x.devs = append(x.devs, device{gpu: g, busID: id, hasBusID: true, numa: n.GPUs[g].NUMA, affinity: n.GPUs[g].CPUAffinity})
	}
	names := map[string]int{}
	byBus := map[busID]int{}
	for k, nic := range n.NICs {
		if nic.Name == "" {
			return fmt.Errorf("NIC%d has no name: NCCL matches NICs by name", k)
		}
		if prev, dup := names[nic.Name]; dup {
			return fmt.Errorf("NIC%d and NIC%d are both named %q", prev, k, nic.Name)
		}
		names[nic.Name] = k
		if nic.BusID == "" {
			x.devs = append(x.devs, device{gpu: -1, nics: []int{k}, numa: nic.NUMA})
			continue
		}
		id, ok := parseBusID(nic.BusID)
		if !ok || id.placeholder {
			return fmt.Errorf("NIC%d (%s): bus id %q: expected a PCI bus id like 0000:07:00.0", k, nic.Name, nic.BusID)
		}
		if d, ok := byBus[id]; ok {
			dev := &x.devs[d]
			dev.nics = append(dev.nics, k)
			if dev.numa < 0 {
				dev.numa = nic.NUMA
			} else if nic.NUMA >= 0 && nic.NUMA != dev.numa {
				return fmt.Errorf("NICs %s and %s share bus id %s but not their NUMA node (%d, %d)",
					n.NICs[dev.nics[0]].Name, nic.Name, id, dev.numa, nic.NUMA)
			}
			continue
		}
		if x.used[id] {
			return fmt.Errorf("NIC%d (%s): bus id %s is a GPU's", k, nic.Name, id)
		}
		x.used[id] = true
		byBus[id] = len(x.devs)
		x.devs = append(x.devs, device{gpu: -1, nics: []int{k}, busID: id, hasBusID: true, numa: nic.NUMA})
	}

	// The levels the node gives.
	x.levels = make([][]int, len(x.devs))
	for a := range x.devs {
		x.levels[a] = make([]int, len(x.devs))
	}
	set := func(a, b, l int) {
		x.levels[a][b], x.levels[b][a] = l, l
	}
	for a, da := range x.devs {
		if da.gpu < 0 {
			continue
		}
		for b, db := range x.devs {
			switch {
			case a == b:
			case db.gpu >= 0:
				set(a, b, level(n.GPUPaths[da.gpu][db.gpu].Class))
			case n.NICPaths != nil:
				l := level(n.NICPaths[da.gpu][db.nics[0]].Class)
				for _, k := range db.nics[1:] {
					if l2 := level(n.NICPaths[da.gpu][k].Class); l2 != l {
						return fmt.Errorf("NICs %s and %s share bus id %s but not their path to GPU%d (%s, %s)",
							n.NICs[db.nics[0]].Name, n.NICs[k].Name, db.busID, da.gpu,
							n.NICPaths[da.gpu][db.nics[0]], n.NICPaths[da.gpu][k])
					}
				}
				set(a, b, l)
			}
		}
	}
	// A NIC without a bus id that is PHB or SYS to every GPU sits right
	// under its cpu; any other gets a made-up bus id.
	for a := range x.devs {
		d := &x.devs[a]
		if d.gpu >= 0 || d.hasBusID {
			continue
		}
		d.onCPU = true
		for _, l := range x.levels[a] {
			if l != 0 && l != 3 && l != 5 {
				d.onCPU = false
			}
		}
		if !d.onCPU {
			id, err := x.take(0xfffc)
			if err != nil {
				return err
			}
			d.busID, d.hasBusID = id, true
		}
	}
	return nil
}

// take returns an unused bus id in the domain, on the first bus with room.
func (x *exporter) take(domain uint32) (busID, error) {
	for bus := 0; bus <= 0xff; bus++ {
		if id, ok := x.takeOn(domain, uint8(bus)); ok {
			return id, nil
		}
	}
	return busID{}, fmt.Errorf("no free bus id left in domain %04x", domain)
}

// takeOn returns an unused bus id on one bus.
func (x *exporter) takeOn(domain uint32, bus uint8) (busID, bool) {
	for fn := uint8(0); fn < 8; fn++ {
		for dev := uint8(1); dev <= 0x1f; dev++ {
			id := busID{domain: domain, bus: bus, dev: dev, fn: fn}
			if !x.used[id] {
				x.used[id] = true
				return id, true
			}
		}
	}
	return busID{}, false
}

// group puts the devices into nested groups, level by level, joining two
// devices only where the node says their path is that close; a group that
// joins too much shows in check.
func (x *exporter) group() error {
	nd := len(x.devs)
	uf := make([]int, nd)
	for i := range uf {
		uf[i] = i
	}
	find := func(a int) int {
		for uf[a] != a {
			uf[a] = uf[uf[a]]
			a = uf[a]
		}
		return a
	}
	union := func(a, b int) {
		ra, rb := find(a), find(b)
		if ra == rb {
			return
		}
		if rb < ra {
			ra, rb = rb, ra
		}
		uf[rb] = ra
	}
	for k := 1; k <= 4; k++ {
		for a := range nd {
			for b := a + 1; b < nd; b++ {
				l := x.levels[a][b]
				if l == 0 || l > k {
					continue
				}
				if k < 4 && (x.devs[a].onCPU || x.devs[b].onCPU) {
					continue
				}
				union(a, b)
			}
		}
		if k == 4 {
			if err := x.mergeNUMA(find, union); err != nil {
				return err
			}
		}
		x.part[k] = make([]int, nd)
		for d := range nd {
			x.part[k][d] = find(d)
		}
	}
	return nil
}

// mergeNUMA puts groups of one NUMA node into one cpu where nothing the node
// says keeps them apart: no SYS between them and the same CPU affinity.
func (x *exporter) mergeNUMA(find func(int) int, union func(a, b int)) error {
	type info struct {
		numa     int
		affinity string
		hasGPU   bool
	}
	infos := map[int]*info{}
	var roots []int
	for d, dev := range x.devs {
		r := find(d)
		in, ok := infos[r]
		if !ok {
			in = &info{numa: -1}
			infos[r] = in
			roots = append(roots, r)
		}
		if dev.numa >= 0 {
			if in.numa >= 0 && in.numa != dev.numa {
				return fmt.Errorf("%s is on NUMA node %d but closer than SYS to a device on NUMA node %d: one <cpu> cannot hold both",
					x.name(d), dev.numa, in.numa)
			}
			in.numa = dev.numa
		}
		if dev.gpu >= 0 && !in.hasGPU {
			in.hasGPU, in.affinity = true, dev.affinity
		}
	}
	slices.Sort(roots)
	members := map[int][]int{}
	for d := range x.devs {
		members[find(d)] = append(members[find(d)], d)
	}
	apart := func(ra, rb int) bool {
		for _, a := range members[ra] {
			for _, b := range members[rb] {
				if x.levels[a][b] == 5 {
					return true
				}
			}
		}
		return false
	}
	for i, ra := range roots {
		if find(ra) != ra {
			continue
		}
		for _, rb := range roots[i+1:] {
			if find(rb) != rb {
				continue
			}
			a, b := infos[ra], infos[rb]
			if a.numa < 0 || a.numa != b.numa || (a.hasGPU && b.hasGPU && a.affinity != b.affinity) || apart(ra, rb) {
				continue
			}
			union(ra, rb) // ra < rb stays the root
			members[ra] = append(members[ra], members[rb]...)
			if !a.hasGPU {
				a.hasGPU, a.affinity = b.hasGPU, b.affinity
			}
		}
	}
	return nil
}

func (x *exporter) name(d int) string {
	dev := x.devs[d]
	if dev.gpu >= 0 {
		return fmt.Sprintf("GPU%d", dev.gpu)
	}
	return fmt.Sprintf("NIC%d (%s)", dev.nics[0], x.n.NICs[dev.nics[0]].Name)
}

// groupsOf splits devices by their group at level k, groups in order of
// their first device.
func (x *exporter) groupsOf(devs []int, k int) [][]int {
	var out [][]int
	idx := map[int]int{}
	for _, d := range devs {
		g := x.part[k][d]
		i, ok := idx[g]
		if !ok {
			i = len(out)
			idx[g] = i
			out = append(out, nil)
		}
		out[i] = append(out[i], d)
	}
	return out
}

// check reads the output back and compares its matrix with the node's.
func (x *exporter) check(out []byte) error {
	back, err := Parse("exported", out, Options{})
	if err != nil {
		return fmt.Errorf("the exported file does not read back: %w", err)
	}
	n := x.n
	if len(back.GPUs) != len(x.sel) || len(back.NICs) != len(n.NICs) {
		return fmt.Errorf("the exported file reads back with %d GPUs and %d NICs, not %d and %d",
			len(back.GPUs), len(back.NICs), len(x.sel), len(n.NICs))
	}
	checkable := func(c topology.Class) bool { return c == topology.NV || level(c) > 0 }
	for p, a := range x.sel {
		for q, b := range x.sel {
			want, got := n.GPUPaths[a][b], back.GPUPaths[p][q]
			if p != q && checkable(want.Class) && want != got {
				return fmt.Errorf("GPU%d-GPU%d is %s in the node but %s in any PCI tree built from the rest of its matrix", a, b, want, got)
			}
		}
		if n.NICPaths == nil {
			continue
		}
		for k := range n.NICs {
			want, got := n.NICPaths[a][k], back.NICPaths[p][k]
			if checkable(want.Class) && want != got {
				return fmt.Errorf("GPU%d-NIC%d is %s in the node but %s in any PCI tree built from the rest of its matrix", a, k, want, got)
			}
		}
	}
	return nil
}
