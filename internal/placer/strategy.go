package placer

import (
	"fmt"
	"strings"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/internal/placer/aware"
	"github.com/toposched/toposched/internal/placer/blind"
	"github.com/toposched/toposched/internal/placer/engine"
	"github.com/toposched/toposched/internal/placer/fill"
	"github.com/toposched/toposched/internal/placer/gpuallocator"
	"github.com/toposched/toposched/internal/placer/nodefit"
	"github.com/toposched/toposched/internal/placer/outcome"
	"github.com/toposched/toposched/internal/placer/random"
	"github.com/toposched/toposched/internal/store"
)

// Strategy names, as recorded in PlacementDecided.Strategy.
const (
	StrategyTopologyAware = aware.Name
	StrategyBlind         = blind.Name
	StrategyExhaustive    = aware.NameExhaustive
	// Peers: what other schedulers would do, for comparisons (replay
	// --compare).
	StrategyBinpack      = nodefit.NameBinpack
	StrategySpread       = nodefit.NameSpread
	StrategyGPUAllocator = gpuallocator.Name
	StrategyRandom       = random.Name
)

// Strategy is one way of choosing a job's GPUs. The Planner gives it the
// snapshot, the job, the policies (req.Filter, req.Judge), the fabric and
// the explanation to fill; it answers its own result and blind first
// fit's on the same snapshot, the baseline every decision reports.
type Strategy interface {
	Name() string
	Place(req engine.Request) (ours, base outcome.Result, err error)
}

// registered is the one list of strategies: the Planner, the placement
// service's configuration and the CLIs' flags all read it.
var registered = []struct {
	Strategy
	// dryRunOnly strategies are too slow for a live queue (exhaustive
	// enumerates every subset); dry runs and harnesses may use them.
	dryRunOnly bool
}{
	{Strategy: awareStrategy{}},
	{Strategy: judged{StrategyBlind, blindFit}},
	{Strategy: exhaustiveStrategy{}, dryRunOnly: true},
	{Strategy: judged{StrategyBinpack, nodefit.Binpack}},
	{Strategy: judged{StrategySpread, nodefit.Spread}},
	{Strategy: judged{StrategyGPUAllocator, gpuallocator.Place}},
	{Strategy: judged{StrategyRandom, random.Place}},
}

// Lookup returns the strategy called name ("" is topology-aware). With
// live set, only the strategies the placement service may run are found.
func Lookup(name string, live bool) (Strategy, error) {
	if name == "" {
		name = StrategyTopologyAware
	}
	for _, r := range registered {
		if r.Name() == name && (!live || !r.dryRunOnly) {
			return r.Strategy, nil
		}
	}
	return nil, fmt.Errorf("strategy %q: expected %s", name, strings.Join(Names(live), ", "))
}

// Names lists the strategies, the default first; with live set, only those
// the placement service may run.
func Names(live bool) []string {
	var out []string
	for _, r := range registered {
		if !live || !r.dryRunOnly {
			out = append(out, r.Name())
		}
	}
	return out
}

type awareStrategy struct{}

func (awareStrategy) Name() string { return StrategyTopologyAware }

func (awareStrategy) Place(req engine.Request) (outcome.Result, outcome.Result, error) {
	ours, base := aware.PlaceWithBaseline(req)
	return ours, base, nil
}

// judged is a strategy of one answer (blind first fit and the peers:
// binpack, spread, go-gpuallocator, random), with the placement policies
// judging the placement it finds. It takes GPUs only of the nodes
// req.Filter allows (node policies, a reservation for an older job), as
// topology-aware does, so that every strategy runs under the same
// policies and queue.
//
// Where the policies deny its placement and the job has tensor-parallel
// groups (engine.Unit), it asks once more with each group kept on one
// node, as its users would run the job under a scheduler of its kind: one
// pod (or Slurm task) a group, each pod fitted to a node (fill.Place).
// That placement is judged in turn; the job waits only when it is denied
// too, or cannot be had. A peer that cannot satisfy a policy it could
// satisfy by its users' ordinary means would wait for nothing, and its
// large jobs' waits would make its small jobs' look short.
type judged struct {
	name string
	// place takes the job's GPUs unit at a time on a node (1: any number).
	place func(snap *store.Snapshot, job events.JobAnalyzed, keep engine.Keep, unit int) outcome.Result
}

func (s judged) Name() string { return s.name }

func (s judged) Place(req engine.Request) (outcome.Result, outcome.Result, error) {
	keep := keepOf(req.Filter)
	r := s.place(req.Snap, req.Job, keep, 1)
	base := r
	if s.name != StrategyBlind {
		base = blind.Place(req.Snap, req.Job)
	}
	if r.Verdict != outcome.Placed || req.Judge == nil {
		return r, base, nil
	}
	j := s.judge(req, r.GPUs)
	if j.Deny {
		r, j = s.byGroups(req, keep, r, j)
	}
	if j.Deny {
		r = outcome.Result{Verdict: outcome.Wait, Reasons: j.Reasons}
	}
	if req.Explain != nil {
		req.Explain.PolicyDenied = j.Deny
		req.Explain.Judgement = j
	}
	return r, base, nil
}

// byGroups is judged's second ask, for a placement r the policies denied
// (j): the job by groups of its innermost dimension, each on one node. It
// answers that placement and its judgement where the policies allow it,
// else r and j.
func (s judged) byGroups(req engine.Request, keep engine.Keep, r outcome.Result, j engine.Judgement) (outcome.Result, engine.Judgement) {
	unit := engine.Unit(req.Job, req.Job.Job.GPUs)
	if unit <= 1 || wholeGroups(r.GPUs, unit) {
		return r, j
	}
	g := s.place(req.Snap, req.Job, keep, unit)
	if g.Verdict != outcome.Placed {
		return r, j
	}
	gj := s.judge(req, g.GPUs)
	if gj.Deny {
		return r, j
	}
	gj.Warnings = append(gj.Warnings, events.Reason{Code: CodePlacedByGroups, Field: outcome.FieldGPUs,
		Message: fmt.Sprintf("%s's first placement was denied (%s); placed again with each %s group of %d GPUs on one node", s.name, codes(j.Reasons), req.Job.Order[0], unit)})
	return g, gj
}

// CodePlacedByGroups warns that a peer's placement is its second, by
// tensor-parallel groups (judged).
const CodePlacedByGroups = "placed_by_tp_groups"

// codes joins the reasons' codes.
func codes(rs []events.Reason) string {
	c := make([]string, len(rs))
	for i, r := range rs {
		c[i] = r.Code
	}
	return strings.Join(c, ", ")
}

// judge asks the policies of the placement gpus.
func (s judged) judge(req engine.Request, gpus []store.GPUKey) engine.Judgement {
	c := engine.Candidate{GPUs: gpus, Domain: store.ClusterDomain}
	if pr, err := Prediction(req.Snap, req.Job, gpus, req.Fabric, req.Bandwidths, s.name); err == nil {
		c.CommSeconds = pr.CommSecondsPerStep
	}
	return req.Judge(c)
}

// wholeGroups says whether every group of unit consecutive GPUs of gpus
// is on one node already (then asking by groups gives nothing new).
func wholeGroups(gpus []store.GPUKey, unit int) bool {
	for i := 0; i+unit <= len(gpus); i += unit {
		for _, g := range gpus[i+1 : i+unit] {
			if g.Node != gpus[i].Node {
				return false
			}
		}
	}
	return true
}

// blindFit is blind first fit (blind.PlaceOn), unit GPUs at a time on a
// node in its node order where unit is above 1.
func blindFit(snap *store.Snapshot, job events.JobAnalyzed, keep engine.Keep, unit int) outcome.Result {
	if unit <= 1 {
		return blind.PlaceOn(snap, job, keep)
	}
	return fill.Place(snap, job, snap.EachNodeFree(job.Job.GPUModel), fill.First, keep, unit)
}

// keepOf asks filter of each node at most once (the verdict and the walk
// both look at a node, and the Planner counts each denial), nil for nil.
func keepOf(filter func(engine.NodeView) bool) engine.Keep {
	if filter == nil {
		return nil
	}
	asked := map[string]bool{}
	return func(n *store.Node, free []store.FreeGPU) bool {
		ok, seen := asked[n.Name]
		if !seen {
			ok = filter(engine.ViewOf(*n, free))
			asked[n.Name] = ok
		}
		return ok
	}
}

// exhaustiveStrategy is the optimum under the cost model, for jobs small
// enough to enumerate.
type exhaustiveStrategy struct{}

func (exhaustiveStrategy) Name() string { return StrategyExhaustive }

func (exhaustiveStrategy) Place(req engine.Request) (outcome.Result, outcome.Result, error) {
	base := blind.Place(req.Snap, req.Job)
	if base.Verdict != outcome.Placed {
		return base, base, nil
	}
	r, err := aware.Exhaustive(req)
	return r, base, err
}
