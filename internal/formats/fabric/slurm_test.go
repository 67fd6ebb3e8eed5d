package fabric

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/toposched/toposched/events"
)

// The circe file lists circe-n051 under s2 (circe-n[041-058], line 3) and
// again under s4 (line 5): a real configuration mistake, which Slurm only
// warns about. ParseSlurm keeps the node under s2 and warns.
//
// Counted by hand from the file: s0 = circe-n001..016 (16) + n019, n020 (2,
// literally "n[019-020]" without the circe- prefix, as in the source), s1 =
// circe-n017..018 + 021..036 (18), s2 = circe-n041..058 (18), s3 =
// circe-n040, 060, 062..077 (18), s4 = circe-n037..039, (051 dropped), 061,
// 078..080 (7): 79 nodes, five leaf switches, no switch above them.
// circe-n019, n020, n059 and n081..n098 are on no switch.
func TestSlurmCirce(t *testing.T) {
	t.Parallel()
	fab, err := ParseSlurm(circeFile, readFile(t, circeFile))
	if err != nil {
		t.Fatal(err)
	}
	checkFabric(t, fab)
	want := []string{circeFile + `:5: Nodes: node "circe-n051" is below both s2 (line 3) and s4 (line 5): kept below s2, the first (Slurm only warns)`}
	if !slices.Equal(fab.Warnings, want) {
		t.Errorf("warnings =\n%q\nwant\n%q", fab.Warnings, want)
	}
	leaf, spine, core, nodes := tierCounts(fab)
	if leaf != 5 || spine != 0 || core != 0 || nodes != 79 {
		t.Errorf("got %d leaves, %d spines, %d cores, %d nodes; want 5 leaves and 79 nodes", leaf, spine, core, nodes)
	}
	if fab.Cluster != "" {
		t.Errorf("Cluster = %q, want it left to the caller", fab.Cluster)
	}
	wantNodes := map[string][]string{
		"s0": slices.Concat(seq("circe-n", 1, 16, 3), []string{"n019", "n020"}),
		"s1": slices.Concat(seq("circe-n", 17, 18, 3), seq("circe-n", 21, 36, 3)),
		"s2": seq("circe-n", 41, 58, 3),
		"s3": slices.Concat([]string{"circe-n040", "circe-n060"}, seq("circe-n", 62, 77, 3)),
		"s4": slices.Concat(seq("circe-n", 37, 39, 3), []string{"circe-n061"}, seq("circe-n", 78, 80, 3)),
	}
	for i, name := range []string{"s0", "s1", "s2", "s3", "s4"} {
		s := fab.Switches[i]
		if s.Name != name || s.Tier != TierLeaf || len(s.Switches) != 0 {
			t.Errorf("switch %d = %s %s %v, want leaf %s", i, s.Tier, s.Name, s.Switches, name)
		}
		if !slices.Equal(s.Nodes, wantNodes[name]) {
			t.Errorf("%s nodes =\n%q\nwant\n%q", name, s.Nodes, wantNodes[name])
		}
	}
}

// TestSlurmDuplicateNodes: a node below two switches of a tree stays below
// the first, with a warning; below two blocks it is an error (see
// TestSlurmErrors).
func TestSlurmDuplicateNodes(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		src      string
		want     []events.Switch
		warnings []string
	}{
		{
			name: "one node",
			src:  "SwitchName=l1 Nodes=n[1-3]\nSwitchName=l2 Nodes=n[3-4]\nSwitchName=top Switches=l[1-2]\n",
			want: []events.Switch{
				{Name: "l1", Tier: TierLeaf, Nodes: []string{"n1", "n2", "n3"}},
				{Name: "l2", Tier: TierLeaf, Nodes: []string{"n4"}},
				{Name: "top", Tier: TierSpine, Switches: []string{"l1", "l2"}},
			},
			warnings: []string{`t.conf:2: Nodes: node "n3" is below both l1 (line 1) and l2 (line 2): kept below l1, the first (Slurm only warns)`},
		},
		{
			name: "every node of a leaf: it is left empty",
			src:  "SwitchName=l1 Nodes=n[1-2]\nSwitchName=l2 Nodes=n[1-2]\n",
			want: []events.Switch{
				{Name: "l1", Tier: TierLeaf, Nodes: []string{"n1", "n2"}},
				{Name: "l2", Tier: TierLeaf, Nodes: []string{}},
			},
			warnings: []string{
				`t.conf:2: Nodes: node "n1" is below both l1 (line 1) and l2 (line 2): kept below l1, the first (Slurm only warns)`,
				`t.conf:2: Nodes: node "n2" is below both l1 (line 1) and l2 (line 2): kept below l1, the first (Slurm only warns)`,
			},
		},
		{
			name: "below three leaves: the first kept",
			src:  "SwitchName=a Nodes=x\nSwitchName=b Nodes=x,y\nSwitchName=c Nodes=x\n",
			want: []events.Switch{
				{Name: "a", Tier: TierLeaf, Nodes: []string{"x"}},
				{Name: "b", Tier: TierLeaf, Nodes: []string{"y"}},
				{Name: "c", Tier: TierLeaf, Nodes: []string{}},
			},
			warnings: []string{
				`t.conf:2: Nodes: node "x" is below both a (line 1) and b (line 2): kept below a, the first (Slurm only warns)`,
				`t.conf:3: Nodes: node "x" is below both a (line 1) and c (line 3): kept below a, the first (Slurm only warns)`,
			},
		},
		{
			name: "a continued line keeps its first line number",
			src:  "SwitchName=s0 Nodes=n1\nSwitchName=s1 \\\nNodes=n1,n2\n",
			want: []events.Switch{
				{Name: "s0", Tier: TierLeaf, Nodes: []string{"n1"}},
				{Name: "s1", Tier: TierLeaf, Nodes: []string{"n2"}},
			},
			warnings: []string{`t.conf:2: Nodes: node "n1" is below both s0 (line 1) and s1 (line 2): kept below s0, the first (Slurm only warns)`},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			fab, err := ParseSlurm("t.conf", []byte(tt.src))
			if err != nil {
				t.Fatal(err)
			}
			checkFabric(t, fab)
			if !slices.EqualFunc(fab.Switches, tt.want, switchEqual) {
				t.Errorf("got  %+v\nwant %+v", fab.Switches, tt.want)
			}
			if !slices.Equal(fab.Warnings, tt.warnings) {
				t.Errorf("warnings =\n%q\nwant\n%q", fab.Warnings, tt.warnings)
			}
		})
	}

	// Many nodes: five warnings, then one for the rest.
	fab, err := ParseSlurm("t.conf", []byte("SwitchName=l1 Nodes=n[1-9]\nSwitchName=l2 Nodes=n[1-9]\n"))
	if err != nil {
		t.Fatal(err)
	}
	if len(fab.Warnings) != 6 || !strings.Contains(fab.Warnings[4], `node "n5" is below both l1`) ||
		fab.Warnings[5] != "t.conf:2: Nodes: and 4 more nodes of l2 already below another leaf: kept below the first" {
		t.Errorf("warnings = %q", fab.Warnings)
	}
	if l2 := findSwitch(t, fab, "l2"); len(l2.Nodes) != 0 {
		t.Errorf("l2 nodes = %q, want none", l2.Nodes)
	}
}

func TestSlurmUNSWAbacus(t *testing.T) {
	t.Parallel()
	fab, err := ParseSlurm(unswFile, readFile(t, unswFile))
	if err != nil {
		t.Fatal(err)
	}
	checkFabric(t, fab)
	leaf, spine, core, nodes := tierCounts(fab)
	if leaf != 4 || spine != 1 || core != 0 || nodes != 13 {
		t.Errorf("got %d leaves, %d spines, %d cores, %d nodes; want 4, 1, 0, 13", leaf, spine, core, nodes)
	}
	top := findSwitch(t, fab, "abacusc-net")
	if top.Tier != TierSpine || !slices.Equal(top.Switches, []string{"abacusc-0", "abacusc-1", "abacusc-2", "abacusc-neta"}) {
		t.Errorf("abacusc-net = %+v", top)
	}
	for r := range 3 {
		name := "abacusc-" + string(rune('0'+r))
		s := findSwitch(t, fab, name)
		if want := seq(name+"-", 0, 3, 1); s.Tier != TierLeaf || !slices.Equal(s.Nodes, want) {
			t.Errorf("%s = %+v, want leaf with %q", name, s, want)
		}
	}
	if s := findSwitch(t, fab, "abacusc-neta"); !slices.Equal(s.Nodes, []string{"abacus"}) {
		t.Errorf("abacusc-neta nodes = %q, want the head node abacus", s.Nodes)
	}
}

func TestSlurmPuppetIslands(t *testing.T) {
	t.Parallel()
	fab, err := ParseSlurm(puppetFile, readFile(t, puppetFile))
	if err != nil {
		t.Fatal(err)
	}
	checkFabric(t, fab)
	leaf, spine, core, nodes := tierCounts(fab)
	if leaf != 4 || spine != 0 || core != 0 || nodes != 39 {
		t.Errorf("got %d leaves, %d spines, %d cores, %d nodes; want 4 islands and 39 nodes", leaf, spine, core, nodes)
	}
	s0 := findSwitch(t, fab, "s0")
	want := slices.Concat(seq("hpc", 1, 19, 3), seq("gpu", 1, 13, 3), []string{"submit1", "submit2", "master1", "master2"})
	if !slices.Equal(s0.Nodes, want) {
		t.Errorf("s0 nodes = %q, want %q", s0.Nodes, want)
	}
	for name, node := range map[string]string{"s1": "xf11id-srv2", "s2": "xf11id-srv3", "s3": "saturn4"} {
		if s := findSwitch(t, fab, name); !slices.Equal(s.Nodes, []string{node}) {
			t.Errorf("%s nodes = %q, want [%s]", name, s.Nodes, node)
		}
	}
}

// The man page example shows three layouts in one file: as a whole it is
// refused (tree and block mixed, ring unsupported); each layout alone parses.
func TestSlurmSchedMDExamples(t *testing.T) {
	t.Parallel()
	data := readFile(t, schedmdFile)
	_, err := ParseSlurm(schedmdFile, data)
	wantErr(t, err,
		schedmdFile+":10: BlockName: expected only SwitchName lines, as line 1 starts a topology/tree layout",
		schedmdFile+`:20: RingName: expected a topology/tree or topology/block line, got ring "ring0": topology/ring is not supported`,
		schedmdFile+`:21: RingName:`)
	if n := strings.Count(err.Error(), "\n") + 1; n != 3 {
		t.Errorf("want 3 problems, got %d:\n%v", n, err)
	}

	t.Run("tree", func(t *testing.T) {
		t.Parallel()
		fab, err := ParseSlurm("tree.conf", lines(data, 1, 4))
		if err != nil {
			t.Fatal(err)
		}
		checkFabric(t, fab)
		want := []events.Switch{
			{Name: "s0", Tier: TierLeaf, Nodes: seq("dev", 0, 5, 1)},
			{Name: "s1", Tier: TierLeaf, Nodes: seq("dev", 6, 11, 1)},
			{Name: "s2", Tier: TierLeaf, Nodes: seq("dev", 12, 17, 1)},
			{Name: "s3", Tier: TierSpine, Switches: []string{"s0", "s1", "s2"}},
		}
		if !slices.EqualFunc(fab.Switches, want, switchEqual) {
			t.Errorf("got %+v\nwant %+v", fab.Switches, want)
		}
	})
	t.Run("block", func(t *testing.T) {
		t.Parallel()
		fab, err := ParseSlurm("block.conf", lines(data, 6, 14))
		if err != nil {
			t.Fatal(err)
		}
		checkFabric(t, fab)
		leaf, spine, core, nodes := tierCounts(fab)
		if leaf != 4 || spine+core != 0 || nodes != 128 {
			t.Errorf("got %d leaves, %d spines, %d cores, %d nodes; want 4 blocks of 32", leaf, spine, core, nodes)
		}
		for b := range 4 {
			s := fab.Switches[b]
			want := seq("node", 32*b+1, 32*b+32, 1)
			if s.Name != "block"+string(rune('1'+b)) || s.Tier != TierLeaf || !slices.Equal(s.Nodes, want) {
				t.Errorf("block %d = %s %s %q", b+1, s.Tier, s.Name, s.Nodes)
			}
		}
	})
	t.Run("ring", func(t *testing.T) {
		t.Parallel()
		_, err := ParseSlurm("ring.conf", lines(data, 16, 21))
		wantErr(t, err, `ring.conf:5: RingName: expected a topology/tree or topology/block line, got ring "ring0": topology/ring is not supported`)
	})
}

func switchEqual(a, b events.Switch) bool {
	return a.Name == b.Name && a.Tier == b.Tier && slices.Equal(a.Nodes, b.Nodes) && slices.Equal(a.Switches, b.Switches)
}

// TestSlurmSyntax covers the configuration syntax and tier derivation.
func TestSlurmSyntax(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		src  string
		want []events.Switch
	}{
		{
			name: "case-insensitive keys, comments, blank lines, LinkSpeed",
			src: "# a comment\n\nswitchname=l1 NODES=n[1-2] linkspeed=100 # trailing\n" +
				"SWITCHNAME=l2 nodes=n3\nSwitchName=top Switches=l[1-2] LinkSpeed=1\n",
			want: []events.Switch{
				{Name: "l1", Tier: TierLeaf, Nodes: []string{"n1", "n2"}},
				{Name: "l2", Tier: TierLeaf, Nodes: []string{"n3"}},
				{Name: "top", Tier: TierSpine, Switches: []string{"l1", "l2"}},
			},
		},
		{
			name: "continuation lines",
			src:  "SwitchName=l1 \\\n  Nodes=n[1-2],\\\nn9\nSwitchName=l2 Nodes=m1 \\  \n",
			want: []events.Switch{
				{Name: "l1", Tier: TierLeaf, Nodes: []string{"n1", "n2", "n9"}},
				{Name: "l2", Tier: TierLeaf, Nodes: []string{"m1"}},
			},
		},
		{
			name: "CRLF, tabs, spaces around =, quotes",
			src:  "SwitchName = l1\tNodes=\"n1,n2\"\r\nSwitchName=l2 Nodes= n3\r\n",
			want: []events.Switch{
				{Name: "l1", Tier: TierLeaf, Nodes: []string{"n1", "n2"}},
				{Name: "l2", Tier: TierLeaf, Nodes: []string{"n3"}},
			},
		},
		{
			name: "three levels: leaf, spine, core; children listed before parents",
			src:  "SwitchName=c Switches=a[1-2]\nSwitchName=a1 Switches=t1\nSwitchName=a2 Switches=t2,t3\nSwitchName=t1 Nodes=n1\nSwitchName=t2 Nodes=n2\nSwitchName=t3 Nodes=n3\n",
			want: []events.Switch{
				{Name: "c", Tier: TierCore, Switches: []string{"a1", "a2"}},
				{Name: "a1", Tier: TierSpine, Switches: []string{"t1"}},
				{Name: "a2", Tier: TierSpine, Switches: []string{"t2", "t3"}},
				{Name: "t1", Tier: TierLeaf, Nodes: []string{"n1"}},
				{Name: "t2", Tier: TierLeaf, Nodes: []string{"n2"}},
				{Name: "t3", Tier: TierLeaf, Nodes: []string{"n3"}},
			},
		},
		{
			name: "height decides: a switch above a leaf and a spine is core; four levels",
			src:  "SwitchName=l1 Nodes=n1\nSwitchName=l2 Nodes=n2\nSwitchName=sp Switches=l1\nSwitchName=mix Switches=sp,l2\nSwitchName=top Switches=mix\n",
			want: []events.Switch{
				{Name: "l1", Tier: TierLeaf, Nodes: []string{"n1"}},
				{Name: "l2", Tier: TierLeaf, Nodes: []string{"n2"}},
				{Name: "sp", Tier: TierSpine, Switches: []string{"l1"}},
				{Name: "mix", Tier: TierCore, Switches: []string{"sp", "l2"}},
				{Name: "top", Tier: TierCore, Switches: []string{"mix"}},
			},
		},
		{
			name: "a switch under two parents, repeats dropped",
			src:  "SwitchName=l1 Nodes=n[1-2],n1\nSwitchName=p1 Switches=l1,l1\nSwitchName=p2 Switches=l1\n",
			want: []events.Switch{
				{Name: "l1", Tier: TierLeaf, Nodes: []string{"n1", "n2"}},
				{Name: "p1", Tier: TierSpine, Switches: []string{"l1"}},
				{Name: "p2", Tier: TierSpine, Switches: []string{"l1"}},
			},
		},
		{
			name: "a switch with neither Nodes nor Switches is an empty leaf",
			src:  "SwitchName=empty\nSwitchName=top Switches=empty\n",
			want: []events.Switch{
				{Name: "empty", Tier: TierLeaf},
				{Name: "top", Tier: TierSpine, Switches: []string{"empty"}},
			},
		},
		{
			name: "blocks, BlockSizes, case-insensitive",
			src:  "blockname=b1 nodes=n[1-4]\nBlockName=b2 Nodes=n[5-9]\nblocksizes=4,8,16\n",
			want: []events.Switch{
				{Name: "b1", Tier: TierLeaf, Nodes: seq("n", 1, 4, 1)},
				{Name: "b2", Tier: TierLeaf, Nodes: seq("n", 5, 9, 1)},
			},
		},
		{
			name: "blocks without BlockSizes: later blocks as large as the first",
			src:  "BlockName=b1 Nodes=n[1-2]\nBlockName=b2 Nodes=n[3-5]\n",
			want: []events.Switch{
				{Name: "b1", Tier: TierLeaf, Nodes: seq("n", 1, 2, 1)},
				{Name: "b2", Tier: TierLeaf, Nodes: seq("n", 3, 5, 1)},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			fab, err := ParseSlurm("t.conf", []byte(tt.src))
			if err != nil {
				t.Fatal(err)
			}
			checkFabric(t, fab)
			if !slices.EqualFunc(fab.Switches, tt.want, switchEqual) {
				t.Errorf("got  %+v\nwant %+v", fab.Switches, tt.want)
			}
		})
	}
}

func TestSlurmErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		src  string
		want []string
	}{
		{"empty file", "", []string{"t.conf:1: SwitchName: expected at least one SwitchName or BlockName line, got none"}},
		{"comments only", "# nothing\n\n", []string{"t.conf:1: SwitchName: expected at least one"}},
		{"not key=value", "SwitchName=s0 Nodes=n1\nfoo bar\n", []string{`t.conf:2: syntax: expected Key=Value pairs such as SwitchName=s0 Nodes=node[1-4], got "foo bar"`}},
		{"escaped hash", "SwitchName=l1 Nodes=n1 \\# x\n", []string{`t.conf:1: syntax: expected Key=Value pairs`, `got "# x"`}},
		{"unterminated quote", "SwitchName=s0 Nodes=\"n1\n", []string{`t.conf:1: Nodes: expected a closing '"'`}},
		{"text after quote", "SwitchName=s0 Nodes=\"n1\"x\n", []string{`t.conf:1: Nodes: expected white space after the quoted value, got "x"`}},
		{"unknown line key", "NodeName=n1\n", []string{`t.conf:1: NodeName: expected SwitchName, BlockName or BlockSizes at the start of a line, got "NodeName"`}},
		{"unknown key", "SwitchName=s0 Nodes=n1 Speed=1\n", []string{`t.conf:1: Speed: expected Nodes, Switches or LinkSpeed after SwitchName, got unknown key "Speed"`}},
		{"empty name", "SwitchName= Nodes=n1\n", []string{"t.conf:1: SwitchName: expected a name, got nothing"}},
		{"empty value before the next key", "SwitchName=s0 Nodes= LinkSpeed=1\n", []string{`t.conf:1: Nodes: expected a hostlist such as node[1-4,7], got "": names nothing`}},
		{"empty value at end", "SwitchName=s0 Nodes=\n", []string{`t.conf:1: Nodes: expected a hostlist such as node[1-4,7], got "": names nothing`}},
		{"bad switch name", "SwitchName=s[0-1] Nodes=n1\n", []string{`t.conf:1: SwitchName: expected a name of at most 64 letters, digits, '.', '_', ':' or '-', got "s[0-1]"`}},
		{"long switch name", "SwitchName=" + strings.Repeat("s", 65) + " Nodes=n1\n", []string{"t.conf:1: SwitchName: expected a name of at most 64"}},
		{"duplicate switch", "SwitchName=s0 Nodes=n1\n\nSwitchName=s0 Nodes=n2\n", []string{`t.conf:3: SwitchName: expected a new name, got "s0", already defined on line 1`}},
		{"key twice", "SwitchName=s0 Nodes=n1 nodes=n2\n", []string{"t.conf:1: Nodes: expected it once on the line, got it again (as nodes)"}},
		{"nodes and switches", "SwitchName=a Nodes=n1\nSwitchName=s0 Nodes=n2 Switches=a\n", []string{"t.conf:2: Switches: expected either Nodes or Switches, got both"}},
		{"bad link speed", "SwitchName=s0 Nodes=n1 LinkSpeed=fast\n", []string{`t.conf:1: LinkSpeed: expected a whole number, got "fast"`}},
		{"negative link speed", "SwitchName=s0 Nodes=n1 LinkSpeed=-1\n", []string{`t.conf:1: LinkSpeed: expected a whole number, got "-1"`}},
		{"unbalanced bracket", "SwitchName=s0 Nodes=n[1-3\n", []string{`t.conf:1: Nodes: expected a hostlist such as node[1-4,7], got "n[1-3": '[' at offset 1 is not closed`}},
		{"reversed range", "SwitchName=s0 Nodes=n[3-1]\n", []string{`t.conf:1: Nodes: expected a hostlist such as node[1-4,7], got "n[3-1]": range 3-1 is reversed`}},
		{"huge range", "SwitchName=s0 Nodes=n[1-9999999]\n", []string{"t.conf:1: Nodes: expected at most 1048576 names in the whole file, got more by this line"}},
		{"huge file", "SwitchName=s0 Nodes=a[1-600000]\nSwitchName=s1 Nodes=b[1-600000]\nSwitchName=s2 Nodes=c[1-600000]\n",
			[]string{"t.conf:2: Nodes: expected at most 1048576 names in the whole file, got more by this line"}},
		{"bad node name", "SwitchName=s0 Nodes=n1,n=2\n", []string{`t.conf:1: Nodes: expected host names (letters, digits, '.', '_', '-') of at most 253 characters, got "n=2"`}},
		{"unknown child", "SwitchName=s0 Nodes=n1\nSwitchName=top Switches=s[0-1]\n", []string{`t.conf:2: Switches: expected switches defined in this file, got "s1"`}},
		{"self cycle", "SwitchName=s0 Switches=s0\n", []string{"t.conf:1: Switches: expected a tree, got a cycle s0 -> s0"}},
		{"cycle", "SwitchName=a Switches=b\nSwitchName=b Switches=c\nSwitchName=c Switches=a\n", []string{"t.conf:3: Switches: expected a tree, got a cycle a -> b -> c -> a"}},
		{"node under two blocks", "BlockName=b1 Nodes=n[1-2]\nBlockName=b2 Nodes=n[2-3]\n", []string{`t.conf:2: Nodes: expected each node below one leaf, got "n2" below both b1 (line 1) and b2 (line 2)`}},
		{"many nodes under two blocks", "BlockName=b1 Nodes=n[1-9]\nBlockName=b2 Nodes=n[1-9]\n",
			[]string{`got "n5" below both b1`, "t.conf:2: Nodes: and 4 more nodes of b2 already below another leaf"}},
		{"continued line keeps its first line number", "SwitchName=s0 Nodes=n1\nSwitchName=s1 \\\nNodes=n[1-2\n",
			[]string{`t.conf:2: Nodes: expected a hostlist such as node[1-4,7], got "n[1-2"`}},
		{"ring", "RingName=r0 Nodes=n[1-8]\n", []string{`t.conf:1: RingName: expected a topology/tree or topology/block line, got ring "r0": topology/ring is not supported`}},
		{"block then switch", "BlockName=b1 Nodes=n1\nSwitchName=s0 Nodes=n2\n", []string{"t.conf:2: SwitchName: expected only BlockName and BlockSizes lines, as line 1 starts a topology/block layout, got a topology/tree line"}},
		{"switch then BlockSizes", "SwitchName=s0 Nodes=n2\nBlockSizes=4\n", []string{"t.conf:2: BlockSizes: expected only SwitchName lines, as line 1 starts a topology/tree layout"}},
		{"block without nodes", "BlockName=b1\n", []string{"t.conf:1: BlockName: expected Nodes= with the block's nodes, got none"}},
		{"block with switches", "BlockName=b1 Nodes=n1 Switches=x\n", []string{`t.conf:1: Switches: expected Nodes after BlockName, got unknown key "Switches"`}},
		{"block smaller than BlockSizes", "BlockName=b1 Nodes=n[1-4]\nBlockName=b2 Nodes=n[5-6]\nBlockSizes=4\n",
			[]string{"t.conf:2: Nodes: expected at least 4 nodes, the base block size (BlockSizes on line 3), got 2"}},
		{"block smaller than the first", "BlockName=b1 Nodes=n[1-4]\nBlockName=b2 Nodes=n[5-6]\n",
			[]string{"t.conf:2: Nodes: expected at least 4 nodes, the first block b1 (line 1), got 2"}},
		{"BlockSizes not a power of two", "BlockName=b1 Nodes=n[1-4]\nBlockSizes=4,12\n", []string{"t.conf:2: BlockSizes: expected 4 times a power of two (at most 2^15), got 12"}},
		{"BlockSizes not a multiple", "BlockName=b1 Nodes=n[1-4]\nBlockSizes=4,10\n", []string{"t.conf:2: BlockSizes: expected 4 times a power of two"}},
		{"BlockSizes zero", "BlockName=b1 Nodes=n[1-4]\nBlockSizes=0\n", []string{`t.conf:2: BlockSizes: expected positive node counts such as 30,120, got "0"`}},
		{"BlockSizes twice", "BlockName=b1 Nodes=n[1-4]\nBlockSizes=4\nBlockSizes=4\n", []string{"t.conf:3: BlockSizes: expected it once, got it again (first on line 2)"}},
		{"BlockSizes with more", "BlockName=b1 Nodes=n[1-4]\nBlockSizes=4 Nodes=n1\n", []string{"t.conf:2: Nodes: expected BlockSizes alone on its line, got Nodes="}},
		{"all problems, in line order", "SwitchName=top Switches=nope\nSwitchName=s0 Nodes=n[2-1]\nFoo=1\n",
			[]string{"t.conf:1: Switches", "t.conf:2: Nodes", "t.conf:3: Foo"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			fab, err := ParseSlurm("t.conf", []byte(tt.src))
			wantErr(t, err, tt.want...)
			if len(fab.Switches) != 0 {
				t.Errorf("got switches %v along with the error", fab.Switches)
			}
		})
	}
}

func TestSlurmErrorsInLineOrder(t *testing.T) {
	t.Parallel()
	_, err := ParseSlurm("t.conf", []byte("SwitchName=top Switches=nope\nSwitchName=s0 Nodes=n[2-1]\nFoo=1\n"))
	var joined interface{ Unwrap() []error }
	if !errors.As(err, &joined) {
		t.Fatalf("error %v is not a joined error", err)
	}
	var got []string
	for _, e := range joined.Unwrap() {
		got = append(got, strings.SplitN(e.Error(), ":", 3)[1])
	}
	if !slices.Equal(got, []string{"1", "2", "3"}) {
		t.Errorf("lines of the problems = %v, want 1, 2, 3", got)
	}
}
