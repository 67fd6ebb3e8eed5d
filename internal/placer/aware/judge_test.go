package aware

import (
	"fmt"
	"testing"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/internal/fixtures"
	"github.com/toposched/toposched/internal/placer/engine"
	"github.com/toposched/toposched/internal/placer/outcome"
	"github.com/toposched/toposched/internal/store"
)

func TestJudge(t *testing.T) {
	t.Parallel()
	var specs []spec
	for i := range 4 {
		sp := spec{name: fmt.Sprintf("n%d", i), ev: dgx(t, "", "dgx-a100")}
		sp.held = []int{0, 1, 2, 3, 4, 5, 6, 7}[:2*i] // n0 empty ... n3 with 2 free
		specs = append(specs, sp)
	}
	snap := build(t, specs...).Snapshot()
	deny := func(node string) func(engine.Candidate) engine.Judgement {
		return func(c engine.Candidate) engine.Judgement {
			for _, g := range c.GPUs {
				if g.Node == node {
					return engine.Judgement{Deny: true, Reasons: []events.Reason{{Code: "no_" + node, Message: "not on " + node, Policy: "test"}}}
				}
			}
			return engine.Judgement{}
		}
	}
	nodeOf := func(r outcome.Result) string {
		if r.Verdict != outcome.Placed {
			return fmt.Sprintf("(%s %v)", r.Verdict, r.Reasons)
		}
		return r.GPUs[0].Node
	}
	tests := []struct {
		name     string
		gpus     int
		judge    func(engine.Candidate) engine.Judgement
		want     string
		outcomes []string
	}{
		{name: "no judge: best fit", gpus: 2, want: "n3"},
		{name: "allowed favourite: one judgement", gpus: 2, judge: deny("n0"), want: "n3", outcomes: []string{"chosen"}},
		{name: "denied favourite: the next", gpus: 2, judge: deny("n3"), want: "n2", outcomes: []string{"chosen", "costlier", "costlier", "denied"}},
		{name: "score moves the choice", gpus: 4, judge: func(c engine.Candidate) engine.Judgement {
			if c.GPUs[0].Node == "n2" {
				return engine.Judgement{Score: 5, Warnings: []events.Reason{{Code: "w", Message: "penalised"}}}
			}
			return engine.Judgement{}
		}, want: "n1", outcomes: []string{"chosen", "costlier", "costlier"}},
		{name: "every candidate denied", gpus: 2, judge: func(engine.Candidate) engine.Judgement {
			return engine.Judgement{Deny: true, Reasons: []events.Reason{{Code: "never", Message: "no", Policy: "test"}}}
		}, want: "(wait [{never no  test}])"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			x := &engine.Explain{}
			r := Place(engine.Request{Snap: snap, Job: fixtures.SyntheticJob("j", tt.gpus, tt.gpus, 1), Options: engine.Options{Judge: tt.judge, Explain: x}})
			if got := nodeOf(r); got != tt.want {
				t.Fatalf("placed on %s, want %s", got, tt.want)
			}
			if x.Explanation.NodesConsidered != 4 {
				t.Errorf("nodes considered %d, want 4", x.Explanation.NodesConsidered)
			}
			if len(x.Explanation.Levels) == 0 {
				t.Error("no levels explained")
			}
			if tt.outcomes != nil {
				var got []string
				for _, c := range x.Explanation.Candidates {
					got = append(got, c.Outcome)
				}
				if fmt.Sprint(got) != fmt.Sprint(tt.outcomes) {
					t.Errorf("outcomes %v, want %v (%+v)", got, tt.outcomes, x.Explanation.Candidates)
				}
			}
			if r.Verdict == outcome.Wait && !x.PolicyDenied {
				t.Error("every candidate denied, but PolicyDenied is not set")
			}
		})
	}
}

// A judge that denies what local search makes of the favourite keeps the
// favourite as it was before the search.
func TestJudgeAfterLocalSearch(t *testing.T) {
	t.Parallel()
	snap := build(t, spec{name: "n0", ev: dgx(t, "", "dgx-a100")}).Snapshot()
	job := fixtures.SyntheticJob("j", 8, 2, 1)
	var first []store.GPUKey
	r := Place(engine.Request{Snap: snap, Job: job, Options: engine.Options{Judge: func(c engine.Candidate) engine.Judgement {
		if first == nil {
			first = c.GPUs
			return engine.Judgement{}
		}
		return engine.Judgement{Deny: true}
	}}})

	if r.Verdict != outcome.Placed || fmt.Sprint(r.GPUs) != fmt.Sprint(first) {
		t.Fatalf("placed %v, want the favourite as judged %v", r.GPUs, first)
	}
}
