package collective

// Protocols: NCCL's LL, LL128 and Simple, and its tuner's choice among
// them by message size, per NCCL version.
//
// The model's links and steps are those of the Simple protocol (its
// efficiencies and per-step latencies are Simple's, constants.go). LL and
// LL128 trade bandwidth for latency. Their figures are NCCL's own tuner
// tables (src/graph/tuning.cc), read from two releases: 2.7.5 and 2.20.3
// (Tuning27, Tuning220). Per algorithm and protocol NCCL keeps a base
// latency and a per-step latency for each kind of hardware (NVLink, PCI,
// network); the model scales its own Simple latencies by the ratio of the
// protocol's figure to ring/Simple's, so that a calibrated per-step
// overhead moves every protocol alike. The bandwidth term is divided by
// the protocol's factor over Simple (ring LL 1/4 or 1/3, ring LL128 0.92,
// tree LL 1/3.8, tree LL128 7/9 or 120/128), and a tree's by NCCL's
// correction for medium sizes (treeCorrectionFactor); a multi-node ring
// all-reduce pays NCCL's "plateau" latency factor. The protocol predicted
// is the one NCCL's tuner would pick, the fastest of those it enables:
// LL128 only on GPUs of one compute capability it supports, all on NVLink
// within a node and near their NICs across nodes.
//
// NCCL's per-channel bandwidth caps (llMaxBw, perChMaxRingLL128Bw) and
// its channel count per size are not modelled: they bind below about
// 1 MiB, where the latency terms decide.

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/toposched/toposched/internal/topology"
)

// Protocol is an NCCL protocol.
type Protocol string

// Protocols. AutoProtocol is NCCL's choice by its tuner.
const (
	AutoProtocol Protocol = "auto"
	LL           Protocol = "ll"
	LL128        Protocol = "ll128"
	Simple       Protocol = "simple"
)

// Protocols are NCCL's, in its order (the tables' index).
var Protocols = []Protocol{LL, LL128, Simple}

// ParseProtocol accepts ll, ll128, simple (any case) and auto or "".
func ParseProtocol(s string) (Protocol, error) {
	switch p := Protocol(strings.ToLower(strings.TrimSpace(s))); p {
	case "":
		return AutoProtocol, nil
	case AutoProtocol, LL, LL128, Simple:
		return p, nil
	}
	return "", fmt.Errorf("protocol %q: expected ll, ll128, simple or auto", s)
}

// NCCLName is the protocol's spelling in NCCL_PROTO.
func (p Protocol) NCCLName() string {
	switch p {
	case LL:
		return "LL"
	case LL128:
		return "LL128"
	}
	return "Simple"
}

func (p Protocol) index() int {
	switch p {
	case LL:
		return 0
	case LL128:
		return 1
	}
	return 2
}

// Hardware classes of NCCL's per-step latency table.
const (
	hwNVLink = iota
	hwPCI
	hwNet
)

// Tuning is one NCCL release's tuner: what its tables say and what it
// runs by default.
type Tuning struct {
	// Version is the release the tables were read from.
	Version string
	// BaseLat and HWLat are tuning.cc's baseLat and hwLat (µs) for tree
	// and ring (rowTree, rowRing), by protocol in NCCL's order (LL,
	// LL128, Simple); HWLat by hardware class (NVLink, PCI, network).
	BaseLat [2][3]float64
	HWLat   [3][2][3]float64
	// TreeLL128Multi is tree LL128's bandwidth factor across nodes.
	TreeLL128Multi float64
	// TreeCorrection is treeCorrectionFactor: a tree's bandwidth factor
	// by protocol and log2(bytes/64), 1 past the table.
	TreeCorrection [3][]float64
	// Plateau multiplies a multi-node ring/Simple all-reduce's latency
	// at sizes of nRanks/16 x 64 KiB and more, by the GPUs' compute
	// capability (PlateauAmpere from 8.0 on).
	Plateau, PlateauAmpere float64
	// LL128 lists the compute capabilities (x10) LL128 is on by default
	// for; from LL128PXNOn on, a NIC reached through an NVLink peer
	// (PXN) is near enough for it.
	LL128      []int
	LL128NVB   bool // an NVLink bridge counts as NVLink for LL128
	LL128PXNOn int  // compute capability from which PXN is near enough (0: never)
	// NVLS and NVLSTree: the release runs them (2.17 and 2.18 on), and
	// their hwLat (µs): NVLSLat the whole in-switch reduction inside a
	// node (no base latency), NVLSTreeNetLat a step between nodes.
	NVLS, NVLSTree          bool
	NVLSLat, NVLSTreeNetLat float64
	// NVLSTreeChunk is the chunk an NVLS-tree starts from before cutting
	// it for a short message (0: one Simple step, 512 KiB), and
	// NVLSChannelsSM100 the channels NVLS and NVLS-tree run on with
	// Blackwell GPUs (0: NVLSChannels, as on Hopper); ramp.go.
	NVLSTreeChunk     float64
	NVLSChannelsSM100 int
	// P2PPXB: the release's default P2P level is PXB (2.23 on), not SYS
	// with CPU exceptions (transport.go).
	P2PPXB bool
	// GDRReadAmpere: the NIC reads what a GPU sends straight from its
	// memory on GPUs of compute capability 8.0 and later without NVLink
	// too (2.19 on), not only on GPUs with an NVLink peer (usesGDR).
	GDRReadAmpere bool
	// P2PLevel is NCCL_P2P_LEVEL or NCCL_P2P_DISABLE where set
	// (WithP2PLevel), topology.Unknown for the release's default.
	P2PLevel topology.Class
}

// Tuning27 is NCCL 2.7.5's tuner (src/graph/tuning.cc at v2.7.5-1).
var Tuning27 = &Tuning{
	Version: "2.7.5",
	BaseLat: [2][3]float64{rowTree: {4.4, 4.4, 0}, rowRing: {3.6, 10.0, 8.4}},
	HWLat: [3][2][3]float64{
		hwNVLink: {rowTree: {.52, 1.2, 28}, rowRing: {.47, 1.9, 3.4}},
		hwPCI:    {rowTree: {1.0, 1.9, 28}, rowRing: {1.0, 2.5, 5.7}},
		hwNet:    {rowTree: {5.0, 8.5, 50}, rowRing: {2.7, 4.0, 9.6}},
	},
	TreeLL128Multi: 0.915,
	TreeCorrection: [3][]float64{
		{1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0},
		{1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .5, .6, .6, .7, .7, .8, .9, .9, 1.0},
		{.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .5, .5, .6, .6, .7, .8, .9},
	},
	Plateau: 1.9, PlateauAmpere: 1.9,
	LL128: []int{70, 80},
}

// Tuning220 is NCCL 2.20.3's tuner (src/graph/tuning.cc at v2.20.3-1).
var Tuning220 = &Tuning{
	Version: "2.20.3",
	BaseLat: [2][3]float64{rowTree: {6.8, 14.0, 0}, rowRing: {6.6, 14.0, 8.4}},
	HWLat: [3][2][3]float64{
		hwNVLink: {rowTree: {.6, 1.25, 28}, rowRing: {.6, 1.9, 3.4}},
		hwPCI:    {rowTree: {1.0, 1.9, 28}, rowRing: {1.0, 2.5, 5.7}},
		hwNet:    {rowTree: {5.0, 8.5, 28}, rowRing: {2.7, 4.0, 14.0}},
	},
	TreeLL128Multi: 120.0 / 128,
	TreeCorrection: [3][]float64{
		{1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0, 1.0},
		{1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1.0, 1.0},
		{.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9},
	},
	Plateau: 1.9, PlateauAmpere: 1.4,
	LL128:    []int{70, 80, 90},
	LL128NVB: true, LL128PXNOn: 90,
	NVLS: true, NVLSTree: true,
	NVLSLat: 23, NVLSTreeNetLat: 14,
	GDRReadAmpere: true,
}

// Tuning226 is NCCL 2.26.6's tuner (src/graph/tuning.cc at v2.26.6-1, the
// release google/dranet's A4 all_gather names), where it differs from
// 2.20.3 in what the model reads: NVLS's NVLink latency 25 µs (from
// 2.21.5); LL128 on Blackwell (compute capability 10.0 and 12.0: "case
// 100", "case 120" of its LL128 switch; NCCL 2.25.1 added Blackwell,
// "Add Blackwell/SM100 support"); an NVLS-tree chunk that starts at
// comm->nvlsChunkSize, NCCL_NVLS_CHUNKSIZE's 128 KiB, not one step
// (src/enqueue.cc, from 2.21.5; src/transport/nvls.cc); and 32 NVLS
// channels on Blackwell (NVLS_NCHANNELS_SM100, src/transport/nvls.cc).
// Its tree/Simple latencies (4 µs NVLink, 14 µs network, down from 28)
// change nothing here: the model prices Simple with its own step
// latencies and scales only LL and LL128 by the tables.
var Tuning226 = &Tuning{
	Version: "2.26.6",
	BaseLat: Tuning220.BaseLat,
	HWLat: [3][2][3]float64{
		hwNVLink: {rowTree: {.6, 1.25, 4.0}, rowRing: {.6, 1.9, 3.4}},
		hwPCI:    {rowTree: {1.0, 1.9, 4.0}, rowRing: {1.0, 2.5, 5.7}},
		hwNet:    {rowTree: {5.0, 8.5, 14}, rowRing: {2.7, 4.0, 14.0}},
	},
	TreeLL128Multi: Tuning220.TreeLL128Multi,
	TreeCorrection: Tuning220.TreeCorrection,
	Plateau:        1.9, PlateauAmpere: 1.4,
	LL128:    []int{70, 80, 90, 100, 120},
	LL128NVB: true, LL128PXNOn: 90,
	NVLS: true, NVLSTree: true,
	NVLSLat: 25, NVLSTreeNetLat: 14,
	NVLSTreeChunk: 128 << 10, NVLSChannelsSM100: 32,
	GDRReadAmpere: true,
}

// DefaultTuning is the tuner predictions assume unless told a version.
var DefaultTuning = Tuning220

// TuningFor is the tuner of an NCCL version ("2.18.3", "2.21"): the
// tables of the nearest release read (2.7.5 before 2.17, 2.20.3 from
// 2.17 to 2.20, 2.26.6 from 2.21 on, whose NVLS latency and NVLS-tree
// chunk came with 2.21.5: the tables between are not in this repository),
// with NVLS from 2.17 and NVLS-tree from 2.18, when NCCL added them, and
// the P2P level's default of 2.23 from 2.23 on. "" is DefaultTuning.
func TuningFor(version string) (*Tuning, error) {
	v := strings.TrimPrefix(strings.TrimSpace(version), "v")
	if v == "" {
		return DefaultTuning, nil
	}
	bad := fmt.Errorf("nccl version %q: expected 2.MINOR[.PATCH[-BUILD]], such as 2.20.3", version)
	parts := strings.Split(v, ".")
	if len(parts) < 2 || len(parts) > 3 {
		return nil, bad
	}
	num := func(s string) (int, bool) {
		n, err := strconv.Atoi(s)
		return n, err == nil && n >= 0 && s != "" && s[0] != '+'
	}
	major, ok1 := num(parts[0])
	minor, ok2 := num(parts[1])
	ok3 := true
	if len(parts) == 3 {
		patch, _, _ := strings.Cut(parts[2], "-")
		_, ok3 = num(patch)
	}
	if !ok1 || !ok2 || !ok3 || major != 2 {
		return nil, bad
	}
	switch {
	case minor < 17:
		t := *Tuning27
		t.Version = v
		return &t, nil
	case minor == 17:
		t := *Tuning220
		t.Version, t.NVLSTree, t.GDRReadAmpere = v, false, false
		return &t, nil
	case minor <= 20:
		t := *Tuning220
		t.Version = v
		// GDR reads on Ampere and later without NVLink from 2.19.3
		// (ncclTopoCheckGdr, src/graph/paths.cc).
		t.GDRReadAmpere = minor >= 19
		return &t, nil
	}
	t := *Tuning226
	t.Version = v
	// The default P2P level became PXB in 2.23.4 (src/graph/paths.cc).
	t.P2PPXB = minor >= 23
	return &t, nil
}

func (t *Tuning) tuning() *Tuning {
	if t == nil {
		return DefaultTuning
	}
	return t
}

// nvlsChannels is the channels NVLS and NVLS-tree run on, by the
// release and the GPUs' compute capability.
func (m *model) nvlsChannels() int {
	if m.tuning.NVLSChannelsSM100 > 0 {
		for _, nd := range m.nodes {
			if nd.cc >= 100 {
				return m.tuning.NVLSChannelsSM100
			}
		}
	}
	return NVLSChannels
}

// The tables' rows: tree's for tree, ring's for the rest.
const (
	rowTree = iota
	rowRing
)

func algoRow(a Algorithm) int {
	if a == Tree {
		return rowTree
	}
	return rowRing
}

// protocols lists the protocols algorithm a runs on the model's ranks:
// LL, LL128 and Simple for ring and tree (LL128 where ll128 says), Simple
// for the others. Across nodes the network's plugin can take protocols
// away: AWS's (aws-ofi-nccl) sets NCCL_PROTO=simple on EFA, as EFA before
// P5 (Hopper) does not deliver LL's flags in order (aws/aws-ofi-nccl#76,
// #280), and on TCP providers (#850); Google's GPUDirect-TCPXO profile
// (nccl-env-profile.sh) sets NCCL_PROTO=Simple,LL128, NCCL_ALGO=Ring,Tree
// and NCCL_NVLS_ENABLE=0, so over TCP NICs LL does not run (nor NVLS-tree,
// overTCP).
func (m *model) protocols(a Algorithm) []Protocol {
	if a != Ring && a != Tree {
		return Protocols[2:]
	}
	if m.protos == nil {
		m.protos = m.ringProtocols()
	}
	return m.protos
}

func (m *model) ringProtocols() []Protocol {
	ll, ll128 := true, m.ll128()
	if len(m.nodes) > 1 {
		for _, nd := range m.nodes {
			for _, k := range nd.nics {
				if nd.nicKind[k+1] == topology.TransportEFA && nd.cc < 90 {
					return Protocols[2:]
				}
			}
		}
		ll = !m.overTCP()
	}
	switch {
	case ll && ll128:
		return Protocols
	case ll:
		return protocolsLL
	case ll128:
		return Protocols[1:]
	}
	return Protocols[2:]
}

var protocolsLL = []Protocol{LL, Simple}

// scale is a protocol's cost relative to the model's Simple terms: the
// operation latency's, each hardware class's step latency's, and the
// bandwidth term's (a divisor: the share of Simple's bandwidth).
type scale struct {
	op   float64
	step [3]float64
	bw   float64
	// ramp: the protocol forwards whole chunks, so a pipeline of them
	// fills (Simple; ramp.go).
	ramp bool
}

var simpleScale = scale{op: 1, step: [3]float64{1, 1, 1}, bw: 1, ramp: true}

// scaleOf is protocol p's scale for algorithm a running collective c of
// S bytes over n ranks on nodes nodes.
func (t *Tuning) scaleOf(c Collective, a Algorithm, p Protocol, S float64, n, nodes int, ampere bool) scale {
	s := simpleScale
	if (a == NVLS || a == NVLSTree) && t.NVLSLat > 0 {
		// The model's in-switch reduction is two NVLink steps and an
		// operation latency; NCCL's tuner charges NVLSLat for it all.
		s.op = 0
		s.step[hwNVLink] = t.NVLSLat / (2 * t.HWLat[hwNVLink][rowRing][2])
		s.step[hwNet] = t.NVLSTreeNetLat / t.HWLat[hwNet][rowRing][2]
		return s
	}
	row := algoRow(a)
	pi := p.index()
	s.ramp = p == Simple
	if p != Simple {
		s.op = t.BaseLat[row][pi] / t.BaseLat[rowRing][2]
		for hw := range 3 {
			s.step[hw] = t.HWLat[hw][row][pi] / t.HWLat[hw][rowRing][2]
		}
		if nodes > 1 && pi == 0 {
			// NCCL: an LL step inside a node of a multi-node job costs 1.8x.
			s.step[hwNVLink] *= 1.8
			s.step[hwPCI] *= 1.8
		}
	}
	switch {
	case a == Ring && p == LL:
		s.bw = 1.0 / 3
		if nodes > 1 || c == AllReduce {
			s.bw = 1.0 / 4
		}
	case a == Ring && p == LL128:
		s.bw = 0.92
		if n <= nodes { // one GPU per node sends and receives through the NIC
			s.bw = 0.7
		}
	case a == Tree && p == LL:
		s.bw = 1 / 3.8
	case a == Tree && p == LL128:
		s.bw = 7.0 / 9
		if nodes > 1 {
			s.bw = t.TreeLL128Multi
		}
	}
	if a == Tree {
		s.bw *= t.treeCorrection(pi, S)
	}
	if a == Ring && p == Simple && c == AllReduce && nodes > 1 && S >= float64(n)/16*65536 {
		pl := t.Plateau
		if ampere {
			pl = t.PlateauAmpere
		}
		s.op *= pl
		for hw := range 3 {
			s.step[hw] *= pl
		}
	}
	return s
}

func (t *Tuning) treeCorrection(pi int, S float64) float64 {
	b := int64(S) >> 6
	if b <= 0 {
		return t.TreeCorrection[pi][0]
	}
	log := 0
	for b > 1 {
		b >>= 1
		log++
	}
	if log < len(t.TreeCorrection[pi]) {
		return t.TreeCorrection[pi][log]
	}
	return 1
}

// ComputeCapability is a node's GPUs' CUDA compute capability times ten
// (80 for A100), from the NVLink generation where known, else the GPU
// model's name; 0 when neither says.
func ComputeCapability(n *topology.Node) int {
	switch n.NVLinkGen {
	case 2:
		return 70
	case 3:
		return 80
	case 4:
		return 90
	case 5:
		return 100
	}
	if len(n.GPUs) == 0 {
		return 0
	}
	m := strings.ToUpper(n.GPUs[0].Model)
	for _, k := range []struct {
		names []string
		cc    int
	}{
		{[]string{"GB200", "B200", "B100", "GB300", "B300"}, 100},
		{[]string{"H100", "H200", "H800", "H20", "GH200"}, 90},
		{[]string{"L40", "L4", "RTX 40", "RTX 6000 ADA"}, 89},
		{[]string{"A100", "A800", "A30"}, 80},
		{[]string{"A10", "A40", "RTX 30", "RTX A"}, 86},
		{[]string{"T4", "RTX 20", "QUADRO RTX"}, 75},
		{[]string{"V100"}, 70},
	} {
		for _, name := range k.names {
			if strings.Contains(m, name) {
				return k.cc
			}
		}
	}
	return 0
}

// scale is protocol p's scale for algorithm a running c of S bytes on the
// model's ranks.
func (m *model) scale(c Collective, a Algorithm, p Protocol, S float64) scale {
	if p == Simple && (a != Ring || len(m.nodes) == 1) && a != Tree && a != NVLS && a != NVLSTree {
		return simpleScale // the common case, at no cost
	}
	ampere := true
	if a == Ring && p == Simple { // only the plateau reads it
		for _, nd := range m.nodes {
			ampere = ampere && nd.cc >= 80
		}
	}
	return m.tuning.scaleOf(c, a, p, S, len(m.ranks), len(m.nodes), ampere)
}

// ll128 reports whether NCCL enables LL128 by default on the model's
// ranks: GPUs of one compute capability the release runs it on, every
// pair of a node's ranks on NVLink, and across nodes each rank's NIC
// under its PCIe switch tree (PXB or nearer), or (Hopper, 2.20) reached
// through an NVLink peer that has it so (PXN).
func (m *model) ll128() bool {
	t := m.tuning
	cc := -1
	for i, nd := range m.nodes {
		if cc >= 0 && nd.cc != cc {
			return false
		}
		cc = nd.cc
		paths := nd.n.GPUPaths
		for _, a := range nd.ranks {
			for _, b := range nd.ranks {
				if a == b {
					continue
				}
				if paths == nil {
					return false
				}
				cl := paths[m.ranks[a].gpu][m.ranks[b].gpu].Class
				if cl != topology.NV && (!t.LL128NVB || cl != topology.NVB) {
					return false
				}
			}
		}
		if len(m.nodes) > 1 && !m.nicsNear(int32(i), t.LL128PXNOn > 0 && cc >= t.LL128PXNOn) {
			return false
		}
	}
	return slices.Contains(t.LL128, cc)
}

// nicsNear reports whether each of a node's ranks reaches its NIC at PXB
// or nearer (or, with pxn, through an NVLink peer that does). A node
// whose GPU-NIC paths are not known counts as near.
func (m *model) nicsNear(i int32, pxn bool) bool {
	nd := m.nodes[i]
	n := nd.n
	if n.NICPaths == nil {
		return true
	}
	near := func(g, k int) bool { return n.NICPaths[g][k].Class <= topology.PXB }
	for _, r := range nd.ranks {
		g := m.ranks[r].gpu
		k := nd.localNICs[g]
		if k < 0 || k >= len(n.NICs) || near(g, k) {
			continue
		}
		ok := false
		for h := range n.GPUs {
			if pxn && h != g && n.GPUPaths != nil && n.GPUPaths[g][h].Class.NVLink() && near(h, k) {
				ok = true
				break
			}
		}
		if !ok {
			return false
		}
	}
	return true
}

// overTCP reports whether the model's ranks span nodes and some node's
// NICs they use are TCP (GPUDirect-TCPX/TCPXO or sockets).
func (m *model) overTCP() bool {
	if len(m.nodes) < 2 {
		return false
	}
	for _, nd := range m.nodes {
		for _, k := range nd.nics {
			if nd.nicKind[k+1] == topology.TransportTCP {
				return true
			}
		}
	}
	return false
}
