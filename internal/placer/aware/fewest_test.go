package aware

import (
	"fmt"
	"slices"
	"testing"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/internal/fixtures"
	"github.com/toposched/toposched/internal/pattern"
	"github.com/toposched/toposched/internal/placer/outcome"
	"github.com/toposched/toposched/internal/store"
	"github.com/toposched/toposched/internal/topology"
)

// spreadJob is a 16-GPU job over nodes (no gpus_per_node) of GPT 6.7B in
// bf16, sequence 2048, global batch 8·dp: tp 8 as the replay shapes one
// (sim/replay's Shape), or data parallel; without the model its step
// compute time is unknown.
func spreadJob(t testing.TB, tp int, withModel bool) events.JobAnalyzed {
	t.Helper()
	dp := 16 / tp
	sub := events.JobSubmitted{JobID: fmt.Sprintf("j16-tp%d", tp), GPUs: 16, Strategy: events.StrategyMegatron,
		Parallelism: &events.Parallelism{TP: tp, PP: 1, DP: dp}}
	if withModel {
		sub.Model = &events.Model{Parameters: 6700e6, Layers: 32, HiddenSize: 4096, Heads: 32, SeqLen: 2048,
			MicroBatchSize: 1, GlobalBatchSize: 8 * dp, Dtype: events.DtypeBF16}
	}
	job, reasons := pattern.Analyze(sub)
	if len(reasons) > 0 {
		t.Fatalf("analysis: %v", reasons)
	}
	return job
}

// leftovers is a busy cluster of 16 A100 nodes in two leaves of eight:
// l0's nodes have two free GPUs each (16, the tightest leaf that holds a
// 16-GPU job), l1's first three 7, 7 and 3, the rest full (33 of 128
// free).
func leftovers(t testing.TB) (*store.Snapshot, *topology.Fabric) {
	t.Helper()
	a100 := fitNodes(t)["a100-001"]
	var nodes []fixtures.Node
	var names []string
	for i := range 16 {
		name := fmt.Sprintf("a100-%02d", i)
		held := []int{2, 3, 4, 5, 6, 7}
		switch {
		case i == 8, i == 9:
			held = []int{7}
		case i == 10:
			held = []int{3, 4, 5, 6, 7}
		case i > 10:
			held = []int{0, 1, 2, 3, 4, 5, 6, 7}
		}
		nodes = append(nodes, fixtures.Node{Event: a100, Name: name, Held: held})
		names = append(names, name)
	}
	fabric := fixtures.MustFabric(t, fixtures.LeafSpine("fit", names, 8))
	return fixtures.MustStore(t, nodes, fabric).Snapshot(), fabric
}

// TestFewestWithin: a 16-GPU job no node holds, on the leftovers of a
// busy cluster. Without the rule it takes l0's eight nodes (the tightest
// leaf), each then held for the job's life. With its step compute time
// known it takes the fewest nodes whose step is within the tolerance of
// the fastest spread: a data-parallel job three of l1's, which is faster
// too; a tensor-parallel one keeps l0's eight, l1's three being 21% slower
// (their NICs carry both TP groups), unless the tolerance is 25%. Without
// a compute time, or with the rule off, nothing changes.
func TestFewestWithin(t *testing.T) {
	t.Parallel()
	snap, fabric := leftovers(t)
	for _, tc := range []struct {
		name      string
		tp        int
		withModel bool
		tol       float64
		nodes     int // 0: as without the rule
	}{
		{"data parallel: three nodes, faster", 1, true, 0, 3},
		{"tensor parallel: three nodes are 21% slower, eight kept", 8, true, 0, 8},
		{"tensor parallel with a 25% tolerance: three nodes", 8, true, 0.25, 3},
		{"no compute time: as without the rule", 1, false, 0, 0},
		{"rule off: as before", 1, true, -1, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			job := spreadJob(t, tc.tp, tc.withModel)
			r := Place(snap, job, Options{Fabric: fabric, Budget: -1, FitTolerance: tc.tol})
			before := Place(snap, job, Options{Fabric: fabric, Budget: -1, FitTolerance: -1})
			if r.Verdict != outcome.Placed || before.Verdict != outcome.Placed {
				t.Fatalf("verdicts %v %v, %v %v", r.Verdict, r.Reasons, before.Verdict, before.Reasons)
			}
			if nodesOf(before.GPUs) != 8 {
				t.Fatalf("without the rule on %d nodes, want l0's 8: %v", nodesOf(before.GPUs), before.GPUs)
			}
			if tc.nodes == 0 {
				if !slices.Equal(r.GPUs, before.GPUs) {
					t.Errorf("placed on %v; without the rule %v", r.GPUs, before.GPUs)
				}
				return
			}
			if got := nodesOf(r.GPUs); got != tc.nodes {
				t.Errorf("on %d nodes (%v), want %d", got, r.GPUs, tc.nodes)
			}
			tol := tc.tol
			if tol == 0 {
				tol = DefaultFitTolerance
			}
			if s, b := stepOf(t, snap, job, r.GPUs), stepOf(t, snap, job, before.GPUs); s > b*(1+tol) {
				t.Errorf("step %.4f s against %.4f s without the rule: past the tolerance", s, b)
			}
		})
	}
}
