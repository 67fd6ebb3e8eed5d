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
// The cost model predicts each protocol NCCL enables on the placement
// (collective.Protocol: LL, LL128 and Simple, by NCCL's own tuner tables;
// NVLS and NVLS-tree run Simple only), so each phase is fitted per
// algorithm and protocol.
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

// Protocol is an NCCL protocol (collective's).
type Protocol = collective.Protocol

// Protocols, in NCCL's order.
const (
	LL     = collective.LL
	LL128  = collective.LL128
	Simple = collective.Simple
)

// Thresholds below which a setting is not worth making: the model's
// error at small differences is larger than the difference.
const (
	MinGainFraction = 0.02
	MinGainSeconds  = 10e-6
)

// algorithms NCCL runs for the collectives it can be told to run otherwise.
var tunable = []collective.Algorithm{collective.Ring, collective.Tree, collective.NVLS, collective.NVLSTree}

var protocols = collective.Protocols

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
	// Tuning is the NCCL release the job runs (nil: the default).
	Tuning *collective.Tuning
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

// ncclAlgo is an algorithm's spelling in NCCL_ALGO.
func ncclAlgo(a collective.Algorithm) string {
	if a == collective.NVLSTree {
		return "nvlstree"
	}
	return string(a)
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
				names[i] = ncclAlgo(a)
			}
			as = append(as, ncclFunc(s.Collective)+":"+strings.Join(names, ","))
		}
		if s.Protocols != nil {
			names := make([]string, len(s.Protocols))
			for i, pr := range s.Protocols {
				names[i] = pr.NCCLName()
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

// phaseModel is one phase's predictions.
type phaseModel struct {
	ph *Phase
	// real and blind are per algorithm and protocol that run the phase:
	// with the fabric (and contention) and without, as NCCL sees it.
	real, blind map[Option]line
	bottleneck  map[collective.Algorithm]neck
}

// allows reports whether o can run the phase.
func (m *phaseModel) allows(o Option) bool {
	_, ok := m.real[o]
	return ok
}

// time predicts one call of o at size bytes, with the fabric (real) or
// without (NCCL's view).
func (m *phaseModel) time(real bool, o Option, bytes float64) float64 {
	l := m.blind[o]
	if real {
		l = m.real[o]
	}
	return l.alpha + l.beta*bytes
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
	// The algorithms and protocols that run some phase.
	var algos []collective.Algorithm
	var protos []Protocol
	for _, m := range ms {
		for o := range m.real {
			if !slices.Contains(algos, o.Algorithm) {
				algos = append(algos, o.Algorithm)
			}
			if !slices.Contains(protos, o.Protocol) {
				protos = append(protos, o.Protocol)
			}
		}
	}
	slices.SortFunc(algos, func(a, b collective.Algorithm) int { return slices.Index(tunable, a) - slices.Index(tunable, b) })
	slices.SortFunc(protos, func(a, b Protocol) int { return slices.Index(protocols, a) - slices.Index(protocols, b) })
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

// modelPhase predicts a phase under each algorithm and protocol that
// applies, with and without the fabric; nil when no tunable algorithm
// applies (sendrecv, all_to_all).
func modelPhase(in Input, ph *Phase) (*phaseModel, error) {
	m := &phaseModel{ph: ph, real: map[Option]line{}, blind: map[Option]line{}, bottleneck: map[collective.Algorithm]neck{}}
	for _, a := range tunable {
		for _, p := range protocols {
			o := Option{a, p}
			real, bn, err := fit(in, ph, o, true)
			if errors.Is(err, collective.ErrNotApplicable) {
				continue
			}
			if err != nil {
				return nil, err
			}
			blind, _, err := fit(in, ph, o, false)
			if err != nil {
				return nil, err
			}
			m.real[o], m.blind[o] = real, blind
			if _, ok := m.bottleneck[a]; !ok || p == Simple {
				m.bottleneck[a] = bn
			}
		}
	}
	if len(m.real) == 0 {
		return nil, nil
	}
	return m, nil
}

// fit predicts one call of the phase with option o at its size and at
// zero bytes.
func fit(in Input, ph *Phase, o Option, real bool) (line, neck, error) {
	at := func(bytes float64) (float64, neck, error) {
		j := collective.Job{Bandwidths: in.Bandwidths, Tuning: in.Tuning, Groups: make([]collective.Group, len(ph.Members))}
		if real {
			j.Fabric, j.Contention = in.Fabric, in.Contention
		}
		for i, ranks := range ph.Members {
			j.Groups[i] = collective.Group{Name: ph.Name, Collective: ph.Collective, Ranks: ranks, Bytes: bytes,
				Algorithm: o.Algorithm, Protocol: o.Protocol, Phase: ph.Name}
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

// Choose is the tuner's choice for one collective on one placement, as
// `toposched model predict --algorithm auto` reports it: the algorithm and
// protocol the tuner would set, NCCL's own, and both predicted with the
// fabric. tuned is false when the tuner would leave NCCL's choice.
func Choose(p collective.Placement, c collective.Collective, bytes float64, tun *collective.Tuning) (chosen, def Option, chosenSeconds, defSeconds float64, tuned bool, err error) {
	plan, err := Tune(Input{Fabric: p.Fabric, Bandwidths: p.Bandwidths, Tuning: tun,
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
func ChooseNode(ev events.TopologyNode, gpus []int, c collective.Collective, bytes float64, tun *collective.Tuning) (chosen, def Option, chosenSeconds, defSeconds float64, tuned bool, err error) {
	n, err := topology.FromEvent(ev)
	if err != nil {
		return Option{}, Option{}, 0, 0, false, err
	}
	for _, g := range gpus {
		if g < 0 || g >= len(n.GPUs) {
			return Option{}, Option{}, 0, 0, false, fmt.Errorf("GPU %d: the node has GPUs 0 to %d", g, len(n.GPUs)-1)
		}
	}
	return Choose(collective.Placement{Ranks: collective.NodeRanks(n, gpus...)}, c, bytes, tun)
}

// ChooseCluster is Choose on the first gpusPerNode GPUs of each node,
// across the fabric, as collective.PredictCluster reads them.
func ChooseCluster(nodes []events.TopologyNode, fabric events.TopologyFabric, gpusPerNode int, c collective.Collective, bytes float64, tun *collective.Tuning) (chosen, def Option, chosenSeconds, defSeconds float64, tuned bool, err error) {
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
	return Choose(p, c, bytes, tun)
}
