// Package collective is toposched's cost model for NCCL-style collectives:
// an alpha-beta model per collective and algorithm, evaluated on the
// physical links a placement uses.
//
// Every flow an algorithm generates is routed onto links: per GPU its
// NVLink port (the aggregate NVLink bandwidth on an NVSwitch node, one
// link per GPU pair on a direct-NVLink node) or its PCIe link, per node
// the inter-socket link and each NIC, per leaf switch the uplink share of
// the job's nodes below it. The bytes of all flows that cross a link are
// summed, so several rings (or several groups, or other jobs through
// Contention) on one link share it; the bandwidth term of a phase is the
// most loaded link's bytes over its effective capacity, and the latency
// term the phase's sequential steps times the slowest hop's latency.
//
// Bus bandwidth follows nccl-tests (doc/PERFORMANCE.md): all_reduce busbw
// = algbw * 2(n-1)/n, all_gather, reduce_scatter and all_to_all
// algbw * (n-1)/n, sendrecv busbw = algbw.
//
// Links and steps are those of NCCL's Simple protocol; a prediction is of
// the protocol NCCL's tuner picks (LL, LL128, Simple), its costs scaled from
// Simple's by NCCL's own tables, per release (protocols.go).
//
// Constants (see constants.go) come from public hardware figures
// (topology.Bandwidths) and one efficiency per link type, taken from
// NCCL maintainers' statements; none is fitted per validation case.
package collective

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/toposched/toposched/internal/topology"
)

// Collective names an operation as nccl-tests does.
type Collective string

// Collectives.
const (
	AllReduce     Collective = "all_reduce"
	AllGather     Collective = "all_gather"
	ReduceScatter Collective = "reduce_scatter"
	SendRecv      Collective = "sendrecv"
	AllToAll      Collective = "all_to_all"
)

// ParseCollective accepts the names above (and "allreduce"-style
// spellings without the underscore).
func ParseCollective(s string) (Collective, error) {
	k := strings.ReplaceAll(strings.ToLower(strings.TrimSpace(s)), "-", "_")
	switch k {
	case "all_reduce", "allreduce":
		return AllReduce, nil
	case "all_gather", "allgather":
		return AllGather, nil
	case "reduce_scatter", "reducescatter":
		return ReduceScatter, nil
	case "sendrecv", "send_recv", "p2p":
		return SendRecv, nil
	case "all_to_all", "alltoall":
		return AllToAll, nil
	}
	return "", fmt.Errorf("collective %q: expected all_reduce, all_gather, reduce_scatter, sendrecv or all_to_all", s)
}

// Algorithm names a way to run a collective.
type Algorithm string

// Algorithms. Auto picks the fastest predicted one that applies.
const (
	Auto             Algorithm = "auto"
	Ring             Algorithm = "ring"
	Tree             Algorithm = "tree" // NCCL's double binary tree (chain inside a node)
	HalvingDoubling  Algorithm = "halving_doubling"
	NVLS             Algorithm = "nvls"
	NVLSTree         Algorithm = "nvls_tree" // NVLS inside each node, a tree between nodes
	Hierarchical     Algorithm = "hierarchical"
	Direct           Algorithm = "direct" // all-to-all: every pair at once
	PointToPoint     Algorithm = "p2p"    // sendrecv
	algorithmsListed           = "ring, tree, halving_doubling, nvls, nvls_tree, hierarchical, direct, p2p or auto"
)

// ParseAlgorithm accepts the names above; "" is Auto.
func ParseAlgorithm(s string) (Algorithm, error) {
	switch a := Algorithm(strings.ToLower(strings.TrimSpace(s))); a {
	case "":
		return Auto, nil
	case Auto, Ring, Tree, HalvingDoubling, NVLS, NVLSTree, Hierarchical, Direct, PointToPoint:
		return a, nil
	case "nvlstree", "nvls-tree":
		return NVLSTree, nil
	case "rhd", "recursive_halving_doubling":
		return HalvingDoubling, nil
	}
	return "", fmt.Errorf("algorithm %q: expected %s", s, algorithmsListed)
}

// Rank is where one rank runs: a GPU of a node, by position in
// Node.GPUs.
type Rank struct {
	Node *topology.Node
	GPU  int
}

// Placement is the ranks of one communicator, in rank order, and the
// fabric between their nodes (nil: the nodes share one non-blocking
// leaf). Bandwidths nil means topology.DefaultBandwidths.
type Placement struct {
	Ranks      []Rank
	Fabric     *topology.Fabric
	Bandwidths *topology.Bandwidths
}

// Contention is the share (0 to 1) of a link's capacity already taken by
// other jobs' flows, by link name (see LinkName): "nic:<node>:<k>:tx",
// "uplink:<leaf>:up", "nvport:<node>:<gpu>:rx", ...
type Contention map[string]float64

// Options tune a prediction.
type Options struct {
	Algorithm  Algorithm
	Contention Contention
	// Bandwidths, for PredictNode and PredictCluster, which build the
	// placement (nil: the defaults; a calibration's, Calibration.Bandwidths).
	Bandwidths *topology.Bandwidths
	// Candidates limits what Auto chooses from (nil: every algorithm;
	// NCCLAlgorithms: those NCCL itself runs).
	Candidates []Algorithm
	// Protocol is the NCCL protocol ("", AutoProtocol: the tuner's
	// choice, the fastest predicted of those NCCL enables).
	Protocol Protocol
	// Tuning is the NCCL release whose tuner decides what runs (nil:
	// DefaultTuning; TuningFor reads a version).
	Tuning *Tuning
}

// NCCLAlgorithms are the algorithms NCCL runs (NCCL has no recursive
// halving-doubling all-reduce, and the hierarchical form is what its
// tree and NVLS-tree do inside).
var NCCLAlgorithms = []Algorithm{Ring, Tree, NVLS, NVLSTree, PointToPoint, Direct}

// Result is one predicted collective.
type Result struct {
	Collective  Collective `json:"collective"`
	Algorithm   Algorithm  `json:"algorithm"`
	Protocol    Protocol   `json:"protocol"`
	Ranks       int        `json:"ranks"`
	Bytes       float64    `json:"bytes"`
	TimeSeconds float64    `json:"time_seconds"`
	// AlgBWGBps is bytes / time; BusBWGBps the nccl-tests bus bandwidth.
	AlgBWGBps float64 `json:"algbw_gbps"`
	BusBWGBps float64 `json:"busbw_gbps"`
	// Bottleneck names the most loaded link of the bandwidth term, and
	// BottleneckKind its kind of link as a calibration fits it
	// (LinkKinds; "" when latency bound).
	Bottleneck     string `json:"bottleneck,omitempty"`
	BottleneckKind string `json:"bottleneck_kind,omitempty"`
}

// BusFactor is nccl-tests' busbw/algbw factor for n ranks.
func BusFactor(c Collective, n int) float64 {
	if n <= 1 {
		return 1
	}
	f := float64(n-1) / float64(n)
	switch c {
	case AllReduce:
		return 2 * f
	case AllGather, ReduceScatter, AllToAll:
		return f
	}
	return 1
}

// SpeedUp is the speed-up of n workers over one when each step computes
// for tcalc and then communicates for tcomm (no overlap):
// n * tcalc / (tcalc + tcomm) = n / (1 + tcomm/tcalc). 64 GPUs with
// tcomm = tcalc give 32; 8 GPUs with a 35% comm share give 5.2.
//
// The design's N / (1 + (N-1) * Tcomm/Tcalc) is Amdahl's law with
// Tcomm/Tcalc read as the serial fraction of the one-GPU run (see
// AmdahlSpeedUp); read as step times it would give 1 for 64 GPUs with
// Tcomm = Tcalc, not the 32 the design's example asks for.
func SpeedUp(n int, tcomm, tcalc float64) float64 {
	if n <= 0 || tcalc <= 0 || tcomm < 0 {
		return 0
	}
	return float64(n) / (1 + tcomm/tcalc)
}

// AmdahlSpeedUp is N / (1 + (N-1) s) for a serial fraction s.
func AmdahlSpeedUp(n int, s float64) float64 {
	if n <= 0 || s < 0 {
		return 0
	}
	return float64(n) / (1 + float64(n-1)*s)
}

// Errors.
var (
	ErrNoRanks       = errors.New("collective: no ranks")
	ErrNotApplicable = errors.New("collective: algorithm does not apply")
)

// Predict predicts one collective of size bytes (nccl-tests' size: the
// buffer per rank for all_reduce and sendrecv, the gathered buffer for
// all_gather and reduce_scatter, the send buffer per rank for all_to_all).
func Predict(p Placement, c Collective, bytes float64, opt Options) (Result, error) {
	m, err := newModel(p, opt.Contention, opt.Tuning)
	if err != nil {
		return Result{}, err
	}
	return m.predict(c, bytes, opt.Algorithm, opt.Candidates, opt.Protocol)
}

// Algorithms lists the algorithms that apply to c on p with NCCL release
// tun (nil: DefaultTuning), in a fixed order (not by cost).
func Algorithms(p Placement, c Collective, tun *Tuning) []Algorithm {
	m, err := newModel(p, nil, tun)
	if err != nil {
		return nil
	}
	var out []Algorithm
	for _, a := range candidates(c) {
		if m.applies(c, a) {
			out = append(out, a)
		}
	}
	return out
}

func candidates(c Collective) []Algorithm {
	switch c {
	case AllReduce:
		return []Algorithm{Ring, Tree, HalvingDoubling, NVLS, NVLSTree, Hierarchical}
	case AllGather, ReduceScatter:
		return []Algorithm{Ring, HalvingDoubling, NVLS, Hierarchical}
	case SendRecv:
		return []Algorithm{PointToPoint}
	case AllToAll:
		return []Algorithm{Direct}
	}
	return nil
}

func (m *model) predict(c Collective, bytes float64, a Algorithm, only []Algorithm, p Protocol) (Result, error) {
	if a == "" {
		a = Auto
	}
	if p == "" {
		p = AutoProtocol
	}
	if bytes < 0 || math.IsNaN(bytes) || math.IsInf(bytes, 0) {
		return Result{}, fmt.Errorf("collective: bytes: expected at least 0, got %v", bytes)
	}
	if candidates(c) == nil {
		return Result{}, fmt.Errorf("collective %q: expected all_reduce, all_gather, reduce_scatter, sendrecv or all_to_all", c)
	}
	if a == Auto {
		var best evaluated
		found := false
		for _, cand := range candidates(c) {
			if !m.applies(c, cand) || only != nil && !slices.Contains(only, cand) {
				continue
			}
			r, ok := m.eval(c, bytes, cand, p)
			if ok && (!found || r.TimeSeconds < best.TimeSeconds) {
				best, found = r, true
			}
		}
		if !found {
			return Result{}, fmt.Errorf("%w: no algorithm for %s on %d ranks%s", ErrNotApplicable, c, len(m.ranks), withProtocol(p))
		}
		return m.named(best), nil
	}
	if !m.applies(c, a) {
		return Result{}, fmt.Errorf("%w: %s for %s on this placement", ErrNotApplicable, a, c)
	}
	r, ok := m.eval(c, bytes, a, p)
	if !ok {
		return Result{}, fmt.Errorf("%w: %s for %s%s", ErrNotApplicable, a, c, withProtocol(p))
	}
	return m.named(r), nil
}

// evaluated is a prediction whose bottleneck is not yet named (naming
// costs a string; only the chosen algorithm's is needed).
type evaluated struct {
	Result
	bn    int32
	found bool
	// gdr: the bottleneck is a GPU's PCIe link loaded mostly by its NIC
	// (addGDR), which a calibration fits as the NIC's kind of link.
	gdr bool
}

func (m *model) named(e evaluated) Result {
	r := e.Result
	r.Bottleneck = m.bottleneckName(e.bn, e.found)
	r.BottleneckKind = m.kindOf(r.Bottleneck, r.Algorithm)
	if e.gdr {
		r.BottleneckKind = m.gdrKind(e.bn)
	}
	return r
}

func withProtocol(p Protocol) string {
	if p == AutoProtocol {
		return ""
	}
	return " with protocol " + string(p)
}

// eval predicts algorithm a with protocol p (AutoProtocol: the fastest
// NCCL enables); false when a does not run p here.
func (m *model) eval(c Collective, bytes float64, a Algorithm, p Protocol) (evaluated, bool) {
	ph := phases{root: m.root()}
	m.build(&ph, c, bytes, a, 1)
	bn, found := m.measure(&ph)
	gdr := ph.bnGDR
	var t float64
	chosen := Protocol("")
	for _, pr := range m.protocols(a) {
		if p != AutoProtocol && pr != p {
			continue
		}
		if tp := ph.cost(m.scale(c, a, pr, bytes)); chosen == "" || tp < t {
			t, chosen = tp, pr
		}
	}
	ph.release()
	if chosen == "" {
		return evaluated{}, false
	}
	t += m.opOverheadUS() * 1e-6
	r := Result{Collective: c, Algorithm: a, Protocol: chosen, Ranks: len(m.ranks), Bytes: bytes, TimeSeconds: t}
	if t > 0 {
		r.AlgBWGBps = bytes / t / 1e9
		r.BusBWGBps = r.AlgBWGBps * BusFactor(c, len(m.ranks))
	}
	return evaluated{Result: r, bn: bn, found: found, gdr: gdr}, true
}

// gdrKind is the kind of link (LinkKinds) of the NIC whose traffic loads
// a GPU's PCIe link bn: net, or its transport's.
func (m *model) gdrKind(bn int32) string {
	r := m.root()
	k := r.key(bn)
	nd := r.nodes[k.node]
	return nd.nicKind[nd.localNICs[k.a]+1]
}

// kindOf is LinkKind with a NIC's transport: "nic:<node>:<k>:<dir>" of an
// EFA NIC is efa, not net.
func (m *model) kindOf(bottleneck string, a Algorithm) string {
	k := LinkKind(bottleneck, a)
	if k != "net" || !strings.HasPrefix(bottleneck, "nic:") {
		return k
	}
	if m.parent != nil {
		return m.parent.kindOf(bottleneck, a)
	}
	rest := strings.TrimPrefix(bottleneck, "nic:")
	i := strings.LastIndexByte(rest, ':') // the direction
	if i < 0 {
		return k
	}
	j := strings.LastIndexByte(rest[:i], ':')
	if j < 0 {
		return k
	}
	node, pos := rest[:j], rest[j+1:i]
	nic, err := strconv.Atoi(pos)
	if err != nil {
		return k
	}
	for _, nd := range m.nodes {
		if nd.name == node && nic+1 >= 0 && nic+1 < len(nd.nicKind) {
			return nd.nicKind[nic+1]
		}
	}
	return k
}
