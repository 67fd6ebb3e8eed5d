package aware

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/internal/fixtures"
	"github.com/toposched/toposched/internal/placer/engine"
	"github.com/toposched/toposched/internal/placer/outcome"
	"github.com/toposched/toposched/internal/store"
)

// A one-GPU job's walk stops once enough nodes take the GPU without a
// hole: the candidates the judge can read (the first max(limit,
// maxJudged)) are those of the whole walk, on seeded clusters of mixed
// nodes and occupancy, with and without a filter that turns nodes away.
func TestOneGPUWalkStopsWithoutChangingTheChoice(t *testing.T) {
	t.Parallel()
	kinds := []events.TopologyNode{dgx(t, "", "dgx-h100"), dgx(t, "", "pcie-8gpu"), pairs(""), fixtures.PlainNode("", "A100", 8)}
	stopped := 0
	const seeds = 200
	for seed := range uint64(seeds) {
		rng := rand.New(rand.NewPCG(seed, 15))
		// A third of the clusters are of one kind: where every node is an
		// NVSwitch node, the walk's floor of holes is the free GPUs.
		of := kinds
		if rng.IntN(3) == 0 {
			of = kinds[rng.IntN(len(kinds)):][:1]
		}
		snap := build(t, partlyHeld(rng, of, 20+rng.IntN(300))...).Snapshot()
		var filter func(engine.NodeView) bool
		if seed%2 == 1 {
			filter = func(v engine.NodeView) bool { return len(v.Node.Name)%3 != 0 || v.Node.Name[len(v.Node.Name)-1]%2 == 0 }
		}
		opts := engine.Options{Filter: filter}
		enough := max((&placer{opts: opts}).limit(), maxJudged)
		holesOf := (&placer{opts: opts}).holesOne
		full, _ := bestFitSingle(snap, "", filter, 1, enough, nil)
		short, _ := bestFitSingle(snap, "", filter, 1, enough, holesOf)
		if len(short) < len(full) {
			stopped++
		}
		job := fixtures.SyntheticJob("j", 1, 1, 1)
		listOf := func(cands []*candNode) []string {
			p := &placer{opts: opts, e: newEvaluator(snap, job, 1, opts), n: 1, cands: cands}
			var out []string
			for i, c := range p.singleNode(cands) {
				if i == enough {
					break
				}
				out = append(out, fmt.Sprint(c.gpus))
			}
			return out
		}
		a, b := listOf(full), listOf(short)
		if fmt.Sprint(a) != fmt.Sprint(b) {
			t.Fatalf("seed %d: the whole walk's first %d candidates %v, the stopped walk's %v", seed, enough, a, b)
		}
		r := Place(engine.Request{Snap: snap, Job: job, Options: opts})
		if r.Verdict == outcome.Placed && len(r.GPUs) == 1 && a[0] != fmt.Sprint([]store.GPUKey{r.GPUs[0]}) {
			t.Fatalf("seed %d: placed on %v, the whole walk's favourite is %s", seed, r.GPUs, a[0])
		}
	}
	if stopped == 0 {
		t.Fatal("no walk stopped early: the test tests nothing")
	}
	t.Logf("%d of %d walks stopped early", stopped, seeds)
}

// A walk for a job of several GPUs passes over twins too: on seeded
// clusters of mixed nodes (many alike), its favourite is never slower
// than that of the walk that keeps every twin, and the walk reads fewer
// nodes where twins abound.
func TestTwinWalkNeverSlower(t *testing.T) {
	t.Parallel()
	kinds := mixedKinds(t)
	same, shorter := 0, 0
	for seed := range uint64(80) {
		rng := rand.New(rand.NewPCG(seed, 17))
		// A third of the nodes busy, the rest empty: twins.
		specs := randomNodes(rng, kinds, 40+rng.IntN(300), func() bool { return rng.IntN(3) == 0 }, func() bool { return rng.IntN(2) == 0 })
		snap := build(t, specs...).Snapshot()
		var filter func(engine.NodeView) bool
		if seed%2 == 1 {
			filter = func(v engine.NodeView) bool { return v.Node.Name[len(v.Node.Name)-1]%3 != 0 }
		}
		k := []int{2, 4, 8}[rng.IntN(3)]
		opts := engine.Options{Filter: filter}
		enough := max((&placer{opts: opts}).limit(), maxJudged)
		job := fixtures.SyntheticJob("j", k, k, 1)
		best := func(cands []*candNode) float64 {
			p := &placer{opts: opts, e: newEvaluator(snap, job, k, opts), n: k, cands: cands}
			list := p.singleNode(cands)
			if len(list) == 0 {
				return inf
			}
			return p.score(list[0])
		}
		all, _ := bestFitSingle(snap, "", filter, k, 0, nil)
		twins, _ := bestFitSingle(snap, "", filter, k, enough, nil)
		a, b := best(all), best(twins)
		if b > a*(1+1e-9) {
			t.Fatalf("seed %d, %d GPUs: the twin walk's favourite costs %g, the whole walk's %g", seed, k, b, a)
		}
		if b == a {
			same++
		}
		if len(twins) < len(all) {
			shorter++
		}
	}
	if shorter == 0 {
		t.Fatal("no walk passed over a twin: the test tests nothing")
	}
	t.Logf("80 walks: %d chose as fast a favourite as the whole walk, %d kept fewer nodes", same, shorter)
}

// mixedKinds are the node kinds of the seeded clusters: NVSwitch, PCIe
// switch tree, NVLink-bridged pairs, plain.
func mixedKinds(t testing.TB) []events.TopologyNode {
	return []events.TopologyNode{dgx(t, "", "dgx-h100"), dgx(t, "", "pcie-8gpu"), pairs(""), fixtures.PlainNode("", "A100", 8)}
}

// randomNodes draws n nodes of kinds; on each node busy says, each GPU
// held says, the GPU is held.
// partlyHeld is n nodes of the kinds, each with a share of its GPUs held
// drawn for it.
func partlyHeld(rng *rand.Rand, kinds []events.TopologyNode, n int) []spec {
	specs := make([]spec, 0, n)
	for i := range n {
		sp := spec{name: fmt.Sprintf("n%03d", i), ev: kinds[rng.IntN(len(kinds))]}
		occ := rng.Float64()
		for g := range len(sp.ev.GPUs) {
			if rng.Float64() < occ {
				sp.held = append(sp.held, g)
			}
		}
		specs = append(specs, sp)
	}
	return specs
}

func randomNodes(rng *rand.Rand, kinds []events.TopologyNode, n int, busy, held func() bool) []spec {
	specs := make([]spec, 0, n)
	for i := range n {
		sp := spec{name: fmt.Sprintf("n%03d", i), ev: kinds[rng.IntN(len(kinds))]}
		if busy() {
			for g := range len(sp.ev.GPUs) {
				if held() {
					sp.held = append(sp.held, g)
				}
			}
		}
		specs = append(specs, sp)
	}
	return specs
}

// A candidate exactInNode calls settled (its node's free GPUs alike, or a
// single order of them) is one the local search inside its node cannot
// better, which is why refine skips the search for it: on seeded clusters
// of mixed nodes, partly held, for jobs of 2 to 8 GPUs with and without
// tensor parallelism, the search returns every settled candidate as it
// was given.
func TestSettledCandidatesTheSearchCannotBetter(t *testing.T) {
	t.Parallel()
	kinds := mixedKinds(t)
	settled, other := 0, 0
	for seed := range uint64(120) {
		rng := rand.New(rand.NewPCG(seed, 29))
		specs := randomNodes(rng, kinds, 4+rng.IntN(12), func() bool { return true }, func() bool { return rng.IntN(3) == 0 })
		snap := build(t, specs...).Snapshot()
		k := []int{2, 3, 4, 6, 8}[rng.IntN(5)]
		tp := []int{1, 2, k}[rng.IntN(3)]
		if k%tp != 0 {
			tp = 1
		}
		job := fixtures.SyntheticJob("j", k, tp, 1)
		opts := engine.Options{}
		p := &placer{opts: opts, e: newEvaluator(snap, job, k, opts), n: k}
		p.cands, _ = bestFitSingle(snap, "", nil, k, 0, nil)
		for _, c := range p.singleNode(p.cands) {
			if !c.settled {
				other++
				continue
			}
			settled++
			got, tt := p.localSearch(c.gpus, p.cands, false, p.score(c))
			if !slices.Equal(got, c.gpus) {
				t.Fatalf("seed %d, %d GPUs tp %d: settled %v (%g s) searched to %v (%g s)", seed, k, tp, c.gpus, p.score(c), got, tt)
			}
		}
	}
	if settled == 0 || other == 0 {
		t.Fatalf("settled %d, other %d candidates: the test tests nothing", settled, other)
	}
	t.Logf("%d settled candidates searched in vain, %d others", settled, other)
}

// The one-node walk stops where all it has left are twins it would pass
// over (wholly free nodes of kinds it keeps enough of): on seeded clusters
// of mixed kinds and sizes, mostly empty or mostly busy, some GPUs
// unhealthy, for jobs of
// 1 to 8 GPUs of any model or of one, with and without a filter, it keeps
// the nodes the walk to the end keeps, in its order, and asks the filter
// of the same nodes, with the same answers.
func TestWalkStopsAtWholeTwins(t *testing.T) {
	t.Parallel()
	kinds := append(mixedKinds(t), fixtures.PlainNode("", "A100", 4), fixtures.PairsNode("", "A100", 8))
	const seeds = 150
	stopped := 0
	for seed := range uint64(seeds) {
		rng := rand.New(rand.NewPCG(seed, 19))
		busy := []float64{0.25, 0.6, 0.97}[rng.IntN(3)]
		specs := randomNodes(rng, kinds, 20+rng.IntN(300), func() bool { return rng.Float64() < busy }, func() bool { return rng.IntN(2) == 0 })
		for i := range specs {
			if seed%4 == 0 && len(specs[i].ev.GPUs) == 8 && !slices.Contains(specs[i].held, 0) {
				// No 8-GPU node wholly free: the most free GPUs are on
				// nodes that have more.
				specs[i].held = append(specs[i].held, 0)
			}
			if rng.IntN(40) == 0 {
				specs[i].unhealthy = []int{rng.IntN(len(specs[i].ev.GPUs))}
			}
		}
		snap := build(t, specs...).Snapshot()
		model := []string{"", "A100", specs[0].ev.GPUModel}[rng.IntN(3)]
		var filter func(engine.NodeView) bool
		if seed%3 == 1 {
			filter = func(v engine.NodeView) bool { return v.Node.Name[len(v.Node.Name)-1]%3 != 0 }
		}
		k := []int{1, 1, 2, 4, 8}[rng.IntN(5)]
		enough := []int{1, 4, 16}[rng.IntN(3)]
		var holesOf func(*candNode) int
		if k == 1 && rng.IntN(2) == 0 {
			holesOf = (&placer{}).holesOne
		}
		names := func(cands []*candNode) []string {
			out := make([]string, len(cands))
			for i, c := range cands {
				out[i] = c.node.Name
			}
			return out
		}
		all, allSeen, allRead := bestFitWalk(snap, model, filter, k, enough, holesOf, false)
		short, shortSeen, shortRead := bestFitWalk(snap, model, filter, k, enough, holesOf, true)
		if !slices.Equal(names(all), names(short)) {
			t.Fatalf("seed %d (model %q, %d GPUs, enough %d): the walk to the end keeps %v, the stopped walk %v", seed, model, k, enough, names(all), names(short))
		}
		if !maps.Equal(allSeen, shortSeen) {
			t.Fatalf("seed %d: the walk to the end asked the filter %v, the stopped walk %v", seed, allSeen, shortSeen)
		}
		if shortRead < allRead {
			stopped++
		}
	}
	if stopped < seeds/10 {
		t.Fatalf("%d of %d walks stopped at whole twins: the test tests little", stopped, seeds)
	}
	t.Logf("%d of %d walks stopped at whole twins", stopped, seeds)
}

// A twin's pick is the one worked out on its class's first node (for one
// GPU, by the walk's holesOne), and its cost on the same GPUs that
// node's: on seeded clusters of mixed kinds, partly held, some GPUs
// unhealthy, for jobs of 1 to 8 GPUs, every kept node's pick, and
// singleNode's list with its costs, are those worked out node by node.
func TestTwinPicksAreTheirOwn(t *testing.T) {
	t.Parallel()
	kinds := append(mixedKinds(t), fixtures.PlainNode("", "A100", 4), fixtures.PairsNode("", "A100", 8))
	copied := 0
	for seed := range uint64(80) {
		rng := rand.New(rand.NewPCG(seed, 23))
		busy := []float64{0.25, 0.6, 0.97}[rng.IntN(3)]
		specs := randomNodes(rng, kinds, 20+rng.IntN(200), func() bool { return rng.Float64() < busy }, func() bool { return rng.IntN(3) == 0 })
		for i := range specs {
			if rng.IntN(30) == 0 {
				specs[i].unhealthy = []int{rng.IntN(len(specs[i].ev.GPUs))}
			}
		}
		snap := build(t, specs...).Snapshot()
		k := []int{1, 2, 3, 4, 8}[rng.IntN(5)]
		job := fixtures.SyntheticJob("j", k, k, 1)
		opts := engine.Options{}
		enough := max((&placer{opts: opts}).limit(), maxJudged)
		run := func(noTwinPicks bool) ([]inNode, []string) {
			var holesOf func(*candNode) int
			if k == 1 {
				holesOf = (&placer{opts: opts, knobs: knobs{noTwinPicks: noTwinPicks}}).holesOne
			}
			cands, _ := bestFitSingle(snap, "", nil, k, enough, holesOf)
			p := &placer{opts: opts, e: newEvaluator(snap, job, k, opts), n: k, cands: cands, knobs: knobs{noTwinPicks: noTwinPicks}}
			var picks []inNode
			for _, c := range cands {
				if len(c.free) < k {
					continue
				}
				in, err := p.pick(c, k)
				if err != nil {
					t.Fatalf("seed %d: pick %s: %v", seed, c.node.Name, err)
				}
				if !noTwinPicks && c.twin != nil {
					copied++
				}
				picks = append(picks, in)
			}
			var list []string
			for _, c := range p.singleNode(cands) {
				list = append(list, fmt.Sprint(c.gpus, " ", c.comm, " ", c.settled))
			}
			return picks, list
		}
		got, gotList := run(false)
		want, wantList := run(true)
		if len(got) != len(want) {
			t.Fatalf("seed %d: %d picks, want %d", seed, len(got), len(want))
		}
		for i := range got {
			g, w := got[i], want[i]
			if g.c.node.Name != w.c.node.Name || !slices.Equal(g.gpus, w.gpus) || g.level != w.level || g.minBW != w.minBW ||
				g.sumBW != w.sumBW || g.holes != w.holes || g.fit != w.fit {
				t.Fatalf("seed %d, %d GPUs: on %s the twin's pick is %+v, worked out %+v", seed, k, g.c.node.Name, g, w)
			}
		}
		if !slices.Equal(gotList, wantList) {
			t.Fatalf("seed %d, %d GPUs: singleNode lists %v, worked out node by node %v", seed, k, gotList, wantList)
		}
	}
	if copied == 0 {
		t.Fatal("no pick was a twin's: the test tests nothing")
	}
	t.Logf("%d picks taken from a twin", copied)
}

// A one-GPU job's walk keeps the favourite's few nodes and walks on only
// for a judge that does not pass the favourite (place): on seeded clusters
// of mixed nodes and occupancy, with judges that pass everything, deny
// or score some nodes, and a filter or none, it decides as the walk to
// maxJudged at once does, judges the same candidates, and explains alike
// but for the levels' counts of the nodes walked, which are the longer
// walk's whenever it comes.
func TestOneGPUWalkWaitsForTheJudge(t *testing.T) {
	t.Parallel()
	kinds := []events.TopologyNode{dgx(t, "", "dgx-h100"), dgx(t, "", "pcie-8gpu"), pairs(""), fixtures.PlainNode("", "A100", 8)}
	judges := oneGPUJudges()
	judges["denies-all"] = func(engine.Candidate) engine.Judgement {
		return engine.Judgement{Deny: true, Reasons: []events.Reason{{Code: "no"}}}
	}
	longer := 0
	for seed := range uint64(120) {
		rng := rand.New(rand.NewPCG(seed, 21))
		snap := build(t, partlyHeld(rng, kinds, 10+rng.IntN(200))...).Snapshot()
		job := fixtures.SyntheticJob("j", 1, 1, 1)
		for name, judge := range judges {
			var filter func(engine.NodeView) bool
			if seed%2 == 1 {
				filter = func(v engine.NodeView) bool { return v.Node.Name[len(v.Node.Name)-1]%5 != 0 }
			}
			run := func(eager bool) (outcome.Result, engine.Explain, []string, map[string]int) {
				asked := map[string]int{}
				counted := func(v engine.NodeView) bool { asked[v.Node.Name]++; return filter(v) }
				var judged []string
				x := engine.Explain{}
				opts := engine.Options{Judge: func(c engine.Candidate) engine.Judgement {
					judged = append(judged, fmt.Sprint(c.GPUs))
					return judge(c)
				}, Explain: &x}
				if filter != nil {
					opts.Filter = counted
				}
				return placeKnobs(engine.Request{Snap: snap, Job: job, Options: opts}, knobs{eagerOneGPU: eager}), x, judged, asked
			}
			want, wantX, wantJudged, wantAsked := run(true)
			got, gotX, gotJudged, asked := run(false)
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("seed %d, judge %s: %v, the walk to maxJudged %v", seed, name, got, want)
			}
			if len(gotJudged) > 1 || name != "passes" {
				if !slices.Equal(gotJudged[1:], wantJudged[1:]) || (len(wantJudged) > 0 && gotJudged[0] != wantJudged[0]) {
					t.Fatalf("seed %d, judge %s: judged %v, the walk to maxJudged %v", seed, name, gotJudged, wantJudged)
				}
			}
			// The filter counts the nodes it denies: the walk that goes
			// on asks none it asked before.
			for node, n := range asked {
				if n > wantAsked[node] {
					t.Fatalf("seed %d, judge %s: node %s asked of the filter %d times, by the walk to maxJudged %d", seed, name, node, n, wantAsked[node])
				}
			}
			if !slices.Equal(gotX.Explanation.Levels, wantX.Explanation.Levels) {
				if name != "passes" && len(wantJudged) > 1 {
					t.Fatalf("seed %d, judge %s: levels %v, the walk to maxJudged %v", seed, name, gotX.Explanation.Levels, wantX.Explanation.Levels)
				}
				longer++
				gotX.Explanation.Levels = wantX.Explanation.Levels
			}
			if fmt.Sprint(gotX) != fmt.Sprint(wantX) {
				t.Fatalf("seed %d, judge %s: explained %+v, the walk to maxJudged %+v", seed, name, gotX, wantX)
			}
		}
	}
	t.Logf("%d decisions walked fewer nodes", longer)
}

// With compute weighed by model, a one-GPU job's walk goes to oneGPULimit
// only where free GPUs of more than one model could be ordered by the
// job's known compute: on seeded clusters whose nodes are all of one model
// (several shapes), or of mixed models for a job whose compute is not
// known, busy or not, with judges and filters, the short walk decides and
// judges as the walk to oneGPULimit does.
func TestOneModelSkipsTheModelWalk(t *testing.T) {
	t.Parallel()
	h100 := dgx(t, "", "dgx-h100")
	model := h100.GPUs[0].Model
	one := []events.TopologyNode{h100, fixtures.PlainNode("", model, 8), fixtures.PairsNode("", model, 4), fixtures.PlainNode("", model, 2)}
	mixed := append(slices.Clone(one), fixtures.PlainNode("", "T4", 1), pairs(""))
	judges := oneGPUJudges()
	skipped, mixedSkipped := 0, 0
	for seed := range uint64(100) {
		rng := rand.New(rand.NewPCG(seed, 51))
		kinds := one
		if seed%5 == 4 {
			kinds = mixed
		}
		snap := build(t, partlyHeld(rng, kinds, 10+rng.IntN(200))...).Snapshot()
		if snap.OneModelFree(1) {
			skipped++
			if seed%5 == 4 {
				mixedSkipped++
			}
		}
		job := fixtures.SyntheticJob("j", 1, 1, 1)
		if seed%5 != 4 || seed%2 == 0 {
			job.Job.StepComputeSeconds = 0.4
		}
		for name, judge := range judges {
			var filter func(engine.NodeView) bool
			if seed%2 == 1 {
				filter = func(v engine.NodeView) bool { return v.Node.Name[len(v.Node.Name)-1]%5 != 0 }
			}
			run := func(every bool) (outcome.Result, []string) {
				var judged []string
				opts := engine.Options{ComputeReference: "a100", Filter: filter, Judge: func(c engine.Candidate) engine.Judgement {
					judged = append(judged, fmt.Sprint(c.GPUs))
					return judge(c)
				}}
				return placeKnobs(engine.Request{Snap: snap, Job: job, Options: opts}, knobs{everyModelWalk: every}), judged
			}
			want, wantJudged := run(true)
			got, gotJudged := run(false)
			if fmt.Sprint(got) != fmt.Sprint(want) || !slices.Equal(gotJudged, wantJudged) {
				t.Fatalf("seed %d, judge %s: %v judging %v; the walk to oneGPULimit %v judging %v", seed, name, got, gotJudged, want, wantJudged)
			}
		}
	}
	if skipped == 0 {
		t.Fatal("no cluster had its free GPUs of one model: the test tests nothing")
	}
	if mixedSkipped == 20 {
		t.Fatal("every mixed cluster skipped the model walk")
	}
	t.Logf("%d of 100 clusters skipped the model walk (%d of 20 mixed ones: their free GPUs all of one model)", skipped, mixedSkipped)
}

// oneGPUJudges are judges of one-GPU candidates that pass every node, deny
// the nodes whose name ends in an odd digit, or score some.
func oneGPUJudges() map[string]func(engine.Candidate) engine.Judgement {
	return map[string]func(engine.Candidate) engine.Judgement{
		"passes": func(engine.Candidate) engine.Judgement { return engine.Judgement{} },
		"denies-odd": func(c engine.Candidate) engine.Judgement {
			return engine.Judgement{Deny: c.GPUs[0].Node[len(c.GPUs[0].Node)-1]%2 == 1, Reasons: []events.Reason{{Code: "odd"}}}
		},
		"scores-some": func(c engine.Candidate) engine.Judgement {
			return engine.Judgement{Score: float64(c.GPUs[0].Node[len(c.GPUs[0].Node)-1]%3) / 2}
		},
	}
}
