package client

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/events/eventstest"
)

// TestWatchFromNowSurvivesReset deletes a FromNow watch's consumer
// before its first message and publishes an outcome at once: the ordered
// consumer's reset must resume from the sequence the watch started at.
// With DeliverNew the new consumer started after the outcome and lost it,
// which is how `topoctl finish` once reported no answer from placement on
// a loaded machine.
func TestWatchFromNowSurvivesReset(t *testing.T) {
	t.Parallel()
	srv := eventstest.Server(t)
	b := eventstest.Bus(t, srv.ClientURL(), "watch-test")
	ctx := eventstest.Context(t, 30*time.Second)
	publish(t, ctx, b, &events.PlacementReleased{JobID: "before", Status: events.StatusSucceeded})

	ready := make(chan struct{})
	got := make(chan string, 4)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- Watch(wctx, b, FromNow, ready, func(o Outcome) error {
			got <- o.JobID()
			return nil
		})
	}()
	<-ready

	if n := eventstest.DeleteConsumers(t, ctx, b, events.DomainPlacement); n != 1 {
		t.Fatalf("deleted %d consumers, want the watch's one", n)
	}
	publish(t, ctx, b, &events.PlacementReleased{JobID: "after", Status: events.StatusSucceeded})

	select {
	case id := <-got:
		if id != "after" {
			t.Fatalf("first outcome seen: %s, want after (before was published before the watch)", id)
		}
	case err := <-done:
		t.Fatalf("watch ended: %v", err)
	case <-ctx.Done():
		t.Fatal("the outcome published while the watch's consumer was reset was never delivered")
	}
	cancel()
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("watch: %v", err)
	}
}
