package placer

import (
	"fmt"
	"slices"
	"testing"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/internal/fixtures"
	"github.com/toposched/toposched/internal/placer/engine"
	"github.com/toposched/toposched/internal/placer/outcome"
)

// TestPeersKeepGroupsWhenDenied: a peer whose placement a policy denies
// asks once more with each tensor-parallel group on one node (one pod a
// group) and starts the job there if the policy allows it; else the job
// waits on the policy's reasons, as before.
func TestPeersKeepGroupsWhenDenied(t *testing.T) {
	t.Parallel()
	// a: 3 free, b: 8 free, c: 2 free; d: 3 free, e: 3 free.
	st := fixtures.MustStore(t, []fixtures.Node{
		{Event: fixtures.PlainNode("a", "", 8), Held: []int{0, 1, 2, 3, 4}},
		{Event: fixtures.PlainNode("b", "", 8)},
		{Event: fixtures.PlainNode("c", "", 8), Held: []int{0, 1, 2, 3, 4, 5}},
	}, nil)
	full := fixtures.MustStore(t, []fixtures.Node{
		{Event: fixtures.PlainNode("d", "", 8), Held: []int{0, 1, 2, 3, 4}},
		{Event: fixtures.PlainNode("e", "", 8), Held: []int{0, 1, 2, 3, 4}},
	}, nil)
	// tpSplit denies a placement with a group of tp consecutive ranks on
	// more than one node, as the shipped tp_nvlink policy does where a node
	// is one NVLink domain.
	tpSplit := func(tp int) func(engine.Candidate) engine.Judgement {
		return func(c engine.Candidate) engine.Judgement {
			for i := 0; i+tp <= len(c.GPUs); i += tp {
				for _, g := range c.GPUs[i : i+tp] {
					if g.Node != c.GPUs[i].Node {
						return engine.Judgement{Deny: true, Reasons: []events.Reason{{Code: "tp_outside_nvlink", Policy: "test",
							Message: fmt.Sprintf("TP group %d spans nodes", i/tp)}}}
					}
				}
			}
			return engine.Judgement{}
		}
	}
	allow := func(engine.Candidate) engine.Judgement { return engine.Judgement{} }
	always := func(engine.Candidate) engine.Judgement {
		return engine.Judgement{Deny: true, Reasons: []events.Reason{{Code: "never", Policy: "test", Message: "no"}}}
	}
	tests := []struct {
		name     string
		strategy string
		full     bool
		job      events.JobAnalyzed
		judge    func(engine.Candidate) engine.Judgement
		verdict  outcome.Verdict
		want     []string // GPUs, or the reasons' codes when not placed
	}{
		{"blind: first fit splits a group, by groups it starts on b", StrategyBlind, false, fixtures.SyntheticJob("j", 8, 4, 1), tpSplit(4),
			outcome.Placed, []string{"b/0", "b/1", "b/2", "b/3", "b/4", "b/5", "b/6", "b/7"}},
		{"binpack: the fullest nodes split a group, by groups b", StrategyBinpack, false, fixtures.SyntheticJob("j", 8, 4, 1), tpSplit(4),
			outcome.Placed, []string{"b/0", "b/1", "b/2", "b/3", "b/4", "b/5", "b/6", "b/7"}},
		{"binpack: groups of 2 fill the fuller nodes first", StrategyBinpack, false, fixtures.SyntheticJob("j", 8, 2, 1), tpSplit(2),
			outcome.Placed, []string{"c/6", "c/7", "a/5", "a/6", "b/0", "b/1", "b/2", "b/3"}},
		{"blind: allowed as it is, unchanged", StrategyBlind, false, fixtures.SyntheticJob("j", 8, 4, 1), allow,
			outcome.Placed, []string{"a/5", "a/6", "a/7", "b/0", "b/1", "b/2", "b/3", "b/4"}},
		{"no groups to keep: waits on the policy", StrategyBlind, false, fixtures.SyntheticJob("j", 8, 1, 1), always,
			outcome.Wait, []string{"never"}},
		{"by groups denied too: waits on the policy", StrategyBlind, false, fixtures.SyntheticJob("j", 8, 4, 1), always,
			outcome.Wait, []string{"never"}},
		{"no node holds a whole group: waits on the policy", StrategyBinpack, true, fixtures.SyntheticJob("j", 4, 4, 1), tpSplit(4),
			outcome.Wait, []string{"tp_outside_nvlink"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, err := Lookup(tc.strategy, true)
			if err != nil {
				t.Fatal(err)
			}
			snap := st.Snapshot()
			if tc.full {
				snap = full.Snapshot()
			}
			x := &engine.Explain{}
			r, _, err := s.Place(engine.Request{Snap: snap, Job: tc.job, Options: engine.Options{Judge: tc.judge, Explain: x}})
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			if r.Verdict == outcome.Placed {
				for _, g := range r.GPUs {
					got = append(got, g.String())
				}
			} else {
				for _, re := range r.Reasons {
					got = append(got, re.Code)
				}
			}
			if r.Verdict != tc.verdict || !slices.Equal(got, tc.want) {
				t.Errorf("%v %v, want %v %v", r.Verdict, got, tc.verdict, tc.want)
			}
			// The decision says when it is the second placement.
			second := r.Verdict == outcome.Placed && tc.name != "blind: allowed as it is, unchanged"
			warned := slices.ContainsFunc(x.Judgement.Warnings, func(w events.Reason) bool { return w.Code == CodePlacedByGroups })
			if warned != second || x.PolicyDenied != (r.Verdict == outcome.Wait) {
				t.Errorf("warned %v (%v), policy denied %v; want warned %v", warned, x.Judgement.Warnings, x.PolicyDenied, second)
			}
		})
	}
}
