package optimizer

import (
	"bytes"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/internal/store"
)

// writeBackRig is an optimizer on a store of four 8-GPU nodes, driven by
// hand with placement events.
func writeBackRig(t *testing.T, log *slog.Logger) *Service {
	t.Helper()
	st, err := store.New()
	if err != nil {
		t.Fatal(err)
	}
	for i := range 4 {
		if err := st.UpsertNode(dgx(t, fmt.Sprintf("n%d", i), i, 0)); err != nil {
			t.Fatal(err)
		}
	}
	return &Service{store: st, log: log, live: map[string]*liveJob{}, holder: map[gpuKey]string{},
		analyses: map[string]*events.JobAnalyzed{}}
}

// Placement changes reach the optimizer's store in batches: between them
// the store lags the working set, and what reads its occupancy (Store,
// the migration search) finds every change applied, in order, however
// the batches fall. A seeded run of 3,000 decisions and releases.
func TestWriteBack(t *testing.T) {
	t.Parallel()
	s := writeBackRig(t, slog.New(slog.DiscardHandler))
	rng := rand.New(rand.NewPCG(7, 15))
	var free []gpuKey
	for i := range 4 {
		for g := range 8 {
			free = append(free, gpuKey{fmt.Sprintf("n%d", i), g})
		}
	}
	held := map[string][]gpuKey{}
	lagged := false
	for step := range 3000 {
		if len(held) > 0 && (rng.IntN(2) == 0 || len(free) == 0) {
			ids := slices.Sorted(func(yield func(string) bool) {
				for id := range held {
					if !yield(id) {
						return
					}
				}
			})
			id := ids[rng.IntN(len(ids))]
			free = append(free, held[id]...)
			delete(held, id)
			s.applyPlacement(0, &events.PlacementReleased{JobID: id})
		} else {
			n := 1 + rng.IntN(min(4, len(free)))
			rng.Shuffle(len(free), func(i, j int) { free[i], free[j] = free[j], free[i] })
			id := fmt.Sprintf("j%d", step)
			d := &events.PlacementDecided{JobID: id}
			for r, k := range free[:n] {
				d.Ranks = append(d.Ranks, events.RankPlacement{Rank: r, Node: k.node, GPU: k.gpu})
			}
			held[id] = slices.Clone(free[:n])
			free = free[n:]
			s.applyPlacement(0, d)
		}
		if len(s.unwritten) >= unwrittenMax {
			t.Fatalf("step %d: %d changes held back, want fewer than %d", step, len(s.unwritten), unwrittenMax)
		}
		if s.store.Snapshot().FreeCount() != len(free) {
			lagged = true
		}
		if step%97 != 0 {
			continue
		}
		snap := s.Store().Snapshot()
		if got := snap.FreeCount(); got != len(free) {
			t.Fatalf("step %d: the store has %d GPUs free, want %d", step, got, len(free))
		}
		for id, keys := range held {
			var got []gpuKey
			for _, g := range snap.GPUsOfJob(id) {
				got = append(got, gpuKey{g.Node, g.Index})
			}
			slices.SortFunc(keys, func(a, b gpuKey) int { return strings.Compare(fmt.Sprint(a), fmt.Sprint(b)) })
			slices.SortFunc(got, func(a, b gpuKey) int { return strings.Compare(fmt.Sprint(a), fmt.Sprint(b)) })
			if !slices.Equal(got, keys) {
				t.Fatalf("step %d: job %s holds %v in the store, want %v", step, id, got, keys)
			}
			if j, ok := snap.Job(id); !ok || j.State != store.JobPlaced {
				t.Fatalf("step %d: job %s's row %+v", step, id, j)
			}
		}
		if n := len(snap.JobsInState(store.JobPlaced)); n != len(held) {
			t.Fatalf("step %d: %d job rows, want %d", step, n, len(held))
		}
	}
	if !lagged {
		t.Fatal("the store never lagged the working set: nothing was batched")
	}
}

// A batch whose transaction a bad change spoils is written one change at
// a time: the bad change alone is lost, and logged.
func TestWriteBackSpoiled(t *testing.T) {
	t.Parallel()
	var logs bytes.Buffer
	s := writeBackRig(t, slog.New(slog.NewTextHandler(&logs, nil)))
	s.applyPlacement(0, &events.PlacementDecided{JobID: "a", Ranks: []events.RankPlacement{{Rank: 0, Node: "n0", GPU: 0}}})
	// A job row without an id spoils a store transaction.
	s.later(storeChange{kind: changeRecorded, lj: &liveJob{decision: &events.PlacementDecided{}}})
	s.applyPlacement(0, &events.PlacementDecided{JobID: "b", Ranks: []events.RankPlacement{{Rank: 0, Node: "n1", GPU: 3}}})
	snap := s.Store().Snapshot()
	if len(snap.GPUsOfJob("a")) != 1 || len(snap.GPUsOfJob("b")) != 1 || snap.FreeCount() != 30 {
		t.Fatalf("a holds %d, b %d GPUs, %d free; want 1, 1, 30", len(snap.GPUsOfJob("a")), len(snap.GPUsOfJob("b")), snap.FreeCount())
	}
	for _, want := range []string{"writing them one at a time", "job not recorded"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("log lacks %q:\n%s", want, logs.String())
		}
	}
}
