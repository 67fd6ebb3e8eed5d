package main

import (
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/events/bus"
	"github.com/toposched/toposched/events/eventstest"
	"github.com/toposched/toposched/events/natsserver"
	"github.com/toposched/toposched/services/analysis"
	"github.com/toposched/toposched/services/operator"
	"github.com/toposched/toposched/services/optimizer"
)

// runOperator starts every service on srv and returns readiness for it,
// with a clock the test moves.
func runOperator(t *testing.T, srv *natsserver.Server) (*bus.Bus, *readiness, *time.Time) {
	t.Helper()
	ctx := eventstest.Context(t, 30*time.Second)
	b := eventstest.Bus(t, srv.ClientURL(), "test")
	file := filepath.Join(t.TempDir(), "cluster.yaml")
	if err := os.WriteFile(file, []byte("name: m\nnodes:\n  - {name: n, count: 2, gpus: 8, gpu_model: A100}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	op, err := operator.Start(ctx, b, operator.Config{Services: operator.All, ClusterFile: file, Sole: true}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = op.Stop() })
	r := newReadiness(b, op, operator.All, srv)
	now := time.Now()
	r.now = func() time.Time { return now }
	return b, r, &now
}

// wantNotReady checks that readiness fails naming every one of want.
func wantNotReady(t *testing.T, r *readiness, want ...string) {
	t.Helper()
	err := r.check()
	if err == nil {
		t.Fatalf("ready, want not ready naming %q", want)
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("not ready: %v; want it to name %q", err, w)
		}
	}
}

// /readyz tells the truth: a deleted durable consumer or stream makes it
// fail naming what is missing; answers are cached for a second.
func TestReadyChecksStreamsAndConsumers(t *testing.T) {
	srv := eventstest.Server(t)
	b, r, now := runOperator(t, srv)
	if err := r.check(); err != nil {
		t.Fatalf("not ready after Start: %v", err)
	}
	ctx := eventstest.Context(t, 10*time.Second)
	js := b.JetStream()
	jobs := b.StreamName(events.DomainJobs)
	if err := js.DeleteConsumer(ctx, jobs, analysis.HandlerSubmitted); err != nil {
		t.Fatal(err)
	}
	if err := r.check(); err != nil {
		t.Errorf("within a second of a ready answer: %v, want the cached ready", err)
	}
	*now = now.Add(readyCacheFor)
	wantNotReady(t, r, analysis.HandlerSubmitted, jobs, "missing")

	placement := b.StreamName(events.DomainPlacement)
	if err := js.DeleteStream(ctx, placement); err != nil {
		t.Fatal(err)
	}
	*now = now.Add(readyCacheFor)
	wantNotReady(t, r, "stream "+placement+": missing", analysis.HandlerSubmitted)
	// The optimizer's consumer of the placement stream went with it, but
	// the stream is what is named.
	if err := r.check(); strings.Contains(err.Error(), optimizer.HandlerPlacement) {
		t.Errorf("not ready: %v; a missing stream's consumers need not be listed", err)
	}
}

// A full JetStream store makes readiness fail naming the storage, and
// freeing it makes it pass again; a publish meanwhile says the storage is
// full.
func TestReadyChecksStorage(t *testing.T) {
	cfg := natsserver.DefaultConfig()
	cfg.Port, cfg.StoreDir, cfg.MaxStore = -1, t.TempDir(), natsserver.MinMaxStore
	srv, err := natsserver.Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	b, r, now := runOperator(t, srv)
	if err := r.check(); err != nil {
		t.Fatalf("not ready after Start: %v", err)
	}
	ctx := eventstest.Context(t, 20*time.Second)
	filler := b.Subjects.Prefix + ".jobs.filler"
	body := make([]byte, 32<<10)
	var full error
	for range 2 * natsserver.MinMaxStore / len(body) {
		if full = b.PublishRaw(ctx, filler, nil, body); full != nil {
			break
		}
	}
	if full == nil {
		t.Fatalf("published %d bytes into a %d-byte store", 2*natsserver.MinMaxStore, natsserver.MinMaxStore)
	}
	if !strings.Contains(full.Error(), "JetStream storage full") {
		t.Errorf("publish into a full store: %v, want 'JetStream storage full'", full)
	}
	*now = now.Add(readyCacheFor)
	wantNotReady(t, r, "JetStream storage full", srv.StoreDir())

	s, err := b.JetStream().Stream(ctx, b.StreamName(events.DomainJobs))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Purge(ctx, jetstream.WithPurgeSubject(filler)); err != nil {
		t.Fatal(err)
	}
	*now = now.Add(readyCacheFor)
	if err := r.check(); err != nil {
		t.Errorf("after the purge: %v, want ready", err)
	}
}

func TestBytesText(t *testing.T) {
	for n, want := range map[uint64]string{0: "0 B", 1023: "1023 B", 1536: "1.5 KiB", 3 << 20: "3.0 MiB", 8 << 30: "8.0 GiB"} {
		if got := bytesText(n); got != want {
			t.Errorf("bytesText(%d) = %q, want %q", n, got, want)
		}
	}
}
