package placement

import (
	"strings"
	"testing"
	"time"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/events/eventstest"
	"github.com/toposched/toposched/internal/formats/clusterfile"
	"github.com/toposched/toposched/internal/pattern"
	"github.com/toposched/toposched/internal/placer"
	"github.com/toposched/toposched/internal/store"
)

// A large job at the head of the queue gets nodes held once it has waited
// ReserveAfter: a small job that would backfill the freed GPUs waits
// instead, and the large job is placed when the holders finish.
func TestReservationStopsStarvation(t *testing.T) {
	t.Parallel()
	srv := eventstest.Server(t)
	b := eventstest.Bus(t, srv.ClientURL(), "test")
	ctx := eventstest.Context(t, 30*time.Second)
	clock := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	after := 10 * time.Minute
	s, err := New(Config{ReserveAfter: &after}, Deps{Publish: b, Read: b, Consume: b, Subjects: b.Subjects,
		Now: func() time.Time { return clock }})
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"n0", "n1"} {
		m, err := clusterfile.Model("dgx-a100")
		if err != nil {
			t.Fatal(err)
		}
		m.Name = name
		ev := m.Event()
		if err := s.OnNode(ctx, events.Envelope{}, &ev); err != nil {
			t.Fatal(err)
		}
	}
	submit := func(id string, gpus, prio int) store.Job {
		t.Helper()
		a, reasons := pattern.Analyze(events.JobSubmitted{JobID: id, GPUs: gpus, Priority: prio})
		if len(reasons) > 0 {
			t.Fatal(reasons)
		}
		if err := s.OnAnalyzed(ctx, events.Envelope{}, &a); err != nil {
			t.Fatal(err)
		}
		j, _ := s.Store().Snapshot().Job(id)
		return j
	}
	finish := func(id string) {
		t.Helper()
		if err := s.OnFinished(ctx, events.Envelope{}, &events.JobFinished{JobID: id, Status: events.StatusSucceeded}); err != nil {
			t.Fatal(err)
		}
	}
	state := func(id string) store.JobState { j, _ := s.Store().Snapshot().Job(id); return j.State }

	submit("a", 4, 0)
	submit("b", 4, 0)
	if j := submit("large", 16, 0); j.State != store.JobPending {
		t.Fatalf("large: %s, want pending", j.State)
	}
	// Before ReserveAfter, small jobs backfill.
	if j := submit("s1", 4, 0); j.State != store.JobPlaced {
		t.Fatalf("s1 before the hold: %s, want placed", j.State)
	}
	finish("s1")
	clock = clock.Add(11 * time.Minute)
	// After it, the freed GPUs are held for large.
	j := submit("s2", 4, 0)
	if j.State != store.JobPending || !strings.Contains(j.Reasons[len(j.Reasons)-1].Code, placer.CodeReserved) {
		t.Fatalf("s2 after the hold: %s %v, want pending behind the reservation", j.State, j.Reasons)
	}
	if r := s.Reservation(); r == nil || r.JobID != "large" || len(r.Nodes) != 2 {
		t.Fatalf("reservation %+v, want both nodes for large", r)
	}
	// A higher priority is not held back.
	if j := submit("urgent", 4, 9); j.State != store.JobPlaced {
		t.Fatalf("urgent: %s %v, want placed", j.State, j.Reasons)
	}
	finish("urgent")
	finish("a")
	if state("large") != store.JobPending || state("s2") != store.JobPending {
		t.Fatalf("after a: large %s, s2 %s; want both waiting (s2 must not take the freed GPUs)", state("large"), state("s2"))
	}
	finish("b")
	if state("large") != store.JobPlaced || state("s2") != store.JobPending {
		t.Fatalf("after b: large %s, s2 %s; want large placed, s2 waiting", state("large"), state("s2"))
	}
	if s.Reservation() != nil {
		t.Errorf("reservation %+v after large was placed, want none", s.Reservation())
	}
	finish("large")
	if state("s2") != store.JobPlaced {
		t.Errorf("s2 after large: %s, want placed", state("s2"))
	}
}
