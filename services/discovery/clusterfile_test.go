package discovery

import (
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite golden files")

func TestParseClusterGolden(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"lab.yaml", "lab.json"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			c, err := LoadCluster(filepath.Join("testdata", name))
			if err != nil {
				t.Fatal(err)
			}
			got, err := json.MarshalIndent(c, "", "  ")
			if err != nil {
				t.Fatal(err)
			}
			golden := filepath.Join("testdata", "lab.golden.json")
			if *update && name == "lab.yaml" {
				if err := os.WriteFile(golden, append(got, '\n'), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatal(err)
			}
			if strings.TrimSpace(string(got)) != strings.TrimSpace(string(want)) {
				t.Errorf("parsed cluster differs from %s (run with -update to accept):\n%s", golden, got)
			}
		})
	}
}

func TestParseClusterErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		src  string
		want []string
	}{
		{"empty", "", []string{"f.yaml:1", "nodes: expected a list"}},
		{"not yaml", "nodes: [", []string{"f.yaml", "yaml"}},
		{"unknown field", "nodes:\n  - name: a\n    gpu: 8\n", []string{"f.yaml", "line 3", "field gpu not found"}},
		{"zero gpus", "nodes:\n  - name: a\n    gpus: 0\n", []string{"f.yaml:2", "nodes[0].gpus: expected 1 to 256 GPUs, got 0"}},
		{"duplicate", "nodes:\n  - name: a\n    gpus: 8\n  - name: a\n    gpus: 8\n", []string{"f.yaml:4", `"a" already defined on line 2`}},
		{"bad name", "nodes:\n  - name: 'a b'\n    gpus: 8\n", []string{"f.yaml:2", "nodes[0].name: expected a host name"}},
		{"wrong type", "nodes:\n  - name: a\n    gpus: eight\n", []string{"f.yaml", "line 3", "eight"}},
		{"bad tier", "nodes:\n  - name: a\n    gpus: 8\nfabric:\n  switches:\n    - name: s\n      tier: top\n      nodes: [a, b]\n",
			[]string{"f.yaml:6", "tier: expected leaf, spine or core", `"b" is not a node`}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := ParseCluster("f.yaml", []byte(tc.src))
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

func TestParseClusterCountExpands(t *testing.T) {
	t.Parallel()
	c, err := ParseCluster("f.yaml", []byte("nodes:\n  - {name: n, count: 3, gpus: 4}\n  - {name: x, gpus: 2}\n"))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for i, n := range c.Nodes {
		names = append(names, n.Name)
		if n.Position != i {
			t.Errorf("%s: position %d, want %d", n.Name, n.Position, i)
		}
	}
	if got := strings.Join(names, ","); got != "n-001,n-002,n-003,x" {
		t.Fatalf("nodes %s", got)
	}
}

func FuzzParseCluster(f *testing.F) {
	for _, name := range []string{"lab.yaml", "lab.json"} {
		data, err := os.ReadFile(filepath.Join("testdata", name))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Add([]byte("nodes:\n  - {name: n, count: 3, gpus: 4}\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := ParseCluster("fuzz.yaml", data)
		if err != nil {
			return
		}
		seen := map[string]bool{}
		for _, n := range c.Nodes {
			if seen[n.Name] || len(n.GPUs) < 1 || len(n.GPUs) > MaxGPUsPerNode {
				t.Fatalf("accepted an invalid node %+v", n)
			}
			seen[n.Name] = true
		}
	})
}

func TestParseClusterModels(t *testing.T) {
	t.Parallel()
	c, err := ParseCluster("f.yaml", []byte("nodes:\n  - {name: a, model: dgx-h100}\n  - {name: b, model: pcie-8gpu, gpu_model: L40S}\n"))
	if err != nil {
		t.Fatal(err)
	}
	a, b := c.Nodes[0], c.Nodes[1]
	if len(a.GPUs) != 8 || a.GPUModel != "H100-SXM5-80GB" || a.GPUPaths[0][5] != "NV18" || len(a.NICs) != 8 {
		t.Fatalf("dgx-h100 node: %+v", a)
	}
	if b.GPUModel != "L40S" || b.GPUs[0].Model != "L40S" || b.GPUPaths[0][1] != "PIX" || b.GPUPaths[0][4] != "SYS" {
		t.Fatalf("pcie-8gpu node: %+v", b)
	}
	for _, tc := range []struct{ src, want string }{
		{"nodes:\n  - {name: a, model: dgx-z9}\n", `nodes[0].model: unknown node model "dgx-z9"`},
		{"nodes:\n  - {name: a, model: dgx-a100, gpus: 4}\n", "nodes[0].gpus: model dgx-a100 has 8 GPUs, got 4"},
	} {
		if _, err := ParseCluster("f.yaml", []byte(tc.src)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("error %v, want %q", err, tc.want)
		}
	}
}

func TestParseClusterNodeFiles(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	smi, err := os.ReadFile(filepath.Join("nvsmi", "testdata", "t4-4gpu-2socket-sys-node_nccl-issue-428.txt"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "t4.txt"), smi, 0o600); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "cluster.yaml")
	src := "nodes:\n  - {name: t4, count: 2, nvidia_smi: t4.txt, gpu_model: T4}\n"
	if err := os.WriteFile(file, []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := LoadCluster(file)
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Nodes) != 2 || len(c.Nodes[1].GPUs) != 4 || c.Nodes[1].GPUPaths[1][2] != "NODE" || c.Nodes[1].GPUs[0].Model != "T4" {
		t.Fatalf("nodes %+v", c.Nodes)
	}
	for _, tc := range []struct{ src, want string }{
		{"nodes:\n  - {name: a, nvidia_smi: missing.txt}\n", "cluster.yaml:2: nodes[0]: open"},
		{"nodes:\n  - {name: a, model: dgx-a100, nvidia_smi: t4.txt}\n", "expected at most one of model, nvidia_smi and nccl_xml"},
		{"nodes:\n  - {name: a, nvidia_smi: t4.txt, gpus: 8}\n", "t4.txt has 4 GPUs, got 8"},
	} {
		if _, err := ParseCluster(file, []byte(tc.src)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("error %v, want %q", err, tc.want)
		}
	}
}
