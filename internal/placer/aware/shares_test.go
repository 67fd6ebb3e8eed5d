package aware

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/toposched/toposched/internal/fixtures"
	"github.com/toposched/toposched/internal/placer/engine"
	"github.com/toposched/toposched/internal/store"
)

// A job over several generated nodes gets, on each node, the share the
// cost model scores best with the other nodes' GPUs as placed: checked
// against every order of every choice of the node's free GPUs (no twin
// classes), on seeded clusters of two to four nodes of one family. The
// budgets are raised so that every share checked is affordable and the
// local search does not depend on the machine's speed: what is tested is
// that the twin classes leave out no better share.
func TestSharesAreNodeOptima(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(7, 14))
	checked := 0
	for i := 0; checked < 2000 && i < 50_000; i++ {
		fam := fixtures.Families[i%len(fixtures.Families)]
		var specs []spec
		total := 0
		for j := range 2 + rng.IntN(3) {
			ev := fam.Node(rng, fmt.Sprintf("n%d", j))
			g := len(ev.GPUs)
			sp := spec{name: ev.Name, ev: ev, held: rng.Perm(g)[:g/2+rng.IntN(g/2)]}
			total += g - len(sp.held)
			specs = append(specs, sp)
		}
		if total < 3 {
			continue
		}
		k := min(2+rng.IntN(total-1), 16)
		tp := []int{1, 2}[rng.IntN(2)]
		if k%tp != 0 {
			tp = 1
		}
		snap := build(t, specs...).Snapshot()
		job := fixtures.SyntheticJob("j", k, tp, 1)
		r := Place(engine.Request{Snap: snap, Job: job, Options: engine.Options{Budget: -1, NodeExact: 4 * 4 * 3000}})
		if len(r.GPUs) != k {
			continue
		}
		nodes := map[string][]int{}
		for pos, g := range r.GPUs {
			nodes[g.Node] = append(nodes[g.Node], pos)
		}
		if len(nodes) < 2 {
			continue
		}
		got, err := Predict(snap, job, r.GPUs, nil)
		if err != nil {
			t.Fatal(err)
		}
		for node, ranks := range nodes {
			var free []int
			for _, f := range snap.FreeGPUs(node) {
				free = append(free, f.Index)
			}
			if ExhaustiveCount(len(free), len(ranks)) > 3000 {
				continue
			}
			checked++
			trial := slices.Clone(r.GPUs)
			var orders func(at int, used []bool)
			orders = func(at int, used []bool) {
				if at == len(ranks) {
					p, err := Predict(snap, job, trial, nil)
					if err == nil && p.CommSeconds < got.CommSeconds*(1-0.005) {
						t.Errorf("%s, %d GPUs tp=%d: %v on %s is %.3f× faster than ours %v", fam.Name, k, tp, trial, node,
							got.CommSeconds/p.CommSeconds, r.GPUs)
					}
					return
				}
				for i, g := range free {
					if !used[i] {
						used[i] = true
						trial[ranks[at]] = store.GPUKey{Node: node, Index: g}
						orders(at+1, used)
						used[i] = false
					}
				}
			}
			orders(0, make([]bool, len(free)))
		}
	}
	if checked < 100 {
		t.Fatalf("only %d shares checked", checked)
	}
	t.Logf("%d shares checked against every order of their node's free GPUs", checked)
}

// Decisions for small jobs spread over half-full nodes of bridged NVLink
// pairs on two sockets (the nodes where each share has choices).
func BenchmarkPlaceBridgedShares(b *testing.B) {
	rng := rand.New(rand.NewPCG(3, 3))
	var specs []spec
	for j := range 32 {
		sp := bridgedPairs(fmt.Sprintf("n%02d", j), "NV4", 2, 8)
		sp.held = rng.Perm(8)[:5]
		specs = append(specs, sp)
	}
	snap := build(b, specs...).Snapshot()
	for _, n := range []int{4, 8} {
		job := fixtures.SyntheticJob("j", n, 2, 1)
		b.Run(fmt.Sprintf("job=%d", n), func(b *testing.B) {
			for b.Loop() {
				if r := Place(engine.Request{Snap: snap, Job: job, Options: engine.Options{}}); len(r.GPUs) != n {
					b.Fatal(r)
				}
			}
		})
	}
}
