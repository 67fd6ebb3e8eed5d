package random

import (
	"maps"
	"slices"
	"testing"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/internal/fixtures"
	"github.com/toposched/toposched/internal/placer/outcome"
	"github.com/toposched/toposched/internal/store"
)

func TestPlace(t *testing.T) {
	var nodes []fixtures.Node
	for _, n := range []string{"a", "b", "c", "d"} {
		nodes = append(nodes, fixtures.Node{Event: fixtures.PlainNode(n, "", 8), Held: []int{0}})
	}
	snap := fixtures.MustStore(t, nodes, nil).Snapshot()
	job := func(id string, n, gpn int) events.JobAnalyzed {
		return events.JobAnalyzed{Job: events.JobSubmitted{JobID: id, GPUs: n, GPUsPerNode: gpn}}
	}
	seen := map[string]bool{}
	for _, id := range []string{"j1", "j2", "j3", "j4", "j5", "j6", "j7", "j8"} {
		r := Place(snap, job(id, 3, 3), nil, 1)
		if r.Verdict != outcome.Placed || len(r.GPUs) != 3 {
			t.Fatalf("%s: %v %v", id, r.Verdict, r.GPUs)
		}
		again := Place(snap, job(id, 3, 3), nil, 1)
		if !slices.Equal(r.GPUs, again.GPUs) {
			t.Errorf("%s: %v then %v: the same job and state must get the same GPUs", id, r.GPUs, again.GPUs)
		}
		keys := map[store.GPUKey]bool{}
		for _, g := range r.GPUs {
			if g.Node != r.GPUs[0].Node || g.Index == 0 || keys[g] {
				t.Errorf("%s: %v: want three distinct free GPUs of one node", id, r.GPUs)
			}
			keys[g] = true
		}
		seen[r.GPUs[0].String()+r.GPUs[1].String()+r.GPUs[2].String()] = true
	}
	if len(seen) < 4 {
		t.Errorf("8 jobs drew only %d distinct placements: %v", len(seen), slices.Collect(maps.Keys(seen)))
	}
	if r := Place(snap, job("big", 29, 0), nil, 1); r.Verdict != outcome.Wait {
		t.Errorf("29 GPUs with 28 free: %v, want wait", r.Verdict)
	}
	if r := Place(snap, job("huge", 33, 0), nil, 1); r.Verdict != outcome.Never {
		t.Errorf("33 GPUs on a 32-GPU cluster: %v, want never", r.Verdict)
	}
}
