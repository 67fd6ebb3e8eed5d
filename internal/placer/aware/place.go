package aware

// The entry points, and place, which runs the stages in order: the
// candidate walk (candidates.go), the single-node (single.go) or
// multi-node (multi.go) candidates, the judge's choice among them
// (judge.go), the local search (search.go), and the judge again on its
// result. Also the placer the stages share and the node-local level
// helpers.
//
// Flow: candidates → single node or multi-node → judge →
// local search → judge again.

import (
	"math"
	"slices"
	"strings"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/internal/placer/blind"
	"github.com/toposched/toposched/internal/placer/outcome"
	"github.com/toposched/toposched/internal/store"
)

// Place decides where a job runs, topology-aware (see the package doc).
func Place(snap *store.Snapshot, job events.JobAnalyzed, opts Options) outcome.Result {
	ours, _ := PlaceWithBaseline(snap, job, opts)
	return ours
}

// PlaceWithBaseline is Place, also returning what blind first fit decided
// on the same snapshot: Place runs it anyway (for its reasons why a job
// can never fit or must wait), and the decision reports it as the
// baseline, so the cluster is walked once for both.
func PlaceWithBaseline(snap *store.Snapshot, job events.JobAnalyzed, opts Options) (ours, base outcome.Result) {
	base = blind.Place(snap, job)
	if base.Verdict != outcome.Placed {
		return base, base
	}
	return placeNotWorse(snap, job, opts, base), base
}

func place(snap *store.Snapshot, job events.JobAnalyzed, opts Options) outcome.Result {
	n, gpn, model := job.Job.GPUs, job.Job.GPUsPerNode, job.Job.GPUModel
	x := opts.Explain
	var cands []*candNode
	var total int
	single := gpn == 0 || gpn == n
	// A job one node can hold is placed among the best-fitting nodes
	// only (see bestFitSingle): they are walked and filtered first, and
	// the whole cluster only when no node holds the job, or a Judge asks
	// for more.
	var fit []*candNode
	filter := opts.Filter
	if single && snap.NodeCounts(model).FreeAtLeast(n) > 0 {
		var seen map[string]bool
		fit, seen = bestFitSingle(snap, model, opts.Filter, n)
		if x != nil {
			x.Explanation.NodesConsidered = snap.NodeCounts(model).FreeAtLeast(1)
		}
		if f := opts.Filter; f != nil {
			// The cluster walk, if it comes, asks no node twice.
			filter = func(v NodeView) bool {
				if ok, asked := seen[v.Node.Name]; asked {
					return ok
				}
				return f(v)
			}
		}
	}
	var fullDone bool
	full := func() []*candNode {
		if !fullDone {
			var considered int
			cands, total, considered = candidates(snap, model, filter)
			fullDone = true
			if x != nil {
				x.Explanation.NodesConsidered = considered
			}
		}
		return cands
	}
	if len(fit) == 0 {
		full()
		if wait, ok := filterWait(cands, total, n, gpn, model); ok {
			return wait
		}
	}
	e := newEvaluator(snap, job, n, opts)
	p := &placer{opts: opts, e: e, n: n, cands: fit}
	if len(fit) == 0 {
		p.cands = cands
	}
	var list []*cand
	var more func() []*cand
	if len(fit) > 0 {
		list = p.singleNode(fit)
		if gpn == 0 {
			// Spread over nodes, for when every one-node candidate is
			// denied; those that land on one node were seen already.
			more = func() []*cand {
				p.cands = full() // holds the nodes of fit too
				return slices.DeleteFunc(p.multiNode(p.cands, job, gpn, p.limit()), func(c *cand) bool {
					return !slices.ContainsFunc(c.gpus, func(g store.GPUKey) bool { return g.Node != c.gpus[0].Node })
				})
			}
		}
	}
	if len(list) == 0 {
		p.cands = full()
		list = p.multiNode(p.cands, job, gpn, 1)
		more = func() []*cand { return p.multiNode(p.cands, job, gpn, p.limit())[1:] }
	}
	if len(list) == 0 {
		// Cannot happen when blind placed and the filter left enough; be
		// safe rather than wrong.
		return waitReason(n, gpn, model, total, 0)
	}
	chosen, judged := p.choose(list, more)
	if chosen == nil {
		if x != nil {
			x.PolicyDenied = true
		}
		p.explain(judged, nil)
		return outcome.Result{Verdict: outcome.Wait, Reasons: denyReasons(judged[0])}
	}
	if gpus := p.localSearch(chosen.gpus, p.cands); !slices.Equal(gpus, chosen.gpus) {
		refined := &cand{domain: chosen.domain, gpus: gpus, comm: math.NaN(), cost: chosen.cost}
		if p.opts.Judge == nil {
			*chosen = *refined
		} else {
			// The search moved ranks or GPUs: what the policies see may
			// have changed (a TP group's islands), so the result is judged
			// again and kept only if it passes.
			p.judge(refined)
			if !refined.j.Deny {
				*chosen = *refined
			}
		}
	}
	p.explain(judged, chosen)
	return outcome.Result{Verdict: outcome.Placed, GPUs: chosen.gpus}
}

type placer struct {
	opts   Options
	e      *evaluator
	n      int
	cands  []*candNode
	leaves map[string]string // node → leaf domain, for explanations
	counts []domainCount     // scratch of countLocal, reused node after node
}

func levelOf(kind string) int {
	switch kind {
	case store.DomainIsland:
		return 0
	case store.DomainPCIe:
		return 1
	case store.DomainNUMA:
		return 2
	}
	return 3
}

// levelOfID is levelOf(store.DomainKind(id)) without cutting the string.
func levelOfID(id string) int {
	switch {
	case strings.HasPrefix(id, store.DomainIsland+":"):
		return 0
	case strings.HasPrefix(id, store.DomainPCIe+":"):
		return 1
	case strings.HasPrefix(id, store.DomainNUMA+":"):
		return 2
	}
	return 3
}
