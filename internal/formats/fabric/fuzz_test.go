package fabric

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// seedFiles adds every file under testdata/<dir> to the corpus.
func seedFiles(f *testing.F, dir string) {
	paths, err := filepath.Glob(filepath.Join("testdata", dir, "*"))
	if err != nil || len(paths) == 0 {
		f.Fatalf("no seed files in testdata/%s: %v", dir, err)
	}
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
}

func FuzzParseSlurm(f *testing.F) {
	seedFiles(f, "slurm")
	for _, s := range []string{
		"SwitchName=c Switches=a[1-2]\nSwitchName=a1 Switches=t1\nSwitchName=a2 Switches=t2\nSwitchName=t1 Nodes=n[1-2]\nSwitchName=t2 Nodes=n[3-4]\n",
		"SwitchName=a Switches=b\nSwitchName=b Switches=a\n",
		"switchname=l1 \\\n nodes=\"n1,n2\" linkspeed=5 # c\n",
		"BlockName=b1 Nodes=n[1-4]\nBlockName=b2 Nodes=n[5-8]\nBlockSizes=4,8\n",
		"RingName=r Nodes=n[1-4]\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		fab, err := ParseSlurm("fuzz.conf", data)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "fuzz.conf:") {
				t.Fatalf("error without file:line: %v", err)
			}
			return
		}
		checkFabric(t, fab)
	})
}

func FuzzExpandHostlist(f *testing.F) {
	for _, s := range []string{
		"circe-n[001-016],n[019-020]", "node[1-3,7,10-12]", "s[0-2]", "rack[1-2]-n[01-04]",
		"abacusc-[0-2],abacusc-neta", "a, b\tc", "n[3-1]", "n[1-", "n]", "[]", "n[0-1048575]",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, expr string) {
		names, err := ExpandHostlist(expr)
		if err != nil {
			return
		}
		if len(names) == 0 || len(names) > MaxHostlistNames {
			t.Fatalf("ExpandHostlist(%q) gave %d names", expr, len(names))
		}
		for _, n := range names {
			if n == "" || len(n) > maxHostlistNameLen || strings.ContainsAny(n, "[], \t\r\n") {
				t.Fatalf("ExpandHostlist(%q) gave name %q", expr, n)
			}
		}
	})
}

func FuzzParseClosCSV(f *testing.F) {
	seedFiles(f, "lingjun")
	for _, s := range []string{
		"ip,DSW,PSW,ASW\nh1,c1,a1,t1\nh2,c2,a1,t2\n",
		"ASW,ip,psw,dsw,x\nt1,h1,a1,c1,y\n",
		"ip,DSW,PSW,ASW\nh1,x,a1,t1\nh2,c1,x,t1\n",
		"ip,DSW,PSW,ASW\nh1,\"c1,a1,t1\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		fab, err := ParseClosCSV("fuzz.csv", data)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "fuzz.csv:") {
				t.Fatalf("error without file:line: %v", err)
			}
			return
		}
		checkFabric(t, fab)
		for _, s := range fab.Switches {
			if want := map[string]bool{TierLeaf: len(s.Nodes) > 0, TierSpine: len(s.Switches) > 0, TierCore: len(s.Switches) > 0}; !want[s.Tier] {
				t.Fatalf("switch %+v is empty", s)
			}
		}
	})
}

// FuzzCompressHostlist checks that what CompressHostlist writes expands
// back into the names it was given, in order.
func FuzzCompressHostlist(f *testing.F) {
	for _, s := range []string{
		"n1 n2 n3 n7", "n08 n09 n10", "n8 n9 n10", "n9 n010", "a b8 b9 b10", "n2 n1", "n1 n1",
		"rack1-n01 rack1-n02 rack2-n01", "1 2 3", "n18446744073709551615 n18446744073709551614",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		names := strings.Fields(s)
		for _, n := range names {
			if strings.ContainsAny(n, "[],") || len(n) > maxHostlistNameLen {
				return
			}
		}
		if len(names) == 0 {
			return
		}
		expr := CompressHostlist(names)
		back, err := ExpandHostlist(expr)
		if err != nil {
			t.Fatalf("ExpandHostlist(CompressHostlist(%q) = %q): %v", names, expr, err)
		}
		if !slices.Equal(back, names) {
			t.Fatalf("ExpandHostlist(CompressHostlist(%q) = %q) = %q", names, expr, back)
		}
	})
}
