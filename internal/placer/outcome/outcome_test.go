package outcome

import (
	"reflect"
	"slices"
	"testing"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/internal/store"
)

func on(node string, idx ...int) []store.GPUKey {
	out := make([]store.GPUKey, len(idx))
	for i, x := range idx {
		out[i] = store.GPUKey{Node: node, Index: x}
	}
	return out
}

func cat(parts ...[]store.GPUKey) []store.GPUKey { return slices.Concat(parts...) }

func TestDecide(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		gpus  []store.GPUKey
		ranks []events.RankPlacement
		nodes []events.NodePlacement
	}{
		{
			name: "one node",
			gpus: on("n0", 0, 1, 2, 3),
			ranks: []events.RankPlacement{
				{Rank: 0, Node: "n0", GPU: 0, LocalRank: 0}, {Rank: 1, Node: "n0", GPU: 1, LocalRank: 1},
				{Rank: 2, Node: "n0", GPU: 2, LocalRank: 2}, {Rank: 3, Node: "n0", GPU: 3, LocalRank: 3},
			},
			nodes: []events.NodePlacement{{Node: "n0", GPUs: []int{0, 1, 2, 3}, CUDAVisibleDevices: "0,1,2,3"}},
		},
		{
			name: "interleaved nodes keep rank order",
			gpus: cat(on("n1", 4, 5), on("n0", 7), on("n1", 2)),
			ranks: []events.RankPlacement{
				{Rank: 0, Node: "n1", GPU: 4, LocalRank: 0}, {Rank: 1, Node: "n1", GPU: 5, LocalRank: 1},
				{Rank: 2, Node: "n0", GPU: 7, LocalRank: 0}, {Rank: 3, Node: "n1", GPU: 2, LocalRank: 2},
			},
			nodes: []events.NodePlacement{
				{Node: "n1", GPUs: []int{4, 5, 2}, CUDAVisibleDevices: "4,5,2"},
				{Node: "n0", GPUs: []int{7}, CUDAVisibleDevices: "7"},
			},
		},
		{
			name:  "nothing",
			ranks: []events.RankPlacement{},
			nodes: []events.NodePlacement{},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			d := Decide("job-1", tt.gpus, "blind")
			want := events.PlacementDecided{JobID: "job-1", Strategy: "blind", Ranks: tt.ranks, Nodes: tt.nodes}
			if !reflect.DeepEqual(d, want) {
				t.Errorf("Decide =\n%+v\nwant\n%+v", d, want)
			}
			if !d.DecidedAt.IsZero() {
				t.Error("DecidedAt stamped")
			}
		})
	}
}

func TestVerdictString(t *testing.T) {
	t.Parallel()
	for v, want := range map[Verdict]string{Placed: "placed", Wait: "wait", Never: "never", 0: "Verdict(0)"} {
		if got := v.String(); got != want {
			t.Errorf("%d.String() = %q, want %q", int(v), got, want)
		}
	}
}
