package client

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/toposched/toposched/events"
)

// hist builds a history from events one second apart and settles it.
func hist(jobID string, vs ...any) *JobHistory {
	h := &JobHistory{JobID: jobID}
	t0 := time.Date(2025, 1, 2, 10, 0, 0, 0, time.UTC)
	for i, v := range vs {
		e := HistoryEvent{Time: t0.Add(time.Duration(i) * time.Second), Data: v}
		if err, ok := v.(error); ok {
			e.Name, e.Data, e.Error = events.NamePlacementDecided, nil, err.Error()
		} else if he, ok := v.(HistoryEvent); ok {
			he.Time = e.Time // an event as History reads it
			e = he
			if e.Data != nil {
				e.Name, _ = events.NameOf(e.Data)
			}
		} else {
			e.Name, _ = events.NameOf(v)
		}
		e.Stored = e.Time
		h.Events = append(h.Events, e)
	}
	h.settle()
	return h
}

func intp(i int) *int { return &i }

// fullDecision has every optional part: NUMA and NICs, the prediction and
// baseline with a group only one of them has, warnings and an explanation.
func fullDecision() *events.PlacementDecided {
	d := decision("llm", 2, 4)
	for i := range d.Ranks {
		d.Ranks[i].NUMA = intp(i / 2)
		d.Ranks[i].NIC = fmt.Sprintf("mlx5_%d", i%4)
		d.Ranks[i].UUID = fmt.Sprintf("GPU-%04d", i)
	}
	d.Ranks[7].NUMA, d.Ranks[7].NIC = nil, ""
	d.Prediction = &events.Prediction{Strategy: "topology-aware", CommSecondsPerStep: 0.0123, CommFraction: 0.0581, SpeedUp: 7.5,
		Groups: []events.GroupPrediction{{Name: "tp", Algorithm: "ring", SecondsPerStep: 0.004}, {Name: "dp", Algorithm: "tree", SecondsPerStep: 0.0083}}}
	d.Baseline = &events.Prediction{Strategy: "blind", CommSecondsPerStep: 1.75, CommFraction: 0.8974, SpeedUp: 0.8,
		Groups: []events.GroupPrediction{{Name: "dp", Algorithm: "ring", SecondsPerStep: 1.2}, {Name: "pp", Algorithm: "p2p", SecondsPerStep: 0.55}}}
	d.Warnings = []events.Reason{
		{Code: "leaf_span", Policy: "toposched.span", Message: "spans 2 leaves; jobs of 8 GPUs should stay on 1"},
		{Code: "no_policy_code", Message: "a warning without a policy"},
	}
	d.Explanation = &events.Explanation{
		PolicyRevision:  "r42",
		NodesConsidered: 12,
		NodesDenied: []events.NodeDenial{
			{Policy: "toposched.tenancy", Code: "tenant_mismatch", Example: "node dgx-005 belongs to tenant vision", Nodes: 4},
			{Policy: "toposched.model", Code: "gpu_model", Example: "node l40s-001 has L40S", Nodes: 2},
		},
		NodesReserved: 2,
		Levels:        []events.LevelCount{{Level: "node", Domains: 6, Fitting: 0}, {Level: "leaf", Domains: 3, Fitting: 2}},
		Candidates: []events.CandidateScore{
			{Domain: "leaf/l1", Nodes: 2, Leaves: 1, CommSecondsPerStep: 0.0123, Cost: 1, Outcome: events.OutcomeChosen},
			{Domain: "leaf/l2", Nodes: 2, Leaves: 1, CommSecondsPerStep: 0.0125, Score: 0.5, Cost: 1.516, Outcome: events.OutcomeCostlier},
			{Domain: "cluster", Nodes: 2, Leaves: 2, CommSecondsPerStep: 1.75, Cost: 142.276, Outcome: events.OutcomeDenied,
				Reasons: []events.Reason{{Code: "leaf_span", Policy: "toposched.span", Message: "too wide"}, {Code: "x", Message: "y"}}},
		},
	}
	return d
}

// largeDecision has more nodes, ranks and candidates than are printed.
func largeDecision() *events.PlacementDecided {
	d := decision("big", 40, 8)
	d.Prediction = &events.Prediction{Strategy: "topology-aware", CommSecondsPerStep: 2.5}
	d.Baseline = &events.Prediction{Strategy: "blind", CommSecondsPerStep: 2.5}
	for i := range 40 {
		g := events.GroupPrediction{Name: fmt.Sprintf("dp%d", i), Algorithm: "ring", SecondsPerStep: 2.5}
		d.Prediction.Groups = append(d.Prediction.Groups, g)
		d.Baseline.Groups = append(d.Baseline.Groups, g)
	}
	d.Explanation = &events.Explanation{NodesConsidered: 64}
	for i := range 40 {
		d.Explanation.Candidates = append(d.Explanation.Candidates, events.CandidateScore{
			Domain: fmt.Sprintf("pod/p%d", i), Nodes: 40, Leaves: 5, CommSecondsPerStep: 2.5 + float64(i)/100,
			Cost: 1 + float64(i)/250, Outcome: events.OutcomeCostlier})
	}
	d.Explanation.Candidates[0].Outcome = events.OutcomeChosen
	return d
}

func TestWriteExplainGolden(t *testing.T) {
	t.Parallel()
	job := &events.JobSubmitted{JobID: "llm", GPUs: 8, GPUsPerNode: 4, GPUModel: "A100-SXM4-80GB", Tenant: "research", Priority: 10,
		Strategy: events.StrategyMegatron, Parallelism: &events.Parallelism{TP: 4, DP: 2}}
	analyzed := &events.JobAnalyzed{Job: *job, Parallelism: events.Parallelism{TP: 4, DP: 2, PP: 1, CP: 1, EP: 1},
		BytesPerStepPerRank: 3 << 30, Warnings: []string{"no model: volumes unknown"}}
	minimal := decision("small", 1, 2)
	noBaseline := fullDecision()
	noBaseline.Baseline, noBaseline.Warnings, noBaseline.Explanation = nil, nil, nil
	noBaseline.Prediction.CommFraction, noBaseline.Prediction.SpeedUp = 0, 0
	byModel := decision("by-model", 1, 2)
	byModel.Prediction = &events.Prediction{Strategy: "topology-aware", CommSecondsPerStep: 0.03, CommFraction: 0.0638, SpeedUp: 1.9,
		ComputeSecondsPerStep: 0.44, GPUModel: "H100-SXM5-80GB"}
	byModel.Baseline = &events.Prediction{Strategy: "blind", CommSecondsPerStep: 0.08, CommFraction: 0.0145, SpeedUp: 2.0,
		ComputeSecondsPerStep: 5.45, GPUModel: "T4"}
	// The online compute calibration measured the T4 slower than the
	// speed table says.
	corrected := decision("corrected", 1, 2)
	corrected.Prediction = byModel.Prediction
	corrected.Baseline = &events.Prediction{Strategy: "blind", CommSecondsPerStep: 0.08, CommFraction: 0.0124, SpeedUp: 2.0,
		ComputeSecondsPerStep: 6.43, GPUModel: "T4", ComputeCorrection: &events.ComputeCorrection{Factor: 1.18, Samples: 12, Set: "online"}}
	worse := decision("worse", 1, 2)
	worse.Prediction = &events.Prediction{Strategy: "blind", CommSecondsPerStep: 0.2}
	worse.Baseline = &events.Prediction{Strategy: "blind", CommSecondsPerStep: 0.1}

	traded := decision("traded", 1, 2)
	traded.Explanation = &events.Explanation{NodesConsidered: 40, FitTrade: &events.FitTrade{Made: true,
		Node: "node:h100-002", Tighter: "node:t4-007", NodeFree: 8, MinGPUs: 7, StepSeconds: 1.0, TighterStepSeconds: 1.09,
		HorizonSeconds: 5400, Queued: 1, ArrivalsPerHour: 0.8, Spare: 0, Ending: 1, Probability: 0.7,
		JobCostSeconds: 486, OthersCostSeconds: 1890}}
	declined := decision("declined", 1, 2)
	declined.Explanation = &events.Explanation{NodesConsidered: 40, FitTrade: &events.FitTrade{
		Node: "node:h100-002", Tighter: "node:t4-007", NodeFree: 8, MinGPUs: 7, StepSeconds: 1.0, TighterStepSeconds: 1.09,
		HorizonSeconds: 5400, ArrivalsPerHour: 0.05, Spare: 2, Probability: 0.0003,
		JobCostSeconds: 486, OthersCostSeconds: 0.5}}
	backfilled := decision("backfilled", 1, 2)
	backfilled.Explanation = &events.Explanation{NodesConsidered: 2, Backfill: &events.Backfill{HeldFor: "big",
		ExpectedEnd: time.Date(2025, 1, 2, 11, 10, 0, 0, time.UTC), DrainedBy: time.Date(2025, 1, 2, 13, 0, 0, 0, time.UTC)}}

	pending := &events.PlacementPending{JobID: "waits",
		Reasons: []events.Reason{
			{Code: "insufficient_free_gpus", Field: "gpus", Message: "needs 16 GPUs on 2 nodes; 12 are free"},
			{Code: "tenant_mismatch", Policy: "toposched.tenancy", Message: "4 nodes belong to other tenants"},
		},
		Counterfactuals: []events.Counterfactual{
			{Kind: events.CounterfactualJobsFinish, Message: "these jobs finish", Jobs: []string{"a", "b"}},
			{Kind: events.CounterfactualPolicy, Message: "toposched.tenancy allowed tenant research on rack r2", Policy: "toposched.tenancy"},
		},
		Explanation: &events.Explanation{NodesConsidered: 3, Levels: []events.LevelCount{{Level: "cluster", Domains: 1, Fitting: 0}}},
	}
	waits := []any{&events.JobSubmitted{JobID: "waits", GPUs: 16}}
	for range 40 {
		waits = append(waits, pending)
	}
	rejected := &events.PlacementRejected{JobID: "bad",
		Reasons: []events.Reason{{Code: "schema", Field: "parallelism.tp", Message: "minimum: got 0, want 1"}}}
	capacity := &events.PlacementRejected{JobID: "huge",
		Reasons:         []events.Reason{{Code: "exceeds_cluster", Field: "gpus", Message: "needs 4096 GPUs; the cluster has 64"}},
		Counterfactuals: []events.Counterfactual{{Kind: events.CounterfactualCapacity, Message: "the cluster had 4032 more GPUs"}}}

	tests := []struct {
		name string
		h    *JobHistory
	}{
		{"finished", hist("llm", job, analyzed, &events.PlacementPending{JobID: "llm", Reasons: pending.Reasons}, fullDecision(), job,
			&events.JobFinished{JobID: "llm", Status: events.StatusSucceeded, Message: "loss converged"},
			&events.PlacementReleased{JobID: "llm", Status: events.StatusSucceeded, Nodes: fullDecision().Nodes})},
		{"decided-minimal", hist("small", &events.JobSubmitted{JobID: "small", GPUs: 2}, minimal)},
		{"decided-no-baseline", hist("llm", job, noBaseline)},
		{"decided-worse", hist("worse", worse)},
		// Compute weighed by GPU model: each side's compute on its model.
		{"decided-by-model", hist("by-model", byModel)},
		{"decided-by-model-corrected", hist("corrected", corrected)},
		{"decided-fit-trade", hist("traded", &events.JobSubmitted{JobID: "traded", GPUs: 2}, traded)},
		{"decided-fit-trade-declined", hist("declined", &events.JobSubmitted{JobID: "declined", GPUs: 2}, declined)},
		{"decided-backfill", hist("backfilled", &events.JobSubmitted{JobID: "backfilled", GPUs: 2}, backfilled)},
		{"decided-large", hist("big", &events.JobSubmitted{JobID: "big", GPUs: 320}, largeDecision())},
		{"pending-long", hist("waits", waits...)},
		// Ordered by expected ends: the turn says why later jobs start first.
		{"pending-turn", hist("short", &events.JobSubmitted{JobID: "short", GPUs: 1}, &events.PlacementPending{JobID: "short",
			Reasons: []events.Reason{{Code: "insufficient_free_gpus", Field: "gpus", Message: "needs 1 free GPUs, 0 free now"}},
			Turn:    &events.QueueTurn{At: time.Date(2025, 1, 2, 11, 18, 41, 0, time.UTC), ExpectedRunSeconds: 4720}})},
		// Ordered by expected work: the run time weighed by its share of a node.
		{"pending-turn-work", hist("small", &events.JobSubmitted{JobID: "small", GPUs: 1}, &events.PlacementPending{JobID: "small",
			Reasons: []events.Reason{{Code: "insufficient_free_gpus", Field: "gpus", Message: "needs 1 free GPUs, 0 free now"}},
			Turn:    &events.QueueTurn{At: time.Date(2025, 1, 2, 10, 9, 51, 0, time.UTC), ExpectedRunSeconds: 4720, NodeShare: 0.125}})},
		{"rejected", hist("bad", &events.JobSubmitted{JobID: "bad", GPUs: 8, Parallelism: &events.Parallelism{}}, rejected)},
		{"rejected-capacity", hist("huge", &events.JobSubmitted{JobID: "huge", GPUs: 4096}, capacity)},
		{"submitted", hist("new", &events.JobSubmitted{JobID: "new", GPUs: 1}, fmt.Errorf("unreadable body: unexpected end of JSON input"))},
		{"no-state", hist("ghost", &events.JobFinished{JobID: "ghost", Status: events.StatusCancelled})},
		// 8 MB of numbers as args: summarised, never shown.
		{"rejected-summarised", hist("flood", HistoryEvent{Name: events.NameJobSubmitted, ID: "s1",
			Invalid: "args[0]: type: got number, want string",
			Body:    &BodySummary{Size: 8<<20 - 100, SHA256: strings.Repeat("ab", 32), Head: `{"job_id":"flood","gpus":1,"args":[0,1,2,3,4,5,6,7,8,9,0,1,2,3,4,5,6,7,8,9,0,1,2,3,4,5,6,7,8,9]` + "\x1b[2J"}},
			&events.PlacementRejected{JobID: "flood", Reasons: []events.Reason{{Code: "schema_type", Field: "args[0]", Message: "args[0]: got number, want string"}}})},
		// A finish placement refused changes nothing (issue 46: the
		// heading said finished).
		{"finish-refused", hist("llm", job, analyzed, fullDecision(),
			HistoryEvent{ID: "f1", Data: &events.JobFinished{JobID: "llm", Status: "exploded"}, Invalid: `status: enum: value must be one of "succeeded", "failed", "cancelled", "lost"`},
			&events.PlacementFinishRefused{JobID: "llm", RequestID: "f1",
				Reasons: []events.Reason{{Code: "schema_enum", Field: "status", Message: `status: value must be one of "succeeded", "failed", "cancelled", "lost"`}}})},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var buf bytes.Buffer
			if err := WriteExplain(&buf, tc.h); err != nil {
				t.Fatal(err)
			}
			golden(t, filepath.Join("testdata", "explain-"+tc.name+".golden"), buf.Bytes())
		})
	}
}

// golden compares got with a golden file, rewriting it under -update.
func golden(t *testing.T, file string, got []byte) {
	t.Helper()
	if *update {
		if err := os.WriteFile(file, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("output differs from %s (run with -update):\n%s", file, got)
	}
}

func TestBytesIEC(t *testing.T) {
	t.Parallel()
	for n, want := range map[int64]string{0: "0 B", 1023: "1023 B", 1024: "1.0 KiB", 3 << 30: "3.0 GiB", 1536 << 20: "1.5 GiB", 5 << 50: "5.0 PiB"} {
		if got := bytesIEC(n); got != want {
			t.Errorf("bytesIEC(%d) = %q, want %q", n, got, want)
		}
	}
}
