package aware

// The entry points (Place, PlaceWithBaseline), and place, the driver that
// runs the stages in order, one a file: the walk (walk.go), the
// single-node exact choice (single.go), the multi-node choice (multi.go),
// the judge (judge.go) and the local search (search.go); then notWorse
// (judge.go) checks the result against the blind baseline. Also the
// placer the stages after the walk share.
//
// Flow (place.go): walk → single-node exact choice → multi-node →
// judge → local search; see internal/placer/README.md.

import (
	"math"
	"time"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/internal/placer/blind"
	"github.com/toposched/toposched/internal/placer/engine"
	"github.com/toposched/toposched/internal/placer/outcome"
	"github.com/toposched/toposched/internal/store"
)

// Place decides where a job runs, topology-aware (see the package doc).
func Place(req engine.Request) outcome.Result {
	ours, _ := placeWithBaseline(req, knobs{})
	return ours
}

// PlaceWithBaseline is Place, also returning what blind first fit decided
// on the same snapshot: Place runs it anyway (for its reasons why a job
// can never fit or must wait), and the decision reports it as the
// baseline, so the cluster is walked once for both.
func PlaceWithBaseline(req engine.Request) (ours, base outcome.Result) {
	return placeWithBaseline(req, knobs{})
}

func placeWithBaseline(req engine.Request, k knobs) (ours, base outcome.Result) {
	base = blind.Place(req.Snap, req.Job)
	if base.Verdict != outcome.Placed {
		return base, base
	}
	return placeNotWorse(req.Snap, req.Job, req.Options, base, k), base
}

// knobs are slower ways to the same decisions, kept as the tests'
// references; only the tests set them (export_test.go).
type knobs struct {
	// eagerOneGPU walks a one-GPU job's nodes to maxJudged at once, as
	// before the walk waited for the judge to ask (place).
	eagerOneGPU bool
	// noTwinPicks works out every node's pick, twins' too.
	noTwinPicks bool
	// everyModelWalk walks a one-GPU job's nodes to oneGPULimit where
	// compute is weighed by model, even when the free GPUs are all of one
	// model.
	everyModelWalk bool
}

// place is the topology-aware decision and, when placed, its predicted
// comm time (NaN when none was worked out), and whether bestFitWithin
// chose it (a tighter fit, allowed to be slower than the fastest by the
// fit tolerance). It runs the stages in order; each answers a Wait where
// the job cannot start.
func place(snap *store.Snapshot, job events.JobAnalyzed, opts engine.Options, k knobs) (outcome.Result, float64, bool) {
	w, wait := walkStage(snap, job, opts, k)
	if wait != nil {
		return *wait, math.NaN(), false
	}
	p := newPlacer(w, job, opts, k)
	var s shortlist
	if len(w.fit) > 0 {
		s = p.singleStage(w, job)
	}
	if !p.multiStage(w, job, &s) {
		// Cannot happen when blind placed and the filter left enough; be
		// safe rather than wrong.
		return waitReason(p.n, job.Job.GPUsPerNode, w.model, w.total, 0), math.NaN(), false
	}
	chosen, judged, wait := p.judgeStage(s)
	if wait != nil {
		return *wait, math.NaN(), false
	}
	chosen = p.searchStage(s, chosen, judged)
	return outcome.Result{Verdict: outcome.Placed, GPUs: chosen.gpus}, chosen.comm, chosen == p.byFit
}

// newPlacer is the placer the stages after the walk share: the cost
// model's evaluator for the job, and the walked nodes.
func newPlacer(w *walked, job events.JobAnalyzed, opts engine.Options, k knobs) *placer {
	n := job.Job.GPUs
	p := &placer{opts: opts, e: newEvaluator(w.snap, job, n, opts), n: n, cands: w.fit, busy: busy(w.snap, w.model), knobs: k}
	if len(w.fit) == 0 {
		p.cands = w.cands
	}
	return p
}

type placer struct {
	opts engine.Options
	// scope names the domain multiNode spreads in when it spreads over
	// all of cands ("": the cluster; see scoped).
	scope  string
	e      *evaluator
	n      int
	cands  []*candNode
	counts []domainCount // scratch of countLocal, reused node after node
	// since, when set, is when the next local search's time budget
	// started: the scoring of the alternatives comes out of it.
	since time.Time
	// byFit is the one-node candidate bestFitWithin put first, when it
	// is not the fastest.
	byFit *cand
	// busy: at most half the GPUs of the job's model are free (see
	// bestFitWithin).
	busy bool
	knobs
}

// holesOne is the holes the node's one-GPU pick takes (the free GPUs of
// its smallest node-local domain; bestFitSingle stops by them), 0 where
// there is no pick. It keeps the pick in c.one.
func (p *placer) holesOne(c *candNode) int {
	in, err := p.pick(c, 1)
	if err != nil {
		return 0
	}
	c.one = &in
	return in.holes
}

// busy reports whether at most half the cluster's GPUs of the model (""
// any) are free: where bestFitWithin weighs what a placement costs the
// next jobs.
func busy(snap *store.Snapshot, model string) bool {
	total := 0
	for c, nodes := range snap.NodeCounts(model).Total {
		total += c * nodes
	}
	return 2*snap.FreeByModel(model) <= total
}
