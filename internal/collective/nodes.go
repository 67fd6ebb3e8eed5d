package collective

import (
	"fmt"

	"github.com/toposched/toposched/internal/topology"
)

// NodeSpec describes a common GPU server shape, for tests, validation and
// benchmarks: GPUs linked all-pairs through NVSwitches (NVLinks > 0) or
// over PCIe (PCIePaths, default PIX), and NICs shared by consecutive GPUs.
type NodeSpec struct {
	Name      string
	GPUs      int
	Model     string
	NVLinks   int // per GPU pair through NVSwitches; 0: no NVLink
	NVLinkGen int
	PCIeGen   int
	// NICs at NICGbps each; GPU g's nearest NIC is g*NICs/GPUs (PIX).
	NICs    int
	NICGbps float64
	// Transport is the NICs' (topology.NIC.Transport; "": InfiniBand).
	Transport string
	// PCIePath gives the class between two GPUs without NVLink (nil: PIX).
	PCIePath func(a, b int) topology.Class
	// NoP2P: no pair of GPUs can use P2P (nvidia-smi topo -p2p prints NS).
	NoP2P bool
	// CPU is the host's (NCCL XML's <cpu>; zero: not known).
	CPU topology.CPU
}

// BuildNode makes the node a spec describes.
func BuildNode(s NodeSpec) *topology.Node {
	n := &topology.Node{Name: s.Name, NVLinkGen: s.NVLinkGen, PCIeGen: s.PCIeGen, CPU: s.CPU}
	if s.NVLinks > 0 {
		n.NVSwitches = 1
	}
	for g := range s.GPUs {
		n.GPUs = append(n.GPUs, topology.GPU{Index: g, Model: s.Model, NUMA: -1})
	}
	n.GPUPaths = make([][]topology.Link, s.GPUs)
	for a := range s.GPUs {
		n.GPUPaths[a] = make([]topology.Link, s.GPUs)
		for b := range s.GPUs {
			switch {
			case a == b:
				n.GPUPaths[a][b] = topology.Link{Class: topology.Self}
			case s.NVLinks > 0:
				n.GPUPaths[a][b] = topology.Link{Class: topology.NV, NVLinks: s.NVLinks}
			case s.PCIePath != nil:
				n.GPUPaths[a][b] = topology.Link{Class: s.PCIePath(a, b)}
			default:
				n.GPUPaths[a][b] = topology.Link{Class: topology.PIX}
			}
		}
	}
	if s.NoP2P {
		n.P2P = make([][]topology.P2PStatus, s.GPUs)
		for a := range s.GPUs {
			n.P2P[a] = make([]topology.P2PStatus, s.GPUs)
			for b := range s.GPUs {
				n.P2P[a][b] = topology.P2PNotSupported
				if a == b {
					n.P2P[a][b] = topology.P2PSelf
				}
			}
		}
	}
	if s.NICs > 0 {
		for k := range s.NICs {
			n.NICs = append(n.NICs, topology.NIC{Index: k, Name: fmt.Sprintf("mlx5_%d", k), RateGbps: s.NICGbps, RDMA: true, NUMA: -1, Transport: s.Transport})
		}
		n.NICPaths = make([][]topology.Link, s.GPUs)
		for g := range s.GPUs {
			n.NICPaths[g] = make([]topology.Link, s.NICs)
			near := g * s.NICs / s.GPUs
			for k := range s.NICs {
				n.NICPaths[g][k] = topology.Link{Class: topology.SYS}
				if k == near {
					n.NICPaths[g][k] = topology.Link{Class: topology.PIX}
				}
			}
		}
	}
	return n
}

// NodeRanks places one rank on each of the given GPUs of n (all when none
// is given), in that order.
func NodeRanks(n *topology.Node, gpus ...int) []Rank {
	if len(gpus) == 0 {
		gpus = make([]int, len(n.GPUs))
		for i := range gpus {
			gpus[i] = i
		}
	}
	out := make([]Rank, len(gpus))
	for i, g := range gpus {
		out[i] = Rank{Node: n, GPU: g}
	}
	return out
}

// NodesRanks places the first gpusPerNode GPUs of each node, node by node.
func NodesRanks(nodes []*topology.Node, gpusPerNode int) []Rank {
	var out []Rank
	for _, n := range nodes {
		for g := range min(gpusPerNode, len(n.GPUs)) {
			out = append(out, Rank{Node: n, GPU: g})
		}
	}
	return out
}
