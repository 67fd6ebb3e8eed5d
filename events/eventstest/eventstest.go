// Package eventstest gives tests a real embedded NATS server with JetStream
// on a free loopback port, and buses connected to it.
package eventstest

import (
	"context"
	"testing"
	"time"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/events/bus"
	"github.com/toposched/toposched/events/natsserver"
)

// Server starts an embedded NATS server for the test, on 127.0.0.1 and a
// free port, with its streams in a temporary directory. It stops when the
// test ends.
func Server(t testing.TB) *natsserver.Server {
	t.Helper()
	return ServerAt(t, t.TempDir())
}

// ServerAt is Server with a given store directory, to restart a server on
// the same streams.
func ServerAt(t testing.TB, dir string) *natsserver.Server {
	t.Helper()
	cfg := natsserver.DefaultConfig()
	cfg.Port, cfg.StoreDir = -1, dir
	cfg.MaxMemory, cfg.MaxStore = 64<<20, 1<<30
	srv, err := natsserver.Start(cfg)
	if err != nil {
		t.Fatalf("embedded nats: %v", err)
	}
	t.Cleanup(srv.Shutdown)
	return srv
}

// Bus connects a bus to url under prefix "toposched", closed when the test
// ends.
func Bus(t testing.TB, url, source string) *bus.Bus {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, err := bus.Connect(ctx, bus.Config{URL: url, Source: "urn:toposched:" + source})
	if err != nil {
		t.Fatalf("bus: %v", err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b
}

// Context is a test context that ends with the test or after d.
func Context(t testing.TB, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// DeleteConsumers deletes every consumer of the domain's stream and
// returns how many there were: an ordered consumer then resets, as it
// does on a loaded machine that misses its heartbeats.
func DeleteConsumers(t testing.TB, ctx context.Context, b *bus.Bus, domain events.Domain) int {
	t.Helper()
	st, err := b.JetStream().Stream(ctx, b.StreamName(domain))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for info := range st.ListConsumers(ctx).Info() {
		if err := st.DeleteConsumer(ctx, info.Name); err != nil {
			t.Fatal(err)
		}
		n++
	}
	return n
}
