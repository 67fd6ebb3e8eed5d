package bus_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/events/bus"
	"github.com/toposched/toposched/events/eventstest"
)

// seen counts the jobs a handler was given.
type seen struct {
	mu sync.Mutex
	n  map[string]int
}

func (s *seen) add(id string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.n == nil {
		s.n = map[string]int{}
	}
	s.n[id]++
	return s.n[id]
}

func (s *seen) get(id string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.n[id]
}

// waitUntil polls cond until it holds, failing the test with cond's last
// word after d.
func waitUntil(t *testing.T, d time.Duration, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		ok, why := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %s: %s", d, why)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// runFinished runs fn as the handler of jobs.finished on durable.
func runFinished(t *testing.T, b *bus.Bus, durable string, fn func(ev *events.JobFinished) error) *bus.Router {
	t.Helper()
	r, err := b.NewRouter()
	if err != nil {
		t.Fatal(err)
	}
	bus.Handle(r, bus.Handler[events.JobFinished]{
		Name: durable, Event: events.NameJobFinished,
		Fn: func(_ context.Context, _ events.Envelope, ev *events.JobFinished) error { return fn(ev) },
	})
	ran := make(chan error, 1)
	go func() { ran <- r.Run(context.Background()) }()
	t.Cleanup(func() { _ = r.Close() })
	select {
	case <-r.Running():
	case err := <-ran:
		t.Fatalf("router %s: %v", durable, err)
	}
	return r
}

func finished(id string) *events.JobFinished {
	return &events.JobFinished{JobID: id, Status: events.StatusSucceeded}
}

// A durable consumer deleted under a running service (nats consumer rm) is
// created again with its configuration, and the service keeps handling:
// the message it held unacknowledged at the deletion and the one published
// while the durable was missing are handled, and what it had acknowledged
// before is not delivered again (the new durable starts after the old
// one's ack floor, not at the stream's first message). Before, the
// service's consume ended and nothing more was handled until a restart.
func TestDeletedDurableIsCreatedAgain(t *testing.T) {
	t.Parallel()
	srv := eventstest.Server(t)
	b := eventstest.Bus(t, srv.ClientURL(), "test")
	ctx := eventstest.Context(t, time.Minute)
	js, stream, durable := b.JetStream(), b.StreamName(events.DomainJobs), "test-heal"
	const handled = 20

	// A first run handles and acknowledges 20 jobs.
	var first seen
	r1 := runFinished(t, b, durable, func(ev *events.JobFinished) error { first.add(ev.JobID); return nil })
	var last uint64
	for i := 1; i <= handled; i++ {
		_, seq, err := b.PublishSeq(ctx, finished(fmt.Sprintf("j%d", i)))
		if err != nil {
			t.Fatal(err)
		}
		last = seq
	}
	waitUntil(t, 30*time.Second, func() (bool, string) {
		info, err := js.Consumer(ctx, stream, durable)
		if err != nil {
			return false, err.Error()
		}
		floor := info.CachedInfo().AckFloor.Stream
		return floor == last, fmt.Sprintf("ack floor %d, want %d", floor, last)
	})
	if err := r1.Close(); err != nil {
		t.Fatal(err)
	}

	// The second run holds j21 unacknowledged while the durable is
	// deleted and j22 is published.
	var second seen
	hold := make(chan struct{})
	runFinished(t, b, durable, func(ev *events.JobFinished) error {
		if second.add(ev.JobID) == 1 && ev.JobID == "j21" {
			<-hold
		}
		return nil
	})
	_, seq21, err := b.PublishSeq(ctx, finished("j21"))
	if err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 30*time.Second, func() (bool, string) { return second.get("j21") == 1, "j21 not delivered" })
	if err := js.DeleteConsumer(ctx, stream, durable); err != nil {
		t.Fatal(err)
	}
	_, seq22, err := b.PublishSeq(ctx, finished("j22"))
	if err != nil {
		t.Fatal(err)
	}
	var cfg jetstream.ConsumerConfig
	waitUntil(t, 30*time.Second, func() (bool, string) {
		c, err := js.Consumer(ctx, stream, durable)
		if err != nil {
			return false, "durable not created again: " + err.Error()
		}
		info := c.CachedInfo()
		cfg = info.Config
		return info.Delivered.Stream >= seq22, fmt.Sprintf("the new durable delivered up to %d, want %d", info.Delivered.Stream, seq22)
	})
	close(hold)
	waitUntil(t, 30*time.Second, func() (bool, string) {
		return second.get("j21") == 2 && second.get("j22") == 1,
			fmt.Sprintf("j21 handled %d times, j22 %d; want 2 and 1", second.get("j21"), second.get("j22"))
	})
	for i := 1; i <= handled; i++ {
		if n := second.get(fmt.Sprintf("j%d", i)); n != 0 {
			t.Errorf("j%d, acknowledged before the deletion, was delivered again %d times", i, n)
		}
	}
	if cfg.DeliverPolicy != jetstream.DeliverByStartSequencePolicy || cfg.OptStartSeq != seq21 {
		t.Errorf("the durable created again delivers by %v from %d, want by start sequence from %d (after the ack floor)",
			cfg.DeliverPolicy, cfg.OptStartSeq, seq21)
	}
	filters := cfg.FilterSubjects
	if cfg.FilterSubject != "" {
		filters = []string{cfg.FilterSubject}
	}
	if !slices.Equal(filters, b.Subjects.Filters(events.NameJobFinished)) || cfg.AckPolicy != jetstream.AckExplicitPolicy {
		t.Errorf("the durable created again has filters %q and ack policy %v, not its own", filters, cfg.AckPolicy)
	}
}

// A restart keeps where a durable created again starts: the server
// refuses to change a durable's deliver policy, and a service that asked
// for DeliverAll on it would fail to start.
func TestRestartKeepsADurablesStart(t *testing.T) {
	t.Parallel()
	srv := eventstest.Server(t)
	b := eventstest.Bus(t, srv.ClientURL(), "test")
	ctx := eventstest.Context(t, 30*time.Second)
	js, stream, durable := b.JetStream(), b.StreamName(events.DomainJobs), "test-restart"
	var last uint64
	for i := range 3 {
		_, seq, err := b.PublishSeq(ctx, finished(fmt.Sprintf("old%d", i)))
		if err != nil {
			t.Fatal(err)
		}
		last = seq
	}
	// As a durable created again after a deletion is.
	if _, err := js.CreateConsumer(ctx, stream, jetstream.ConsumerConfig{
		Durable: durable, FilterSubject: b.Subjects.Of(events.NameJobFinished), AckPolicy: jetstream.AckExplicitPolicy,
		DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: last + 1,
	}); err != nil {
		t.Fatal(err)
	}
	var got seen
	runFinished(t, b, durable, func(ev *events.JobFinished) error { got.add(ev.JobID); return nil })
	if _, err := b.Publish(ctx, finished("new")); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 20*time.Second, func() (bool, string) { return got.get("new") == 1, "new not handled" })
	if got.get("old0") != 0 {
		t.Errorf("the restarted service read the stream from its start")
	}
	c, err := js.Consumer(ctx, stream, durable)
	if err != nil {
		t.Fatal(err)
	}
	if cfg := c.CachedInfo().Config; cfg.AckWait != bus.DefaultAckWait || cfg.MaxAckPending != bus.DefaultMaxAckPending {
		t.Errorf("the durable kept ack wait %v and max ack pending %d, want this version's %v and %d",
			cfg.AckWait, cfg.MaxAckPending, bus.DefaultAckWait, bus.DefaultMaxAckPending)
	}
}

// A stream deleted under a running service is created again, empty, by
// KeepStreams; the durable that went with it waits for it and reads the
// new stream from its start.
func TestDeletedStreamIsCreatedAgain(t *testing.T) {
	t.Parallel()
	srv := eventstest.Server(t)
	ctx := eventstest.Context(t, 30*time.Second)
	b, err := bus.Connect(ctx, bus.Config{URL: srv.ClientURL(), Transport: bus.Transport{HealCheck: 50 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	go b.KeepStreams(ctx)
	js, stream, durable := b.JetStream(), b.StreamName(events.DomainJobs), "test-stream"
	var got seen
	runFinished(t, b, durable, func(ev *events.JobFinished) error { got.add(ev.JobID); return nil })
	for _, id := range []string{"a", "b", "c"} {
		if _, err := b.Publish(ctx, finished(id)); err != nil {
			t.Fatal(err)
		}
	}
	waitUntil(t, 20*time.Second, func() (bool, string) { return got.get("c") == 1, "c not handled" })
	if err := js.DeleteStream(ctx, stream); err != nil {
		t.Fatal(err)
	}
	// Publishes find no stream until it is back.
	waitUntil(t, 20*time.Second, func() (bool, string) {
		_, err := b.Publish(ctx, finished("after"))
		return err == nil, fmt.Sprintf("publish: %v", err)
	})
	waitUntil(t, 20*time.Second, func() (bool, string) { return got.get("after") == 1, "after not handled" })
	c, err := js.Consumer(ctx, stream, durable)
	if err != nil {
		t.Fatal(err)
	}
	if p := c.CachedInfo().Config.DeliverPolicy; p != jetstream.DeliverAllPolicy {
		t.Errorf("the durable on the new stream delivers by %v, want all", p)
	}
}

// KeepStreams puts back a stream no consumer of this process reads.
func TestKeepStreamsCreatesAMissingStream(t *testing.T) {
	t.Parallel()
	srv := eventstest.Server(t)
	ctx := eventstest.Context(t, 30*time.Second)
	b, err := bus.Connect(ctx, bus.Config{URL: srv.ClientURL(), Transport: bus.Transport{HealCheck: 20 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	go b.KeepStreams(ctx)
	js, dlq := b.JetStream(), b.StreamName(events.DomainDLQ)
	if err := js.DeleteStream(ctx, dlq); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 20*time.Second, func() (bool, string) {
		_, err := js.Stream(ctx, dlq)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			return false, "stream " + dlq + " still missing"
		}
		return err == nil, fmt.Sprint(err)
	})
}
