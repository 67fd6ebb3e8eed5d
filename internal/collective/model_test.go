package collective

import (
	"errors"
	"math"
	"testing"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/internal/topology"
)

func near(got, want, tol float64) bool { return math.Abs(got-want) <= tol*math.Abs(want) }

func TestSpeedUp(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name         string
		n            int
		tcomm, tcalc float64
		want         float64
	}{
		{"64 GPUs, Tcomm = Tcalc", 64, 1, 1, 32},
		{"8 GPUs, no comm", 8, 0, 1, 8},
		{"8 GPUs, 35% comm share", 8, 0.35, 0.65, 5.2},
		{"8 GPUs, 18% comm share", 8, 0.18, 0.82, 6.56},
		{"no compute", 8, 1, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := SpeedUp(tc.n, tc.tcomm, tc.tcalc); !near(got, tc.want, 0.01) && !(tc.want == 0 && got == 0) {
				t.Errorf("SpeedUp(%d, %v, %v) = %v, want %v", tc.n, tc.tcomm, tc.tcalc, got, tc.want)
			}
		})
	}
	if got := AmdahlSpeedUp(64, 1.0/63); !near(got, 32, 0.01) {
		t.Errorf("AmdahlSpeedUp(64, 1/63) = %v, want 32", got)
	}
}

func TestBusFactor(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		c    Collective
		n    int
		want float64
	}{
		{AllReduce, 8, 1.75}, {AllGather, 8, 0.875}, {ReduceScatter, 4, 0.75},
		{SendRecv, 8, 1}, {AllToAll, 8, 0.875}, {AllReduce, 1, 1},
	} {
		if got := BusFactor(tc.c, tc.n); got != tc.want {
			t.Errorf("BusFactor(%s, %d) = %v, want %v", tc.c, tc.n, got, tc.want)
		}
	}
}

func TestPredictSingleNode(t *testing.T) {
	t.Parallel()
	a := BuildNode(a100)
	h := BuildNode(h100)
	pcie := BuildNode(NodeSpec{Name: "pcie", GPUs: 4, PCIeGen: 4})
	for _, tc := range []struct {
		name  string
		p     Placement
		c     Collective
		algo  Algorithm
		busbw float64 // GB/s at 8 GiB, 5%
	}{
		{"A100 ring = 12 NVLink3 x 25 x 0.8", Placement{Ranks: NodeRanks(a)}, AllReduce, Ring, 240},
		{"H100 ring", Placement{Ranks: NodeRanks(h)}, AllReduce, Ring, 360},
		{"H100 auto is NVLS", Placement{Ranks: NodeRanks(h)}, AllReduce, Auto, 481},
		{"H100 all_gather ring", Placement{Ranks: NodeRanks(h)}, AllGather, Ring, 360},
		{"A100 reduce_scatter", Placement{Ranks: NodeRanks(a)}, ReduceScatter, Ring, 240},
		{"A100 all_to_all", Placement{Ranks: NodeRanks(a)}, AllToAll, Direct, 240},
		{"A100 sendrecv", Placement{Ranks: NodeRanks(a)}, SendRecv, PointToPoint, 240},
		{"PCIe gen4 ring", Placement{Ranks: NodeRanks(pcie)}, AllReduce, Ring, 25.2},
		{"A100 halving-doubling", Placement{Ranks: NodeRanks(a)}, AllReduce, HalvingDoubling, 240},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r, err := Predict(tc.p, tc.c, 8<<30, Options{Algorithm: tc.algo})
			if err != nil {
				t.Fatal(err)
			}
			if !near(r.BusBWGBps, tc.busbw, 0.05) {
				t.Errorf("busbw %.1f GB/s (%s, bottleneck %s), want %.1f", r.BusBWGBps, r.Algorithm, r.Bottleneck, tc.busbw)
			}
			if r.TimeSeconds <= 0 || r.AlgBWGBps*BusFactor(tc.c, len(tc.p.Ranks)) != r.BusBWGBps {
				t.Errorf("inconsistent result %+v", r)
			}
		})
	}
}

func TestPredictErrors(t *testing.T) {
	t.Parallel()
	a := BuildNode(a100)
	for _, tc := range []struct {
		name string
		p    Placement
		c    Collective
		algo Algorithm
		want error
	}{
		{"no ranks", Placement{}, AllReduce, Auto, ErrNoRanks},
		{"NVLS on NVLink 3", Placement{Ranks: NodeRanks(a)}, AllReduce, NVLS, ErrNotApplicable},
		{"halving-doubling on 6", Placement{Ranks: NodeRanks(a, 0, 1, 2, 3, 4, 5)}, AllReduce, HalvingDoubling, ErrNotApplicable},
		{"hierarchical on one node", Placement{Ranks: NodeRanks(a)}, AllReduce, Hierarchical, ErrNotApplicable},
		{"tree all_gather", Placement{Ranks: NodeRanks(a)}, AllGather, Tree, ErrNotApplicable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := Predict(tc.p, tc.c, 1<<20, Options{Algorithm: tc.algo})
			if !errors.Is(err, tc.want) {
				t.Errorf("err = %v, want %v", err, tc.want)
			}
		})
	}
	if _, err := Predict(Placement{Ranks: []Rank{{a, 0}, {a, 0}}}, AllReduce, 1, Options{}); err == nil {
		t.Error("two ranks on one GPU: no error")
	}
	if _, err := Predict(Placement{Ranks: []Rank{{a, 9}}}, AllReduce, 1, Options{}); err == nil {
		t.Error("GPU 9 of 8: no error")
	}
}

func TestContentionSharesLinks(t *testing.T) {
	t.Parallel()
	ns := nodes(with(a100, func(s *NodeSpec) { s.NICs, s.NICGbps = 4, 200 }), 2)
	p := Placement{Ranks: NodesRanks(ns, 8)}
	free, err := Predict(p, AllReduce, 8<<30, Options{Algorithm: Ring})
	if err != nil {
		t.Fatal(err)
	}
	cont := Contention{}
	for _, n := range ns {
		for k := range 4 {
			cont["nic:"+n.Name+":"+string(rune('0'+k))+":tx"] = 0.5
		}
	}
	busy, err := Predict(p, AllReduce, 8<<30, Options{Algorithm: Ring, Contention: cont})
	if err != nil {
		t.Fatal(err)
	}
	if !near(busy.BusBWGBps, free.BusBWGBps/2, 0.05) {
		t.Errorf("half the NICs taken by another job: %.1f GB/s, want half of %.1f", busy.BusBWGBps, free.BusBWGBps)
	}
}

func TestDoubleBinaryTree(t *testing.T) {
	t.Parallel()
	// NCCL's trees for 4 ranks: 0 <- 2 <- {1, 3}; mirror 3 <- 1 <- {2, 0}.
	for _, tc := range []struct {
		n, tree int
		want    []int
	}{
		{4, 0, []int{-1, 2, 0, 2}},
		{4, 1, []int{1, 3, 1, -1}},
		{3, 0, []int{-1, 2, 0}},
		{3, 1, []int{1, -1, 0}},
		{2, 0, []int{-1, 0}},
	} {
		for r, w := range tc.want {
			if got := dtreeParent(tc.n, r, tc.tree); got != w {
				t.Errorf("n=%d tree %d: parent of %d = %d, want %d", tc.n, tc.tree, r, got, w)
			}
		}
	}
}

// The BERT-Large case: one 8x A100 server whose NVLink joins GPUs only
// within two groups of four (the other pairs go through PCIe switches,
// PXB). The brief's topology-blind mapping in PCIe order alternates the
// groups; NCCL searches its own ring inside a node, so for one all-reduce
// over the whole server the ranks' order changes nothing, and the model
// says so. What a placement does change is which GPUs a smaller job gets:
// four GPUs across the groups (0, 4, 1, 5: first fit in PCIe order)
// against four of one group.
func TestMotivatingBERTLarge(t *testing.T) {
	t.Parallel()
	node := BuildNode(NodeSpec{Name: "a100-2x4", GPUs: 8, Model: "A100", NVLinkGen: 3, PCIeGen: 4,
		PCIePath: func(a, b int) topology.Class { return topology.PXB }})
	for a := range 8 {
		for b := range 8 {
			if a != b && a/4 == b/4 {
				node.GPUPaths[a][b] = topology.Link{Class: topology.NV, NVLinks: 12}
			}
		}
	}
	const grads = 1.2e9 // fp32 gradients per step
	const tcalc = 0.2   // assumed compute per step (BERT-Large on A100)
	eval := func(gpus ...int) (Result, JobResult) {
		r, err := Predict(Placement{Ranks: NodeRanks(node, gpus...)}, AllReduce, grads, Options{Candidates: NCCLAlgorithms})
		if err != nil {
			t.Fatal(err)
		}
		j, err := EvaluateJob(Job{Groups: []Group{{Name: "dp", Collective: AllReduce, Ranks: NodeRanks(node, gpus...), Bytes: grads}},
			ComputeSeconds: tcalc, Candidates: NCCLAlgorithms})
		if err != nil {
			t.Fatal(err)
		}
		return r, j
	}
	interleaved, _ := eval(0, 4, 1, 5, 2, 6, 3, 7)
	grouped, _ := eval(0, 1, 2, 3, 4, 5, 6, 7)
	if interleaved.BusBWGBps != grouped.BusBWGBps {
		t.Errorf("8 GPUs: interleaved order %.2f GB/s, grouped %.2f: NCCL's ring inside a node does not depend on the order", interleaved.BusBWGBps, grouped.BusBWGBps)
	}
	blind, bj := eval(0, 4, 1, 5)
	aware, aj := eval(0, 1, 2, 3)
	t.Logf("8 GPUs, any order: %s %.1f GB/s", grouped.Algorithm, grouped.BusBWGBps)
	t.Logf("blind 4: %s %.1f GB/s, comm %.0f ms (%.0f%%), speed-up %.1f", blind.Algorithm, blind.BusBWGBps, 1e3*bj.CommSeconds, 100*bj.CommFraction, bj.SpeedUp)
	t.Logf("aware 4: %s %.1f GB/s, comm %.0f ms (%.0f%%), speed-up %.1f", aware.Algorithm, aware.BusBWGBps, 1e3*aj.CommSeconds, 100*aj.CommFraction, aj.SpeedUp)
	if aware.BusBWGBps < 1.5*blind.BusBWGBps || aj.SpeedUp <= bj.SpeedUp {
		t.Errorf("four GPUs of one NVLink group (%.1f GB/s, speed-up %.2f) should clearly beat four across the groups (%.1f GB/s, %.2f)",
			aware.BusBWGBps, aj.SpeedUp, blind.BusBWGBps, bj.SpeedUp)
	}
}

// The 4-node case: four 8x A100 nodes, 4x 100 Gb/s RoCE NICs each, two
// nodes under each of two leaves whose uplinks (600 Gb/s, 4:3
// oversubscribed) the rings share. A topology-blind rank order alternates
// leaves, so the ring crosses the uplinks twice each way; the double
// binary tree crosses them with half the data.
func TestMotivatingFourNodes(t *testing.T) {
	t.Parallel()
	spec := with(a100, func(s *NodeSpec) { s.NICs, s.NICGbps = 4, 100 })
	ns := nodes(spec, 4)
	fab, err := topology.NewFabric(events.TopologyFabric{Cluster: "c", Switches: []events.Switch{
		{Name: "spine", Tier: "spine", Switches: []string{"leafA", "leafB"}},
		{Name: "leafA", Tier: "leaf", Nodes: []string{ns[0].Name, ns[1].Name}, LinkGbps: 100, Uplinks: 6, UplinkGbps: 100, Oversubscription: 4.0 / 3},
		{Name: "leafB", Tier: "leaf", Nodes: []string{ns[2].Name, ns[3].Name}, LinkGbps: 100, Uplinks: 6, UplinkGbps: 100, Oversubscription: 4.0 / 3},
	}})
	if err != nil {
		t.Fatal(err)
	}
	blindOrder := NodesRanks([]*topology.Node{ns[0], ns[2], ns[1], ns[3]}, 8)
	awareOrder := NodesRanks(ns, 8)
	const grads = 3e9 // GPT-2 1.5B, fp16 gradients
	pred := func(ranks []Rank, a Algorithm) Result {
		r, err := Predict(Placement{Ranks: ranks, Fabric: fab}, AllReduce, grads, Options{Algorithm: a})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	ring, tree, auto := pred(blindOrder, Ring), pred(blindOrder, Tree), pred(blindOrder, Auto)
	aware := pred(awareOrder, Ring)
	t.Logf("blind ring %.1f GB/s (%s), tree %.1f GB/s (%s), auto %s; aware ring %.1f GB/s", ring.BusBWGBps, ring.Bottleneck,
		tree.BusBWGBps, tree.Bottleneck, auto.Algorithm, aware.BusBWGBps)
	if ring.BusBWGBps < 30 || ring.BusBWGBps > 42 {
		t.Errorf("ring %.1f GB/s, brief 38", ring.BusBWGBps)
	}
	if tree.BusBWGBps < 42 || tree.BusBWGBps > 50 {
		t.Errorf("tree %.1f GB/s, brief 47", tree.BusBWGBps)
	}
	if auto.Algorithm == Ring {
		t.Errorf("auto chose ring")
	}
	// Throughput: the compute per step is set so that ring runs at the
	// brief's 52% scaling efficiency; tree then gains what its faster
	// all-reduce gives. The brief's 12,500 -> 21,000 tokens/s (1.68x) is
	// more than the all-reduce alone can give (at most 47/38 = 1.24x).
	tcalc := ring.TimeSeconds * 0.52 / 0.48
	gain := (tcalc + ring.TimeSeconds) / (tcalc + tree.TimeSeconds)
	t.Logf("tokens/s gain tree over ring: %.2fx (brief 1.68x): 12,500 -> %.0f", gain, 12500*gain)
	if gain < 1.05 || gain > 1.68 {
		t.Errorf("gain %.2f", gain)
	}
}

func TestEvaluateJobSharesLinks(t *testing.T) {
	t.Parallel()
	spec := with(h100, func(s *NodeSpec) { s.NICs, s.NICGbps = 8, 400 })
	ns := nodes(spec, 4)
	// TP inside each node, DP across nodes: 8 DP groups, one per local GPU.
	var groups []Group
	for _, n := range ns {
		groups = append(groups, Group{Name: "tp", Collective: AllReduce, Ranks: NodeRanks(n), Bytes: 64 << 20, Calls: 4})
	}
	for g := range 8 {
		var r []Rank
		for _, n := range ns {
			r = append(r, Rank{n, g})
		}
		groups = append(groups, Group{Name: "dp", Collective: AllReduce, Ranks: r, Bytes: 1 << 30, Algorithm: Ring, Phase: "dp"})
	}
	j, err := EvaluateJob(Job{Groups: groups, ComputeSeconds: 0.5})
	if err != nil {
		t.Fatal(err)
	}
	if j.GPUs != 32 || len(j.Groups) != 12 || j.SpeedUp <= 0 || j.SpeedUp >= 32 || j.CommFraction <= 0 {
		t.Errorf("job %+v", j)
	}
	// Each DP group alone uses one NIC per node; all eight at once use
	// eight NICs: sharing must not make the phase slower than one group
	// alone by more than the NICs' count allows, nor faster.
	var dpAlone float64
	for _, g := range j.Groups {
		if g.Phase == "dp" {
			dpAlone = max(dpAlone, g.StepSeconds)
		}
	}
	if dpAlone <= 0 || j.CommSeconds < dpAlone {
		t.Errorf("comm %.4f s below one DP group alone %.4f s", j.CommSeconds, dpAlone)
	}
}

func TestParse(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]Collective{"allreduce": AllReduce, "all_gather": AllGather, "reduce-scatter": ReduceScatter, "sendrecv": SendRecv, "alltoall": AllToAll} {
		if got, err := ParseCollective(in); err != nil || got != want {
			t.Errorf("ParseCollective(%q) = %v, %v", in, got, err)
		}
	}
	if _, err := ParseCollective("broadcast"); err == nil {
		t.Error("broadcast: no error")
	}
	for in, want := range map[string]Algorithm{"": Auto, "ring": Ring, "tree": Tree, "nvls": NVLS, "hierarchical": Hierarchical, "rhd": HalvingDoubling} {
		if got, err := ParseAlgorithm(in); err != nil || got != want {
			t.Errorf("ParseAlgorithm(%q) = %v, %v", in, got, err)
		}
	}
	if _, err := ParseAlgorithm("butterfly"); err == nil {
		t.Error("butterfly: no error")
	}
}
