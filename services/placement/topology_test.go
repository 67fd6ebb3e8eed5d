package placement_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/events/bus"
	"github.com/toposched/toposched/events/eventstest"
	"github.com/toposched/toposched/internal/fixtures"
	"github.com/toposched/toposched/internal/store"
	"github.com/toposched/toposched/services/placement"
)

// The store ends where the topology stream ends, whatever the order in
// which its consumers deliver: a node's report is its whole description
// (every GPU it lists healthy is healthy again), so a report that
// overtook the health change published after it would put a failed GPU
// back into placement. Rounds of report-then-failure go in before the
// service starts (its rebuild applies them, and its consumer delivers them
// again) and after it is ready; only the last failure may remain.
// With one consumer per event type it failed 3 runs of 10.
func TestTopologyAppliesInStreamOrder(t *testing.T) {
	t.Parallel()
	srv := eventstest.Server(t)
	b := eventstest.Bus(t, srv.ClientURL(), "test")
	ctx := eventstest.Context(t, 60*time.Second)
	const rounds = 20
	last := -1
	round := func(i int) {
		t.Helper()
		n := fixtures.PlainNode("n1", "A100", 8)
		if _, err := b.Publish(ctx, &n); err != nil {
			t.Fatal(err)
		}
		h := events.TopologyHealth{Node: "n1", Component: events.ComponentGPU, ID: fmt.Sprint(i % 8),
			Health: events.HealthUnhealthy, Reason: "xid 79", ObservedAt: time.Now().UTC()}
		if _, err := b.Publish(ctx, &h); err != nil {
			t.Fatal(err)
		}
		last = i % 8
	}
	for i := range rounds {
		round(i)
	}
	s := placement.NewOnBus(t, b, placement.Config{})
	run(t, ctx, s)
	for i := rounds; i < 2*rounds+3; i++ {
		round(i)
	}
	awaitTopologyConsumed(t, ctx, b)

	for _, g := range s.Store().Snapshot().GPUs("n1") {
		if want := g.Index != last; g.Healthy != want {
			t.Errorf("GPU n1/%d healthy=%v, want %v: only GPU %d's failure comes after the last report",
				g.Index, g.Healthy, want, last)
		}
	}
}

// awaitTopologyConsumed waits until every durable consumer of the topology
// stream has acknowledged every message up to the stream's last sequence
// as read now (the durables take the whole domain, so their ack floors
// reach it). A consumer's NumPending is no such measure: nats-server
// counts a stored message as pending for a consumer only once it has
// signalled the consumers of it, on a goroutine of its own after the
// publisher has its acknowledgement. Waiting for NumPending and
// NumAckPending to be 0 failed about 1 run in 50 on a loaded machine: a
// consumer read "0 pending, 0 unacknowledged" with its ack floor at 40 of
// the stream's 86, and the store was checked before the last events came.
func awaitTopologyConsumed(t *testing.T, ctx context.Context, b *bus.Bus) {
	t.Helper()
	stream, err := b.JetStream().Stream(ctx, b.StreamName(events.DomainTopology))
	if err != nil {
		t.Fatal(err)
	}
	last := stream.CachedInfo().State.LastSeq
	why := "no durable consumer"
	for ctx.Err() == nil {
		durables, drained := 0, true
		for name := range stream.ConsumerNames(ctx).Name() {
			c, err := stream.Consumer(ctx, name)
			if err != nil {
				continue // an ephemeral replay's, gone since the listing
			}
			ci := c.CachedInfo()
			if ci.Config.Durable == "" {
				continue
			}
			durables++
			if ci.AckFloor.Stream < last {
				drained = false
				why = fmt.Sprintf("consumer %s: acknowledged up to sequence %d of %d", name, ci.AckFloor.Stream, last)
			}
		}
		if durables > 0 && drained {
			return
		}
		select {
		case <-ctx.Done():
		case <-time.After(20 * time.Millisecond):
		}
	}
	t.Fatalf("topology stream not consumed: %s", why)
}

// A job that finds no node catches up with the topology stream itself
// (decide); the topology consumer then skips those events, but the rest
// of the queue is retried on them once: here a waiting job fits on the
// node the catch-up found.
func TestCatchUpRetriesTheQueue(t *testing.T) {
	t.Parallel()
	srv := eventstest.Server(t)
	b := eventstest.Bus(t, srv.ClientURL(), "test")
	ctx := eventstest.Context(t, 30*time.Second)
	s := placement.NewOnBus(t, b, placement.Config{}) // no handlers running: the test delivers
	publish := func(name string) uint64 {
		t.Helper()
		n := fixtures.PlainNode(name, "A100", 8)
		_, seq, err := b.PublishSeq(ctx, &n)
		if err != nil {
			t.Fatal(err)
		}
		return seq
	}
	seq1 := publish("n1")
	n1 := fixtures.PlainNode("n1", "A100", 8)
	if err := s.OnNode(bus.WithStreamSeq(ctx, seq1), events.Envelope{}, &n1); err != nil {
		t.Fatal(err)
	}
	for i, job := range []events.JobSubmitted{
		{JobID: "first", GPUs: 8, GPUModel: "A100"},
		{JobID: "waiter", GPUs: 8, GPUModel: "A100"},
	} {
		if err := s.OnAnalyzed(ctx, events.Envelope{ID: fmt.Sprint("a", i)}, analyzed(t, job)); err != nil {
			t.Fatal(err)
		}
	}
	if got := state(s, "waiter"); got != store.JobPending {
		t.Fatalf("waiter is %s, want pending behind first", got)
	}
	seq2 := publish("n2")
	// Twelve GPUs are more than the one node known: the job catches up,
	// finds n2, and waits (8 free); waiter is not retried by it.
	if err := s.OnAnalyzed(ctx, events.Envelope{ID: "a2"}, analyzed(t, events.JobSubmitted{JobID: "big", GPUs: 12, GPUModel: "A100"})); err != nil {
		t.Fatal(err)
	}
	if got := state(s, "big"); got != store.JobPending {
		t.Fatalf("big is %s, want pending", got)
	}
	n2 := fixtures.PlainNode("n2", "A100", 8)
	if err := s.OnNode(bus.WithStreamSeq(ctx, seq2), events.Envelope{}, &n2); err != nil {
		t.Fatal(err)
	}
	if got := state(s, "waiter"); got != store.JobPlaced {
		t.Fatalf("waiter is %s after n2's report reached the consumer, want placed on n2", got)
	}
}

// run runs s until the test ends and returns once it is ready; the
// context it runs under ends with the test.
func run(t *testing.T, ctx context.Context, s *placement.Service) context.Context {
	t.Helper()
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- s.Run(rctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("placement: %v", err)
		}
	})
	select {
	case <-s.Ready():
	case err := <-done:
		t.Fatalf("placement stopped: %v", err)
	}
	return rctx
}
