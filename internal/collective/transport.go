package collective

// Transport: which of NCCL's transports joins two GPUs of a node, P2P
// (through PCIe or NVLink, straight into the peer's memory) or SHM
// (through host memory), decided as NCCL decides it. Between nodes it is
// always NET (route).
//
// NCCL (src/graph/paths.cc, ncclTopoCheckP2p) uses P2P between two GPUs
// when their path type is no farther than its P2P level, and NVML says
// P2P works between them (topology.Node.P2P); otherwise it reroutes the
// pair through the CPU (addInterStep in ncclTopoComputePaths) and the SHM
// transport (src/transport/shm.cc) carries it. The level:
//
//   - NCCL_P2P_DISABLE=1 makes it LOC (no P2P at all), else NCCL_P2P_LEVEL
//     sets it (Tuning.P2PLevel, P2PLevelFromEnv);
//   - 2.7.3 to 2.22 (Tuning.P2PPXB false): SYS (P2P at any distance),
//     but PXB on Intel, ARM and Zhaoxin CPUs ("Don't use P2P through ARM
//     CPUs" and the Intel and Zhaoxin rules after it);
//   - 2.23 on (Tuning.P2PPXB true): PXB ("By default don't use P2P across
//     CPU Host Bridges and further apart"), but SYS on AMD CPUs when the
//     communicator has at most two GPUs on the node.
//
// NCCL knows its CPU; the model knows it where the source said
// (topology.Node.CPU, from NCCL XML). Where it did not, the model takes
// the release's default without the CPU's exception: SYS before 2.23 (P2P
// everywhere, as the model priced every node before it read CPUs), PXB
// from 2.23 on.

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/toposched/toposched/internal/topology"
)

// p2pLevel is the farthest path class over which NCCL uses P2P between
// two GPUs of a node with this CPU, gpus of the communicator's GPUs on
// it. NCCL has no NODE: every path through a CPU is its PHB, so a level
// of PHB is NODE here.
func p2pLevel(t *Tuning, cpu topology.CPU, gpus int) topology.Class {
	if t.P2PLevel != topology.Unknown {
		return t.P2PLevel
	}
	k := cpu.Kind()
	if t.P2PPXB {
		if k.AMD() && gpus <= 2 {
			return topology.SYS
		}
		return topology.PXB
	}
	if k.Intel() || k.Zhaoxin() || k == topology.CPUARM {
		return topology.PXB
	}
	return topology.SYS
}

// usesSHM reports whether NCCL joins GPUs a and b of the node by SHM:
// their path class is past the node's P2P level, or NVML says P2P does
// not work between them.
func (nd *nodeInfo) usesSHM(a, b int, cl topology.Class) bool {
	if nd.n.P2POff(a, b) {
		return true
	}
	// Without a matrix the path is not known (routeLocal takes PHB):
	// no level applies.
	return nd.n.GPUPaths != nil && cl > nd.p2pLevel
}

// setTransport fixes the node's P2P level for the ranks the root placed
// on it, and whether any pair under one PCIe switch goes through host
// memory (the node then has a host link, kHost).
func (m *model) setTransport(nd *nodeView) {
	nd.p2pLevel = p2pLevel(m.tuning.tuning(), nd.n.CPU, len(nd.ranks))
	nd.hostLink = nd.n.AnyP2POff()
	if nd.hostLink || nd.n.GPUPaths == nil {
		return
	}
	for a, row := range nd.n.GPUPaths {
		for b, l := range row {
			if a != b && (l.Class == topology.PIX || l.Class == topology.PXB) && nd.usesSHM(a, b, l.Class) {
				nd.hostLink = true
				return
			}
		}
	}
}

// usesGDR reports whether NCCL's net transport moves a GPU's bytes in
// direction dir (tx: what it sends, rx: what it receives) between its
// NIC and the GPU's memory directly (GPUDirect RDMA), as ncclTopoCheckGdr
// decides (src/graph/paths.cc, the same from 2.7 to 2.30): only where the
// GPU's path to the NIC is no farther than NCCL_NET_GDR_LEVEL's default,
// PXB (one or more PCIe switches, not through a CPU); and for sends (the
// NIC reads GPU memory) only on a GPU with an NVLink peer or alone on its
// node, or, from 2.19, of compute capability 8.0 and later ("Disable GDR
// Reads pre-Ampere when we have other PCI flows"). Otherwise the GPU's
// own threads copy its bytes to or from a buffer in host memory that the
// NIC reads or writes. A GPU whose NIC path is not known (no NIC listed,
// or no GPU-NIC matrix) takes GDR: NICs beside their GPUs under one
// PCIe switch, as in the HGX and DGX reference designs.
func (m *model) usesGDR(nd *nodeView, gpu int, dir int32) bool {
	k := nd.localNICs[gpu]
	if k < 0 || gpu >= len(nd.n.NICPaths) || k >= len(nd.n.NICPaths[gpu]) {
		return true
	}
	if cl := nd.n.NICPaths[gpu][k].Class; cl > topology.PXB {
		return false
	}
	if dir != tx || len(nd.n.GPUs) == 1 || m.tuning.tuning().GDRReadAmpere && nd.cc >= 80 {
		return true
	}
	if gpu < len(nd.n.GPUPaths) {
		for i, l := range nd.n.GPUPaths[gpu] {
			if i != gpu && l.Class.NVLink() {
				return true
			}
		}
	}
	return false
}

// P2PLevelFromEnv reads NCCL's P2P settings as ncclGetLevel does
// (src/graph/paths.cc): disable is NCCL_P2P_DISABLE ("1": no P2P, the
// level LOC, topology.Self), level NCCL_P2P_LEVEL, a path type (LOC, NVL,
// NVB, C2C, PIX, PXB, P2C, PXN, PHB, SYS) or an old-style number (0 LOC,
// 1 PIX, 2 PXB, 3 PHB, 4 and up SYS). Both empty: topology.Unknown, the
// release's default. C2C counts as NVB and P2C and PXN as PXB, which is
// where they fall between two GPUs; PHB is NODE (see p2pLevel). NCCL
// ignores a value it cannot read; this refuses it.
func P2PLevelFromEnv(disable, level string) (topology.Class, error) {
	if d := strings.TrimSpace(disable); d != "" {
		n, err := strconv.ParseInt(d, 0, 64)
		if err != nil {
			return topology.Unknown, fmt.Errorf("NCCL_P2P_DISABLE %q: expected an integer", disable)
		}
		if n == 1 {
			return topology.Self, nil
		}
	}
	l := strings.TrimSpace(level)
	if l == "" {
		return topology.Unknown, nil
	}
	byName := map[string]topology.Class{
		"LOC": topology.Self, "NVL": topology.NV, "NVB": topology.NVB, "C2C": topology.NVB,
		"PIX": topology.PIX, "PXB": topology.PXB, "P2C": topology.PXB, "PXN": topology.PXB,
		"PHB": topology.NODE, "SYS": topology.SYS,
	}
	if c, ok := byName[l]; ok {
		return c, nil
	}
	if l[0] >= '0' && l[0] <= '9' {
		n, err := strconv.Atoi(l)
		if err == nil {
			old := []topology.Class{topology.Self, topology.PIX, topology.PXB, topology.NODE, topology.SYS}
			return old[min(n, len(old)-1)], nil
		}
	}
	return topology.Unknown, fmt.Errorf("NCCL_P2P_LEVEL %q: expected LOC, NVL, NVB, C2C, PIX, PXB, P2C, PXN, PHB, SYS or 0-5", level)
}

// nvLinkPerLinkOf is the NVLink rate (GB/s per link and direction) of a
// GPU model whose links run slower than their generation's, 0 for the
// rest: the GA102 boards (RTX 3090, RTX A6000, A5000, A4500, A40) have
// "four x4 links, with each link providing 14.0625 GB/sec bandwidth in
// each direction" (NVIDIA Ampere GA102 GPU Architecture whitepaper;
// "112.5 GB/s (bidirectional)" on the RTX A6000 datasheet), where the
// A100's x8 links run at 25. NCCL counts 12 per link for them
// (topo.h SM86_NVLINK_BW) against 20 for the A100's (SM80_NVLINK_BW),
// the same ratio.
func nvLinkPerLinkOf(model string) float64 {
	// By whole words, so that an RTX A4000 (no NVLink) is not an A40.
	words := strings.FieldsFunc(strings.ToUpper(model), func(r rune) bool { return r == ' ' || r == '-' || r == '_' })
	for _, w := range words {
		switch w {
		case "3090", "A6000", "A5000", "A4500", "A40":
			return 112.5 / 2 / 4
		}
	}
	return 0
}

// WithP2PLevel is t (nil: DefaultTuning) with the P2P level the NCCL
// settings disable and level give (P2PLevelFromEnv).
func (t *Tuning) WithP2PLevel(disable, level string) (*Tuning, error) {
	l, err := P2PLevelFromEnv(disable, level)
	if err != nil {
		return nil, err
	}
	c := *t.tuning()
	c.P2PLevel = l
	return &c, nil
}
