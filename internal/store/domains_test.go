package store

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/toposched/toposched/events"
)

// topoReport builds a node report with GPUs 0..len(paths)-1, the GPU matrix
// paths, NUMA numa[i] (-1: not said; nil: none said) and NICs mlx5_k with
// GPU-NIC matrix nics (nil: no NICs).
func topoReport(name string, pos int, model string, paths [][]string, numa []int, nics [][]string) events.TopologyNode {
	n := report(name, pos, model, len(paths))
	n.GPUPaths = paths
	for i := range n.GPUs {
		if i < len(numa) && numa[i] >= 0 {
			v := numa[i]
			n.GPUs[i].NUMA = &v
		}
	}
	if nics != nil {
		for k := range nics[0] {
			n.NICs = append(n.NICs, events.NIC{Name: fmt.Sprintf("mlx5_%d", k)})
		}
		n.NICPaths = nics
	}
	return n
}

// nvswitch returns the matrix of a node of g GPUs, every pair NV<links>.
func nvswitch(g, links int) [][]string {
	m := make([][]string, g)
	for i := range m {
		m[i] = make([]string, g)
		for j := range m[i] {
			m[i][j] = fmt.Sprintf("NV%d", links)
			if i == j {
				m[i][j] = "X"
			}
		}
	}
	return m
}

// dgxNICs gives each GPU its own NIC under its PCIe switch (PIX), the
// pair's other NIC PXB, the socket's NODE, the rest SYS.
func dgxNICs(g int) [][]string {
	m := make([][]string, g)
	for i := range m {
		m[i] = make([]string, g)
		for k := range m[i] {
			switch {
			case k == i:
				m[i][k] = "PIX"
			case k/2 == i/2:
				m[i][k] = "PXB"
			case k/(g/2) == i/(g/2):
				m[i][k] = "NODE"
			default:
				m[i][k] = "SYS"
			}
		}
	}
	return m
}

// allGPUs returns every GPU row of a snapshot, orphans included.
func allGPUs(s *Snapshot) []GPU {
	var out []GPU
	it := s.get(TableGPUs, IndexID)
	for raw := it.Next(); raw != nil; raw = it.Next() {
		out = append(out, *raw.(*GPU))
	}
	return out
}

func allDomains(s *Snapshot) []Domain {
	var out []Domain
	it := s.get(TableDomains, IndexID)
	for raw := it.Next(); raw != nil; raw = it.Next() {
		out = append(out, raw.(*Domain).public())
	}
	return out
}

// checkDomains recounts every domain from the GPU rows of one snapshot and
// checks the domain table, the domain index and the O(1) reads against it.
func checkDomains(t *testing.T, snap *Snapshot) {
	t.Helper()
	want := map[string]*Domain{}
	members := map[string][]GPU{}
	for _, g := range allGPUs(snap) {
		for _, id := range g.Domains {
			d := want[id]
			if d == nil {
				d = &Domain{ID: id, Kind: DomainKind(id), Node: domainNode(id)}
				want[id] = d
			}
			if d.Node != "" {
				d.Position = g.NodePosition
			}
			i, ok := slices.BinarySearchFunc(d.Models, g.Model, compareModel)
			if !ok {
				d.Models = slices.Insert(d.Models, i, ModelCount{Model: g.Model})
			}
			m := &d.Models[i]
			d.Total++
			m.Total++
			if g.Healthy {
				d.Healthy++
				m.Healthy++
			}
			if g.Free() {
				d.Free++
				m.Free++
			}
			members[id] = append(members[id], g)
		}
		if len(g.Domains) > 0 && g.Node != domainNode(g.Domains[slices.IndexFunc(g.Domains, func(d string) bool {
			return DomainKind(d) == DomainNode
		})]) {
			t.Errorf("GPU %s in node domain of another node: %v", g.Key(), g.Domains)
		}
	}
	// A node domain's row points at its node's row and its GPUs' rows.
	it := snap.get(TableDomains, IndexID)
	for raw := it.Next(); raw != nil; raw = it.Next() {
		d := raw.(*Domain)
		if d.Kind != DomainNode {
			if d.node != nil || d.free != nil {
				t.Errorf("domain %s has node or GPU pointers", d.ID)
			}
			continue
		}
		if n, ok := snap.Node(d.Node); !ok || d.node == nil || !reflect.DeepEqual(*d.node, n) {
			t.Errorf("domain %s points at node %+v", d.ID, d.node)
		}
		var free []FreeGPU
		for _, g := range members[d.ID] {
			if g.Free() {
				free = append(free, FreeGPU{Node: g.Node, Index: g.Index, Model: g.Model, Domains: g.Domains})
			}
		}
		if !reflect.DeepEqual(d.free, free) {
			t.Errorf("domain %s lists free GPUs %v, its free members are %v", d.ID, d.free, free)
		}
	}
	got := allDomains(snap)
	if len(got) != len(want) {
		t.Errorf("%d domain rows, want %d: %v", len(got), len(want), slices.Sorted(maps.Keys(want)))
	}
	for _, d := range got {
		w := want[d.ID]
		if w == nil {
			t.Errorf("domain %s has a row but no GPU", d.ID)
			continue
		}
		w.outside = d.outside // recounted in checkNodeCounts
		if !domainEqual(&d, w) {
			t.Errorf("domain %s = %+v, recounted %+v", d.ID, d, *w)
		}
	}
	for id, d := range want {
		models := []string{""}
		for _, m := range d.Models {
			models = append(models, m.Model)
		}
		for _, model := range append(models, "no-such-model") {
			var free []GPU
			for _, g := range members[id] {
				if g.Free() && (model == "" || g.Model == model) {
					free = append(free, g)
				}
			}
			slices.SortFunc(free, compareGPUs)
			if got := snap.FreeGPUsIn(id, model); !reflect.DeepEqual(got, free) && (len(got) > 0 || len(free) > 0) {
				t.Errorf("FreeGPUsIn(%s, %q) = %v, want %v", id, model, gpuKeys(got), gpuKeys(free))
			}
		}
	}
	// The O(1) reads against walks.
	for _, model := range []string{"", "A100", "H100", "L40S"} {
		total, healthy, maxN := 0, 0, 0
		for n := range snap.EachNode() {
			c := 0
			for g := range snap.EachGPU(n.Name) {
				if model == "" || g.Model == model {
					total++
					c++
					if g.Healthy {
						healthy++
					}
				}
			}
			maxN = max(maxN, c)
		}
		if gt, gh := snap.Capacity(model); gt != total || gh != healthy {
			t.Errorf("Capacity(%q) = %d, %d; walk says %d, %d", model, gt, gh, total, healthy)
		}
		if got := snap.MaxGPUsPerNode(model); got != maxN {
			t.Errorf("MaxGPUsPerNode(%q) = %d; walk says %d", model, got, maxN)
		}
		free := 0
		for _, g := range allGPUs(snap) {
			if g.Free() && (model == "" || g.Model == model) {
				free++
			}
		}
		if got := snap.FreeByModel(model); got != free {
			t.Errorf("FreeByModel(%q) = %d; walk says %d", model, got, free)
		}
	}
}

// checkNodeCounts recounts, for every model, the nodes by their GPUs from
// a walk of the nodes and checks NodeCounts, NodesByFree and NodesWithFree
// against it.
func checkNodeCounts(t *testing.T, snap *Snapshot) {
	t.Helper()
	type nodeCount struct {
		node                          Node
		total, healthy, free, outside int
	}
	byModel := map[string][]nodeCount{"": nil, "no-such-model": nil}
	for n, gpus := range snap.EachNodeWithGPUs() {
		// The most of the node's GPUs (less those its report dropped)
		// without one GPU's smallest node-local domain among theirs.
		outside := 0
		for _, g := range gpus {
			smallest := ""
			for _, prefix := range []string{DomainIsland, DomainPCIe, DomainNUMA} {
				if i := slices.IndexFunc(g.Domains, func(d string) bool { return strings.HasPrefix(d, prefix+":") }); i >= 0 {
					smallest = g.Domains[i]
					break
				}
			}
			if smallest == "" || g.HealthReason == ReasonMissing {
				continue
			}
			without := 0
			for _, h := range gpus {
				if h.HealthReason != ReasonMissing && !slices.Contains(h.Domains, smallest) {
					without++
				}
			}
			outside = max(outside, without)
		}
		counts := map[string]*nodeCount{"": {node: n, outside: outside}}
		for _, g := range gpus {
			m := cmp.Or(g.Model, n.GPUModel)
			if g.Model != m {
				t.Errorf("GPU %s has no model, its node has %q", g.Key(), m)
			}
			models := []string{""}
			if m != "" {
				models = append(models, m)
			}
			for _, model := range models {
				c := counts[model]
				if c == nil {
					c = &nodeCount{node: n, outside: outside}
					counts[model] = c
				}
				c.total++
				if g.Healthy {
					c.healthy++
				}
				if g.Free() {
					c.free++
				}
			}
		}
		for model, c := range counts {
			if c.total > 0 {
				byModel[model] = append(byModel[model], *c)
			}
		}
	}
	// OneModelFree, worked out from the nodes: the nodes with min free
	// GPUs of any model are all among those of one model, and all its.
	for min := 1; min <= 9; min++ {
		anyModel, models, all := 0, 0, true
		for model, ncs := range byModel {
			k := 0
			for _, c := range ncs {
				if c.free >= min {
					k++
				}
			}
			if model == "" {
				anyModel = k
			} else if k > 0 {
				models++
				all = all && k == len(slices.DeleteFunc(slices.Clone(byModel[""]), func(c nodeCount) bool { return c.free < min }))
			}
		}
		if want := models <= 1 && all; snap.OneModelFree(min) != want {
			t.Errorf("OneModelFree(%d) = %v, want %v (%d models, %d nodes of any model)", min, !want, want, models, anyModel)
		}
	}
	for model := range byModel {
		type nodeFree struct {
			node Node
			free []FreeGPU
		}
		var want, got []nodeFree
		for n, gpus := range snap.EachNodeWithGPUs() {
			var free []FreeGPU
			for _, g := range gpus {
				if g.Free() && (model == "" || g.Model == model) {
					free = append(free, FreeGPU{Node: g.Node, Index: g.Index, Model: g.Model, Domains: g.Domains})
				}
			}
			if len(free) > 0 {
				want = append(want, nodeFree{n, free})
			}
		}
		for n, free := range snap.EachNodeFree(model) {
			got = append(got, nodeFree{*n, free})
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("EachNodeFree(%q) = %v, want %v", model, got, want)
		}
		// NodeFree answers node by node as the walk does.
		for n := range snap.EachNode() {
			i := slices.IndexFunc(want, func(w nodeFree) bool { return w.node.Name == n.Name })
			row, free, ok := snap.NodeFree(n.Name, model)
			switch {
			case ok != (i >= 0):
				t.Errorf("NodeFree(%s, %q) found %v, the walk %v", n.Name, model, ok, i >= 0)
			case ok && (!reflect.DeepEqual(*row, want[i].node) || !reflect.DeepEqual(free, want[i].free)):
				t.Errorf("NodeFree(%s, %q) = %v %v, the walk %v", n.Name, model, *row, free, want[i])
			}
		}
		if _, _, ok := snap.NodeFree("no-such-node", model); ok {
			t.Errorf("NodeFree of an unknown node found it")
		}
	}
	for model, nodes := range byModel {
		want := NodeCounts{Model: model}
		hist := func(h *[]int, c int) {
			if c < 1 {
				return
			}
			for len(*h) <= c {
				*h = append(*h, 0)
			}
			(*h)[c]++
		}
		for _, c := range nodes {
			if c.free == c.total {
				want.WholeFree++
				want.Whole = addWholeKind(want.Whole, snap, c.node, model)
			}
			hist(&want.Total, c.total)
			hist(&want.Healthy, c.healthy)
			hist(&want.Free, c.free)
			for len(want.Outside) <= c.outside {
				want.Outside = append(want.Outside, 0)
			}
			want.Outside[c.outside]++
		}
		got := snap.NodeCounts(model)
		if !sameKinds(got.Whole, want.Whole) {
			t.Errorf("NodeCounts(%q).Whole = %v, recounted %v", model, kindsString(got.Whole), kindsString(want.Whole))
		}
		want.Whole = got.Whole // compared as sets above
		if !nodeCountsEqual(&got, &want) {
			t.Errorf("NodeCounts(%q) = %+v, recounted %+v", model, got, want)
		}
		for k := range 6 {
			var fits []nodeCount
			for _, c := range nodes {
				if c.free >= max(k, 1) {
					fits = append(fits, c)
				}
			}
			var first []string // enumeration order, as the walk gave them
			for _, c := range fits {
				first = append(first, c.node.Name)
			}
			slices.SortStableFunc(fits, func(a, b nodeCount) int { return cmp.Compare(a.free, b.free) })
			var best []string
			for _, c := range fits {
				best = append(best, c.node.Name)
			}
			var gotBest, gotFirst []string
			for d := range snap.NodesByFree(model, k) {
				gotBest = append(gotBest, d.Node)
			}
			for d := range snap.NodesWithFree(model, k) {
				gotFirst = append(gotFirst, d.Node)
			}
			if !slices.Equal(gotBest, best) {
				t.Errorf("NodesByFree(%q, %d) = %v, want %v", model, k, gotBest, best)
			}
			if !slices.Equal(gotFirst, first) {
				t.Errorf("NodesWithFree(%q, %d) = %v, want %v", model, k, gotFirst, first)
			}
			if got := snap.NodeCounts(model).FreeAtLeast(k); got != len(fits) {
				t.Errorf("NodeCounts(%q).FreeAtLeast(%d) = %d, want %d", model, k, got, len(fits))
			}
		}
	}
}

func domainIDs(ds []Domain) []string {
	out := make([]string, len(ds))
	for i, d := range ds {
		out[i] = d.ID
	}
	return out
}

func TestNodeDomains(t *testing.T) {
	t.Parallel()
	pcie := [][]string{
		{"X", "PIX", "SYS", "SYS"},
		{"PIX", "X", "SYS", "SYS"},
		{"SYS", "SYS", "X", "PXB"},
		{"SYS", "SYS", "PXB", "X"},
	}
	twoIslands := [][]string{
		{"X", "NV4", "PHB", "SYS"},
		{"NV4", "X", "SYS", "PHB"},
		{"PHB", "SYS", "X", "NVB"},
		{"SYS", "PHB", "NVB", "X"},
	}
	tests := []struct {
		name   string
		report events.TopologyNode
		want   map[int][]string // GPU index -> Domains
	}{
		{
			name:   "NVSwitch node: one island, NUMA pairs",
			report: topoReport("n", 0, "A100", nvswitch(4, 12), []int{0, 0, 1, 1}, nil),
			want: map[int][]string{
				0: {"island:n/0", "numa:n/0", "node:n", "cluster:"},
				1: {"island:n/0", "numa:n/0", "node:n", "cluster:"},
				2: {"island:n/0", "numa:n/1", "node:n", "cluster:"},
				3: {"island:n/0", "numa:n/1", "node:n", "cluster:"},
			},
		},
		{
			name:   "PCIe node: a group per switch, no island",
			report: topoReport("n", 0, "A100", pcie, nil, nil),
			want: map[int][]string{
				0: {"pcie:n/0", "node:n", "cluster:"},
				1: {"pcie:n/0", "node:n", "cluster:"},
				2: {"pcie:n/2", "node:n", "cluster:"},
				3: {"pcie:n/2", "node:n", "cluster:"},
			},
		},
		{
			name:   "two islands, NV and NVB",
			report: topoReport("n", 0, "A100", twoIslands, []int{-1, 0, -1, 1}, nil),
			want: map[int][]string{
				0: {"island:n/0", "node:n", "cluster:"},
				1: {"island:n/0", "numa:n/0", "node:n", "cluster:"},
				2: {"island:n/2", "node:n", "cluster:"},
				3: {"island:n/2", "numa:n/1", "node:n", "cluster:"},
			},
		},
		{
			name: "no matrix: node and NUMA only",
			report: func() events.TopologyNode {
				n := topoReport("n", 0, "A100", nvswitch(2, 12), []int{3, 3}, nil)
				n.GPUPaths = nil
				return n
			}(),
			want: map[int][]string{
				0: {"numa:n/3", "node:n", "cluster:"},
				1: {"numa:n/3", "node:n", "cluster:"},
			},
		},
		{
			name: "k is the lowest GPU index, not a position",
			report: func() events.TopologyNode {
				n := topoReport("n", 0, "A100", pcie, nil, nil)
				for i, idx := range []int{7, 5, 3, 9} {
					n.GPUs[i].Index = idx
				}
				return n
			}(),
			want: map[int][]string{
				7: {"pcie:n/5", "node:n", "cluster:"},
				5: {"pcie:n/5", "node:n", "cluster:"},
				3: {"pcie:n/3", "node:n", "cluster:"},
				9: {"pcie:n/3", "node:n", "cluster:"},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s := newStore(t)
			mustUpsert(t, s, tt.report)
			snap := s.Snapshot()
			got := map[int][]string{}
			for _, g := range snap.GPUs("n") {
				got[g.Index] = g.Domains
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("domains\n got %v\nwant %v", got, tt.want)
			}
			checkDomains(t, snap)
		})
	}
}

func TestDomainCountsFollowEveryWrite(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	if err := s.UpsertFabric(map[string][]string{
		"a": {"leaf:l1", "pod:p1"}, "b": {"leaf:l1", "pod:p1"}, "c": {"leaf:l2", "pod:p1"},
	}); err != nil {
		t.Fatal(err)
	}
	a := topoReport("a", 0, "H100", nvswitch(4, 18), []int{0, 0, 1, 1}, nil)
	b := topoReport("b", 1, "H100", nvswitch(4, 18), []int{0, 0, 1, 1}, nil)
	c := report("c", 2, "A100", 2)
	mustUpsert(t, s, a, b, c)

	type counts struct{ total, healthy, free int }
	dom := func(snap *Snapshot, id string) counts {
		d, _ := snap.Domain(id)
		return counts{d.Total, d.Healthy, d.Free}
	}
	steps := []struct {
		name string
		do   func() error
		want map[string]counts
	}{
		{"loaded", func() error { return nil }, map[string]counts{
			"leaf:l1": {8, 8, 8}, "leaf:l2": {2, 2, 2}, "pod:p1": {10, 10, 10}, "cluster:": {10, 10, 10},
			"island:a/0": {4, 4, 4}, "numa:a/1": {2, 2, 2}, "node:c": {2, 2, 2},
		}},
		{"allocate", func() error { return s.Allocate("j", append(keys("a", 0, 2), keys("c", 1)...)) }, map[string]counts{
			"leaf:l1": {8, 8, 6}, "leaf:l2": {2, 2, 1}, "pod:p1": {10, 10, 7}, "island:a/0": {4, 4, 2},
			"numa:a/0": {2, 2, 1}, "numa:b/0": {2, 2, 2},
		}},
		{"gpu unhealthy", func() error {
			return s.SetHealth(events.TopologyHealth{Node: "b", Component: "gpu", ID: "3", Health: "unhealthy"})
		}, map[string]counts{"leaf:l1": {8, 7, 5}, "numa:b/1": {2, 1, 1}, "cluster:": {10, 9, 6}}},
		{"held gpu unhealthy", func() error {
			return s.SetHealth(events.TopologyHealth{Node: "a", Component: "gpu", ID: "0", Health: "unhealthy"})
		}, map[string]counts{"leaf:l1": {8, 6, 5}, "island:a/0": {4, 3, 2}}},
		{"release", func() error { _, err := s.Release("j"); return err }, map[string]counts{
			"leaf:l1": {8, 6, 6}, "leaf:l2": {2, 2, 2}, "island:a/0": {4, 3, 3},
		}},
		{"gpu dropped from report", func() error {
			n := b
			n.GPUs, n.GPUPaths = b.GPUs[:3], [][]string{{"X", "NV18", "NV18"}, {"NV18", "X", "NV18"}, {"NV18", "NV18", "X"}}
			return s.UpsertNode(n)
		}, map[string]counts{"leaf:l1": {7, 6, 6}, "island:b/0": {3, 3, 3}, "numa:b/1": {1, 1, 1}, "cluster:": {9, 8, 8}}},
		{"fabric moves c", func() error {
			return s.UpsertFabric(map[string][]string{"a": {"leaf:l1", "pod:p1"}, "b": {"leaf:l1", "pod:p1"}, "c": {"leaf:l1", "pod:p2"}})
		}, map[string]counts{"leaf:l1": {9, 8, 8}, "leaf:l2": {}, "pod:p1": {7, 6, 6}, "pod:p2": {2, 2, 2}}},
		{"node removed", func() error { return s.UpsertNode(events.TopologyNode{Name: "a", Removed: true}) }, map[string]counts{
			"leaf:l1": {5, 5, 5}, "island:a/0": {}, "node:a": {}, "cluster:": {5, 5, 5},
		}},
		{"node back, fabric kept", func() error { return s.UpsertNode(a) }, map[string]counts{
			"leaf:l1": {9, 9, 9}, "island:a/0": {4, 4, 4},
		}},
	}
	for _, st := range steps {
		if err := st.do(); err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		snap := s.Snapshot()
		for id, want := range st.want {
			if got := dom(snap, id); got != want {
				t.Errorf("%s: %s = %+v, want %+v", st.name, id, got, want)
			}
		}
		checkDomains(t, snap)
	}
}

func TestUpsertFabric(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		fabric  map[string][]string
		wantErr string
		// Domains of n1's GPU 0 afterwards, and the leaves.
		want   []string
		leaves []string
	}{
		{
			name:   "leaf, pod, core",
			fabric: map[string][]string{"n1": {"leaf:l1", "pod:p", "core:c"}, "n2": {"leaf:l2", "pod:p", "core:c"}},
			want:   []string{"node:n1", "leaf:l1", "pod:p", "core:c", "cluster:"},
			leaves: []string{"leaf:l1", "leaf:l2"},
		},
		{
			name:   "duplicates dropped, order kept, unknown node kept for later",
			fabric: map[string][]string{"n1": {"pod:p", "leaf:l1", "pod:p"}, "later": {"leaf:l9"}},
			want:   []string{"node:n1", "pod:p", "leaf:l1", "cluster:"},
			leaves: []string{"leaf:l1"},
		},
		{
			name:   "empty map clears",
			fabric: map[string][]string{},
			want:   []string{"node:n1", "cluster:"},
		},
		{
			name:    "store's own kind refused",
			fabric:  map[string][]string{"n1": {"leaf:l1"}, "n2": {"node:n2", "island:x/0"}},
			wantErr: `"node:n2"`,
			want:    []string{"node:n1", "leaf:old", "cluster:"},
			leaves:  []string{"leaf:old"},
		},
		{
			name:    "malformed refused",
			fabric:  map[string][]string{"n1": {"leaf"}, "": {"leaf:x"}},
			wantErr: `"leaf"`,
			want:    []string{"node:n1", "leaf:old", "cluster:"},
			leaves:  []string{"leaf:old"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s := newStore(t)
			mustUpsert(t, s, report("n1", 0, "A100", 2), report("n2", 1, "A100", 2))
			if s.Snapshot().HasFabric() {
				t.Error("HasFabric before any fabric")
			}
			if err := s.UpsertFabric(map[string][]string{"n1": {"leaf:old"}, "n2": {"leaf:old"}}); err != nil {
				t.Fatal(err)
			}
			err := s.UpsertFabric(tt.fabric)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want one naming %s", err, tt.wantErr)
				}
			} else if err != nil {
				t.Fatal(err)
			}
			snap := s.Snapshot()
			if got := snap.GPUs("n1")[0].Domains; !slices.Equal(got, tt.want) {
				t.Errorf("domains %v, want %v", got, tt.want)
			}
			if got := domainIDs(snap.DomainsOfKind(DomainLeaf)); !slices.Equal(got, tt.leaves) && len(got)+len(tt.leaves) > 0 {
				t.Errorf("leaves %v, want %v", got, tt.leaves)
			}
			if got, want := snap.HasFabric(), len(tt.leaves) > 0; got != want {
				t.Errorf("HasFabric %v, want %v", got, want)
			}
			checkDomains(t, snap)
			if tt.wantErr == "" {
				if got := snap.FabricDomains("later"); tt.fabric["later"] != nil && len(got) != 1 {
					t.Errorf("fabric of a node not yet reported: %v", got)
				}
				// A node reported after the fabric gets its domains.
				mustUpsert(t, s, report("later", 5, "A100", 1))
				want := []string{"node:later", "cluster:"}
				if tt.fabric["later"] != nil {
					want = []string{"node:later", "leaf:l9", "cluster:"}
				}
				if got := s.Snapshot().GPUs("later")[0].Domains; !slices.Equal(got, want) {
					t.Errorf("later node's domains %v, want %v", got, want)
				}
			}
		})
	}
}

func TestFreeGPUsIn(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	// Positions run against names, and models mix within leaf l1.
	mustUpsert(t, s,
		topoReport("z", 0, "H100", nvswitch(2, 18), []int{0, 1}, nil),
		report("y", 1, "A100", 2),
		topoReport("x", 2, "H100", nvswitch(2, 18), []int{0, 1}, nil),
	)
	if err := s.UpsertFabric(map[string][]string{"z": {"leaf:l1", "core:c"}, "y": {"leaf:l1"}, "x": {"leaf:l2", "core:c"}}); err != nil {
		t.Fatal(err)
	}
	if err := s.Allocate("j", keys("z", 1)); err != nil {
		t.Fatal(err)
	}
	snap := s.Snapshot()
	tests := []struct {
		domain, model string
		want          []GPUKey
	}{
		{"leaf:l1", "", []GPUKey{{"z", 0}, {"y", 0}, {"y", 1}}},
		{"leaf:l1", "H100", []GPUKey{{"z", 0}}},
		{"leaf:l1", "A100", []GPUKey{{"y", 0}, {"y", 1}}},
		{"leaf:l1", "B200", nil},
		{"cluster:", "", []GPUKey{{"z", 0}, {"y", 0}, {"y", 1}, {"x", 0}, {"x", 1}}},
		{"cluster:", "H100", []GPUKey{{"z", 0}, {"x", 0}, {"x", 1}}},
		{"core:c", "", []GPUKey{{"z", 0}, {"x", 0}, {"x", 1}}},
		{"core:c", "H100", []GPUKey{{"z", 0}, {"x", 0}, {"x", 1}}},
		{"core:c", "A100", nil},
		{"island:x/0", "", []GPUKey{{"x", 0}, {"x", 1}}},
		{"island:z/0", "", []GPUKey{{"z", 0}}},
		{"numa:x/1", "H100", []GPUKey{{"x", 1}}},
		{"node:y", "H100", nil},
		{"leaf:nope", "", nil},
		{"leaf:l", "", nil}, // a prefix of a domain is not that domain
	}
	for _, tt := range tests {
		got := gpuKeys(snap.FreeGPUsIn(tt.domain, tt.model))
		if !slices.Equal(got, tt.want) && len(got)+len(tt.want) > 0 {
			t.Errorf("FreeGPUsIn(%s, %q) = %v, want %v", tt.domain, tt.model, got, tt.want)
		}
	}
	if got := gpuKeys(snap.FreeGPUsOfModel("H100")); !slices.Equal(got, []GPUKey{{"z", 0}, {"x", 0}, {"x", 1}}) {
		t.Errorf("FreeGPUsOfModel(H100) = %v", got)
	}
	if got, want := snap.FreeByModel("H100"), 3; got != want {
		t.Errorf("FreeByModel(H100) = %d, want %d", got, want)
	}
	d, ok := snap.Domain("leaf:l1")
	if !ok || d.Kind != DomainLeaf || d.Node != "" || !maps.Equal(d.FreeByModel(), map[string]int{"A100": 2, "H100": 1}) {
		t.Errorf("Domain(leaf:l1) = %+v, %v", d, ok)
	}
	if d, _ := snap.Domain("island:z/0"); d.Node != "z" || d.Kind != DomainIsland || d.Total != 2 || d.Free != 1 {
		t.Errorf("Domain(island:z/0) = %+v", d)
	}
	if got := domainIDs(snap.DomainsOfKind(DomainNUMA)); !slices.Equal(got, []string{"numa:x/0", "numa:x/1", "numa:z/0", "numa:z/1"}) {
		t.Errorf("DomainsOfKind(numa) = %v", got)
	}
	if got := domainIDs(snap.DomainsOfKind(DomainCluster)); !slices.Equal(got, []string{ClusterDomain}) {
		t.Errorf("DomainsOfKind(cluster) = %v", got)
	}
	var first []string // a walk the caller stops
	for d := range snap.EachDomainOfKind(DomainNUMA) {
		if first = append(first, d.ID); len(first) == 2 {
			break
		}
	}
	if !slices.Equal(first, []string{"numa:x/0", "numa:x/1"}) {
		t.Errorf("EachDomainOfKind(numa), stopped after two = %v", first)
	}
	checkDomains(t, snap)
}

func TestWatchFreeIn(t *testing.T) {
	t.Parallel()
	fired := func(ch <-chan struct{}) bool {
		select {
		case <-ch:
			return true
		case <-time.After(time.Second):
			return false
		}
	}
	quiet := func(ch <-chan struct{}) bool {
		select {
		case <-ch:
			return false
		default:
			return true
		}
	}
	type watch struct{ domain, model string }
	tests := []struct {
		name  string
		do    func(s *Store) error
		fire  []watch
		quiet []watch
	}{
		{
			name: "allocate in l1",
			do:   func(s *Store) error { return s.Allocate("j", keys("a", 0)) },
			fire: []watch{{"leaf:l1", ""}, {"leaf:l1", "H100"}, {ClusterDomain, ""}, {"island:a/0", ""}},
			// A watch on a model the domain has none of sits higher up
			// the index, and may fire: not checked.
			quiet: []watch{{"leaf:l2", ""}, {"leaf:l2", "H100"}, {"island:b/0", ""}},
		},
		{
			name: "unhealthy in l2",
			do: func(s *Store) error {
				return s.SetHealth(events.TopologyHealth{Node: "b", Component: "gpu", ID: "1", Health: "unhealthy"})
			},
			fire:  []watch{{"leaf:l2", ""}, {ClusterDomain, "H100"}, {"core:c", ""}},
			quiet: []watch{{"leaf:l1", ""}, {"island:a/0", ""}},
		},
		{
			name:  "job table only",
			do:    func(s *Store) error { return s.UpsertJob(Job{ID: "x", State: JobPending}) },
			quiet: []watch{{"leaf:l1", ""}, {ClusterDomain, ""}, {"island:a/0", ""}},
		},
		{
			name:  "fabric moves a node",
			do:    func(s *Store) error { return s.UpsertFabric(map[string][]string{"a": {"leaf:l2"}, "b": {"leaf:l2"}}) },
			fire:  []watch{{"leaf:l1", ""}, {"leaf:l2", ""}},
			quiet: []watch{},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s := watchedStore(t)
			mustUpsert(t, s,
				topoReport("a", 0, "H100", nvswitch(2, 18), nil, nil),
				topoReport("b", 1, "H100", nvswitch(2, 18), nil, nil))
			if err := s.UpsertFabric(map[string][]string{"a": {"leaf:l1", "core:c"}, "b": {"leaf:l2", "core:c"}}); err != nil {
				t.Fatal(err)
			}
			snap := s.Snapshot()
			chans := map[watch]<-chan struct{}{}
			for _, w := range append(slices.Clone(tt.fire), tt.quiet...) {
				chans[w] = snap.watchFreeIn(w.domain, w.model)
				if !quiet(chans[w]) {
					t.Fatalf("%v closed before the change", w)
				}
			}
			if err := tt.do(s); err != nil {
				t.Fatal(err)
			}
			for _, w := range tt.fire {
				if !fired(chans[w]) {
					t.Errorf("%v did not fire", w)
				}
			}
			for _, w := range tt.quiet {
				if !quiet(chans[w]) {
					t.Errorf("%v fired", w)
				}
			}
		})
	}
}

// TestDomainsRandomized runs random writes, checking after each that every
// domain's counts and index entries agree with the GPU rows, and that a
// snapshot taken before a write still agrees with itself.
func TestDomainsRandomized(t *testing.T) {
	t.Parallel()
	for seed := range uint64(16) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			t.Parallel()
			rng := rand.New(rand.NewPCG(seed, 42))
			s := newStore(t)
			names := []string{"n0", "n1", "n2", "n3", "n4"}
			nodeReport := func() events.TopologyNode {
				name := names[rng.IntN(len(names))]
				pos := slices.Index(names, name)
				if rng.IntN(6) == 0 {
					pos = rng.IntN(3) // moved, or sharing a position
				}
				model := []string{"A100", "H100", ""}[rng.IntN(3)]
				g := 1 + rng.IntN(4)
				var n events.TopologyNode
				switch rng.IntN(4) {
				case 0:
					n = topoReport(name, pos, model, nvswitch(g, 12), []int{0, 0, 1, 1}, dgxNICs(g))
				case 1:
					n = report(name, pos, model, g)
				case 2:
					// One NVLink between each pair: a link down takes its
					// GPU out of the island, and the node's counts stay.
					n = topoReport(name, pos, model, nvswitch(g, 1), []int{0, 0, 1, 1}, nil)
				default:
					n = topoReport(name, pos, model, nvswitch(g, 12), nil, nil)
					for i := range n.GPUPaths {
						for j := range n.GPUPaths[i] {
							if i != j && (i/2 != j/2) {
								n.GPUPaths[i][j] = "SYS"
							} else if i != j {
								n.GPUPaths[i][j] = "PIX"
							}
						}
					}
				}
				if rng.IntN(4) == 0 {
					n.GPUs[rng.IntN(g)].Health = events.HealthUnhealthy
				}
				if rng.IntN(5) == 0 {
					n.GPUs[rng.IntN(g)].Model = "L40S" // a node of two models
				}
				if rng.IntN(8) == 0 {
					n.Removed = true
				}
				return n
			}
			jobs := 0
			randomKeys := func() []GPUKey {
				var out []GPUKey
				seen := map[GPUKey]bool{}
				for range 1 + rng.IntN(3) {
					k := GPUKey{names[rng.IntN(len(names))], rng.IntN(4)}
					if !seen[k] {
						seen[k] = true
						out = append(out, k)
					}
				}
				return out
			}
			ops := []func() error{
				func() error { return s.UpsertNode(nodeReport()) },
				func() error {
					jobs++
					err := s.Allocate(fmt.Sprintf("j%d", jobs), randomKeys())
					if errors.Is(err, ErrConflict) {
						return nil
					}
					return err
				},
				func() error {
					jobs++
					err := s.Restore(fmt.Sprintf("j%d", jobs), randomKeys())
					if errors.Is(err, ErrConflict) {
						return nil
					}
					return err
				},
				func() error {
					if jobs == 0 {
						return nil
					}
					_, err := s.Release(fmt.Sprintf("j%d", 1+rng.IntN(jobs)))
					return err
				},
				func() error {
					h := events.TopologyHealth{Node: names[rng.IntN(len(names))], Health: []string{"healthy", "unhealthy"}[rng.IntN(2)]}
					switch rng.IntN(4) {
					case 0:
						h.Component, h.ID = events.ComponentGPU, fmt.Sprint(rng.IntN(4))
					case 1:
						h.Component = events.ComponentNode
					case 2:
						h.Component, h.ID = events.ComponentNVLink, fmt.Sprintf("%d/%d", rng.IntN(4), rng.IntN([]int{1, 12}[rng.IntN(2)]))
					default:
						h.Component, h.ID = events.ComponentNIC, fmt.Sprintf("mlx5_%d", rng.IntN(4))
					}
					_ = s.SetHealth(h) // unknown parts are refused; fine
					return nil
				},
				func() error {
					f := map[string][]string{}
					for _, n := range names {
						if rng.IntN(3) > 0 {
							f[n] = []string{fmt.Sprintf("leaf:l%d", rng.IntN(2)), fmt.Sprintf("pod:p%d", rng.IntN(2)), fmt.Sprintf("core:c%d", rng.IntN(2))}
							if rng.IntN(2) == 0 {
								f[n] = append(f[n], "core:c9") // dual-homed
							}
						}
					}
					return s.UpsertFabric(f)
				},
			}
			for step := range 150 {
				before := s.Snapshot()
				beforeDomains := allDomains(before)
				if err := ops[rng.IntN(len(ops))](); err != nil {
					t.Fatalf("step %d: %v", step, err)
				}
				checkDomains(t, s.Snapshot())
				checkNodeCounts(t, s.Snapshot())
				if !reflect.DeepEqual(allDomains(before), beforeDomains) {
					t.Fatalf("step %d: a write changed an earlier snapshot", step)
				}
				if t.Failed() {
					t.Fatalf("step %d failed", step)
				}
			}
		})
	}
}

// addWholeKind counts node n, whose GPUs of model are all free, in its
// kind: the free GPUs read from the GPU rows, not the store's lists.
func addWholeKind(kinds []WholeKind, snap *Snapshot, n Node, model string) []WholeKind {
	var free []FreeGPU
	for _, g := range snap.GPUs(n.Name) {
		if g.Free() && (model == "" || g.Model == model) {
			free = append(free, FreeGPU{Node: g.Node, Index: g.Index, Model: g.Model, Domains: g.Domains})
		}
	}
	for i, k := range kinds {
		if sameKind(k, WholeKind{Node: &n, GPUs: free}) {
			kinds[i].Nodes++
			return kinds
		}
	}
	return append(kinds, WholeKind{Node: &n, GPUs: free, Nodes: 1})
}

// sameKinds compares two lists of kinds as sets.
func sameKinds(a, b []WholeKind) bool {
	if len(a) != len(b) {
		return false
	}
	for _, x := range a {
		if !slices.ContainsFunc(b, func(y WholeKind) bool { return x.Nodes == y.Nodes && sameKind(x, y) }) {
			return false
		}
	}
	return true
}

// sameKind is Alike spelled out again, so that the recount does not
// share the store's mistakes.
func sameKind(a, b WholeKind) bool {
	key := func(k WholeKind) string {
		s := fmt.Sprintf("%x %q %d", k.Node.Links, k.Node.GPUModel, k.Node.GPUCount)
		for _, g := range k.GPUs {
			s += fmt.Sprintf(" %d:%q", g.Index, g.Model)
		}
		return s
	}
	return key(a) == key(b)
}

func kindsString(kinds []WholeKind) string {
	var parts []string
	for _, k := range kinds {
		parts = append(parts, fmt.Sprintf("{%s %x %s/%d gpus %d: %d nodes}", k.Node.Name, k.Node.Links[:4], k.Node.GPUModel, k.Node.GPUCount, len(k.GPUs), k.Nodes))
	}
	return "[" + strings.Join(parts, " ") + "]"
}
