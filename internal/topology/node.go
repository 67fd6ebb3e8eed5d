package topology

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// GPU is one GPU of a node.
type GPU struct {
	Index     int    `json:"index"`
	UUID      string `json:"uuid,omitempty"`
	BusID     string `json:"bus_id,omitempty"`
	Model     string `json:"model,omitempty"`
	MemoryMiB int    `json:"memory_mib,omitempty"`
	// NUMA is the GPU's NUMA node, -1 when the source does not say.
	NUMA        int    `json:"numa"`
	CPUAffinity string `json:"cpu_affinity,omitempty"`
	MIG         bool   `json:"mig,omitempty"`
}

// NIC is one network interface of a node, as RDMA device name (mlx5_0).
type NIC struct {
	Index    int     `json:"index"`
	Name     string  `json:"name"`
	BusID    string  `json:"bus_id,omitempty"`
	RateGbps float64 `json:"rate_gbps,omitempty"`
	RDMA     bool    `json:"rdma,omitempty"`
	// Transport is what carries NCCL's traffic through the NIC when it is
	// not InfiniBand or RoCE (empty): TransportEFA or TransportTCP. The
	// cost model calibrates each transport's efficiency on its own.
	Transport string `json:"transport,omitempty"`
	// NUMA is the NIC's NUMA node, -1 when the source does not say.
	NUMA int `json:"numa"`
}

// NIC transports besides InfiniBand and RoCE (NIC.Transport).
const (
	// TransportEFA is AWS's Elastic Fabric Adapter (libfabric over SRD).
	TransportEFA = "efa"
	// TransportTCP is NCCL over sockets, GPUDirect-TCPX(O) included.
	TransportTCP = "tcp"
)

// Transports lists the valid NIC.Transport values; "" is InfiniBand or
// RoCE.
var Transports = []string{"", TransportEFA, TransportTCP}

// Node is one node's topology.
type Node struct {
	Name string `json:"name,omitempty"`
	GPUs []GPU  `json:"gpus"`
	NICs []NIC  `json:"nics"`
	// GPUPaths[i][j] is the best path from GPUs[i] to GPUs[j].
	GPUPaths [][]Link `json:"gpu_paths"`
	// NICPaths[i][k] is the best path from GPUs[i] to NICs[k]; nil where
	// the source did not say.
	NICPaths [][]Link `json:"nic_paths,omitempty"`
	// P2P[i][j] is whether GPUs[i] can use CUDA peer-to-peer to GPUs[j]
	// (nvidia-smi topo -p2p, NVML GetP2PStatus); nil where the source did
	// not say, and then P2P is taken as available.
	P2P [][]P2PStatus `json:"p2p,omitempty"`
	// CPU is the node's host processor where the source says (NCCL XML);
	// it decides NCCL's P2P level and the inter-socket bandwidth.
	CPU CPU `json:"cpu,omitzero"`
	// NVSwitches counts the node's NVSwitch chips where the source says.
	NVSwitches int `json:"nvswitches,omitempty"`
	// NVLinkGen is the NVLink generation (2 for V100, 3 for A100, 4 for
	// H100/H200, 5 for B200/GB200), 0 when unknown.
	NVLinkGen int `json:"nvlink_gen,omitempty"`
	// PCIeGen is the PCIe generation of the GPUs' links, 0 when unknown.
	PCIeGen int `json:"pcie_gen,omitempty"`
	// Source names the file or API the node came from.
	Source string `json:"source,omitempty"`
	// Warnings list what the source lacked, for people to read.
	Warnings []string `json:"warnings,omitempty"`
	// Inferred list the facts worked out rather than read (Infer), each
	// with what it came from.
	Inferred []string `json:"inferred,omitempty"`
}

// Validate checks that the matrices are square over the GPUs, symmetric,
// and X exactly on the diagonal.
func (n *Node) Validate() error {
	var errs []error
	g := len(n.GPUs)
	if len(n.GPUPaths) != g {
		errs = append(errs, fmt.Errorf("gpu matrix has %d rows for %d GPUs", len(n.GPUPaths), g))
	}
	for i, row := range n.GPUPaths {
		if len(row) != g {
			errs = append(errs, fmt.Errorf("gpu matrix row %d has %d columns for %d GPUs", i, len(row), g))
			continue
		}
		for j, l := range row {
			if (i == j) != (l.Class == Self) {
				errs = append(errs, fmt.Errorf("GPU%d-GPU%d: %s is not allowed there", i, j, l))
			}
			if j < len(n.GPUPaths) && i < len(n.GPUPaths[j]) && n.GPUPaths[j][i] != l {
				errs = append(errs, fmt.Errorf("GPU%d-GPU%d is %s but GPU%d-GPU%d is %s", i, j, l, j, i, n.GPUPaths[j][i]))
			}
		}
	}
	if n.NICPaths != nil {
		if len(n.NICPaths) != g {
			errs = append(errs, fmt.Errorf("gpu-nic matrix has %d rows for %d GPUs", len(n.NICPaths), g))
		}
		for i, row := range n.NICPaths {
			if len(row) != len(n.NICs) {
				errs = append(errs, fmt.Errorf("gpu-nic matrix row %d has %d columns for %d NICs", i, len(row), len(n.NICs)))
			}
		}
	}
	errs = append(errs, n.validateP2P()...)
	return errors.Join(errs...)
}

// Path is the best path between two GPUs of a node, with what it gives.
type Path struct {
	Link
	// BandwidthGBps is the bottleneck bandwidth per direction.
	BandwidthGBps float64 `json:"bandwidth_gbps"`
	// LatencyUS is the one-way latency of a small message.
	LatencyUS float64 `json:"latency_us"`
}

// Path returns the best path between GPUs a and b (by position).
func (n *Node) Path(a, b int, bw *Bandwidths) Path {
	l := n.GPUPaths[a][b]
	bw = orDefaults(bw)
	gbps, lat := bw.Of(l, n.NVLinkGen, n.PCIeGen)
	return Path{Link: l, BandwidthGBps: gbps, LatencyUS: lat}
}

// NearestNIC returns the position of the NIC closest to GPU g, or -1 when
// the node has no NIC or the source gave no GPU-NIC paths. When several
// NICs are equally close and shared by several GPUs (two GPUs and two NICs
// under one PCIe switch), the GPUs are spread over them in index order, as
// NCCL does, rather than all given the first.
func (n *Node) NearestNIC(g int) int {
	best := n.bestNICClass(g)
	if best == Unknown {
		return -1
	}
	var cands []int
	for k, l := range n.NICPaths[g] {
		if l.Class == best {
			cands = append(cands, k)
		}
	}
	r := 0
	for h := range g {
		if n.bestNICClass(h) == best && n.NICPaths[h][cands[0]].Class == best {
			r++
		}
	}
	return cands[r%len(cands)]
}

func (n *Node) bestNICClass(g int) Class {
	if g >= len(n.NICPaths) {
		return Unknown
	}
	best := Unknown
	for _, l := range n.NICPaths[g] {
		if l.Class != Unknown && (best == Unknown || l.Class < best) {
			best = l.Class
		}
	}
	return best
}

// Flat is the topology assumed for a node whose report gave no paths: its
// GPUs, every pair through the host bridge (PHB), the slowest in-node path
// a report would show short of SYS. source says who assumed it.
func Flat(name, source string, gpus []GPU) *Node {
	t := &Node{Name: name, Source: source, GPUs: gpus}
	t.GPUPaths = make([][]Link, len(gpus))
	for a := range gpus {
		t.GPUPaths[a] = make([]Link, len(gpus))
		for b := range gpus {
			t.GPUPaths[a][b] = Link{Class: PHB}
			if a == b {
				t.GPUPaths[a][b] = Link{Class: Self}
			}
		}
	}
	return t
}

// SameLinks reports whether two nodes have the same GPUs and NICs (by
// index, model, memory, NUMA node and MIG; by name, rate, RDMA,
// transport and NUMA node) joined by the same paths: nodes that placement
// cannot tell apart, whatever their names, UUIDs and bus IDs. Two nil
// nodes are the same.
func (n *Node) SameLinks(o *Node) bool {
	if n == o {
		return true
	}
	return n.LinksKey() == o.LinksKey()
}

// LinksKey is a digest of what SameLinks compares.
type LinksKey [16]byte

// LinksKey returns the node's digest of what SameLinks compares (the
// first 16 bytes of a SHA-256 of it), the zero key for a nil node. A
// store computes it once per topology it keeps, so that comparing two
// nodes as placement sees them is comparing two keys.
func (n *Node) LinksKey() LinksKey {
	var k LinksKey
	if n == nil {
		return k
	}
	b := make([]byte, 0, 256)
	num := func(v int) { b = binary.AppendVarint(b, int64(v)) }
	str := func(v string) { num(len(v)); b = append(b, v...) }
	num(len(n.GPUs))
	num(len(n.NICs))
	num(n.NVSwitches)
	num(n.NVLinkGen)
	num(n.PCIeGen)
	for _, g := range n.GPUs {
		num(g.Index)
		str(g.Model)
		num(g.MemoryMiB)
		num(g.NUMA)
		b = append(b, boolByte(g.MIG))
	}
	for _, c := range n.NICs {
		num(c.Index)
		str(c.Name)
		b = binary.BigEndian.AppendUint64(b, math.Float64bits(c.RateGbps))
		b = append(b, boolByte(c.RDMA))
		str(c.Transport)
		num(c.NUMA)
	}
	for _, paths := range [][][]Link{n.GPUPaths, n.NICPaths} {
		num(len(paths))
		for _, row := range paths {
			num(len(row))
			for _, l := range row {
				num(int(l.Class))
				num(l.NVLinks)
			}
		}
	}
	// Only a node with a P2P matrix adds it, so that the keys of nodes
	// without one stay what they were.
	if n.P2P != nil {
		num(len(n.P2P))
		for _, row := range n.P2P {
			num(len(row))
			for _, s := range row {
				num(int(s))
			}
		}
	}
	// Likewise a node whose CPU is known.
	if n.CPU != (CPU{}) {
		str(n.CPU.Arch)
		str(n.CPU.Vendor)
		num(n.CPU.Family)
		num(n.CPU.Model)
	}
	sum := sha256.Sum256(b)
	copy(k[:], sum[:])
	return k
}

func boolByte(v bool) byte {
	if v {
		return 1
	}
	return 0
}
