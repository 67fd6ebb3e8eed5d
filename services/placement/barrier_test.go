package placement_test

import (
	"context"
	"testing"
	"time"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/events/bus"
	"github.com/toposched/toposched/events/eventstest"
	"github.com/toposched/toposched/internal/fixtures"
	"github.com/toposched/toposched/internal/pattern"
	"github.com/toposched/toposched/internal/store"
	"github.com/toposched/toposched/services/placement"
)

func analyzed(t *testing.T, job events.JobSubmitted) *events.JobAnalyzed {
	t.Helper()
	a, reasons := pattern.Analyze(job)
	if len(reasons) > 0 {
		t.Fatal(reasons)
	}
	return &a
}

// A job handled before the node reports already in the topology stream is
// not rejected: placement catches up with the stream first.
func TestNoRejectionBeforeTopologyIsRead(t *testing.T) {
	t.Parallel()
	srv := eventstest.Server(t)
	b := eventstest.Bus(t, srv.ClientURL(), "test")
	ctx := eventstest.Context(t, 30*time.Second)
	s := placement.NewOnBus(t, b, placement.Config{}) // no handlers running: topology is only in the stream

	// Nothing reported at all: the job waits instead of being rejected.
	if err := s.OnAnalyzed(ctx, events.Envelope{ID: "e1"}, analyzed(t, events.JobSubmitted{JobID: "early", GPUs: 8})); err != nil {
		t.Fatal(err)
	}
	if j, _ := s.Store().Snapshot().Job("early"); j.State != store.JobPending || j.Reasons[0].Code != "no_topology" {
		t.Fatalf("early: %+v", j)
	}

	for _, name := range []string{"n1", "n2"} {
		node := fixtures.PlainNode(name, "", 8)
		if _, err := b.Publish(context.Background(), &node); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.OnAnalyzed(ctx, events.Envelope{ID: "e2"}, analyzed(t, events.JobSubmitted{JobID: "wide", GPUs: 16})); err != nil {
		t.Fatal(err)
	}
	if j, _ := s.Store().Snapshot().Job("wide"); j.State != store.JobPlaced {
		t.Fatalf("wide: %+v", j)
	}
	if err := s.OnAnalyzed(ctx, events.Envelope{ID: "e3"}, analyzed(t, events.JobSubmitted{JobID: "huge", GPUs: 64})); err != nil {
		t.Fatal(err)
	}
	if j, _ := s.Store().Snapshot().Job("huge"); j.State != store.JobRejected {
		t.Fatalf("huge: %+v", j)
	}
}

// A job cancelled while analysis still has it (its finish reaches placement
// before its analysis) is withdrawn: the analysis that arrives later is a
// duplicate, and the job never holds a GPU.
func TestFinishBeforeAnalysisWins(t *testing.T) {
	t.Parallel()
	srv := eventstest.Server(t)
	b := eventstest.Bus(t, srv.ClientURL(), "test")
	ctx := eventstest.Context(t, 30*time.Second)
	s := placement.NewOnBus(t, b, placement.Config{})
	n := fixtures.PlainNode("n1", "A100", 8)
	if err := s.OnNode(ctx, events.Envelope{}, &n); err != nil {
		t.Fatal(err)
	}
	if err := s.OnFinished(ctx, events.Envelope{ID: "f1"}, &events.JobFinished{JobID: "early", Status: events.StatusCancelled}); err != nil {
		t.Fatal(err)
	}
	if err := s.OnAnalyzed(ctx, events.Envelope{ID: "a1"}, analyzed(t, events.JobSubmitted{JobID: "early", GPUs: 4})); err != nil {
		t.Fatal(err)
	}
	snap := s.Store().Snapshot()
	if j, _ := snap.Job("early"); j.State != store.JobFinished || j.Decision != nil {
		t.Fatalf("early: %+v, want finished and never decided", j)
	}
	if got := len(snap.GPUsOfJob("early")); got != 0 {
		t.Fatalf("early holds %d GPUs", got)
	}
	var released int
	err := b.Replay(ctx, events.DomainPlacement, []string{b.Subjects.Of(events.NamePlacementReleased)}, func(r bus.Record) error {
		if r.Env.Subject == "early" {
			released++
		}
		return nil
	})
	if err != nil || released != 1 {
		t.Fatalf("releases of early in the stream: %d (%v), want 1", released, err)
	}
}
