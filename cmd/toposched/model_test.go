package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const h100Topo = `        GPU0    GPU1    GPU2    GPU3    CPU Affinity    NUMA Affinity
GPU0     X      NV18    NV18    NV18    0-47    0
GPU1    NV18     X      NV18    NV18    0-47    0
GPU2    NV18    NV18     X      NV18    0-47    0
GPU3    NV18    NV18    NV18     X      0-47    0

Legend:

  X    = Self
  NV#  = Connection traversing a bonded set of # NVLinks
`

func TestParseBytes(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in   string
		want float64
		bad  bool
	}{
		{"1048576", 1 << 20, false}, {"128M", 128 << 20, false}, {"1G", 1 << 30, false}, {"1g", 1 << 30, false},
		{"2GiB", 2 << 30, false}, {"4K", 4096, false}, {"1GB", 1e9, false}, {"512B", 512, false},
		{"", 0, true}, {"-1", 0, true}, {"1X", 0, true}, {"G", 0, true},
	} {
		got, err := parseBytes(tc.in)
		if (err != nil) != tc.bad || (!tc.bad && got != tc.want) {
			t.Errorf("parseBytes(%q) = %v, %v", tc.in, got, err)
		}
	}
}

func runModel(t *testing.T, args ...string) (string, error) {
	t.Helper()
	root := newRoot()
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs(append([]string{"model"}, args...))
	err := root.Execute()
	return out.String(), err
}

func TestModelPredict(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	topo := filepath.Join(dir, "h100.txt")
	if err := os.WriteFile(topo, []byte(h100Topo), 0o600); err != nil {
		t.Fatal(err)
	}
	cluster := filepath.Join("..", "..", "deploy", "examples", "cluster.yaml")
	for _, tc := range []struct {
		name    string
		args    []string
		algo    string
		minBus  float64
		wantErr string
	}{
		{"ring on 4 GPUs", []string{"--topology", topo, "--bytes", "1G", "--algorithm", "ring"}, "ring", 300, ""},
		{"auto on 2 GPUs", []string{"--topology", topo, "--bytes", "128M", "--gpus", "0,2"}, "", 100, ""},
		{"all_gather", []string{"--topology", topo, "--bytes", "1G", "--collective", "all_gather"}, "", 300, ""},
		{"cluster tree", []string{"--cluster", cluster, "--nodes", "2", "--gpus-per-node", "8", "--bytes", "1G", "--algorithm", "tree"}, "tree", 40, ""},
		{"cluster hierarchical", []string{"--cluster", cluster, "--nodes", "4", "--gpus-per-node", "8", "--bytes", "1G", "--algorithm", "hierarchical"}, "hierarchical", 10, ""},
		{"no source", []string{"--bytes", "1G"}, "", 0, "exactly one of"},
		{"bad bytes", []string{"--topology", topo, "--bytes", "lots"}, "", 0, "--bytes"},
		{"bad collective", []string{"--topology", topo, "--bytes", "1G", "--collective", "broadcast"}, "", 0, "--collective"},
		{"bad gpu", []string{"--topology", topo, "--bytes", "1G", "--gpus", "0,9"}, "", 0, "GPU 9"},
		// nvidia-smi names no NVLink generation: NV18 on every pair says
		// NVLink 4 through NVSwitches, where NVLS runs.
		{"nvls, generation inferred", []string{"--topology", topo, "--bytes", "1G", "--algorithm", "nvls"}, "nvls", 300, ""},
		{"too many nodes", []string{"--cluster", cluster, "--nodes", "99", "--bytes", "1G"}, "", 0, "--nodes 99"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			out, err := runModel(t, append([]string{"predict", "--format", "json"}, tc.args...)...)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var r struct {
				TimeSeconds float64 `json:"time_seconds"`
				BusBW       float64 `json:"busbw_gbps"`
				Algorithm   string  `json:"algorithm"`
			}
			if err := json.Unmarshal([]byte(out), &r); err != nil {
				t.Fatalf("%v: %s", err, out)
			}
			if r.TimeSeconds <= 0 || r.BusBW < tc.minBus || (tc.algo != "" && r.Algorithm != tc.algo) {
				t.Errorf("got %+v, want algorithm %q and busbw >= %v", r, tc.algo, tc.minBus)
			}
		})
	}
	out, err := runModel(t, "predict", "--topology", topo, "--bytes", "1G")
	if err != nil || !strings.Contains(out, "busbw:") || !strings.Contains(out, "GB/s") {
		t.Errorf("text output %q, %v", out, err)
	}
}

func TestModelValidate(t *testing.T) {
	t.Parallel()
	// The project's copy, through a directory given explicitly.
	dir := filepath.Join("..", "..", "internal", "collective", "testdata")
	out, err := runModel(t, "validate", dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"gb200-3x-nvl8-tree", "large messages (>= 128 MB): median", "held"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	out, err = runModel(t, "validate", dir, "--format", "json")
	if err != nil {
		t.Fatal(err)
	}
	var s struct {
		Rows []json.RawMessage `json:"rows"`
		Held bool              `json:"large_targets_held"`
	}
	if err := json.Unmarshal([]byte(out), &s); err != nil || len(s.Rows) < 10 || !s.Held {
		t.Errorf("json %v rows %d held %v", err, len(s.Rows), s.Held)
	}
	if _, err := runModel(t, "validate", t.TempDir()); err == nil {
		t.Error("empty directory: no error")
	}
}

// The cross-collective section of model validate is golden: the model is
// deterministic, so a change to any of its figures shows in review (go
// test ./cmd/toposched -run TestModelValidateCrossCollective -update
// rewrites it).
func TestModelValidateCrossCollective(t *testing.T) {
	t.Parallel()
	dir := filepath.Join("..", "..", "internal", "collective", "testdata")
	out, err := runModel(t, "validate", dir)
	if err != nil {
		t.Fatal(err)
	}
	start := strings.Index(out, "\ncross-collective transfer:")
	if start < 0 {
		t.Fatalf("no cross-collective section:\n%s", out)
	}
	section := out[start+1:]
	section = section[:strings.Index(section, "\n\n")+1]
	golden := filepath.Join("testdata", "validate-cross-collective.golden")
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(golden, []byte(section), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if section != string(want) {
		t.Errorf("cross-collective section differs from %s (-update rewrites it):\n%s", golden, section)
	}
	out, err = runModel(t, "validate", dir, "--format", "json")
	if err != nil {
		t.Fatal(err)
	}
	var s struct {
		Cross struct {
			Pairs  []json.RawMessage `json:"pairs"`
			Median float64           `json:"median_abs_error"`
			Count  int               `json:"count"`
		} `json:"cross_collective"`
		Held *bool `json:"cross_collective_target_held"`
	}
	if err := json.Unmarshal([]byte(out), &s); err != nil || len(s.Cross.Pairs) == 0 || s.Cross.Count == 0 || s.Held == nil {
		t.Errorf("json %v: %+v", err, s)
	}
}
