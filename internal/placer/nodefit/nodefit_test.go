package nodefit

import (
	"slices"
	"testing"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/internal/fixtures"
	"github.com/toposched/toposched/internal/placer/engine"
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
		place   func(*store.Snapshot, events.JobAnalyzed, engine.Keep, int) outcome.Result
		keep    engine.Keep
		n, gpn  int
		unit    int
		verdict outcome.Verdict
		want    []string
	}{
		{"binpack: the fullest node that fits", Binpack, nil, 2, 2, 1, outcome.Placed, []string{"a/6", "a/7"}},
		{"binpack: skips nodes too full", Binpack, nil, 3, 3, 1, outcome.Placed, []string{"c/4", "c/5", "c/6"}},
		{"binpack: across nodes, fullest first", Binpack, nil, 7, 0, 1, outcome.Placed, []string{"a/6", "a/7", "c/4", "c/5", "c/6", "c/7", "b/0"}},
		{"spread: the emptiest node", Spread, nil, 2, 2, 1, outcome.Placed, []string{"b/0", "b/1"}},
		{"spread: across nodes, emptiest first", Spread, nil, 10, 0, 1, outcome.Placed, []string{"b/0", "b/1", "b/2", "b/3", "b/4", "b/5", "b/6", "b/7", "c/4", "c/5"}},
		{"binpack waits with blind", Binpack, nil, 9, 9, 1, outcome.Never, nil},
		{"spread waits with blind", Spread, nil, 15, 0, 1, outcome.Wait, nil},
		{"binpack: the fullest node kept", Binpack, refuse("a"), 2, 2, 1, outcome.Placed, []string{"c/4", "c/5"}},
		{"spread: the emptiest node kept", Spread, refuse("b"), 2, 2, 1, outcome.Placed, []string{"c/4", "c/5"}},
		{"binpack: across the kept nodes", Binpack, refuse("c"), 4, 0, 1, outcome.Placed, []string{"a/6", "a/7", "b/0", "b/1"}},
		{"spread waits for the kept nodes", Spread, refuse("b"), 7, 0, 1, outcome.Wait, nil},
		{"binpack waits for kept nodes with room", Binpack, refuse("b"), 5, 5, 1, outcome.Wait, nil},
		// Groups of 4 on one node each: a's 2 free GPUs hold none.
		{"binpack by groups: the fullest nodes with a whole group", Binpack, nil, 8, 0, 4, outcome.Placed, []string{"c/4", "c/5", "c/6", "c/7", "b/0", "b/1", "b/2", "b/3"}},
		{"spread by groups: the emptiest first", Spread, nil, 4, 0, 2, outcome.Placed, []string{"b/0", "b/1", "b/2", "b/3"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := tc.place(st.Snapshot(), job(tc.n, tc.gpn), tc.keep, tc.unit)
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

// refuse keeps every node but the one named.
func refuse(name string) engine.Keep {
	return func(n *store.Node, _ []store.FreeGPU) bool { return n.Name != name }
}
