package aware

// The strategy's names and defaults (of engine.Options' tuning) and the
// package's constants, read by every stage.
//
// Flow (place.go): walk → single-node exact choice → multi-node →
// judge → local search; see internal/placer/README.md.

import (
	"math"
	"time"

	"github.com/toposched/toposched/internal/placer/engine"
)

// Strategy names.
const (
	Name           = "topology-aware"
	NameExhaustive = "exhaustive"
)

const inf = math.MaxFloat64

// oneGPULimit is how many nodes a one-GPU job looks at, best fit first:
// holes matter more than the node's fit.
const oneGPULimit = 256

// singleLimit is how many nodes a job of more GPUs that one node can hold
// looks at (the first by level, then fit).
const singleLimit = 32

// budget is the local search's wall-time bound; 0 is none.
func searchBudget(o engine.Options) time.Duration {
	switch {
	case o.Budget < 0:
		return 0
	case o.Budget > 0:
		return o.Budget
	}
	return 2 * time.Millisecond
}

// DefaultScopeNodes is engine.Options.ScopeNodes's default. Below it the walk
// of every node costs less than a few milliseconds, and the spreads and
// alternatives it allows over the whole cluster find faster placements
// on small clusters of mixed nodes than a few domains' nodes do: scoped
// on the decision golden's clusters of 24 to 64 nodes, 125 decisions
// were faster and 38 slower, some several times.
const DefaultScopeNodes = 2_048

// DefaultFitTolerance is engine.Options.FitTolerance's default. See
// bestFitWithin for the rule and BENCHMARKS.md ("Issue 17: best fit
// within a tolerance") for how it was chosen.
const DefaultFitTolerance = 0.15

func fitTolerance(o engine.Options) float64 {
	switch {
	case o.FitTolerance < 0:
		return 0
	case o.FitTolerance == 0:
		return DefaultFitTolerance
	}
	return o.FitTolerance
}

func scopeNodes(o engine.Options) int {
	if o.ScopeNodes == 0 {
		return DefaultScopeNodes
	}
	return o.ScopeNodes
}

// DefaultNodeExact is engine.Options.NodeExact's default: enough for 4 of 8
// free GPUs (1,680 orders) or 3 of 12 (1,320), at some 10 µs each.
const DefaultNodeExact = 2_000

func nodeExact(o engine.Options) int {
	switch {
	case o.NodeExact < 0:
		return 0
	case o.NodeExact == 0:
		return DefaultNodeExact
	}
	return o.NodeExact
}

func searchEvals(o engine.Options) int {
	switch {
	case o.MaxEvals < 0:
		return 0
	case o.MaxEvals == 0:
		return 200
	}
	return o.MaxEvals
}
