package optimizer

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/events/bus"
	"github.com/toposched/toposched/events/eventstest"
	"github.com/toposched/toposched/internal/formats/clusterfile"
	"github.com/toposched/toposched/internal/pattern"
)

func decision(job string, gpus ...int) *events.PlacementDecided {
	d := &events.PlacementDecided{JobID: job}
	for i, g := range gpus {
		d.Ranks = append(d.Ranks, events.RankPlacement{Rank: i, Node: "n", GPU: g, LocalRank: i})
	}
	return d
}

func TestWorkingSetAndAudit(t *testing.T) {
	t.Parallel()
	var logs bytes.Buffer
	s, err := New(Config{}, Deps{Publish: &eventstest.Memory{}, Read: &eventstest.Memory{}, Log: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		decided  *events.PlacementDecided
		released string
		jobs     int
		gpus     int
	}{
		{decided: decision("a", 0, 1), jobs: 1, gpus: 2},
		{decided: decision("a", 0, 1), jobs: 1, gpus: 2}, // redelivery
		{decided: decision("b", 2, 3), jobs: 2, gpus: 4},
		{released: "a", jobs: 1, gpus: 2},
		{released: "a", jobs: 1, gpus: 2},
		{decided: decision("c", 0), jobs: 2, gpus: 3},
	}
	for i, st := range steps {
		s.mu.Lock()
		if st.decided != nil {
			s.applyPlacement(0, st.decided)
		} else {
			s.applyPlacement(0, &events.PlacementReleased{JobID: st.released})
		}
		s.mu.Unlock()
		if j, g := s.Live(); j != st.jobs || g != st.gpus {
			t.Fatalf("step %d: %d jobs on %d GPUs, want %d on %d", i, j, g, st.jobs, st.gpus)
		}
	}
	if strings.Contains(logs.String(), "double booking") {
		t.Fatalf("false alarm: %s", logs.String())
	}
	s.mu.Lock()
	s.applyPlacement(0, decision("d", 3))
	s.mu.Unlock()
	if !strings.Contains(logs.String(), "double booking") || !strings.Contains(logs.String(), "other_job_id=b") {
		t.Fatalf("double booking not reported: %s", logs.String())
	}
}

// cluster is a test cluster on a real embedded NATS: nodes and fabric in
// the topology stream, and a decider making placement's decisions into the
// placement stream.
type cluster struct {
	t     *testing.T
	b     *bus.Bus
	ctx   context.Context
	place *decider
}

// twoLeaves is four dgx-a100 nodes, two under each of two leaves whose
// uplinks are 4:3 oversubscribed (issue 4's four-node case).
func twoLeaves() events.TopologyFabric {
	return events.TopologyFabric{Cluster: "c", Switches: []events.Switch{
		{Name: "spine", Tier: "spine", Switches: []string{"leafA", "leafB"}},
		{Name: "leafA", Tier: "leaf", Nodes: []string{"n1", "n2"}, LinkGbps: 100, Uplinks: 6, UplinkGbps: 100, Oversubscription: 4.0 / 3},
		{Name: "leafB", Tier: "leaf", Nodes: []string{"n3", "n4"}, LinkGbps: 100, Uplinks: 6, UplinkGbps: 100, Oversubscription: 4.0 / 3},
	}}
}

// dgx is a dgx-a100 node report, with its NICs at nicGbps (0: the model's).
func dgx(t testing.TB, name string, position int, nicGbps float64) events.TopologyNode {
	t.Helper()
	n, err := clusterfile.Model("dgx-a100")
	if err != nil {
		t.Fatal(err)
	}
	n.Name = name
	if nicGbps > 0 {
		for i := range n.NICs {
			n.NICs[i].RateGbps = nicGbps
		}
	}
	ev := n.Event()
	ev.Position = position
	ev.GPUModel = "A100-SXM4-80GB"
	return ev
}

// newCluster publishes the nodes and fabric; its decider places jobs with
// strategy ("" is placement's default).
func newCluster(t *testing.T, strategy string, nodes []events.TopologyNode, fabric *events.TopologyFabric) *cluster {
	t.Helper()
	srv := eventstest.Server(t)
	c := &cluster{t: t, b: eventstest.Bus(t, srv.ClientURL(), "test"), ctx: eventstest.Context(t, 60*time.Second)}
	c.place = newDecider(t, c.b, strategy)
	for i := range nodes {
		c.publish(&nodes[i])
	}
	if fabric != nil {
		c.publish(fabric)
	}
	return c
}

// publish publishes v; a topology event reaches the decider's store too,
// as it reaches placement's.
func (c *cluster) publish(v any) events.Envelope {
	c.t.Helper()
	env, err := c.b.Publish(c.ctx, v)
	if err != nil {
		c.t.Fatal(err)
	}
	c.place.topology(v)
	return env
}

// optimizer is an optimizer on c's bus, its state empty and no handler
// running; log nil is slog.Default.
func (c *cluster) optimizer(log *slog.Logger) *Service {
	c.t.Helper()
	o, err := New(Config{}, Deps{Publish: c.b, Read: c.b, Consume: c.b, Subjects: c.b.Subjects, Log: log})
	if err != nil {
		c.t.Fatal(err)
	}
	return o
}

// submit analyses a job, publishes the analysis, and has placement decide
// it; it returns the analysis and the decision.
func (c *cluster) submit(job events.JobSubmitted) (*events.JobAnalyzed, *events.PlacementDecided) {
	c.t.Helper()
	a, reasons := pattern.Analyze(job)
	if len(reasons) > 0 {
		c.t.Fatal(reasons)
	}
	env := c.publish(&a)
	return &a, c.place.decide(c.ctx, env, &a)
}

func (c *cluster) finish(job string) {
	c.t.Helper()
	ev := &events.JobFinished{JobID: job, Status: events.StatusSucceeded}
	env := c.publish(ev)
	c.place.finish(c.ctx, env, ev)
}

// A decision handled before the optimizer has read the job's analysis or
// its nodes' reports is not tuned on partial data: the optimizer catches up
// with the streams first. When the analysis or a node's report is nowhere
// in them, the decision is not placement's: it fails once, permanently
// (ErrUnknownJob), and a second delivery reads no stream again.
func TestDecisionCatchesUp(t *testing.T) {
	t.Parallel()
	c := newCluster(t, "", []events.TopologyNode{dgx(t, "n1", 0, 0), dgx(t, "n2", 1, 0)}, nil)
	_, d := c.submit(events.JobSubmitted{JobID: "j", GPUs: 16})
	o := c.optimizer(nil) // nothing applied: no Rebuild, no handlers
	if err := o.OnDecided(c.ctx, events.Envelope{ID: "x"}, d); err != nil {
		t.Fatal(err)
	}
	o.mu.Lock()
	lj := o.live["j"]
	o.mu.Unlock()
	if lj == nil || lj.spec == nil || lj.spec.Job.GPUs != 16 {
		t.Fatalf("live job %+v", lj)
	}
	snap := o.Store().Snapshot()
	if len(snap.Nodes()) != 2 || len(snap.GPUsOfJob("j")) != 16 {
		t.Fatalf("store: %d nodes, %d GPUs of j", len(snap.Nodes()), len(snap.GPUsOfJob("j")))
	}

	ghost := *d
	ghost.JobID = "ghost"
	ghost.Ranks = nil
	err := o.OnDecided(c.ctx, events.Envelope{ID: "y"}, &ghost)
	if bus.IsTransient(err) || !errors.Is(err, ErrUnknownJob) || !strings.Contains(err.Error(), "analysis") {
		t.Fatalf("decision without analysis: %v, want ErrUnknownJob, not Transient", err)
	}
	counted := &replays{Reader: c.b}
	o.read = counted
	if err := o.OnDecided(c.ctx, events.Envelope{ID: "y"}, &ghost); !errors.Is(err, ErrUnknownJob) || counted.n.Load() != 0 {
		t.Fatalf("decision without analysis again: %v after %d replays, want ErrUnknownJob after none", err, counted.n.Load())
	}
	o.read = c.b

	// A known job decided on a node nobody reported.
	a, reasons := pattern.Analyze(events.JobSubmitted{JobID: "nowhere", GPUs: 1})
	if len(reasons) > 0 {
		t.Fatal(reasons)
	}
	c.publish(&a)
	nowhere := events.PlacementDecided{JobID: "nowhere", Strategy: "forged", DecidedAt: d.DecidedAt,
		Ranks: []events.RankPlacement{{Node: "n9", GPU: 0}}, Nodes: []events.NodePlacement{{Node: "n9", GPUs: []int{0}, CUDAVisibleDevices: "0"}}}
	if err := o.OnDecided(c.ctx, events.Envelope{ID: "z"}, &nowhere); bus.IsTransient(err) || !errors.Is(err, ErrUnknownJob) {
		t.Fatalf("decision on an unknown node: %v, want ErrUnknownJob, not Transient", err)
	}
}

// replays counts the replays of a Reader.
type replays struct {
	bus.Reader
	n atomic.Int32
}

func (r *replays) ReplayFrom(ctx context.Context, d events.Domain, subjects []string, after uint64, fn func(bus.Record) error) error {
	r.n.Add(1)
	return r.Reader.ReplayFrom(ctx, d, subjects, after, fn)
}

// A decision for a job placement never analysed, published by hand
// (issue 46), is dead-lettered once and acked; the optimizer's placement
// consumer goes on (it failed on every delivery, redelivered for ever).
func TestForgedDecisionDeadLetteredOnce(t *testing.T) {
	t.Parallel()
	c := newCluster(t, "", []events.TopologyNode{dgx(t, "n1", 0, 0)}, nil)
	c.running()
	tunings := follow[events.RuntimeTuning](c, events.NameRuntimeTuning)
	// On a node placement does not know, so that the job placed after it
	// shares no GPU with it.
	forged := &events.PlacementDecided{JobID: "forged", Strategy: "by-hand", DecidedAt: time.Date(2026, 12, 6, 0, 0, 0, 0, time.UTC),
		Ranks: []events.RankPlacement{{Node: "n9", GPU: 0}}, Nodes: []events.NodePlacement{{Node: "n9", GPUs: []int{0}, CUDAVisibleDevices: "0"}}}
	if _, err := c.b.Publish(c.ctx, forged); err != nil {
		t.Fatal(err)
	}
	c.submit(events.JobSubmitted{JobID: "after", GPUs: 8})
	next(c, tunings, forJob[*events.RuntimeTuning]("after"))
	var info *jetstream.ConsumerInfo
	for {
		cons, err := c.b.JetStream().Consumer(c.ctx, c.b.StreamName(events.DomainPlacement), HandlerPlacement)
		if err == nil {
			info, err = cons.Info(c.ctx)
		}
		if err == nil && info.NumPending == 0 && info.NumAckPending == 0 && info.AckFloor.Stream >= 2 {
			break
		}
		select {
		case <-c.ctx.Done():
			t.Fatalf("the placement consumer is stuck: %+v, %v", info, err)
		case <-time.After(20 * time.Millisecond):
		}
	}
	if info.NumRedelivered != 0 {
		t.Errorf("%d redeliveries", info.NumRedelivered)
	}
	dlq, err := c.b.JetStream().Stream(c.ctx, c.b.StreamName(events.DomainDLQ))
	if err != nil {
		t.Fatal(err)
	}
	if n := dlq.CachedInfo().State.Msgs; n != 1 {
		t.Errorf("%d dead letters, want the forged decision's", n)
	}
}

// A restarted optimizer rebuilds the same state from the streams: a job
// decided, released and its GPUs decided again to another job are one live
// job, with no double booking.
func TestRebuild(t *testing.T) {
	t.Parallel()
	fab := twoLeaves()
	c := newCluster(t, "", []events.TopologyNode{dgx(t, "n1", 0, 0), dgx(t, "n2", 1, 0), dgx(t, "n3", 2, 0), dgx(t, "n4", 3, 0)}, &fab)
	c.submit(events.JobSubmitted{JobID: "a", GPUs: 32})
	c.finish("a")
	c.submit(events.JobSubmitted{JobID: "b", GPUs: 16})
	c.submit(events.JobSubmitted{JobID: "c", GPUs: 8})
	c.publish(&events.TopologyHealth{Node: "n4", Component: events.ComponentNIC, ID: "mlx5_0", Health: events.HealthUnhealthy,
		Reason: "link down", ObservedAt: time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)})

	var logs bytes.Buffer
	o := c.optimizer(slog.New(slog.NewTextHandler(&logs, nil)))
	if err := o.Rebuild(c.ctx); err != nil {
		t.Fatal(err)
	}
	if jobs, gpus := o.Live(); jobs != 2 || gpus != 24 {
		t.Fatalf("live: %d jobs on %d GPUs, want 2 on 24", jobs, gpus)
	}
	if strings.Contains(logs.String(), "double booking") {
		t.Fatal(logs.String())
	}
	snap := o.Store().Snapshot()
	if got := len(snap.GPUsOfJob("b")); got != 16 {
		t.Errorf("b holds %d GPUs in the store", got)
	}
	if got := len(snap.GPUsOfJob("a")); got != 0 {
		t.Errorf("released a holds %d GPUs in the store", got)
	}
	if n, _ := snap.Node("n4"); len(n.DownNICs) != 1 {
		t.Errorf("n4 down NICs %v", n.DownNICs)
	}
	if o.fabric == nil || len(o.health["n4"]) != 1 {
		t.Errorf("fabric %v, health %v", o.fabric, o.health)
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.analyses) != 0 || o.live["b"].spec == nil || o.live["c"].spec == nil {
		t.Errorf("analyses kept %d, live specs %v %v", len(o.analyses), o.live["b"].spec != nil, o.live["c"].spec != nil)
	}
}
