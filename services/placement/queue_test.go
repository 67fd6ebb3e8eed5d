package placement

import (
	"strings"
	"testing"
	"time"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/internal/store"
)

// learnRunTimes runs one job of each size for its time, so that the
// service's forecast has learned them.
func (r *clockedRig) learnRunTimes(runs map[int]time.Duration) {
	r.t.Helper()
	for gpus, run := range runs {
		id := "learn-" + strings.Repeat("x", gpus)
		if j := r.submit(events.JobSubmitted{JobID: id, GPUs: gpus}); j.State != store.JobPlaced {
			r.t.Fatalf("%s: %s, want placed on the empty cluster", id, j.State)
		}
		r.clock = r.clock.Add(run)
		r.finish(id)
	}
}

// Ordered by expected ends, a one-hour job that comes a minute after a
// ten-hour one is tried first: the GPUs that free go to it, and each
// job's turn is its first wait plus the run time learned for its size.
// In arrival order they go to the ten-hour job, and no job has a turn.
func TestQueueOrder(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		order       string
		placed      string // the job the freed node goes to
		shortTurnIn time.Duration
	}{
		{order: "", placed: "short", shortTurnIn: time.Hour},
		{order: QueueByEnd, placed: "short", shortTurnIn: time.Hour},
		{order: QueueByArrival, placed: "long"},
	} {
		t.Run(tt.order, func(t *testing.T) {
			t.Parallel()
			after := 24 * time.Hour // no hold in the way
			r := newClockedRig(t, Config{ReserveAfter: &after, QueueOrder: tt.order}, map[string]string{"n0": "dgx-a100"})
			r.learnRunTimes(map[int]time.Duration{1: time.Hour, 8: 10 * time.Hour})
			r.submit(events.JobSubmitted{JobID: "fill", GPUs: 8})
			first := r.clock
			if j := r.submit(events.JobSubmitted{JobID: "long", GPUs: 8}); j.State != store.JobPending {
				t.Fatalf("long: %s, want pending", j.State)
			}
			r.clock = r.clock.Add(time.Minute)
			short := r.submit(events.JobSubmitted{JobID: "short", GPUs: 1})
			if short.State != store.JobPending {
				t.Fatalf("short: %s, want pending", short.State)
			}
			wantLong, wantShort := time.Time{}, time.Time{}
			if tt.shortTurnIn > 0 {
				wantLong, wantShort = first.Add(10*time.Hour), first.Add(time.Minute+tt.shortTurnIn)
			}
			if long := r.job("long"); !long.Turn.Equal(wantLong) || !short.Turn.Equal(wantShort) {
				t.Errorf("turns: long %v, short %v; want %v, %v", long.Turn, short.Turn, wantLong, wantShort)
			}
			r.finish("fill")
			other := map[string]string{"short": "long", "long": "short"}[tt.placed]
			if j := r.job(tt.placed); j.State != store.JobPlaced {
				t.Errorf("%s: %s, want placed on the freed node", tt.placed, j.State)
			}
			if j := r.job(other); j.State != store.JobPending {
				t.Errorf("%s: %s, want still waiting", other, j.State)
			}
		})
	}
}

// Nodes held for a job stay held while a short job that came later is
// ahead of it in the queue (ordered by expected ends): the short job, of
// the same priority, waits off them, and the held job starts when they
// drain. Moving the hold to the short job would have given it the first
// node freed and left the held job waiting again.
func TestHoldStaysWithItsJob(t *testing.T) {
	t.Parallel()
	after := 10 * time.Minute
	r := newClockedRig(t, Config{ReserveAfter: &after}, map[string]string{"n0": "dgx-a100", "n1": "dgx-a100"})
	r.learnRunTimes(map[int]time.Duration{1: time.Hour, 16: 10 * time.Hour})
	r.submit(events.JobSubmitted{JobID: "a", GPUs: 8})
	r.submit(events.JobSubmitted{JobID: "b", GPUs: 8})
	if j := r.submit(events.JobSubmitted{JobID: "large", GPUs: 16}); j.State != store.JobPending {
		t.Fatalf("large: %s, want pending", j.State)
	}
	r.clock = r.clock.Add(11 * time.Minute)
	small := r.submit(events.JobSubmitted{JobID: "small", GPUs: 1})
	if small.State != store.JobPending || !small.Turn.Before(r.job("large").Turn) {
		t.Fatalf("small: %s, turn %v; want pending, its turn before large's %v", small.State, small.Turn, r.job("large").Turn)
	}
	if h, _ := r.s.Store().Snapshot().PendingHead(); h.ID != "small" {
		t.Fatalf("head of the queue %q, want small", h.ID)
	}
	if res := r.s.Reservation(); res == nil || res.JobID != "large" {
		t.Fatalf("reservation %+v, want large's", res)
	}
	r.finish("a")
	if res := r.s.Reservation(); res == nil || res.JobID != "large" {
		t.Fatalf("reservation after a ended %+v, want still large's", res)
	}
	if j := r.job("small"); j.State != store.JobPending {
		t.Fatalf("small after a ended: %s on %v, want waiting off the held nodes", j.State, spanned(j))
	}
	r.finish("b")
	if j := r.job("large"); j.State != store.JobPlaced {
		t.Fatalf("large after b ended: %s %v, want placed", j.State, j.Reasons)
	}
}
