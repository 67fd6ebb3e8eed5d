package bus_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/events/bus"
	"github.com/toposched/toposched/events/eventstest"
)

// Every retry of a Transient failure runs with a live context: the timeout
// middleware's context of the attempt before is not handed on (before, the
// second attempt always failed at once with "context canceled").
func TestRetriesGetALiveContext(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	var dead atomic.Bool
	h := start(t, func(ctx context.Context, _ events.Envelope, _ *events.JobFinished) error {
		if ctx.Err() != nil {
			dead.Store(true)
		}
		if calls.Add(1) < 3 {
			return bus.Transient(errors.New("broker away"))
		}
		return nil
	}, nil)
	h.raw(t, "toposched.jobs.finished", nil, `{"job_id":"j8","status":"succeeded"}`)
	h.wait(t)
	if dead.Load() {
		t.Fatal("a retry ran with a context already done")
	}
	if calls.Load() != 3 {
		t.Fatalf("handler ran %d times, want 3", calls.Load())
	}
}

// A router closed after AbortOnClose does not wait for the handler in
// flight: its context ends, its retries stop, and its message is nacked,
// not dead-lettered, so the next consumer of the durable gets it.
func TestAbortOnCloseCancelsInFlightAndRedelivers(t *testing.T) {
	t.Parallel()
	srv := eventstest.Server(t)
	b := eventstest.Bus(t, srv.ClientURL(), "test")
	ctx := eventstest.Context(t, 60*time.Second)

	entered := make(chan struct{}, 1)
	first, err := b.NewRouter()
	if err != nil {
		t.Fatal(err)
	}
	first.AbortOnClose()
	bus.Handle(first, bus.Handler[events.JobFinished]{
		Name: "abort-finished", Event: events.NameJobFinished,
		Fn: func(ctx context.Context, _ events.Envelope, _ *events.JobFinished) error {
			select {
			case entered <- struct{}{}:
			default:
			}
			// A handler stuck on a broker that does not answer: it
			// fails Transient until its context ends.
			<-ctx.Done()
			return bus.Transient(ctx.Err())
		},
	})
	done := make(chan error, 1)
	go func() { done <- first.Run(context.Background()) }()
	<-first.Running()
	if _, err := b.Publish(ctx, &events.JobFinished{JobID: "stuck", Status: events.StatusSucceeded}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-entered:
	case <-ctx.Done():
		t.Fatal("handler never ran")
	}
	if err := first.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	if err := <-done; err != nil {
		t.Fatalf("run: %v", err)
	}

	got := make(chan string, 1)
	second, err := b.NewRouter()
	if err != nil {
		t.Fatal(err)
	}
	bus.Handle(second, bus.Handler[events.JobFinished]{
		Name: "abort-finished", Event: events.NameJobFinished,
		Fn: func(_ context.Context, _ events.Envelope, ev *events.JobFinished) error {
			got <- ev.JobID
			return nil
		},
	})
	go func() { _ = second.Run(context.Background()) }()
	<-second.Running()
	t.Cleanup(func() { _ = second.Close() })
	select {
	case id := <-got:
		if id != "stuck" {
			t.Fatalf("redelivered %q, want stuck", id)
		}
	case <-ctx.Done():
		t.Fatal("the aborted message was not redelivered")
	}
	info, err := b.JetStream().Stream(ctx, b.StreamName(events.DomainDLQ))
	if err != nil {
		t.Fatal(err)
	}
	st, err := info.Info(ctx, jetstream.WithSubjectFilter(">"))
	if err != nil {
		t.Fatal(err)
	}
	if st.State.Msgs != 0 {
		t.Fatalf("%d dead letters, want none", st.State.Msgs)
	}
}

type countingObserver struct{ published atomic.Int32 }

func (*countingObserver) Handled(string, time.Duration, error, uint64) {}
func (o *countingObserver) Published(context.Context, events.Name, events.Envelope) {
	o.published.Add(1)
}

// An event republished under the same id (a redelivery after a restart
// handled again) is stored once and counted once: before, each republish
// was counted, and a restart made the rejection counter jump.
func TestDuplicatePublishCountedOnce(t *testing.T) {
	t.Parallel()
	srv := eventstest.Server(t)
	obs := &countingObserver{}
	ctx := eventstest.Context(t, 30*time.Second)
	b, err := bus.Connect(ctx, bus.Config{URL: srv.ClientURL(), Source: "urn:toposched:test", Observer: obs})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	cause := bus.WithCause(ctx, events.Envelope{ID: "the-same-input", CorrelationID: "c"})
	for range 3 {
		if _, err := b.Publish(cause, &events.PlacementRejected{JobID: "j", Reasons: []events.Reason{{Code: "x", Message: "x"}}}); err != nil {
			t.Fatal(err)
		}
	}
	if n := obs.published.Load(); n != 1 {
		t.Fatalf("counted %d publishes of one event, want 1", n)
	}
}
