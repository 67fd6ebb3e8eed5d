package slurmconf

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/toposched/toposched/events"
)

// renderGres prints a parsed gres.conf, node by node, for golden files.
func renderGres(g Gres, err error) string {
	if err != nil {
		return "error:\n" + err.Error() + "\n"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "autodetect: %s\n", orNone(g.AutoDetect))
	line := func(name string, gpus []GPU) {
		fmt.Fprintf(&b, "%s:\n", name)
		for _, gpu := range gpus {
			fmt.Fprintf(&b, "  %d type=%s file=%s cores=%s links=%s (line %d)\n", gpu.Index, orNone(gpu.Type), gpu.File,
				orNone(FormatCPUList(gpu.Cores)), orNone(formatLinks(gpu.Links)), gpu.Line)
		}
	}
	for _, n := range g.Order {
		line(n, g.Nodes[n])
	}
	line("(every node)", g.Global)
	return b.String()
}

// TestParseGresGolden reads each file of testdata/gres and compares what
// it makes of it with testdata/golden/<file>.golden.
func TestParseGresGolden(t *testing.T) {
	t.Parallel()
	paths, err := filepath.Glob("testdata/gres/*.conf")
	if err != nil || len(paths) == 0 {
		t.Fatalf("no files in testdata/gres: %v", err)
	}
	for _, p := range paths {
		t.Run(filepath.Base(p), func(t *testing.T) {
			t.Parallel()
			data, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			g, err := ParseGres(filepath.Base(p), data)
			checkGolden(t, filepath.Base(p)+".golden", []byte(renderGres(g, err)))
		})
	}
}

// TestParseGresErrors checks that each fault is reported with the file,
// the line and the key, and what was expected.
func TestParseGresErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, data string
		want       []string // substrings of the error, in order
	}{
		{"syntax", "NodeName=n1 Name=gpu File=/dev/nvidia0\nfoo bar\n",
			[]string{`g.conf:2: syntax: expected Key=Value pairs such as NodeName=n[1-2] Name=gpu File=/dev/nvidia0, got "foo bar"`}},
		{"first key", "Type=x Name=gpu File=/dev/nvidia0\n",
			[]string{`g.conf:1: Type: expected NodeName, Name or AutoDetect at the start of a line, got "Type"`}},
		{"nodename later", "Name=gpu File=/dev/nvidia0 NodeName=n1\n",
			[]string{`g.conf:1: NodeName: expected one of AutoDetect, Count, Cores, File, Flags, Links, MultipleFiles, Name and Type, got unknown key "NodeName"`}},
		{"bad hostlist", "NodeName=n[2-1] Name=gpu File=/dev/nvidia0\n",
			[]string{`g.conf:1: NodeName: expected a hostlist such as n[1-4,7], got "n[2-1]": range 2-1 is reversed`}},
		{"bad node name", "NodeName=n/1 Name=gpu File=/dev/nvidia0\n",
			[]string{`g.conf:1: NodeName: expected host names (letters, digits, '.', '_', '-'), got "n/1"`}},
		{"unknown key", "NodeName=n1 Name=gpu File=/dev/nvidia0 Colour=red\n",
			[]string{`g.conf:1: Colour: expected one of`, `got unknown key "Colour"`}},
		{"twice", "NodeName=n1 Name=gpu File=/dev/nvidia0 file=/dev/nvidia1\n",
			[]string{`g.conf:1: File: expected it once on the line, got it again (as file)`}},
		{"files and file", "NodeName=n1 Name=gpu File=/dev/nvidia0 Files=/dev/nvidia1\n",
			[]string{`g.conf:1: File: expected it once on the line, got it again (as Files)`}},
		{"no name", "NodeName=n1 File=/dev/nvidia0\n",
			[]string{`g.conf:1: Name: expected Name=gpu (or another GRES name) on the line, got none`}},
		{"no file", "NodeName=n1 Name=gpu Type=h100\n",
			[]string{`g.conf:1: File: expected the GPU's device file (Slurm discards a gpu record without File or MultipleFiles), got none`}},
		{"file and multiple", "NodeName=n1 Name=gpu File=/dev/nvidia0 MultipleFiles=/dev/nvidia1\n",
			[]string{`g.conf:1: MultipleFiles: expected either File or MultipleFiles, got both`}},
		{"bad file list", "NodeName=n1 Name=gpu File=/dev/nvidia[0-\n",
			[]string{`g.conf:1: File: expected device files such as /dev/nvidia[0-3], got "/dev/nvidia[0-"`}},
		{"count", "NodeName=n1 Name=gpu File=/dev/nvidia[0-3] Count=2\n",
			[]string{`g.conf:1: Count: expected 4, the number of device files, got "2"`}},
		{"type", "NodeName=n1 Name=gpu Type=h:100 File=/dev/nvidia0\n",
			[]string{`g.conf:1: Type: expected a type of at most 64 letters, digits, '_', '.' or '-', got "h:100"`}},
		{"cores", "NodeName=n1 Name=gpu File=/dev/nvidia0 Cores=3-1\n",
			[]string{`g.conf:1: Cores: expected a list such as 0-3,8, got "3-1": range 3-1 is reversed`}},
		{"cores and cpus", "NodeName=n1 Name=gpu File=/dev/nvidia0 Cores=0 CPUs=1\n",
			[]string{`g.conf:1: CPUs: expected either Cores or CPUs, got both`}},
		{"cores too big", "NodeName=n1 Name=gpu File=/dev/nvidia0 Cores=0-70000\n",
			[]string{`g.conf:1: Cores: expected a list such as 0-3,8, got "0-70000": 70000 is beyond 65535`}},
		{"flags", "NodeName=n1 Name=gpu File=/dev/nvidia0 Flags=nvidia_gpu_env,fast\n",
			[]string{`g.conf:1: Flags: expected flags among`, `got "fast"`}},
		{"autodetect", "AutoDetect=magic\n",
			[]string{`g.conf:1: AutoDetect: expected nvml, rsmi, oneapi or off, got "magic"`}},
		{"autodetect twice", "AutoDetect=nvml\nAutoDetect=off\n",
			[]string{`g.conf:2: AutoDetect: expected it once alone on a line, got it again (first on line 1)`}},
		{"links value", "NodeName=n1 Name=gpu File=/dev/nvidia0 Links=-1,x\n",
			[]string{`g.conf:1: Links: expected NVLink counts such as -1,2,0,0 (-1 for the GPU itself, 0 for none), got "x" at place 1`}},
		{"links no self", "NodeName=n1 Name=gpu File=/dev/nvidia0 Links=0,2\n",
			[]string{`g.conf:1: Links: expected one -1 (the GPU itself), got none in "0,2"`}},
		{"links two selves", "NodeName=n1 Name=gpu File=/dev/nvidia0 Links=-1,-1\n",
			[]string{`g.conf:1: Links: expected one -1 (the GPU itself), got -1 at places 0 and 1`}},
		{"links many files", "NodeName=n1 Name=gpu File=/dev/nvidia[0-1] Links=-1,2\n",
			[]string{`g.conf:1: Links: expected Links only on a line of one device file, got 2 files`}},
		{"links length", "NodeName=n1 Name=gpu File=/dev/nvidia0 Links=-1,2\n",
			[]string{`g.conf:1: Links: expected 1 entries, one per GPU of node n1, got 2`}},
		{"links place", "NodeName=n1 Name=gpu File=/dev/nvidia0 Links=-1,2\nNodeName=n1 Name=gpu File=/dev/nvidia1 Links=-1,2\n",
			[]string{`g.conf:2: Links: expected -1 at place 1, this GPU's index on node n1 (its place among the node's gpu lines), got it at place 0`}},
		{"links disagree", "NodeName=n1 Name=gpu File=/dev/nvidia0 Links=-1,2\nNodeName=n1 Name=gpu File=/dev/nvidia1 Links=4,-1\n",
			[]string{`g.conf:2: Links: expected 2 links to GPU 0, as its line 1 gives for this pair, got 4`}},
		{"file twice", "NodeName=n[1-2] Name=gpu File=/dev/nvidia0\nNodeName=n2 Name=gpu File=/dev/nvidia0\n",
			[]string{`g.conf:2: File: expected each device file once on node n2, got /dev/nvidia0 again (first on line 1)`}},
		{"global file twice", "Name=gpu File=/dev/nvidia0\nName=gpu File=/dev/nvidia0\n",
			[]string{`g.conf:2: File: expected each device file once on every node (lines without NodeName), got /dev/nvidia0 again (first on line 1)`}},
		{"several, in line order", "NodeName=n1 Name=gpu File=/dev/nvidia0 Cores=x\nNodeName=n1 Name=gpu\nBad=1\n",
			[]string{"g.conf:1: Cores:", "\ng.conf:2: File:", "\ng.conf:3: Bad:"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := ParseGres("g.conf", []byte(tt.data))
			if err == nil {
				t.Fatalf("ParseGres(%q) gave no error", tt.data)
			}
			msg := err.Error()
			at := 0
			for _, w := range tt.want {
				i := strings.Index(msg[at:], w)
				if i < 0 {
					t.Fatalf("error %q lacks %q (after offset %d)", msg, w, at)
				}
				at += i + len(w)
			}
		})
	}
}

// TestWriteErrors checks the writers' refusals: each names the node or
// switch and the field.
func TestWriteErrors(t *testing.T) {
	t.Parallel()
	gpus := func(n int) []events.GPU {
		out := make([]events.GPU, n)
		for i := range out {
			out[i].Index = i
		}
		return out
	}
	mig := gpus(2)
	mig[1].MIG = true
	gap := gpus(2)
	gap[1].Index = 3
	aff := gpus(1)
	aff[0].CPUAffinity = "0-15,200"
	badAff := gpus(1)
	badAff[0].CPUAffinity = "N/A"
	tests := []struct {
		name  string
		nodes []events.TopologyNode
		opts  Options
		want  string
	}{
		{"mig", []events.TopologyNode{{Name: "n1", GPUs: mig}}, Options{},
			"node n1: gpu 1: mig: a MIG GPU's gres.conf records come from AutoDetect=nvml, not written here"},
		{"indices", []events.TopologyNode{{Name: "n1", GPUs: gap}}, Options{},
			"node n1: gpus: expected indices 0 to 1, got index 3"},
		{"name", []events.TopologyNode{{Name: "n 1", GPUs: gpus(1)}}, Options{},
			`node "n 1": name: expected a host name (letters, digits, '.', '_', '-')`},
		{"affinity beyond the cores", []events.TopologyNode{{Name: "n1", GPUs: aff}}, Options{ThreadsPerCore: 2, CoresPerNode: 96},
			`node n1: gpu 0: cpu_affinity: expected CPUs below 192 (96 cores x 2 threads per core), got CPU 200 in "0-15,200"`},
		{"affinity unreadable", []events.TopologyNode{{Name: "n1", GPUs: badAff}}, Options{},
			`node n1: gpu 0: cpu_affinity: expected a list such as 0-3,8, got "N/A"`},
		{"threads without cores", nil, Options{ThreadsPerCore: 2},
			"threads per core: 2 needs the cores per node"},
		{"device format", nil, Options{DeviceFormat: "/dev/nvidia"},
			`device format: expected a path with one %d for the GPU index, such as /dev/nvidia%d, got "/dev/nvidia"`},
		{"device format spaces", nil, Options{DeviceFormat: "/my dev/nvidia%d"},
			`device format: expected a path without '[', ']', ',', '#', quotes, backslashes or white space, got "/my dev/nvidia%d"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := WriteGres(tt.nodes, tt.opts)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("WriteGres: error %v, want one containing %q", err, tt.want)
			}
		})
	}

	topo := []struct {
		name string
		fab  events.TopologyFabric
		want string
	}{
		{"no switches", events.TopologyFabric{}, ErrNoFabric.Error()},
		{"only nvlink", events.TopologyFabric{Switches: []events.Switch{{Name: "nvl", Tier: "nvlink", Nodes: []string{"n1"}}}}, ErrNoFabric.Error()},
		{"switch name", events.TopologyFabric{Switches: []events.Switch{{Name: "leaf one", Tier: "leaf", Nodes: []string{"n1"}}}},
			`fabric: switch "leaf one": name: expected at most 64 letters, digits, '.', '_', ':' or '-', as Slurm's SwitchName`},
		{"not a tree", events.TopologyFabric{Switches: []events.Switch{{Name: "l", Tier: "leaf", Switches: []string{"x"}}}},
			`fabric: switch "l": tier inconsistent: a leaf holds nodes, got switches`},
	}
	for _, tt := range topo {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := WriteTopology(tt.fab)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("WriteTopology: error %v, want one containing %q", err, tt.want)
			}
		})
	}
}

func TestTypeOf(t *testing.T) {
	t.Parallel()
	for model, want := range map[string]string{
		"H100":                  "h100",
		"NVIDIA H100 80GB HBM3": "nvidia_h100_80gb_hbm3",
		"A100-SXM4-80GB":        "a100-sxm4-80gb",
		" Tesla  V100 (PCIe) ":  "tesla_v100_pcie_",
		"":                      "",
	} {
		if got := TypeOf(model); got != want {
			t.Errorf("TypeOf(%q) = %q, want %q", model, got, want)
		}
	}
}

func TestCPUList(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"0-3":           "0-3",
		"0-3,8,10-11":   "0-3,8,10-11",
		"8,0-3,2,9":     "0-3,8-9",
		"0-47,96-143":   "0-47,96-143",
		"0-3,0-3,4":     "0-4",
		"65535":         "65535",
		"0-65535,0-100": "0-65535",
	} {
		cpus, err := ParseCPUList(in)
		if err != nil {
			t.Errorf("ParseCPUList(%q): %v", in, err)
			continue
		}
		if got := FormatCPUList(cpus); got != want {
			t.Errorf("FormatCPUList(ParseCPUList(%q)) = %q, want %q", in, got, want)
		}
	}
	for _, in := range []string{"", "a", "1-", "-1", "3-1", "1,,2", "65536", "99999999999999999999"} {
		if _, err := ParseCPUList(in); err == nil {
			t.Errorf("ParseCPUList(%q) gave no error", in)
		}
	}
}
