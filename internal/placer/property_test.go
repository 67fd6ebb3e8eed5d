package placer

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/internal/fixtures"
	"github.com/toposched/toposched/internal/placer/blind"
	"github.com/toposched/toposched/internal/placer/outcome"
	"github.com/toposched/toposched/internal/store"
	"github.com/toposched/toposched/internal/topology"
)

var (
	propertySeed  = flag.Uint64("property-seed", 20261201, "seed of TestPlacementProperties' cases")
	propertyCases = flag.Int("property-cases", 0, "how many cases TestPlacementProperties generates (0: 3000, or 300 with -short)")
	propertyCase  = flag.Int("property-case", -1, "run only this case of TestPlacementProperties (to rerun a failure)")
)

// notWorseMargin is how much slower than blind's a topology-aware
// placement may be predicted: aware's notWorse (judge.go) takes blind's
// GPUs when they are predicted faster by more than 0.5% and the Judge
// allows them, so, without policies, ours·(1−0.005) ≤ blind's.
const notWorseMargin = 0.005

// propCase is one generated cluster and two jobs: job is planned on the
// cluster, next on the cluster once job's plan is committed.
type propCase struct {
	seed      uint64
	index     int
	nodes     []fixtures.Node
	kinds     []string // what each node is, for the report
	fabric    *topology.Fabric
	fabricDoc string
	job, next events.JobAnalyzed
}

func (c *propCase) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "seed %d case %d (rerun: go test ./internal/placer -run TestPlacementProperties -property-seed %d -property-case %d)\n",
		c.seed, c.index, c.seed, c.index)
	for i, n := range c.nodes {
		fmt.Fprintf(&b, "    node %s: %s, held %v, unhealthy %v\n", n.Name, c.kinds[i], n.Held, n.Unhealthy)
	}
	fmt.Fprintf(&b, "    fabric: %s\n    job:  %s\n    next: %s", c.fabricDoc, jobDoc(c.job), jobDoc(c.next))
	return b.String()
}

func jobDoc(j events.JobAnalyzed) string {
	s := fmt.Sprintf("%s: %d GPUs tp%d pp%d dp%d", j.Job.JobID, j.Job.GPUs, j.Parallelism.TP, j.Parallelism.PP, j.Parallelism.DP)
	if j.Job.GPUsPerNode > 0 {
		s += fmt.Sprintf(", gpus_per_node %d", j.Job.GPUsPerNode)
	}
	if j.Job.GPUModel != "" {
		s += ", model " + j.Job.GPUModel
	}
	return s
}

var propModels = []string{"A100", "H100", "L40S"}

// genCase draws case index of seed: 1 to 16 nodes (a quarter of the cases
// 1 to 3 fuller ones, where exhaustive can run), each a built-in model, a
// node without paths, NVLink pairs or a random island/PCIe/NUMA layout of
// 2 to 8 GPUs; each node 0-75% held, about 1 GPU in 10 unhealthy (some of
// them held too); no fabric, a leaf/spine or a rail fabric.
func genCase(t *testing.T, seed uint64, index int) *propCase {
	rng := rand.New(rand.NewPCG(seed, uint64(index)))
	c := &propCase{seed: seed, index: index}
	small := rng.IntN(4) == 0
	nn := 1 + rng.IntN(16)
	if small {
		nn = 1 + rng.IntN(3)
	}
	names := make([]string, nn)
	models := map[string]bool{}
	for i := range nn {
		names[i] = fmt.Sprintf("n%02d", i)
		ev, kind := genNode(t, rng, names[i])
		n := fixtures.Node{Event: ev, Name: names[i]}
		occ := []float64{0, 0.25, 0.5, 0.75}[rng.IntN(4)]
		if small {
			occ = 0.4 + 0.4*rng.Float64()
		}
		for g := range len(ev.GPUs) {
			held := rng.Float64() < occ
			if held {
				n.Held = append(n.Held, g)
			}
			if rng.IntN(10) == 0 {
				n.Unhealthy = append(n.Unhealthy, g)
			}
		}
		for _, g := range ev.GPUs {
			models[cmpOr(g.Model, ev.GPUModel)] = true
		}
		c.nodes = append(c.nodes, n)
		c.kinds = append(c.kinds, kind)
	}
	switch rng.IntN(3) {
	case 0:
		c.fabricDoc = "none"
	case 1:
		per := 1 + rng.IntN(4)
		c.fabric = fixtures.MustFabric(t, fixtures.LeafSpine("prop", names, per))
		c.fabricDoc = fmt.Sprintf("leaf/spine, %d nodes per leaf", per)
	case 2:
		shape := fixtures.RailShape{NodesPerPod: 1 + rng.IntN(4), Rails: 1 + rng.IntN(2), PodsPerCore: 1 + rng.IntN(2),
			LinkGbps: 200, Uplinks: 2, UplinkGbps: 200, Oversubscription: float64(1 + rng.IntN(2)), SpineGbps: 400}
		c.fabric = fixtures.MustFabric(t, fixtures.RailFabric("prop", names, shape))
		c.fabricDoc = fmt.Sprintf("rails %+v", shape)
	}
	present := slices.Sorted(func(yield func(string) bool) {
		for m := range models {
			if !yield(m) {
				return
			}
		}
	})
	total := 0
	for _, n := range c.nodes {
		total += len(n.Event.GPUs)
	}
	c.job = genJob(rng, "j", small, total, present)
	c.next = genJob(rng, "k", small, total, present)
	return c
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

func genNode(t *testing.T, rng *rand.Rand, name string) (events.TopologyNode, string) {
	model := propModels[rng.IntN(len(propModels))]
	switch rng.IntN(4) {
	case 0:
		m := []string{"dgx-a100", "dgx-h100", "hgx-h100", "pcie-8gpu"}[rng.IntN(4)]
		ev := fixtures.MustModelNode(t, m, name)
		if m == "pcie-8gpu" {
			// The model names no GPU; its GPUs are what the node says.
			ev.GPUModel = model
			return ev, m + " of " + model
		}
		return ev, m
	case 1:
		k := 2 + rng.IntN(7)
		return fixtures.PlainNode(name, model, k), fmt.Sprintf("%d %s without paths", k, model)
	case 2:
		k := 2 * (1 + rng.IntN(4))
		return fixtures.PairsNode(name, model, k), fmt.Sprintf("%d %s in NVLink pairs", k, model)
	}
	k := 2 + rng.IntN(7)
	island := []int{1, 2, 4, 8}[rng.IntN(4)]
	nv := fmt.Sprintf("NV%d", []int{2, 4, 12, 18}[rng.IntN(4)])
	pcie := []int{1, 2, 4}[rng.IntN(3)]
	sw := []string{"PIX", "PXB"}[rng.IntN(2)]
	numa := []string{"NODE", "PHB"}[rng.IntN(2)]
	half := max(k/2, 1)
	ev := fixtures.PathsNode(name, model, k, func(i, j int) string {
		switch {
		case island > 1 && i/island == j/island:
			return nv
		case i/pcie == j/pcie:
			return sw
		case i/half == j/half:
			return numa
		}
		return "SYS"
	})
	return ev, fmt.Sprintf("%d %s, islands of %d (%s), PCIe groups of %d (%s), halves %s", k, model, island, nv, pcie, sw, numa)
}

// genJob draws a job of 1 to 32 GPUs (most no more than the cluster's
// total; 1 to 4 on small clusters, half of the time) in a tp-dp-pp layout;
// a quarter ask for gpus_per_node (a divisor of the size mostly, any 1 to
// 8 otherwise), a third for a model (one of the cluster's, sometimes one
// it lacks).
func genJob(rng *rand.Rand, id string, small bool, total int, models []string) events.JobAnalyzed {
	n := 1 + rng.IntN(32)
	switch {
	case small && rng.IntN(2) == 0:
		n = 1 + rng.IntN(4)
	case rng.IntN(5) > 0:
		n = 1 + rng.IntN(min(32, total))
	}
	var tps []int
	for _, tp := range []int{1, 2, 4, 8} {
		if n%tp == 0 {
			tps = append(tps, tp)
		}
	}
	tp := tps[rng.IntN(len(tps))]
	var pps []int
	for _, pp := range []int{1, 2, 4} {
		if (n/tp)%pp == 0 {
			pps = append(pps, pp)
		}
	}
	pp := pps[rng.IntN(len(pps))]
	j := fixtures.SyntheticJob(id, n, tp, pp)
	if rng.IntN(4) == 0 {
		var divs []int
		for d := 1; d <= min(n, 8); d++ {
			if n%d == 0 {
				divs = append(divs, d)
			}
		}
		j.Job.GPUsPerNode = divs[rng.IntN(len(divs))]
		if rng.IntN(4) == 0 {
			j.Job.GPUsPerNode = 1 + rng.IntN(8)
		}
	}
	if rng.IntN(3) == 0 {
		if rng.IntN(16) == 0 || len(models) == 0 {
			j.Job.GPUModel = "B200"
		} else {
			j.Job.GPUModel = models[rng.IntN(len(models))]
		}
	}
	return j
}

// propStats counts how often each property was exercised.
type propStats struct {
	cases, placed, waits, nevers, compared, committed, exhaustive int
}

// TestPlacementProperties checks, over generated clusters and jobs,
// without policies, what every live strategy promises of a plan:
//
//   - its GPUs are distinct, exist, are healthy and free in the snapshot
//     and of the job's model when it asks for one;
//   - gangs are all or nothing: Placed has exactly the job's GPUs
//     (gpus_per_node on every node used when it asks), Wait and Never none;
//   - capacity: too few free healthy GPUs of the model (or nodes with
//     gpus_per_node of them) is never Placed;
//   - the baseline is blind first fit on the same snapshot, and
//     topology-aware places exactly when blind does (else it answers
//     blind's verdict and reasons);
//   - topology-aware is never predicted more than notWorseMargin slower
//     than blind;
//   - the plan commits (store.Allocate re-checks it), no other job can
//     then take its GPUs, and the next job's plan avoids them.
//
// On small cases (at most 8 free GPUs of the model, at most 4 ranks) the
// exhaustive optimum is predicted no slower than topology-aware.
func TestPlacementProperties(t *testing.T) {
	seed := *propertySeed
	cases := *propertyCases
	if cases <= 0 {
		cases = 3000
		if testing.Short() {
			cases = 300
		}
	}
	first, last := 0, cases
	if *propertyCase >= 0 {
		first, last = *propertyCase, *propertyCase+1
	}
	start := time.Now()
	var st propStats
	failed := 0
	for i := first; i < last; i++ {
		c := genCase(t, seed, i)
		if fails := checkCase(t, c, &st); len(fails) > 0 {
			t.Errorf("%s\n  %s", c, strings.Join(fails, "\n  "))
			if failed++; failed == 10 {
				t.Fatalf("stopping after %d failing cases", failed)
			}
		}
	}
	t.Logf("seed %d: %d cases in %v: plans placed %d, waiting %d, never %d; %d compared with blind, %d committed, %d with exhaustive",
		seed, st.cases, time.Since(start).Round(time.Millisecond), st.placed, st.waits, st.nevers, st.compared, st.committed, st.exhaustive)
	if st.cases >= 100 && (st.compared < st.cases/10 || st.exhaustive < st.cases/50 || st.waits == 0 || st.nevers == 0) {
		t.Errorf("the generator no longer exercises the properties: %+v", st)
	}
}

var discard = slog.New(slog.DiscardHandler)

// checkCase runs every check on one case and returns what failed.
func checkCase(t *testing.T, c *propCase, st *propStats) []string {
	t.Helper()
	var fails []string
	fail := func(format string, args ...any) { fails = append(fails, fmt.Sprintf(format, args...)) }
	st.cases++
	s := fixtures.MustStore(t, c.nodes, c.fabric)
	snap := s.Snapshot()
	ctx := context.Background()
	plan := func(strategy string, snap *store.Snapshot, job events.JobAnalyzed) (Plan, bool) {
		p := &Planner{Strategy: strategy, Fabric: c.fabric, Log: discard}
		out, err := p.Plan(ctx, snap, job, PlanOptions{})
		if err != nil {
			fail("%s: plan %s: %v", strategy, job.Job.JobID, err)
			return Plan{}, false
		}
		for _, f := range planFails(snap, job, out) {
			fail("%s: plan %s: %s", strategy, job.Job.JobID, f)
		}
		return out, true
	}
	predict := func(strategy string, gpus []store.GPUKey) (float64, bool) {
		pr, err := Prediction(snap, c.job, gpus, c.fabric, nil, strategy)
		if err != nil {
			fail("%s: prediction: %v", strategy, err)
			return 0, false
		}
		return pr.CommSecondsPerStep, true
	}

	base := blind.Place(snap, c.job)
	plans := map[string]Plan{}
	for _, name := range Names(true) {
		p, ok := plan(name, snap, c.job)
		if !ok {
			continue
		}
		plans[name] = p
		switch p.Verdict {
		case outcome.Placed:
			st.placed++
		case outcome.Wait:
			st.waits++
		case outcome.Never:
			st.nevers++
		}
		if p.Baseline.Verdict != base.Verdict || !slices.Equal(p.Baseline.GPUs, base.GPUs) {
			fail("%s: baseline %v %v, blind first fit %v %v", name, p.Baseline.Verdict, p.Baseline.GPUs, base.Verdict, base.GPUs)
		}
		if p.Verdict == outcome.Placed {
			commitFails(c, s, name, p, func(snap *store.Snapshot) (Plan, bool) { return plan(name, snap, c.next) }, fail)
			st.committed++
		}
	}
	ours, okO := plans[StrategyTopologyAware]
	bl, okB := plans[StrategyBlind]
	if !okO || !okB {
		return fails
	}
	if bl.Verdict != base.Verdict || !slices.Equal(bl.GPUs, base.GPUs) {
		fail("blind plan %v %v, blind first fit %v %v", bl.Verdict, bl.GPUs, base.Verdict, base.GPUs)
	}
	switch {
	case bl.Verdict == outcome.Placed && ours.Verdict != outcome.Placed:
		fail("blind places, topology-aware answers %v %v", ours.Verdict, ours.Reasons)
	case bl.Verdict != outcome.Placed && (ours.Verdict != bl.Verdict || !slices.Equal(ours.Reasons, bl.Reasons)):
		fail("blind answers %v %v, topology-aware %v %v (want blind's)", bl.Verdict, bl.Reasons, ours.Verdict, ours.Reasons)
	}
	if bl.Verdict != outcome.Placed || ours.Verdict != outcome.Placed {
		return fails
	}
	st.compared++
	to, ok1 := predict(StrategyTopologyAware, ours.GPUs)
	tb, ok2 := predict(StrategyBlind, bl.GPUs)
	if ok1 && ok2 && to*(1-notWorseMargin) > tb*(1+1e-12) {
		fail("topology-aware predicted %.6g s per step, blind %.6g s: more than %.1f%% slower", to, tb, 100*notWorseMargin)
	}
	if free := freeOf(snap, c.job.Job.GPUModel); len(free) <= 8 && c.job.Job.GPUs <= 4 && ok1 {
		st.exhaustive++
		ex, ok := plan(StrategyExhaustive, snap, c.job)
		if !ok {
			return fails
		}
		if ex.Verdict != outcome.Placed {
			fail("exhaustive answers %v %v where blind places", ex.Verdict, ex.Reasons)
			return fails
		}
		if te, ok := predict(StrategyExhaustive, ex.GPUs); ok && te > to*(1+1e-9) {
			fail("exhaustive optimum %v predicted %.6g s per step, slower than topology-aware's %v at %.6g s", ex.GPUs, te, ours.GPUs, to)
		}
	}
	return fails
}

// commitFails commits p for c.job on a fork of s, checks the store holds
// its GPUs for the job alone, and plans c.next on the result.
func commitFails(c *propCase, s *store.Store, strategy string, p Plan, next func(*store.Snapshot) (Plan, bool), fail func(string, ...any)) {
	f := s.Fork()
	if err := f.Allocate(c.job.Job.JobID, p.GPUs); err != nil {
		fail("%s: committing %v: %v", strategy, p.GPUs, err)
		return
	}
	if err := f.Allocate("intruder", p.GPUs[:1]); !errors.Is(err, store.ErrConflict) {
		fail("%s: a second job took committed GPU %s: %v, want ErrConflict", strategy, p.GPUs[0], err)
	}
	snap := f.Snapshot()
	var held []store.GPUKey
	for _, g := range snap.GPUsOfJob(c.job.Job.JobID) {
		held = append(held, g.Key())
	}
	if want := sortedKeys(p.GPUs); !slices.Equal(sortedKeys(held), want) {
		fail("%s: the store holds %v for the job, want %v", strategy, held, want)
	}
	q, ok := next(snap)
	if !ok {
		return
	}
	for _, g := range q.GPUs {
		if slices.Contains(p.GPUs, g) {
			fail("%s: the next job's plan %v reuses committed GPU %s", strategy, q.GPUs, g)
		}
	}
}

func sortedKeys(ks []store.GPUKey) []store.GPUKey {
	out := slices.Clone(ks)
	slices.SortFunc(out, func(a, b store.GPUKey) int {
		if c := strings.Compare(a.Node, b.Node); c != 0 {
			return c
		}
		return a.Index - b.Index
	})
	return out
}

// freeOf lists the free healthy GPUs of model ("": any) by walking every
// node, not through the store's counts.
func freeOf(snap *store.Snapshot, model string) []store.GPU {
	var out []store.GPU
	for _, n := range snap.Nodes() {
		for _, g := range snap.GPUs(n.Name) {
			if g.Free() && (model == "" || g.Model == model) {
				out = append(out, g)
			}
		}
	}
	return out
}

// planFails checks one plan against the snapshot it was made on.
func planFails(snap *store.Snapshot, job events.JobAnalyzed, p Plan) []string {
	var fails []string
	fail := func(format string, args ...any) { fails = append(fails, fmt.Sprintf(format, args...)) }
	n, gpn, model := job.Job.GPUs, job.Job.GPUsPerNode, job.Job.GPUModel
	seen := map[store.GPUKey]bool{}
	perNode := map[string]int{}
	for _, k := range p.GPUs {
		if seen[k] {
			fail("GPU %s twice in %v", k, p.GPUs)
		}
		seen[k] = true
		perNode[k.Node]++
		i := slices.IndexFunc(snap.GPUs(k.Node), func(g store.GPU) bool { return g.Index == k.Index })
		if i < 0 {
			fail("GPU %s does not exist", k)
			continue
		}
		g := snap.GPUs(k.Node)[i]
		switch {
		case !g.Healthy:
			fail("GPU %s is unhealthy", k)
		case g.JobID != "":
			fail("GPU %s is held by %s", k, g.JobID)
		case model != "" && g.Model != model:
			fail("GPU %s is a %s, the job asks for %s", k, g.Model, model)
		}
	}
	switch p.Verdict {
	case outcome.Placed:
		if len(p.GPUs) != n {
			fail("placed on %d GPUs, the job asks for %d", len(p.GPUs), n)
		}
		for node, cnt := range perNode {
			if gpn > 0 && cnt != gpn {
				fail("placed %d ranks on %s, the job asks for %d per node", cnt, node, gpn)
			}
		}
	case outcome.Wait, outcome.Never:
		if len(p.GPUs) != 0 {
			fail("%v with GPUs %v", p.Verdict, p.GPUs)
		}
		if len(p.Reasons) == 0 {
			fail("%v without a reason", p.Verdict)
		}
	default:
		fail("verdict %v", p.Verdict)
	}
	free := freeOf(snap, model)
	if p.Verdict == outcome.Placed && len(free) < n {
		fail("placed with %d free healthy GPUs of the model for %d", len(free), n)
	}
	if p.Verdict == outcome.Placed && gpn > 0 {
		byNode := map[string]int{}
		for _, g := range free {
			byNode[g.Node]++
		}
		nodes := 0
		for _, c := range byNode {
			if c >= gpn {
				nodes++
			}
		}
		if nodes < n/gpn {
			fail("placed with %d nodes of %d free GPUs for %d nodes", nodes, gpn, n/gpn)
		}
	}
	return fails
}
