package collective

import (
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/toposched/toposched/internal/formats/nvsmi"
	"github.com/toposched/toposched/internal/topology"
)

// permutations calls fn with every order of a.
func permutations(a []int, fn func([]int)) {
	var rec func(k int)
	rec = func(k int) {
		if k == len(a) {
			fn(a)
			return
		}
		for i := k; i < len(a); i++ {
			a[k], a[i] = a[i], a[k]
			rec(k + 1)
			a[k], a[i] = a[i], a[k]
		}
	}
	rec(0)
}

// The same GPUs of one node give one prediction whatever their order, as
// NCCL searches its own ring and chain inside a node. On an RTX 4090 box
// with two PCIe switches, 0,1,4,5 was predicted 18.89 GB/s, 1,4,5,0 16.63
// and 0,4,1,5 8.32.
func TestPredictionIndependentOfOrder(t *testing.T) {
	t.Parallel()
	file := filepath.Join("..", "formats", "nvsmi", "testdata", "rtx4090-8gpu-pcie-switch_nccl-tests-issue-307.txt")
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	box, err := nvsmi.Parse(file, data)
	if err != nil {
		t.Fatal(err)
	}
	nodes := []*topology.Node{box}
	// Generated nodes: PCIe trees and bridged pairs with random classes.
	rng := rand.New(rand.NewPCG(3, 14))
	classes := []topology.Class{topology.PIX, topology.PXB, topology.PHB, topology.SYS}
	for range 40 {
		g := 4 + rng.IntN(5)
		n := BuildNode(NodeSpec{Name: "gen", GPUs: g, Model: "G", PCIeGen: 4, PCIePath: func(a, b int) topology.Class {
			return classes[(a/2+b/2+a%2*b%2)%len(classes)]
		}})
		for a := range g {
			for b := range a {
				l := topology.Link{Class: classes[rng.IntN(len(classes))]}
				if a/2 == b/2 && rng.IntN(2) == 0 {
					l = topology.Link{Class: topology.NV, NVLinks: 1 + rng.IntN(4)}
				}
				n.GPUPaths[a][b], n.GPUPaths[b][a] = l, l
			}
		}
		nodes = append(nodes, n)
	}
	// Bridged pairs, two GPUs on each of four sockets: one GPU of each
	// socket crosses the inter-socket link between every pair, whose two
	// directions the ring's order would load unevenly (tp4 x dp2 placed
	// 23% off the optimum before the ring balanced them).
	quad := BuildNode(NodeSpec{Name: "quad", GPUs: 8, Model: "G", PCIeGen: 4, PCIePath: func(a, b int) topology.Class { return topology.SYS }})
	for a := 0; a < 8; a += 2 {
		quad.GPUPaths[a][a+1], quad.GPUPaths[a+1][a] = topology.Link{Class: topology.NV, NVLinks: 4}, topology.Link{Class: topology.NV, NVLinks: 4}
	}
	nodes = append(nodes, quad)
	checked := 0
	for i, n := range nodes {
		k := min(len(n.GPUs), 3+i%3)
		set := rng.Perm(len(n.GPUs))[:k]
		switch {
		case i == 0:
			set = []int{0, 1, 4, 5}
		case n == quad:
			set = []int{1, 2, 4, 6}
		}
		for _, c := range []Collective{AllReduce, AllGather, ReduceScatter} {
			for _, bytes := range []float64{1 << 20, 1 << 30} {
				var first float64
				var firstOrder []int
				permutations(slices.Clone(set), func(order []int) {
					r, err := Predict(Placement{Ranks: NodeRanks(n, order...)}, c, bytes, Options{Candidates: NCCLAlgorithms})
					if err != nil {
						t.Fatal(err)
					}
					checked++
					if firstOrder == nil {
						first, firstOrder = r.BusBWGBps, slices.Clone(order)
						return
					}
					if r.BusBWGBps != first {
						r0, _ := Predict(Placement{Ranks: NodeRanks(n, firstOrder...)}, c, bytes, Options{Candidates: NCCLAlgorithms})
						t.Fatalf("node %d, %s of %g B: GPUs %v give %.3f GB/s (%s %s), %v %.3f (%s %s)", i, c, bytes, firstOrder, first, r0.Algorithm, r0.Bottleneck, order, r.BusBWGBps, r.Algorithm, r.Bottleneck)
					}
				})
			}
		}
	}
	t.Logf("%d predictions over %d nodes, one bandwidth per GPU set", checked, len(nodes))
}

// Across two nodes a ring visits each node's GPUs through its searched
// chain, whatever the ranks' order (interleaved between the nodes, too).
func TestRingAcrossNodesIndependentOfOrder(t *testing.T) {
	t.Parallel()
	pcie := func(name string) *topology.Node {
		return BuildNode(NodeSpec{Name: name, GPUs: 4, PCIeGen: 4, NICs: 2, NICGbps: 200, PCIePath: func(a, b int) topology.Class {
			if a/2 == b/2 {
				return topology.PIX
			}
			return topology.SYS
		}})
	}
	a, b := pcie("a"), pcie("b")
	ranks := append(NodeRanks(a, 0, 1, 3), NodeRanks(b, 0, 2, 3)...)
	idx := []int{0, 1, 2, 3, 4, 5}
	var first float64
	seen := 0
	permutations(idx, func(order []int) {
		rs := make([]Rank, len(order))
		for i, o := range order {
			rs[i] = ranks[o]
		}
		r, err := Predict(Placement{Ranks: rs}, AllReduce, 1<<30, Options{Algorithm: Ring})
		if err != nil {
			t.Fatal(err)
		}
		if seen++; seen == 1 {
			first = r.BusBWGBps
		} else if r.BusBWGBps != first {
			t.Fatalf("order %v: %.3f GB/s, first order %.3f", order, r.BusBWGBps, first)
		}
	})
	t.Logf("%d orders of 3 + 3 GPUs on two nodes: %.2f GB/s each", seen, first)
}
