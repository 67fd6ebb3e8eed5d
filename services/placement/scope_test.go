package placement_test

import (
	"encoding/json"
	"slices"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/events/bus"
	"github.com/toposched/toposched/internal/store"
	"github.com/toposched/toposched/services/placement"
)

// finishAs finishes job id under scope and returns placement's refusal,
// nil when the finish was taken.
func (w *migWorld) finishAs(scope events.Scope, id string) *events.PlacementFinishRefused {
	w.t.Helper()
	env := w.env()
	env.Scope = scope
	var refused *events.PlacementFinishRefused
	stop := w.watch(events.NamePlacementFinishRefused, func(r bus.Record) {
		if v := new(events.PlacementFinishRefused); w.b.Decode(r.Name, r.Body, v) == nil && v.RequestID == env.ID {
			refused = v
		}
	})
	if err := w.s.OnFinished(w.ctx, env, &events.JobFinished{JobID: id, Status: events.StatusCancelled}); err != nil {
		w.t.Fatal(err)
	}
	stop()
	return refused
}

// watch reads what is stored of one placement event from now on, until
// the returned function is called (which waits for everything stored
// before it).
func (w *migWorld) watch(name events.Name, fn func(bus.Record)) (stop func()) {
	w.t.Helper()
	m, err := w.b.JetStream().Stream(w.ctx, w.b.StreamName(events.DomainPlacement))
	if err != nil {
		w.t.Fatal(err)
	}
	info, err := m.Info(w.ctx)
	if err != nil {
		w.t.Fatal(err)
	}
	from := info.State.LastSeq
	return func() {
		err := w.b.ReplayFrom(w.ctx, events.DomainPlacement, []string{w.b.Subjects.Of(name)}, from, func(r bus.Record) error {
			fn(r)
			return nil
		})
		if err != nil {
			w.t.Fatal(err)
		}
	}
}

// A tenant finishes its own jobs, a node's agent the jobs whose rank 0 it
// runs, the services any job; any other finish is refused (not_permitted)
// and the job keeps its GPUs. The forged ranks_exited and cancellation of
// another user's job (issue 46) ended jobs it had no part in.
func TestFinishOnlyOwnPart(t *testing.T) {
	t.Parallel()
	w := newMigWorld(t)
	w.submit(events.JobSubmitted{JobID: "ours", GPUs: 6, GPUsPerNode: 3, Tenant: "research"})
	d := w.decision("ours")
	lead, other := d.Ranks[0].Node, d.Ranks[len(d.Ranks)-1].Node
	if lead == other {
		t.Fatalf("ours is on one node (%s), want two", lead)
	}
	for _, tc := range []struct {
		name  string
		scope events.Scope
	}{
		{"another tenant", events.TenantScope("ads")},
		{"a node of the job that does not run rank 0", events.NodeScope(other)},
		{"a node the job does not run on", events.NodeScope("elsewhere")},
	} {
		ref := w.finishAs(tc.scope, "ours")
		if ref == nil || len(ref.Reasons) != 1 || ref.Reasons[0].Code != events.CodeNotPermitted {
			t.Errorf("%s: refusal %+v, want one %s", tc.name, ref, events.CodeNotPermitted)
		}
		if got := w.held(w.s, "ours"); len(got) != 6 {
			t.Fatalf("%s: ours holds %v after a refused finish, want its 6 GPUs", tc.name, got)
		}
	}
	if ref := w.finishAs(events.NodeScope(lead), "ours"); ref != nil {
		t.Fatalf("the lead node's finish refused: %+v", ref.Reasons)
	}
	if j, _ := w.s.Store().Snapshot().Job("ours"); j.State != store.JobFinished {
		t.Fatalf("ours is %s after its lead node's finish, want finished", j.State)
	}

	w.submit(events.JobSubmitted{JobID: "mine", GPUs: 1, Tenant: "research"})
	if ref := w.finishAs(events.TenantScope("research"), "mine"); ref != nil {
		t.Fatalf("a tenant's finish of its own job refused: %+v", ref.Reasons)
	}
	w.submit(events.JobSubmitted{JobID: "theirs", GPUs: 1, Tenant: "ads"})
	if ref := w.finishAs(events.Scope{}, "theirs"); ref != nil {
		t.Fatalf("the services' finish refused: %+v", ref.Reasons)
	}
}

// A tenant may withdraw its job before placement has seen it, but that
// withdrawal holds for its own job of that id alone: another tenant
// cannot keep a job from ever being placed by finishing its id first.
func TestWithdrawalHoldsForTheTenantOnly(t *testing.T) {
	t.Parallel()
	w := newMigWorld(t)
	if ref := w.finishAs(events.TenantScope("ads"), "early"); ref != nil {
		t.Fatalf("withdrawal refused: %+v", ref.Reasons)
	}
	w.submit(events.JobSubmitted{JobID: "early", GPUs: 2, Tenant: "research"})
	if j, _ := w.s.Store().Snapshot().Job("early"); j.State != store.JobPlaced {
		t.Fatalf("research's job withdrawn by ads is %s, want placed", j.State)
	}

	if ref := w.finishAs(events.TenantScope("research"), "late"); ref != nil {
		t.Fatalf("withdrawal refused: %+v", ref.Reasons)
	}
	for _, s := range []*placement.Service{w.s, w.replica()} {
		if j, _ := s.Store().Snapshot().Job("late"); j.State != store.JobFinished || j.WithdrawnBy != "research" {
			t.Fatalf("withdrawn job: %s by %q, want finished by research (through a rebuild too)", j.State, j.WithdrawnBy)
		}
	}
	w.submit(events.JobSubmitted{JobID: "late", GPUs: 2, Tenant: "research"})
	if j, _ := w.s.Store().Snapshot().Job("late"); j.State != store.JobFinished {
		t.Fatalf("research's job withdrawn by research is %s, want finished", j.State)
	}
}

// A tenant accepts migrations of its own jobs only.
func TestMigrationAcceptOnlyOwnJobs(t *testing.T) {
	t.Parallel()
	w := newMigWorld(t)
	w.submit(events.JobSubmitted{JobID: "j", GPUs: 2, Tenant: "research"})
	env := w.env()
	env.Scope = events.TenantScope("ads")
	var refused *events.PlacementMigrationRefused
	stop := w.watch(events.NamePlacementMigrationRefused, func(r bus.Record) {
		if v := new(events.PlacementMigrationRefused); w.b.Decode(r.Name, r.Body, v) == nil && v.RequestID == env.ID {
			refused = v
		}
	})
	if err := w.s.OnMigrationAccepted(w.ctx, env, &events.JobMigrationAccepted{JobID: "j"}); err != nil {
		t.Fatal(err)
	}
	stop()
	if refused == nil || refused.Reasons[0].Code != events.CodeNotPermitted {
		t.Fatalf("refusal %+v, want %s", refused, events.CodeNotPermitted)
	}
}

// A rebuild takes in only the outcomes a placement term wrote: a decision
// published without a term's fence (issue 46: a client on the open
// loopback listener stored one for a GPU another job held, and after a
// restart 41 jobs sat on 40 GPUs), or fenced on something that is no
// term, is ignored, counted and logged; so is a decision for GPUs another
// job holds.
func TestRebuildIgnoresOutcomesNoTermWrote(t *testing.T) {
	t.Parallel()
	w := newMigWorld(t)
	w.submit(events.JobSubmitted{JobID: "real", GPUs: 4, GPUsPerNode: 4})
	held := w.held(w.s, "real")
	grab := func(job string, gpus []store.GPUKey) *events.PlacementDecided {
		return decided(job, gpus)
	}
	raw := func(v any, headers map[string]string) {
		t.Helper()
		body, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		msg := nats.NewMsg(w.b.Subjects.Of(events.NamePlacementDecided))
		for k, v := range headers {
			msg.Header.Set(k, v)
		}
		msg.Data = body
		if _, err := w.b.JetStream().PublishMsg(w.ctx, msg); err != nil {
			t.Fatal(err)
		}
	}
	// JetStream stores a fence it can check, so a forger's fence can
	// only name a real term's marker (which the permissions must keep it
	// from), or another subject.
	raw(grab("forged", held[:1]), nil)
	raw(grab("forged-fence", held[1:2]), map[string]string{
		"Nats-Expected-Last-Subject-Sequence-Subject": w.b.Subjects.Of(events.NameJobSubmitted),
		"Nats-Expected-Last-Subject-Sequence":         "0",
	})
	w.publish(grab("conflict", held[2:3])) // fenced, but on GPUs real holds
	s := w.replica()
	if got := w.held(s, "real"); !slices.Equal(got, held) {
		t.Fatalf("real holds %v after the rebuild, want %v", got, held)
	}
	for _, id := range []string{"forged", "forged-fence", "conflict"} {
		if j, ok := s.Store().Snapshot().Job(id); ok && j.State == store.JobPlaced {
			t.Errorf("%s is placed after the rebuild", id)
		}
	}
	got := s.RebuildIgnored()
	if got[placement.IgnoredUnfenced] != 2 || got[placement.IgnoredConflict] != 1 {
		t.Fatalf("ignored %v, want 2 unfenced and 1 conflict", got)
	}
}
