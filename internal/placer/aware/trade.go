package aware

// The fit trade, part of stage 2 (single.go's bestFitWithin): whether a
// tighter fit on a slower box is worth the fast shape it keeps whole, as
// the forecast of demand (Options.Demand) says.
//
// Flow (place.go): walk → single-node exact choice → multi-node →
// judge → local search; see internal/placer/README.md.

import (
	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/internal/demand"
	"github.com/toposched/toposched/internal/store"
)

// fitTrade decides between the fastest one-node candidate (out[fav]) and
// the tighter fit bestFitWithin found (out[best]), and returns the index
// taken. Without a forecast, or when the tighter fit is as fast (within
// 0.5%), the tighter fit is taken as before: it costs the job nothing
// then. Otherwise it is taken only where the forecast says the fastest
// node's shape (a job of MinGPUs or more, which its free GPUs hold now and
// would not once the job took its share; where the job takes the whole
// node, a job as large as this one, which would face the same choice) is
// likely to be needed before
// the job ends: more jobs needing it waiting or arriving within the job's
// expected run than there are shapes like it, free or freed by the
// running jobs due to end. Before any job has ended no run time is known,
// and the trade is made as without a forecast. Explain records the
// weighing.
func (p *placer) fitTrade(out []*cand, picks []inNode, fav, best int) int {
	f := p.opts.Demand
	tFav, tBest := p.e.comp+p.score(out[fav]), p.e.comp+p.score(out[best])
	if f == nil || !(tBest > tFav*(1+0.005)) {
		return best
	}
	node := picks[fav].c
	model := node.free[0].Model
	free := len(node.free)
	tr := &events.FitTrade{Node: store.DomainNode + ":" + node.node.Name, Tighter: store.DomainNode + ":" + picks[best].c.node.Name,
		NodeFree: free, MinGPUs: max(free-p.n+1, p.n), StepSeconds: tFav, TighterStepSeconds: tBest, Made: true}
	defer p.explainTrade(tr)
	d, ok := f.RunTime(p.n)
	if !ok {
		return best
	}
	counts := p.e.res.snap.NodeCounts(model).Free
	for c := free; c < len(counts); c++ {
		tr.Spare += counts[c]
	}
	tr.Spare-- // the node itself
	need := f.Need(demand.Shape{Model: model, MinGPUs: tr.MinGPUs, Spare: tr.Spare, Within: d, Now: p.opts.Now})
	h := d.Seconds()
	tr.HorizonSeconds, tr.Queued, tr.ArrivalsPerHour, tr.Ending = h, need.Queued, need.Rate*3600, need.Ending
	tr.Probability = need.Probability
	tr.JobCostSeconds = h * (tBest/tFav - 1)
	tr.OthersCostSeconds = need.Shortfall * h / 2
	if need.Probability >= demand.Likely {
		return best
	}
	tr.Made = false
	return fav
}

func (p *placer) explainTrade(tr *events.FitTrade) {
	if x := p.opts.Explain; x != nil {
		x.Explanation.FitTrade = tr
	}
}
