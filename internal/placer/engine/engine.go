// Package engine is what a placement strategy is asked: the Request (a
// snapshot, a job, and Options: the fabric, the policies' hooks and the
// topology-aware strategy's tuning), the view of a node a node filter
// gets (NodeView, Keep) and the exchange with the placement policies
// (Candidate, Judgement), with the Explain a strategy fills. It sits below
// every strategy, so that the Planner, the policies' view and each
// strategy speak one vocabulary without importing one another; what a
// strategy answers is outcome's Result. It imports nothing of the
// strategies'.
package engine

import (
	"slices"
	"strings"
	"time"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/internal/demand"
	"github.com/toposched/toposched/internal/store"
	"github.com/toposched/toposched/internal/topology"
)

// Request is one placement question: where Job goes on Snap, under Options.
type Request struct {
	Snap *store.Snapshot
	Job  events.JobAnalyzed
	Options
}

// Options tune a placement. The zero value is usable. Fabric, Bandwidths,
// Filter, Judge and Explain apply to every strategy; the rest tune the
// topology-aware strategy and the exhaustive optimum (their defaults are
// package aware's).
type Options struct {
	// Fabric between the nodes (nil: one non-blocking leaf).
	Fabric *topology.Fabric
	// Bandwidths of the links (nil: topology.DefaultBandwidths).
	Bandwidths *topology.Bandwidths
	// Budget bounds the local search's wall time (0: 2 ms), counted from
	// the scoring of the multi-node alternatives where there are some;
	// negative: no bound on the wall clock, MaxEvals alone, so that the
	// decision does not depend on the machine's speed or load (a replay
	// on a virtual clock).
	Budget time.Duration
	// MaxEvals bounds the local search's cost-model evaluations (0: 200;
	// negative: no local search).
	MaxEvals int
	// Candidates is how many single-node candidates the cost model scores
	// (0: 4).
	Candidates int
	// NodeExact bounds the cost-model evaluations of the exact choice
	// inside a node, over the single-node candidates scored together (0:
	// aware.DefaultNodeExact; negative: none). A node is chosen exactly,
	// every subset of its free GPUs and every rank order on it, when those
	// ordered selections fit in what is left.
	NodeExact int
	// FitTolerance is how much longer a job's predicted step time may be
	// (compute + communication, a share of the fastest one-node
	// candidate's) on a node that fits it tighter (aware's bestFitWithin;
	// 0: aware.DefaultFitTolerance; negative: off, the fastest wins). It
	// applies only to a job whose step compute time is known.
	FitTolerance float64
	// ScopeNodes is how many nodes with free GPUs of the job's model a
	// cluster must have before a job no node holds reads one leaf's or
	// pod's nodes rather than every node (aware's scoped; 0:
	// aware.DefaultScopeNodes; negative: never).
	ScopeNodes int
	// ComputeReference, when set, weighs compute by GPU model: the job's
	// compute per step (aware.StepCompute) is taken as measured on this
	// model and scaled, for each candidate, to the slowest model it takes
	// (internal/gpuspeed; the job's step_compute_seconds_by_model where it
	// gives one), so that a step's predicted time is compute on that model
	// plus communication. "" leaves compute the same on every model.
	ComputeReference string
	// Filter, when set, keeps only the nodes it accepts (node policies
	// plug in here). It is asked only about nodes with free GPUs of the
	// job's model.
	Filter func(NodeView) bool
	// Judge, when set, judges candidate placements (placement policies
	// plug in here).
	Judge func(Candidate) Judgement
	// Explain, when set, is filled with how the decision was reached.
	Explain *Explain
	// Compact, when set, is asked of the candidate chosen for a job
	// spread over nodes, with its predicted communication per step,
	// before the local search refines it: when it answers true the job
	// waits, with its reason, rather than start there (placer.Compact).
	// The search only makes a candidate faster, so one it lets start
	// stays allowed after it.
	Compact func(gpus []store.GPUKey, comm float64) (events.Reason, bool)
	// Demand, when set, is what placement expects to be asked for next,
	// and Now the decision's time on placement's clock: topology-aware
	// takes a tighter fit on a slower box (bestFitWithin) only where the
	// fast shape the faster placement would break is likely needed before
	// the job ends. Nil: the tighter fit within FitTolerance is taken
	// wherever there is one.
	Demand *demand.Forecast
	Now    time.Time
}

// NodeView is what a Filter is told of a node: what the candidate walk
// has at hand, so that filtering costs no store lookups.
type NodeView struct {
	Node store.Node
	// Free counts its free GPUs of the job's model.
	Free int
	// Fabric lists its fabric domains (leaf, pod, core), smallest first.
	Fabric []string
}

// ViewOf is the view of a node with free GPUs (of the job's model, by
// index; at least one) that the candidate walk gives a Filter.
func ViewOf(node store.Node, free []store.FreeGPU) NodeView {
	return NodeView{Node: node, Free: len(free), Fabric: FabricDomains(free[0].Domains)}
}

// Keep says whether a strategy may take GPUs of a node, shown with its free
// GPUs of the job's model: the Planner's node filter (node policies and a
// reservation for an older job) as the strategies of one answer (blind
// first fit and the peers) ask it. Nil keeps every node.
type Keep func(node *store.Node, free []store.FreeGPU) bool

// Candidate is a placement a strategy considered, as a Judge sees it.
type Candidate struct {
	// Domain is the smallest domain holding it (a store domain ID such as
	// island:n1/0, node:n1, leaf:l3, or cluster:).
	Domain string
	// GPUs in rank order.
	GPUs []store.GPUKey
	// CommSeconds is the cost model's predicted comm time per step.
	CommSeconds float64
}

// Judgement is a Judge's verdict on a candidate: placement policies'
// deny, warn and score.
type Judgement struct {
	Deny bool
	// Score is a penalty added to the candidate's cost: its comm time
	// relative to the fastest candidate judged (1 is the fastest). A score
	// of 1 weighs as much as doubling the comm time.
	Score float64
	// Reasons say why it was denied; Warnings are kept with it.
	Reasons  []events.Reason
	Warnings []events.Reason
}

// Explain is what a strategy reports of a decision when Options.Explain
// is set.
type Explain struct {
	// Explanation is filled with nodes considered, levels and candidates;
	// the caller adds what only it knows (policy revision, node denials).
	Explanation events.Explanation
	// Judgement is the chosen candidate's.
	Judgement Judgement
	// PolicyDenied is set when the Judge denied every candidate: the
	// strategy then answers Wait with the favourite's deny reasons.
	PolicyDenied bool
	// CompactAwaited is set when Options.Compact kept the job waiting.
	CompactAwaited bool
}

// HasLevel reports whether the explanation counts the domains of level.
func (x *Explain) HasLevel(level string) bool {
	return slices.ContainsFunc(x.Explanation.Levels, func(l events.LevelCount) bool { return l.Level == level })
}

// nodeLocalOrCluster reports whether a domain ID is of a node-local kind
// (island, pcie, numa, node) or the cluster: not a fabric domain.
func nodeLocalOrCluster(d string) bool {
	i := strings.IndexByte(d, ':')
	if i < 0 {
		return false
	}
	switch d[:i] {
	case store.DomainIsland, store.DomainPCIe, store.DomainNUMA, store.DomainNode, store.DomainCluster:
		return true
	}
	return false
}

// FabricDomains returns a GPU's fabric domains (all but the node-local
// ones and the cluster), in order. The store lists them as one run between
// the node and the cluster, so this is a capped window of the GPU's shared
// Domains (appending copies); a list of another shape gets a new slice.
func FabricDomains(ds []string) []string {
	i := 0
	for i < len(ds) && nodeLocalOrCluster(ds[i]) {
		i++
	}
	j := i
	for j < len(ds) && !nodeLocalOrCluster(ds[j]) {
		j++
	}
	k := j
	for k < len(ds) && nodeLocalOrCluster(ds[k]) {
		k++
	}
	if i == j {
		return nil
	}
	if k == len(ds) {
		return ds[i:j:j]
	}
	var out []string
	for _, d := range ds {
		if !nodeLocalOrCluster(d) {
			out = append(out, d)
		}
	}
	return out
}

// Unit is the size of the job's innermost groups when they are blocks of
// consecutive ranks (TP in the default layout), else 1: the GPUs a
// placement of n GPUs keeps together on a node so that each such group
// talks inside one.
func Unit(job events.JobAnalyzed, n int) int {
	if len(job.Order) == 0 {
		return 1
	}
	for _, rg := range job.Groups {
		if rg.Dimension != job.Order[0] || rg.Size < 2 || n%rg.Size != 0 {
			continue
		}
		for _, m := range rg.Members {
			if len(m) != rg.Size {
				return 1
			}
			for i := 1; i < len(m); i++ {
				if m[i] != m[0]+i || m[0]%rg.Size != 0 {
					return 1
				}
			}
		}
		return rg.Size
	}
	return 1
}
