package optimizer

import (
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/events/bus"
	"github.com/toposched/toposched/internal/collective"
	"github.com/toposched/toposched/internal/gpuspeed"
	"github.com/toposched/toposched/internal/pattern"
	"github.com/toposched/toposched/internal/placer"
	"github.com/toposched/toposched/internal/placer/aware"
	"github.com/toposched/toposched/internal/store"
	"github.com/toposched/toposched/internal/topology"
)

// pcieNode is an 8-GPU PCIe server of a GPU model.
func pcieNode(name, model string, position int) events.TopologyNode {
	n := collective.BuildNode(collective.NodeSpec{Name: name, GPUs: 8, Model: model, PCIeGen: 4, NICs: 1, NICGbps: 100})
	ev := n.Event()
	ev.Position = position
	ev.GPUModel = model
	return ev
}

// oneGPU is a one-GPU job whose step computes for a second on the
// reference model (the A100).
func oneGPU(t *testing.T, id string) events.JobSubmitted {
	t.Helper()
	return events.JobSubmitted{JobID: id, GPUs: 1, StepComputeSeconds: 1}
}

// migrations are the placement.migration events published so far.
func migrations(c *cluster) []*events.PlacementMigration {
	c.t.Helper()
	var out []*events.PlacementMigration
	if err := c.b.Replay(c.ctx, events.DomainPlacement, []string{c.b.Subjects.Of(events.NamePlacementMigration)}, func(r bus.Record) error {
		m := new(events.PlacementMigration)
		if err := bus.Decode(r.Name, r.Body, m); err != nil {
			return err
		}
		out = append(out, m)
		return nil
	}); err != nil {
		c.t.Fatal(err)
	}
	return out
}

// The online compute calibration end to end, on an embedded NATS: eight
// one-GPU jobs on an L4 server measure their compute 1.6 times what the
// speed table predicts from their A100 time, report after report; the
// optimizer pushes the L4's factor in steps of at most 20% until it is
// 1.6, each set one the replicas take. Placement's planner, given the set
// in force, then sends a one-GPU job to the T4 server rather than the
// free L4 one it took before (by the table an L4 computes in 0.76 of a
// T4's time, measured in 1.21 of it); a running job's own move is
// planned on the corrected value (a proposal to the T4 with the compute
// it saves), which without the correction it is not offered.
func TestOnlineComputeCalibration(t *testing.T) {
	t.Parallel()
	c := newCluster(t, placer.StrategyBlind, []events.TopologyNode{
		pcieNode("l4-a", "NVIDIA L4", 0), pcieNode("l4-b", "NVIDIA L4", 1), pcieNode("t4", "Tesla T4", 2),
	}, nil)
	const truth = 1.6
	table, _ := gpuspeed.Factor("L4", "a100")
	measured := truth * table // a job's compute per step on an L4
	var jobs []string
	for i := range 8 {
		id := fmt.Sprintf("j%d", i)
		if _, d := c.submit(oneGPU(t, id)); d.Ranks[0].Node != "l4-a" {
			t.Fatalf("%s placed on %s, want l4-a", id, d.Ranks[0].Node)
		}
		jobs = append(jobs, id)
	}
	newOpt := func() *Service {
		o, err := New(Config{ComputeReference: "a100"}, Deps{Publish: c.b, Read: c.b, Consume: c.b, Subjects: c.b.Subjects})
		if err != nil {
			t.Fatal(err)
		}
		if err := o.Rebuild(c.ctx); err != nil {
			t.Fatal(err)
		}
		return o
	}
	report := func(o *Service, id string, step int64) {
		tel := &events.RuntimeTelemetry{JobID: id, Step: step, StepSeconds: measured, ComputeSeconds: measured}
		if err := o.OnTelemetry(c.ctx, events.Envelope{}, tel); err != nil {
			t.Fatal(err)
		}
	}

	// Without the calibration a move of j0 is not offered: the T4 is
	// predicted slower than the L4 it runs on.
	blind := newOpt()
	report(blind, "j0", 1)
	blind.mu.Lock()
	if err := blind.proposeMove(c.ctx, blind.live["j0"], events.MigrationBetterPlacement, "", true); err != nil {
		t.Fatal(err)
	}
	blind.mu.Unlock()
	if m := migrations(c); len(m) != 0 {
		t.Fatalf("proposed without a correction: %s", m[0].Message)
	}

	o := newOpt()
	fake := &fakeCalibrator{o: o}
	o.CalibrateOnline(fake)
	for step := range int64(10) {
		for _, id := range jobs {
			report(o, id, step)
		}
	}
	if len(fake.pushes) == 0 {
		t.Fatalf("no move (pending %v)", o.onlineCompute.Pending())
	}
	prev := 1.0
	for i, p := range fake.pushes {
		if err := p.Validate(); err != nil {
			t.Fatalf("push %d refused by the replicas: %v", i, err)
		}
		if len(p.Compute) != 1 || p.Compute[0].Model != "L4" || p.Name != OnlineName {
			t.Fatalf("push %d: %+v", i, p.Compute)
		}
		f := p.Compute[0].Factor
		if math.Abs(f/prev-1) > collective.OnlineComputeMaxStep+1e-9 {
			t.Fatalf("push %d: L4 %.3f -> %.3f in one step", i, prev, f)
		}
		prev = f
	}
	if math.Abs(prev/truth-1) > 0.01 {
		t.Fatalf("L4 factor %.3f after %d pushes, truth %.1f", prev, len(fake.pushes), truth)
	}

	// Placement's planner with the set in force.
	bw := fake.cur.Bandwidths(nil)
	probe, reasons := pattern.Analyze(oneGPU(t, "probe"))
	if len(reasons) > 0 {
		t.Fatal(reasons)
	}
	snap := c.place.store.Snapshot()
	for _, tc := range []struct {
		bw   *topology.Bandwidths
		want string
	}{{nil, "l4-b"}, {bw, "t4"}} {
		plan, err := (&placer.Planner{Strategy: placer.StrategyTopologyAware, Bandwidths: tc.bw, ComputeReference: "a100"}).Plan(c.ctx, snap, probe, placer.PlanOptions{})
		if err != nil || len(plan.GPUs) != 1 || plan.GPUs[0].Node != tc.want {
			t.Errorf("corrections %v: planned %v (%v), want %s", tc.bw != nil, plan.GPUs, err, tc.want)
		}
	}
	est, ok := aware.EstimateCompute(snap, probe, []store.GPUKey{{Node: "l4-b", Index: 0}}, "a100", bw)
	if !ok || math.Abs(est.Seconds/measured-1) > 0.01 || est.Correction.Set != OnlineName || est.Correction.Samples != len(jobs) {
		t.Errorf("compute on an L4 under the set in force: %+v; want %.3g s, from %d runs, online", est, measured, len(jobs))
	}

	// j0's move, planned on its own measured compute and the correction.
	o.mu.Lock()
	if err := o.proposeMove(c.ctx, o.live["j0"], events.MigrationBetterPlacement, "", true); err != nil {
		t.Fatal(err)
	}
	o.mu.Unlock()
	m := migrations(c)
	if len(m) != 1 || len(m[0].Nodes) != 1 || m[0].Nodes[0].Node != "t4" {
		t.Fatalf("proposals %+v, want j0's to the T4", m)
	}
	// Its own L4 time scaled to a T4, the L4's factor divided out.
	t4, _ := gpuspeed.Factor("T4", "L4")
	if want := measured - measured*t4/truth; math.Abs(m[0].GainSecondsPerStep/want-1) > 0.02 ||
		!strings.Contains(m[0].Message, "compute") || !strings.Contains(m[0].Message, "measured now") {
		t.Errorf("gain %.4g s, want %.4g: %s", m[0].GainSecondsPerStep, want, m[0].Message)
	}
	t.Logf("proposal: %s", m[0].Message)
}
