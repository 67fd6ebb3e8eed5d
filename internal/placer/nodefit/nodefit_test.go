package nodefit

import (
	"slices"
	"testing"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/internal/fixtures"
	"github.com/toposched/toposched/internal/placer/outcome"
	"github.com/toposched/toposched/internal/store"
)

func TestBinpackAndSpread(t *testing.T) {
	// a: 8 GPUs, 6 held (2 free); b: empty (8 free); c: 4 held (4 free).
	st := fixtures.MustStore(t, []fixtures.Node{
		{Event: fixtures.PlainNode("a", "", 8), Held: []int{0, 1, 2, 3, 4, 5}},
		{Event: fixtures.PlainNode("b", "", 8)},
		{Event: fixtures.PlainNode("c", "", 8), Held: []int{0, 1, 2, 3}},
	}, nil)
	job := func(n, gpn int) events.JobAnalyzed {
		return events.JobAnalyzed{Job: events.JobSubmitted{JobID: "j", GPUs: n, GPUsPerNode: gpn}}
	}
	for _, tc := range []struct {
		name    string
		place   func(*store.Snapshot, events.JobAnalyzed) outcome.Result
		n, gpn  int
		verdict outcome.Verdict
		want    []string
	}{
		{"binpack: the fullest node that fits", Binpack, 2, 2, outcome.Placed, []string{"a/6", "a/7"}},
		{"binpack: skips nodes too full", Binpack, 3, 3, outcome.Placed, []string{"c/4", "c/5", "c/6"}},
		{"binpack: across nodes, fullest first", Binpack, 7, 0, outcome.Placed, []string{"a/6", "a/7", "c/4", "c/5", "c/6", "c/7", "b/0"}},
		{"spread: the emptiest node", Spread, 2, 2, outcome.Placed, []string{"b/0", "b/1"}},
		{"spread: across nodes, emptiest first", Spread, 10, 0, outcome.Placed, []string{"b/0", "b/1", "b/2", "b/3", "b/4", "b/5", "b/6", "b/7", "c/4", "c/5"}},
		{"binpack waits with blind", Binpack, 9, 9, outcome.Never, nil},
		{"spread waits with blind", Spread, 15, 0, outcome.Wait, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := tc.place(st.Snapshot(), job(tc.n, tc.gpn))
			if r.Verdict != tc.verdict {
				t.Fatalf("verdict %v (%v), want %v", r.Verdict, r.Reasons, tc.verdict)
			}
			var got []string
			for _, g := range r.GPUs {
				got = append(got, g.String())
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("GPUs %v, want %v", got, tc.want)
			}
		})
	}
}
