package placement

import (
	"encoding/json"
	"testing"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/internal/store"
)

// FuzzProposalGPUs feeds proposals' ranks, as anyone may publish them, to
// the check placement applies before it moves a job: it never panics, and
// what it accepts places ranks 0..n-1 in order on distinct GPUs.
func FuzzProposalGPUs(f *testing.F) {
	for _, seed := range []struct {
		ranks string
		n     int
	}{
		{`[{"rank":0,"node":"a","gpu":0,"local_rank":0},{"rank":1,"node":"a","gpu":1,"local_rank":1}]`, 2},
		{`[{"rank":1,"node":"a","gpu":0,"local_rank":0},{"rank":0,"node":"a","gpu":1,"local_rank":1}]`, 2},
		{`[{"rank":0,"node":"a","gpu":0,"local_rank":0},{"rank":1,"node":"a","gpu":0,"local_rank":1}]`, 2},
		{`[{"rank":0,"node":"a","gpu":0,"local_rank":0}]`, 2},
		{`[]`, 0},
		{`[{"rank":0,"node":"","gpu":-1,"local_rank":0}]`, 1},
	} {
		f.Add(seed.ranks, seed.n)
	}
	f.Fuzz(func(t *testing.T, ranks string, n int) {
		var p events.PlacementMigration
		if json.Unmarshal([]byte(ranks), &p.Ranks) != nil || n < 0 || n > 1<<12 {
			return
		}
		gpus, err := proposalGPUs(&p, n)
		if err != nil {
			return
		}
		if len(gpus) != n {
			t.Fatalf("accepted %d GPUs for %d ranks", len(gpus), n)
		}
		seen := map[store.GPUKey]bool{}
		for i, g := range gpus {
			if p.Ranks[i].Rank != i || seen[g] {
				t.Fatalf("accepted rank %d as %+v (seen %v)", i, p.Ranks[i], seen[g])
			}
			seen[g] = true
		}
	})
}
