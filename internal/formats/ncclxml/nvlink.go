package ncclxml

// NVLink: the builder's last step, which puts the file's <nvlink> elements
// (or, where the file has none, what the options say) over the PCIe
// classes, and the NVLink generation and GPU model it reads from the file.

import (
	"fmt"
	"strings"

	"github.com/toposched/toposched/internal/topology"
)

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
