package slurmconf

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// FuzzParseGres checks that ParseGres either names the file and line of a
// fault or gives each node GPUs indexed in order with Links that fit.
func FuzzParseGres(f *testing.F) {
	paths, _ := filepath.Glob("testdata/gres/*.conf")
	golden, _ := filepath.Glob("testdata/golden/*.gres.conf")
	for _, p := range append(paths, golden...) {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	for _, s := range []string{
		"NodeName=n1 Name=gpu File=/dev/nvidia0 Links=-1,2\nNodeName=n1 Name=gpu File=/dev/nvidia1 Links=2,-1\n",
		"Name=gpu File=/dev/nvidia[0-3]\nNodeName=n2 Name=gpu File=/dev/nvidia9\n",
		"AutoDetect=nvml\nNodeName=n[1-2] AutoDetect=off Name=gpu File=/dev/nvidia[0,2-3] Count=3 Cores=0-3\n",
		"NodeName=n1 Name=gpu File=/dev/nvidia0 Links=-1,x\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		g, err := ParseGres("fuzz.conf", data)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "fuzz.conf:") {
				t.Fatalf("error without file:line: %v", err)
			}
			return
		}
		check := func(gpus []GPU) {
			for i, gpu := range gpus {
				if gpu.Index != i || gpu.File == "" || gpu.Line < 1 {
					t.Fatalf("GPU %d: %+v", i, gpu)
				}
				if gpu.Links != nil && (len(gpu.Links) != len(gpus) || slices.Index(gpu.Links, -1) != i) {
					t.Fatalf("GPU %d: Links %v on a node of %d GPUs", i, gpu.Links, len(gpus))
				}
			}
		}
		check(g.Global)
		for _, n := range g.Order {
			check(g.Nodes[n])
		}
		if len(g.Order) != len(g.Nodes) {
			t.Fatalf("Order %v, Nodes %d", g.Order, len(g.Nodes))
		}
	})
}

// FuzzParseCPUList checks that a list read is sorted and distinct, and
// that FormatCPUList writes it so that it reads back the same.
func FuzzParseCPUList(f *testing.F) {
	for _, s := range []string{"0-3", "0-3,8,10-11", "8,0-3,2,9", "0-47,96-143", "3-1", "65535", "0-65535,0-65535", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		cpus, err := ParseCPUList(s)
		if err != nil {
			return
		}
		if !slices.IsSorted(cpus) || len(slices.Compact(slices.Clone(cpus))) != len(cpus) || len(cpus) == 0 {
			t.Fatalf("ParseCPUList(%q) = %v", s, cpus)
		}
		back, err := ParseCPUList(FormatCPUList(cpus))
		if err != nil || !slices.Equal(back, cpus) {
			t.Fatalf("ParseCPUList(FormatCPUList(%v)) = %v, %v", cpus, back, err)
		}
	})
}
