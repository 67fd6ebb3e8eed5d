package main

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/events/eventstest"
	"github.com/toposched/toposched/internal/client"
)

func TestExplain(t *testing.T) {
	t.Parallel()
	srv := eventstest.Server(t)
	b := eventstest.Bus(t, srv.ClientURL(), "explain-test")
	ctx := eventstest.Context(t, 30*time.Second)
	numa := 1
	for _, v := range []any{
		&events.JobSubmitted{JobID: "llm", GPUs: 2, Tenant: "research"},
		&events.JobSubmitted{JobID: "other", GPUs: 64},
		&events.PlacementPending{JobID: "llm", Reasons: []events.Reason{{Code: "insufficient_free_gpus", Field: "gpus", Message: "needs 2"}},
			Counterfactuals: []events.Counterfactual{{Kind: events.CounterfactualJobsFinish, Message: "job other finishes", Jobs: []string{"other"}}}},
		&events.PlacementRejected{JobID: "other", Reasons: []events.Reason{{Code: "exceeds_cluster", Field: "gpus", Message: "needs 64"}}},
		&events.PlacementDecided{JobID: "llm", Strategy: "topology-aware", DecidedAt: time.Now().UTC(),
			Ranks:      []events.RankPlacement{{Rank: 0, Node: "n1", GPU: 2, LocalRank: 0, NUMA: &numa, NIC: "mlx5_1"}, {Rank: 1, Node: "n1", GPU: 3, LocalRank: 1}},
			Nodes:      []events.NodePlacement{{Node: "n1", GPUs: []int{2, 3}, CUDAVisibleDevices: "2,3"}},
			Prediction: &events.Prediction{Strategy: "topology-aware", CommSecondsPerStep: 0.01},
			Baseline:   &events.Prediction{Strategy: "blind", CommSecondsPerStep: 0.04},
			Warnings:   []events.Reason{{Code: "leaf_span", Policy: "toposched.span", Message: "spans 2 leaves"}},
			Explanation: &events.Explanation{PolicyRevision: "r7", NodesConsidered: 3,
				Candidates: []events.CandidateScore{{Domain: "node/n1", Nodes: 1, CommSecondsPerStep: 0.01, Cost: 1, Outcome: events.OutcomeChosen}}}},
	} {
		if _, err := b.Publish(ctx, v); err != nil {
			t.Fatalf("publish %T: %v", v, err)
		}
	}
	url := srv.ClientURL()

	out := run(t, "--nats-url", url, "explain", "llm")
	for _, w := range []string{
		"llm: decided at ",
		"2 GPUs, tenant research",
		"placement.pending  insufficient_free_gpus",
		"decision at ",
		"n1    0-1    2,3",
		"0     n1    2    0      1     mlx5_1",
		"1     n1    3    1      -     -",
		"75.0% less communication than blind first fit",
		"leaf_span  -      toposched.span  spans 2 leaves",
		"how placement looked (policy revision r7)",
		"node/n1    1      -       10.0 ms",
	} {
		if !strings.Contains(out, w) {
			t.Errorf("explain llm lacks %q:\n%s", w, out)
		}
	}
	if strings.Contains(out, "exceeds_cluster") {
		t.Errorf("explain llm shows another job's events:\n%s", out)
	}

	out = run(t, "--nats-url", url, "explain", "other")
	for _, w := range []string{"other: rejected at ", "exceeds_cluster  gpus   -       needs 64"} {
		if !strings.Contains(out, w) {
			t.Errorf("explain other lacks %q:\n%s", w, out)
		}
	}

	var h client.JobHistory
	out = run(t, "--nats-url", url, "explain", "llm", "-o", "json")
	if err := json.Unmarshal([]byte(out), &h); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if h.JobID != "llm" || h.State != client.StateDecided || len(h.Events) != 3 {
		t.Fatalf("json history %+v", h)
	}
	if p, ok := h.Events[1].Data.(*events.PlacementPending); !ok || p.Counterfactuals[0].Jobs[0] != "other" {
		t.Errorf("json pending %+v", h.Events[1])
	}

	tests := []struct {
		args []string
		want string
	}{
		{[]string{"explain", "nobody"}, "no events for job nobody on toposched"},
		{[]string{"explain", "llm", "--prefix", "elsewhere"}, "no events for job llm on elsewhere"},
		{[]string{"explain", "a b"}, `job id "a b"`},
		{[]string{"explain", "llm", "-o", "dot"}, "explain prints table or json"},
	}
	for _, tc := range tests {
		root := newRoot()
		root.SetOut(&strings.Builder{})
		root.SetArgs(append([]string{"--nats-url", url}, tc.args...))
		err := root.Execute()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("topoctl %s: %v, want %q", strings.Join(tc.args, " "), err, tc.want)
		}
		if strings.HasPrefix(tc.want, "no events") && !errors.Is(err, client.ErrUnknownJob) {
			t.Errorf("topoctl %s: %v is not ErrUnknownJob", strings.Join(tc.args, " "), err)
		}
	}
}

// explain of a job submitted as 8 MB of numbers (issue 46: it ran for
// minutes) shows the submission's size, digest and first bytes, not the
// body, in either format.
func TestExplainHugeSubmission(t *testing.T) {
	t.Parallel()
	srv := eventstest.Server(t)
	b := eventstest.Bus(t, srv.ClientURL(), "explain-test")
	ctx := eventstest.Context(t, 30*time.Second)
	body := []byte(`{"job_id":"flood","gpus":1,"args":[` + strings.Repeat("7,", 4<<20-40) + `7]}`)
	m := nats.NewMsg("toposched.jobs.submitted")
	m.Header.Set(events.HeaderSubject, "flood")
	m.Data = body
	if _, err := b.JetStream().PublishMsg(ctx, m); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Publish(ctx, &events.PlacementRejected{JobID: "flood",
		Reasons: []events.Reason{{Code: "schema_type", Field: "args[0]", Message: "args[0]: got number, want string"}}}); err != nil {
		t.Fatal(err)
	}
	url := srv.ClientURL()
	out := run(t, "--nats-url", url, "explain", "flood")
	for _, w := range []string{"flood: rejected at ", "body of 8.0 MiB not shown (sha256 ", `begins "{\"job_id\":\"flood\"`, "args[0]: type: got number, want string"} {
		if !strings.Contains(out, w) {
			t.Errorf("explain flood lacks %q:\n%.4000s", w, out)
		}
	}
	out = run(t, "--nats-url", url, "explain", "flood", "-o", "json")
	if len(out) > 16<<10 {
		t.Errorf("explain -o json printed %d bytes", len(out))
	}
	var h client.JobHistory
	if err := json.Unmarshal([]byte(out), &h); err != nil {
		t.Fatalf("%v\n%.4000s", err, out)
	}
	if len(h.Events) != 2 || h.Events[0].Body == nil || h.Events[0].Body.Size != len(body) || h.Events[0].Data != nil {
		t.Fatalf("json history %+v", h)
	}
}
