package fabric

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/toposched/toposched/events"
)

var update = flag.Bool("update", false, "rewrite golden files")

// Test data files (see testdata/SOURCES.md).
var (
	circeFile   = filepath.Join("testdata", "slurm", "nvidia-circe-dgx2-superpod_slurm-superpod-topology.conf.txt")
	puppetFile  = filepath.Join("testdata", "slurm", "puppet-hpc-gpu-cluster_maatthias-slurm-cluster-topology.conf.txt")
	schedmdFile = filepath.Join("testdata", "slurm", "schedmd-documented-examples_tree-block-ring_slurm-man5-topology.conf.txt")
	unswFile    = filepath.Join("testdata", "slurm", "unsw-abacus_UNSW-Rocks-Config-topology.conf.txt")
	lingjunFile = filepath.Join("testdata", "lingjun", "topo.csv")
)

func readFile(t testing.TB, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// lines returns lines from..to (1-based, inclusive) of data.
func lines(data []byte, from, to int) []byte {
	all := strings.SplitAfter(string(data), "\n")
	return []byte(strings.Join(all[from-1:to], ""))
}

// render draws a fabric as a tree: top-level switches first, each switch
// followed by what hangs below it; a leaf shows its node count and first
// names, then come the warnings. A parse error is rendered as its text.
func render(fab events.TopologyFabric, err error) string {
	var b strings.Builder
	if err != nil {
		b.WriteString("error:\n")
		for l := range strings.SplitSeq(err.Error(), "\n") {
			fmt.Fprintf(&b, "  %s\n", l)
		}
		return b.String()
	}
	byName := map[string]events.Switch{}
	hasParent := map[string]bool{}
	tiers := map[string]int{}
	nodes := 0
	for _, s := range fab.Switches {
		byName[s.Name] = s
		tiers[s.Tier]++
		nodes += len(s.Nodes)
		for _, c := range s.Switches {
			hasParent[c] = true
		}
	}
	var top []string
	for _, s := range fab.Switches {
		if !hasParent[s.Name] {
			top = append(top, s.Name)
		}
	}
	fmt.Fprintf(&b, "switches: %d (core %d, spine %d, leaf %d)\nnodes: %d\ntop-level switches: %d\n",
		len(fab.Switches), tiers[TierCore], tiers[TierSpine], tiers[TierLeaf], nodes, len(top))
	var draw func(name string, depth int)
	draw = func(name string, depth int) {
		s := byName[name]
		indent := strings.Repeat("  ", depth)
		if s.Tier == TierLeaf {
			fmt.Fprintf(&b, "%sleaf %s: %s%s\n", indent, s.Name, plural(len(s.Nodes), "node", "nodes"), firstNames(s.Nodes))
			return
		}
		fmt.Fprintf(&b, "%s%s %s: %s\n", indent, s.Tier, s.Name, plural(len(s.Switches), "switch", "switches"))
		for _, c := range s.Switches {
			draw(c, depth+1)
		}
	}
	for _, name := range top {
		draw(name, 0)
	}
	for _, w := range fab.Warnings {
		fmt.Fprintf(&b, "warning: %s\n", w)
	}
	return b.String()
}

// firstNames shows up to five names, or the first four and the last; a name
// longer than 16 characters (the Lingjun hosts are 64-digit hashes) is cut
// to its first 12.
func firstNames(names []string) string {
	short := func(ns []string) string {
		out := make([]string, len(ns))
		for i, n := range ns {
			if len(n) > 16 {
				n = n[:12] + ".."
			}
			out[i] = n
		}
		return strings.Join(out, " ")
	}
	switch {
	case len(names) == 0:
		return ""
	case len(names) <= 5:
		return ": " + short(names)
	default:
		return ": " + short(names[:4]) + " ... " + short(names[len(names)-1:])
	}
}

func plural(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %s", n, many)
}

// checkFabric checks what every accepted fabric must hold: unique names,
// known tiers, every child switch defined, no cycle, leaves without child
// switches, non-leaves without nodes, each node below one leaf.
func checkFabric(t testing.TB, fab events.TopologyFabric) {
	t.Helper()
	byName := map[string]events.Switch{}
	for _, s := range fab.Switches {
		if s.Name == "" {
			t.Fatalf("switch without a name: %+v", s)
		}
		if _, dup := byName[s.Name]; dup {
			t.Fatalf("switch %q listed twice", s.Name)
		}
		byName[s.Name] = s
		switch s.Tier {
		case TierLeaf:
			if len(s.Switches) > 0 {
				t.Fatalf("leaf %q has child switches %v", s.Name, s.Switches)
			}
		case TierSpine, TierCore:
			if len(s.Nodes) > 0 {
				t.Fatalf("%s %q has nodes", s.Tier, s.Name)
			}
		default:
			t.Fatalf("switch %q has tier %q", s.Name, s.Tier)
		}
	}
	leafOf := map[string]string{}
	for _, s := range fab.Switches {
		seen := map[string]bool{}
		for _, c := range s.Switches {
			if _, ok := byName[c]; !ok {
				t.Fatalf("switch %q lists unknown child %q", s.Name, c)
			}
			if seen[c] {
				t.Fatalf("switch %q lists child %q twice", s.Name, c)
			}
			seen[c] = true
		}
		for _, n := range s.Nodes {
			if prev, ok := leafOf[n]; ok {
				t.Fatalf("node %q below %q and %q", n, prev, s.Name)
			}
			leafOf[n] = s.Name
		}
	}
	state := map[string]int{}
	var visit func(name string)
	visit = func(name string) {
		switch state[name] {
		case 1:
			t.Fatalf("cycle through %q", name)
		case 2:
			return
		}
		state[name] = 1
		for _, c := range byName[name].Switches {
			visit(c)
		}
		state[name] = 2
	}
	for _, s := range fab.Switches {
		visit(s.Name)
	}
}

// tierCounts counts switches per tier and nodes.
func tierCounts(fab events.TopologyFabric) (leaf, spine, core, nodes int) {
	for _, s := range fab.Switches {
		switch s.Tier {
		case TierLeaf:
			leaf++
		case TierSpine:
			spine++
		case TierCore:
			core++
		}
		nodes += len(s.Nodes)
	}
	return
}

func findSwitch(t testing.TB, fab events.TopologyFabric, name string) events.Switch {
	t.Helper()
	for _, s := range fab.Switches {
		if s.Name == name {
			return s
		}
	}
	t.Fatalf("no switch %q in %v", name, fab.Switches)
	return events.Switch{}
}

// wantErr checks that err is set and holds every want.
func wantErr(t testing.TB, err error, want ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("got no error, want one with %q", want)
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q\ndoes not contain %q", err, w)
		}
	}
}

// seq makes prefix+number names, zero-padded to width.
func seq(prefix string, from, to, width int) []string {
	var out []string
	for i := from; i <= to; i++ {
		out = append(out, fmt.Sprintf("%s%0*d", prefix, width, i))
	}
	return out
}
