package client

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/events/bus"
	"github.com/toposched/toposched/events/eventstest"
)

func place(job string, nodes ...events.NodePlacement) *events.PlacementDecided {
	d := &events.PlacementDecided{JobID: job, Strategy: "topology-aware", Nodes: nodes, DecidedAt: time.Now().UTC()}
	for _, n := range nodes {
		for i, g := range n.GPUs {
			d.Ranks = append(d.Ranks, events.RankPlacement{Rank: len(d.Ranks), Node: n.Node, GPU: g, LocalRank: i})
		}
	}
	return d
}

func np(node string, gpus string) events.NodePlacement {
	n := events.NodePlacement{Node: node, CUDAVisibleDevices: gpus}
	for _, s := range strings.Split(gpus, ",") {
		n.GPUs = append(n.GPUs, int(s[0]-'0'))
	}
	return n
}

func proposal(id string, from, to *events.PlacementDecided) *events.PlacementMigration {
	return &events.PlacementMigration{JobID: from.JobID, ProposalID: id, Reason: events.MigrationCongestion, Message: "uplink shared with etl",
		CurrentNodes: from.Nodes, Ranks: to.Ranks, Nodes: to.Nodes, CurrentCommSecondsPerStep: 0.4, MeasuredCommSecondsPerStep: 1,
		ProposedCommSecondsPerStep: 0.25, GainSecondsPerStep: 0.75, StepSeconds: 3, RestartCostSeconds: 300,
		RestartCostSource: events.RestartCostFromDefault, BreakEvenSeconds: 1200, ProposedAt: time.Now().UTC()}
}

func TestProposals(t *testing.T) {
	t.Parallel()
	srv := eventstest.Server(t)
	b := eventstest.Bus(t, srv.ClientURL(), "test")
	ctx := eventstest.Context(t, 30*time.Second)
	open := place("open", np("a", "0"), np("c", "0"))
	stale := place("stale", np("a", "1"), np("c", "1"))
	applied := place("applied", np("a", "2"), np("c", "2"))
	gone := place("gone", np("a", "3"))
	target := place("open", np("b", "0,1"))
	moved := place("applied", np("b", "2,3"))
	moved.Migration = &events.Migration{ProposalID: "p-applied", RequestID: "r1", PreviousNodes: applied.Nodes}
	staleTarget := place("stale", np("d", "0,1"))
	for _, v := range []any{
		open, stale, applied, gone,
		proposal("p-open-old", open, target), proposal("p-open", open, target),
		proposal("p-stale", &events.PlacementDecided{JobID: "stale", Nodes: staleTarget.Nodes}, staleTarget),
		proposal("p-applied", applied, moved), moved,
		proposal("p-gone", gone, place("gone", np("b", "3"))),
		&events.PlacementReleased{JobID: "gone", Status: events.StatusSucceeded},
	} {
		if _, err := b.Publish(ctx, v); err != nil {
			t.Fatal(err)
		}
	}
	ps, err := Proposals(ctx, b)
	if err != nil {
		t.Fatal(err)
	}
	want := []struct{ job, id, status string }{
		{"applied", "p-applied", ProposalApplied},
		{"open", "p-open", ProposalOpen},
		{"stale", "p-stale", ProposalStale},
	}
	if len(ps) != len(want) {
		t.Fatalf("got %d proposals, want %d: %+v", len(ps), len(want), ps)
	}
	for i, w := range want {
		if p := ps[i]; p.JobID != w.job || p.ProposalID != w.id || p.Status != w.status {
			t.Errorf("proposal %d = %s %s %s, want %s %s %s", i, p.JobID, p.ProposalID, p.Status, w.job, w.id, w.status)
		}
	}
	if ps[1].Superseded != 1 {
		t.Errorf("open: superseded %d, want 1", ps[1].Superseded)
	}
	var out bytes.Buffer
	if err := WriteProposals(&out, ps); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"JOB ", "open     p-open", "750.0 ms", "1200.00 s", "a:0 c:0", "b:0,1", "open: uplink shared with etl"} {
		if !strings.Contains(out.String(), s) {
			t.Errorf("table lacks %q:\n%s", s, out.String())
		}
	}
}

// respond answers every jobs.migration_accepted as placement would: with
// answer(request), published under the request's id.
func respond(t *testing.T, b *bus.Bus, answer func(env events.Envelope, req *events.JobMigrationAccepted) any) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = b.Follow(ctx, events.DomainJobs, []string{b.Subjects.Of(events.NameJobMigrationAccepted)}, ready, func(r bus.Record) error {
			var req events.JobMigrationAccepted
			if err := b.Decode(r.Name, r.Body, &req); err != nil {
				return err
			}
			_, err := b.Publish(bus.WithCause(ctx, r.Env), answer(r.Env, &req))
			return err
		})
	}()
	<-ready
	t.Cleanup(func() { cancel(); <-done })
}

func TestAcceptMigrationAndWait(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		answer  func(env events.Envelope, req *events.JobMigrationAccepted) any
		decided bool
		print   []string
	}{
		{name: "applied", decided: true,
			answer: func(env events.Envelope, req *events.JobMigrationAccepted) any {
				d := place(req.JobID, np("b", "0,1"))
				d.Migration = &events.Migration{ProposalID: "p1", RequestID: env.ID, Reason: events.MigrationCongestion,
					PreviousNodes: []events.NodePlacement{np("a", "0"), np("c", "0")}}
				return d
			},
			print: []string{"j: migrated by proposal p1 (congestion), from a:0 c:0", "j: decided by topology-aware, 2 ranks on 1 node", "b     0-1    0,1"}},
		{name: "refused",
			answer: func(env events.Envelope, req *events.JobMigrationAccepted) any {
				return &events.PlacementMigrationRefused{JobID: req.JobID, ProposalID: req.ProposalID, RequestID: env.ID,
					Reasons: []events.Reason{{Code: events.RefusedGPUsUnavailable, Message: "GPU b/1 is held by job x"}}}
			},
			print: []string{"j: migration refused (proposal p1); the job keeps its placement", "gpus_unavailable: GPU b/1 is held by job x"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv := eventstest.Server(t)
			b := eventstest.Bus(t, srv.ClientURL(), "test")
			ctx := eventstest.Context(t, 30*time.Second)
			// An answer to another request for the same job comes first,
			// and is not taken for ours.
			if _, err := b.Publish(ctx, &events.PlacementMigrationRefused{JobID: "j", RequestID: "someone-else",
				Reasons: []events.Reason{{Code: events.RefusedNoProposal, Message: "x"}}}); err != nil {
				t.Fatal(err)
			}
			respond(t, b, tt.answer)
			env, ans, err := AcceptMigrationAndWait(ctx, b, "j", "p1")
			if err != nil {
				t.Fatal(err)
			}
			if (ans.Decided != nil) != tt.decided || (ans.Refused != nil) == tt.decided {
				t.Fatalf("answer %+v", ans)
			}
			if ans.Refused != nil && ans.Refused.RequestID != env.ID {
				t.Errorf("refusal for %s, want %s", ans.Refused.RequestID, env.ID)
			}
			var out bytes.Buffer
			if err := WriteMigrationAnswer(&out, ans); err != nil {
				t.Fatal(err)
			}
			for _, s := range tt.print {
				if !strings.Contains(out.String(), s) {
					t.Errorf("output lacks %q:\n%s", s, out.String())
				}
			}
		})
	}
}

func TestAcceptMigrationAndWaitTimesOut(t *testing.T) {
	t.Parallel()
	srv := eventstest.Server(t)
	b := eventstest.Bus(t, srv.ClientURL(), "test")
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if _, _, err := AcceptMigrationAndWait(ctx, b, "j", ""); err == nil {
		t.Fatal("no error without an answer")
	}
}

func TestMigrationSummaries(t *testing.T) {
	t.Parallel()
	moved := place("j", np("b", "0,1"))
	moved.Migration = &events.Migration{ProposalID: "p1", RequestID: "r", PreviousNodes: []events.NodePlacement{np("a", "0"), np("c", "0")}}
	tests := []struct {
		data any
		want string
	}{
		{moved, "topology-aware, 2 ranks on 1 node; migrated by proposal p1 from a:0 c:0"},
		{proposal("p1", place("j", np("a", "0")), place("j", np("b", "0"))), "proposal p1 (congestion): to b:0, 750.0 ms less per step, break-even 1200.00 s"},
		{&events.JobMigrationAccepted{JobID: "j"}, "the latest proposal accepted"},
		{&events.JobMigrationAccepted{JobID: "j", ProposalID: "p1"}, "proposal p1 accepted"},
		{&events.PlacementMigrationRefused{JobID: "j", Reasons: []events.Reason{{Code: events.RefusedSuperseded}}}, "proposal_superseded"},
	}
	for _, tt := range tests {
		if got := summary(HistoryEvent{Data: tt.data}); got != tt.want {
			t.Errorf("summary(%T) = %q, want %q", tt.data, got, tt.want)
		}
	}
}
