package placement_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/events/bus"
	"github.com/toposched/toposched/events/eventstest"
	"github.com/toposched/toposched/internal/fixtures"
	"github.com/toposched/toposched/services/placement"
)

// A replica whose term has been followed by another's cannot store an
// outcome: JetStream refuses its publish (the term marker it is fenced on
// is no longer the last), and its Run ends with bus.ErrFenced rather than
// going on deciding on a store the new leader does not share.
func TestStaleTermIsFenced(t *testing.T) {
	t.Parallel()
	srv := eventstest.Server(t)
	b := eventstest.Bus(t, srv.ClientURL(), "test")
	ctx := eventstest.Context(t, 60*time.Second)
	n := fixtures.PlainNode("n1", "A100", 8)
	if _, err := b.Publish(ctx, &n); err != nil {
		t.Fatal(err)
	}
	// run starts s; the returned channel is closed when Run returns, and
	// *runErr is then its error.
	run := func(s *placement.Service, runErr *error) <-chan struct{} {
		rctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { defer close(done); *runErr = s.Run(rctx) }()
		select {
		case <-s.Ready():
		case <-done:
			t.Fatalf("run: %v", *runErr)
		}
		t.Cleanup(func() { cancel(); <-done })
		return done
	}

	old := placement.NewOnBus(t, b, placement.Config{Holder: "r1", LeaseRevision: 1})
	var oldErr, newerErr error
	oldDone := run(old, &oldErr)
	// Its own term: it decides.
	if err := old.OnAnalyzed(ctx, events.Envelope{ID: "a1"}, analyzed(t, events.JobSubmitted{JobID: "before", GPUs: 2})); err != nil {
		t.Fatalf("a decision in its own term: %v", err)
	}

	// A newer term opens (the lease lapsed while r1 was paused).
	newer := placement.NewOnBus(t, b, placement.Config{Holder: "r2", LeaseRevision: 2})
	run(newer, &newerErr)

	err := old.OnAnalyzed(ctx, events.Envelope{ID: "a2"}, analyzed(t, events.JobSubmitted{JobID: "after", GPUs: 2}))
	if !errors.Is(err, bus.ErrFenced) {
		t.Fatalf("a decision after a newer term opened: %v, want %v", err, bus.ErrFenced)
	}
	select {
	case <-oldDone:
		if !errors.Is(oldErr, bus.ErrFenced) {
			t.Fatalf("the fenced term's Run: %v, want %v", oldErr, bus.ErrFenced)
		}
	case <-ctx.Done():
		t.Fatal("the fenced term kept running")
	}

	decided := map[string]int{}
	err = b.Replay(ctx, events.DomainPlacement, []string{b.Subjects.Of(events.NamePlacementDecided)}, func(r bus.Record) error {
		decided[r.Env.Subject]++
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if decided["before"] != 1 || decided["after"] != 0 {
		t.Fatalf("decisions in the stream: %v, want one for before and none for after", decided)
	}
	// The newer term rebuilt from the stream: it holds the decision made
	// before it and no trace of the refused one.
	snap := newer.Store().Snapshot()
	if j, ok := snap.Job("before"); !ok || j.Decision == nil {
		t.Errorf("the newer term does not hold the earlier decision: %+v", j)
	}
	if _, ok := snap.Job("after"); ok {
		t.Error("the newer term holds the refused job")
	}
}
