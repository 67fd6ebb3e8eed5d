package placement_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"testing/fstest"
	"time"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/events/bus"
	"github.com/toposched/toposched/events/eventstest"
	"github.com/toposched/toposched/internal/placer/outcome"
	"github.com/toposched/toposched/internal/store"
	"github.com/toposched/toposched/policies"
	"github.com/toposched/toposched/services/placement"
)

// migWorld is a placement service on a real JetStream, driven by direct
// handler calls so that each step is finished when the call returns. The
// cluster has three nodes of four GPUs: n1 and n2 under leaf l1, n3 under l2.
type migWorld struct {
	t   *testing.T
	ctx context.Context
	b   *bus.Bus
	s   *placement.Service
	seq int
}

func newMigWorld(t *testing.T) *migWorld {
	t.Helper()
	srv := eventstest.Server(t)
	w := &migWorld{t: t, ctx: eventstest.Context(t, 60*time.Second), b: eventstest.Bus(t, srv.ClientURL(), "test")}
	w.publish(&events.TopologyFabric{Cluster: "c", Switches: []events.Switch{
		{Name: "l1", Tier: "leaf", Nodes: []string{"n1", "n2"}},
		{Name: "l2", Tier: "leaf", Nodes: []string{"n3"}},
		{Name: "s", Tier: "spine", Switches: []string{"l1", "l2"}},
	}})
	for i, name := range []string{"n1", "n2", "n3"} {
		n := &events.TopologyNode{Name: name, Position: i, GPUModel: "A100", GPUs: make([]events.GPU, 4)}
		for g := range n.GPUs {
			n.GPUs[g].Index = g
		}
		w.publish(n)
	}
	w.s = placement.NewOnBus(t, w.b, placement.Config{})
	if err := w.s.Rebuild(w.ctx); err != nil {
		t.Fatal(err)
	}
	return w
}

// replica starts a fresh placement service rebuilt from the streams, a
// standby beside w.s, which keeps the term.
func (w *migWorld) replica() *placement.Service {
	w.t.Helper()
	s := placement.NewStandby(w.t, w.b, placement.Config{})
	if err := s.Rebuild(w.ctx); err != nil {
		w.t.Fatal(err)
	}
	return s
}

// publish stores v; a decision, wait or release as the term in force
// would (fenced on its marker), so that a rebuild takes it in.
func (w *migWorld) publish(v any) events.Envelope {
	w.t.Helper()
	ctx := w.ctx
	switch v.(type) {
	case *events.PlacementDecided, *events.PlacementPending, *events.PlacementReleased:
		ctx = bus.WithFence(ctx, w.term())
	}
	env, err := w.b.Publish(ctx, v)
	if err != nil {
		w.t.Fatal(err)
	}
	return env
}

// term is the fence of the last placement term marker stored.
func (w *migWorld) term() bus.Fence {
	w.t.Helper()
	subject := w.b.Subjects.Of(events.NamePlacementTerm)
	m, err := w.b.JetStream().Stream(w.ctx, w.b.StreamName(events.DomainPlacement))
	if err != nil {
		w.t.Fatal(err)
	}
	last, err := m.GetLastMsgForSubject(w.ctx, subject)
	if err != nil {
		w.t.Fatalf("no placement term to fence on: %v", err)
	}
	return bus.Fence{Subject: subject, Seq: last.Sequence}
}

func (w *migWorld) env() events.Envelope {
	w.seq++
	return events.Envelope{ID: fmt.Sprintf("req-%d", w.seq), CorrelationID: fmt.Sprintf("req-%d", w.seq)}
}

func (w *migWorld) submit(job events.JobSubmitted) {
	w.t.Helper()
	if err := w.s.OnAnalyzed(w.ctx, w.env(), analyzed(w.t, job)); err != nil {
		w.t.Fatal(err)
	}
}

func (w *migWorld) finish(id string) {
	w.t.Helper()
	if err := w.s.OnFinished(w.ctx, w.env(), &events.JobFinished{JobID: id, Status: events.StatusSucceeded}); err != nil {
		w.t.Fatal(err)
	}
}

// accept asks for a migration and returns the request's envelope.
func (w *migWorld) accept(job, proposal string) events.Envelope {
	w.t.Helper()
	env := w.env()
	if err := w.s.OnMigrationAccepted(w.ctx, env, &events.JobMigrationAccepted{JobID: job, ProposalID: proposal}); err != nil {
		w.t.Fatal(err)
	}
	return env
}

// held returns the GPUs a job holds in the service's store.
func (w *migWorld) held(s *placement.Service, job string) []store.GPUKey {
	var out []store.GPUKey
	for _, g := range s.Store().Snapshot().GPUsOfJob(job) {
		out = append(out, g.Key())
	}
	return out
}

func (w *migWorld) decision(job string) *events.PlacementDecided {
	j, ok := w.s.Store().Snapshot().Job(job)
	if !ok || j.Decision == nil {
		w.t.Fatalf("job %s has no decision: %+v", job, j)
	}
	return j.Decision
}

// propose publishes a proposal to move job onto gpus (rank order).
func (w *migWorld) propose(id, job string, gpus []store.GPUKey) *events.PlacementMigration {
	w.t.Helper()
	target := outcome.Decide(job, gpus, "optimizer")
	p := &events.PlacementMigration{JobID: job, ProposalID: id, Reason: events.MigrationCongestion,
		Message: "test", CurrentNodes: w.decision(job).Nodes, Ranks: target.Ranks, Nodes: target.Nodes,
		CurrentCommSecondsPerStep: 0.4, MeasuredCommSecondsPerStep: 1, ProposedCommSecondsPerStep: 0.25,
		GainSecondsPerStep: 0.75, StepSeconds: 3, RestartCostSeconds: events.DefaultRestartCostSeconds,
		RestartCostSource: events.RestartCostFromDefault, BreakEvenSeconds: events.BreakEven(events.DefaultRestartCostSeconds, 3, 0.75),
		ProposedAt: time.Now().UTC()}
	w.publish(p)
	return p
}

// answers returns the placement stream's events about job since seq.
func (w *migWorld) answers(job string) []bus.Record {
	w.t.Helper()
	var out []bus.Record
	err := w.b.Replay(w.ctx, events.DomainPlacement, []string{w.b.Subjects.Domain(events.DomainPlacement)}, func(r bus.Record) error {
		if r.Env.Subject == job && (r.Name == events.NamePlacementDecided || r.Name == events.NamePlacementMigrationRefused) {
			out = append(out, r)
		}
		return nil
	})
	if err != nil {
		w.t.Fatal(err)
	}
	return out
}

func (w *migWorld) lastAnswer(job string) bus.Record {
	a := w.answers(job)
	if len(a) == 0 {
		w.t.Fatalf("no answer for %s", job)
	}
	return a[len(a)-1]
}

// refusal returns the refusal answering req, failing if the last answer is
// not one.
func (w *migWorld) refusal(job string, req events.Envelope) *events.PlacementMigrationRefused {
	w.t.Helper()
	r := w.lastAnswer(job)
	var ref events.PlacementMigrationRefused
	if r.Name != events.NamePlacementMigrationRefused {
		w.t.Fatalf("last answer for %s is %s, want a refusal", job, r.Name)
	}
	if err := bus.Decode(r.Name, r.Body, &ref); err != nil {
		w.t.Fatal(err)
	}
	if ref.RequestID != req.ID {
		w.t.Fatalf("refusal answers %s, want %s", ref.RequestID, req.ID)
	}
	return &ref
}

func node(name string, idx ...int) []store.GPUKey {
	out := make([]store.GPUKey, len(idx))
	for i, x := range idx {
		out[i] = store.GPUKey{Node: name, Index: x}
	}
	return out
}

func sorted(k []store.GPUKey) []store.GPUKey {
	k = slices.Clone(k)
	slices.SortFunc(k, func(a, b store.GPUKey) int {
		if a.Node != b.Node {
			if a.Node < b.Node {
				return -1
			}
			return 1
		}
		return a.Index - b.Index
	})
	return k
}

// split places "j" on one GPU of n2 and one of n3 (across leaves): fillers
// hold the rest.
func split(w *migWorld) {
	w.t.Helper()
	w.submit(events.JobSubmitted{JobID: "fill-n1", GPUs: 4, GPUsPerNode: 4, GPUModel: "A100"})
	w.submit(events.JobSubmitted{JobID: "fill-n23", GPUs: 6, GPUsPerNode: 3, GPUModel: "A100"})
	w.submit(events.JobSubmitted{JobID: "j", GPUs: 2, GPUModel: "A100"})
	if got := w.decision("j").Nodes; len(got) != 2 || got[0].Node == got[1].Node {
		w.t.Fatalf("j is on %+v, want two nodes (the only free GPUs are split)", got)
	}
}

func TestMigrationApplied(t *testing.T) {
	t.Parallel()
	w := newMigWorld(t)
	split(w)
	before := w.decision("j")
	old := w.held(w.s, "j")
	w.finish("fill-n1")
	target := node("n1", 1, 0)
	p := w.propose("p1", "j", target)

	req := w.accept("j", "")
	r := w.lastAnswer("j")
	if r.Name != events.NamePlacementDecided {
		t.Fatalf("answer %s, want placement.decided", r.Name)
	}
	var d events.PlacementDecided
	if err := bus.Decode(r.Name, r.Body, &d); err != nil {
		t.Fatal(err)
	}
	if d.Migration == nil || d.Migration.ProposalID != p.ProposalID || d.Migration.RequestID != req.ID || d.Migration.Reason != events.MigrationCongestion {
		t.Fatalf("migration %+v", d.Migration)
	}
	if !sameGPUs(d.Migration.PreviousNodes, before.Nodes) || d.Migration.PreviousNodes[0].Torchrun != nil {
		t.Errorf("previous nodes %+v, want j's two nodes, bare", d.Migration.PreviousNodes)
	}
	for i := range d.Ranks {
		if d.Ranks[i].Node != p.Ranks[i].Node || d.Ranks[i].GPU != p.Ranks[i].GPU {
			t.Errorf("rank %d on %s/%d, proposed %s/%d", i, d.Ranks[i].Node, d.Ranks[i].GPU, p.Ranks[i].Node, p.Ranks[i].GPU)
		}
	}
	if d.Launch == nil || d.Launch.MasterAddr != "n1" || d.Prediction == nil || d.Nodes[0].CUDAVisibleDevices != "1,0" || len(d.Nodes[0].Torchrun) == 0 {
		t.Errorf("decision not filled like a normal one: launch %+v prediction %+v nodes %+v", d.Launch, d.Prediction, d.Nodes)
	}
	if got := w.held(w.s, "j"); !slices.Equal(got, sorted(target)) {
		t.Errorf("j holds %v, want %v", got, target)
	}
	if dd := w.decision("j"); dd.Migration == nil || dd.DecidedAt.Before(before.DecidedAt) {
		t.Errorf("store keeps decision %+v", dd)
	}
	// The GPUs j left are free: the next job of 4 gets them.
	w.submit(events.JobSubmitted{JobID: "next", GPUs: 4, GPUModel: "A100"})
	got := w.held(w.s, "next")
	for _, k := range old {
		if !slices.Contains(got, k) {
			t.Errorf("next holds %v, without %s that j left", got, k)
		}
	}

	// The same request redelivered: nothing happens.
	n := len(w.answers("j"))
	if err := w.s.OnMigrationAccepted(w.ctx, req, &events.JobMigrationAccepted{JobID: "j"}); err != nil {
		t.Fatal(err)
	}
	if got := len(w.answers("j")); got != n {
		t.Errorf("redelivered request answered again (%d answers, had %d)", got, n)
	}
	// A new request for the applied proposal is refused.
	again := w.accept("j", "p1")
	if ref := w.refusal("j", again); ref.Reasons[0].Code != events.RefusedPlacementChanged {
		t.Errorf("second accept: %+v", ref.Reasons)
	}

	// A fresh replica rebuilt from the stream holds the same, and the
	// redelivered request still does nothing.
	fresh := w.replica()
	for _, job := range []string{"j", "next", "fill-n23"} {
		if got, want := w.held(fresh, job), w.held(w.s, job); !slices.Equal(got, want) {
			t.Errorf("rebuilt: %s holds %v, live %v", job, got, want)
		}
	}
	if got, want := fresh.Store().Snapshot().FreeCount(), w.s.Store().Snapshot().FreeCount(); got != want {
		t.Errorf("rebuilt: %d free GPUs, live %d", got, want)
	}
	if err := fresh.OnMigrationAccepted(w.ctx, req, &events.JobMigrationAccepted{JobID: "j"}); err != nil {
		t.Fatal(err)
	}
	if got := len(w.answers("j")); got != n+1 {
		t.Errorf("redelivery to a rebuilt replica answered (%d answers, want %d)", got, n+1)
	}
}

func sameGPUs(a, b []events.NodePlacement) bool {
	key := func(ns []events.NodePlacement) string { return fmt.Sprint(ns) }
	bare := func(ns []events.NodePlacement) []events.NodePlacement {
		out := make([]events.NodePlacement, len(ns))
		for i, n := range ns {
			out[i] = events.NodePlacement{Node: n.Node, GPUs: n.GPUs, CUDAVisibleDevices: n.CUDAVisibleDevices}
		}
		return out
	}
	return key(bare(a)) == key(bare(b))
}

func TestMigrationRefused(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		// arrange runs after split; it returns the job and proposal id to
		// accept.
		arrange  func(w *migWorld) (job, proposal string)
		code     string
		proposal string // the refusal's proposal_id
	}{
		{name: "no proposal", code: events.RefusedNoProposal,
			arrange: func(w *migWorld) (string, string) { return "j", "" }},
		{name: "unknown job", code: events.RefusedJobNotRunning,
			arrange: func(w *migWorld) (string, string) { return "ghost", "" }},
		{name: "job finished", code: events.RefusedJobNotRunning, proposal: "p1",
			arrange: func(w *migWorld) (string, string) {
				w.finish("fill-n1")
				w.propose("p1", "j", node("n1", 0, 1))
				w.finish("j")
				return "j", "p1"
			}},
		{name: "superseded", code: events.RefusedSuperseded, proposal: "p1",
			arrange: func(w *migWorld) (string, string) {
				w.finish("fill-n1")
				w.propose("p1", "j", node("n1", 0, 1))
				w.propose("p2", "j", node("n1", 1, 0))
				return "j", "p1"
			}},
		{name: "unknown proposal", code: events.RefusedNoProposal, proposal: "nope",
			arrange: func(w *migWorld) (string, string) {
				w.finish("fill-n1")
				w.propose("p1", "j", node("n1", 0, 1))
				return "j", "nope"
			}},
		{name: "target taken since", code: events.RefusedGPUsUnavailable, proposal: "p1",
			arrange: func(w *migWorld) (string, string) {
				w.finish("fill-n1")
				w.propose("p1", "j", node("n1", 0, 1))
				w.submit(events.JobSubmitted{JobID: "thief", GPUs: 1, GPUModel: "A100"})
				if len(w.held(w.s, "thief")) != 1 || w.held(w.s, "thief")[0].Node != "n1" {
					w.t.Fatalf("thief holds %v, want a GPU of n1", w.held(w.s, "thief"))
				}
				return "j", ""
			}},
		{name: "target unhealthy", code: events.RefusedGPUsUnavailable, proposal: "p1",
			arrange: func(w *migWorld) (string, string) {
				w.finish("fill-n1")
				w.propose("p1", "j", node("n1", 0, 1))
				h := &events.TopologyHealth{Node: "n1", Component: events.ComponentGPU, ID: "1", Health: events.HealthUnhealthy, ObservedAt: time.Now().UTC()}
				if err := w.s.OnHealth(w.ctx, w.env(), h); err != nil {
					w.t.Fatal(err)
				}
				return "j", "p1"
			}},
		{name: "job moved since", code: events.RefusedPlacementChanged, proposal: "p2",
			arrange: func(w *migWorld) (string, string) {
				w.finish("fill-n1")
				p := w.propose("p1", "j", node("n1", 0, 1))
				stale := *p
				stale.ProposalID = "p2"
				stale.CurrentNodes = p.Nodes // made against a placement j never had
				w.publish(&stale)
				return "j", "p2"
			}},
		{name: "placement policy denies", code: placement.CodeMigrationPolicyDenied, proposal: "p1",
			arrange: func(w *migWorld) (string, string) {
				w.finish("fill-n1")
				w.propose("p1", "j", node("n1", 0, 1))
				set, err := policies.Compile(fstest.MapFS{"no_n1.rego": {Data: []byte(`package toposched.placement.no_n1

deny contains {"code": "no_n1", "msg": "n1 is being drained"} if {
	some n in input.placement.nodes
	n.name == "n1"
}
`)}}, "no-n1")
				if err != nil {
					w.t.Fatal(err)
				}
				if err := w.s.SetPolicies(w.ctx, set); err != nil {
					w.t.Fatal(err)
				}
				return "j", "p1"
			}},
		{name: "launched by the agents", code: events.RefusedLaunched,
			arrange: func(w *migWorld) (string, string) {
				w.finish("fill-n1")
				w.submit(events.JobSubmitted{JobID: "launched", GPUs: 2, GPUModel: "A100", Command: "python3", Args: []string{"train.py"}})
				if len(w.held(w.s, "launched")) != 2 {
					w.t.Fatalf("launched holds %v, want 2 GPUs", w.held(w.s, "launched"))
				}
				w.propose("p1", "launched", node("n1", 3, 2))
				return "launched", ""
			}},
		{name: "too few ranks", code: events.RefusedInvalid, proposal: "p1",
			arrange: func(w *migWorld) (string, string) {
				w.finish("fill-n1")
				w.propose("p1", "j", node("n1", 0))
				return "j", "p1"
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			w := newMigWorld(t)
			split(w)
			job, proposal := tt.arrange(w)
			before := map[string][]store.GPUKey{}
			for _, id := range []string{"j", "fill-n23", "thief"} {
				before[id] = w.held(w.s, id)
			}
			free := w.s.Store().Snapshot().FreeCount()
			req := w.accept(job, proposal)
			ref := w.refusal(job, req)
			if len(ref.Reasons) != 1 || ref.Reasons[0].Code != tt.code || ref.Reasons[0].Message == "" {
				t.Errorf("reasons %+v, want code %s", ref.Reasons, tt.code)
			}
			if ref.ProposalID != tt.proposal {
				t.Errorf("refusal names proposal %q, want %q", ref.ProposalID, tt.proposal)
			}
			for id, k := range before {
				if got := w.held(w.s, id); !slices.Equal(got, k) {
					t.Errorf("%s holds %v after a refusal, had %v", id, got, k)
				}
			}
			if got := w.s.Store().Snapshot().FreeCount(); got != free {
				t.Errorf("%d free GPUs after a refusal, had %d", got, free)
			}
			t.Logf("%s: %s", ref.Reasons[0].Code, ref.Reasons[0].Message)
		})
	}
}

// The latest proposal is the one stored last, and a replica that never saw
// it live reads it from the stream.
func TestProposalRead(t *testing.T) {
	t.Parallel()
	w := newMigWorld(t)
	split(w)
	w.finish("fill-n1")
	w.propose("p1", "j", node("n1", 0, 1))
	w.propose("p2", "j", node("n1", 1, 0))
	for _, s := range []*placement.Service{w.s, w.replica()} {
		p, err := s.Proposal(w.ctx, "j")
		if err != nil || p == nil || p.ProposalID != "p2" {
			t.Errorf("Proposal = %+v, %v; want p2", p, err)
		}
	}
	w.finish("j")
	if p, err := w.s.Proposal(w.ctx, "j"); err != nil || p != nil {
		t.Errorf("finished job's proposal = %+v, %v; want none", p, err)
	}
}

// A rebuild replays a job decided twice as a move: the second decision
// replaces the first's GPUs, which a later decision may reuse, and a
// release frees only what the job holds last.
func TestRebuildJobDecidedTwice(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		log   []any // after the topology
		holds map[string][]store.GPUKey
		free  int
	}{
		{name: "moved", free: 10,
			log:   []any{decided("a", node("n2", 3), node("n3", 3)), decided("a", node("n1", 0, 1))},
			holds: map[string][]store.GPUKey{"a": node("n1", 0, 1)}},
		{name: "moved, then its old GPUs reused", free: 8,
			log: []any{decided("a", node("n2", 3), node("n3", 3)), decided("a", node("n1", 0, 1)),
				decided("b", node("n2", 3), node("n3", 3))},
			holds: map[string][]store.GPUKey{"a": node("n1", 0, 1), "b": sorted(append(node("n2", 3), node("n3", 3)...))}},
		{name: "moved keeping a GPU, then released", free: 12,
			log: []any{decided("a", node("n1", 0), node("n3", 3)), decided("a", node("n1", 0, 1)),
				&events.PlacementReleased{JobID: "a", Status: events.StatusSucceeded}},
			holds: map[string][]store.GPUKey{"a": nil}},
		{name: "decided twice, same GPUs", free: 10,
			log:   []any{decided("a", node("n1", 0, 1)), decided("a", node("n1", 0, 1))},
			holds: map[string][]store.GPUKey{"a": node("n1", 0, 1)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			w := newMigWorld(t)
			for _, v := range tt.log {
				w.publish(v)
			}
			s := w.replica()
			for job, want := range tt.holds {
				if got := w.held(s, job); !slices.Equal(got, want) {
					t.Errorf("%s holds %v, want %v", job, got, want)
				}
			}
			if got := s.Store().Snapshot().FreeCount(); got != tt.free {
				t.Errorf("%d free GPUs, want %d", got, tt.free)
			}
		})
	}
}

// A job withdrawn before it was analysed, which analysis then rejects,
// stays finished through a rebuild, as it stays in the leader that stored
// its release (which never reads analysis's rejections): the chaos soak
// once saw a new term count one finished job fewer than the log.
func TestRebuildKeepsAFinishedJobFinished(t *testing.T) {
	t.Parallel()
	w := newMigWorld(t)
	w.publish(&events.PlacementReleased{JobID: "gone", Status: events.StatusCancelled})
	w.publish(&events.PlacementRejected{JobID: "gone", Reasons: []events.Reason{{Code: "invalid", Field: "gpus", Message: "by analysis"}}})
	w.publish(&events.PlacementRejected{JobID: "bad", Reasons: []events.Reason{{Code: "invalid", Field: "gpus", Message: "by analysis"}}})
	s := w.replica()
	for id, want := range map[string]store.JobState{"gone": store.JobFinished, "bad": store.JobRejected} {
		if j, ok := s.Store().Snapshot().Job(id); !ok || j.State != want {
			t.Errorf("%s: %v (known %v), want %v", id, j.State, ok, want)
		}
	}
}

// decided is a decision for job on the given GPUs, in rank order.
func decided(job string, gpus ...[]store.GPUKey) *events.PlacementDecided {
	var all []store.GPUKey
	for _, g := range gpus {
		all = append(all, g...)
	}
	d := outcome.Decide(job, all, "topology-aware")
	d.DecidedAt = time.Now().UTC()
	return &d
}
