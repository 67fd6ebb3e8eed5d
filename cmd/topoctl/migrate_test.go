package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/events/bus"
	"github.com/toposched/toposched/events/eventstest"
	"github.com/toposched/toposched/internal/client"
)

func TestMigrate(t *testing.T) {
	t.Parallel()
	srv := eventstest.Server(t)
	b := eventstest.Bus(t, srv.ClientURL(), "migrate-test")
	ctx := eventstest.Context(t, 30*time.Second)
	url := srv.ClientURL()

	if out := run(t, "--nats-url", url, "migrate", "list"); !strings.Contains(out, "no migration proposals") {
		t.Errorf("empty list:\n%s", out)
	}
	cur := []events.NodePlacement{{Node: "a", GPUs: []int{0}, CUDAVisibleDevices: "0"}, {Node: "c", GPUs: []int{0}, CUDAVisibleDevices: "0"}}
	d := &events.PlacementDecided{JobID: "llm", Strategy: "topology-aware", DecidedAt: time.Now().UTC(), Nodes: cur,
		Ranks: []events.RankPlacement{{Rank: 0, Node: "a", GPU: 0}, {Rank: 1, Node: "c", GPU: 0}}}
	p := &events.PlacementMigration{JobID: "llm", ProposalID: "p1", Reason: events.MigrationCongestion, Message: "leaf uplink shared with etl",
		CurrentNodes: cur, Ranks: []events.RankPlacement{{Rank: 0, Node: "b", GPU: 0}, {Rank: 1, Node: "b", GPU: 1, LocalRank: 1}},
		Nodes:                     []events.NodePlacement{{Node: "b", GPUs: []int{0, 1}, CUDAVisibleDevices: "0,1"}},
		CurrentCommSecondsPerStep: 0.4, MeasuredCommSecondsPerStep: 1, ProposedCommSecondsPerStep: 0.25, GainSecondsPerStep: 0.75,
		StepSeconds: 3, RestartCostSeconds: 300, RestartCostSource: events.RestartCostFromDefault, BreakEvenSeconds: 1200, ProposedAt: time.Now().UTC()}
	for _, v := range []any{d, p} {
		if _, err := b.Publish(ctx, v); err != nil {
			t.Fatal(err)
		}
	}
	out := run(t, "--nats-url", url, "migrate", "list")
	for _, s := range []string{"llm  p1        open    congestion  750.0 ms   1200.00 s   a:0 c:0  b:0,1", "llm: leaf uplink shared with etl"} {
		if !strings.Contains(out, s) {
			t.Errorf("list lacks %q:\n%s", s, out)
		}
	}
	var ps []client.Proposal
	if err := json.Unmarshal([]byte(run(t, "--nats-url", url, "migrate", "list", "-o", "json")), &ps); err != nil || len(ps) != 1 || ps[0].ProposalID != "p1" || ps[0].Status != "open" {
		t.Errorf("list -o json: %+v, %v", ps, err)
	}

	// A stand-in for placement: refuse a named proposal, apply the latest.
	rctx, cancel := context.WithCancel(context.Background())
	ready, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		_ = b.Follow(rctx, "jobs", []string{b.Subjects.Of(events.NameJobMigrationAccepted)}, ready, func(r bus.Record) error {
			var req events.JobMigrationAccepted
			if err := bus.Decode(r.Name, r.Body, &req); err != nil {
				return err
			}
			var ans any = &events.PlacementMigrationRefused{JobID: req.JobID, ProposalID: req.ProposalID, RequestID: r.Env.ID,
				Reasons: []events.Reason{{Code: events.RefusedSuperseded, Message: "proposal old was superseded by p1"}}}
			if req.ProposalID == "" {
				moved := *d
				moved.Nodes, moved.Ranks = p.Nodes, p.Ranks
				moved.Migration = &events.Migration{ProposalID: "p1", RequestID: r.Env.ID, PreviousNodes: cur, Reason: p.Reason}
				ans = &moved
			}
			_, err := b.Publish(bus.WithCause(rctx, r.Env), ans)
			return err
		})
	}()
	<-ready
	t.Cleanup(func() { cancel(); <-done })

	out = run(t, "--nats-url", url, "migrate", "accept", "llm", "--wait")
	for _, s := range []string{"llm: migrated by proposal p1 (congestion), from a:0 c:0", "llm: decided by topology-aware, 2 ranks on 1 node"} {
		if !strings.Contains(out, s) {
			t.Errorf("accept --wait lacks %q:\n%s", s, out)
		}
	}
	var buf bytes.Buffer
	root := newRoot()
	root.SetOut(&buf)
	root.SetErr(&buf)
	root.SetArgs([]string{"--nats-url", url, "migrate", "accept", "llm", "--proposal", "old", "--wait"})
	if err := root.Execute(); err == nil || !strings.Contains(err.Error(), "refused") {
		t.Errorf("a refused accept returned %v", err)
	}
	if !strings.Contains(buf.String(), "proposal_superseded: proposal old was superseded by p1") {
		t.Errorf("refusal output:\n%s", buf.String())
	}
	if out := run(t, "--nats-url", url, "migrate", "accept", "llm"); !strings.Contains(out, "accepted the migration of llm (event ") {
		t.Errorf("accept without --wait:\n%s", out)
	}
	for _, args := range [][]string{{"migrate", "accept", "bad id"}, {"migrate", "accept", "llm", "--proposal", "x y"}, {"migrate", "list", "-o", "dot"}} {
		root := newRoot()
		root.SetOut(&buf)
		root.SetErr(&buf)
		root.SetArgs(append([]string{"--nats-url", url}, args...))
		if err := root.Execute(); err == nil {
			t.Errorf("topoctl %v: no error", args)
		}
	}
}
