package collective

import (
	"fmt"
	"math"

	"github.com/toposched/toposched/internal/topology"
)

// Group is one communicator of a job and what it runs per step.
type Group struct {
	// Name labels the group in results ("dp0", "tp3").
	Name       string
	Collective Collective
	Ranks      []Rank
	// Bytes per call (nccl-tests' size), Calls per step (0: one).
	Bytes float64
	Calls int
	// Algorithm (""/auto: fastest predicted for this group alone), and
	// Protocol (""/auto: NCCL's choice for it).
	Algorithm Algorithm
	Protocol  Protocol
	// Phase: groups with the same phase run at the same time and share
	// every link they cross (all DP groups of a step, say); phases run
	// one after another. "" is the group's collective.
	Phase string
}

// Job is a training job's communication per step.
type Job struct {
	// GPUs is the job's size N (0: the number of distinct ranks).
	GPUs   int
	Groups []Group
	// ComputeSeconds is the compute time per step (Tcalc).
	ComputeSeconds float64
	Fabric         *topology.Fabric
	Bandwidths     *topology.Bandwidths
	Contention     Contention
	// Candidates limits Auto's choice (see Options).
	Candidates []Algorithm
	// Tuning is the NCCL release (nil: DefaultTuning).
	Tuning *Tuning
}

// GroupResult is one group's prediction inside a job.
type GroupResult struct {
	Name   string `json:"name"`
	Phase  string `json:"phase"`
	Result Result `json:"result"`
	// StepSeconds is the group's time per step alone (Calls x time).
	StepSeconds float64 `json:"step_seconds"`
}

// JobResult is a job's predicted step.
type JobResult struct {
	GPUs int `json:"gpus"`
	// CommSeconds per step: the phases' times summed, each phase as long
	// as its groups take together on their shared links.
	CommSeconds  float64       `json:"comm_seconds"`
	CommFraction float64       `json:"comm_fraction"`
	SpeedUp      float64       `json:"speed_up"`
	Groups       []GroupResult `json:"groups"`
}

// EvaluateJob predicts a job's communication per step. Each group's
// algorithm is chosen (or taken) on the group alone; then the groups of
// one phase are evaluated together so that their flows share links. The
// comm fraction is Tcomm / (Tcalc + Tcomm) (no overlap), the speed-up
// SpeedUp(N, Tcomm, Tcalc).
func EvaluateJob(j Job) (JobResult, error) {
	return evaluateJob(j, true)
}

// CommSeconds is EvaluateJob's CommSeconds alone: it keeps no result per
// group, for a caller that compares many placements of one job.
func CommSeconds(j Job) (float64, error) {
	r, err := evaluateJob(j, false)
	return r.CommSeconds, err
}

// evaluateJob is EvaluateJob; withGroups false leaves JobResult.Groups
// empty.
func evaluateJob(j Job, withGroups bool) (JobResult, error) {
	type phaseSet struct {
		name  string
		ps    phases
		m     *model
		calls int
	}
	var order []*phaseSet
	byName := map[string]*phaseSet{}
	res := JobResult{}
	if withGroups {
		res.Groups = make([]GroupResult, 0, len(j.Groups))
	}
	// One model over all ranks of the job (each distinct rank once, in
	// order of first appearance), so that groups share links.
	n := 0
	for _, g := range j.Groups {
		n += len(g.Ranks)
	}
	if n == 0 {
		return res, ErrNoRanks
	}
	whole := newRoot(j.Fabric, j.Bandwidths, j.Contention, 0)
	whole.tuning = j.Tuning.tuning()
	defer func() {
		for _, set := range order {
			set.ps.release()
		}
		whole.recycle()
	}()
	for _, g := range j.Groups {
		for _, r := range g.Ranks {
			if _, err := whole.addRank(len(whole.ranks), r, true); err != nil {
				return res, err
			}
		}
	}
	whole.finish()
	for gi, g := range j.Groups {
		calls := max(g.Calls, 1)
		m, err := whole.sub(g.Ranks)
		if err != nil {
			return res, fmt.Errorf("group %d (%s): %w", gi, g.Name, err)
		}
		r, err := m.predict(g.Collective, g.Bytes, g.Algorithm, j.Candidates, g.Protocol)
		if err != nil {
			return res, fmt.Errorf("group %d (%s): %w", gi, g.Name, err)
		}
		ph := g.Phase
		if ph == "" {
			ph = string(g.Collective)
		}
		set := byName[ph]
		if set == nil {
			set = &phaseSet{name: ph, m: whole}
			set.ps.root = whole
			byName[ph] = set
			order = append(order, set)
		}
		// The group's flows at its protocol's cost: bytes over its share of
		// Simple's bandwidth (every flow is proportional to the size), its
		// steps at its latency.
		sc := m.scale(g.Collective, r.Algorithm, r.Protocol, g.Bytes)
		set.ps.sc, set.ps.scaled = sc, true
		m.build(&set.ps, g.Collective, g.Bytes/sc.bw, r.Algorithm, calls)
		set.ps.scaled = false
		set.ps.op = max(set.ps.op, sc.op)
		set.calls = max(set.calls, calls)
		if withGroups {
			res.Groups = append(res.Groups, GroupResult{Name: g.Name, Phase: ph, Result: r, StepSeconds: float64(calls) * r.TimeSeconds})
		}
	}
	for _, set := range order {
		whole.measure(&set.ps)
		op := set.ps.op
		t := set.ps.cost(scale{op: op, step: simpleScale.step, bw: 1, ramp: true})
		// cost counts one operation latency; each call has one, and the
		// calibrated overhead of a call (opOverheadUS) too.
		res.CommSeconds += t + float64(set.calls-1)*OpLatencyUS*op*1e-6 + float64(set.calls)*whole.opOverheadUS()*1e-6
	}
	res.GPUs = j.GPUs
	if res.GPUs == 0 {
		res.GPUs = len(whole.ranks)
	}
	if j.ComputeSeconds > 0 {
		res.CommFraction = res.CommSeconds / (j.ComputeSeconds + res.CommSeconds)
		res.SpeedUp = SpeedUp(res.GPUs, res.CommSeconds, j.ComputeSeconds)
	} else if res.CommSeconds > 0 {
		res.CommFraction = 1
	}
	if math.IsNaN(res.CommSeconds) {
		return res, fmt.Errorf("collective: comm time is not a number")
	}
	return res, nil
}

// sub is a model over some of m's ranks (in the given order) that shares
// m's nodes, NICs and leaves, so that flows built on it land on the same
// links as other groups'.
func (m *model) sub(ranks []Rank) (*model, error) {
	if len(ranks) == 0 {
		return nil, ErrNoRanks
	}
	sc := m.sc
	s := &take(&sc.subs, 1)[0]
	*s = model{bw: m.bw, fabric: m.fabric, leafNames: m.leafNames, upGBps: m.upGBps, contByNm: m.contByNm,
		netLat: m.netLat, ranks: take(&sc.refs, len(ranks)), parent: m, tuning: m.tuning}
	if len(m.localIdx) < len(m.nodes) {
		m.localIdx = grown(m.localIdx, len(m.nodes))
		for i := range m.localIdx {
			m.localIdx[i] = -1
		}
	}
	// The root's rank of each of ours, and the nodes in order of first
	// rank (marked in localIdx, cleared before returning).
	order := sc.order[:0]
	defer func() {
		for _, g := range order {
			m.localIdx[g] = -1
		}
		sc.order = order[:0]
	}()
	for i, r := range ranks {
		p := -1
		if ni, ok := m.index[r.Node]; ok && r.GPU >= 0 && r.GPU < len(r.Node.GPUs) {
			p = m.nodes[ni].rankAt[r.GPU]
		}
		if p < 0 {
			return nil, fmt.Errorf("collective: rank %d not in the job", i)
		}
		ref := m.ranks[p]
		if m.localIdx[ref.node] < 0 {
			m.localIdx[ref.node] = int32(len(order))
			order = append(order, ref.node)
		}
		s.ranks[i] = rankRef{node: m.localIdx[ref.node], gpu: ref.gpu}
	}
	// Nodes are shared; each keeps the group's own ranks and NICs, in
	// one buffer (a node's NICs are no more than its ranks).
	views := take(&sc.views, len(order))
	s.nodes = take(&sc.ptrs, len(order))
	for _, r := range s.ranks {
		views[r.node].nicSum++ // count ranks per node for now
	}
	buf := take(&sc.ints, 2*len(ranks))
	at := 0
	for li, g := range order {
		cnt := int(views[li].nicSum)
		views[li] = nodeView{nodeInfo: m.nodes[g].nodeInfo, ranks: buf[at : at : at+cnt], nics: buf[at+cnt : at+cnt : at+2*cnt]}
		at += 2 * cnt
		s.nodes[li] = &views[li]
	}
	for i, r := range s.ranks {
		nd := s.nodes[r.node]
		nd.ranks = append(nd.ranks, i)
	}
	for _, nd := range s.nodes {
		s.nicsOf(nd)
	}
	return s, nil
}
