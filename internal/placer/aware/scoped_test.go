package aware

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/internal/fixtures"
	"github.com/toposched/toposched/internal/placer/engine"
	"github.com/toposched/toposched/internal/placer/outcome"
)

// A job no node holds, on a cluster above ScopeNodes, is spread from one
// leaf's or pod's nodes (scoped) rather than every node's: on seeded
// clusters of mixed nodes (NVSwitch, PCIe, bridged pairs, plain) of 1,536
// nodes in leaves of 16 and pods of 128, the scoped decision's predicted
// communication against the whole-cluster walk's, for jobs of 16 to 256
// GPUs, TP 1 to 8, plain, with gpus_per_node and with a node filter.
func TestScopedAgainstClusterWalk(t *testing.T) {
	if testing.Short() {
		t.Skip("builds two clusters of 12k GPUs; left out with -short")
	}
	t.Parallel()
	var ratios []float64
	worse, better := 0, 0
	for seed := range uint64(2) {
		rng := rand.New(rand.NewPCG(seed, 17))
		kinds := []events.TopologyNode{dgx(t, "", "dgx-h100"), dgx(t, "", "pcie-8gpu"), pairs(""), fixtures.PlainNode("", "A100", 8)}
		specs := make([]spec, 1536)
		for i := range specs {
			// Kinds come in runs of a leaf, as racks are bought.
			specs[i] = spec{name: fmt.Sprintf("n%05d", i), ev: kinds[(i/16+int(seed))%len(kinds)]}
			occ := []float64{0.2, 0.5, 0.8}[rng.IntN(3)]
			for g := range len(specs[i].ev.GPUs) {
				if rng.Float64() < occ {
					specs[i].held = append(specs[i].held, g)
				}
			}
		}
		st := build(t, specs...)
		fab := map[string][]string{}
		for i, sp := range specs {
			fab[sp.name] = []string{fmt.Sprintf("leaf:l%d", i/16), fmt.Sprintf("pod:p%d", i/128)}
		}
		if err := st.UpsertFabric(fab); err != nil {
			t.Fatal(err)
		}
		snap := st.Snapshot()
		for _, n := range []int{16, 24, 32, 64, 128, 256} {
			for _, tp := range []int{1, 2, 4, 8} {
				for variant := range 3 {
					j := fixtures.SyntheticJob("j", n, tp, 1)
					opts := engine.Options{MaxEvals: 30, Budget: -1}
					switch variant {
					case 1:
						j.Job.GPUsPerNode = min(n, tp)
					case 2:
						opts.Filter = func(n engine.NodeView) bool { return n.Node.Name[len(n.Node.Name)-1]%3 != 0 }
					}
					whole, scoped := opts, opts
					whole.ScopeNodes, scoped.ScopeNodes = -1, 1
					a, b := Place(engine.Request{Snap: snap, Job: j, Options: whole}), Place(engine.Request{Snap: snap, Job: j, Options: scoped})
					if a.Verdict != outcome.Placed || b.Verdict != outcome.Placed {
						if a.Verdict != b.Verdict {
							t.Errorf("seed %d n%d tp%d variant %d: whole-cluster walk %s, scoped %s", seed, n, tp, variant, a.Verdict, b.Verdict)
						}
						continue
					}
					checkFree(t, snap, b, n)
					e := newEvaluator(snap, j, n, opts)
					r := e.cost(b.GPUs) / e.cost(a.GPUs)
					if math.IsNaN(r) {
						continue
					}
					ratios = append(ratios, r)
					if r < 0.98 {
						better++
					}
					if r > 1.02 {
						worse++
						t.Logf("seed %d n%d tp%d variant %d: scoped %.1f%% slower: %v against %v", seed, n, tp, variant, 100*(r-1), b.GPUs, a.GPUs)
					}
				}
			}
		}
	}
	slices.Sort(ratios)
	med, p90, top := ratios[len(ratios)/2], ratios[len(ratios)*9/10], ratios[len(ratios)-1]
	t.Logf("scoped / whole-cluster predicted comm over %d decisions: median %.4f, p90 %.4f, max %.4f; %d more than 2%% slower, %d more than 2%% faster",
		len(ratios), med, p90, top, worse, better)
	// Scoping trades the whole cluster's spreads for the fastest of a few
	// domains' (measured: 1 of 144 more than 2% slower, by 84%; 50 faster).
	if med > 1 || worse > len(ratios)/20 {
		t.Errorf("scoped decisions slower than the whole-cluster walk's: median %.4f, %d of %d more than 2%% slower (at most %d allowed)",
			med, worse, len(ratios), len(ratios)/20)
	}
}
