package aware

// Options: the strategy's names, its Options and the package's
// constants, read by every stage.
//
// Flow (place.go): candidates → single node or multi-node → judge →
// local search → judge again.

import (
	"math"
	"time"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/internal/store"
	"github.com/toposched/toposched/internal/topology"
)

// Strategy names.
const (
	Name           = "topology-aware"
	NameExhaustive = "exhaustive"
)

// Options tune Place and Exhaustive. The zero value is usable.
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
	// DefaultNodeExact; negative: none). A node is chosen exactly, every
	// subset of its free GPUs and every rank order on it, when those
	// ordered selections fit in what is left.
	NodeExact int
	// FitTolerance is how much longer a job's predicted step time may be
	// (compute + communication, a share of the fastest one-node
	// candidate's) on a node that fits it tighter (see bestFitWithin; 0:
	// DefaultFitTolerance; negative: off, the fastest wins). It applies
	// only to a job whose step compute time is known.
	FitTolerance float64
	// ScopeNodes is how many nodes with free GPUs of the job's model a
	// cluster must have before a job no node holds reads one leaf's or
	// pod's nodes rather than every node (see scoped; 0:
	// DefaultScopeNodes; negative: never).
	ScopeNodes int
	// Filter, when set, keeps only the nodes it accepts (node policies
	// plug in here). It is asked only about nodes with free GPUs of the
	// job's model.
	Filter func(NodeView) bool
	// Judge, when set, judges candidate placements (placement policies
	// plug in here): see judge.go.
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

	// eagerOneGPU walks a one-GPU job's nodes to maxJudged at once, as
	// before the walk waited for the judge to ask (place): the tests'
	// reference.
	eagerOneGPU bool
}

const inf = math.MaxFloat64

// oneGPULimit is how many nodes a one-GPU job looks at, best fit first:
// holes matter more than the node's fit.
const oneGPULimit = 256

// singleLimit is how many nodes a job of more GPUs that one node can hold
// looks at (the first by level, then fit).
const singleLimit = 32

// budget is the local search's wall-time bound; 0 is none.
func (o Options) budget() time.Duration {
	switch {
	case o.Budget < 0:
		return 0
	case o.Budget > 0:
		return o.Budget
	}
	return 2 * time.Millisecond
}

// DefaultScopeNodes is Options.ScopeNodes's default. Below it the walk
// of every node costs less than a few milliseconds, and the spreads and
// alternatives it allows over the whole cluster find faster placements
// on small clusters of mixed nodes than a few domains' nodes do: scoped
// on the decision golden's clusters of 24 to 64 nodes, 125 decisions
// were faster and 38 slower, some several times.
const DefaultScopeNodes = 2_048

// DefaultFitTolerance is Options.FitTolerance's default. See
// bestFitWithin for the rule and BENCHMARKS.md ("Issue 17: best fit
// within a tolerance") for how it was chosen.
const DefaultFitTolerance = 0.15

func (o Options) fitTolerance() float64 {
	switch {
	case o.FitTolerance < 0:
		return 0
	case o.FitTolerance == 0:
		return DefaultFitTolerance
	}
	return o.FitTolerance
}

func (o Options) scopeNodes() int {
	if o.ScopeNodes == 0 {
		return DefaultScopeNodes
	}
	return o.ScopeNodes
}

// DefaultNodeExact is Options.NodeExact's default: enough for 4 of 8
// free GPUs (1,680 orders) or 3 of 12 (1,320), at some 10 µs each.
const DefaultNodeExact = 2_000

func (o Options) nodeExact() int {
	switch {
	case o.NodeExact < 0:
		return 0
	case o.NodeExact == 0:
		return DefaultNodeExact
	}
	return o.NodeExact
}

func (o Options) maxEvals() int {
	switch {
	case o.MaxEvals < 0:
		return 0
	case o.MaxEvals == 0:
		return 200
	}
	return o.MaxEvals
}
