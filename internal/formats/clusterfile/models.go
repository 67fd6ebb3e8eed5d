package clusterfile

import (
	"fmt"
	"slices"
	"strings"

	"github.com/toposched/toposched/internal/topology"
)

// builtin describes a node model as its vendor documents it. The dgx-a100
// layout is checked against the rows of a real DGX A100's `nvidia-smi topo
// -m` (NVIDIA/nccl issue 1505, in nvsmi/testdata), the H100 ones against a
// real HGX H100's GPU rows (HazyResearch/ThunderKittens issue 167).
type builtin struct {
	doc        string
	gpuModel   string
	memoryMiB  int
	gpus       int
	nvlinks    int // per GPU pair through NVSwitch; 0: no NVLink
	nvswitches int
	nvlinkGen  int
	pcieGen    int
	gpuNUMA    []int
	nics       []string
	nicRate    float64
	// gpuNIC[g] lists, per NIC, the class from GPU g; built by layout.
	layout func(g, k int) topology.Class
}

var builtins = map[string]builtin{
	// DGX A100: 8 A100-SXM4 on 6 NVSwitches (12 NVLink 3 links per GPU),
	// two GPUs and two HDR NICs per PCIe switch complex, AMD EPYC in NPS4
	// (NUMA 3,3,1,1,7,7,5,5 as a real DGX A100 prints it).
	"dgx-a100": {
		doc:      "NVIDIA DGX A100: 8x A100-SXM4-80GB, NVSwitch (NV12), 8x 200 Gb/s HDR",
		gpuModel: "A100-SXM4-80GB", memoryMiB: 81920, gpus: 8,
		nvlinks: 12, nvswitches: 6, nvlinkGen: 3, pcieGen: 4,
		gpuNUMA: []int{3, 3, 1, 1, 7, 7, 5, 5},
		nics:    []string{"mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3", "mlx5_6", "mlx5_7", "mlx5_8", "mlx5_9"},
		nicRate: 200,
		layout: func(g, k int) topology.Class {
			if g/2 == k/2 {
				return topology.PXB
			}
			return topology.SYS
		},
	},
	// DGX H100 / HGX H100: 8 H100-SXM5 on 4 NVSwitches (18 NVLink 4 links
	// per GPU), one 400 Gb/s ConnectX-7 beside each GPU, two sockets.
	"dgx-h100": h100("NVIDIA DGX H100: 8x H100-SXM5-80GB, NVSwitch (NV18), 8x 400 Gb/s NDR"),
	"hgx-h100": h100("HGX H100 8-GPU board: 8x H100-SXM5-80GB, NVSwitch (NV18), 8x 400 Gb/s NDR"),
	// A generic two-socket PCIe server: pairs of GPUs under four PCIe
	// switches, two per socket, one 100 Gb/s NIC on the first switch of
	// each socket; no NVLink.
	"pcie-8gpu": {
		doc:      "2-socket PCIe Gen4 server: 8 GPUs in pairs under 4 PCIe switches, 2x 100 Gb/s, no NVLink",
		gpuModel: "", gpus: 8, pcieGen: 4,
		gpuNUMA: []int{0, 0, 0, 0, 1, 1, 1, 1},
		nics:    []string{"mlx5_0", "mlx5_1"},
		nicRate: 100,
		layout: func(g, k int) topology.Class {
			switch {
			case g/4 != k:
				return topology.SYS
			case g/2 == 2*k:
				return topology.PIX
			}
			return topology.NODE
		},
	},
}

func h100(doc string) builtin {
	return builtin{
		doc: doc, gpuModel: "H100-SXM5-80GB", memoryMiB: 81920, gpus: 8,
		nvlinks: 18, nvswitches: 4, nvlinkGen: 4, pcieGen: 5,
		gpuNUMA: []int{0, 0, 0, 0, 1, 1, 1, 1},
		nics:    []string{"mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_7"},
		nicRate: 400,
		layout: func(g, k int) topology.Class {
			switch {
			case g == k:
				return topology.PIX
			case g/4 == k/4:
				return topology.NODE
			}
			return topology.SYS
		},
	}
}

// Models lists the built-in node models with what each one is.
func Models() map[string]string {
	out := make(map[string]string, len(builtins))
	for name, b := range builtins {
		out[name] = b.doc
	}
	return out
}

// Model returns the topology of a built-in node model.
func Model(name string) (*topology.Node, error) {
	b, ok := builtins[name]
	if !ok {
		names := make([]string, 0, len(builtins))
		for n := range builtins {
			names = append(names, n)
		}
		slices.Sort(names)
		return nil, fmt.Errorf("unknown node model %q: expected one of %s", name, strings.Join(names, ", "))
	}
	n := &topology.Node{NVSwitches: b.nvswitches, NVLinkGen: b.nvlinkGen, PCIeGen: b.pcieGen, Source: "model " + name}
	for g := range b.gpus {
		n.GPUs = append(n.GPUs, topology.GPU{Index: g, Model: b.gpuModel, MemoryMiB: b.memoryMiB, NUMA: b.gpuNUMA[g]})
	}
	for k, name := range b.nics {
		numa := -1
		for g := range b.gpus {
			if b.layout(g, k) != topology.SYS {
				numa = b.gpuNUMA[g]
				break
			}
		}
		n.NICs = append(n.NICs, topology.NIC{Index: k, Name: name, RateGbps: b.nicRate, RDMA: true, NUMA: numa})
	}
	for a := range b.gpus {
		row := make([]topology.Link, b.gpus)
		nicRow := make([]topology.Link, len(b.nics))
		for c := range b.gpus {
			switch {
			case a == c:
				row[c] = topology.Link{Class: topology.Self}
			case b.nvlinks > 0:
				row[c] = topology.Link{Class: topology.NV, NVLinks: b.nvlinks}
			default:
				row[c] = topology.Link{Class: pcieClass(b, a, c)}
			}
		}
		for k := range b.nics {
			nicRow[k] = topology.Link{Class: b.layout(a, k)}
		}
		n.GPUPaths = append(n.GPUPaths, row)
		n.NICPaths = append(n.NICPaths, nicRow)
	}
	if err := n.Validate(); err != nil {
		return nil, fmt.Errorf("model %s: %w", name, err)
	}
	return n, nil
}

// pcieClass is the class between two GPUs of a PCIe-only model: under one
// switch PIX, on one socket NODE, else SYS.
func pcieClass(b builtin, a, c int) topology.Class {
	switch {
	case a/2 == c/2:
		return topology.PIX
	case b.gpuNUMA[a] == b.gpuNUMA[c]:
		return topology.NODE
	}
	return topology.SYS
}
