package aware

// Stage 4, the judge (judgeStage): the policies' choice among the
// shortlist (choose: the favourite when it passes, else the allowed one
// of least cost), then the Compact rule on it. In: the shortlist; out:
// the chosen candidate and those judged, or a Wait. Also notWorse, the
// check of place's result against the blind baseline.
//
// Flow (place.go): walk → single-node exact choice → multi-node →
// judge → local search; see internal/placer/README.md.

import (
	"cmp"
	"math"
	"slices"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/internal/placer/engine"
	"github.com/toposched/toposched/internal/placer/outcome"
	"github.com/toposched/toposched/internal/store"
)

// judgeStage is the judge's choice among the shortlist (choose), then
// Options.Compact's on the chosen candidate. It answers a Wait instead
// when the judge denies every candidate, or Compact keeps the job
// waiting; both explain the candidates judged.
func (p *placer) judgeStage(s shortlist) (chosen *cand, judged []*cand, wait *outcome.Result) {
	x := p.opts.Explain
	chosen, judged = p.choose(s.list, s.more)
	if chosen == nil {
		if x != nil {
			x.PolicyDenied = true
		}
		p.explain(judged, nil)
		return nil, nil, &outcome.Result{Verdict: outcome.Wait, Reasons: denyReasons(judged[0])}
	}
	if p.opts.Compact != nil {
		if why, hold := p.opts.Compact(chosen.gpus, p.score(chosen)); hold {
			// Listed as denied, by the rule, with its reason.
			chosen.j.Deny, chosen.j.Reasons = true, []events.Reason{why}
			if !slices.Contains(judged, chosen) {
				judged = append(judged, chosen)
			}
			if c, cj := p.elsewhere(s, chosen); c != nil {
				for _, e := range cj {
					if !slices.ContainsFunc(judged, func(d *cand) bool { return slices.Equal(d.gpus, e.gpus) }) {
						judged = append(judged, e)
					}
				}
				return c, judged, nil
			}
			if x != nil {
				x.CompactAwaited = true
			}
			p.explain(judged, nil)
			return nil, nil, &outcome.Result{Verdict: outcome.Wait, Reasons: []events.Reason{why}}
		}
	}
	return chosen, judged, nil
}

// elsewhere is the job's spread in the tightest other fabric domain
// (shortlist.elsewhere, in multiNode's order) on which Options.Compact
// lets it start and the judge allows it, with the candidates judged; nil
// when there is none. held is the candidate Compact kept waiting. The
// tightest such domain, not the fastest, as for the first choice: within
// the bound, best fit keeps the looser domains whole for larger jobs.
func (p *placer) elsewhere(s shortlist, held *cand) (*cand, []*cand) {
	if s.elsewhere == nil {
		return nil, nil
	}
	var judged []*cand
	for _, c := range s.elsewhere() {
		if slices.Equal(c.gpus, held.gpus) || p.score(c) >= p.score(held) {
			continue
		}
		if _, hold := p.opts.Compact(c.gpus, p.score(c)); hold {
			continue
		}
		judged = append(judged, c)
		if p.opts.Judge != nil {
			if p.judge(c); c.j.Deny {
				continue
			}
			c.cost = 1 + c.j.Score
		}
		return c, judged
	}
	return nil, nil
}

// cand is one candidate inside Place.
type cand struct {
	domain string
	gpus   []store.GPUKey
	comm   float64 // NaN until scored
	judged bool
	j      engine.Judgement
	cost   float64
	// settled: a one-node candidate no other choice on its node beats
	// (exactInNode), so the local search inside the node is skipped.
	settled bool
}

// limit is how many candidates are scored (Options.Candidates, 4).
func (p *placer) limit() int {
	if p.opts.Candidates > 0 {
		return p.opts.Candidates
	}
	return 4
}

// score returns the candidate's predicted comm time, computing it once.
func (p *placer) score(c *cand) float64 {
	if math.IsNaN(c.comm) {
		c.comm = p.e.cost(c.gpus)
	}
	return c.comm
}

// passes judges c and reports whether the judge lets it through as it
// is: neither denied nor scored, so that no other candidate can cost less.
func (p *placer) passes(c *cand) bool {
	p.judge(c)
	return !c.j.Deny && c.j.Score == 0
}

func (p *placer) judge(c *cand) {
	if c.judged {
		return
	}
	c.j = p.opts.Judge(engine.Candidate{Domain: c.domain, GPUs: c.gpus, CommSeconds: p.score(c)})
	c.judged = true
}

// maxJudged bounds the candidates judged when the favourites are denied.
const maxJudged = 16

// choose picks among the candidates, the favourite first. Without a Judge
// the favourite wins. With one, the favourite wins when it is allowed and
// scores nothing (the common case, one evaluation); otherwise the first
// Options.Candidates of the list and of more() are judged, then, while all
// are denied, up to maxJudged, and the allowed one of least cost wins
// (ties within 0.5% to the earlier). It returns the candidates judged; the
// chosen one is nil when every one was denied.
func (p *placer) choose(list []*cand, more func() []*cand) (*cand, []*cand) {
	if p.opts.Judge == nil {
		return list[0], list[:1]
	}
	if p.passes(list[0]) {
		list[0].cost = 1
		return list[0], list[:1]
	}
	if more != nil {
		list = append(list, more()...)
	}
	n := min(len(list), p.limit())
	for i := range n {
		p.judge(list[i])
	}
	for ; n < min(len(list), maxJudged) && !slices.ContainsFunc(list[:n], func(c *cand) bool { return !c.j.Deny }); n++ {
		p.judge(list[n])
	}
	judged := list[:n]
	// The cost is relative step time: communication, plus compute where
	// compute is weighed by GPU model (bymodel.go).
	step := func(c *cand) float64 { return c.comm }
	if p.e.byModel != nil {
		step = p.stepOn
	}
	fastest := math.Inf(1)
	for _, c := range judged {
		fastest = min(fastest, step(c))
	}
	var best *cand
	for _, c := range judged {
		c.cost = 1 + c.j.Score
		if fastest > 0 && !math.IsInf(fastest, 0) {
			c.cost = step(c)/fastest + c.j.Score
		}
		if !c.j.Deny && (best == nil || c.cost < best.cost-0.005*math.Abs(best.cost)) {
			best = c
		}
	}
	return best, judged
}

// explain records the judged candidates, the chosen one first.
func (p *placer) explain(judged []*cand, chosen *cand) {
	x := p.opts.Explain
	if x == nil {
		return
	}
	order := slices.Clone(judged)
	slices.SortStableFunc(order, func(a, b *cand) int {
		switch {
		case a == chosen:
			return -1
		case b == chosen:
			return 1
		case a.j.Deny != b.j.Deny:
			if b.j.Deny {
				return -1
			}
			return 1
		}
		return cmp.Compare(a.cost, b.cost)
	})
	leafOf := p.leavesOf(order)
	for _, c := range order {
		leaves := map[string]bool{}
		nodes := map[string]bool{}
		for _, g := range c.gpus {
			nodes[g.Node] = true
		}
		cs := events.CandidateScore{Domain: c.domain, Nodes: len(nodes), CommSecondsPerStep: p.score(c), Score: c.j.Score, Cost: c.cost}
		if c.cost == 0 {
			cs.Cost = 1 + c.j.Score
		}
		for n := range nodes {
			if l := leafOf[n]; l != "" {
				leaves[l] = true
			}
		}
		cs.Leaves = len(leaves)
		switch {
		case c == chosen:
			cs.Outcome = events.OutcomeChosen
		case c.j.Deny:
			cs.Outcome, cs.Reasons = events.OutcomeDenied, c.j.Reasons
		default:
			cs.Outcome = events.OutcomeCostlier
		}
		x.Explanation.Candidates = append(x.Explanation.Candidates, cs)
	}
	if chosen != nil {
		x.Judgement = chosen.j
	}
}

func denyReasons(c *cand) []events.Reason {
	if len(c.j.Reasons) > 0 {
		return c.j.Reasons
	}
	return []events.Reason{{Code: "policy_denied", Message: "a placement policy denied every candidate placement"}}
}

// leavesOf maps the nodes of the candidates to their leaves, as the
// candidate nodes list them (none when they list no leaf): one pass over
// the candidate nodes, keeping the few the candidates use.
func (p *placer) leavesOf(cs []*cand) map[string]string {
	out := map[string]string{}
	for _, c := range cs {
		for _, g := range c.gpus {
			out[g.Node] = ""
		}
	}
	for _, c := range p.cands {
		if _, ok := out[c.node.Name]; !ok {
			continue
		}
		for _, d := range c.fabric {
			if store.DomainKind(d) == store.DomainLeaf {
				out[c.node.Name] = d
				break
			}
		}
	}
	return out
}

// notWorse keeps a topology-aware decision from being predicted slower than
// the blind baseline it is published beside: when blind's GPUs, in blind's
// rank order, are predicted faster by more than 0.5% (the heuristics and a
// budgeted local search can miss on odd fragmentations) and the Judge
// allows them, they are taken instead, and the explanation says so.
//
// refused names the nodes the Filter refused: blind ignores the Filter, so
// its GPUs count only when none lies on such a node.
//
// oursT is ours' predicted comm time when place worked it out (else NaN).
// byFit says that bestFitWithin chose ours, a tighter fit allowed to be
// slower than the fastest by the fit tolerance in step time: then blind's
// GPUs are taken only when ours' step time is longer than blind's by more
// than that tolerance.
func notWorse(snap *store.Snapshot, job events.JobAnalyzed, opts engine.Options, ours outcome.Result, oursT float64, byFit bool, base outcome.Result, refused map[string]bool) outcome.Result {
	if ours.Verdict != outcome.Placed || base.Verdict != outcome.Placed || slices.Equal(ours.GPUs, base.GPUs) {
		return ours
	}
	for _, g := range base.GPUs {
		if refused[g.Node] {
			return ours
		}
	}
	e := newEvaluator(snap, job, len(base.GPUs), opts)
	if len(e.groups) == 0 {
		return ours
	}
	tb := e.cost(base.GPUs)
	to := oursT
	if math.IsNaN(to) {
		to = e.cost(ours.GPUs)
	}
	so, sb, comp := to, tb, e.comp
	if e.byModel != nil {
		// Compute differs by model: compare whole steps.
		so, sb, comp = to+e.compOn(ours.GPUs), tb+e.compOn(base.GPUs), 0
	}
	if byFit {
		if !((comp + so) > (comp+sb)*(1+fitTolerance(opts))) {
			return ours
		}
	} else if !(sb < so*(1-0.005)) {
		return ours
	}
	c := engine.Candidate{Domain: store.ClusterDomain, GPUs: base.GPUs, CommSeconds: tb}
	var j engine.Judgement
	if opts.Judge != nil {
		if j = opts.Judge(c); j.Deny {
			return ours
		}
	}
	if x := opts.Explain; x != nil {
		nodes := map[string]bool{}
		for _, g := range base.GPUs {
			nodes[g.Node] = true
		}
		cs := events.CandidateScore{Domain: c.Domain, Nodes: len(nodes), CommSecondsPerStep: tb, Score: j.Score,
			Cost: 1 + j.Score, Outcome: events.OutcomeChosen}
		for i := range x.Explanation.Candidates {
			old := &x.Explanation.Candidates[i]
			// Costs are relative to the fastest, which is now this one.
			old.Cost = old.CommSecondsPerStep/tb + old.Score
			if old.Outcome == events.OutcomeChosen {
				old.Outcome = events.OutcomeCostlier
			}
		}
		x.Explanation.Candidates = append([]events.CandidateScore{cs}, x.Explanation.Candidates...)
		x.Judgement = j
	}
	return outcome.Result{Verdict: outcome.Placed, GPUs: base.GPUs}
}

// placeNotWorse is place, then notWorse against base.
func placeNotWorse(snap *store.Snapshot, job events.JobAnalyzed, opts engine.Options, base outcome.Result, k knobs) outcome.Result {
	var refused map[string]bool
	f := opts.Filter
	if f != nil {
		// Refusals are few next to acceptances, so they are what is kept.
		opts.Filter = func(n engine.NodeView) bool {
			if f(n) {
				return true
			}
			if refused == nil {
				refused = map[string]bool{}
			}
			refused[n.Node.Name] = true
			return false
		}
	}
	ours, oursT, byFit := place(snap, job, opts, k)
	if f != nil && ours.Verdict == outcome.Placed && base.Verdict == outcome.Placed {
		// The walk may not have read base's nodes (a job no node holds
		// reads one leaf or pod's): the filter is asked of them now.
		if refused == nil {
			refused = map[string]bool{}
		}
		for _, g := range base.GPUs {
			if _, asked := refused[g.Node]; !asked {
				refused[g.Node] = !allowed(snap, job.Job.GPUModel, g.Node, f)
			}
		}
	}
	return notWorse(snap, job, opts, ours, oursT, byFit, base, refused)
}

// allowed asks filter of one node, as the candidate walk would.
func allowed(snap *store.Snapshot, model, name string, filter func(engine.NodeView) bool) bool {
	node, free, ok := snap.NodeFree(name, model)
	return ok && filter(engine.ViewOf(*node, free))
}
