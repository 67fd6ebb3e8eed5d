package operator_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/events/bus"
	"github.com/toposched/toposched/events/eventstest"
	"github.com/toposched/toposched/internal/client"
	"github.com/toposched/toposched/services/discovery"
	"github.com/toposched/toposched/services/operator"
)

// BenchmarkEndToEnd measures sustained decisions per second through NATS:
// a burst of b.N one-GPU jobs published as fast as JetStream acks them, all
// services in one process on a file-backed embedded server, until the last
// decision is read back. latency-p50/p99 are from publish to decision seen.
func BenchmarkEndToEnd(b *testing.B) {
	dir := b.TempDir()
	srv := eventstest.ServerAt(b, filepath.Join(dir, "nats"))
	bs := eventstest.Bus(b, srv.ClientURL(), "bench")
	file := filepath.Join(dir, "cluster.yaml")
	if err := os.WriteFile(file, []byte("nodes:\n  - {name: n, count: 1250, gpus: 8, gpu_model: A100}\n"), 0o600); err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	op, stop, err := operator.StartOn(b, ctx, bs, operator.Config{Services: operator.All, Discovery: discovery.Config{ClusterFile: file}}, slog.New(slog.DiscardHandler))
	if err != nil {
		b.Fatal(err)
	}
	defer func() {
		if err := stop(); err != nil {
			b.Error(err)
		}
	}()
	for {
		if total, _ := op.PlacementService().Store().Snapshot().Capacity(""); total == 10000 {
			break
		}
		time.Sleep(10 * time.Millisecond) // setup only, outside the timed part
	}
	n := min(b.N, 9000)
	sent := make([]time.Time, n)
	lat := make([]time.Duration, 0, n)
	ready := make(chan struct{})
	done := make(chan struct{})
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		defer close(done)
		_ = client.Watch(wctx, bs, client.FromNow, ready, func(o client.Outcome) error {
			var i int
			if o.Decided == nil {
				return nil
			}
			if _, err := fmt.Sscanf(o.JobID(), "b%d", &i); err != nil {
				return nil
			}
			lat = append(lat, time.Since(sent[i]))
			if len(lat) == n {
				return bus.ErrStop
			}
			return nil
		})
	}()
	<-ready
	b.ResetTimer()
	start := time.Now()
	for i := range n {
		sent[i] = time.Now()
		if _, err := client.Submit(ctx, bs, &events.JobSubmitted{JobID: fmt.Sprintf("b%d", i), GPUs: 1}); err != nil {
			b.Fatal(err)
		}
	}
	<-done
	elapsed := time.Since(start)
	b.StopTimer()
	if len(lat) != n {
		b.Fatalf("%d of %d decided", len(lat), n)
	}
	b.ReportMetric(float64(n)/elapsed.Seconds(), "decisions/s")
	b.ReportMetric(float64(percentile(lat, 50).Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(percentile(lat, 99).Microseconds())/1000, "p99-ms")
}

func percentile(d []time.Duration, p int) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[(len(s)-1)*p/100]
}
