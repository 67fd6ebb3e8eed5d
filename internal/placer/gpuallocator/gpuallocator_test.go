package gpuallocator

import (
	"slices"
	"testing"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/internal/fixtures"
	"github.com/toposched/toposched/internal/placer/outcome"
	"github.com/toposched/toposched/internal/topology"
)

// A test node as go-gpuallocator's tests describe one
// (gpuallocator/common_test.go): NVLinks per pair and the pair's PCIe
// level, scored as upstream scores them (100 per NVLink plus the level).
type testNode struct {
	nvlinks map[[2]int]int
	pcie    func(a, b int) topology.Class
}

func (n testNode) score(a, b int) int {
	if a > b {
		a, b = b, a
	}
	return 100*n.nvlinks[[2]int{a, b}] + PairScore(topology.Link{Class: n.pcie(a, b)})
}

// dgx1Volta is NewDGX1VoltaNode: the hybrid cube-mesh (NV1 and NV2), PCIe
// switch pairs 0-1, 2-3, 4-5, 6-7, host bridge within a socket of four.
var dgx1Volta = testNode{
	nvlinks: map[[2]int]int{
		{0, 1}: 1, {0, 2}: 1, {0, 3}: 2, {0, 4}: 2, {1, 2}: 2, {1, 3}: 1, {1, 5}: 2, {2, 3}: 2, {2, 6}: 1,
		{3, 7}: 1, {4, 5}: 1, {4, 6}: 1, {4, 7}: 2, {5, 6}: 2, {5, 7}: 1, {6, 7}: 2,
	},
	pcie: func(a, b int) topology.Class {
		switch {
		case a/4 != b/4:
			return topology.SYS
		case a/2 == b/2:
			return topology.PIX
		}
		return topology.PHB
	},
}

// dgx1Pascal is NewDGX1PascalNode: NV1 cube-mesh, PCIe switch pairs 0-2,
// 1-3, 4-6, 5-7.
var dgx1Pascal = testNode{
	nvlinks: map[[2]int]int{
		{0, 1}: 1, {0, 2}: 1, {0, 3}: 1, {0, 4}: 1, {1, 2}: 1, {1, 3}: 1, {1, 5}: 1, {2, 3}: 1, {2, 6}: 1,
		{3, 7}: 1, {4, 5}: 1, {4, 6}: 1, {4, 7}: 1, {5, 6}: 1, {5, 7}: 1, {6, 7}: 1,
	},
	pcie: func(a, b int) topology.Class {
		switch {
		case a/4 != b/4:
			return topology.SYS
		case a%2 == b%2:
			return topology.PIX
		}
		return topology.PHB
	},
}

// rtx8000 is New4xRTX8000Node: NVLink bridges 0-3 and 1-2 (NV2), sockets
// {0, 1} and {2, 3}.
var rtx8000 = testNode{
	nvlinks: map[[2]int]int{{0, 3}: 2, {1, 2}: 2},
	pcie: func(a, b int) topology.Class {
		if a/2 == b/2 {
			return topology.NODE
		}
		return topology.SYS
	},
}

// TestAllocatePublished is upstream's TestBestEffortAllocate
// (gpuallocator/besteffort_test.go) without the required-devices cases,
// which toposched never asks for.
func TestAllocatePublished(t *testing.T) {
	for _, tc := range []struct {
		name      string
		available []int
		size      int
		want      []int
	}{
		{"single NVLink, prefer same switch", []int{0, 2, 4, 5}, 2, []int{4, 5}},
		{"single NVLink, prefer same socket", []int{0, 4, 5, 6}, 2, []int{5, 6}},
		{"prefer dual NVLink same socket", []int{0, 3, 1}, 2, []int{0, 3}},
		{"prefer dual NVLink cross socket", []int{0, 1, 4}, 2, []int{0, 4}},
		{"too few available", []int{1, 2}, 3, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Allocate(tc.available, tc.size, dgx1Volta.score); !slices.Equal(got, tc.want) {
				t.Errorf("Allocate(%v, %d) = %v, want %v", tc.available, tc.size, got, tc.want)
			}
		})
	}
}

// TestAllocateInTurn is upstream's allocator tests (TestBestEffort*Alloc*):
// successive requests on one node, each taking its GPUs away, until a
// request finds nothing.
func TestAllocateInTurn(t *testing.T) {
	for _, tc := range []struct {
		name string
		node testNode
		gpus int
		size int
		want [][]int
	}{
		{"4x RTX 8000, two", rtx8000, 4, 2, [][]int{{0, 3}, {1, 2}}},
		{"4x RTX 8000, four", rtx8000, 4, 4, [][]int{{0, 1, 2, 3}}},
		{"4x RTX 8000, one", rtx8000, 4, 1, [][]int{{0}, {1}, {2}, {3}}},
		{"DGX-1 Pascal, two", dgx1Pascal, 8, 2, [][]int{{0, 2}, {1, 3}, {4, 6}, {5, 7}}},
		{"DGX-1 Pascal, four", dgx1Pascal, 8, 4, [][]int{{0, 1, 2, 3}, {4, 5, 6, 7}}},
		{"DGX-1 Pascal, eight", dgx1Pascal, 8, 8, [][]int{{0, 1, 2, 3, 4, 5, 6, 7}}},
		{"DGX-1 Volta, one", dgx1Volta, 8, 1, [][]int{{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}}},
		{"DGX-1 Volta, two", dgx1Volta, 8, 2, [][]int{{0, 3}, {1, 2}, {4, 7}, {5, 6}}},
		{"DGX-1 Volta, four", dgx1Volta, 8, 4, [][]int{{0, 1, 2, 3}, {4, 5, 6, 7}}},
		{"DGX-1 Volta, eight", dgx1Volta, 8, 8, [][]int{{0, 1, 2, 3, 4, 5, 6, 7}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var avail []int
			for g := range tc.gpus {
				avail = append(avail, g)
			}
			for _, want := range tc.want {
				got := Allocate(avail, tc.size, tc.node.score)
				if !slices.Equal(got, want) {
					t.Fatalf("from %v: got %v, want %v", avail, got, want)
				}
				avail = slices.DeleteFunc(avail, func(g int) bool { return slices.Contains(got, g) })
			}
			if got := Allocate(avail, tc.size, tc.node.score); got != nil {
				t.Errorf("from %v after every set: got %v, want nothing", avail, got)
			}
		})
	}
}

func TestPairScore(t *testing.T) {
	for _, tc := range []struct {
		cell string
		want int
	}{{"NV12", 1200}, {"NV2", 200}, {"PIX", 50}, {"PXB", 40}, {"PHB", 30}, {"NODE", 20}, {"SYS", 10}, {"NVB", 0}} {
		l, err := topology.ParseLink(tc.cell)
		if err != nil {
			t.Fatal(err)
		}
		if got := PairScore(l); got != tc.want {
			t.Errorf("PairScore(%s) = %d, want %d", tc.cell, got, tc.want)
		}
	}
}

// TestPlace checks the strategy on a store: first fit over nodes, the
// best-effort choice inside. The first node is full; the second is a PCIe
// tree of two switches {0,1,6,7} and {2,3,4,5} (the Quadro RTX 6000 host
// of nvsmi/testdata) with GPU 0 held: a pair goes on one switch.
func TestPlace(t *testing.T) {
	tree := func(i, j int) string {
		grp := func(g int) bool { return g == 0 || g == 1 || g == 6 || g == 7 }
		if grp(i) == grp(j) {
			return "PIX"
		}
		return "PXB"
	}
	st := fixtures.MustStore(t, []fixtures.Node{
		{Event: fixtures.PlainNode("full", "", 2), Held: []int{0, 1}},
		{Event: fixtures.PathsNode("tree", "", 8, tree), Held: []int{0}},
	}, nil)
	job := func(n, gpn int) events.JobAnalyzed {
		return events.JobAnalyzed{Job: events.JobSubmitted{JobID: "j", GPUs: n, GPUsPerNode: gpn}}
	}
	for _, tc := range []struct {
		name    string
		n, gpn  int
		verdict outcome.Verdict
		want    []int
	}{
		// Free 1..7 padded to eight: the first best partition found is
		// {1,6} {2,3} {4,5} {7,pad} (150), and its first best set {1,6}
		// (one switch), not the {2,3} a greedy choice of the same score
		// might take.
		{"two on one node", 2, 2, outcome.Placed, []int{1, 6}},
		{"four on one node", 4, 4, outcome.Placed, []int{2, 3, 4, 5}},
		{"more than the cluster", 11, 0, outcome.Never, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := Place(st.Snapshot(), job(tc.n, tc.gpn), nil, 1)
			if r.Verdict != tc.verdict {
				t.Fatalf("verdict %v (%v), want %v", r.Verdict, r.Reasons, tc.verdict)
			}
			var got []int
			for _, g := range r.GPUs {
				if g.Node != "tree" {
					t.Fatalf("GPU %v: want node tree", g)
				}
				got = append(got, g.Index)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("GPUs %v, want %v", got, tc.want)
			}
		})
	}
}
