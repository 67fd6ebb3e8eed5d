// Package tuning chooses NCCL algorithms and protocols for a job's groups
// on the placement it got, by the cost model (internal/collective), and
// says what the choice gains over NCCL's own.
//
// # What NCCL would pick, and what we pick
//
// NCCL's tuner (src/graph/tuning.cc) predicts each algorithm and protocol
// from what it sees: the GPUs and NICs of each node and their links. It
// does not see the fabric between nodes: leaf uplinks, their
// oversubscription, other jobs on them. "NCCL's default" is therefore
// modelled as the choice the cost model makes with the fabric taken away
// (the nodes under one non-blocking leaf), and the prediction of what that
// choice costs is made with the fabric in. The tuner's choice is made with
// the fabric in. The gain is the difference of the two, both predicted on
// the real placement.
//
// The cost model is linear in the message size for a given algorithm (an
// alpha-beta model: a latency term, and the most loaded link's bytes over
// its capacity), so each phase (the groups of one kind that run side by
// side, all evaluated together so that they share links) is predicted
// twice per algorithm, at its size and at zero bytes, and every other
// size follows.
//
// # Protocols
//
// The cost model predicts NCCL's Simple protocol. LL and LL128 trade
// bandwidth for latency; their figures are NCCL 2.2x's own (tuning.cc):
// per-step hardware latency hwLat[NVLink|PCI|NET][algorithm][protocol]
// and base latency baseLat, whose ratios to Simple's scale the model's
// latency term, and the bandwidth factors Ring LL 0.5, Ring LL128 0.92
// (0.7 with one GPU per node), Tree LL 1/3.8, Tree LL128 7/9 on one node
// and 120/128 across nodes. LL128 is offered only where every pair of a
// group's GPUs on a node is on NVLink (NCCL enables it by default only
// there); NVLS runs Simple only.
//
// # Settings
//
// NCCL_ALGO and NCCL_PROTO apply to every communicator of a process, per
// collective function with NCCL 2.24's syntax
// ("allreduce:tree;allgather:ring"), and NCCL still picks among what they
// allow by its own model. So the tuner searches, per collective, the
// subsets of algorithms and protocols to allow: for each subset, every
// phase of that collective gets what NCCL's fabric-blind model picks
// within it, and the subset whose total predicted time (with the fabric)
// is least wins. Forcing tree for a data-parallel all-reduce that crosses
// an oversubscribed uplink would also force it on a tensor-parallel
// all-reduce inside a node; the search weighs both. A setting is made only
// when it saves at least MinGainFraction of the collective's predicted
// time per step and MinGainSeconds.
package tuning

// This file stays whole: the tuner is one algorithm (model each phase per
// algorithm and protocol, search the settings NCCL_ALGO and NCCL_PROTO can
// allow, report the plan), and it reads in the order the package doc above
// explains it; Choose, ChooseNode and ChooseCluster at the end are thin
// entry points over Tune.

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/internal/collective"
	"github.com/toposched/toposched/internal/topology"
)

// Protocol is an NCCL protocol.
type Protocol string

// Protocols, in NCCL's order.
const (
	LL     Protocol = "ll"
	LL128  Protocol = "ll128"
	Simple Protocol = "simple"
)

// ncclName is the protocol's spelling in NCCL_PROTO.
func (p Protocol) ncclName() string {
	switch p {
	case LL:
		return "LL"
	case LL128:
		return "LL128"
	}
	return "Simple"
}

// Thresholds below which a setting is not worth making: the model's
// error at small differences is larger than the difference.
const (
	MinGainFraction = 0.02
	MinGainSeconds  = 10e-6
)

// algorithms NCCL runs for the collectives it can be told to run otherwise.
var tunable = []collective.Algorithm{collective.Ring, collective.Tree, collective.NVLS}

var protocols = []Protocol{LL, LL128, Simple}

// Phase is the groups of one kind that run one collective side by side in
// a step (all data-parallel groups' all-reduce, say).
type Phase struct {
	// Name is the group kind (dp, tp, ...).
	Name       string
	Collective collective.Collective
	Members    [][]collective.Rank
	// Bytes per call (nccl-tests' size) and Calls per step (0: one).
	Bytes float64
	Calls int
}

// Input is what the tuner works on.
type Input struct {
	Phases     []Phase
	Fabric     *topology.Fabric
	Bandwidths *topology.Bandwidths
	// Contention is other jobs' load on links (collective.Contention),
	// seen by the tuner's prediction and not by NCCL's.
	Contention collective.Contention
}

// Option is an algorithm run with a protocol.
type Option struct {
	Algorithm collective.Algorithm
	Protocol  Protocol
}

func (o Option) String() string { return string(o.Algorithm) + "/" + string(o.Protocol) }

// PhaseResult is one phase under the chosen settings and under NCCL's
// defaults. Times are per step (all calls).
type PhaseResult struct {
	Phase           *Phase
	Chosen, Default Option
	ChosenSeconds   float64
	DefaultSeconds  float64
	// BusBWGBps is the chosen option's bus bandwidth of one call.
	BusBWGBps float64
	// Alpha and Beta are the chosen option's one call with the fabric:
	// Alpha + Beta·bytes seconds (latency and bandwidth terms).
	Alpha, Beta float64
	// MinBytes and MaxBytes bound the message sizes (powers of two around
	// the phase's own) over which the settings still give Chosen.
	MinBytes, MaxBytes float64
	// Bottleneck is the most loaded link of the chosen algorithm, by the
	// model with the fabric in ("" when latency bound), and
	// BottleneckKind its kind of link (collective.LinkKinds).
	Bottleneck     string
	BottleneckKind string
	// DefaultBottleneck is the same for NCCL's default.
	DefaultBottleneck string
}

// Setting restricts one collective function: the algorithms and protocols
// NCCL may choose from; nil means all (NCCL's default).
type Setting struct {
	Collective collective.Collective
	Algorithms []collective.Algorithm
	Protocols  []Protocol
}

// Plan is the tuner's result.
type Plan struct {
	Settings []Setting
	Phases   []PhaseResult
	// PredictedSeconds and DefaultSeconds per step, summed over phases.
	PredictedSeconds, DefaultSeconds float64
}

// ncclFunc is a collective's prefix in NCCL_ALGO and NCCL_PROTO.
func ncclFunc(c collective.Collective) string {
	return strings.ReplaceAll(string(c), "_", "")
}

// Env renders the settings as NCCL_ALGO and NCCL_PROTO values (NCCL 2.24
// per-function syntax); "" where nothing is restricted.
func (p Plan) Env() (algo, proto string) {
	var as, ps []string
	for _, s := range p.Settings {
		if s.Algorithms != nil {
			names := make([]string, len(s.Algorithms))
			for i, a := range s.Algorithms {
				names[i] = string(a)
			}
			as = append(as, ncclFunc(s.Collective)+":"+strings.Join(names, ","))
		}
		if s.Protocols != nil {
			names := make([]string, len(s.Protocols))
			for i, pr := range s.Protocols {
				names[i] = pr.ncclName()
			}
			ps = append(ps, ncclFunc(s.Collective)+":"+strings.Join(names, ","))
		}
	}
	return strings.Join(as, ";"), strings.Join(ps, ";")
}

// neck is a bottleneck link and its kind.
type neck struct{ name, kind string }

// line is an alpha-beta prediction: alpha + beta·bytes seconds.
type line struct{ alpha, beta float64 }

type hwClass int

const (
	hwNVLink hwClass = iota
	hwPCI
	hwNet
)

// NCCL 2.2x tuning.cc: base latency per algorithm and protocol (µs), and
// per-step hardware latency.
var (
	baseLat = map[collective.Algorithm][3]float64{
		collective.Ring: {6.6, 14.0, 8.4},
		collective.Tree: {6.8, 14.0, 8.4},
	}
	hwLat = map[hwClass]map[collective.Algorithm][3]float64{
		hwNVLink: {collective.Ring: {.6, 1.9, 3.4}, collective.Tree: {.6, 1.25, 4}},
		hwPCI:    {collective.Ring: {1.0, 2.5, 5.7}, collective.Tree: {1.0, 1.9, 4}},
		hwNet:    {collective.Ring: {2.7, 4.0, 14.0}, collective.Tree: {5.0, 8.5, 14}},
	}
)

func protoIndex(p Protocol) int { return slices.Index(protocols, p) }

// phaseModel is one phase's predictions.
type phaseModel struct {
	ph *Phase
	// real and blind are per algorithm: with the fabric (and contention)
	// and without, as NCCL sees it.
	real, blind map[collective.Algorithm]line
	bottleneck  map[collective.Algorithm]neck
	hw          hwClass
	ll128       bool
	multiNode   bool
	onePerNode  bool
}

// allows reports whether o can run the phase.
func (m *phaseModel) allows(o Option) bool {
	if _, ok := m.real[o.Algorithm]; !ok {
		return false
	}
	switch {
	case o.Algorithm == collective.NVLS:
		return o.Protocol == Simple
	case o.Protocol == LL128:
		return m.ll128
	}
	return true
}

// time predicts one call of o at size bytes, with the fabric (real) or
// without (NCCL's view).
func (m *phaseModel) time(real bool, o Option, bytes float64) float64 {
	l := m.blind[o.Algorithm]
	if real {
		l = m.real[o.Algorithm]
	}
	if o.Protocol == Simple {
		return l.alpha + l.beta*bytes
	}
	pi, si := protoIndex(o.Protocol), protoIndex(Simple)
	op := collective.OpLatencyUS * 1e-6
	steps := max(l.alpha-op, 0)
	lat := op*baseLat[o.Algorithm][pi]/baseLat[o.Algorithm][si] + steps*hwLat[m.hw][o.Algorithm][pi]/hwLat[m.hw][o.Algorithm][si]
	return lat + l.beta*bytes/m.efficiency(o)
}

// efficiency is the protocol's bandwidth factor relative to Simple.
func (m *phaseModel) efficiency(o Option) float64 {
	switch {
	case o.Algorithm == collective.Ring && o.Protocol == LL:
		return 0.5
	case o.Algorithm == collective.Ring && o.Protocol == LL128:
		if m.onePerNode {
			return 0.7
		}
		return 0.92
	case o.Algorithm == collective.Tree && o.Protocol == LL:
		return 1 / 3.8
	case o.Algorithm == collective.Tree && o.Protocol == LL128:
		if m.multiNode {
			return 120.0 / 128
		}
		return 7.0 / 9
	}
	return 1
}

// pick is what NCCL's model picks for the phase among what is allowed,
// at size bytes; false when nothing allowed can run it.
func (m *phaseModel) pick(algos []collective.Algorithm, protos []Protocol, bytes float64) (Option, bool) {
	var best Option
	bestT, found := math.Inf(1), false
	for _, a := range algos {
		for _, p := range protos {
			o := Option{a, p}
			if !m.allows(o) {
				continue
			}
			if t := m.time(false, o, bytes); t < bestT {
				best, bestT, found = o, t, true
			}
		}
	}
	return best, found
}

// Tune chooses the settings for in's phases.
func Tune(in Input) (Plan, error) {
	models := make([]*phaseModel, 0, len(in.Phases))
	for i := range in.Phases {
		ph := &in.Phases[i]
		if ph.Bytes <= 0 || len(ph.Members) == 0 {
			continue
		}
		m, err := modelPhase(in, ph)
		if err != nil {
			return Plan{}, fmt.Errorf("tuning: phase %s: %w", ph.Name, err)
		}
		if m != nil {
			models = append(models, m)
		}
	}
	var plan Plan
	byColl := map[collective.Collective][]*phaseModel{}
	var colls []collective.Collective
	for _, m := range models {
		c := m.ph.Collective
		if byColl[c] == nil {
			colls = append(colls, c)
		}
		byColl[c] = append(byColl[c], m)
	}
	for _, c := range colls {
		ms := byColl[c]
		set, ok := search(ms)
		algos, protos := set.Algorithms, set.Protocols
		if algos == nil {
			algos = tunable
		}
		if protos == nil {
			protos = protocols
		}
		if ok {
			plan.Settings = append(plan.Settings, set)
		}
		for _, m := range ms {
			calls := float64(max(m.ph.Calls, 1))
			def, _ := m.pick(tunable, protocols, m.ph.Bytes)
			ch, _ := m.pick(algos, protos, m.ph.Bytes)
			r := PhaseResult{Phase: m.ph, Chosen: ch, Default: def,
				ChosenSeconds: calls * m.time(true, ch, m.ph.Bytes), DefaultSeconds: calls * m.time(true, def, m.ph.Bytes),
				Bottleneck: m.bottleneck[ch.Algorithm].name, BottleneckKind: m.bottleneck[ch.Algorithm].kind,
				DefaultBottleneck: m.bottleneck[def.Algorithm].name}
			r.Alpha = m.time(true, ch, 0)
			r.Beta = max(m.time(true, ch, m.ph.Bytes)-r.Alpha, 0) / m.ph.Bytes
			if t := m.time(true, ch, m.ph.Bytes); t > 0 {
				r.BusBWGBps = m.ph.Bytes / t / 1e9 * collective.BusFactor(m.ph.Collective, len(m.ph.Members[0]))
			}
			r.MinBytes, r.MaxBytes = holds(m, algos, protos, ch)
			plan.Phases = append(plan.Phases, r)
			plan.PredictedSeconds += r.ChosenSeconds
			plan.DefaultSeconds += r.DefaultSeconds
		}
	}
	return plan, nil
}

// search finds the subsets of algorithms and protocols to allow for one
// collective's phases; false when NCCL's defaults are as good.
func search(ms []*phaseModel) (Setting, bool) {
	c := ms[0].ph.Collective
	var algos []collective.Algorithm
	ll128 := false
	for _, a := range tunable {
		for _, m := range ms {
			if _, ok := m.real[a]; ok {
				algos = append(algos, a)
				break
			}
		}
	}
	for _, m := range ms {
		ll128 = ll128 || m.ll128
	}
	protos := []Protocol{LL, Simple}
	if ll128 {
		protos = protocols
	}
	cost := func(as []collective.Algorithm, ps []Protocol) (float64, bool) {
		total := 0.0
		for _, m := range ms {
			o, ok := m.pick(as, ps, m.ph.Bytes)
			if !ok {
				return 0, false // NCCL would fail: nothing allowed runs it
			}
			total += float64(max(m.ph.Calls, 1)) * m.time(true, o, m.ph.Bytes)
		}
		return total, true
	}
	def, _ := cost(tunable, protocols)
	best, bestCost, bestSize := Setting{Collective: c}, def, len(tunable)+len(protocols)
	for _, as := range subsets(algos) {
		for _, ps := range subsets(protos) {
			t, ok := cost(as, ps)
			if !ok {
				continue
			}
			size := len(as) + len(ps)
			// Among (nearly) equal costs, the fewest restrictions.
			if t < bestCost*(1-1e-9) || (t <= bestCost*(1+1e-9) && size > bestSize) {
				best, bestCost, bestSize = Setting{Collective: c, Algorithms: as, Protocols: ps}, t, size
			}
		}
	}
	gain := def - bestCost
	if gain < MinGainSeconds || gain < MinGainFraction*def {
		return Setting{Collective: c}, false
	}
	// Leave unrestricted what the choice does not need restricted.
	if len(best.Algorithms) == len(algos) {
		best.Algorithms = nil
	}
	if len(best.Protocols) == len(protos) {
		best.Protocols = nil
	}
	if best.Algorithms == nil && best.Protocols == nil {
		return Setting{Collective: c}, false
	}
	return best, true
}

// subsets lists the non-empty subsets of xs, largest first, each in xs'
// order.
func subsets[T any](xs []T) [][]T {
	var out [][]T
	for mask := 1; mask < 1<<len(xs); mask++ {
		var s []T
		for i, x := range xs {
			if mask&(1<<i) != 0 {
				s = append(s, x)
			}
		}
		out = append(out, s)
	}
	slices.SortStableFunc(out, func(a, b []T) int { return len(b) - len(a) })
	return out
}

// holds finds the message sizes around the phase's own over which the
// allowed algorithms and protocols still give ch: powers of two from 1 KiB
// to 64 GiB, and the phase's size.
func holds(m *phaseModel, algos []collective.Algorithm, protos []Protocol, ch Option) (lo, hi float64) {
	const first, last = 10, 36
	sizes := []float64{m.ph.Bytes}
	for k := first; k <= last; k++ {
		sizes = append(sizes, math.Ldexp(1, k))
	}
	slices.Sort(sizes)
	sizes = slices.Compact(sizes)
	at := slices.Index(sizes, m.ph.Bytes)
	same := func(b float64) bool { o, ok := m.pick(algos, protos, b); return ok && o == ch }
	i, j := at, at
	for i > 0 && same(sizes[i-1]) {
		i--
	}
	for j+1 < len(sizes) && same(sizes[j+1]) {
		j++
	}
	return sizes[i], sizes[j]
}

// modelPhase predicts a phase under each algorithm that applies, with and
// without the fabric; nil when no tunable algorithm applies (sendrecv,
// all_to_all).
func modelPhase(in Input, ph *Phase) (*phaseModel, error) {
	m := &phaseModel{ph: ph, real: map[collective.Algorithm]line{}, blind: map[collective.Algorithm]line{},
		bottleneck: map[collective.Algorithm]neck{}}
	m.describe()
	for _, a := range tunable {
		real, bn, err := fit(in, ph, a, true)
		if errors.Is(err, collective.ErrNotApplicable) {
			continue
		}
		if err != nil {
			return nil, err
		}
		blind, _, err := fit(in, ph, a, false)
		if err != nil {
			return nil, err
		}
		m.real[a], m.blind[a], m.bottleneck[a] = real, blind, bn
	}
	if len(m.real) == 0 {
		return nil, nil
	}
	return m, nil
}

// fit predicts one call of the phase with algorithm a at its size and at
// zero bytes.
func fit(in Input, ph *Phase, a collective.Algorithm, real bool) (line, neck, error) {
	at := func(bytes float64) (float64, neck, error) {
		j := collective.Job{Bandwidths: in.Bandwidths, Groups: make([]collective.Group, len(ph.Members))}
		if real {
			j.Fabric, j.Contention = in.Fabric, in.Contention
		}
		for i, ranks := range ph.Members {
			j.Groups[i] = collective.Group{Name: ph.Name, Collective: ph.Collective, Ranks: ranks, Bytes: bytes, Algorithm: a, Phase: ph.Name}
		}
		r, err := collective.EvaluateJob(j)
		if err != nil {
			return 0, neck{}, err
		}
		var bn neck
		if len(r.Groups) > 0 {
			bn = neck{r.Groups[0].Result.Bottleneck, r.Groups[0].Result.BottleneckKind}
		}
		return r.CommSeconds, bn, nil
	}
	t0, _, err := at(0)
	if err != nil {
		return line{}, neck{}, err
	}
	t1, bn, err := at(ph.Bytes)
	if err != nil {
		return line{}, neck{}, err
	}
	return line{alpha: t0, beta: max(t1-t0, 0) / ph.Bytes}, bn, nil
}

// describe finds what the protocols depend on: whether the phase crosses
// nodes, whether its GPUs on each node are all on NVLink, and how many
// GPUs per node it has.
func (m *phaseModel) describe() {
	m.ll128, m.onePerNode = true, true
	anyIntra := false
	for _, ranks := range m.ph.Members {
		perNode := map[*topology.Node][]int{}
		for _, r := range ranks {
			perNode[r.Node] = append(perNode[r.Node], r.GPU)
		}
		if len(perNode) > 1 {
			m.multiNode = true
		}
		for n, gpus := range perNode {
			if len(gpus) > 1 {
				m.onePerNode = false
			}
			for _, a := range gpus {
				for _, b := range gpus {
					if a == b {
						continue
					}
					anyIntra = true
					if n.GPUPaths == nil || !n.GPUPaths[a][b].Class.NVLink() {
						m.ll128 = false
					}
				}
			}
		}
	}
	switch {
	case m.multiNode:
		m.hw = hwNet
	case anyIntra && m.ll128:
		m.hw = hwNVLink
	default:
		m.hw = hwPCI
	}
}

// Choose is the tuner's choice for one collective on one placement, as
// `toposched model predict --algorithm auto` reports it: the algorithm and
// protocol the tuner would set, NCCL's own, and both predicted with the
// fabric. tuned is false when the tuner would leave NCCL's choice.
func Choose(p collective.Placement, c collective.Collective, bytes float64) (chosen, def Option, chosenSeconds, defSeconds float64, tuned bool, err error) {
	plan, err := Tune(Input{Fabric: p.Fabric, Bandwidths: p.Bandwidths,
		Phases: []Phase{{Name: "all", Collective: c, Members: [][]collective.Rank{p.Ranks}, Bytes: bytes, Calls: 1}}})
	if err != nil {
		return Option{}, Option{}, 0, 0, false, err
	}
	if len(plan.Phases) == 0 {
		return Option{}, Option{}, 0, 0, false, fmt.Errorf("tuning: %s has no NCCL algorithm to choose among here", c)
	}
	r := plan.Phases[0]
	return r.Chosen, r.Default, r.ChosenSeconds, r.DefaultSeconds, len(plan.Settings) > 0, nil
}

// ChooseNode is Choose on GPUs (by position; all when none is given) of
// one node given as its topology.node event, as collective.PredictNode
// reads it.
func ChooseNode(ev events.TopologyNode, gpus []int, c collective.Collective, bytes float64) (chosen, def Option, chosenSeconds, defSeconds float64, tuned bool, err error) {
	n, err := topology.FromEvent(ev)
	if err != nil {
		return Option{}, Option{}, 0, 0, false, err
	}
	for _, g := range gpus {
		if g < 0 || g >= len(n.GPUs) {
			return Option{}, Option{}, 0, 0, false, fmt.Errorf("GPU %d: the node has GPUs 0 to %d", g, len(n.GPUs)-1)
		}
	}
	return Choose(collective.Placement{Ranks: collective.NodeRanks(n, gpus...)}, c, bytes)
}

// ChooseCluster is Choose on the first gpusPerNode GPUs of each node,
// across the fabric, as collective.PredictCluster reads them.
func ChooseCluster(nodes []events.TopologyNode, fabric events.TopologyFabric, gpusPerNode int, c collective.Collective, bytes float64) (chosen, def Option, chosenSeconds, defSeconds float64, tuned bool, err error) {
	var ns []*topology.Node
	for _, ev := range nodes {
		n, err := topology.FromEvent(ev)
		if err != nil {
			return Option{}, Option{}, 0, 0, false, fmt.Errorf("node %q: %w", ev.Name, err)
		}
		ns = append(ns, n)
	}
	p := collective.Placement{Ranks: collective.NodesRanks(ns, gpusPerNode)}
	if len(fabric.Switches) > 0 {
		f, err := topology.NewFabric(fabric)
		if err != nil {
			return Option{}, Option{}, 0, 0, false, err
		}
		p.Fabric = f
	}
	return Choose(p, c, bytes)
}
