package clusterfile

import (
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/toposched/toposched/internal/topology"
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
			[]string{"f.yaml:6", "tier: expected leaf, spine, core or nvlink", `"b" is not a node`}},
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
	smi, err := os.ReadFile(filepath.Join("..", "nvsmi", "testdata", "t4-4gpu-2socket-sys-node_nccl-issue-428.txt"))
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

// TestParseClusterRailFabric reads a rail-optimized cluster file and asks
// the fabric for paths between its DGX A100 GPUs: GPU g's nearest NIC is
// NIC g, wired to the leaf of rail g.
func TestParseClusterRailFabric(t *testing.T) {
	t.Parallel()
	c, err := LoadCluster(filepath.Join("testdata", "superpod.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Fabric.Switches) != 19 || c.Fabric.Cluster != "superpod" {
		t.Fatalf("fabric %+v", c.Fabric)
	}
	leaf := c.Fabric.Switches[3]
	if leaf.Name != "pod-1-rail-0" || leaf.Rail == nil || *leaf.Rail != 0 || leaf.LinkGbps != 200 ||
		leaf.Uplinks != 1 || leaf.UplinkGbps != 200 || leaf.Oversubscription != 2 {
		t.Fatalf("leaf %+v", leaf)
	}
	f, err := topology.NewFabric(c.Fabric)
	if err != nil {
		t.Fatal(err)
	}
	nodes := map[string]*topology.Node{}
	for _, ev := range c.Nodes {
		n, err := topology.FromEvent(ev)
		if err != nil {
			t.Fatal(err)
		}
		nodes[n.Name] = n
	}
	if l, ok := f.LeafOf("dgx-003", 5); !ok || l != "pod-2-rail-5" {
		t.Errorf("LeafOf(dgx-003, 5) = %q, %v", l, ok)
	}
	if got, want := f.Domains("dgx-002"), "leaf:pod-1-rail-0 pod:pod-1 core:core"; strings.Join(got, " ") != want {
		t.Errorf("Domains(dgx-002) = %q", got)
	}
	bw := topology.DefaultBandwidths()
	tests := []struct {
		a       string
		ga      int
		b       string
		gb      int
		class   topology.Class
		gbps    float64
		latency float64
	}{
		{"dgx-001", 0, "dgx-001", 7, topology.NV, 300, 0.6},
		{"dgx-001", 0, "dgx-002", 0, topology.NET, 25, 1.2 + 2.0 + 1.2},   // rail 0 leaf
		{"dgx-001", 0, "dgx-002", 1, topology.NET, 12.5, 1.2 + 3.0 + 1.2}, // rails 0 and 1: pod spine
		{"dgx-001", 6, "dgx-004", 6, topology.NET, 12.5, 1.2 + 4.0 + 1.2}, // the other pod: core
	}
	for _, tc := range tests {
		p := topology.GPUPath(f, nodes[tc.a], tc.ga, nodes[tc.b], tc.gb, bw)
		if p.Class != tc.class || p.BandwidthGBps != tc.gbps || math.Abs(p.LatencyUS-tc.latency) > 1e-9 {
			t.Errorf("GPUPath(%s/%d, %s/%d) = %v %v GB/s %v µs; want %v %v GB/s %v µs", tc.a, tc.ga, tc.b, tc.gb,
				p.Link, p.BandwidthGBps, p.LatencyUS, tc.class, tc.gbps, tc.latency)
		}
	}
}

func TestParseClusterFabricErrors(t *testing.T) {
	t.Parallel()
	nodes := "nodes:\n  - {name: a, gpus: 8}\n  - {name: b, gpus: 8}\n"
	tests := []struct {
		name string
		src  string
		want []string
	}{
		{"bad rates", nodes + "fabric:\n  switches:\n    - {name: l, tier: leaf, nodes: [a], link_gbps: -1, uplink_gbps: -2, uplinks: -3, oversubscription: 0.5}\n",
			[]string{"f.yaml:6: fabric.switches[0].link_gbps: expected a rate in Gb/s of at least 0, got -1",
				"f.yaml:6: fabric.switches[0].uplink_gbps: expected a rate in Gb/s of at least 0, got -2",
				"f.yaml:6: fabric.switches[0].uplinks: expected a number of links of at least 0, got -3",
				"f.yaml:6: fabric.switches[0].oversubscription: expected a ratio of at least 1 (or 0, not given), got 0.5"}},
		{"bad rails", nodes + "fabric:\n  switches:\n    - {name: l, tier: leaf, nodes: [a], rail: -1}\n    - {name: s, tier: spine, switches: [l], rail: 2}\n",
			[]string{"f.yaml:6: fabric.switches[0].rail: expected a rail number of at least 0, got -1",
				"f.yaml:7: fabric.switches[1].rail: expected a rail on a leaf only, got rail 2 on a spine"}},
		{"cycle", nodes + "fabric:\n  switches:\n    - {name: l, tier: leaf, nodes: [a]}\n    - {name: c1, tier: core, switches: [c2, l]}\n    - {name: c2, tier: core, switches: [c1]}\n",
			[]string{`f.yaml:4: fabric: switch "c1": cycle c1 -> c2 -> c1`}},
		{"tier order", nodes + "fabric:\n  switches:\n    - {name: l, tier: leaf, nodes: [a]}\n    - {name: c, tier: core, switches: [l]}\n    - {name: s, tier: spine, switches: [c]}\n",
			[]string{`f.yaml:4: fabric: switch "s": tier inconsistent: core "c" is below spine "s"`}},
		{"node under two leaves", nodes + "fabric:\n  switches:\n    - {name: l1, tier: leaf, nodes: [a, b]}\n    - {name: l2, tier: leaf, nodes: [b]}\n",
			[]string{`f.yaml:4: fabric: switch "l2": node "b" below both "l1" and "l2"`}},
		{"two sources", nodes + "fabric:\n  slurm: topology.conf\n  switches:\n    - {name: l1, tier: leaf, nodes: [a]}\n",
			[]string{"f.yaml:4: fabric: expected one of switches, slurm and clos_csv, got switches and slurm"}},
		{"two imports", nodes + "fabric: {slurm: a.conf, clos_csv: b.csv}\n",
			[]string{"f.yaml:4: fabric: expected one of switches, slurm and clos_csv, got slurm and clos_csv"}},
		{"missing import", nodes + "fabric:\n  slurm: missing.conf\n", []string{"f.yaml:5: fabric.slurm: open missing.conf"}},
		{"unknown key", nodes + "fabric:\n  slurm_conf: x\n", []string{"f.yaml", "field slurm_conf not found"}},
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
					t.Errorf("error\n%v\ndoes not contain %q", err, w)
				}
			}
		})
	}
}

// TestParseClusterFabricImport imports the fabric from a Slurm
// topology.conf or a Clos table next to the cluster file.
func TestParseClusterFabricImport(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(name, data string) string {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	write("tree.conf", "SwitchName=l1 Nodes=n[1-2]\nSwitchName=l2 Nodes=n[2-3],cpu1\nSwitchName=top Switches=l[1-2]\n")
	write("bad.conf", "SwitchName=l1 Nodes=n[1-2]\nSwitchName=top Switches=l[1-3]\n")
	write("clos.csv", "ip,DSW,PSW,ASW\nn1,c1,p1,s1\nn2,c1,p1,s2\nn3,c1,p2,s1\n")
	nodes := "name: lab\nnodes:\n  - {name: n1, gpus: 8}\n  - {name: n2, gpus: 8}\n  - {name: n3, gpus: 8}\n"

	c, err := LoadCluster(write("slurm.yaml", nodes+"fabric:\n  slurm: tree.conf\n"))
	if err != nil {
		t.Fatal(err)
	}
	if c.Fabric.Cluster != "lab" || len(c.Fabric.Switches) != 3 || c.Fabric.Switches[2].Tier != "spine" ||
		!slices.Equal(c.Fabric.Switches[1].Nodes, []string{"n3", "cpu1"}) {
		t.Errorf("fabric %+v", c.Fabric)
	}
	conf := filepath.Join(dir, "tree.conf")
	wantWarnings := []string{
		conf + `:2: Nodes: node "n2" is below both l1 (line 1) and l2 (line 2): kept below l1, the first (Slurm only warns)`,
		filepath.Join(dir, "slurm.yaml") + ":7: fabric.slurm: " + conf + " names 1 node that is not a node of this cluster: cpu1",
	}
	if !slices.Equal(c.Fabric.Warnings, wantWarnings) {
		t.Errorf("warnings =\n%q\nwant\n%q", c.Fabric.Warnings, wantWarnings)
	}

	c, err = LoadCluster(write("clos.yaml", nodes+"fabric: {clos_csv: clos.csv}\n"))
	if err != nil {
		t.Fatal(err)
	}
	f, err := topology.NewFabric(c.Fabric)
	if err != nil {
		t.Fatal(err)
	}
	if sw, tier, hops := f.Common("n1", "n3"); sw != "c1" || tier != "core" || hops != 6 || len(c.Fabric.Warnings) != 0 {
		t.Errorf("Common(n1, n3) = %q %q %d; warnings %q", sw, tier, hops, c.Fabric.Warnings)
	}

	_, err = LoadCluster(write("bad.yaml", nodes+"fabric:\n  slurm: bad.conf\n"))
	if want := "bad.yaml:7: fabric.slurm: " + filepath.Join(dir, "bad.conf") + `:2: Switches: expected switches defined in this file, got "l2"`; err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("error %v, want %q", err, want)
	}
}

// TestParseClusterCirce imports the real DGX-2 SuperPOD topology.conf for
// a cluster of its 98 nodes: it lists circe-n051 under two leaves (a
// warning) and names "n019" and "n020", which the cluster lacks (the file
// means circe-n019 and circe-n020; also a warning).
func TestParseClusterCirce(t *testing.T) {
	t.Parallel()
	conf, err := filepath.Abs(filepath.Join("..", "fabric", "testdata", "slurm", "nvidia-circe-dgx2-superpod_slurm-superpod-topology.conf.txt"))
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	b.WriteString("name: circe\nnodes:\n")
	for i := 1; i <= 98; i++ {
		fmt.Fprintf(&b, "  - {name: circe-n%03d, gpus: 16}\n", i)
	}
	fmt.Fprintf(&b, "fabric:\n  slurm: %s\n", conf)
	c, err := ParseCluster("circe.yaml", []byte(b.String()))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		conf + `:5: Nodes: node "circe-n051" is below both s2 (line 3) and s4 (line 5): kept below s2, the first (Slurm only warns)`,
		"circe.yaml:102: fabric.slurm: " + conf + " names 2 nodes that are not nodes of this cluster: n019, n020",
	}
	if !slices.Equal(c.Fabric.Warnings, want) {
		t.Errorf("warnings =\n%q\nwant\n%q", c.Fabric.Warnings, want)
	}
	f, err := topology.NewFabric(c.Fabric)
	if err != nil {
		t.Fatal(err)
	}
	// Five leaves and nothing above them: islands.
	if _, tier, _ := f.Common("circe-n041", "circe-n051"); tier != "leaf" {
		t.Errorf("circe-n041 and circe-n051 share tier %q, want their leaf s2", tier)
	}
	if _, tier, _ := f.Common("circe-n001", "circe-n041"); tier != topology.TierNone {
		t.Errorf("circe-n001 and circe-n041 share tier %q, want none", tier)
	}
}
