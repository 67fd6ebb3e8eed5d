package bus_test

import (
	"errors"
	"testing"
	"time"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/events/bus"
	"github.com/toposched/toposched/events/eventstest"
)

// PublishAsync stores events in the order sent, answers through Wait with
// Publish's errors (a fence refused, a duplicate stored once), and says
// when the stream's answer never came.
func TestPublishAsync(t *testing.T) {
	t.Parallel()
	srv := eventstest.Server(t)
	b := eventstest.Bus(t, srv.ClientURL(), "test")
	ctx := eventstest.Context(t, 30*time.Second)

	var pending []*bus.Pending
	for _, id := range []string{"j1", "j2", "j3"} {
		_, p, err := b.PublishAsync(ctx, &events.PlacementPending{JobID: id, Reasons: []events.Reason{{Code: "c", Field: "gpus", Message: "m"}}})
		if err != nil {
			t.Fatal(err)
		}
		pending = append(pending, p)
	}
	var last uint64
	for i, p := range pending {
		seq, err := p.Wait(ctx)
		if err != nil || seq <= last {
			t.Fatalf("event %d: seq %d after %d, err %v: want stored in the order sent", i, seq, last, err)
		}
		last = seq
	}

	// The same event under the same cause is the same message: stored once.
	cause := bus.WithCause(ctx, events.Envelope{ID: "cause-1", CorrelationID: "cause-1"})
	ev := &events.PlacementRejected{JobID: "j4", Reasons: []events.Reason{{Code: "c", Field: "gpus", Message: "m"}}}
	var seqs []uint64
	for range 2 {
		_, p, err := b.PublishAsync(cause, ev)
		if err != nil {
			t.Fatal(err)
		}
		seq, err := p.Wait(ctx)
		if err != nil {
			t.Fatal(err)
		}
		seqs = append(seqs, seq)
	}
	if seqs[0] != seqs[1] {
		t.Fatalf("sent twice under one cause: stored at %v, want once", seqs)
	}

	// A fence whose marker is not the last on its subject: refused.
	_, mark, err := b.PublishSeq(ctx, &events.PlacementTerm{Holder: "r1", LeaseRevision: 1, StartedAt: time.Now().UTC()})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := b.PublishSeq(ctx, &events.PlacementTerm{Holder: "r2", LeaseRevision: 2, StartedAt: time.Now().UTC()}); err != nil {
		t.Fatal(err)
	}
	stale := bus.WithFence(ctx, bus.Fence{Subject: b.Subjects.Of(events.NamePlacementTerm), Seq: mark})
	_, p, err := b.PublishAsync(stale, &events.PlacementPending{JobID: "j5", Reasons: []events.Reason{{Code: "c", Field: "gpus", Message: "m"}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Wait(ctx); !errors.Is(err, bus.ErrFenced) {
		t.Fatalf("a stale fence: %v, want %v", err, bus.ErrFenced)
	}

	// No stream answers (none holds the subject): the event may or may
	// not be stored, as far as the client knows.
	bare, err := bus.Connect(ctx, bus.Config{URL: srv.ClientURL(), Prefix: "nostreams", SkipStreams: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = bare.Close() })
	_, p, err = bare.PublishAsync(ctx, &events.PlacementPending{JobID: "j6", Reasons: []events.Reason{{Code: "c", Field: "gpus", Message: "m"}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Wait(ctx); !errors.Is(err, bus.ErrUnconfirmed) || !bus.IsTransient(err) {
		t.Fatalf("no answer: %v, want a transient %v", err, bus.ErrUnconfirmed)
	}
}
