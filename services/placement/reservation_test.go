package placement

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/events/eventstest"
	"github.com/toposched/toposched/internal/formats/clusterfile"
	"github.com/toposched/toposched/internal/pattern"
	"github.com/toposched/toposched/internal/placer"
	"github.com/toposched/toposched/internal/store"
	"github.com/toposched/toposched/policies"
)

// A large job at the head of the queue gets nodes held once it has waited
// ReserveAfter: a small job that would backfill the freed GPUs waits
// instead, and the large job is placed when the holders finish.
func TestReservationStopsStarvation(t *testing.T) {
	t.Parallel()
	after := 10 * time.Minute
	r := newClockedRig(t, Config{ReserveAfter: &after}, map[string]string{"n0": "dgx-a100", "n1": "dgx-a100"})
	s, finish := r.s, r.finish
	submit := func(id string, gpus, prio int) store.Job {
		t.Helper()
		return r.submit(events.JobSubmitted{JobID: id, GPUs: gpus, Priority: prio})
	}
	state := func(id string) store.JobState { return r.job(id).State }

	submit("a", 4, 0)
	submit("b", 4, 0)
	if j := submit("large", 16, 0); j.State != store.JobPending {
		t.Fatalf("large: %s, want pending", j.State)
	}
	// Before ReserveAfter, small jobs backfill.
	if j := submit("s1", 4, 0); j.State != store.JobPlaced {
		t.Fatalf("s1 before the hold: %s, want placed", j.State)
	}
	finish("s1")
	r.clock = r.clock.Add(11 * time.Minute)
	// After it, the freed GPUs are held for large.
	j := submit("s2", 4, 0)
	if j.State != store.JobPending || !strings.Contains(j.Reasons[len(j.Reasons)-1].Code, placer.CodeReserved) {
		t.Fatalf("s2 after the hold: %s %v, want pending behind the reservation", j.State, j.Reasons)
	}
	if r := s.Reservation(); r == nil || r.JobID != "large" || len(r.Nodes) != 2 {
		t.Fatalf("reservation %+v, want both nodes for large", r)
	}
	// A higher priority is not held back.
	if j := submit("urgent", 4, 9); j.State != store.JobPlaced {
		t.Fatalf("urgent: %s %v, want placed", j.State, j.Reasons)
	}
	finish("urgent")
	finish("a")
	if state("large") != store.JobPending || state("s2") != store.JobPending {
		t.Fatalf("after a: large %s, s2 %s; want both waiting (s2 must not take the freed GPUs)", state("large"), state("s2"))
	}
	finish("b")
	if state("large") != store.JobPlaced || state("s2") != store.JobPending {
		t.Fatalf("after b: large %s, s2 %s; want large placed, s2 waiting", state("large"), state("s2"))
	}
	if s.Reservation() != nil {
		t.Errorf("reservation %+v after large was placed, want none", s.Reservation())
	}
	finish("large")
	if state("s2") != store.JobPlaced {
		t.Errorf("s2 after large: %s, want placed", state("s2"))
	}
}

// Nodes held for the head take a job expected to end before the jobs on
// them, from the run times learned for each size, and only such a job;
// with backfill off, none. A backfilled job that runs past its mean
// delays the head (the trade EASY makes).
func TestBackfillOntoHeldNodes(t *testing.T) {
	t.Parallel()
	for _, backfill := range []bool{true, false} {
		t.Run(fmt.Sprint("backfill=", backfill), func(t *testing.T) {
			t.Parallel()
			now := time.Duration(0)
			r := newClockedRig(t, Config{ReserveAfter: &now, Backfill: backfill}, map[string]string{"n0": "dgx-a100", "n1": "dgx-a100"})
			// 1-GPU jobs run 10 minutes, 2-GPU jobs two and a half
			// hours, 3-4-GPU jobs three, 5-8-GPU jobs two.
			r.learnRunTimes(map[int]time.Duration{1: 10 * time.Minute, 2: 150 * time.Minute, 4: 3 * time.Hour, 8: 2 * time.Hour})
			start := r.clock
			for _, j := range []events.JobSubmitted{{JobID: "four", GPUs: 4}, {JobID: "eight", GPUs: 8}} {
				if got := r.submit(j); got.State != store.JobPlaced {
					t.Fatalf("%s: %s, want placed", j.JobID, got.State)
				}
			}
			if j := r.submit(events.JobSubmitted{JobID: "large", GPUs: 16}); j.State != store.JobPending {
				t.Fatalf("large: %s, want pending", j.State)
			}
			// The held nodes drain in three hours (four's end); a
			// 10-minute job ends long before.
			s := r.submit(events.JobSubmitted{JobID: "s", GPUs: 1})
			if res := r.s.Reservation(); res == nil || res.JobID != "large" {
				t.Fatalf("reservation %+v, want large's", res)
			}
			want := store.JobPending
			if backfill {
				want = store.JobPlaced
			}
			if s.State != want {
				t.Fatalf("s: %s %v, want %s", s.State, s.Reasons, want)
			}
			// An hour on, a 2-GPU job would outlast them by half an hour.
			r.clock = start.Add(time.Hour)
			if j := r.submit(events.JobSubmitted{JobID: "s2", GPUs: 2}); j.State != store.JobPending || !strings.Contains(j.Reasons[len(j.Reasons)-1].Code, placer.CodeReserved) {
				t.Fatalf("s2: %s %v, want pending behind the reservation", j.State, j.Reasons)
			}
			r.clock = start.Add(3 * time.Hour)
			r.finish("four")
			r.finish("eight")
			if !backfill {
				if j := r.job("large"); j.State != store.JobPlaced {
					t.Fatalf("large once the held nodes drained: %s %v, want placed", j.State, j.Reasons)
				}
				return
			}
			// s runs past its mean: large waits for it.
			if j := r.job("large"); j.State != store.JobPending {
				t.Fatalf("large while s runs: %s, want pending", j.State)
			}
			r.finish("s")
			if j := r.job("large"); j.State != store.JobPlaced {
				t.Fatalf("large once s ended: %s %v, want placed", j.State, j.Reasons)
			}
		})
	}
}

// The fullest-free nodes for a 32-GPU head lie under three leaf switches,
// which the shipped leaf_span policy does not let it span: it is held the
// nodes of two leaves instead, filled leaf by leaf, and starts there once
// they are free.
func TestReservationHoldsNodesThePoliciesAllow(t *testing.T) {
	t.Parallel()
	set, err := policies.Compile(policies.Default, "default")
	if err != nil {
		t.Fatal(err)
	}
	now := time.Duration(0)
	names := []string{"a0", "a1", "b0", "b1", "c0", "c1"}
	nodes := map[string]string{}
	for _, n := range names {
		nodes[n] = "dgx-a100"
	}
	r := newClockedRig(t, Config{ReserveAfter: &now, Policies: set}, nodes)
	fabric := &events.TopologyFabric{Cluster: "c", Switches: []events.Switch{
		{Name: "l1", Tier: "leaf", Nodes: []string{"a0", "a1"}},
		{Name: "l2", Tier: "leaf", Nodes: []string{"b0", "b1"}},
		{Name: "l3", Tier: "leaf", Nodes: []string{"c0", "c1"}},
		{Name: "s", Tier: "spine", Switches: []string{"l1", "l2", "l3"}},
	}}
	if err := r.s.OnFabric(r.ctx, events.Envelope{}, fabric); err != nil {
		t.Fatal(err)
	}
	// GPUs another scheduler holds: 7, 6, 7, 5, 7 and 5 free.
	hold := func(node string, n int) {
		t.Helper()
		h := &events.TopologyHeld{Node: node, ObservedAt: r.clock}
		for i := range n {
			h.GPUs = append(h.GPUs, events.HeldGPU{Index: i, By: "claim other/" + node})
		}
		if err := r.s.OnHeld(r.ctx, events.Envelope{}, h); err != nil {
			t.Fatal(err)
		}
	}
	for node, n := range map[string]int{"a0": 1, "a1": 2, "b0": 1, "b1": 3, "c0": 1, "c1": 3} {
		hold(node, n)
	}
	j := r.submit(events.JobSubmitted{JobID: "head", GPUs: 32, GPUsPerNode: 8})
	if j.State != store.JobPending {
		t.Fatalf("head: %s on %v, want pending", j.State, spanned(j))
	}
	r.submit(events.JobSubmitted{JobID: "later", GPUs: 1})
	res := r.s.Reservation()
	if res == nil || res.JobID != "head" {
		t.Fatalf("reservation %+v, want head's", res)
	}
	if got := slices.Sorted(maps.Keys(res.Nodes)); !slices.Equal(got, []string{"a0", "a1", "b0", "b1"}) {
		t.Fatalf("held %v, want a0 a1 b0 b1 (two leaves; the fullest-free a0 b0 c0 a1 span three)", got)
	}
	if l := r.job("later"); l.State != store.JobPlaced || !strings.HasPrefix(spanned(l)[0], "c") {
		t.Fatalf("later: %s on %v, want placed on a node of l3", l.State, spanned(l))
	}
	for _, n := range []string{"a0", "a1", "b0", "b1"} {
		hold(n, 0) // given back: placement retries the queue
	}
	if j := r.job("head"); j.State != store.JobPlaced || !slices.Equal(spanned(j), []string{"a0", "a1", "b0", "b1"}) {
		t.Fatalf("head once its nodes are free: %s on %v %v, want placed on a0 a1 b0 b1", j.State, spanned(j), j.Reasons)
	}
}

// Under the Compact rule the head is held nodes it would run on within the
// bound: two busy NVSwitch nodes rather than the two empty PCIe servers
// (the most free GPUs), on which a TP-8 job would run several times as
// slow. It starts on the NVSwitch nodes once they drain.
func TestReservationHoldsFastNodes(t *testing.T) {
	t.Parallel()
	after := 10 * time.Minute
	r := newClockedRig(t, Config{ReserveAfter: &after},
		map[string]string{"fast0": "dgx-a100", "fast1": "dgx-a100", "slow0": "pcie-8gpu", "slow1": "pcie-8gpu"})
	s, submit, finish := r.s, r.submit, r.finish
	on := map[string]string{} // node → the whole-node job on it
	for i := range 4 {
		id := fmt.Sprintf("w%d", i)
		j := submit(events.JobSubmitted{JobID: id, GPUs: 8, GPUsPerNode: 8})
		if j.State != store.JobPlaced || len(spanned(j)) != 1 {
			t.Fatalf("%s: %s on %v, want one whole node", id, j.State, spanned(j))
		}
		on[spanned(j)[0]] = id
	}
	finish(on["slow0"])
	finish(on["slow1"])
	if j := submit(bigTP8Job()); j.State != store.JobPending || j.Reasons[0].Code != placer.CodeCompactAwaited {
		t.Fatalf("big on the PCIe servers: %s %+v, want pending for %s", j.State, j.Reasons, placer.CodeCompactAwaited)
	}
	r.clock = r.clock.Add(11 * time.Minute)
	if j := submit(events.JobSubmitted{JobID: "small", GPUs: 1}); j.State != store.JobPlaced || !strings.HasPrefix(spanned(j)[0], "slow") {
		t.Fatalf("small: %s on %v, want placed on a PCIe server", j.State, spanned(j))
	}
	if r := s.Reservation(); r == nil || r.JobID != "big" || !r.Nodes["fast0"] || !r.Nodes["fast1"] || len(r.Nodes) != 2 {
		t.Fatalf("reservation %+v, want fast0 and fast1 for big", r)
	}
	finish(on["fast0"])
	if j := r.job("big"); j.State != store.JobPending {
		t.Fatalf("big with fast0 alone free: %s on %v, want pending", j.State, spanned(j))
	}
	finish(on["fast1"])
	if j := r.job("big"); j.State != store.JobPlaced || !slices.Equal(spanned(j), []string{"fast0", "fast1"}) {
		t.Fatalf("big: %s on %v, want placed on fast0, fast1", j.State, spanned(j))
	}
}

// clockedRig is a placement service on a test server, its nodes made from
// built-in models, with a clock the test moves.
type clockedRig struct {
	t     *testing.T
	s     *Service
	ctx   context.Context
	clock time.Time
}

func newClockedRig(t *testing.T, cfg Config, nodes map[string]string) *clockedRig {
	t.Helper()
	srv := eventstest.Server(t)
	b := eventstest.Bus(t, srv.ClientURL(), "test")
	r := &clockedRig{t: t, ctx: eventstest.Context(t, 30*time.Second), clock: time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)}
	s, err := New(cfg, Deps{Publish: b, Read: b, Consume: b, Subjects: b.Subjects, Now: func() time.Time { return r.clock }})
	if err != nil {
		t.Fatal(err)
	}
	r.s = s
	for _, name := range slices.Sorted(maps.Keys(nodes)) {
		m, err := clusterfile.Model(nodes[name])
		if err != nil {
			t.Fatal(err)
		}
		m.Name = name
		ev := m.Event()
		if err := s.OnNode(r.ctx, events.Envelope{}, &ev); err != nil {
			t.Fatal(err)
		}
	}
	return r
}

// submit hands the job, analysed, to the service and returns its row.
func (r *clockedRig) submit(sub events.JobSubmitted) store.Job {
	r.t.Helper()
	a, reasons := pattern.Analyze(sub)
	if len(reasons) > 0 {
		r.t.Fatal(reasons)
	}
	if err := r.s.OnAnalyzed(r.ctx, events.Envelope{}, &a); err != nil {
		r.t.Fatal(err)
	}
	return r.job(sub.JobID)
}

func (r *clockedRig) job(id string) store.Job {
	j, _ := r.s.Store().Snapshot().Job(id)
	return j
}

func (r *clockedRig) finish(id string) {
	r.t.Helper()
	if err := r.s.OnFinished(r.ctx, events.Envelope{}, &events.JobFinished{JobID: id, Status: events.StatusSucceeded}); err != nil {
		r.t.Fatal(err)
	}
}

// bigTP8Job is a 16-GPU Megatron job, TP 8, with a model size (so the
// Compact rule applies): fast on two NVSwitch nodes, several times as
// slow where its TP groups cross PCIe or the network.
func bigTP8Job() events.JobSubmitted {
	return events.JobSubmitted{JobID: "big", GPUs: 16, Strategy: events.StrategyMegatron,
		Parallelism: &events.Parallelism{TP: 8, PP: 1, DP: 2},
		Model: &events.Model{Parameters: 7_000_000_000, Layers: 32, HiddenSize: 4096, Heads: 32,
			SeqLen: 2048, MicroBatchSize: 1, GlobalBatchSize: 16, Dtype: events.DtypeBF16}}
}
