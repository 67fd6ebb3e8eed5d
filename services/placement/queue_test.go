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

// The waiting jobs' order. A node-wide job of ten hours ("long") waits,
// then a one-GPU job of one hour ("short") a minute later: ordered by
// expected work or by expected ends, the short job is tried first (its
// turn is its first wait plus its run time, over 8 by work: one GPU of an
// 8-GPU node). A node-wide job of one hour against a one-GPU job of four
// hours tells the two apart: by ends the node-wide job ends first, by
// work the one-GPU job takes less (half an hour of a node). In arrival
// order the first to come goes first, and no job has a turn.
func TestQueueOrder(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name         string
		order        string
		wide, narrow time.Duration // run times learned for 8 GPUs and 1
		placed       string        // the job the freed node goes to
		narrowTurnIn time.Duration // from the narrow job's first wait; 0: no turns
		share        float64       // the narrow job's node_share
	}{
		{name: "default", wide: 10 * time.Hour, narrow: time.Hour, placed: "narrow", narrowTurnIn: time.Hour},
		{name: "work/short", order: QueueByWork, wide: 10 * time.Hour, narrow: time.Hour, placed: "narrow", narrowTurnIn: time.Hour / 8, share: 0.125},
		{name: "end/short", order: QueueByEnd, wide: 10 * time.Hour, narrow: time.Hour, placed: "narrow", narrowTurnIn: time.Hour},
		{name: "arrival/short", order: QueueByArrival, wide: 10 * time.Hour, narrow: time.Hour, placed: "wide"},
		{name: "work/narrow", order: QueueByWork, wide: time.Hour, narrow: 4 * time.Hour, placed: "narrow", narrowTurnIn: time.Hour / 2, share: 0.125},
		{name: "end/narrow", order: QueueByEnd, wide: time.Hour, narrow: 4 * time.Hour, placed: "wide", narrowTurnIn: 4 * time.Hour},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			after := 24 * time.Hour // no hold in the way
			r := newClockedRig(t, Config{ReserveAfter: &after, QueueOrder: tt.order}, map[string]string{"n0": "dgx-a100"})
			r.learnRunTimes(map[int]time.Duration{1: tt.narrow, 8: tt.wide})
			r.submit(events.JobSubmitted{JobID: "fill", GPUs: 8})
			first := r.clock
			if j := r.submit(events.JobSubmitted{JobID: "wide", GPUs: 8}); j.State != store.JobPending {
				t.Fatalf("wide: %s, want pending", j.State)
			}
			r.clock = r.clock.Add(time.Minute)
			narrow := r.submit(events.JobSubmitted{JobID: "narrow", GPUs: 1})
			if narrow.State != store.JobPending {
				t.Fatalf("narrow: %s, want pending", narrow.State)
			}
			wantWide, wantNarrow := time.Time{}, time.Time{}
			if tt.narrowTurnIn > 0 {
				wantWide, wantNarrow = first.Add(tt.wide), first.Add(time.Minute+tt.narrowTurnIn)
			}
			if wide := r.job("wide"); !wide.Turn.Equal(wantWide) || !narrow.Turn.Equal(wantNarrow) {
				t.Errorf("turns: wide %v, narrow %v; want %v, %v", wide.Turn, narrow.Turn, wantWide, wantNarrow)
			}
			// A resubmission keeps the turn, and its event tells it the same.
			if _, qt := r.s.turn(r.s.Store().Snapshot(), &narrow, narrow.Spec); tt.narrowTurnIn > 0 &&
				(qt == nil || !qt.At.Equal(wantNarrow) || qt.NodeShare != tt.share || qt.ExpectedRunSeconds != tt.narrow.Seconds()) {
				t.Errorf("narrow's turn resubmitted %+v, want at %v, node_share %v, expected_run_seconds %v", qt, wantNarrow, tt.share, tt.narrow.Seconds())
			}
			r.finish("fill")
			other := map[string]string{"narrow": "wide", "wide": "narrow"}[tt.placed]
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
