package optimizer

import (
	"context"
	"testing"
	"time"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/events/bus"
	"github.com/toposched/toposched/internal/placer"
	"github.com/toposched/toposched/internal/placer/launch"
	"github.com/toposched/toposched/internal/placer/outcome"
	"github.com/toposched/toposched/internal/store"
	"github.com/toposched/toposched/internal/topology"
)

// decider makes, with the placement engine, the decisions the placement
// service would make on the same events, and publishes them as it does:
// the optimizer's tests must not import another service. It keeps its own
// store, fed with the topology events the test publishes, and decides with
// the Planner placement runs (no policies, no reservation: the tests queue
// nothing), so its decisions, launcher fields and predictions are
// placement's.
type decider struct {
	t        testing.TB
	pub      bus.Publisher
	store    *store.Store
	fabric   *topology.Fabric
	strategy string
}

// newDecider decides with strategy ("" is placement's default).
func newDecider(t testing.TB, pub bus.Publisher, strategy string) *decider {
	t.Helper()
	s, err := placer.Lookup(strategy, true)
	if err != nil {
		t.Fatal(err)
	}
	st, err := store.New()
	if err != nil {
		t.Fatal(err)
	}
	return &decider{t: t, pub: pub, store: st, strategy: s.Name()}
}

// Store is the decider's inventory, as placement's Store.
func (d *decider) Store() *store.Store { return d.store }

// topology applies a topology event as placement's handlers do; other
// events are ignored.
func (d *decider) topology(v any) {
	d.t.Helper()
	var err error
	switch ev := v.(type) {
	case *events.TopologyNode:
		err = d.store.UpsertNode(*ev)
	case *events.TopologyHealth:
		err = d.store.SetHealth(*ev)
	case *events.TopologyFabric:
		var f *topology.Fabric
		if f, err = d.store.ApplyFabric(*ev); err == nil {
			d.fabric = f
		}
	}
	if err != nil {
		d.t.Fatalf("decider: topology %T: %v", v, err)
	}
}

// decide places the job of analysis a, handled as the event env, as
// placement's OnAnalyzed does, and publishes the decision with env as its
// cause. A job that would not be placed fails the test.
func (d *decider) decide(ctx context.Context, env events.Envelope, a *events.JobAnalyzed) *events.PlacementDecided {
	d.t.Helper()
	ctx = bus.WithCause(ctx, env)
	id := a.Job.JobID
	if j, ok := d.store.Snapshot().Job(id); ok && j.State != store.JobRejected {
		d.t.Fatalf("decider: job %s submitted again (%s): placement would ignore it", id, j.State)
	}
	job := store.Job{ID: id, Priority: a.Job.Priority, Spec: *a}
	p := &placer.Planner{Strategy: d.strategy, Fabric: d.fabric}
	plan, err := p.Plan(ctx, d.store.Snapshot(), job.Spec, placer.PlanOptions{Counterfactuals: true})
	if err != nil {
		d.t.Fatal(err)
	}
	if plan.Verdict != outcome.Placed {
		d.t.Fatalf("job %s: %s %+v", id, plan.Verdict, plan.Reasons)
	}
	before := d.store.Snapshot()
	if err := d.store.Allocate(id, plan.GPUs); err != nil {
		d.t.Fatalf("reserve GPUs for %s: %v", id, err)
	}
	dec := outcome.Decide(id, plan.GPUs, d.strategy)
	dec.DecidedAt = time.Now().UTC()
	launch.Fill(&dec, d.store.Snapshot())
	dec.Prediction, dec.Baseline = d.predict(before, job.Spec, plan.GPUs, plan.Baseline)
	dec.Warnings, dec.Explanation = plan.Warnings, plan.Explanation
	if _, err := d.pub.Publish(ctx, &dec); err != nil {
		d.t.Fatal(err)
	}
	job.State, job.Decision = store.JobPlaced, &dec
	if err := d.store.UpsertJob(job); err != nil {
		d.t.Fatal(err)
	}
	return &dec
}

// predict is placement's: placer.Predictions on the state before the
// decision, a failure logged.
func (d *decider) predict(before *store.Snapshot, job events.JobAnalyzed, gpus []store.GPUKey, b outcome.Result) (ours, base *events.Prediction) {
	ours, base, err := placer.Predictions(before, job, gpus, b, d.fabric, nil, d.strategy)
	if err != nil {
		d.t.Logf("prediction of %s failed: %v", job.Job.JobID, err)
	}
	return ours, base
}

// finish releases a job, handled as the JobFinished event env, as
// placement's OnFinished does: placement.released is published with env as
// its cause and the job's GPUs are freed.
func (d *decider) finish(ctx context.Context, env events.Envelope, ev *events.JobFinished) {
	d.t.Helper()
	ctx = bus.WithCause(ctx, env)
	j, ok := d.store.Snapshot().Job(ev.JobID)
	if !ok || (j.State != store.JobPlaced && j.State != store.JobPending) {
		d.t.Fatalf("decider: finish of job %s, which does not run", ev.JobID)
	}
	rel := &events.PlacementReleased{JobID: j.ID, Status: ev.Status}
	if j.Decision != nil {
		rel.Nodes = j.Decision.Nodes
	}
	if _, err := d.pub.Publish(ctx, rel); err != nil {
		d.t.Fatal(err)
	}
	if _, err := d.store.Release(j.ID); err != nil {
		d.t.Fatalf("release %s: %v", j.ID, err)
	}
	j.State = store.JobFinished
	if err := d.store.UpsertJob(j); err != nil {
		d.t.Fatal(err)
	}
}
