package ncclxml

// Export's writing: the XML of the grouped devices (cpus, made-up host
// bridges and switches, GPUs, NICs, NVSwitches) and the <nvlink> elements
// each exported GPU gets.

import (
	"bytes"
	"cmp"
	"encoding/xml"
	"fmt"
	"slices"
	"strconv"

	"github.com/toposched/toposched/internal/topology"
)

// xw writes indented XML.
type xw struct {
	b     bytes.Buffer
	depth int
}

func (w *xw) open(name string, selfClose bool, attrs ...string) {
	for range w.depth {
		w.b.WriteString("  ")
	}
	w.b.WriteString("<" + name)
	for i := 0; i+1 < len(attrs); i += 2 {
		w.b.WriteString(" " + attrs[i] + `="`)
		xml.EscapeText(&w.b, []byte(attrs[i+1])) //nolint:errcheck // bytes.Buffer does not fail
		w.b.WriteString(`"`)
	}
	if selfClose {
		w.b.WriteString("/>\n")
		return
	}
	w.b.WriteString(">\n")
	w.depth++
}

func (w *xw) close(name string) {
	w.depth--
	for range w.depth {
		w.b.WriteString("  ")
	}
	w.b.WriteString("</" + name + ">\n")
}

func (x *exporter) write() ([]byte, error) {
	n := x.n
	all := make([]int, len(x.devs))
	for i := range all {
		all[i] = i
	}
	cpus := x.groupsOf(all, 4)
	numaOf := func(g []int) int {
		for _, d := range g {
			if x.devs[d].numa >= 0 {
				return x.devs[d].numa
			}
		}
		return -1
	}
	slices.SortStableFunc(cpus, func(a, b []int) int {
		na, nb := numaOf(a), numaOf(b)
		if (na < 0) != (nb < 0) {
			if na < 0 {
				return 1
			}
			return -1
		}
		return cmp.Compare(na, nb)
	})
	if len(cpus) == 0 && n.NVSwitches > 0 {
		cpus = append(cpus, nil) // a cpu for the NVSwitches alone
	}
	nvlinks, switchIDs, err := x.nvlinks()
	if err != nil {
		return nil, err
	}
	gpuDev := map[int]int{} // node position -> exported dev
	for i, g := range x.sel {
		gpuDev[g] = i
	}
	bridgeSpeed := speedOfPCIeGen(n.PCIeGen)

	w := &xw{}
	w.open("system", false, "version", "1")
	root := 0 // host bridge groups so far, over all cpus
	for ci, cpu := range cpus {
		var attrs []string
		if numa := numaOf(cpu); numa >= 0 {
			attrs = append(attrs, "numaid", strconv.Itoa(numa))
		}
		for _, d := range cpu {
			if x.devs[d].gpu >= 0 {
				if m := affinityMask(x.devs[d].affinity); m != "" {
					attrs = append(attrs, "affinity", m)
				}
				break
			}
		}
		w.open("cpu", false, attrs...)
		var placed, onCPU []int
		for _, d := range cpu {
			if x.devs[d].onCPU {
				onCPU = append(onCPU, d)
			} else {
				placed = append(placed, d)
			}
		}
		for _, hb := range x.groupsOf(placed, 3) {
			// Top-level devices of one host bridge share a bus: its key.
			domain, bus := uint32(0xffff-root/256), uint8(0xff-root%256)
			root++
			for _, tg := range x.groupsOf(hb, 2) {
				id, ok := x.takeOn(domain, bus)
				if !ok {
					return nil, fmt.Errorf("more than %d top-level PCI groups under one host bridge", 31*8)
				}
				w.open("pci", false, "busid", id.String(), "class", "0x060400", "link_speed", bridgeSpeed, "link_width", "16")
				switches := x.groupsOf(tg, 1)
				for _, sw := range switches {
					if len(switches) > 1 {
						id, err := x.take(0xfffe)
						if err != nil {
							return nil, err
						}
						w.open("pci", false, "busid", id.String(), "class", "0x060400", "link_speed", bridgeSpeed, "link_width", "16")
					}
					for _, d := range sw {
						x.writeDevice(w, d, gpuDev, nvlinks)
					}
					if len(switches) > 1 {
						w.close("pci")
					}
				}
				w.close("pci")
			}
		}
		for _, d := range onCPU {
			x.writeNICs(w, x.devs[d], false)
		}
		if ci == 0 {
			for _, id := range switchIDs {
				w.open("pci", true, "busid", id.String(), "class", "0x068000")
			}
		}
		w.close("cpu")
	}
	w.close("system")
	return w.b.Bytes(), nil
}

func (x *exporter) writeDevice(w *xw, d int, gpuDev map[int]int, nvlinks map[int][]nvlinkElem) {
	dev := x.devs[d]
	if dev.gpu < 0 {
		// The class says RDMA for all ports of the device, or for none.
		allRDMA := true
		for _, k := range dev.nics {
			allRDMA = allRDMA && x.n.NICs[k].RDMA
		}
		class := "0x020000"
		if allRDMA {
			class = "0x020700"
		}
		w.open("pci", false, "busid", dev.busID.String(), "class", class)
		x.writeNICs(w, dev, allRDMA)
		w.close("pci")
		return
	}
	attrs := []string{"busid", dev.busID.String(), "class", "0x030200"}
	if s := speedOfPCIeGen(x.n.PCIeGen); s != "" {
		attrs = append(attrs, "link_speed", s)
	}
	w.open("pci", false, attrs...)
	links := nvlinks[dev.gpu]
	w.open("gpu", len(links) == 0, "dev", strconv.Itoa(gpuDev[dev.gpu]))
	if len(links) > 0 {
		for _, l := range links {
			w.open("nvlink", true, "target", l.target.String(), "count", strconv.Itoa(l.count), "tclass", l.tclass)
		}
		w.close("gpu")
	}
	w.close("pci")
}

// writeNICs writes the <nic> of a device; classRDMA: its pci class says
// RDMA already.
func (x *exporter) writeNICs(w *xw, dev device, classRDMA bool) {
	w.open("nic", false)
	for _, k := range dev.nics {
		nic := x.n.NICs[k]
		attrs := []string{"name", nic.Name, "dev", strconv.Itoa(k)}
		if nic.RateGbps > 0 {
			attrs = append(attrs, "speed", strconv.FormatInt(mbps(nic.RateGbps), 10))
		}
		if nic.RDMA && !classRDMA && !rdmaName(nic.Name) {
			// Nothing else says it: NCCL's word for a NIC that does RDMA
			// to GPU memory.
			attrs = append(attrs, "gdr", "1")
		}
		w.open("net", true, attrs...)
	}
	w.close("nic")
}

// nvlinks decides each exported GPU's <nvlink> elements. On an NVSwitch
// machine every GPU links to the switches with as many links as its best
// peer path; elsewhere each NV pair gets a direct link each way. The
// NVSwitches the node counts are written as pci devices of their own, the
// links split over them.
func (x *exporter) nvlinks() (map[int][]nvlinkElem, []busID, error) {
	n := x.n
	nv := func(a, b int) int {
		if l := n.GPUPaths[a][b]; l.Class == topology.NV {
			return l.NVLinks
		}
		return 0
	}
	var switchIDs []busID
	for range n.NVSwitches {
		id, err := x.take(0xfffd)
		if err != nil {
			return nil, nil, err
		}
		switchIDs = append(switchIDs, id)
	}
	// Not the generation's own limit: an exported node reads back without
	// its generation, and must export the same again.
	onSwitch := n.NVSwitches > 0
	limit := maxLinksPerGPU
	for i := range n.GPUs {
		sum := 0
		for j := range n.GPUs {
			if i != j {
				sum += nv(i, j)
			}
		}
		if sum > limit {
			onSwitch = true // more links than one GPU has: they end on switches
		}
	}
	links := map[int][]nvlinkElem{}
	if onSwitch {
		c := map[int]int{}
		ok := true
		if len(x.sel) == 1 {
			for j := range n.GPUs {
				c[x.sel[0]] = max(c[x.sel[0]], nv(x.sel[0], j))
			}
		} else {
			for _, a := range x.sel {
				for _, b := range x.sel {
					if a != b {
						c[a] = max(c[a], nv(a, b))
					}
				}
			}
			for _, a := range x.sel {
				for _, b := range x.sel {
					if a != b && nv(a, b) != min(c[a], c[b]) {
						ok = false
					}
				}
			}
		}
		if ok {
			for _, a := range x.sel {
				if c[a] == 0 {
					continue
				}
				if len(switchIDs) == 0 {
					placeholder, _ := parseBusID("fffffff:ff:ff.0")
					links[a] = append(links[a], nvlinkElem{target: placeholder, count: c[a], tclass: "0x068000"})
					continue
				}
				k := len(switchIDs)
				for s, id := range switchIDs {
					cnt := c[a] / k
					if s < c[a]%k {
						cnt++
					}
					if cnt > 0 {
						links[a] = append(links[a], nvlinkElem{target: id, count: cnt, tclass: "0x068000"})
					}
				}
			}
			return links, switchIDs, nil
		}
	}
	for _, a := range x.sel {
		for _, b := range x.sel {
			if c := nv(a, b); a != b && c > 0 {
				id, _ := parseBusID(n.GPUs[b].BusID)
				links[a] = append(links[a], nvlinkElem{target: id, count: c, tclass: "0x030200"})
			}
		}
	}
	return links, switchIDs, nil
}
