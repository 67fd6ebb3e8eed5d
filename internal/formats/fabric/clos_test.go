package fabric

import (
	"slices"
	"strings"
	"testing"

	"github.com/toposched/toposched/events"
)

// Counts checked against the file with an independent count (awk/Python
// over the CSV): 847 hosts, one DSW (G6), three PSWs (P10: 362 hosts, P12:
// 306, P8: 179) and 119 distinct (PSW, ASW) ToRs: 48 under P10, 42 under
// P12, 29 under P8, each with at most 8 hosts.
func TestClosLingjun(t *testing.T) {
	t.Parallel()
	fab, err := ParseClosCSV(lingjunFile, readFile(t, lingjunFile))
	if err != nil {
		t.Fatal(err)
	}
	checkFabric(t, fab)
	leaf, spine, core, nodes := tierCounts(fab)
	if leaf != 119 || spine != 3 || core != 1 || nodes != 847 {
		t.Errorf("got %d ASW, %d PSW, %d DSW, %d hosts; want 119, 3, 1, 847", leaf, spine, core, nodes)
	}
	if fab.Cluster != "" {
		t.Errorf("Cluster = %q, want it left to the caller", fab.Cluster)
	}
	g6 := fab.Switches[0]
	if g6.Name != "G6" || g6.Tier != TierCore || !slices.Equal(g6.Switches, []string{"P10", "P12", "P8"}) {
		t.Errorf("first switch = %+v, want core G6 above P10, P12, P8", g6)
	}
	below := map[string]int{}
	leaves := map[string]events.Switch{}
	for _, s := range fab.Switches {
		if s.Tier == TierLeaf {
			leaves[s.Name] = s
			if len(s.Nodes) > 8 {
				t.Errorf("leaf %s has %d hosts, want at most 8", s.Name, len(s.Nodes))
			}
		}
	}
	for _, spine := range []struct {
		name          string
		leaves, hosts int
	}{{"P10", 48, 362}, {"P12", 42, 306}, {"P8", 29, 179}} {
		s := findSwitch(t, fab, spine.name)
		hosts := 0
		for _, l := range s.Switches {
			if !strings.HasPrefix(l, spine.name+"/") {
				t.Errorf("leaf %s under %s", l, spine.name)
			}
			hosts += len(leaves[l].Nodes)
			below[l]++
		}
		if s.Tier != TierSpine || len(s.Switches) != spine.leaves || hosts != spine.hosts {
			t.Errorf("%s: %s with %d leaves, %d hosts; want spine with %d, %d", spine.name, s.Tier, len(s.Switches), hosts, spine.leaves, spine.hosts)
		}
	}
	for l, n := range below {
		if n != 1 {
			t.Errorf("leaf %s under %d spines", l, n)
		}
	}
	// The first data row: host 0c9d...fe4b on G6, P10, S14.
	first := findSwitch(t, fab, "P10/S14")
	if len(first.Nodes) != 8 || first.Nodes[0] != "0c9d9de1b19e7f39b08f49ddfa26744ae26d3adf8bd59af1b16e203b6fa5fe4b" {
		t.Errorf("P10/S14 = %d hosts starting %q", len(first.Nodes), first.Nodes[0])
	}
	if s := findSwitch(t, fab, "P10/S44"); len(s.Nodes) != 3 {
		t.Errorf("P10/S44 has %d hosts, want 3", len(s.Nodes))
	}
}

func TestClosSyntax(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		src  string
		want []events.Switch
	}{
		{
			name: "columns in any order and case, extra columns, spaces, CRLF, BOM, blank lines",
			src:  "\ufeffasw, Rack ,IP,psw,dsw\r\n t1 ,r1, h1 ,a1,c1\r\n\r\nt1,r1,h2,a1,c1\r\nt1,r9,h3,a2,c1\r\n",
			want: []events.Switch{
				{Name: "c1", Tier: TierCore, Switches: []string{"a1", "a2"}},
				{Name: "a1", Tier: TierSpine, Switches: []string{"a1/t1"}},
				{Name: "a2", Tier: TierSpine, Switches: []string{"a2/t1"}},
				{Name: "a1/t1", Tier: TierLeaf, Nodes: []string{"h1", "h2"}},
				{Name: "a2/t1", Tier: TierLeaf, Nodes: []string{"h3"}},
			},
		},
		{
			name: "a spine under two cores, quoted cells",
			src:  "ip,DSW,PSW,ASW\nh1,c1,a1,t1\n\"h2\",c2,a1,\"t2\"\n",
			want: []events.Switch{
				{Name: "c1", Tier: TierCore, Switches: []string{"a1"}},
				{Name: "c2", Tier: TierCore, Switches: []string{"a1"}},
				{Name: "a1", Tier: TierSpine, Switches: []string{"a1/t1", "a1/t2"}},
				{Name: "a1/t1", Tier: TierLeaf, Nodes: []string{"h1"}},
				{Name: "a1/t2", Tier: TierLeaf, Nodes: []string{"h2"}},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			fab, err := ParseClosCSV("t.csv", []byte(tt.src))
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

func TestClosErrors(t *testing.T) {
	t.Parallel()
	const hdr = "ip,DSW,PSW,ASW\n"
	tests := []struct {
		name string
		src  string
		want []string
	}{
		{"empty file", "", []string{"t.csv:1: header: expected the columns ip, DSW, PSW and ASW, got an empty file"}},
		{"header only", hdr, []string{"t.csv:2: row: expected at least one host row, got none"}},
		{"missing columns", "ip,DSW,ToR\nh1,c1,t1\n", []string{`t.csv:1: header: expected the columns ip, DSW, PSW and ASW, got "ip,DSW,ToR" without PSW, ASW`}},
		{"duplicate column", "ip,DSW,PSW,ASW,psw\nh1,c,a,t,a\n", []string{`t.csv:1: header: expected each of ip, DSW, PSW and ASW once, got "psw" in columns 3 and 5`}},
		{"too few columns", hdr + "h1,c1,a1,t1\nh2,c1,a1\n", []string{"t.csv:3: row: expected 4 columns as in the header, got 3"}},
		{"too many columns", hdr + "h1,c1,a1,t1,x\n", []string{"t.csv:2: row: expected 4 columns as in the header, got 5"}},
		{"empty cell", hdr + "h1,c1,,t1\n", []string{"t.csv:2: PSW: expected a name, got an empty cell"}},
		{"blank cell", hdr + "h1,c1,a1,  \n", []string{"t.csv:2: ASW: expected a name, got an empty cell"}},
		{"empty host", hdr + ",c1,a1,t1\n", []string{"t.csv:2: ip: expected a name, got an empty cell"}},
		{"duplicate host", hdr + "h1,c1,a1,t1\nh2,c1,a1,t1\nh1,c1,a1,t2\n", []string{`t.csv:4: ip: expected each host once, got "h1" again (first on line 2)`}},
		{"bad host", hdr + "h 1,c1,a1,t1\n", []string{`t.csv:2: ip: expected a host name or address (letters, digits, '.', '_', '-'), got "h 1"`}},
		{"bad switch", hdr + "h1,c1,a/1,t1\n", []string{`t.csv:2: PSW: expected a switch name of at most 253 letters, digits, '.', '_', ':' or '-', got "a/1"`}},
		{"name in two columns", hdr + "h1,x,a1,t1\nh2,c1,x,t1\n", []string{`t.csv:3: PSW: expected a name not used in another column, got "x", a core switch on line 2`}},
		{"bare quote", hdr + "h1,c\"1,a1,t1\n", []string{"t.csv:2: row: expected well-formed CSV"}},
		{"unterminated quote", hdr + "h1,\"c1,a1,t1\n", []string{"t.csv:2: row: expected well-formed CSV"}},
		{"all problems, in line order", hdr + "h1,,a1,t1\nh2,c1,a1\nh3,c1,a1,t1\nh3,c1,a1,t1\n",
			[]string{"t.csv:2: DSW", "t.csv:3: row", "t.csv:5: ip"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			fab, err := ParseClosCSV("t.csv", []byte(tt.src))
			wantErr(t, err, tt.want...)
			if len(fab.Switches) != 0 {
				t.Errorf("got switches %v along with the error", fab.Switches)
			}
		})
	}
}
