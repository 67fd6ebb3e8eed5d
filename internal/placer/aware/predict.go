package aware

import (
	"fmt"
	"math"
	"slices"
	"strconv"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/internal/collective"
	"github.com/toposched/toposched/internal/placer/engine"
	"github.com/toposched/toposched/internal/store"
	"github.com/toposched/toposched/internal/topology"
)

// DefaultBytes is the all-reduce message size assumed for a job whose
// analysis gives no sized collective: one data-parallel all-reduce of
// every rank.
const DefaultBytes = 256 << 20

// resolver turns GPU keys into cost-model ranks, caching each node's
// topology and the position of each GPU index in it.
type resolver struct {
	snap  *store.Snapshot
	nodes map[string]*nodeTopo
}

type nodeTopo struct {
	topo *topology.Node
	pos  map[int]int // GPU index -> position in topo.GPUs
	sys  bool        // some GPU pair is joined over the inter-socket link (SYS)
}

func newResolver(snap *store.Snapshot) *resolver {
	return &resolver{snap: snap, nodes: map[string]*nodeTopo{}}
}

// node returns the topology the cost model sees for a node: its effective
// topology, or, for a node reported without paths, its GPUs joined over
// the host bridge (PHB).
func (r *resolver) node(name string) (*nodeTopo, error) {
	if nt, ok := r.nodes[name]; ok {
		return nt, nil
	}
	n, ok := r.snap.Node(name)
	if !ok {
		return nil, fmt.Errorf("aware: unknown node %q", name)
	}
	t := n.Effective
	if t == nil {
		t = n.Topology
	}
	if t == nil || t.GPUPaths == nil {
		t = fallbackTopology(n, r.snap.GPUs(name))
	}
	nt := &nodeTopo{topo: t, pos: make(map[int]int, len(t.GPUs))}
	for _, row := range t.GPUPaths {
		for _, l := range row {
			nt.sys = nt.sys || l.Class == topology.SYS
		}
	}
	for p, g := range t.GPUs {
		nt.pos[g.Index] = p
	}
	r.nodes[name] = nt
	return nt, nil
}

func fallbackTopology(n store.Node, gpus []store.GPU) *topology.Node {
	tg := make([]topology.GPU, len(gpus))
	for i, g := range gpus {
		tg[i] = topology.GPU{Index: g.Index, Model: g.Model, NUMA: -1}
	}
	return topology.Flat(n.Name, "placement fallback (no paths reported)", tg)
}

func (r *resolver) ranks(out []collective.Rank, gpus []store.GPUKey) ([]collective.Rank, error) {
	out = slices.Grow(out[:0], len(gpus))[:len(gpus)]
	for i, k := range gpus {
		nt, err := r.node(k.Node)
		if err != nil {
			return nil, err
		}
		p, ok := nt.pos[k.Index]
		if !ok {
			return nil, fmt.Errorf("aware: node %s has no GPU %d in its topology", k.Node, k.Index)
		}
		out[i] = collective.Rank{Node: nt.topo, GPU: p}
	}
	return out, nil
}

// commGroup is one communicator of the job by rank, with what it runs.
type commGroup struct {
	name, phase string
	coll        collective.Collective
	ranks       []int
	bytes       float64
	calls       int
}

// jobGroups lists the job's communicators: every member of every dimension
// with two or more ranks, once per collective it calls. Groups of one
// dimension and collective share a phase (they run at the same time). A
// job whose analysis sizes no collective gets one all-reduce of
// DefaultBytes over all its ranks.
func jobGroups(job events.JobAnalyzed, n int) []commGroup {
	var out []commGroup
	for _, rg := range job.Groups {
		dim := rg.Dimension
		if rg.Name != "" {
			dim = rg.Name
		}
		for _, c := range rg.Collectives {
			coll, scale := mapCollective(c.Collective)
			if c.Bytes <= 0 {
				continue
			}
			for mi, m := range rg.Members {
				if len(m) < 2 || !inRange(m, n) {
					continue
				}
				out = append(out, commGroup{
					name: dim + strconv.Itoa(mi), phase: dim + "/" + c.Collective, coll: coll,
					ranks: m, bytes: float64(c.Bytes) * scale, calls: max(c.CallsPerStep, 1),
				})
			}
		}
	}
	if out == nil && n >= 2 && !hasSizedGroups(job) {
		all := make([]int, n)
		for i := range all {
			all[i] = i
		}
		out = append(out, commGroup{name: "dp0", phase: "dp", coll: collective.AllReduce, ranks: all, bytes: DefaultBytes, calls: 1})
	}
	return out
}

func hasSizedGroups(job events.JobAnalyzed) bool {
	for _, rg := range job.Groups {
		for _, c := range rg.Collectives {
			if c.Bytes > 0 {
				return true
			}
		}
	}
	return false
}

func inRange(m []int, n int) bool {
	for _, r := range m {
		if r < 0 || r >= n {
			return false
		}
	}
	return true
}

// mapCollective maps an analysed collective to the cost model's. A
// broadcast moves about what an all-gather of the same buffer does.
func mapCollective(s string) (collective.Collective, float64) {
	switch s {
	case events.CollectiveAllReduce:
		return collective.AllReduce, 1
	case events.CollectiveAllGather:
		return collective.AllGather, 1
	case events.CollectiveReduceScatter:
		return collective.ReduceScatter, 1
	case events.CollectiveAllToAll:
		return collective.AllToAll, 1
	case events.CollectiveSendRecv:
		return collective.SendRecv, 1
	case events.CollectiveBroadcast:
		return collective.AllGather, 1
	}
	return collective.AllReduce, 1
}

// evaluator scores rank orders of one job by the cost model.
type evaluator struct {
	res    *resolver
	groups []commGroup
	fabric *topology.Fabric
	bw     *topology.Bandwidths
	comp   float64
	// byModel prices compute per GPU model (Options.ComputeReference;
	// nil: blind to the model).
	byModel *modelCompute
	evals   int
	// The last evaluation's job and ranks, whose arrays the next one
	// reuses (EvaluateJob keeps neither).
	job        collective.Job
	ranks, grp []collective.Rank
}

func (e *evaluator) eval(gpus []store.GPUKey) (collective.JobResult, error) {
	e.evals++
	if len(e.groups) == 0 {
		return collective.JobResult{GPUs: len(gpus)}, nil
	}
	j, err := e.jobOn(gpus)
	if err != nil {
		return collective.JobResult{}, err
	}
	return collective.EvaluateJob(*j)
}

// jobOn is the cost model's job of the placement gpus, in the arrays of the
// last one.
func (e *evaluator) jobOn(gpus []store.GPUKey) (*collective.Job, error) {
	ranks, err := e.res.ranks(e.ranks, gpus)
	if err != nil {
		return nil, err
	}
	e.ranks = ranks
	if e.job.Groups == nil {
		e.job = collective.Job{Fabric: e.fabric, Bandwidths: e.bw, Candidates: collective.NCCLAlgorithms,
			Groups: make([]collective.Group, len(e.groups))}
	}
	j := &e.job
	j.GPUs, j.ComputeSeconds = len(gpus), e.compOn(gpus)
	rs := e.grp[:0]
	for i, g := range e.groups {
		at := len(rs)
		for _, r := range g.ranks {
			rs = append(rs, ranks[r])
		}
		j.Groups[i] = collective.Group{Name: g.name, Collective: g.coll, Ranks: rs[at:len(rs):len(rs)], Bytes: g.bytes, Calls: g.calls, Phase: g.phase}
	}
	e.grp = rs
	return j, nil
}

// cost is the predicted comm time per step, +Inf on an error.
func (e *evaluator) cost(gpus []store.GPUKey) float64 {
	e.evals++
	if len(e.groups) == 0 {
		return 0
	}
	j, err := e.jobOn(gpus)
	if err != nil {
		return inf
	}
	t, err := collective.CommSeconds(*j)
	if err != nil {
		return inf
	}
	return t
}

// Predict scores a placement by the cost model: the analysed job's groups
// (per dimension, each member's ranks with its collectives' bytes and
// calls per step) on gpus, where rank i runs on gpus[i], over fabric (nil:
// one non-blocking leaf) with the default bandwidths. Blind, topology-aware
// and exhaustive placements are all scored by it.
func Predict(snap *store.Snapshot, job events.JobAnalyzed, gpus []store.GPUKey, fabric *topology.Fabric) (collective.JobResult, error) {
	return PredictWith(snap, job, gpus, engine.Options{Fabric: fabric})
}

// PredictWith is Predict with Options' fabric and bandwidths.
func PredictWith(snap *store.Snapshot, job events.JobAnalyzed, gpus []store.GPUKey, opts engine.Options) (collective.JobResult, error) {
	e := newEvaluator(snap, job, len(gpus), opts)
	return e.eval(gpus)
}

func newEvaluator(snap *store.Snapshot, job events.JobAnalyzed, n int, opts engine.Options) *evaluator {
	comp := StepCompute(job.Job)
	if math.IsNaN(comp) {
		comp = 0
	}
	e := &evaluator{res: newResolver(snap), groups: jobGroups(job, n), fabric: opts.Fabric, bw: opts.Bandwidths,
		comp: comp}
	if opts.ComputeReference != "" {
		e.byModel = newModelCompute(snap, job.Job, opts.ComputeReference, opts.Bandwidths)
		if e.comp == 0 {
			e.comp = e.byModel.onReference()
		}
	}
	return e
}

// ReferenceFLOPS is the training throughput of one GPU, FLOP/s, that a
// step's compute is estimated at when the job gives no measured compute
// time: an A100's bf16 peak (312 TFLOP/s) at 40% model FLOPs
// utilisation, for every GPU model.
const ReferenceFLOPS = 125e12

// StepCompute is a training step's compute time for sub: its own
// step_compute_seconds when it gives one; else 6 FLOPs per parameter and
// token (forward and backward, Kaplan et al. 2020) over the step's tokens
// (global batch × sequence), shared by its GPUs at ReferenceFLOPS; NaN
// when neither is known. bestFitWithin's tolerance is on the step time it
// makes (compute + communication).
func StepCompute(sub events.JobSubmitted) float64 {
	if sub.StepComputeSeconds > 0 {
		return sub.StepComputeSeconds
	}
	if m := sub.Model; m != nil && m.Parameters > 0 && m.GlobalBatchSize > 0 && m.SeqLen > 0 && sub.GPUs > 0 {
		return 6 * float64(m.Parameters) * float64(m.GlobalBatchSize) * float64(m.SeqLen) / (float64(sub.GPUs) * ReferenceFLOPS)
	}
	return math.NaN()
}
