package aware

import (
	"fmt"
	"testing"
	"time"

	"github.com/toposched/toposched/internal/demand"
	"github.com/toposched/toposched/internal/placer/engine"
	"github.com/toposched/toposched/internal/placer/outcome"
	"github.com/toposched/toposched/internal/store"
)

// TestFitTrade is TestBestFitWithin's busy state, where a 2-GPU
// data-parallel job's tighter fit (the RTX 4090 box's free pair) is 9%
// slower than the fastest, the only H100 node, whole: with a forecast of
// demand the pair is taken only where a job of 7 or more GPUs is likely to
// need the H100 before the 2-GPU job ends.
func TestFitTrade(t *testing.T) {
	t.Parallel()
	snap := fitState(t, true)
	job := shapedJob(t, 2, 1, 1300e6, 24, 2048, true)
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	hours := func(h float64) time.Time { return t0.Add(time.Duration(h * float64(time.Hour))) }
	// learned: 2-GPU jobs that ran an hour each, and whole-node jobs
	// arriving every `every` hours for two days (each withdrawn at once,
	// so none waits).
	learned := func(every float64) *demand.Forecast {
		f := demand.New(demand.Config{})
		for i := range 10 {
			id := fmt.Sprint("small-", i)
			f.Started(id, 2, "RTX-4090", hours(0))
			f.Ended(id, hours(1))
		}
		for i := 0; float64(i)*every < 48; i++ {
			id := fmt.Sprint("whole-", i)
			f.Submitted(id, 8, "", hours(float64(i)*every))
			f.Ended(id, hours(float64(i)*every))
		}
		return f
	}
	for _, tc := range []struct {
		name   string
		demand func() *demand.Forecast
		want   string
		made   bool
		known  bool // a run time was learned
	}{
		{"no run time learned yet: the trade as without a forecast", func() *demand.Forecast { return demand.New(demand.Config{}) }, "rtx4090-sw-001", true, false},
		{"whole-node jobs rare (one in 8 h): the faster placement", func() *demand.Forecast { return learned(8) }, "h100-001", false, true},
		{"whole-node jobs frequent (two an hour): the H100 kept whole", func() *demand.Forecast { return learned(0.5) }, "rtx4090-sw-001", true, true},
		{"one whole-node job waiting: the H100 kept whole", func() *demand.Forecast {
			f := learned(8)
			f.Submitted("waiting", 8, "", hours(47.5))
			return f
		}, "rtx4090-sw-001", true, true},
		{"one waiting, pinned to another model: the faster placement", func() *demand.Forecast {
			f := learned(8)
			f.Submitted("waiting", 8, "A100-SXM4-80GB", hours(47.5))
			return f
		}, "h100-001", false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			x := &engine.Explain{}
			r := Place(engine.Request{Snap: snap, Job: job, Options: engine.Options{Demand: tc.demand(), Now: hours(48), Explain: x}})
			if r.Verdict != outcome.Placed {
				t.Fatalf("verdict %v: %v", r.Verdict, r.Reasons)
			}
			if got := r.GPUs[0].Node; got != tc.want {
				t.Errorf("placed on %v, want node %s", r.GPUs, tc.want)
			}
			tr := x.Explanation.FitTrade
			if tr == nil {
				t.Fatal("no fit trade explained")
			}
			t.Logf("%+v", *tr)
			if tr.Made != tc.made || (tr.HorizonSeconds > 0) != tc.known {
				t.Errorf("trade made %v with horizon %v s, want made %v, horizon known %v", tr.Made, tr.HorizonSeconds, tc.made, tc.known)
			}
			if tr.Node != store.DomainNode+":h100-001" || tr.Tighter != store.DomainNode+":rtx4090-sw-001" || tr.MinGPUs != 7 {
				t.Errorf("weighed %s against %s for %d+ GPUs, want node:h100-001, node:rtx4090-sw-001, 7", tr.Node, tr.Tighter, tr.MinGPUs)
			}
			if tc.known && !(tr.JobCostSeconds > 0 && tr.TighterStepSeconds > tr.StepSeconds) {
				t.Errorf("the job's cost of the trade is %v s (steps %v, %v)", tr.JobCostSeconds, tr.StepSeconds, tr.TighterStepSeconds)
			}
		})
	}
	// Without a forecast nothing is weighed: the tighter fit, unexplained.
	x := &engine.Explain{}
	r := Place(engine.Request{Snap: snap, Job: job, Options: engine.Options{Explain: x}})
	if r.GPUs[0].Node != "rtx4090-sw-001" || x.Explanation.FitTrade != nil {
		t.Errorf("without a forecast: placed on %v, trade %+v", r.GPUs, x.Explanation.FitTrade)
	}
}
