package operator

import (
	"context"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/toposched/toposched/events/eventstest"
)

// TestLead: of two processes leading one key, one runs its function at a
// time; when the leader stops gracefully, the other takes over at once
// (the lease is handed over, not left to lapse), and placement's key is
// not for Lead.
func TestLead(t *testing.T) {
	srv := eventstest.Server(t)
	ctx := eventstest.Context(t, 60*time.Second)
	log := slog.New(slog.DiscardHandler)
	var running atomic.Int32
	var overlap atomic.Bool
	started := make(chan string, 4)
	lead := func(ctx context.Context, name string) chan error {
		b := eventstest.Bus(t, srv.ClientURL(), name)
		done := make(chan error, 1)
		go func() {
			done <- Lead(ctx, b, "kube", name, time.Minute, log, func(ctx context.Context) error {
				if running.Add(1) > 1 {
					overlap.Store(true)
				}
				defer running.Add(-1)
				started <- name
				<-ctx.Done()
				return nil
			})
		}()
		return done
	}
	ctx1, stop1 := context.WithCancel(ctx)
	done1 := lead(ctx1, "r1")
	if got := <-started; got != "r1" {
		t.Fatalf("%s leads first, want r1", got)
	}
	ctx2, stop2 := context.WithCancel(ctx)
	done2 := lead(ctx2, "r2")
	stop1()
	if err := <-done1; err != nil {
		t.Fatal(err)
	}
	select {
	case got := <-started:
		if got != "r2" {
			t.Fatalf("%s leads second, want r2", got)
		}
	case <-ctx.Done():
		t.Fatal("r2 did not lead after r1 stopped (the lease TTL is a minute: it was not handed over)")
	}
	if overlap.Load() {
		t.Fatal("two replicas ran at once")
	}
	b := eventstest.Bus(t, srv.ClientURL(), "r3")
	if err := Lead(ctx, b, LeaseKey, "r3", time.Minute, log, func(context.Context) error { return nil }); err == nil {
		t.Fatal("Lead took placement's lease key")
	}
	stop2()
	if err := <-done2; err != nil {
		t.Fatal(err)
	}
}
