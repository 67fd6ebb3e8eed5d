package optimizer

import (
	"context"
	"fmt"
	"testing"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/events/bus"
	"github.com/toposched/toposched/internal/collective"
	"github.com/toposched/toposched/internal/placer"
)

// a100x4 is an 8x A100 NVSwitch node with 4x 100 Gb/s NICs, two GPUs per
// NIC (issue 4's nodes).
func a100x4(name string, position int) events.TopologyNode {
	n := collective.BuildNode(collective.NodeSpec{Name: name, GPUs: 8, Model: "A100-SXM4-80GB", NVLinks: 12, NVLinkGen: 3, PCIeGen: 4, NICs: 4, NICGbps: 100})
	ev := n.Event()
	ev.Position = position
	ev.GPUModel = "A100-SXM4-80GB"
	return ev
}

// running runs an optimizer on c's bus (Run: a rebuild, then the
// handlers) until the test ends.
func (c *cluster) running() *Service {
	c.t.Helper()
	o := c.optimizer(nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	var runErr error
	go func() {
		defer close(done)
		runErr = o.Run(ctx)
	}()
	c.t.Cleanup(func() {
		cancel()
		<-done
		if runErr != nil {
			c.t.Errorf("optimizer: %v", runErr)
		}
	})
	select {
	case <-o.Ready():
	case <-done:
		c.t.Fatalf("optimizer stopped before it was ready: %v", runErr)
	case <-c.ctx.Done():
		c.t.Fatal("optimizer did not start")
	}
	return o
}

// follow collects the events of one name published from now on.
func follow[T any](c *cluster, name events.Name) <-chan *T {
	c.t.Helper()
	out := make(chan *T, 64)
	ready := make(chan struct{})
	ctx, cancel := context.WithCancel(c.ctx)
	c.t.Cleanup(cancel)
	go func() {
		_ = c.b.Follow(ctx, name.Domain(), []string{c.b.Subjects.Of(name)}, ready, func(r bus.Record) error {
			v := new(T)
			if err := bus.Decode(r.Name, r.Body, v); err != nil {
				c.t.Errorf("follow %s: %v", name, err)
				return nil
			}
			out <- v
			return nil
		})
	}()
	select {
	case <-ready:
	case <-c.ctx.Done():
		c.t.Fatal("follow did not start")
	}
	return out
}

// next waits for the first value from ch that match accepts.
func next[T any](c *cluster, ch <-chan *T, match func(*T) bool) *T {
	c.t.Helper()
	for {
		select {
		case v := <-ch:
			if match(v) {
				return v
			}
		case <-c.ctx.Done():
			c.t.Fatal("timed out waiting for an event")
			return nil
		}
	}
}

func forJob[T interface {
	*events.RuntimeTuning | *events.RuntimeDiagnosis
}](job string) func(T) bool {
	return func(v T) bool {
		switch e := any(v).(type) {
		case *events.RuntimeTuning:
			return e.JobID == job
		case *events.RuntimeDiagnosis:
			return e.JobID == job
		}
		return false
	}
}

// fourNodeCluster is issue 4's cluster: n1, n2 under leafA and n3, n4
// under leafB, enumerated n1, n3, n2, n4 so that blind first fit
// alternates leaves.
func fourNodeCluster(t *testing.T, strategy string) *cluster {
	fab := twoLeaves()
	return newCluster(t, strategy, []events.TopologyNode{a100x4("n1", 0), a100x4("n3", 1), a100x4("n2", 2), a100x4("n4", 3)}, &fab)
}

// gpt2 is GPT-2 1.5B trained with DDP in fp16 on 32 GPUs: one 3 GB
// gradient all-reduce per step.
func gpt2(id string, gpus int) events.JobSubmitted {
	return events.JobSubmitted{JobID: id, GPUs: gpus, Strategy: events.StrategyDDP,
		Model: &events.Model{Parameters: 1_500_000_000, Dtype: events.DtypeFP16}, StepComputeSeconds: 0.5}
}

// Every decision is followed by a runtime.tuning; the ring→tree case of
// issue 4 (four nodes whose rings share 4:3 oversubscribed uplinks,
// ranks alternating leaves) gets NCCL_ALGO=allreduce:tree with its gain,
// and a job inside one node gets no recommendation, only bindings.
func TestTuningOnEveryDecision(t *testing.T) {
	t.Parallel()
	c := fourNodeCluster(t, placer.StrategyBlind)
	c.running()
	tunings := follow[events.RuntimeTuning](c, events.NameRuntimeTuning)

	_, d := c.submit(gpt2("gpt2", 32))
	if d.Ranks[8].Node != "n3" {
		t.Fatalf("blind order: rank 8 on %s, want n3 (leaves alternating)", d.Ranks[8].Node)
	}
	tu := next(c, tunings, forJob[*events.RuntimeTuning]("gpt2"))
	if got := tu.Env.All["NCCL_ALGO"]; got != "allreduce:tree" {
		t.Errorf("NCCL_ALGO %q, want allreduce:tree; tuning %+v", got, tu)
	}
	var rec *events.Recommendation
	for i := range tu.Recommendations {
		if tu.Recommendations[i].Kind == events.TuningAlgorithm {
			rec = &tu.Recommendations[i]
		}
	}
	if rec == nil || rec.Group != "dp" || rec.Algorithm != "tree" || rec.DefaultAlgorithm != "ring" || rec.PredictedGainSeconds <= 0 ||
		rec.BytesRange.Min > 3e9 || rec.BytesRange.Max < 3e9 {
		t.Fatalf("recommendation %+v", rec)
	}
	t.Logf("gpt2: %s (gain %.3f s/step)", rec.Reason, rec.PredictedGainSeconds)
	if tu.PredictedCommSecondsPerStep >= tu.DefaultCommSecondsPerStep {
		t.Errorf("predicted %.3f s, default %.3f s", tu.PredictedCommSecondsPerStep, tu.DefaultCommSecondsPerStep)
	}
	if got := tu.Env.Ranks["2"]["NCCL_IB_HCA"]; got != "=mlx5_1" {
		t.Errorf("rank 2 NCCL_IB_HCA %q, want =mlx5_1 (GPU 2's nearest NIC)", got)
	}
	// These nodes report no bus ids, so placement has no NCCL XML for them.
	if len(tu.Files) != 0 || tu.Env.Nodes != nil {
		t.Errorf("topology files %d, env %v", len(tu.Files), tu.Env.Nodes)
	}
	c.finish("gpt2")

	// One node: NVSwitch, nothing the fabric hides from NCCL.
	c.submit(events.JobSubmitted{JobID: "bert", GPUs: 8, Strategy: events.StrategyDDP,
		Model: &events.Model{Parameters: 340_000_000, Dtype: events.DtypeFP32}})
	tu = next(c, tunings, forJob[*events.RuntimeTuning]("bert"))
	for _, r := range tu.Recommendations {
		if r.Kind == events.TuningAlgorithm {
			t.Errorf("one-node job: recommendation %+v", r)
		}
	}
	if tu.Env.All["NCCL_ALGO"] != "" || len(tu.Groups) != 1 || tu.Groups[0].Ranks != 8 {
		t.Errorf("one-node job: %+v", tu)
	}
}

// A job whose latency term shows in its gradient all-reduce is told a
// bucket size; a decision tuned twice (a redelivery) publishes the same
// event id.
func TestBucketAndRedelivery(t *testing.T) {
	t.Parallel()
	c := fourNodeCluster(t, "")
	o := c.optimizer(nil)
	// Many small all-reduce calls across 4 nodes: 8 B parameters in bf16
	// are 16 GB of gradients, 640 calls of 25 MiB.
	a, d := c.submit(events.JobSubmitted{JobID: "big", GPUs: 32, Strategy: events.StrategyDDP,
		Model: &events.Model{Parameters: 8_000_000_000, Dtype: events.DtypeBF16}})
	_ = a
	ev, err := Tuning(c.place.Store().Snapshot(), nil, d, a)
	if err != nil {
		t.Fatal(err)
	}
	var bucket *events.Recommendation
	for i := range ev.Recommendations {
		if ev.Recommendations[i].Kind == events.TuningBucket {
			bucket = &ev.Recommendations[i]
		}
	}
	t.Logf("bucket: %+v", bucket)
	if bucket != nil && (ev.Env.All[events.EnvBucketCapMB] != fmt.Sprint(bucket.BytesRange.Max>>20) || bucket.PredictedGainSeconds <= 0) {
		t.Errorf("bucket %+v, env %v", bucket, ev.Env.All)
	}

	tunings := follow[events.RuntimeTuning](c, events.NameRuntimeTuning)
	env := events.Envelope{ID: "decision-1"}
	for range 2 {
		if err := o.OnDecided(bus.WithCause(c.ctx, env), env, d); err != nil {
			t.Fatal(err)
		}
	}
	next(c, tunings, forJob[*events.RuntimeTuning]("big"))
	info, err := c.b.JetStream().Stream(c.ctx, c.b.StreamName(events.DomainRuntime))
	if err != nil {
		t.Fatal(err)
	}
	if n := info.CachedInfo().State.Msgs; n != 1 {
		t.Errorf("runtime stream holds %d messages after a redelivery, want 1", n)
	}
}

// A node whose NCCL topology XML is known gets NCCL_TOPO_FILE and the file
// to write; node names become safe file names.
func TestTopoFileBinding(t *testing.T) {
	t.Parallel()
	numa := 1
	d := &events.PlacementDecided{JobID: "j:1", Nodes: []events.NodePlacement{{Node: "a/b", NCCLTopoXML: "<system/>"}, {Node: "c"}},
		Ranks: []events.RankPlacement{{Rank: 0, Node: "a/b", NUMA: &numa, NIC: "mlx5_0"}, {Rank: 1, Node: "c", NIC: "mlx5_0"}}}
	ev := &events.RuntimeTuning{}
	bindings(ev, d)
	want := "/tmp/toposched/j_1/a_b.xml"
	if len(ev.Files) != 1 || ev.Files[0].Path != want || ev.Env.Nodes["a/b"]["NCCL_TOPO_FILE"] != want {
		t.Errorf("files %+v, nodes env %v", ev.Files, ev.Env.Nodes)
	}
	if ev.Env.Ranks["0"][events.EnvNumactl] != "--cpunodebind=1 --membind=1" || ev.Env.Ranks["0"]["NCCL_IB_HCA"] != "" {
		t.Errorf("ranks env %v (one NIC per node: nothing to pin)", ev.Env.Ranks)
	}
}
