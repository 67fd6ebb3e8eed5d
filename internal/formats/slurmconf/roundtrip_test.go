package slurmconf

import (
	"errors"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/internal/formats/clusterfile"
	"github.com/toposched/toposched/internal/formats/fabric"
)

var update = flag.Bool("update", false, "rewrite the golden files")

// clusters are the cluster files the writers are tested on, with the
// options each is written with.
var clusters = []struct {
	name, file string
	opts       Options
}{
	{"pairs", "testdata/pairs.yaml", Options{}},
	{"pairs-index-types", "testdata/pairs.yaml", Options{IndexTypes: true, DeviceFormat: "/tmp/slurm/dev/nvidia%d"}},
	{"hgx", "testdata/hgx.yaml", Options{ThreadsPerCore: 2, CoresPerNode: 96}},
	{"superpod", "../clusterfile/testdata/superpod.yaml", Options{}},
	{"example", "../../../deploy/examples/cluster.yaml", Options{}},
}

func loadCluster(t *testing.T, path string) clusterfile.Cluster {
	t.Helper()
	c, err := clusterfile.LoadCluster(path)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// checkGolden compares got with testdata/golden/name, or rewrites it.
func checkGolden(t *testing.T, name string, got []byte) {
	t.Helper()
	golden := filepath.Join("testdata", "golden", name)
	if *update {
		if err := os.WriteFile(golden, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if string(got) != string(want) {
		t.Errorf("output differs from %s (run with -update to accept):\n%s", golden, got)
	}
}

// TestWriteGolden renders gres.conf and topology.conf for each cluster and
// compares them with the golden files.
func TestWriteGolden(t *testing.T) {
	t.Parallel()
	for _, c := range clusters {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			cl := loadCluster(t, c.file)
			gres, err := WriteGres(cl.Nodes, c.opts)
			if err != nil {
				t.Fatal(err)
			}
			checkGolden(t, c.name+".gres.conf", gres)
			topo, err := WriteTopology(cl.Fabric)
			switch {
			case errors.Is(err, ErrNoFabric):
				topo = []byte("(no topology.conf: " + err.Error() + ")\n")
			case err != nil:
				t.Fatal(err)
			}
			checkGolden(t, c.name+".topology.conf", topo)
		})
	}
}

// TestRoundTrip writes each cluster's files, reads them back with the
// parsers and checks that they say the same of the topology: each node's
// GPU count, type, device file, cores and NVLink counts, and the switch
// tree. The facts are checked both through DiffGres/DiffTopology and
// straight against the cluster's own description (NV# of the path
// matrix, the CPU affinity), so that a fault shared by the writer and
// the diff does not hide.
func TestRoundTrip(t *testing.T) {
	t.Parallel()
	for _, c := range clusters {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			cl := loadCluster(t, c.file)
			data, err := WriteGres(cl.Nodes, c.opts)
			if err != nil {
				t.Fatal(err)
			}
			g, err := ParseGres("gres.conf", data)
			if err != nil {
				t.Fatalf("reading back what WriteGres wrote: %v\n%s", err, data)
			}
			diffs, err := DiffGres(cl.Nodes, c.opts, g)
			if err != nil {
				t.Fatal(err)
			}
			if len(diffs) > 0 {
				t.Errorf("gres.conf read back differs:\n%s", strings.Join(diffs, "\n"))
			}
			for _, n := range cl.Nodes {
				checkNodeFacts(t, n, g.Nodes[n.Name], c.opts)
			}
			if len(g.Order) != len(cl.Nodes) {
				t.Errorf("gres.conf names %d nodes, the cluster has %d", len(g.Order), len(cl.Nodes))
			}

			topo, err := WriteTopology(cl.Fabric)
			if errors.Is(err, ErrNoFabric) {
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			fab, err := fabric.ParseSlurm("topology.conf", topo)
			if err != nil {
				t.Fatalf("reading back what WriteTopology wrote: %v\n%s", err, topo)
			}
			diffs, err = DiffTopology(cl.Fabric, fab)
			if err != nil {
				t.Fatal(err)
			}
			if len(diffs) > 0 {
				t.Errorf("topology.conf read back differs:\n%s", strings.Join(diffs, "\n"))
			}
			if len(fab.Warnings) > 0 {
				t.Errorf("topology.conf read back with warnings: %q", fab.Warnings)
			}
			checkTreeFacts(t, cl.Fabric, fab)
		})
	}
}

// checkNodeFacts compares what gres.conf says of a node's GPUs with the
// node's own description.
func checkNodeFacts(t *testing.T, n events.TopologyNode, gpus []GPU, opts Options) {
	t.Helper()
	if len(gpus) != len(n.GPUs) {
		t.Fatalf("node %s: gres.conf has %d GPUs, the node %d", n.Name, len(gpus), len(n.GPUs))
	}
	for i, g := range gpus {
		if g.Index != i {
			t.Errorf("node %s: GPU %d has index %d", n.Name, i, g.Index)
		}
		for j, l := range g.Links {
			want := 0
			switch {
			case i == j:
				want = -1
			case len(n.GPUPaths) > 0:
				if rest, ok := strings.CutPrefix(n.GPUPaths[i][j], "NV"); ok {
					want, _ = strconv.Atoi(rest)
				}
			}
			if l != want {
				t.Errorf("node %s: GPU %d: Links[%d] = %d, path class %q", n.Name, i, j, l, n.GPUPaths[i][j])
			}
		}
		aff := n.GPUs[i].CPUAffinity
		if aff == "" {
			if g.Cores != nil {
				t.Errorf("node %s: GPU %d: Cores %v without a CPU affinity", n.Name, i, g.Cores)
			}
			continue
		}
		cpus, err := ParseCPUList(aff)
		if err != nil {
			t.Fatal(err)
		}
		var want []int
		for _, c := range cpus {
			if opts.CoresPerNode > 0 {
				c %= opts.CoresPerNode
			}
			if !slices.Contains(want, c) {
				want = append(want, c)
			}
		}
		slices.Sort(want)
		if !slices.Equal(g.Cores, want) {
			t.Errorf("node %s: GPU %d: Cores %v, affinity %s gives %v", n.Name, i, g.Cores, aff, want)
		}
	}
}

// checkTreeFacts checks that every node stays below the switches it was
// below (for a rail-optimized node: its lowest rail's leaf) and that each
// switch keeps its child switches.
func checkTreeFacts(t *testing.T, want, got events.TopologyFabric) {
	t.Helper()
	leafOf := map[string]string{}
	children := map[string][]string{}
	for _, s := range got.Switches {
		for _, n := range s.Nodes {
			leafOf[n] = s.Name
		}
		children[s.Name] = s.Switches
	}
	lowestRail := map[string]int{}
	for _, s := range want.Switches {
		if s.Tier == "nvlink" {
			if _, ok := children[s.Name]; ok {
				t.Errorf("NVLink domain %s written to topology.conf", s.Name)
			}
			continue
		}
		if !slices.Equal(children[s.Name], s.Switches) {
			t.Errorf("switch %s: children %v, want %v", s.Name, children[s.Name], s.Switches)
		}
		rail := -1
		if s.Rail != nil {
			rail = *s.Rail
		}
		for _, n := range s.Nodes {
			if r, seen := lowestRail[n]; seen && r <= rail {
				continue
			}
			lowestRail[n] = rail
			if leafOf[n] != s.Name {
				t.Errorf("node %s: below %q in topology.conf, want %s", n, leafOf[n], s.Name)
			}
		}
	}
}

// TestDiff checks that the diffs see what changed between the files and
// the cluster.
func TestDiff(t *testing.T) {
	t.Parallel()
	cl := loadCluster(t, "testdata/pairs.yaml")
	data, err := WriteGres(cl.Nodes, Options{})
	if err != nil {
		t.Fatal(err)
	}
	g, err := ParseGres("gres.conf", data)
	if err != nil {
		t.Fatal(err)
	}
	// A node whose pairs are (0,2),(1,3), one whose third GPU is gone, and
	// one gres.conf does not name.
	nodes := slices.Clone(cl.Nodes)
	n1 := nodes[0]
	n1.GPUPaths = [][]string{{"X", "SYS", "NV2", "SYS"}, {"SYS", "X", "SYS", "NV2"}, {"NV2", "SYS", "X", "SYS"}, {"SYS", "NV2", "SYS", "X"}}
	nodes[0] = n1
	n2 := nodes[1]
	n2.GPUs, n2.GPUPaths = n2.GPUs[:3], nil
	nodes[1] = n2
	nodes = append(nodes, events.TopologyNode{Name: "n3", GPUs: []events.GPU{{Index: 0}}})
	diffs, err := DiffGres(nodes, Options{}, g)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"node n1: gpu 0: Links: gres.conf (line 7) gives -1,2,0,0, the cluster -1,0,2,0",
		"node n1: gpu 1: Links: gres.conf (line 8) gives 2,-1,0,0, the cluster 0,-1,0,2",
		"node n1: gpu 2: Links: gres.conf (line 9) gives 0,0,-1,2, the cluster 2,0,-1,0",
		"node n1: gpu 3: Links: gres.conf (line 10) gives 0,0,2,-1, the cluster 0,2,0,-1",
		"node n2: gres.conf gives 4 GPUs, the cluster 3",
		"node n3: gres.conf gives 0 GPUs, the cluster 1",
	}
	if !slices.Equal(diffs, want) {
		t.Errorf("DiffGres =\n%s\nwant\n%s", strings.Join(diffs, "\n"), strings.Join(want, "\n"))
	}

	// The tree: n2 moved below s1, a switch gone, one added.
	fab, err := fabric.ParseSlurm("topology.conf", []byte("SwitchName=s1 Nodes=n[1-2]\nSwitchName=s3 Nodes=n9\nSwitchName=top Switches=s[1,3]\n"))
	if err != nil {
		t.Fatal(err)
	}
	diffs, err = DiffTopology(cl.Fabric, fab)
	if err != nil {
		t.Fatal(err)
	}
	want = []string{
		"switch s1: Nodes: topology.conf gives n1,n2, the cluster n1",
		"switch s2: in the cluster's fabric, not in topology.conf",
		"switch top: Switches: topology.conf gives s1,s3, the cluster s1,s2",
		"switch s3: in topology.conf, not in the cluster's fabric",
	}
	if !slices.Equal(diffs, want) {
		t.Errorf("DiffTopology =\n%s\nwant\n%s", strings.Join(diffs, "\n"), strings.Join(want, "\n"))
	}
}
