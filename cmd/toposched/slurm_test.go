package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// slurmConf runs toposched slurm-conf with args.
func slurmConf(args ...string) (string, error) {
	var out bytes.Buffer
	root := newRoot()
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs(append([]string{"slurm-conf"}, args...))
	err := root.Execute()
	return out.String(), err
}

const pairsCluster = "../../internal/formats/slurmconf/testdata/pairs.yaml"

// TestSlurmConf writes the files for the howto's cluster, checks them as
// package slurmconf's golden files, then --check agrees, and sees a
// changed Links and a moved node.
func TestSlurmConf(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	out, err := slurmConf("--cluster", pairsCluster, "--out", dir)
	if err != nil {
		t.Fatalf("slurm-conf: %v\n%s", err, out)
	}
	for _, want := range []string{"wrote " + filepath.Join(dir, "gres.conf") + ": 2 nodes", "TopologyPlugin=topology/tree", "NodeName=n[1-2] ... Gres=gpu:h100:4"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	for _, f := range []string{"gres.conf", "topology.conf"} {
		got, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		want, err := os.ReadFile(filepath.Join("../../internal/formats/slurmconf/testdata/golden", "pairs."+f))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s differs from package slurmconf's golden pairs.%s:\n%s", f, f, got)
		}
	}
	if out, err := slurmConf("--cluster", pairsCluster, "--out", dir, "--check"); err != nil || !strings.Contains(out, "agree with the cluster") {
		t.Fatalf("--check on the files just written: %v\n%s", err, out)
	}

	gres := filepath.Join(dir, "gres.conf")
	data, err := os.ReadFile(gres)
	if err != nil {
		t.Fatal(err)
	}
	data = bytes.Replace(data, []byte("nvidia2 Cores=4-7 Links=0,0,-1,2"), []byte("nvidia2 Cores=4-7 Links=0,0,-1,0"), 1)
	data = bytes.Replace(data, []byte("nvidia3 Cores=4-7 Links=0,0,2,-1"), []byte("nvidia3 Cores=4-7 Links=0,0,0,-1"), 1)
	if err := os.WriteFile(gres, data, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "topology.conf"), []byte("SwitchName=s1 Nodes=n[1-2]\nSwitchName=s2\nSwitchName=top Switches=s[1-2]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = slurmConf("--cluster", pairsCluster, "--out", dir, "--check")
	if err == nil {
		t.Fatal("--check on changed files gave no error")
	}
	for _, want := range []string{
		"node n1: gpu 2: Links: gres.conf (line 9) gives 0,0,-1,0, the cluster 0,0,-1,2",
		"node n2: gpu 3: Links: gres.conf (line 10) gives 0,0,0,-1, the cluster 0,0,2,-1",
		"switch s1: Nodes: topology.conf gives n1,n2, the cluster n1",
		"switch s2: Nodes: topology.conf gives none, the cluster n2",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("--check error lacks %q:\n%v", want, err)
		}
	}
}

// TestSlurmConfErrors checks that bad input is refused with the field at
// fault named, and that nothing is written.
func TestSlurmConfErrors(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("nodes:\n  - name: n1\n    gpus: 0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"no cluster", nil, "slurm-conf: give --cluster FILE, or --nats-url of a running operator to read its topology"},
		{"bad cluster file", []string{"--cluster", bad}, bad + ":2: nodes[0].gpus: expected 1 to 256 GPUs, got 0"},
		{"threads without cores", []string{"--cluster", pairsCluster, "--threads-per-core", "2"}, "slurm-conf: --threads-per-core 2 needs --cores-per-node"},
		{"device format", []string{"--cluster", pairsCluster, "--device-format", "/dev/gpu"}, `device format: expected a path with one %d`},
		{"affinity beyond the cores", []string{"--cluster", pairsCluster, "--cores-per-node", "4"}, `node n1: gpu 2: cpu_affinity: expected CPUs below 4 (4 cores x 1 threads per core), got CPU 4 in "4-7"`},
		{"check without files", []string{"--cluster", pairsCluster, "--check"}, "gres.conf: no such file or directory"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			out := t.TempDir()
			_, err := slurmConf(append(tt.args, "--out", out)...)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want one containing %q", err, tt.want)
			}
			if entries, _ := os.ReadDir(out); len(entries) > 0 {
				t.Errorf("files written despite the error: %v", entries)
			}
		})
	}
}
