package placement_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/events/bus"
	"github.com/toposched/toposched/events/eventstest"
	"github.com/toposched/toposched/internal/fixtures"
	"github.com/toposched/toposched/internal/store"
	"github.com/toposched/toposched/services/placement"
)

// Fates of an outcome in lossy.
const (
	stored  = ""         // stored and acknowledged
	refused = "refused"  // the stream says no
	dropped = "dropped"  // never stored, the answer lost
	ackLost = "ack-lost" // stored, the answer lost
)

// lossy is the bus with the fates of chosen outcomes, by job id, in the
// order they are sent.
type lossy struct {
	*bus.Bus
	mu    sync.Mutex
	fates map[string][]string
	// stuck jobs' outcomes are all dropped.
	stuck map[string]bool
}

func (l *lossy) PublishAsync(ctx context.Context, v any) (events.Envelope, *bus.Pending, error) {
	key := events.KeyOf(v)
	l.mu.Lock()
	fate := stored
	if q := l.fates[key]; len(q) > 0 {
		fate, l.fates[key] = q[0], q[1:]
	}
	if l.stuck[key] && fate == stored {
		fate = dropped
	}
	l.mu.Unlock()
	lost := bus.Transient(fmt.Errorf("%w: the answer was lost (test)", bus.ErrUnconfirmed))
	switch fate {
	case refused:
		return events.Envelope{}, bus.Settled(0, bus.Transient(errors.New("the stream refused it (test)"))), nil
	case dropped:
		return events.Envelope{}, bus.Settled(0, lost), nil
	case ackLost:
		env, p, err := l.Bus.PublishAsync(ctx, v)
		if err == nil {
			_, err = p.Wait(ctx)
		}
		if err != nil {
			return env, nil, err
		}
		return env, bus.Settled(0, lost), nil
	}
	return l.Bus.PublishAsync(ctx, v)
}

// cycleRig is a placement service over an embedded server whose nodes are
// in its store, with its outcomes' fates set by the test.
type cycleRig struct {
	b      *bus.Bus
	s      *placement.Service
	pub    *lossy
	queued chan struct{}
}

func newCycleRig(t *testing.T, ctx context.Context, nodes int) *cycleRig {
	t.Helper()
	srv := eventstest.Server(t)
	b := eventstest.Bus(t, srv.ClientURL(), "test")
	for i := range nodes {
		n := fixtures.PlainNode(fmt.Sprintf("n%d", i+1), "A100", 8)
		if _, err := b.Publish(ctx, &n); err != nil {
			t.Fatal(err)
		}
	}
	r := &cycleRig{b: b, pub: &lossy{Bus: b, fates: map[string][]string{}, stuck: map[string]bool{}}, queued: make(chan struct{}, 64)}
	r.s = r.service(t, ctx, placement.Config{})
	return r
}

// service is a new placement service on the rig's server, rebuilt from
// the streams, publishing through the rig's lossy bus.
func (r *cycleRig) service(t *testing.T, ctx context.Context, cfg placement.Config) *placement.Service {
	t.Helper()
	return r.serviceAt(t, ctx, cfg, nil)
}

// serviceAt is service with the clock now (nil: time.Now).
func (r *cycleRig) serviceAt(t *testing.T, ctx context.Context, cfg placement.Config, now func() time.Time) *placement.Service {
	t.Helper()
	s, err := placement.New(cfg, placement.Deps{Publish: r.pub, Read: r.b, Consume: r.b, Subjects: r.b.Subjects, Now: now})
	if err != nil {
		t.Fatal(err)
	}
	s.NotifyQueued(r.queued)
	if err := s.Rebuild(ctx); err != nil {
		t.Fatal(err)
	}
	return s
}

// submit hands s the jobs' analyses, each as the delivery of message
// "a-<job id>", all in one cycle, in the order given, and returns each
// handler's error by job id.
func (r *cycleRig) submit(t *testing.T, ctx context.Context, s *placement.Service, jobs ...events.JobSubmitted) map[string]error {
	t.Helper()
	release := s.HoldCycles()
	type result struct {
		id  string
		err error
	}
	results := make(chan result, len(jobs))
	for _, j := range jobs {
		a := analyzed(t, j)
		env := events.Envelope{ID: "a-" + j.JobID, Subject: j.JobID}
		go func() { results <- result{j.JobID, s.OnAnalyzed(bus.WithCause(ctx, env), env, a)} }()
		select {
		case <-r.queued:
		case <-ctx.Done():
			t.Fatal("a job never reached the intake")
		}
	}
	release()
	errs := map[string]error{}
	for range jobs {
		res := <-results
		errs[res.id] = res.err
	}
	return errs
}

// decisions reads the placement stream's decisions, by job.
func (r *cycleRig) decisions(t *testing.T, ctx context.Context) map[string][]events.PlacementDecided {
	t.Helper()
	out := map[string][]events.PlacementDecided{}
	err := r.b.Replay(ctx, events.DomainPlacement, []string{r.b.Subjects.Of(events.NamePlacementDecided)}, func(rec bus.Record) error {
		var d events.PlacementDecided
		if err := r.b.Decode(events.NamePlacementDecided, rec.Body, &d); err != nil {
			return err
		}
		out[d.JobID] = append(out[d.JobID], d)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// checkBooking fails the test when a job has more than one decision in
// the stream or a GPU is in two jobs' decisions.
func checkBooking(t *testing.T, decided map[string][]events.PlacementDecided) {
	t.Helper()
	owner := map[store.GPUKey]string{}
	for id, ds := range decided {
		if len(ds) != 1 {
			t.Errorf("job %s has %d decisions in the stream, want 1", id, len(ds))
		}
		for _, rk := range ds[0].Ranks {
			k := store.GPUKey{Node: rk.Node, Index: rk.GPU}
			if o, ok := owner[k]; ok {
				t.Errorf("GPU %s booked twice: jobs %s and %s", k, o, id)
			}
			owner[k] = id
		}
	}
}

func state(s *placement.Service, id string) store.JobState {
	j, ok := s.Store().Snapshot().Job(id)
	if !ok {
		return "absent"
	}
	return j.State
}

// A cycle decides its jobs in priority order, then arrival: the job of
// priority 9 that arrived second takes the node the first one would
// have split.
func TestCycleDecidesInPriorityOrder(t *testing.T) {
	t.Parallel()
	ctx := eventstest.Context(t, 30*time.Second)
	r := newCycleRig(t, ctx, 1)
	errs := r.submit(t, ctx, r.s,
		events.JobSubmitted{JobID: "early", GPUs: 4},
		events.JobSubmitted{JobID: "urgent", GPUs: 8, Priority: 9},
		events.JobSubmitted{JobID: "late", GPUs: 4},
	)
	for id, err := range errs {
		if err != nil {
			t.Fatalf("%s: %v", id, err)
		}
	}
	want := map[string]store.JobState{"urgent": store.JobPlaced, "early": store.JobPending, "late": store.JobPending}
	for id, st := range want {
		if got := state(r.s, id); got != st {
			t.Errorf("%s: %s, want %s", id, got, st)
		}
	}
	// The queue keeps arrival order among equals: the first to fit is early.
	if q := r.s.Store().Snapshot().PendingQueue(); len(q) != 2 || q[0].ID != "early" {
		t.Errorf("queue %v, want early then late", q)
	}
	checkBooking(t, r.decisions(t, ctx))
}

// A cycle takes new jobs for cycleBudget: on a clock that moves a second
// a reading, it decides one job, leaves the rest to the intake, and they
// are decided by the next cycles, every one answered.
func TestCycleBudgetLeavesTheRestToTheNext(t *testing.T) {
	t.Parallel()
	ctx := eventstest.Context(t, 30*time.Second)
	r := newCycleRig(t, ctx, 2)
	var mu sync.Mutex
	clock := time.Unix(0, 0)
	s := r.serviceAt(t, ctx, placement.Config{Holder: "slow"}, func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		clock = clock.Add(time.Second)
		return clock
	})
	var jobs []events.JobSubmitted
	for i := range 6 {
		jobs = append(jobs, events.JobSubmitted{JobID: fmt.Sprintf("j%d", i), GPUs: 2})
	}
	for id, err := range r.submit(t, ctx, s, jobs...) {
		if err != nil {
			t.Errorf("%s: %v", id, err)
		}
	}
	for _, j := range jobs {
		if st := state(s, j.JobID); st != store.JobPlaced {
			t.Errorf("%s: %s, want placed", j.JobID, st)
		}
	}
	checkBooking(t, r.decisions(t, ctx))
}

// An outcome the stream refuses is undone in the store and its message
// comes back (the handler's error); the cycle's other outcomes stand. A
// job that would wait for the GPUs the refused decision took is decided
// again before its pending is sent, and takes them: the stream never
// says a job waits while its own state has room for it.
func TestCycleUndoesARefusedOutcome(t *testing.T) {
	t.Parallel()
	ctx := eventstest.Context(t, 30*time.Second)
	r := newCycleRig(t, ctx, 1)
	r.pub.fates["b"] = []string{refused}
	errs := r.submit(t, ctx, r.s,
		events.JobSubmitted{JobID: "a", GPUs: 2},
		events.JobSubmitted{JobID: "b", GPUs: 4},
		events.JobSubmitted{JobID: "c", GPUs: 2},
		events.JobSubmitted{JobID: "d", GPUs: 4}, // no room while b holds 4
	)
	if errs["a"] != nil || errs["c"] != nil || errs["d"] != nil || errs["b"] == nil {
		t.Fatalf("handlers: %v, want only b's to fail", errs)
	}
	want := map[string]store.JobState{"a": store.JobPlaced, "b": "absent", "c": store.JobPlaced, "d": store.JobPlaced}
	for id, st := range want {
		if got := state(r.s, id); got != st {
			t.Errorf("%s: %s, want %s", id, got, st)
		}
	}
	if errs := r.submit(t, ctx, r.s, events.JobSubmitted{JobID: "b", GPUs: 4}); errs["b"] != nil {
		t.Fatalf("b delivered again: %v", errs["b"])
	}
	if st := state(r.s, "b"); st != store.JobPending {
		t.Fatalf("b delivered again: %s, want pending (d has its GPUs)", st)
	}
	decided := r.decisions(t, ctx)
	if len(decided) != 3 || len(decided["b"]) != 0 {
		t.Errorf("decisions for %d jobs, want a, c and d", len(decided))
	}
	checkBooking(t, decided)
}

// An outcome whose answer never came is sent again at once, under the
// same message id, until the stream answers: stored once whether the
// first send was stored or not, and its job's handler succeeds.
func TestCycleConfirmsAnUnconfirmedOutcome(t *testing.T) {
	t.Parallel()
	for _, fate := range []string{dropped, ackLost} {
		t.Run(fate, func(t *testing.T) {
			t.Parallel()
			ctx := eventstest.Context(t, 30*time.Second)
			r := newCycleRig(t, ctx, 1)
			r.pub.fates["b"] = []string{fate, fate}
			errs := r.submit(t, ctx, r.s, events.JobSubmitted{JobID: "a", GPUs: 2}, events.JobSubmitted{JobID: "b", GPUs: 4})
			if errs["a"] != nil || errs["b"] != nil {
				t.Fatalf("handlers: %v", errs)
			}
			if st, free := state(r.s, "b"), r.s.Store().Snapshot().FreeCount(); st != store.JobPlaced || free != 2 {
				t.Fatalf("b: %s with %d GPUs free, want placed with 2", st, free)
			}
			decided := r.decisions(t, ctx)
			if len(decided["b"]) != 1 {
				t.Fatalf("b has %d decisions in the stream, want 1", len(decided["b"]))
			}
			checkBooking(t, decided)
		})
	}
}

// An outcome still unconfirmed when its acknowledgement wait is over (a
// broker outage) is kept in doubt: its GPUs stay held, its message is
// nacked, every later cycle sends it again, its job's delivery is
// answered with that send, not acked as a duplicate while in doubt, and
// no job is said to wait meanwhile.
func TestCycleKeepsAnOutcomeInDoubt(t *testing.T) {
	t.Parallel()
	ctx := eventstest.Context(t, 30*time.Second)
	r := newCycleRig(t, ctx, 1)
	if errs := r.submit(t, ctx, r.s, events.JobSubmitted{JobID: "a", GPUs: 2}); errs["a"] != nil {
		t.Fatal(errs["a"])
	}
	r.pub.stuck["b"] = true
	// b's outcome is sent, and sent again, and never answered.
	r.s.SetAckWait(time.Millisecond)
	errs := r.submit(t, ctx, r.s, events.JobSubmitted{JobID: "b", GPUs: 4})
	if !errors.Is(errs["b"], bus.ErrUnconfirmed) {
		t.Fatalf("b: %v, want unconfirmed", errs["b"])
	}
	if st, free := state(r.s, "b"), r.s.Store().Snapshot().FreeCount(); st != store.JobPlaced || free != 2 {
		t.Fatalf("b in doubt: %s with %d GPUs free, want placed with 2 (its GPUs held)", st, free)
	}
	// The next cycle sends b's decision again, still unanswered: b's
	// delivery is not acked, and c, which would wait for b's GPUs, is
	// left for later: a pending now could precede b's decision in the
	// stream, or be said while the stream has room.
	errs = r.submit(t, ctx, r.s, events.JobSubmitted{JobID: "b", GPUs: 4}, events.JobSubmitted{JobID: "c", GPUs: 8})
	if !errors.Is(errs["b"], bus.ErrUnconfirmed) || !errors.Is(errs["c"], bus.ErrLater) {
		t.Fatalf("second cycle: %v, want b's unconfirmed and c's left for later", errs)
	}
	if st := state(r.s, "c"); st != "absent" {
		t.Fatalf("c: %s, want absent (nothing recorded)", st)
	}
	// The broker answers again: the next cycle stores it, and b's
	// delivery is a duplicate now. The wait is a real one again: a
	// millisecond is too short for a stored acknowledgement on a busy
	// machine (this failed in CI).
	r.pub.mu.Lock()
	r.pub.stuck["b"] = false
	r.pub.mu.Unlock()
	r.s.SetAckWait(10 * time.Second)
	errs = r.submit(t, ctx, r.s, events.JobSubmitted{JobID: "b", GPUs: 4}, events.JobSubmitted{JobID: "c", GPUs: 8})
	if errs["b"] != nil || errs["c"] != nil {
		t.Fatalf("third cycle: %v", errs)
	}
	if st := state(r.s, "c"); st != store.JobPending {
		t.Fatalf("c: %s, want pending (b holds its GPUs)", st)
	}
	decided := r.decisions(t, ctx)
	if len(decided["b"]) != 1 {
		t.Fatalf("b has %d decisions in the stream, want 1", len(decided["b"]))
	}
	checkBooking(t, decided)
}

// A replica that stops mid-cycle (some outcomes stored, one stored with
// its answer lost, the rest never sent) loses no job and books no GPU
// twice: the next term rebuilds from the stream, and every job's message,
// delivered again, is decided there once.
func TestCrashMidCycle(t *testing.T) {
	t.Parallel()
	ctx := eventstest.Context(t, 30*time.Second)
	r := newCycleRig(t, ctx, 2)
	var jobs []events.JobSubmitted
	for i := range 7 {
		jobs = append(jobs, events.JobSubmitted{JobID: fmt.Sprintf("j%d", i), GPUs: 2})
	}
	// j3's decision is stored but its answer lost, j4 to j6's never
	// stored; the replica gives up on them and is gone.
	r.pub.fates["j3"] = []string{ackLost}
	for _, id := range []string{"j3", "j4", "j5", "j6"} {
		r.pub.stuck[id] = true
	}
	r.s.SetAckWait(time.Millisecond)
	r.submit(t, ctx, r.s, jobs...)
	r.pub.mu.Lock()
	clear(r.pub.stuck)
	r.pub.mu.Unlock()

	next := r.service(t, ctx, placement.Config{Holder: "r2"})
	for id, err := range r.submit(t, ctx, next, jobs...) {
		if err != nil {
			t.Errorf("%s delivered to the next term: %v", id, err)
		}
	}
	for _, j := range jobs {
		if st := state(next, j.JobID); st != store.JobPlaced {
			t.Errorf("%s: %s, want placed", j.JobID, st)
		}
	}
	if free := next.Store().Snapshot().FreeCount(); free != 2 {
		t.Errorf("%d GPUs free, want 2", free)
	}
	decided := r.decisions(t, ctx)
	if len(decided) != len(jobs) {
		t.Errorf("decisions for %d jobs, want %d", len(decided), len(jobs))
	}
	checkBooking(t, decided)
}

// A job is decided under its handler's values but not its deadline (a
// job that waited in the intake behind a long cycle would have its node
// policies cut off, each failing closed), and not past the term's end.
func TestDecisionOutlivesItsHandler(t *testing.T) {
	t.Parallel()
	s := newCycleRig(t, eventstest.Context(t, 30*time.Second), 1).s
	life, end := context.WithCancel(context.Background())
	defer end()
	s.SetLife(life)
	env := events.Envelope{ID: "m1", CorrelationID: "c1"}
	handler, expire := context.WithTimeout(bus.WithCause(context.Background(), env), time.Hour)
	dctx, cancel := s.Decision(handler)
	defer cancel()
	expire() // the handler's time runs out mid-decision
	if err := dctx.Err(); err != nil {
		t.Fatalf("decision ended with its handler: %v", err)
	}
	if cause, ok := bus.CauseFrom(dctx); !ok || cause.CorrelationID != "c1" {
		t.Errorf("decision lost its handler's cause: %+v %v", cause, ok)
	}
	if _, ok := dctx.Deadline(); !ok {
		t.Error("a decision has no deadline of its own")
	}
	end() // the term ends
	<-dctx.Done()
}

// A decision the term's end cuts short sends nothing: its policies and
// catch-up fail once the term's life ends, so its message is left, fenced,
// for the current term (a warning, not an error, and no dead letter).
func TestDecisionCutShortByTheTermsEnd(t *testing.T) {
	t.Parallel()
	ctx := eventstest.Context(t, 30*time.Second)
	r := newCycleRig(t, ctx, 1)
	life, end := context.WithCancelCause(context.Background())
	r.s.SetLife(life)
	end(errors.New("a newer term started"))
	errs := r.submit(t, ctx, r.s, events.JobSubmitted{JobID: "a", GPUs: 2})
	if !errors.Is(errs["a"], bus.ErrFenced) {
		t.Fatalf("a: %v, want fenced", errs["a"])
	}
	if st := state(r.s, "a"); st != "absent" {
		t.Errorf("a: %s, want absent (nothing recorded)", st)
	}
	if d := r.decisions(t, ctx); len(d) != 0 {
		t.Errorf("decisions sent: %v", d)
	}
}
