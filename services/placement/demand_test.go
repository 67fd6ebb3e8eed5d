package placement_test

import (
	"context"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/events/bus"
	"github.com/toposched/toposched/events/eventstest"
	"github.com/toposched/toposched/internal/demand"
	"github.com/toposched/toposched/services/placement"
)

// The service feeds its forecast of demand on its own clock (a replay's
// virtual one): every job decided for the first time arrives, a waiting
// one is queued, a placed one runs until released, when its run time is
// learned.
func TestDemandFedOnTheServiceClock(t *testing.T) {
	t.Parallel()
	ctx := eventstest.Context(t, 30*time.Second)
	r := newCycleRig(t, ctx, 1)
	var mu sync.Mutex
	clock := time.Date(2026, 5, 1, 8, 0, 0, 0, time.UTC)
	now := func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		return clock
	}
	s := r.serviceAt(t, ctx, placement.Config{}, now)
	for id, err := range r.submit(t, ctx, s,
		events.JobSubmitted{JobID: "urgent", GPUs: 8, Priority: 9},
		events.JobSubmitted{JobID: "early", GPUs: 4},
		events.JobSubmitted{JobID: "late", GPUs: 4},
	) {
		if err != nil {
			t.Fatalf("%s: %v", id, err)
		}
	}
	f := s.Demand()
	if _, ok := f.RunTime(8); ok {
		t.Error("a run time learned before any job ended")
	}
	if rate := f.Rate(1, "", now()); rate != 0 {
		t.Errorf("rate %g at the first arrivals' instant, want 0 (no time has passed)", rate)
	}
	need := f.Need(demand.Shape{Model: "A100", MinGPUs: 4, Within: time.Hour, Now: now()})
	if need.Queued != 2 {
		t.Errorf("%d jobs of 4+ GPUs queued, want early and late", need.Queued)
	}
	mu.Lock()
	clock = clock.Add(90 * time.Minute)
	mu.Unlock()
	if err := s.OnFinished(ctx, events.Envelope{ID: "f-urgent"}, &events.JobFinished{JobID: "urgent", Status: events.StatusSucceeded}); err != nil {
		t.Fatal(err)
	}
	if d, ok := f.RunTime(8); !ok || d != 90*time.Minute {
		t.Errorf("run time of 8-GPU jobs %v %v, want 1h30m", d, ok)
	}
	// The release placed early and late from the queue: none waits now,
	// and none was counted twice.
	if need := f.Need(demand.Shape{Model: "A100", MinGPUs: 4, Within: time.Hour, Now: now()}); need.Queued != 0 {
		t.Errorf("%d jobs queued after the release, want 0", need.Queued)
	}
	if jobs, _ := f.Tracked(); jobs != 2 {
		t.Errorf("%d jobs tracked, want the 2 running", jobs)
	}
	// A rebuild seeds a new forecast with the running jobs from the store,
	// and no rate.
	g := s.ReseedDemand()
	if jobs, keys := g.Tracked(); jobs != 2 || keys != 0 {
		t.Errorf("rebuilt: %d jobs and %d rates tracked, want the 2 running and none", jobs, keys)
	}
	if all, eight := f.Rate(1, "", now()), f.Rate(8, "", now()); math.Abs(all-3*eight) > 1e-12*all {
		t.Errorf("rate of every job %g, want 3 times the 8-GPU jobs' %g: three arrivals, each counted once", all, eight)
	}
}

// jumping is a publisher that moves the clock on once a release is
// published, as a replay does once it sees the release.
type jumping struct {
	*bus.Bus
	jump func()
}

func (p jumping) Publish(ctx context.Context, v any) (events.Envelope, error) {
	env, err := p.Bus.Publish(ctx, v)
	if _, ok := v.(*events.PlacementReleased); ok {
		p.jump()
	}
	return env, err
}

// A run time is learned from the clock when the finish is handled, read
// before the release is published: a replay's clock moves on once it sees
// the release, and a run learned after that would depend on how fast
// placement handled it.
func TestDemandRunTimeReadBeforeTheRelease(t *testing.T) {
	t.Parallel()
	ctx := eventstest.Context(t, 30*time.Second)
	r := newCycleRig(t, ctx, 1)
	var mu sync.Mutex
	clock := time.Date(2026, 5, 1, 8, 0, 0, 0, time.UTC)
	now := func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		return clock
	}
	advance := func(d time.Duration) {
		mu.Lock()
		defer mu.Unlock()
		clock = clock.Add(d)
	}
	s, err := placement.New(placement.Config{}, placement.Deps{Publish: jumping{r.b, func() { advance(10 * time.Hour) }},
		Read: r.b, Consume: r.b, Subjects: r.b.Subjects, Now: now})
	if err != nil {
		t.Fatal(err)
	}
	s.NotifyQueued(r.queued)
	if err := s.Rebuild(ctx); err != nil {
		t.Fatal(err)
	}
	for id, err := range r.submit(t, ctx, s, events.JobSubmitted{JobID: "j", GPUs: 8}) {
		if err != nil {
			t.Fatalf("%s: %v", id, err)
		}
	}
	advance(90 * time.Minute)
	if err := s.OnFinished(ctx, events.Envelope{ID: "f-j"}, &events.JobFinished{JobID: "j", Status: events.StatusSucceeded}); err != nil {
		t.Fatal(err)
	}
	if d, ok := s.Demand().RunTime(8); !ok || d != 90*time.Minute {
		t.Errorf("run time %v %v, want 1h30m (the clock when the finish was handled)", d, ok)
	}
}
