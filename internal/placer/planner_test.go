package placer

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/internal/demand"
	"github.com/toposched/toposched/internal/fixtures"
	"github.com/toposched/toposched/internal/pattern"
	"github.com/toposched/toposched/internal/placer/outcome"
	"github.com/toposched/toposched/internal/store"
	"github.com/toposched/toposched/internal/topology"
	"github.com/toposched/toposched/policies"
)

// rig is a store of 8-GPU DGX A100 nodes, two per leaf, with the shipped
// policies.
type rig struct {
	t      *testing.T
	st     *store.Store
	fabric *topology.Fabric
	set    *policies.Set
}

func newRig(t *testing.T, nodes int, labels map[string]map[string]string) *rig {
	t.Helper()
	ns := make([]fixtures.Node, nodes)
	names := make([]string, nodes)
	for i := range ns {
		names[i] = fmt.Sprintf("n%d", i)
		ns[i].Event = fixtures.MustModelNode(t, "dgx-a100", names[i])
		ns[i].Event.Labels = labels[names[i]]
	}
	f := fixtures.MustFabric(t, fixtures.LeafSpine("c", names, 2))
	st := fixtures.MustStore(t, ns, f)
	set, err := policies.Compile(policies.Default, "default")
	if err != nil {
		t.Fatal(err)
	}
	return &rig{t: t, st: st, fabric: f, set: set}
}

// hold gives job id the listed GPUs of node.
func (r *rig) hold(id, node string, gpus ...int) {
	r.t.Helper()
	var keys []store.GPUKey
	for _, g := range gpus {
		keys = append(keys, store.GPUKey{Node: node, Index: g})
	}
	if err := r.st.Allocate(id, keys); err != nil {
		r.t.Fatal(err)
	}
	d := outcome.Decide(id, keys, "test")
	if err := r.st.UpsertJob(store.Job{ID: id, State: store.JobPlaced, Decision: &d}); err != nil {
		r.t.Fatal(err)
	}
}

func (r *rig) plan(p *Planner, job events.JobSubmitted) Plan {
	r.t.Helper()
	a, reasons := pattern.Analyze(job)
	if len(reasons) > 0 {
		r.t.Fatalf("analysis: %v", reasons)
	}
	if p.Fabric == nil {
		p.Fabric = r.fabric
	}
	out, err := p.Plan(context.Background(), r.st.Snapshot(), a, PlanOptions{Counterfactuals: true})
	if err != nil {
		r.t.Fatal(err)
	}
	return out
}

func nodesOf(gpus []store.GPUKey) []string {
	var out []string
	for _, g := range gpus {
		if !slices.Contains(out, g.Node) {
			out = append(out, g.Node)
		}
	}
	return out
}

func TestPlannerNodePolicies(t *testing.T) {
	t.Parallel()
	r := newRig(t, 4, map[string]map[string]string{"n0": {"tenant": "blue"}, "n1": {"tenant": "blue"}})
	p := &Planner{Policies: r.set}

	// A red job keeps off the blue nodes; the explanation counts them.
	got := r.plan(p, events.JobSubmitted{JobID: "red", Tenant: "red", GPUs: 8})
	if got.Verdict != outcome.Placed || slices.ContainsFunc(got.GPUs, func(g store.GPUKey) bool { return g.Node == "n0" || g.Node == "n1" }) {
		t.Fatalf("red job: %v on %v, want placed off n0, n1", got.Verdict, nodesOf(got.GPUs))
	}
	x := got.Explanation
	if x == nil || x.PolicyRevision != r.set.Revision || x.NodesConsidered != 4 || len(x.NodesDenied) != 1 ||
		x.NodesDenied[0].Code != "tenant_mismatch" || x.NodesDenied[0].Nodes != 2 || x.NodesDenied[0].Policy != "toposched.nodes.tenant_isolation" {
		t.Errorf("explanation %+v", x)
	}
	if len(x.Candidates) == 0 || x.Candidates[0].Outcome != events.OutcomeChosen {
		t.Errorf("candidates %+v, want the chosen one first", x.Candidates)
	}

	// More GPUs than the red job may ever use: rejected, naming the policy.
	got = r.plan(p, events.JobSubmitted{JobID: "big", Tenant: "red", GPUs: 24})
	if got.Verdict != outcome.Never || !strings.Contains(codes(got.Reasons), "tenant_mismatch") {
		t.Fatalf("big red job: %v %v, want rejected for tenant_mismatch", got.Verdict, got.Reasons)
	}
	if len(got.Counterfactuals) == 0 || got.Counterfactuals[0].Kind != events.CounterfactualPolicy ||
		got.Counterfactuals[0].Policy != "toposched.nodes.tenant_isolation" {
		t.Errorf("counterfactuals %+v", got.Counterfactuals)
	}

	// The blue tenant may use every node.
	if got = r.plan(p, events.JobSubmitted{JobID: "blue", Tenant: "blue", GPUs: 32}); got.Verdict != outcome.Placed {
		t.Errorf("blue job on the whole cluster: %v %v", got.Verdict, got.Reasons)
	}
}

func TestPlannerPlacementPolicies(t *testing.T) {
	t.Parallel()
	r := newRig(t, 6, nil)
	// Half of every node held: each leaf (two nodes) keeps 8 free GPUs.
	for i := range 6 {
		r.hold(fmt.Sprintf("j%d", i), fmt.Sprintf("n%d", i), 0, 1, 2, 3)
	}
	p := &Planner{Policies: r.set}

	// 16 GPUs may span 2 leaves (leaf_span): placed on one or two.
	got := r.plan(p, events.JobSubmitted{JobID: "a", GPUs: 16, Parallelism: &events.Parallelism{TP: 4, DP: 4}})
	if got.Verdict != outcome.Placed {
		t.Fatalf("16-GPU job: %v %v", got.Verdict, got.Reasons)
	}
	// 24 GPUs, at most 2 leaves, 8 free per leaf: denied, waits, and the
	// counterfactual names leaf_span.
	got = r.plan(p, events.JobSubmitted{JobID: "b", GPUs: 24, Parallelism: &events.Parallelism{TP: 4, DP: 6}})
	if got.Verdict != outcome.Wait || !strings.Contains(codes(got.Reasons), "leaf_span") {
		t.Fatalf("24-GPU job: %v %v, want a wait for leaf_span", got.Verdict, got.Reasons)
	}
	if len(got.Counterfactuals) == 0 || got.Counterfactuals[0].Policy != "toposched.placement.leaf_span" ||
		!strings.Contains(got.Counterfactuals[0].Message, "fits if toposched.placement.leaf_span allowed it") {
		t.Errorf("counterfactuals %+v", got.Counterfactuals)
	}
	if x := got.Explanation; x == nil || len(x.Candidates) == 0 || x.Candidates[0].Outcome != events.OutcomeDenied {
		t.Errorf("explanation %+v, want denied candidates", x)
	}
	// Without policies it is placed.
	if got = r.plan(&Planner{}, events.JobSubmitted{JobID: "b", GPUs: 24, Parallelism: &events.Parallelism{TP: 4, DP: 6}}); got.Verdict != outcome.Placed {
		t.Errorf("24-GPU job without policies: %v %v", got.Verdict, got.Reasons)
	}
}

func TestPlannerRejectsWhatNoFinishCanChange(t *testing.T) {
	t.Parallel()
	r := newRig(t, 6, nil)
	// Nothing runs: a job leaf_span denies on the empty cluster never fits.
	got := r.plan(&Planner{Policies: r.set}, events.JobSubmitted{JobID: "wide", GPUs: 48, Parallelism: &events.Parallelism{TP: 8, DP: 6}})
	if got.Verdict != outcome.Never || !strings.Contains(codes(got.Reasons), "leaf_span") || len(got.Counterfactuals) == 0 {
		t.Fatalf("48 GPUs over 3 leaves with nothing running: %v %v %v", got.Verdict, got.Reasons, got.Counterfactuals)
	}
}

func TestPlannerWarningsAndScore(t *testing.T) {
	t.Parallel()
	r := newRig(t, 2, nil)
	r.hold("j", "n0", 0, 1, 2, 3, 4, 5, 6, 7)
	// A 2-GPU job must break the last wholly free node: placed, with the
	// keep_whole_nodes warning.
	got := r.plan(&Planner{Policies: r.set}, events.JobSubmitted{JobID: "small", GPUs: 2})
	if got.Verdict != outcome.Placed || codes(got.Warnings) != "breaks_whole_node" || got.Warnings[0].Policy != "toposched.placement.keep_whole_nodes" {
		t.Fatalf("small job: %v, warnings %+v", got.Verdict, got.Warnings)
	}
	if c := got.Explanation.Candidates[0]; c.Score != 1 || c.Outcome != events.OutcomeChosen {
		t.Errorf("chosen candidate %+v, want score 1", c)
	}
}

func TestPlannerJobsFinishCounterfactual(t *testing.T) {
	t.Parallel()
	r := newRig(t, 2, nil)
	r.hold("small", "n0", 0, 1)
	r.hold("large", "n1", 0, 1, 2, 3, 4, 5)
	got := r.plan(&Planner{}, events.JobSubmitted{JobID: "w", GPUs: 12})
	if got.Verdict != outcome.Wait || len(got.Counterfactuals) != 1 {
		t.Fatalf("12-GPU job: %v %+v", got.Verdict, got.Counterfactuals)
	}
	if c := got.Counterfactuals[0]; c.Kind != events.CounterfactualJobsFinish || !slices.Equal(c.Jobs, []string{"large"}) {
		t.Errorf("counterfactual %+v, want job large (small alone frees too few)", c)
	}
	got = r.plan(&Planner{}, events.JobSubmitted{JobID: "w", GPUs: 16})
	if c := got.Counterfactuals; len(c) != 1 || !slices.Equal(c[0].Jobs, []string{"large", "small"}) {
		t.Errorf("16-GPU job: counterfactuals %+v, want both jobs", c)
	}
}

func TestPlannerReservation(t *testing.T) {
	t.Parallel()
	r := newRig(t, 2, nil)
	res := &Reservation{JobID: "head", Priority: 5, Since: time.Unix(0, 0), Nodes: map[string]bool{"n0": true}}
	p := &Planner{Reservation: res}
	got := r.plan(p, events.JobSubmitted{JobID: "low", GPUs: 8, Priority: 5})
	if got.Verdict != outcome.Placed || slices.Contains(nodesOf(got.GPUs), "n0") {
		t.Fatalf("equal-priority job: %v on %v, want it off the held n0", got.Verdict, nodesOf(got.GPUs))
	}
	got = r.plan(p, events.JobSubmitted{JobID: "low", GPUs: 16, Priority: 5})
	if got.Verdict != outcome.Wait || !strings.Contains(codes(got.Reasons), CodeReserved) || got.Explanation.NodesReserved != 1 {
		t.Fatalf("16-GPU job behind the hold: %v %v", got.Verdict, got.Reasons)
	}
	for _, job := range []events.JobSubmitted{{JobID: "head", GPUs: 16, Priority: 5}, {JobID: "urgent", GPUs: 16, Priority: 9}} {
		if got = r.plan(p, job); got.Verdict != outcome.Placed {
			t.Errorf("%s: %v %v, want placed (the hold is not for it)", job.JobID, got.Verdict, got.Reasons)
		}
	}
}

func TestPlannerBackfillsHeldNodes(t *testing.T) {
	t.Parallel()
	now := time.Unix(1e6, 0)
	h := func(x float64) time.Time { return now.Add(time.Duration(x * float64(time.Hour))) }
	// learned has seen 1- and 2-GPU jobs run an hour, 3-4-GPU jobs two.
	learned := func() *demand.Forecast {
		f := demand.New(demand.Config{})
		for id, c := range map[string]struct {
			gpus int
			run  float64
		}{"a": {2, 1}, "b": {4, 2}} {
			f.Started(id, c.gpus, "A100", h(-10))
			f.Ended(id, h(-10+c.run))
		}
		return f
	}
	for _, c := range []struct {
		name     string
		backfill bool
		// started is when the 4-GPU job on the held node started (NaN:
		// the forecast does not track it).
		started float64
		gpus    int
		forget  bool
		want    outcome.Verdict
	}{
		{"ends before the held node drains", true, -0.5, 2, false, outcome.Placed},
		{"ends just as it drains", true, 0, 4, false, outcome.Placed},
		{"would outlast the job on it", true, -0.5, 4, false, outcome.Wait},
		{"the job on it ran past its mean: now plus as long again", true, -3, 4, false, outcome.Placed},
		{"backfill off", false, -0.5, 2, false, outcome.Wait},
		{"the job on it is not tracked", true, -0.5, 2, true, outcome.Wait},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			r := newRig(t, 2, nil)
			r.hold("running", "n0", 0, 1, 2, 3)
			r.hold("elsewhere", "n1", 0, 1, 2, 3, 4, 5, 6, 7)
			f := learned()
			if !c.forget {
				f.Started("running", 4, "A100", h(c.started))
			}
			res := &Reservation{JobID: "head", Priority: 5, Since: h(-1), Nodes: map[string]bool{"n0": true}}
			got := r.plan(&Planner{Reservation: res, Backfill: c.backfill, Demand: f, Now: now}, events.JobSubmitted{JobID: "small", GPUs: c.gpus, Priority: 5})
			if got.Verdict != c.want {
				t.Fatalf("%d-GPU job: %v %v, want %v", c.gpus, got.Verdict, got.Reasons, c.want)
			}
			// A job placed on the held node says so, with both ends.
			if got.Verdict == outcome.Placed {
				if ex := got.Explanation; ex == nil || ex.Backfill == nil || ex.Backfill.HeldFor != "head" || ex.Backfill.ExpectedEnd.After(ex.Backfill.DrainedBy) {
					t.Fatalf("explanation %+v, want its backfill onto head's nodes", ex)
				}
			}
		})
	}
}

func TestPlannerFailsClosed(t *testing.T) {
	t.Parallel()
	r := newRig(t, 1, nil)
	// Converting a label that is not a number is an evaluation error
	// under strict built-in errors.
	set, err := policies.Compile(fstest.MapFS{"bad.rego": {Data: []byte(`package toposched.placement.bad

deny contains {"code": "never", "msg": "x"} if {
	to_number(input.job.tenant) > 1
}
`)}}, "bad")
	if err != nil {
		t.Fatal(err)
	}
	got := r.plan(&Planner{Policies: set}, events.JobSubmitted{JobID: "j", GPUs: 2, Tenant: "not-a-number"})
	if got.Verdict == outcome.Placed || !strings.Contains(codes(got.Reasons), policies.CodePolicyError) {
		t.Fatalf("%v %v, want denied with %s", got.Verdict, got.Reasons, policies.CodePolicyError)
	}
}

// TestEveryStrategyHonoursTheNodeFilter: blind and the peers take GPUs only
// of the nodes the node policies and a reservation allow, as topology-aware
// does, each node asked once.
func TestEveryStrategyHonoursTheNodeFilter(t *testing.T) {
	t.Parallel()
	for _, name := range Names(true) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			r := newRig(t, 4, map[string]map[string]string{"n0": {"tenant": "blue"}, "n1": {"tenant": "blue"}})
			p := &Planner{Policies: r.set, Strategy: name}
			got := r.plan(p, events.JobSubmitted{JobID: "red", Tenant: "red", GPUs: 16})
			if got.Verdict != outcome.Placed || slices.ContainsFunc(got.GPUs, func(g store.GPUKey) bool { return g.Node == "n0" || g.Node == "n1" }) {
				t.Fatalf("red job: %v on %v (%v), want placed off n0, n1", got.Verdict, nodesOf(got.GPUs), got.Reasons)
			}
			if x := got.Explanation; x == nil || len(x.NodesDenied) != 1 || x.NodesDenied[0].Nodes != 2 {
				t.Errorf("explanation %+v, want the two blue nodes denied once each", x)
			}
			r.hold("other", "n2", 0)
			if got = r.plan(p, events.JobSubmitted{JobID: "red2", Tenant: "red", GPUs: 16}); got.Verdict != outcome.Wait {
				t.Errorf("red job with 15 GPUs free to it: %v on %v, want it to wait", got.Verdict, nodesOf(got.GPUs))
			}
			if got = r.plan(p, events.JobSubmitted{JobID: "red3", Tenant: "red", GPUs: 8, GPUsPerNode: 8}); got.Verdict != outcome.Placed || !slices.Equal(nodesOf(got.GPUs), []string{"n3"}) {
				t.Errorf("red 8-GPU node job: %v on %v (%v), want n3", got.Verdict, nodesOf(got.GPUs), got.Reasons)
			}

			r = newRig(t, 2, nil)
			res := &Reservation{JobID: "head", Priority: 5, Since: time.Unix(0, 0), Nodes: map[string]bool{"n0": true}}
			p = &Planner{Reservation: res, Strategy: name}
			if got = r.plan(p, events.JobSubmitted{JobID: "low", GPUs: 4, Priority: 5}); got.Verdict != outcome.Placed || slices.Contains(nodesOf(got.GPUs), "n0") {
				t.Errorf("job behind the hold: %v on %v, want it off the held n0", got.Verdict, nodesOf(got.GPUs))
			}
			got = r.plan(p, events.JobSubmitted{JobID: "low", GPUs: 16, Priority: 5})
			if got.Verdict != outcome.Wait || !strings.Contains(codes(got.Reasons), CodeReserved) || got.Explanation == nil || got.Explanation.NodesReserved != 1 {
				t.Errorf("16-GPU job behind the hold: %v %v %+v", got.Verdict, got.Reasons, got.Explanation)
			}
			if got = r.plan(p, events.JobSubmitted{JobID: "head", GPUs: 16, Priority: 5}); got.Verdict != outcome.Placed {
				t.Errorf("head: %v %v, want placed (the hold is for it)", got.Verdict, got.Reasons)
			}
		})
	}
}
