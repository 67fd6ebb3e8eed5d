package optimizer

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"

	"github.com/toposched/toposched/events"
)

func decision(job string, gpus ...int) *events.PlacementDecided {
	d := &events.PlacementDecided{JobID: job}
	for i, g := range gpus {
		d.Ranks = append(d.Ranks, events.RankPlacement{Rank: i, Node: "n", GPU: g, LocalRank: i})
	}
	return d
}

func TestWorkingSetAndAudit(t *testing.T) {
	t.Parallel()
	var logs bytes.Buffer
	s := New(slog.New(slog.NewTextHandler(&logs, nil)))
	ctx := context.Background()
	steps := []struct {
		decided  *events.PlacementDecided
		released string
		jobs     int
		gpus     int
	}{
		{decided: decision("a", 0, 1), jobs: 1, gpus: 2},
		{decided: decision("a", 0, 1), jobs: 1, gpus: 2}, // redelivery
		{decided: decision("b", 2, 3), jobs: 2, gpus: 4},
		{released: "a", jobs: 1, gpus: 2},
		{released: "a", jobs: 1, gpus: 2},
		{decided: decision("c", 0), jobs: 2, gpus: 3},
	}
	for i, st := range steps {
		if st.decided != nil {
			if err := s.OnDecided(ctx, events.Envelope{}, st.decided); err != nil {
				t.Fatal(err)
			}
		} else if err := s.OnReleased(ctx, events.Envelope{}, &events.PlacementReleased{JobID: st.released}); err != nil {
			t.Fatal(err)
		}
		if j, g := s.Live(); j != st.jobs || g != st.gpus {
			t.Fatalf("step %d: %d jobs on %d GPUs, want %d on %d", i, j, g, st.jobs, st.gpus)
		}
	}
	if strings.Contains(logs.String(), "double booking") {
		t.Fatalf("false alarm: %s", logs.String())
	}
	if err := s.OnDecided(ctx, events.Envelope{}, decision("d", 3)); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(logs.String(), "double booking") || !strings.Contains(logs.String(), "other_job_id=b") {
		t.Fatalf("double booking not reported: %s", logs.String())
	}
}
