package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/events/bus"
	"github.com/toposched/toposched/events/eventstest"
	"github.com/toposched/toposched/events/natsserver"
	"github.com/toposched/toposched/services/analysis"
	"github.com/toposched/toposched/services/discovery"
	"github.com/toposched/toposched/services/kube"
	"github.com/toposched/toposched/services/operator"
	"github.com/toposched/toposched/services/optimizer"
)

// runOperator starts every service on srv and returns readiness for it,
// with a clock the test moves.
func runOperator(t *testing.T, srv *natsserver.Server) (*bus.Bus, *readiness, *time.Time) {
	t.Helper()
	return startServices(t, srv, eventstest.Bus(t, srv.ClientURL(), "test"), operator.All)
}

// backgroundOperator runs an operator of cfg on deps until the test ends,
// and returns it once it is ready.
func backgroundOperator(t *testing.T, ctx context.Context, cfg operator.Config, deps operator.Deps) *operator.Operator {
	t.Helper()
	op, err := operator.New(cfg, deps)
	if err != nil {
		t.Fatal(err)
	}
	stop, err := operator.Background(ctx, op)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = stop() })
	return op
}

// startServices starts services on srv over b and returns readiness for
// every service, with a clock the test moves: the durables of a service
// not started are missing.
func startServices(t *testing.T, srv *natsserver.Server, b *bus.Bus, services []string) (*bus.Bus, *readiness, *time.Time) {
	t.Helper()
	ctx := eventstest.Context(t, 30*time.Second)
	file := filepath.Join(t.TempDir(), "cluster.yaml")
	if err := os.WriteFile(file, []byte("name: m\nnodes:\n  - {name: n, count: 2, gpus: 8, gpu_model: A100}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	op := backgroundOperator(t, ctx, operator.Config{Services: services, Discovery: discovery.Config{ClusterFile: file}, Sole: true},
		operator.Deps{Bus: b, Log: slog.New(slog.DiscardHandler)})
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

// /readyz tells the truth: a missing durable consumer or stream makes it
// fail naming what is missing (answers are cached for a second), and it
// passes again, without a restart, once what was missing is back.
func TestReadyChecksStreamsAndConsumers(t *testing.T) {
	srv := eventstest.Server(t)
	// Analysis does not run, so nothing creates its durable again.
	b, r, now := startServices(t, srv, eventstest.Bus(t, srv.ClientURL(), "test"), []string{operator.Discovery, operator.Placement, operator.Optimizer})
	ctx := eventstest.Context(t, 30*time.Second)
	js := b.JetStream()
	jobs := b.StreamName(events.DomainJobs)
	if err := r.check(); err == nil {
		t.Fatal("ready without analysis's durable consumer")
	}
	*now = now.Add(readyCacheFor)
	wantNotReady(t, r, analysis.HandlerSubmitted, jobs, "missing")
	if _, err := js.CreateConsumer(ctx, jobs, jetstream.ConsumerConfig{Durable: analysis.HandlerSubmitted,
		FilterSubject: b.Subjects.Of(events.NameJobSubmitted), AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
		t.Fatal(err)
	}
	if err := r.check(); err == nil {
		t.Error("ready within a second of a not-ready answer, want the cached answer")
	}
	*now = now.Add(readyCacheFor)
	if err := r.check(); err != nil {
		t.Fatalf("not ready once the durable is back: %v", err)
	}

	// A stream no service here consumes, deleted: named until it is
	// created again (serve's KeepStreams does it every HealCheck).
	dlq := b.StreamName(events.DomainDLQ)
	if err := js.DeleteStream(ctx, dlq); err != nil {
		t.Fatal(err)
	}
	*now = now.Add(readyCacheFor)
	wantNotReady(t, r, "stream "+dlq+": missing")
	if err := b.EnsureStreams(ctx); err != nil {
		t.Fatal(err)
	}
	*now = now.Add(readyCacheFor)
	if err := r.check(); err != nil {
		t.Fatalf("not ready once the stream is back: %v", err)
	}
}

// A durable consumer or a stream deleted under the running services comes
// back by itself (the stream with serve's KeepStreams, here looking every
// 100 ms), and readiness with it: it used to fail until a restart.
func TestReadyRecoversFromDeletions(t *testing.T) {
	srv := eventstest.Server(t)
	ctx := eventstest.Context(t, 60*time.Second)
	b, err := bus.Connect(ctx, bus.Config{URL: srv.ClientURL(), Transport: bus.Transport{HealCheck: 100 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	b, r, now := startServices(t, srv, b, operator.All)
	if err := r.check(); err != nil {
		t.Fatalf("not ready after Start: %v", err)
	}
	go b.KeepStreams(ctx)
	js := b.JetStream()
	waitReady := func(what string) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			*now = now.Add(readyCacheFor)
			err := r.check()
			if err == nil {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("after %s, still not ready: %v", what, err)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	jobs := b.StreamName(events.DomainJobs)
	if err := js.DeleteConsumer(ctx, jobs, analysis.HandlerSubmitted); err != nil {
		t.Fatal(err)
	}
	waitReady("analysis's durable consumer was deleted")
	if _, err := js.Consumer(ctx, jobs, analysis.HandlerSubmitted); err != nil {
		t.Errorf("analysis's durable consumer: %v", err)
	}

	// The placement stream, with the optimizer's durable on it.
	placement := b.StreamName(events.DomainPlacement)
	if err := js.DeleteStream(ctx, placement); err != nil {
		t.Fatal(err)
	}
	waitReady("the placement stream was deleted")
	if _, err := js.Consumer(ctx, placement, optimizer.HandlerPlacement); err != nil {
		t.Errorf("the optimizer's durable consumer on the placement stream: %v", err)
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
	if !errors.Is(full, bus.ErrStorageFull) {
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

// A placement replica whose lease is taken away (its entry deleted) steps
// down, campaigns, leads again, and readiness passes again: "no leader
// known yet" lasts only until a replica holds the lease.
func TestReadyRecoversTheLeader(t *testing.T) {
	srv := eventstest.Server(t)
	ctx := eventstest.Context(t, 60*time.Second)
	b := eventstest.Bus(t, srv.ClientURL(), "test")
	file := filepath.Join(t.TempDir(), "cluster.yaml")
	if err := os.WriteFile(file, []byte("name: m\nnodes:\n  - {name: n, count: 2, gpus: 8, gpu_model: A100}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	op := backgroundOperator(t, ctx, operator.Config{Services: operator.All, Discovery: discovery.Config{ClusterFile: file}, LeaseTTL: time.Second},
		operator.Deps{Bus: b, Log: slog.New(slog.DiscardHandler)})
	r := newReadiness(b, op, operator.All, srv)
	now := time.Now()
	r.now = func() time.Time { return now }
	leads := func(terms int) (bool, string) {
		st, ok := op.LeaderStatus()
		if !ok || st.Role != operator.RoleLeader || st.Terms < terms {
			return false, fmt.Sprintf("lease status %+v, want leading term %d", st, terms)
		}
		now = now.Add(readyCacheFor)
		if err := r.check(); err != nil {
			return false, "not ready: " + err.Error()
		}
		return true, ""
	}
	waitUntil := func(cond func() (bool, string)) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			ok, why := cond()
			if ok {
				return
			}
			if time.Now().After(deadline) {
				t.Fatal(why)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitUntil(func() (bool, string) { return leads(1) })
	kv, err := b.JetStream().KeyValue(ctx, operator.LeaseBucket(b.Subjects.Prefix))
	if err != nil {
		t.Fatal(err)
	}
	if err := kv.Delete(ctx, operator.LeaseKey); err != nil {
		t.Fatal(err)
	}
	waitUntil(func() (bool, string) { return leads(2) })
}

// serve's /readyz includes the Kubernetes service it runs: a replica that
// leads it is not ready until its caches are synced (named), and a
// standby is. Before, serve --kubeconfig answered ready while the service
// was still listing the cluster.
func TestReadyIncludesTheKubernetesService(t *testing.T) {
	srv := eventstest.Server(t)
	_, r, now := startServices(t, srv, eventstest.Bus(t, srv.ClientURL(), "test"), operator.All)
	if err := r.check(); err != nil {
		t.Fatalf("not ready: %v", err)
	}
	run := &kubeRun{}
	r.extra = []func() error{run.ready}
	svc, err := kube.New(kube.Config{}, kube.Deps{Kube: fake.NewClientset(), Bus: &bus.Bus{}})
	if err != nil {
		t.Fatal(err)
	}
	run.cur.Store(svc) // leading, its caches not synced
	*now = now.Add(readyCacheFor)
	wantNotReady(t, r, "kubernetes service: syncing")
	run.cur.Store(nil) // a standby
	*now = now.Add(readyCacheFor)
	if err := r.check(); err != nil {
		t.Fatalf("a standby not ready: %v", err)
	}
}
