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
	"cmp"
	"math"
	"slices"
	"time"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/internal/placer/blind"
	"github.com/toposched/toposched/internal/placer/engine"
	"github.com/toposched/toposched/internal/placer/outcome"
	"github.com/toposched/toposched/internal/store"
	"github.com/toposched/toposched/internal/topology"
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
}

// place is the topology-aware decision and, when placed, its predicted
// comm time (NaN when none was worked out), and whether bestFitWithin
// chose it (a tighter fit, allowed to be slower than the fastest by the
// fit tolerance).
func place(snap *store.Snapshot, job events.JobAnalyzed, opts engine.Options, k knobs) (outcome.Result, float64, bool) {
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
	// judgedFrom walks the nodes again, keeping as many as the judge may
	// read (maxJudged), for a one-GPU job whose first walk kept only the
	// favourite's few (below); nil otherwise.
	var judgedFrom func() []*candNode
	if single && snap.NodeCounts(model).FreeAtLeast(n) > 0 {
		var seen map[string]bool
		var holesOf func(*candNode) int
		walker := &placer{opts: opts, knobs: k} // pick's scratch, and limit
		enough := max(walker.limit(), maxJudged)
		if n == 1 && !k.eagerOneGPU {
			// The judge reads one candidate when the favourite passes,
			// as it mostly does, and up to maxJudged when it does not:
			// the walk keeps the first limit() nodes, which it finds
			// exactly as the longer walk does (bestFitSingle), and is
			// walked again to maxJudged only for a favourite the judge
			// does not pass. A tenth of a one-GPU decision's CPU was the
			// longer walk's (BENCHMARKS.md).
			enough = walker.limit()
		}
		if n == 1 {
			holesOf = walker.holesOne
		}
		fit, seen = bestFitSingle(snap, model, opts.Filter, n, enough, holesOf)
		if x != nil {
			x.Explanation.NodesConsidered = snap.NodeCounts(model).FreeAtLeast(1)
		}
		if f := opts.Filter; f != nil {
			// The cluster walk, and the longer walk, if they come, ask
			// no node twice (the filter counts the nodes it denies).
			filter = func(v engine.NodeView) bool {
				if ok, asked := seen[v.Node.Name]; asked {
					return ok
				}
				return f(v)
			}
		}
		if enough < maxJudged {
			judgedFrom = func() []*candNode {
				longer, asked := bestFitSingle(snap, model, filter, n, max(walker.limit(), maxJudged), holesOf)
				for name, ok := range asked {
					if seen == nil {
						seen = map[string]bool{}
					}
					seen[name] = ok
				}
				return longer
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
	// On a large cluster, a job no node holds reads the nodes of a few
	// leaves or pods that hold it (scoped), the cluster's only when none
	// does.
	var sets []scopeSet
	if len(fit) == 0 {
		if sn := scopeNodes(opts); sn >= 0 && snap.NodeCounts(model).FreeAtLeast(1) > sn {
			sets = scoped(snap, job, model, filter, n, gpn)
		}
		if sets != nil {
			for _, set := range sets {
				cands = append(cands, set.cands...)
				for _, c := range set.cands {
					total += len(c.free)
				}
			}
			if x != nil {
				x.Explanation.NodesConsidered = len(cands)
			}
		} else {
			full()
			if wait, ok := filterWait(cands, total, n, gpn, model); ok {
				return wait, math.NaN(), false
			}
		}
	}
	e := newEvaluator(snap, job, n, opts)
	p := &placer{opts: opts, e: e, n: n, cands: fit, busy: busy(snap, model), knobs: k}
	if len(fit) == 0 {
		p.cands = cands
	}
	var list []*cand
	var more func() []*cand
	if len(fit) > 0 {
		levels := 0
		if x != nil {
			levels = len(x.Explanation.Levels)
		}
		list = p.singleNode(fit)
		if judgedFrom != nil && len(list) > 0 && opts.Judge != nil {
			if first := list[0]; !p.passes(first) {
				// As if the walk had gone on to maxJudged from the
				// start: its favourite is the same one, judged already.
				fit = judgedFrom()
				p.cands = fit
				if x != nil {
					x.Explanation.Levels = x.Explanation.Levels[:levels]
				}
				list = p.singleNode(fit)
				if len(list) > 0 && list[0].domain == first.domain && slices.Equal(list[0].gpus, first.gpus) {
					list[0].j, list[0].judged = first.j, true
				}
			}
		}
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
	if len(list) == 0 && sets != nil {
		// One spread per domain, the fastest first.
		for _, set := range sets {
			p.scope = set.dom
			list = append(list, p.multiNode(set.cands, job, gpn, 1)...)
		}
		p.scope = ""
		slices.SortStableFunc(list, func(a, b *cand) int { return cmp.Compare(p.score(a), p.score(b)) })
		if len(list) > 0 {
			// More candidates, for a judge that denies them, come from
			// the whole cluster.
			scopedList := slices.Clone(list)
			more = func() []*cand {
				p.cands = full()
				return slices.DeleteFunc(p.multiNode(p.cands, job, gpn, p.limit()), func(c *cand) bool {
					return slices.ContainsFunc(scopedList, func(s *cand) bool { return slices.Equal(c.gpus, s.gpus) })
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
		return waitReason(n, gpn, model, total, 0), math.NaN(), false
	}
	// A job one node holds may still be faster spread over nodes where its
	// node's choice crosses the inter-socket link (SYS), which the cost
	// model shares among the node's flows: then the whole cluster is the
	// local search's to trade GPUs with. A job spread over nodes trades
	// among them.
	// A tighter fit bestFitWithin chose is not spread again: keeping the
	// job on that node is what it was chosen for.
	across := len(fit) == 0 && gpn == 0 // gpus_per_node fixes each node's share
	if len(fit) > 0 && gpn == 0 && list[0] != p.byFit && p.crossesSMP(list[0].gpus) {
		p.cands = full()
		across = true
	}
	// When an alternative is the favourite of a job of at most 16 GPUs,
	// whose local search trades ranks and GPUs across nodes, the choice
	// without it is refined too, and kept unless the alternative is still
	// better by 0.5% after the search (fewer nodes, groups kept whole). A
	// larger job's search stays inside nodes, which changes neither the
	// nodes nor which groups cross them: the comparison before it stands.
	alt := false
	if len(fit) == 0 || across {
		p.since = time.Now()
		// Other groupings on nodes, and spreads that keep off the
		// inter-socket links, where the cost model finds one faster by
		// 0.5% than the favourite.
		if l := p.faster(list, p.alternatives(p.cands, job, gpn, list[0])); len(l) > len(list) {
			alt, list = true, l
			if more != nil {
				m := more
				more = func() []*cand { // without the alternative, if it is among them
					return slices.DeleteFunc(m(), func(c *cand) bool { return slices.Equal(c.gpus, l[0].gpus) })
				}
			}
		}
	}
	chosen, judged := p.choose(list, more)
	if chosen == nil {
		if x != nil {
			x.PolicyDenied = true
		}
		p.explain(judged, nil)
		return outcome.Result{Verdict: outcome.Wait, Reasons: denyReasons(judged[0])}, math.NaN(), false
	}
	if opts.Compact != nil {
		if why, wait := opts.Compact(chosen.gpus, p.score(chosen)); wait {
			if x != nil {
				x.CompactAwaited = true
			}
			// Listed as denied, by the rule, with its reason.
			chosen.j.Deny, chosen.j.Reasons = true, []events.Reason{why}
			if !slices.Contains(judged, chosen) {
				judged = append(judged, chosen)
			}
			p.explain(judged, nil)
			return outcome.Result{Verdict: outcome.Wait, Reasons: []events.Reason{why}}, math.NaN(), false
		}
	}
	final := p.refine(chosen, across)
	if alt && chosen == list[0] && n <= 16 {
		if other, _ := p.choose(list[1:], more); other != nil {
			r := p.refine(other, across)
			best := min(p.score(final), p.score(r))
			cf, co := 1+chosen.j.Score, 1+other.j.Score
			if best > 0 && !math.IsInf(best, 0) {
				cf, co = p.score(final)/best+chosen.j.Score, p.score(r)/best+other.j.Score
			}
			if !(cf < co-0.005*math.Abs(co)) {
				chosen, final = other, r
				if !slices.Contains(judged, other) {
					judged = append(judged, other)
				}
			}
		}
	}
	*chosen = *final
	p.explain(judged, chosen)
	return outcome.Result{Verdict: outcome.Placed, GPUs: chosen.gpus}, chosen.comm, chosen == p.byFit
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

// refine is the local search's result on c, each node's share then
// chosen exactly (exactShares), judged again with a Judge and kept only if
// allowed; or c when nothing moved.
func (p *placer) refine(c *cand, across bool) *cand {
	if c.settled && !across {
		// Every swap of its ranks and every exchange for a spare GPU of
		// its node costs the same (exactInNode): nothing to search, and
		// the search's clock starts afresh for the next candidate, as it
		// would after a search.
		p.since = time.Time{}
		p.score(c)
		return c
	}
	gpus, t := p.localSearch(c.gpus, p.cands, across, c.comm)
	if searchEvals(p.opts) != 0 {
		gpus, t = p.exactShares(gpus, t)
	}
	if slices.Equal(gpus, c.gpus) {
		if math.IsNaN(c.comm) {
			c.comm = t
		}
		return c
	}
	refined := &cand{domain: c.domain, gpus: gpus, comm: t, cost: c.cost}
	if p.opts.Judge != nil {
		// The search moved ranks or GPUs: what the policies see may have
		// changed (a TP group's islands), so the result is judged again
		// and kept only if it passes.
		p.judge(refined)
		if refined.j.Deny {
			return c
		}
	}
	return refined
}

// faster puts the fastest of alts at the front of list when it is faster
// than list[0] by more than 0.5%.
func (p *placer) faster(list, alts []*cand) []*cand {
	if len(alts) == 0 {
		return list
	}
	best, bestT := -1, p.score(list[0])
	for i, c := range alts {
		if t := p.score(c); t < bestT*(1-0.005) {
			best, bestT = i, t
		}
	}
	if best < 0 {
		return list
	}
	return append([]*cand{alts[best]}, list...)
}

// crossesSMP reports whether two of the GPUs on one node are joined over
// the inter-socket link (SYS). Nodes without such a link are passed over.
func (p *placer) crossesSMP(gpus []store.GPUKey) bool {
	var onNode map[string][]int // positions of the GPUs of nodes with SYS links
	for _, g := range gpus {
		nt, err := p.e.res.node(g.Node)
		if err != nil || !nt.sys {
			continue
		}
		if onNode == nil {
			onNode = map[string][]int{}
		}
		pos := nt.pos[g.Index]
		for _, q := range onNode[g.Node] {
			if nt.topo.GPUPaths[q][pos].Class == topology.SYS {
				return true
			}
		}
		onNode[g.Node] = append(onNode[g.Node], pos)
	}
	return false
}
