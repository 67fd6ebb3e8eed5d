package collective

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/toposched/toposched/internal/topology"
)

var update = flag.Bool("update", false, "rewrite testdata/equivalence_golden.txt")

// fbits prints a float exactly (so that any change of result shows).
func fbits(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }

func dumpResult(b *strings.Builder, label string, r Result, err error) {
	if err != nil {
		fmt.Fprintf(b, "%s: error %v\n", label, err)
		return
	}
	fmt.Fprintf(b, "%s: %s %s/%s n=%d bytes=%s t=%s algbw=%s busbw=%s bn=%q\n", label, r.Collective, r.Algorithm, r.Protocol, r.Ranks,
		fbits(r.Bytes), fbits(r.TimeSeconds), fbits(r.AlgBWGBps), fbits(r.BusBWGBps), r.Bottleneck)
}

func dumpJob(b *strings.Builder, label string, r JobResult, err error) {
	if err != nil {
		fmt.Fprintf(b, "%s: error %v\n", label, err)
		return
	}
	fmt.Fprintf(b, "%s: gpus=%d comm=%s frac=%s speedup=%s\n", label, r.GPUs, fbits(r.CommSeconds), fbits(r.CommFraction), fbits(r.SpeedUp))
	for i, g := range r.Groups {
		dumpResult(b, fmt.Sprintf("  %d %s/%s step=%s", i, g.Name, g.Phase, fbits(g.StepSeconds)), g.Result, nil)
	}
}

// equivalenceDump exercises Predict and EvaluateJob over many shapes; its
// output is compared byte for byte with a golden taken before the model's
// internals were restructured for speed.
func equivalenceDump(t *testing.T) string {
	var b strings.Builder
	sysPath := func(a, c int) topology.Class {
		if a/2 != c/2 {
			return topology.SYS
		}
		return topology.PIX
	}
	pcie := BuildNode(NodeSpec{Name: "pcie", GPUs: 4, PCIeGen: 4, NICs: 2, NICGbps: 100, PCIePath: sysPath})
	pcieNoNIC := BuildNode(NodeSpec{Name: "pcie2", GPUs: 4, PCIeGen: 3})
	a := BuildNode(with(a100, func(s *NodeSpec) { s.NICs, s.NICGbps = 4, 200 }))
	h := BuildNode(with(h100, func(s *NodeSpec) { s.NICs, s.NICGbps = 8, 400 }))
	// A direct-NVLink node (no NVSwitch, uneven pairs), with an NVB pair.
	dn := BuildNode(NodeSpec{Name: "dnv", GPUs: 4, NVLinkGen: 2, PCIeGen: 3, NICs: 1, NICGbps: 100})
	dn.NVSwitches = 0
	for x := range 4 {
		for y := range 4 {
			switch {
			case x == y:
			case x^y == 1:
				dn.GPUPaths[x][y] = topology.Link{Class: topology.NV, NVLinks: 2}
			case x^y == 2:
				dn.GPUPaths[x][y] = topology.Link{Class: topology.NV, NVLinks: 1}
			default:
				dn.GPUPaths[x][y] = topology.Link{Class: topology.NVB}
			}
		}
	}
	colls := []Collective{AllReduce, AllGather, ReduceScatter, SendRecv, AllToAll}
	algos := []Algorithm{Auto, Ring, Tree, HalvingDoubling, NVLS, Hierarchical, Direct, PointToPoint}
	bj := benchJob(t, 1024)
	fab := bj.Fabric
	var hs []*topology.Node
	for _, g := range bj.Groups {
		if g.Name == "tp" {
			hs = append(hs, g.Ranks[0].Node)
		}
	}
	cont := Contention{}
	for _, n := range hs[:6] {
		cont["nic:"+n.Name+":2:tx"] = 0.5
		cont["pcie:"+n.Name+":1:rx"] = 0.25
		cont["nvport:"+n.Name+":3:tx"] = 0.3
	}
	cont["uplink:leaf000:up"] = 0.4
	cont["nvport:dnv:0:rx"] = 0.7
	cont["smp:pcie:tx"] = 0.2
	type pl struct {
		name string
		p    Placement
	}
	mixed := append(append(append(NodeRanks(a, 0, 3, 5, 6), NodeRanks(pcie, 1, 2, 3, 0)...), NodeRanks(pcieNoNIC, 2, 0)...), NodeRanks(dn, 3, 0, 1, 2)...)
	places := []pl{
		{"h100", Placement{Ranks: NodeRanks(h)}},
		{"a100-part", Placement{Ranks: NodeRanks(a, 7, 2, 4, 1)}},
		{"pcie", Placement{Ranks: NodeRanks(pcie)}},
		{"pcie-nonic", Placement{Ranks: NodeRanks(pcieNoNIC, 3, 1)}},
		{"dnv", Placement{Ranks: NodeRanks(dn)}},
		{"one", Placement{Ranks: NodeRanks(h, 5)}},
		{"mixed", Placement{Ranks: mixed}},
		{"fab-64", Placement{Ranks: NodesRanks(hs[:8], 8), Fabric: fab}},
		{"fab-cross-leaf", Placement{Ranks: append(NodesRanks(hs[30:34], 4), NodesRanks(hs[60:66], 4)...), Fabric: fab}},
		{"fab-uneven", Placement{Ranks: append(NodesRanks(hs[0:3], 8), NodesRanks(hs[40:41], 3)...), Fabric: fab}},
	}
	for _, p := range places {
		for _, c := range colls {
			for _, al := range algos {
				for _, sz := range []float64{0, 1 << 20, 8 << 30} {
					for ci, cn := range []Contention{nil, cont} {
						r, err := Predict(p.p, c, sz, Options{Algorithm: al, Contention: cn})
						dumpResult(&b, fmt.Sprintf("%s %s %s %s c%d", p.name, c, al, fbits(sz), ci), r, err)
					}
				}
				r, err := Predict(p.p, c, 1<<30, Options{Algorithm: al, Candidates: NCCLAlgorithms})
				dumpResult(&b, fmt.Sprintf("%s %s %s nccl", p.name, c, al), r, err)
			}
			fmt.Fprintf(&b, "%s %s algorithms %v\n", p.name, c, Algorithms(p.p, c, nil))
		}
	}
	// Jobs.
	r, err := EvaluateJob(benchJob(t, 1024))
	dumpJob(&b, "bench1024", r, err)
	j := benchJob(t, 512)
	for i := range j.Groups {
		j.Groups[i].Algorithm = Auto
		if i%3 == 0 {
			j.Groups[i].Phase = "x"
		}
	}
	j.Contention = cont
	r, err = EvaluateJob(j)
	dumpJob(&b, "bench512-auto-cont", r, err)
	j.Candidates = NCCLAlgorithms
	r, err = EvaluateJob(j)
	dumpJob(&b, "bench512-nccl-cont", r, err)
	// A job mixing shapes, collectives and algorithms.
	var groups []Group
	for i, al := range []Algorithm{Ring, Tree, HalvingDoubling, Hierarchical, Auto} {
		groups = append(groups, Group{Name: fmt.Sprint("dp", i), Collective: AllReduce, Ranks: NodesRanks(hs[i*4:i*4+4], 4), Bytes: 1 << 28, Algorithm: al, Calls: i, Phase: "dp"})
	}
	groups = append(groups,
		Group{Name: "a2a", Collective: AllToAll, Ranks: NodesRanks(hs[0:8], 2), Bytes: 1 << 24, Calls: 2},
		Group{Name: "pp", Collective: SendRecv, Ranks: NodesRanks(hs[40:44], 1), Bytes: 1 << 22, Calls: 3},
		Group{Name: "ag", Collective: AllGather, Ranks: NodesRanks(hs[0:16], 8), Bytes: 1 << 29, Algorithm: HalvingDoubling, Phase: "dp"},
		Group{Name: "rs", Collective: ReduceScatter, Ranks: NodeRanks(hs[20]), Bytes: 1 << 29, Algorithm: NVLS},
		Group{Name: "mixed", Collective: AllReduce, Ranks: mixed, Bytes: 1 << 26, Calls: 2, Phase: "dp"},
	)
	r, err = EvaluateJob(Job{Groups: groups, ComputeSeconds: 0.3, Fabric: fab, Contention: cont})
	dumpJob(&b, "mixed-job", r, err)
	r, err = EvaluateJob(Job{Groups: groups, GPUs: 999})
	dumpJob(&b, "mixed-job-nofab", r, err)
	r, err = EvaluateJob(Job{Groups: append(groups, Group{Name: "bad", Collective: AllReduce, Ranks: NodeRanks(hs[0], 0, 0)})})
	dumpJob(&b, "bad-job", r, err)
	return b.String()
}

func TestEquivalenceGolden(t *testing.T) {
	t.Parallel()
	got := equivalenceDump(t)
	const path = "testdata/equivalence_golden.txt"
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if got != string(want) {
		gl, wl := strings.Split(got, "\n"), strings.Split(string(want), "\n")
		for i := range min(len(gl), len(wl)) {
			if gl[i] != wl[i] {
				t.Fatalf("line %d:\n got %s\nwant %s", i+1, gl[i], wl[i])
			}
		}
		t.Fatalf("got %d lines, want %d", len(gl), len(wl))
	}
}

// TestLinkIDs checks that link ids decode to keys in linkKey order, and
// that the cheap capacities of a model without contention are those
// capacity gives.
func TestLinkIDs(t *testing.T) {
	t.Parallel()
	bj := benchJob(t, 1024)
	pcie := BuildNode(NodeSpec{Name: "pcie", GPUs: 4, PCIeGen: 4, NICs: 2, NICGbps: 100, PCIePath: func(a, b int) topology.Class {
		if a/2 != b/2 {
			return topology.SYS
		}
		return topology.PIX
	}})
	dn := BuildNode(NodeSpec{Name: "dnv", GPUs: 4, NVLinkGen: 2, NICs: 1, NICGbps: 100})
	dn.NVSwitches = 0
	dn.GPUPaths[0][3] = topology.Link{Class: topology.NVB}
	var ranks []Rank
	for _, g := range bj.Groups[:64:64] {
		ranks = append(ranks, g.Ranks[:3]...)
	}
	ranks = append(append(ranks, NodeRanks(pcie)...), NodeRanks(dn, 2, 1)...)
	m, err := newModel(Placement{Ranks: ranks, Fabric: bj.Fabric}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if m.nLinks == 0 || len(m.leafNames) < 2 {
		t.Fatalf("%d links, %d leaves", m.nLinks, len(m.leafNames))
	}
	var prev linkKey
	for id := range m.nLinks {
		k := m.key(id)
		if id > 0 && !prev.less(k) {
			t.Fatalf("id %d: key %+v not after %+v", id, k, prev)
		}
		if c := m.capacity(k); c != m.capOf(id) {
			t.Fatalf("id %d (%s): capacity %v, cached %v", id, m.linkName(k), c, m.capOf(id))
		}
		prev = k
	}
}

// Recycled root models (scratch.go) carry nothing from one evaluation to
// the next: jobs of different shapes, evaluated in shuffled orders from
// several goroutines at once, get the results they get alone (which the
// golden above pins).
func TestEvaluateJobRecycled(t *testing.T) {
	t.Parallel()
	big, small := benchJob(t, 512), benchJob(t, 64)
	var hs []*topology.Node
	for _, g := range big.Groups {
		if g.Name == "tp" {
			hs = append(hs, g.Ranks[0].Node)
		}
	}
	pcie := BuildNode(NodeSpec{Name: "pcie", GPUs: 4, PCIeGen: 4, NICs: 2, NICGbps: 100})
	jobs := []Job{big, small,
		{Groups: []Group{{Name: "a2a", Collective: AllToAll, Ranks: NodesRanks(hs[0:8], 2), Bytes: 1 << 24},
			{Name: "pcie", Collective: AllReduce, Ranks: NodeRanks(pcie, 3, 0, 2), Bytes: 1 << 20, Phase: "a2a"}}, Fabric: big.Fabric},
		{Groups: []Group{{Name: "bad", Collective: AllReduce, Ranks: NodeRanks(hs[0], 0, 0)}}},
		{Groups: []Group{{Name: "one", Collective: AllGather, Ranks: NodeRanks(pcie), Bytes: 1 << 26}}},
	}
	want := make([]string, len(jobs))
	for i, j := range jobs {
		var b strings.Builder
		r, err := EvaluateJob(j)
		dumpJob(&b, "", r, err)
		want[i] = b.String()
	}
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			for range 25 {
				for _, i := range rng.Perm(len(jobs)) {
					var b strings.Builder
					r, err := EvaluateJob(jobs[i])
					if dumpJob(&b, "", r, err); b.String() != want[i] {
						t.Errorf("job %d evaluated after others:\n%s\nalone:\n%s", i, b.String(), want[i])
						return
					}
				}
			}
		})
	}
	wg.Wait()
}
