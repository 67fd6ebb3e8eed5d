package aware

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/internal/fixtures"
	"github.com/toposched/toposched/internal/placer/blind"
	"github.com/toposched/toposched/internal/placer/engine"
	"github.com/toposched/toposched/internal/placer/outcome"
	"github.com/toposched/toposched/internal/store"
)

type spec struct {
	name      string
	ev        events.TopologyNode
	held      []int
	unhealthy []int
}

func dgx(t testing.TB, name, model string) events.TopologyNode {
	t.Helper()
	return fixtures.MustModelNode(t, model, name)
}

// pairs is a 4-GPU node with NVLink pairs 0-1 and 2-3, PHB otherwise.
func pairs(name string) events.TopologyNode { return fixtures.PairsNode(name, "A10", 4) }

func build(t testing.TB, specs ...spec) *store.Store {
	t.Helper()
	nodes := make([]fixtures.Node, len(specs))
	for i, sp := range specs {
		nodes[i] = fixtures.Node{Event: sp.ev, Name: sp.name, Held: sp.held, Unhealthy: sp.unhealthy}
	}
	return fixtures.MustStore(t, nodes, nil)
}

func checkFree(t *testing.T, snap *store.Snapshot, r outcome.Result, n int) {
	t.Helper()
	if r.Verdict != outcome.Placed || len(r.GPUs) != n {
		t.Fatalf("verdict %v, %d GPUs, want %d placed: %+v", r.Verdict, len(r.GPUs), n, r.Reasons)
	}
	seen := map[store.GPUKey]bool{}
	for _, k := range r.GPUs {
		if seen[k] {
			t.Fatalf("GPU %s twice", k)
		}
		seen[k] = true
		ok := false
		for _, g := range snap.GPUs(k.Node) {
			if g.Index == k.Index {
				ok = g.Free()
			}
		}
		if !ok {
			t.Fatalf("GPU %s is not free and healthy", k)
		}
	}
}

func TestOnlyFreeHealthy(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(1, 2))
	var specs []spec
	for i := range 6 {
		sp := spec{name: fmt.Sprintf("n%d", i), ev: dgx(t, "", "dgx-a100")}
		for g := range 8 {
			switch rng.IntN(4) {
			case 0:
				sp.held = append(sp.held, g)
			case 1:
				sp.unhealthy = append(sp.unhealthy, g)
			}
		}
		specs = append(specs, sp)
	}
	snap := build(t, specs...).Snapshot()
	free := snap.FreeCount()
	for _, n := range []int{1, 2, 3, 4, 5, 8, 12, free} {
		for _, tp := range []int{1, 2, 4} {
			if n%tp != 0 {
				continue
			}
			r := Place(engine.Request{Snap: snap, Job: fixtures.SyntheticJob("j", n, tp, 1), Options: engine.Options{}})
			checkFree(t, snap, r, n)
		}
	}
	if r := Place(engine.Request{Snap: snap, Job: fixtures.SyntheticJob("j", free+1, 1, 1), Options: engine.Options{}}); r.Verdict != outcome.Wait {
		t.Errorf("over capacity: %v", r.Verdict)
	}
}

func TestGPUsPerNodeAndModel(t *testing.T) {
	t.Parallel()
	snap := build(t,
		spec{name: "a0", ev: dgx(t, "", "dgx-a100")},
		spec{name: "h0", ev: dgx(t, "", "dgx-h100"), held: []int{0, 1, 2}},
		spec{name: "h1", ev: dgx(t, "", "dgx-h100"), held: []int{5}},
		spec{name: "h2", ev: dgx(t, "", "dgx-h100")},
	).Snapshot()
	model := snap.GPUs("h0")[0].Model
	j := fixtures.SyntheticJob("j", 8, 2, 1)
	j.Job.GPUsPerNode, j.Job.GPUModel = 4, model
	r := Place(engine.Request{Snap: snap, Job: j, Options: engine.Options{}})
	checkFree(t, snap, r, 8)
	per := map[string]int{}
	for _, k := range r.GPUs {
		per[k.Node]++
		if !strings.HasPrefix(k.Node, "h") {
			t.Errorf("GPU %s is not of model %s", k, model)
		}
	}
	for node, c := range per {
		if c != 4 {
			t.Errorf("node %s has %d ranks, want 4: %v", node, c, r.GPUs)
		}
	}
	// Never verdicts are blind's.
	j.Job.GPUsPerNode = 3
	if r := Place(engine.Request{Snap: snap, Job: j, Options: engine.Options{}}); r.Verdict != outcome.Never || r.Reasons[0].Code != outcome.CodeGPUsPerNodeNotDivisor {
		t.Errorf("bad divisor: %+v", r)
	}
	// The filter hook.
	j.Job.GPUsPerNode = 4
	r = Place(engine.Request{Snap: snap, Job: j, Options: engine.Options{Filter: func(n engine.NodeView) bool { return n.Node.Name != "h2" && n.Node.Name != "h1" }}})
	if r.Verdict != outcome.Wait || r.Reasons[0].Code != outcome.CodeInsufficientFreeNodes {
		t.Errorf("filtered: %+v", r)
	}
}

func TestOneGPUKeepsPairsAndWholeNodes(t *testing.T) {
	t.Parallel()
	snap := build(t,
		spec{name: "whole", ev: dgx(t, "", "dgx-a100")},
		spec{name: "p0", ev: pairs("")},
		spec{name: "p1", ev: pairs(""), held: []int{0}},
		spec{name: "p2", ev: pairs("")},
	).Snapshot()
	r := Place(engine.Request{Snap: snap, Job: fixtures.SyntheticJob("j", 1, 1, 1), Options: engine.Options{}})
	checkFree(t, snap, r, 1)
	if want := (store.GPUKey{Node: "p1", Index: 1}); r.GPUs[0] != want {
		t.Errorf("1-GPU job took %s, want %s (the GPU whose NVLink partner is taken)", r.GPUs[0], want)
	}
	// Off the NVSwitch node (faster, so the cost model would take it), a
	// 2-GPU job takes the NVLink pair of the fullest node.
	r = Place(engine.Request{Snap: snap, Job: fixtures.SyntheticJob("j", 2, 1, 1), Options: engine.Options{Filter: func(n engine.NodeView) bool { return n.Node.Name != "whole" }}})
	checkFree(t, snap, r, 2)
	if got := slices.Sorted(slices.Values([]int{r.GPUs[0].Index, r.GPUs[1].Index})); r.GPUs[0].Node != "p1" || r.GPUs[1].Node != "p1" || !slices.Equal(got, []int{2, 3}) {
		t.Errorf("2-GPU job took %v, want p1/2, p1/3", r.GPUs)
	}
}

func TestTPInsideNodeAndWholeNode(t *testing.T) {
	t.Parallel()
	var specs []spec
	for i := range 4 {
		sp := spec{name: fmt.Sprintf("n%d", i), ev: dgx(t, "", "dgx-a100")}
		if i < 3 {
			sp.held = []int{i, i + 4}
		}
		specs = append(specs, sp)
	}
	snap := build(t, specs...).Snapshot()
	r := Place(engine.Request{Snap: snap, Job: fixtures.SyntheticJob("j", 8, 8, 1), Options: engine.Options{}})
	checkFree(t, snap, r, 8)
	for _, k := range r.GPUs {
		if k.Node != "n3" {
			t.Fatalf("8-GPU job: %v, want the whole free node n3", r.GPUs)
		}
	}
	// TP4 x DP4 over nodes with 6 free GPUs each: each TP group on one node.
	r = Place(engine.Request{Snap: snap, Job: fixtures.SyntheticJob("j", 16, 4, 1), Options: engine.Options{}})
	checkFree(t, snap, r, 16)
	for g := 0; g < 16; g += 4 {
		for _, k := range r.GPUs[g : g+4] {
			if k.Node != r.GPUs[g].Node {
				t.Errorf("TP group %d straddles nodes: %v", g/4, r.GPUs[g:g+4])
			}
		}
	}
	// Blind is no better under the same cost model.
	b := blind.Place(snap, fixtures.SyntheticJob("j", 16, 4, 1))
	ours, _ := Predict(snap, fixtures.SyntheticJob("j", 16, 4, 1), r.GPUs, nil)
	theirs, _ := Predict(snap, fixtures.SyntheticJob("j", 16, 4, 1), b.GPUs, nil)
	if ours.CommSeconds > theirs.CommSeconds*1.0001 {
		t.Errorf("ours %.3g s > blind %.3g s", ours.CommSeconds, theirs.CommSeconds)
	}
}

func TestExhaustive(t *testing.T) {
	t.Parallel()
	snap := build(t,
		spec{name: "p0", ev: pairs(""), held: []int{1}},
		spec{name: "p1", ev: pairs("")},
	).Snapshot()
	for n := 2; n <= 4; n++ {
		j := fixtures.SyntheticJob("j", n, 1, 1)
		ex, err := Exhaustive(engine.Request{Snap: snap, Job: j, Options: engine.Options{}})
		if err != nil {
			t.Fatal(err)
		}
		checkFree(t, snap, ex, n)
		r := Place(engine.Request{Snap: snap, Job: j, Options: engine.Options{}})
		exT, _ := Predict(snap, j, ex.GPUs, nil)
		ourT, _ := Predict(snap, j, r.GPUs, nil)
		if ourT.CommSeconds > exT.CommSeconds*1.02 {
			t.Errorf("n=%d: ours %.4g s, optimum %.4g s", n, ourT.CommSeconds, exT.CommSeconds)
		}
		if exT.CommSeconds > ourT.CommSeconds*(1+1e-9) {
			t.Errorf("n=%d: exhaustive %.4g s worse than ours %.4g s", n, exT.CommSeconds, ourT.CommSeconds)
		}
	}
	var specs []spec
	for i := range 4 {
		specs = append(specs, spec{name: fmt.Sprintf("n%d", i), ev: dgx(t, "", "dgx-a100")})
	}
	big := build(t, specs...).Snapshot()
	_, err := Exhaustive(engine.Request{Snap: big, Job: fixtures.SyntheticJob("j", 16, 1, 1), Options: engine.Options{}})
	if err == nil || !strings.Contains(err.Error(), "exceed the limit of 200000; use topology-aware") {
		t.Errorf("big job: %v", err)
	}
}

// cluster builds nodes 8-GPU nodes with about occ of their GPUs held.
func cluster(b testing.TB, nodes int, occ float64) *store.Snapshot {
	rng := rand.New(rand.NewPCG(7, uint64(nodes)))
	base := dgx(b, "", "dgx-h100")
	specs := make([]spec, nodes)
	for i := range specs {
		specs[i] = spec{name: fmt.Sprintf("n%05d", i), ev: base}
		for g := range 8 {
			if rng.Float64() < occ {
				specs[i].held = append(specs[i].held, g)
			}
		}
	}
	return build(b, specs...).Snapshot()
}

func BenchmarkPlace(b *testing.B) {
	for _, gpus := range []int{1024, 10240} {
		snap := cluster(b, gpus/8, 0.5)
		for _, n := range []int{8, 64, 512} {
			b.Run(fmt.Sprintf("gpus=%d/job=%d", gpus, n), func(b *testing.B) {
				j := fixtures.SyntheticJob("j", n, 8, 1)
				for b.Loop() {
					if r := Place(engine.Request{Snap: snap, Job: j, Options: engine.Options{}}); r.Verdict != outcome.Placed {
						b.Fatal(r.Reasons)
					}
				}
			})
		}
	}
}

// BenchmarkPlaceOneGPUByModel is a one-GPU decision on a half-full
// 10k-GPU cluster blind to compute, and with compute weighed by model on
// a cluster of one model (H100 nodes) and of two (every fourth node an
// 8-GPU L4 box).
func BenchmarkPlaceOneGPUByModel(b *testing.B) {
	one := cluster(b, 1280, 0.5)
	rng := rand.New(rand.NewPCG(7, 51))
	h100, l4 := dgx(b, "", "dgx-h100"), fixtures.PlainNode("", "L4", 8)
	specs := make([]spec, 1280)
	for i := range specs {
		specs[i] = spec{name: fmt.Sprintf("n%05d", i), ev: h100}
		if i%4 == 3 {
			specs[i].ev = l4
		}
		for g := range 8 {
			if rng.Float64() < 0.5 {
				specs[i].held = append(specs[i].held, g)
			}
		}
	}
	mixed := build(b, specs...).Snapshot()
	j := fixtures.SyntheticJob("j", 1, 1, 1)
	j.Job.StepComputeSeconds = 0.4
	for _, tc := range []struct {
		name string
		snap *store.Snapshot
		ref  string
	}{{"blind", one, ""}, {"by-model/one-model", one, "a100"}, {"by-model/two-models", mixed, "a100"}} {
		b.Run(tc.name, func(b *testing.B) {
			for b.Loop() {
				if r := Place(engine.Request{Snap: tc.snap, Job: j, Options: engine.Options{ComputeReference: tc.ref}}); r.Verdict != outcome.Placed {
					b.Fatal(r.Reasons)
				}
			}
		})
	}
}

// A 64-GPU job on a half-full 10k-GPU cluster gets free, distinct GPUs.
// Building the cluster takes seconds, so -short leaves it out; its speed is
// measured by BenchmarkPlace, not asserted here.
func TestPlaceOnTenThousandGPUs(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a 10k-GPU cluster; left out with -short")
	}
	snap := cluster(t, 1280, 0.5)
	start := time.Now()
	r := Place(engine.Request{Snap: snap, Job: fixtures.SyntheticJob("j", 64, 8, 1), Options: engine.Options{}})
	checkFree(t, snap, r, 64)
	t.Logf("64-GPU job on 10k GPUs: %v", time.Since(start))
}
