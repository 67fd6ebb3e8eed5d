package aware

import (
	"fmt"
	"slices"
	"testing"

	"github.com/toposched/toposched/internal/collective"
)

// eachGridOrder visits one order of each class of grid symmetry (blocks
// permuted, positions inside every block permuted alike), and every
// class: checked by brute force over all ordered choices.
func TestEachGridOrder(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ f, k, inner int }{
		{4, 2, 2}, {5, 4, 2}, {6, 4, 2}, {6, 6, 3}, {7, 6, 2}, {8, 4, 4}, {6, 3, 3}, {7, 6, 3},
	} {
		t.Run(fmt.Sprintf("%d of %d, blocks of %d", tc.k, tc.f, tc.inner), func(t *testing.T) {
			t.Parallel()
			// The class of an order: its blocks as sets and its columns as
			// sets, each list sorted.
			key := func(at []int) string {
				var blocks, cols []string
				for b := 0; b < tc.k; b += tc.inner {
					blocks = append(blocks, fmt.Sprint(slices.Sorted(slices.Values(at[b:b+tc.inner]))))
				}
				for j := range tc.inner {
					var c []int
					for b := j; b < tc.k; b += tc.inner {
						c = append(c, at[b])
					}
					cols = append(cols, fmt.Sprint(slices.Sorted(slices.Values(c))))
				}
				slices.Sort(blocks)
				slices.Sort(cols)
				return fmt.Sprint(blocks, cols)
			}
			all := map[string]bool{}
			var perm func(at []int, used []bool)
			perm = func(at []int, used []bool) {
				if len(at) == tc.k {
					all[key(at)] = true
					return
				}
				for i := range tc.f {
					if !used[i] {
						used[i] = true
						perm(append(at, i), used)
						used[i] = false
					}
				}
			}
			perm(nil, make([]bool, tc.f))
			seen := map[string]bool{}
			n := 0
			eachGridOrder(tc.f, tc.k, tc.inner, func(at []int) {
				n++
				k := key(at)
				if seen[k] {
					t.Fatalf("class %s visited twice (%v)", k, at)
				}
				seen[k] = true
			})
			if n != len(all) || float64(n) != gridOrders(tc.f, tc.k, tc.inner) {
				t.Errorf("visited %d orders, %d classes, gridOrders %g", n, len(all), gridOrders(tc.f, tc.k, tc.inner))
			}
		})
	}
}

// gridOf finds the blocks whichever of TP and DP is the larger: a tp4 x
// dp2 job on 8 GPUs (DP pairs across two blocks of 4) is a grid as much
// as tp2 x dp4 is.
func TestGridOf(t *testing.T) {
	t.Parallel()
	tpdp := func(tp, dp int) []commGroup {
		var gs []commGroup
		for b := range dp {
			g := commGroup{coll: collective.AllReduce}
			for i := range tp {
				g.ranks = append(g.ranks, b*tp+i)
			}
			gs = append(gs, g)
		}
		for i := range tp {
			g := commGroup{coll: collective.AllReduce}
			for b := range dp {
				g.ranks = append(g.ranks, b*tp+i)
			}
			gs = append(gs, g)
		}
		return gs
	}
	for _, tc := range []struct {
		name   string
		groups []commGroup
		k      int
		inner  int
		ok     bool
	}{
		{"tp2 x dp4", tpdp(2, 4), 8, 2, true},
		{"tp4 x dp2", tpdp(4, 2), 8, 4, true},
		{"tp2 x dp3", tpdp(2, 3), 6, 2, true},
		{"tp3 x dp2", tpdp(3, 2), 6, 3, true},
		{"dp8", []commGroup{{coll: collective.AllReduce, ranks: []int{0, 1, 2, 3, 4, 5, 6, 7}}}, 8, 8, true},
		{"pipeline", append(tpdp(2, 2), commGroup{coll: collective.SendRecv, ranks: []int{0, 2}}), 4, 0, false},
		{"strided pairs", []commGroup{{coll: collective.AllReduce, ranks: []int{0, 3}}, {coll: collective.AllReduce, ranks: []int{1, 2}}}, 4, 0, false},
	} {
		inner, ok := gridOf(tc.groups, tc.k)
		if inner != tc.inner || ok != tc.ok {
			t.Errorf("%s: gridOf = %d, %v; want %d, %v", tc.name, inner, ok, tc.inner, tc.ok)
		}
	}
}
