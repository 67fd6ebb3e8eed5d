package nvsmi

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/toposched/toposched/internal/textout"
	"github.com/toposched/toposched/internal/topology"
)

var update = flag.Bool("update", false, "rewrite testdata/golden")

// inputs lists the nvidia-smi outputs in testdata (all of them, or only the
// complete or only the partial ones).
func inputs(t testing.TB, partial bool, complete bool) []string {
	t.Helper()
	all, err := filepath.Glob("testdata/*.txt")
	if err != nil || len(all) == 0 {
		t.Fatalf("no testdata: %v", err)
	}
	var out []string
	for _, f := range all {
		isPartial := strings.Contains(filepath.Base(f), ".partial.")
		if isPartial && partial || !isPartial && complete {
			out = append(out, f)
		}
	}
	return out
}

func parseFile(t *testing.T, name string) (*topology.Node, error) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return Parse(name, data)
}

// render is a readable form of a node for the golden files.
func render(n *topology.Node) string {
	var b bytes.Buffer
	fmt.Fprintf(&b, "source: %s\ngpus: %d\nnics: %d\nnvlink_gen: %d\n", n.Source, len(n.GPUs), len(n.NICs), n.NVLinkGen)
	for _, inf := range n.Inferred {
		fmt.Fprintf(&b, "inferred: %s\n", inf)
	}
	// Into b, a bytes.Buffer: no write, so no flush, can fail.
	tw := textout.Table(&b, 0, 4, 2, ' ', 0)
	tw.Println("\nGPU\tindex\tnuma\tcpu affinity")
	for i, g := range n.GPUs {
		tw.Printf("GPU%d\t%d\t%d\t%s\n", i, g.Index, g.NUMA, g.CPUAffinity)
	}
	if len(n.NICs) > 0 {
		tw.Println("\nNIC\tindex\tname\tnuma")
		for k, nic := range n.NICs {
			tw.Printf("NIC%d\t%d\t%s\t%d\n", k, nic.Index, nic.Name, nic.NUMA)
		}
	}
	tw.Print("\n")
	for i := range n.GPUs {
		tw.Printf("\tGPU%d", i)
	}
	for k := range n.NICs {
		tw.Printf("\tNIC%d", k)
	}
	tw.Println()
	for i := range n.GPUs {
		tw.Printf("GPU%d", i)
		for _, l := range n.GPUPaths[i] {
			tw.Printf("\t%s", l)
		}
		if n.NICPaths != nil {
			for _, l := range n.NICPaths[i] {
				tw.Printf("\t%s", l)
			}
		}
		tw.Println()
	}
	if n.P2P != nil {
		tw.Println("\np2p")
		for i, row := range n.P2P {
			tw.Printf("GPU%d", i)
			for _, s := range row {
				tw.Printf("\t%s", s)
			}
			tw.Println()
		}
	}
	_ = tw.Flush()
	if len(n.Warnings) > 0 {
		fmt.Fprintln(&b, "\nwarnings:")
		for _, w := range n.Warnings {
			fmt.Fprintf(&b, "- %s\n", w)
		}
	}
	return b.String()
}

// Every complete file, and every partial one that is imported, renders as
// its golden file says (go test -update rewrites them).
func TestGolden(t *testing.T) {
	t.Parallel()
	for _, f := range inputs(t, true, true) {
		name := filepath.Base(f)
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			n, err := parseFile(t, name)
			golden := filepath.Join("testdata", "golden", name+".golden")
			if err != nil {
				if !strings.Contains(name, ".partial.") {
					t.Fatalf("complete file refused: %v", err)
				}
				if _, statErr := os.Stat(golden); statErr == nil {
					t.Errorf("%s refused (%v) but has a golden file", name, err)
				}
				return
			}
			got := render(n)
			if *update {
				if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run go test -update)", err)
			}
			if got != string(want) {
				t.Errorf("%s differs from %s (run go test -update and review the diff):\n%s", name, golden, got)
			}
		})
	}
}

// pair names a cell by its row and column labels (GPU0, NIC3).
type pair struct{ a, b, want string }

func cell(t *testing.T, n *topology.Node, a, b string) string {
	t.Helper()
	var i, j int
	if _, err := fmt.Sscanf(a, "GPU%d", &i); err != nil {
		t.Fatalf("row %s: rows are GPUs", a)
	}
	if _, err := fmt.Sscanf(b, "GPU%d", &j); err == nil {
		return n.GPUPaths[i][j].String()
	}
	if _, err := fmt.Sscanf(b, "NIC%d", &j); err == nil {
		return n.NICPaths[i][j].String()
	}
	t.Fatalf("column %s", b)
	return ""
}

// Values checked by hand against the files.
func TestFiles(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		file     string
		gpus     int
		nics     []string // names, in order; nil: no NICs
		pairs    []pair
		numa     []int    // per GPU
		cpus     []string // per GPU; nil: not checked
		warnings []string // substrings, each in some warning; nil: none
	}{
		{
			file: "a100-sxm-8gpu-nv12-17nic_xuesongtap-blog.txt", gpus: 8,
			nics: []string{"mlx5_2", "mlx5_3", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_7", "mlx5_8", "mlx5_9",
				"mlx5_10", "mlx5_11", "mlx5_12", "mlx5_13", "mlx5_14", "mlx5_15", "mlx5_16", "mlx5_17", "mlx5_bond_0"},
			pairs: []pair{{"GPU0", "GPU1", "NV12"}, {"GPU3", "GPU7", "NV12"}, {"GPU0", "NIC0", "PXB"},
				{"GPU1", "NIC3", "PXB"}, {"GPU0", "NIC4", "SYS"}, {"GPU2", "NIC4", "PXB"},
				{"GPU7", "NIC15", "PXB"}, {"GPU7", "NIC16", "SYS"}, {"GPU0", "NIC16", "SYS"}},
			numa: []int{0, 0, 0, 0, 0, 0, 0, 0},
			cpus: slices.Repeat([]string{"0-103"}, 8),
		},
		{
			file: "t4-4gpu-2socket-sys-node_nccl-issue-428.txt", gpus: 4,
			pairs: []pair{{"GPU0", "GPU1", "SYS"}, {"GPU1", "GPU2", "NODE"}, {"GPU2", "GPU3", "NODE"},
				{"GPU0", "GPU3", "SYS"}, {"GPU2", "GPU2", "X"}},
			numa: []int{-1, -1, -1, -1}, // no NUMA Affinity column
			cpus: []string{"0-15,32-47", "16-31,48-63", "16-31,48-63", "16-31,48-63"},
		},
		{
			// Two PCIe switch groups {0,1,6,7} and {2,3,4,5}.
			file: "quadro-rtx6000-8gpu-pcie-switch-tree_au25-cse599o-hw2.txt", gpus: 8,
			pairs: []pair{{"GPU0", "GPU1", "PIX"}, {"GPU0", "GPU6", "PIX"}, {"GPU1", "GPU7", "PIX"},
				{"GPU2", "GPU5", "PIX"}, {"GPU3", "GPU4", "PIX"}, {"GPU0", "GPU2", "PXB"},
				{"GPU5", "GPU6", "PXB"}, {"GPU4", "GPU7", "PXB"}},
			numa: []int{0, 0, 0, 0, 0, 0, 0, 0},
			cpus: slices.Repeat([]string{"0-19"}, 8),
		},
		{
			file: "rtx4090-8gpu-pcie-switch_nccl-tests-issue-307.txt", gpus: 8, nics: []string{"mlx5_bond_0"},
			pairs: []pair{{"GPU0", "GPU3", "PIX"}, {"GPU3", "GPU4", "SYS"}, {"GPU5", "GPU7", "PIX"},
				{"GPU0", "NIC0", "PIX"}, {"GPU3", "NIC0", "PIX"}, {"GPU4", "NIC0", "SYS"}},
			numa: []int{0, 0, 0, 0, 1, 1, 1, 1},
			cpus: []string{"0-35,72-107", "0-35,72-107", "0-35,72-107", "0-35,72-107",
				"36-71,108-143", "36-71,108-143", "36-71,108-143", "36-71,108-143"},
		},
		{
			// No NIC Legend: the NICs keep their labels, with a warning.
			file: "rtx4090-8gpu-all-sys_go-gpuallocator-issue-17.txt", gpus: 8, nics: []string{"NIC0", "NIC1"},
			pairs: []pair{{"GPU0", "GPU7", "SYS"}, {"GPU0", "GPU1", "SYS"}, {"GPU6", "NIC0", "PHB"},
				{"GPU6", "NIC1", "PHB"}, {"GPU7", "NIC1", "SYS"}},
			numa:     []int{0, 0, 0, 0, 1, 1, 1, 1},
			warnings: []string{"no NIC Legend names NIC0, NIC1"},
		},
		{
			file: "gtx1080ti-2gpu-desktop-phb_xuesongtap-blog.txt", gpus: 2,
			pairs: []pair{{"GPU0", "GPU1", "PHB"}},
			numa:  []int{-1, -1}, // N/A
			cpus:  []string{"0-11", "0-11"},
		},
		{
			file: "rtx3090-2gpu-sys-dual-socket_club-3090-issue-178.txt", gpus: 2,
			pairs: []pair{{"GPU1", "GPU0", "SYS"}},
			numa:  []int{-1, 1}, // GPU0 printed N/A
			cpus:  []string{"0-7,16-23", "8-15,24-31"},
		},
		{
			file: "rtx3090-2gpu-phb-single-socket_club-3090-issue-922.txt", gpus: 2,
			pairs: []pair{{"GPU0", "GPU1", "PHB"}},
			numa:  []int{0, 0}, cpus: []string{"0-31", "0-31"},
		},
		{
			file: "rtx5090-2gpu-phb-threadripper-no-p2p_club-3090-issue-1133.txt", gpus: 2,
			pairs: []pair{{"GPU0", "GPU1", "PHB"}},
			numa:  []int{0, 0}, cpus: []string{"0-63", "0-63"},
		},
		{
			file: "hgx-h100-8gpu-nv18-no-nic_thunderkittens-issue-167.txt", gpus: 8,
			pairs: []pair{{"GPU0", "GPU7", "NV18"}, {"GPU3", "GPU4", "NV18"}},
			numa:  []int{0, 0, 0, 0, 1, 1, 1, 1},
			cpus: []string{"0-47,96-143", "0-47,96-143", "0-47,96-143", "0-47,96-143",
				"48-95,144-191", "48-95,144-191", "48-95,144-191", "48-95,144-191"},
		},
		// Partial files with every GPU row: imported with warnings.
		{
			file: "a100-sxm-2gpu-slurm-slice-10nic_dask-cuda-issue-1358.partial.txt", gpus: 2,
			nics: []string{"NIC0", "NIC1", "NIC2", "NIC3", "NIC4", "NIC5", "NIC6", "NIC7", "NIC8", "NIC9"},
			pairs: []pair{{"GPU0", "GPU1", "NV12"}, {"GPU0", "NIC0", "PXB"}, {"GPU1", "NIC1", "PXB"},
				{"GPU0", "NIC2", "SYS"}, {"GPU1", "NIC9", "SYS"}},
			numa: []int{3, 3}, cpus: []string{"48-63,176-191", "48-63,176-191"},
			warnings: []string{"NIC rows missing: NIC3, NIC4, NIC5, NIC6, NIC7, NIC8, NIC9;", "no NIC Legend"},
		},
		{
			file: "hgx-h100-8gpu-10nic_nccl-issue-1264.partial.txt", gpus: 8,
			nics: []string{"NIC0", "NIC1", "NIC2", "NIC3", "NIC4", "NIC5", "NIC6", "NIC7", "NIC8", "NIC9"},
			pairs: []pair{{"GPU0", "GPU5", "NV18"}, {"GPU0", "NIC0", "PIX"}, {"GPU2", "NIC2", "PIX"},
				{"GPU3", "NIC5", "PIX"}, {"GPU7", "NIC9", "PIX"}, {"GPU0", "NIC3", "SYS"}, {"GPU4", "NIC4", "SYS"}},
			numa:     []int{0, 0, 0, 0, 1, 1, 1, 1},
			warnings: []string{"NIC rows missing: NIC3, NIC4, NIC5, NIC6, NIC7, NIC8, NIC9;"},
		},
		{
			file: "hgx-h100-8gpu-9nic_nccl-issue-1453.partial.txt", gpus: 8,
			nics: []string{"NIC0", "NIC1", "NIC2", "NIC3", "NIC4", "NIC5", "NIC6", "NIC7", "NIC8"},
			pairs: []pair{{"GPU0", "NIC8", "PIX"}, {"GPU3", "NIC5", "PIX"}, {"GPU4", "NIC4", "PIX"},
				{"GPU7", "NIC1", "PIX"}, {"GPU0", "NIC0", "SYS"}, {"GPU0", "NIC5", "NODE"}},
			numa:     []int{0, 0, 0, 0, 1, 1, 1, 1},
			cpus:     []string{"0-79", "0-79", "0-79", "0-79", "80-159", "80-159", "80-159", "80-159"},
			warnings: []string{"NIC rows missing: NIC6, NIC7, NIC8;"},
		},
	} {
		t.Run(tc.file, func(t *testing.T) {
			t.Parallel()
			n, err := parseFile(t, tc.file)
			if err != nil {
				t.Fatal(err)
			}
			if n.Source != tc.file {
				t.Errorf("Source %q", n.Source)
			}
			// The output names no generation: one there is inferred, and
			// says so.
			if n.NVLinkGen != 0 && !slices.ContainsFunc(n.Inferred, func(s string) bool {
				return strings.HasPrefix(s, fmt.Sprintf("NVLink %d, from ", n.NVLinkGen))
			}) {
				t.Errorf("NVLinkGen %d not read and not inferred: %q", n.NVLinkGen, n.Inferred)
			}
			if len(n.GPUs) != tc.gpus {
				t.Fatalf("%d GPUs, want %d", len(n.GPUs), tc.gpus)
			}
			var names []string
			for k, nic := range n.NICs {
				names = append(names, nic.Name)
				if nic.Index != k || nic.NUMA != -1 {
					t.Errorf("NIC%d: index %d NUMA %d, want %d and -1", k, nic.Index, nic.NUMA, k)
				}
			}
			if !slices.Equal(names, tc.nics) {
				t.Errorf("NICs %v, want %v", names, tc.nics)
			}
			if (n.NICPaths == nil) != (len(tc.nics) == 0) {
				t.Errorf("NICPaths %v with %d NICs", n.NICPaths, len(tc.nics))
			}
			for i, g := range n.GPUs {
				if g.Index != i {
					t.Errorf("GPU%d has index %d", i, g.Index)
				}
				if g.NUMA != tc.numa[i] {
					t.Errorf("GPU%d NUMA %d, want %d", i, g.NUMA, tc.numa[i])
				}
				if tc.cpus != nil && g.CPUAffinity != tc.cpus[i] {
					t.Errorf("GPU%d CPU affinity %q, want %q", i, g.CPUAffinity, tc.cpus[i])
				}
			}
			for _, p := range tc.pairs {
				if got := cell(t, n, p.a, p.b); got != p.want {
					t.Errorf("%s-%s = %s, want %s", p.a, p.b, got, p.want)
				}
			}
			if tc.warnings == nil && len(n.Warnings) > 0 {
				t.Errorf("unexpected warnings %q", n.Warnings)
			}
			for _, w := range tc.warnings {
				if !slices.ContainsFunc(n.Warnings, func(s string) bool { return strings.Contains(s, w) }) {
					t.Errorf("no warning says %q: %q", w, n.Warnings)
				}
			}
		})
	}
}

// Every partial file is either refused, naming the GPU rows that are cut or
// missing, or imported with a warning naming the missing NIC rows.
func TestPartial(t *testing.T) {
	t.Parallel()
	type refusal struct {
		cut         []string // rows cut short
		cutLine     int
		missingGPUs []string
		missingNICs []string
	}
	seq := func(prefix string, from, to int) []string {
		var s []string
		for i := from; i <= to; i++ {
			s = append(s, fmt.Sprintf("%s%d", prefix, i))
		}
		return s
	}
	cases := map[string]struct {
		refused *refusal
		warn    []string // imported: missing NIC rows named in a warning
	}{
		"a100-sxm-2gpu-slurm-slice-10nic_dask-cuda-issue-1358.partial.txt": {warn: seq("NIC", 3, 9)},
		"hgx-h100-8gpu-10nic_nccl-issue-1264.partial.txt":                  {warn: seq("NIC", 3, 9)},
		"hgx-h100-8gpu-9nic_nccl-issue-1453.partial.txt":                   {warn: seq("NIC", 6, 8)},
		"a800-class-8gpu-nv8-9nic_nccl-issue-933.partial.txt": {refused: &refusal{
			cut: []string{"GPU7"}, cutLine: 10, missingNICs: seq("NIC", 0, 8)}},
		"dgx-a100-40gb-8gpu-12nic_nccl-issue-1505.partial.txt": {refused: &refusal{
			cut: []string{"GPU4"}, cutLine: 8, missingGPUs: seq("GPU", 5, 7), missingNICs: seq("NIC", 0, 11)}},
		// Every cell of GPU7 is there, but its CPU Affinity ends in "24-47,".
		"dgx1-v100-cube-mesh_nccl-tests-issue-29.partial.txt": {refused: &refusal{
			cut: []string{"GPU7"}, cutLine: 10, missingNICs: []string{"mlx5_0", "mlx5_1"}}},
		// GPU4 has all its cells, the last cut: "0-23,4".
		"dgx2-v100-16gpu-nv6_nccl-tests-issue-78.partial.txt": {refused: &refusal{
			cut: []string{"GPU4"}, cutLine: 8, missingGPUs: seq("GPU", 5, 15), missingNICs: seq("mlx5_", 0, 9)}},
		"gb200-4gpu-tray_sglang-issue-11208.partial.txt": {refused: &refusal{
			cut: []string{"GPU3"}, cutLine: 6, missingNICs: seq("NIC", 0, 5)}},
		// GPU5 lacks its GPU NUMA ID cell.
		"h-class-8gpu-nv18-10nic_vllm-issue-29944.partial.txt": {refused: &refusal{
			cut: []string{"GPU5"}, cutLine: 8, missingGPUs: seq("GPU", 6, 7), missingNICs: seq("NIC", 0, 9)}},
		"h-class-8gpu-nv18-9nic-4numa_sglang-issue-13973.partial.txt": {refused: &refusal{
			cut: []string{"GPU6"}, cutLine: 9, missingGPUs: []string{"GPU7"}, missingNICs: seq("NIC", 0, 8)}},
		"hgx-h100-8gpu-6nic_ibm-pytorch-communication-benchmarks-issue-1.partial.txt": {refused: &refusal{
			cut: []string{"GPU7"}, cutLine: 11, missingNICs: seq("NIC", 0, 5)}},
		"hgx-h100-8gpu-6nic_nccl-issue-1357.partial.txt": {refused: &refusal{
			cut: []string{"GPU7"}, cutLine: 10, missingNICs: seq("NIC", 0, 5)}},
		// GPU4's last cell, a CPU list, may go on.
		"pascal-era-8gpu-pix-phb-mlx4_kubernetes-issue-53497.partial.txt": {refused: &refusal{
			cut: []string{"GPU4"}, cutLine: 7, missingGPUs: seq("GPU", 5, 7), missingNICs: []string{"mlx4_0"}}},
		"pcie-8gpu-all-sys-10nic_deepep-issue-128.partial.txt": {refused: &refusal{
			cut: []string{"GPU6"}, cutLine: 9, missingGPUs: []string{"GPU7"}, missingNICs: seq("NIC", 0, 9)}},
	}
	files := inputs(t, true, false)
	if len(files) != len(cases) {
		t.Errorf("%d partial files, %d cases", len(files), len(cases))
	}
	for _, f := range files {
		name := filepath.Base(f)
		tc, ok := cases[name]
		if !ok {
			t.Errorf("%s: no case", name)
			continue
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			n, err := parseFile(t, name)
			if tc.refused == nil {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				if len(n.Warnings) == 0 || !strings.Contains(n.Warnings[0], "NIC rows missing: "+strings.Join(tc.warn, ", ")+";") {
					t.Errorf("warnings %q do not name the missing NIC rows %v", n.Warnings, tc.warn)
				}
				return
			}
			if err == nil {
				t.Fatalf("imported: %d GPUs, warnings %q", len(n.GPUs), n.Warnings)
			}
			var inc *IncompleteError
			if !errors.As(err, &inc) {
				t.Fatalf("not an IncompleteError: %v", err)
			}
			var cut []string
			for _, c := range inc.Cut {
				cut = append(cut, c.Row)
			}
			want := tc.refused
			if !slices.Equal(cut, want.cut) || inc.CutLine != want.cutLine ||
				!slices.Equal(inc.MissingGPUs, want.missingGPUs) || !slices.Equal(inc.MissingNICs, want.missingNICs) {
				t.Errorf("cut %v at line %d, missing %v %v; want cut %v at line %d, missing %v %v",
					cut, inc.CutLine, inc.MissingGPUs, inc.MissingNICs, want.cut, want.cutLine, want.missingGPUs, want.missingNICs)
			}
			msg := err.Error()
			if !strings.HasPrefix(msg, name+":") {
				t.Errorf("error does not start with the file name: %s", msg)
			}
			for _, r := range want.cut {
				if !strings.Contains(msg, "row "+r+" ") {
					t.Errorf("error does not name the cut row %s: %s", r, msg)
				}
			}
			if len(want.missingGPUs) > 0 && !strings.Contains(msg, "missing GPU rows: "+strings.Join(want.missingGPUs, ", ")) {
				t.Errorf("error does not name the missing GPU rows: %s", msg)
			}
			if !strings.Contains(msg, "missing NIC rows: "+strings.Join(want.missingNICs, ", ")) {
				t.Errorf("error does not name the missing NIC rows: %s", msg)
			}
		})
	}
}

const t4 = `        GPU0    GPU1    GPU2    GPU3    CPU Affinity
GPU0     X      SYS     SYS     SYS     0-15,32-47
GPU1    SYS      X      NODE    NODE    16-31,48-63
GPU2    SYS     NODE     X      NODE    16-31,48-63
GPU3    SYS     NODE    NODE     X      16-31,48-63
`

const withNICs = "\tGPU0\tGPU1\tNIC0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n" +
	"GPU0\t X \tNV12\tPIX\t0-15\t0\t\tN/A\n" +
	"GPU1\tNV12\t X \tSYS\t16-31\t1\t\tN/A\n" +
	"NIC0\tPIX\tSYS\t X \n" +
	"\nLegend:\n\n  X    = Self\n\nNIC Legend:\n\n  NIC0: mlx5_0\n"

// Inputs that are not a valid output are refused, naming the line and what
// was expected.
func TestBadInput(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, in string
		want     []string // substrings of the error
	}{
		{"empty", "", []string{"t.txt: empty input"}},
		{"blank", " \n\t\n", []string{"t.txt: empty input"}},
		{"no header", "hello\nworld\n", []string{"t.txt: no column header"}},
		{"header missing", strings.SplitN(t4, "\n", 2)[1], []string{"t.txt:1:", "found the GPU0 row: the header line is missing"}},
		{"row too short", strings.Replace(t4, "GPU2    SYS     NODE     X      NODE    16-31,48-63", "GPU2    SYS     NODE     X", 1),
			[]string{"t.txt:4: row GPU2: expected 5 cells (4 GPU columns and CPU Affinity), got 3"}},
		{"row too long", strings.Replace(t4, "GPU1    SYS      X      NODE    NODE    16-31,48-63", "GPU1    SYS      X      NODE    NODE    NODE 16-31,48-63", 1),
			[]string{"t.txt:3: row GPU1: expected 5 cells (4 GPU columns and CPU Affinity), got 6"}},
		{"NIC row too short", strings.Replace(withNICs, "NIC0\tPIX\tSYS\t X \n", "NIC0\tPIX\tSYS\n", 1),
			[]string{"t.txt:4: row NIC0: expected 3 cells (2 GPU columns and 1 NIC column), got 2"}},
		{"NV alone", strings.Replace(t4, "GPU0     X      SYS ", "GPU0     X      NV  ", 1),
			[]string{"t.txt:2: row GPU0, column GPU1:", `"NV": expected X, NV#`}},
		{"FOO", strings.Replace(t4, "GPU3    SYS     NODE    NODE", "GPU3    SYS     FOO     NODE", 1),
			[]string{"t.txt:5: row GPU3, column GPU1:", `"FOO": expected`}},
		{"NV0", strings.Replace(withNICs, "GPU0\t X \tNV12", "GPU0\t X \tNV0", 1), []string{"t.txt:2: row GPU0, column GPU1:", `"NV0"`}},
		{"asymmetric GPUs", strings.Replace(withNICs, "GPU1\tNV12", "GPU1\tSYS", 1),
			[]string{"t.txt:2: GPU0-GPU1 is NV12 but GPU1-GPU0 is SYS (line 3)"}},
		{"asymmetric GPU-NIC", strings.Replace(withNICs, "NIC0\tPIX", "NIC0\tPHB", 1),
			[]string{"t.txt:2: GPU0-NIC0 is PIX but NIC0-GPU0 is PHB (line 4)"}},
		{"asymmetric t4", strings.Replace(t4, "GPU2    SYS     NODE", "GPU2    SYS     PHB ", 1),
			[]string{"t.txt:3: GPU1-GPU2 is NODE but GPU2-GPU1 is PHB (line 4)"}},
		{"duplicate row", t4 + "GPU1    SYS      X      NODE    NODE    16-31,48-63\n",
			[]string{"t.txt:6: row GPU1 again (first at line 3)"}},
		{"X off the diagonal", strings.Replace(strings.Replace(t4, "GPU0     X      SYS ", "GPU0     X      X   ", 1), "GPU1    SYS      X", "GPU1    X        X", 1),
			[]string{"t.txt:2: GPU0-GPU1 is X off the diagonal"}},
		{"no X on the diagonal", strings.Replace(t4, "GPU0     X ", "GPU0    SYS", 1),
			[]string{"t.txt:2: GPU0-GPU0 is SYS: expected X on the diagonal"}},
		{"NVLink to a NIC", strings.Replace(strings.Replace(withNICs, "\tPIX\t0-15", "\tNV2\t0-15", 1), "NIC0\tPIX", "NIC0\tNV2", 1),
			[]string{"t.txt:2: GPU0-NIC0 is NV2: NVLink does not reach a NIC"}},
		{"bad CPU affinity", strings.Replace(t4, "0-15,32-47", "0-15,", 1),
			[]string{`t.txt:2: row GPU0: CPU Affinity "0-15,": expected a CPU list`}},
		{"backwards CPU range", strings.Replace(t4, "0-15,32-47", "15-0", 1), []string{`CPU Affinity "15-0"`}},
		{"bad NUMA affinity", strings.Replace(withNICs, "16-31\t1", "16-31\tone", 1),
			[]string{`t.txt:3: row GPU1: NUMA Affinity "one": expected a NUMA node number`}},
		{"bad GPU NUMA ID", strings.Replace(withNICs, "16-31\t1\t\tN/A", "16-31\t1\t\t?", 1),
			[]string{`t.txt:3: row GPU1: GPU NUMA ID "?"`}},
		{"unknown column", strings.Replace(t4, "CPU Affinity", "CPU Affinity    Colour", 1),
			[]string{`t.txt:1: column "Colour" after CPU Affinity`}},
		{"GPU columns out of order", strings.Replace(t4, "GPU1    GPU2", "GPU2    GPU1", 1),
			[]string{"t.txt:1: column GPU2: expected GPU1"}},
		{"GPU after NICs", "\tGPU0\tNIC0\tGPU1\n", []string{"t.txt:1: column GPU1 after the NIC columns"}},
		{"duplicate NIC column", "\tGPU0\tmlx5_0\tmlx5_0\n", []string{"t.txt:1: column mlx5_0 twice"}},
		{"duplicate extra column", "\tGPU0\tCPU Affinity\tCPU Affinity\n", []string{"t.txt:1: column CPU Affinity twice"}},
		{"unknown row", strings.Replace(t4, "GPU3    SYS", "GPU9    SYS", 1),
			[]string{`t.txt:5: expected a row of the matrix (GPU0..GPU3) or a blank line, got "GPU9`}},
		{"legend names a NIC twice", withNICs + "  NIC0: mlx5_1\n", []string{"t.txt:13: NIC Legend names NIC0 mlx5_1, but line 12 names it mlx5_0"}},
		{"header alone", "\tGPU0\tGPU1\tCPU Affinity\n", []string{"t.txt: incomplete output", "missing GPU rows: GPU0, GPU1"}},
		{"GPU row missing, no cut mark", strings.Replace(t4, "GPU1    SYS      X      NODE    NODE    16-31,48-63\n", "", 1),
			[]string{"t.txt: incomplete output", "missing GPU rows: GPU1"}},
		{"last row cut, no cut mark", strings.TrimSuffix(t4, "NODE     X      16-31,48-63\n"),
			[]string{"t.txt:5: incomplete output", "row GPU3 at line 5 is cut: 2 of 5 cells (4 GPU columns and CPU Affinity)"}},
		{"cut within the last NV cell", "\tGPU0\tGPU1\n" + "GPU0\t X \tNV12\n" + "GPU1\tNV1\n[... cut ...]\n",
			[]string{"t.txt:3: incomplete output", "(the text is cut at line 4)", "row GPU1 at line 3 is cut: 1 of 2 cells"}},
		{"NV# could go on before a cut", "\tGPU0\tGPU1\n" + "GPU1\tNV1\t X\n" + "GPU0\t X \tNV1\n[... cut ...]\n",
			[]string{`row GPU0 at line 3 is cut: its last cell "NV1" may be the start of a longer value`}},
		{"hard errors with a cut", "\tGPU0\tGPU1\tGPU2\n" + "GPU0\t X \tFOO\tSYS\n" + "GPU1\tSYS\t X \tSYS\n[...]\n",
			[]string{"missing GPU rows: GPU2", `t.txt:2: row GPU0, column GPU1: "FOO"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			n, err := Parse("t.txt", []byte(tc.in))
			if err == nil {
				t.Fatalf("accepted:\n%s", render(n))
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error does not say %q:\n%v", w, err)
				}
			}
		})
	}
}

// Variants of a valid output that are read the same.
func TestVariants(t *testing.T) {
	t.Parallel()
	base, err := Parse("t.txt", []byte(withNICs))
	if err != nil {
		t.Fatal(err)
	}
	if len(base.NICs) != 1 || base.NICs[0].Name != "mlx5_0" || base.GPUs[1].NUMA != 1 || base.NICPaths[0][0].Class != topology.PIX ||
		base.GPUPaths[0][1] != (topology.Link{Class: topology.NV, NVLinks: 12}) || len(base.Warnings) != 0 {
		t.Fatalf("base:\n%s", render(base))
	}
	for _, tc := range []struct {
		name, in string
		check    func(*topology.Node) string
	}{
		{"CRLF", strings.ReplaceAll(withNICs, "\n", "\r\n"), nil},
		{"tabs expanded", expandTabs(withNICs), nil},
		{"prompt and note before", "# collected by hand\nuser@host:~$ nvidia-smi topo -m\n" + withNICs, nil},
		{"no legend after the matrix", strings.SplitN(withNICs, "\n\n", 2)[0] + "\n", func(n *topology.Node) string {
			if n.NICs[0].Name != "NIC0" || len(n.Warnings) != 1 || !strings.Contains(n.Warnings[0], "no NIC Legend names NIC0") {
				return fmt.Sprintf("name %q, warnings %q", n.NICs[0].Name, n.Warnings)
			}
			return ""
		}},
		{"legend right after the matrix", strings.Replace(withNICs, "\nLegend:", "Legend:", 1), nil},
		{"old driver device labels", strings.ReplaceAll(strings.SplitN(withNICs, "\n\n", 2)[0], "NIC0", "mlx5_0") + "\n", nil},
		{"SOC for SYS", strings.ReplaceAll(withNICs, "SYS", "SOC"), nil},
		{"lower case cells", strings.ReplaceAll(withNICs, "PIX", "pix"), nil},
		{"NIC row with affinity", strings.Replace(withNICs, "NIC0\tPIX\tSYS\t X \n", "NIC0\tPIX\tSYS\t X \t0-15\t0\t\tN/A\n", 1),
			func(n *topology.Node) string {
				if n.NICs[0].NUMA != 0 {
					return fmt.Sprintf("NIC0 NUMA %d, want 0", n.NICs[0].NUMA)
				}
				return ""
			}},
		{"NUMA affinity range: no single node", strings.Replace(withNICs, "16-31\t1", "16-31\t0-1", 1), func(n *topology.Node) string {
			if n.GPUs[1].NUMA != -1 || n.GPUs[1].CPUAffinity != "16-31" {
				return fmt.Sprintf("GPU1 NUMA %d CPUs %q, want -1 and 16-31", n.GPUs[1].NUMA, n.GPUs[1].CPUAffinity)
			}
			return ""
		}},
		{"NUMA affinity list", strings.Replace(withNICs, "16-31\t1", "16-31\t0,3-9,11-17", 1), func(n *topology.Node) string {
			if n.GPUs[1].NUMA != -1 {
				return fmt.Sprintf("GPU1 NUMA %d, want -1", n.GPUs[1].NUMA)
			}
			return ""
		}},
		{"CPU affinity N/A", strings.Replace(withNICs, "16-31", "N/A", 1), func(n *topology.Node) string {
			if n.GPUs[1].CPUAffinity != "" {
				return fmt.Sprintf("GPU1 CPUs %q, want none", n.GPUs[1].CPUAffinity)
			}
			return ""
		}},
		{"GPU NUMA ID is not the NUMA node", strings.Replace(withNICs, "16-31\t1\t\tN/A", "16-31\tN/A\t\t10", 1), func(n *topology.Node) string {
			if n.GPUs[1].NUMA != -1 {
				return fmt.Sprintf("GPU1 NUMA %d, want -1", n.GPUs[1].NUMA)
			}
			return ""
		}},
		{"legend names an absent NIC", withNICs + "  NIC1: mlx5_1\n", func(n *topology.Node) string {
			if len(n.Warnings) != 1 || !strings.Contains(n.Warnings[0], "NIC Legend names NIC1, which is not a column") {
				return fmt.Sprintf("warnings %q", n.Warnings)
			}
			return ""
		}},
		{"NIC row missing, no cut mark", strings.Replace(withNICs, "NIC0\tPIX\tSYS\t X \n", "", 1), func(n *topology.Node) string {
			if len(n.Warnings) != 1 || !strings.Contains(n.Warnings[0], "NIC rows missing: NIC0;") || n.NICPaths[0][0].Class != topology.PIX {
				return fmt.Sprintf("warnings %q", n.Warnings)
			}
			return ""
		}},
		{"NIC row cut", strings.Replace(withNICs, "NIC0\tPIX\tSYS\t X \n\n", "NIC0\tPIX\tSY\n[... cut ...]\n", 1), func(n *topology.Node) string {
			if len(n.Warnings) != 1 || !strings.Contains(n.Warnings[0], "(cut at line 5): NIC rows missing: NIC0 (cut at line 4);") {
				return fmt.Sprintf("warnings %q", n.Warnings)
			}
			return ""
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			n, err := Parse("t.txt", []byte(tc.in))
			if err != nil {
				t.Fatal(err)
			}
			if tc.check != nil {
				if msg := tc.check(n); msg != "" {
					t.Errorf("%s\n%s", msg, render(n))
				}
				return
			}
			if !reflect.DeepEqual(n, base) {
				t.Errorf("got\n%s\nwant\n%s", render(n), render(base))
			}
		})
	}
}

// expandTabs replaces tabs by spaces to the next multiple of 8, as a
// terminal or a web page shows them.
func expandTabs(s string) string {
	var b strings.Builder
	col := 0
	for _, r := range s {
		switch r {
		case '\t':
			for {
				b.WriteByte(' ')
				col++
				if col%8 == 0 {
					break
				}
			}
		case '\n':
			b.WriteRune(r)
			col = 0
		default:
			b.WriteRune(r)
			col++
		}
	}
	return b.String()
}

// Every file reads the same with its tabs expanded to spaces.
func TestTabsExpanded(t *testing.T) {
	t.Parallel()
	for _, f := range inputs(t, true, true) {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		name := filepath.Base(f)
		want, wantErr := Parse(name, data)
		got, gotErr := Parse(name, []byte(expandTabs(string(data))))
		if !reflect.DeepEqual(got, want) || fmt.Sprint(gotErr) != fmt.Sprint(wantErr) {
			t.Errorf("%s: with tabs expanded: %v, %v; as is: %v, %v", name, got, gotErr, want, wantErr)
		}
	}
}

// Every testdata file has its source in SOURCES.md.
func TestSources(t *testing.T) {
	t.Parallel()
	sources, err := os.ReadFile("testdata/SOURCES.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range inputs(t, true, true) {
		entry := "- `" + filepath.Base(f) + "`"
		i := strings.Index(string(sources), entry)
		if i < 0 || !strings.Contains(strings.SplitN(string(sources)[i:], "\n", 3)[1], "source: ") {
			t.Errorf("SOURCES.md has no source for %s", filepath.Base(f))
		}
	}
}

func FuzzParse(f *testing.F) {
	for _, file := range inputs(f, true, true) {
		data, err := os.ReadFile(file)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Add([]byte(t4))
	f.Add([]byte(withNICs))
	f.Fuzz(func(t *testing.T, data []byte) {
		n, err := Parse("fuzz.txt", data)
		if err != nil {
			if n != nil {
				t.Fatalf("node and error: %v", err)
			}
			if !strings.Contains(err.Error(), "fuzz.txt") {
				t.Fatalf("error does not name the file: %v", err)
			}
			return
		}
		if err := n.Validate(); err != nil {
			t.Fatalf("accepted node does not validate: %v\n%s", err, render(n))
		}
		if len(n.GPUs) == 0 || n.Source != "fuzz.txt" {
			t.Fatalf("%d GPUs, source %q", len(n.GPUs), n.Source)
		}
		for i, g := range n.GPUs {
			if g.Index != i || g.NUMA < -1 {
				t.Fatalf("GPU%d: index %d NUMA %d", i, g.Index, g.NUMA)
			}
		}
		if (n.NICPaths == nil) != (len(n.NICs) == 0) {
			t.Fatalf("%d NICs, NICPaths %v", len(n.NICs), n.NICPaths)
		}
		for i := range n.NICPaths {
			for k, l := range n.NICPaths[i] {
				if l.Class == topology.Unknown || l.Class == topology.Self || l.Class.NVLink() {
					t.Fatalf("GPU%d-NIC%d is %s", i, k, l)
				}
			}
		}
		_ = render(n)
	})
}
