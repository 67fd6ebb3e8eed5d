package optimizer

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/events/bus"
	"github.com/toposched/toposched/events/eventstest"
	"github.com/toposched/toposched/internal/gpuspeed"
	"github.com/toposched/toposched/internal/pattern"
	"github.com/toposched/toposched/internal/store"
	"github.com/toposched/toposched/internal/topology"
)

// benchCluster is nodes 8-GPU a100x4 nodes, 8 per leaf under one spine
// (leaf uplinks 2:1 oversubscribed), and a job of gpus GPUs placed node
// by node: megatron tp=8 within nodes, dp across them, GPT-3 13B shape.
func benchCluster(b *testing.B, gpus int) (*store.Snapshot, *topology.Fabric, *events.PlacementDecided, *events.JobAnalyzed) {
	b.Helper()
	st, err := store.New()
	if err != nil {
		b.Fatal(err)
	}
	nodes := gpus / 8
	fab := events.TopologyFabric{Cluster: "bench", Switches: []events.Switch{{Name: "spine", Tier: "spine"}}}
	for i := range nodes {
		name := fmt.Sprintf("n%03d", i)
		if err := st.UpsertNode(a100x4(name, i)); err != nil {
			b.Fatal(err)
		}
		leaf := i / 8
		if leaf >= len(fab.Switches)-1 {
			fab.Switches = append(fab.Switches, events.Switch{Name: fmt.Sprintf("leaf%02d", leaf), Tier: "leaf", LinkGbps: 100, Oversubscription: 2})
			fab.Switches[0].Switches = append(fab.Switches[0].Switches, fmt.Sprintf("leaf%02d", leaf))
		}
		fab.Switches[leaf+1].Nodes = append(fab.Switches[leaf+1].Nodes, name)
	}
	f, err := topology.NewFabric(fab)
	if err != nil {
		b.Fatal(err)
	}
	tp := min(8, gpus)
	a, reasons := pattern.Analyze(events.JobSubmitted{JobID: "bench", GPUs: gpus, Strategy: events.StrategyMegatron,
		Parallelism: &events.Parallelism{TP: tp},
		Model: &events.Model{Parameters: 13_000_000_000, Layers: 40, HiddenSize: 5120, Heads: 40, SeqLen: 2048,
			MicroBatchSize: 1, GlobalBatchSize: 1024, Dtype: events.DtypeBF16}})
	if len(reasons) > 0 {
		b.Fatal(reasons)
	}
	d := &events.PlacementDecided{JobID: "bench"}
	for r := range gpus {
		d.Ranks = append(d.Ranks, events.RankPlacement{Rank: r, Node: fmt.Sprintf("n%03d", r/8), GPU: r % 8, LocalRank: r % 8, NIC: fmt.Sprintf("mlx5_%d", r%8/2)})
		if r%8 == 0 {
			d.Nodes = append(d.Nodes, events.NodePlacement{Node: fmt.Sprintf("n%03d", r/8), GPUs: []int{0, 1, 2, 3, 4, 5, 6, 7}, CUDAVisibleDevices: "0,1,2,3,4,5,6,7"})
		}
	}
	return st.Snapshot(), f, d, &a
}

// BenchmarkTuning is the tuning of one decision: phases from the analysis,
// the cost model per algorithm with and without the fabric, the search over
// NCCL_ALGO/NCCL_PROTO subsets, bucket size and bindings.
func BenchmarkTuning(b *testing.B) {
	for _, gpus := range []int{8, 64, 512} {
		b.Run(fmt.Sprintf("gpus=%d", gpus), func(b *testing.B) {
			snap, f, d, a := benchCluster(b, gpus)
			b.ReportAllocs()
			for b.Loop() {
				if _, err := Tuning(snap, f, d, a); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkTelemetryIngest is telemetry through NATS: published with
// PubAck by a reporter, consumed by the optimizer's durable consumer,
// checked, diagnosed (the same finding each time, so nothing is
// published back) and acked. It reports events/s end to end.
func BenchmarkTelemetryIngest(b *testing.B) { benchTelemetry(b, false, "") }

// With online calibration on: every report is an observation (the bench
// job's groups are bandwidth bound), moves go to a calibrator that keeps
// them.
func BenchmarkTelemetryIngestOnline(b *testing.B) { benchTelemetry(b, true, "") }

// With online calibration on and compute weighed by GPU model, on the
// H100 as reference: every report is also an observation of the A100's
// compute factor (aware.EstimateCompute on the job's 64 GPUs).
func BenchmarkTelemetryIngestOnlineCompute(b *testing.B) { benchTelemetry(b, true, "h100") }

func benchTelemetry(b *testing.B, online bool, computeRef string) {
	srv := eventstest.Server(b)
	bs := eventstest.Bus(b, srv.ClientURL(), "bench")
	ctx := context.Background()
	_, f, d, a := benchCluster(b, 64)
	o, err := New(Config{ComputeReference: computeRef}, Deps{Publish: bs, Read: bs, Subjects: bs.Subjects})
	if err != nil {
		b.Fatal(err)
	}
	// The optimizer's state, set by hand: the nodes, the fabric and one
	// live, tuned job.
	st := o.store
	for i := range 8 {
		if err := st.UpsertNode(a100x4(fmt.Sprintf("n%03d", i), i)); err != nil {
			b.Fatal(err)
		}
	}
	o.fabric = f
	o.applyDecided(d)
	lj := o.live["bench"]
	lj.spec = a
	tu, err := Tuning(st.Snapshot(), f, d, a)
	if err != nil {
		b.Fatal(err)
	}
	lj.tuning, lj.finding = tu, events.FindingAsPredicted
	step := 2 * tu.PredictedCommSecondsPerStep
	if computeRef != "" {
		// The job's time on the reference, so that its A100 compute is
		// predicted as the reports measure it (a factor of 1: no move).
		f, _ := gpuspeed.Factor("A100", computeRef)
		spec := *a
		spec.Job.StepComputeSeconds = step / 2 / f
		lj.spec = &spec
	}
	if online {
		fake := &fakeCalibrator{o: o}
		o.CalibrateOnline(fake)
		if _, err := o.retune(lj); err != nil {
			b.Fatal(err)
		}
		lj.finding = events.FindingAsPredicted
	}

	handled := make(chan error, 1<<16)
	r, err := bs.NewRouter()
	if err != nil {
		b.Fatal(err)
	}
	bus.Handle(r, bus.Handler[events.RuntimeTelemetry]{Name: HandlerTelemetry, Event: events.NameRuntimeTelemetry,
		Fn: func(ctx context.Context, env events.Envelope, t *events.RuntimeTelemetry) error {
			err := o.OnTelemetry(ctx, env, t)
			handled <- err
			return err
		}})
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = r.Run(rctx) }()
	b.Cleanup(func() { _ = r.Close(); cancel(); <-done })
	<-r.Running()
	pred := tu.Groups[0]
	// A step twice its predicted communication: a report CheckTelemetry
	// takes (a group longer than the step is refused, and then nothing
	// past the check would be measured).
	tel := &events.RuntimeTelemetry{JobID: "bench", StepSeconds: step, ComputeSeconds: step / 2,
		Groups: []events.GroupTelemetry{{Group: pred.Name, Collective: pred.Collective, Seconds: pred.SecondsPerStep}}}
	b.ResetTimer()
	start := time.Now()
	for i := 0; b.Loop(); i++ {
		tel.Step = int64(i)
		if _, err := bs.Publish(ctx, tel); err != nil {
			b.Fatal(err)
		}
	}
	n := b.N
	for range n {
		if err := <-handled; err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(n)/time.Since(start).Seconds(), "events/s")
	if online {
		o.mu.Lock()
		pending := 0
		for _, v := range o.online.Pending() {
			pending += v
		}
		o.mu.Unlock()
		b.ReportMetric(float64(pending), "observations-pending")
		if o.onlineCompute != nil {
			b.ReportMetric(float64(o.onlineCompute.Pending()["A100 SXM 80GB"]), "compute-jobs-pending")
		}
	}
}
