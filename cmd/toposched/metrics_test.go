package main

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/events/bus"
	"github.com/toposched/toposched/events/eventstest"
	"github.com/toposched/toposched/internal/client"
	"github.com/toposched/toposched/metrics"
	"github.com/toposched/toposched/services/discovery"
	"github.com/toposched/toposched/services/operator"
)

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }() // only read
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// TestMetricsEndpoints runs every service with metrics on, places one job and
// rejects another, and reads the listed series from /metrics.
func TestMetricsEndpoints(t *testing.T) {
	srv := eventstest.Server(t)
	m := metrics.New()
	ctx := eventstest.Context(t, 30*time.Second)
	b, err := bus.Connect(ctx, bus.Config{URL: srv.ClientURL(), Source: "urn:toposched:test", Observer: m})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	file := filepath.Join(t.TempDir(), "cluster.yaml")
	if err := os.WriteFile(file, []byte("name: m\nnodes:\n  - {name: n, count: 2, gpus: 8, gpu_model: A100}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	op := backgroundOperator(t, ctx, operator.Config{Services: operator.All, Discovery: discovery.Config{ClusterFile: file}},
		operator.Deps{Bus: b, Log: slog.New(slog.DiscardHandler), ObservePolicyEval: m.PolicyEvaluated})
	m.Watch(operatorStats(op))
	notReady := errors.New("not yet")
	readyErr := notReady
	s, err := metrics.Listen("127.0.0.1:0", m.Handler(func() error { return readyErr }), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	base := "http://" + s.Addr().String()

	if code, body := get(t, base+"/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "not yet") {
		t.Errorf("/readyz before ready: %d %q", code, body)
	}
	readyErr = nil
	if code, _ := get(t, base+"/readyz"); code != http.StatusOK {
		t.Errorf("/readyz: %d", code)
	}
	if code, _ := get(t, base+"/healthz"); code != http.StatusOK {
		t.Errorf("/healthz: %d", code)
	}

	// One job placed, one that can never fit.
	finals := 0
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ready := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- client.Watch(wctx, b, client.FromStart, ready, func(o client.Outcome) error {
			if o.Final() {
				finals++
				if finals == 2 {
					return bus.ErrStop
				}
			}
			return nil
		})
	}()
	<-ready
	for _, j := range []events.JobSubmitted{{JobID: "fits", GPUs: 4}, {JobID: "never", GPUs: 64}} {
		if _, err := client.Submit(ctx, b, &j); err != nil {
			t.Fatal(err)
		}
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	wants := []string{
		"toposched_placement_decisions_total 1",
		"toposched_placement_rejections_total 1",
		"toposched_placement_pending_jobs 0",
		"toposched_placement_decision_latency_seconds_count 1",
		"toposched_policy_evaluation_seconds_count",
		`toposched_handler_duration_seconds_count{handler="placement-jobs-analyzed"} 2`,
		`toposched_handler_errors_total{handler="placement-jobs-analyzed"} 0`,
		`toposched_handler_redeliveries_total{handler="placement-jobs-analyzed"} 0`,
		`toposched_store_gpus{kind="total"} 16`,
		`toposched_store_gpus{kind="free"} 12`,
		`toposched_store_jobs{state="placed"} 1`,
		"toposched_store_nodes 2",
		"toposched_placement_leader 1",
		"go_goroutines",
	}
	// The outcomes are published before their handlers finish (the job
	// recorded, the handler's time observed): read until the series
	// agree, or give up after a while.
	var body string
	lacking := func() []string {
		_, body = get(t, base+"/metrics")
		var out []string
		for _, want := range wants {
			if !strings.Contains(body, want) {
				out = append(out, want)
			}
		}
		return out
	}
	deadline := time.Now().Add(10 * time.Second)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for len(lacking()) > 0 && time.Now().Before(deadline) {
		<-tick.C
	}
	for _, want := range lacking() {
		t.Errorf("/metrics lacks %q", want)
	}
	if t.Failed() {
		t.Logf("/metrics:\n%s", body)
	}
}
