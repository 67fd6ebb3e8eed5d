package e2e

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestSlurmConfBadClusterFile runs toposched slurm-conf on bad cluster
// files: it exits non-zero with an error naming the file, line and field
// (or the switch and field), and writes nothing. Slurm is not needed.
func TestSlurmConfBadClusterFile(t *testing.T) {
	needBinaries(t)
	dir := t.TempDir()
	node := filepath.Join(dir, "node.txt")
	writeSlurmFile(t, node, topoPairsBySocket)
	tests := []struct {
		name, cluster, want string
	}{
		{"no GPUs", "nodes:\n  - name: n1\n    gpus: 0\n",
			`cluster.yaml:2: nodes[0].gpus: expected 1 to 256 GPUs, got 0`},
		{"unknown field", "nodes:\n  - name: n1\n    gpu: 4\n",
			`field gpu not found`},
		{"missing node file", "nodes:\n  - name: n1\n    nvidia_smi: gone.txt\n",
			`cluster.yaml:2: nodes[0]: open ` + filepath.Join(dir, "gone.txt")},
		{"switch below no node", "nodes:\n  - {name: n1, nvidia_smi: node.txt}\nfabric:\n  switches:\n    - {name: leaf, tier: leaf, nodes: [n9]}\n",
			`cluster.yaml:5: fabric.switches[0].nodes: "n9" is not a node of this cluster`},
		{"switch name Slurm refuses", "nodes:\n  - {name: n1, nvidia_smi: node.txt}\nfabric:\n  switches:\n    - {name: \"leaf/1\", tier: leaf, nodes: [n1]}\n",
			`topology.conf: fabric: switch "leaf/1": name: expected at most 64 letters, digits, '.', '_', ':' or '-', as Slurm's SwitchName`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cluster := filepath.Join(dir, "cluster.yaml")
			writeSlurmFile(t, cluster, tt.cluster)
			out := t.TempDir()
			cmd := exec.Command(bins.toposched, "slurm-conf", "--cluster", cluster, "--out", out)
			cmd.Env = childEnv()
			b, err := cmd.CombinedOutput()
			var exit *exec.ExitError
			if !errors.As(err, &exit) || exit.ExitCode() != 1 {
				t.Fatalf("slurm-conf exited with %v, want status 1:\n%s", err, b)
			}
			if !strings.Contains(string(b), tt.want) {
				t.Errorf("slurm-conf said:\n%s\nwant it to contain %q", b, tt.want)
			}
			if entries, _ := os.ReadDir(out); len(entries) > 0 {
				t.Errorf("files written despite the error: %v", entries)
			}
		})
	}
}

// TestSlurmConfFromStream checks the other source of slurm-conf: without
// --cluster it reads the running operator's topology stream (signed in as
// topoctl is) and writes the same files as from the cluster file serve
// published. Slurm is not needed.
func TestSlurmConfFromStream(t *testing.T) {
	needBinaries(t)
	dir := t.TempDir()
	writeSlurmFile(t, filepath.Join(dir, "node.txt"), topoPairsBySocket)
	writeSlurmFile(t, filepath.Join(dir, "node-crossed.txt"), topoPairsCrossed)
	cluster := filepath.Join(dir, "cluster.yaml")
	writeSlurmFile(t, cluster, `name: slurm-stream
nodes:
  - {name: n1, nvidia_smi: node.txt, gpu_model: H100}
  - {name: n2, nvidia_smi: node-crossed.txt, gpu_model: H100}
  - {name: n3, nvidia_smi: node.txt, gpu_model: H100}
fabric:
  switches:
    - {name: spine, tier: spine, switches: [leaf-a, leaf-b]}
    - {name: leaf-a, tier: leaf, nodes: [n1, n2]}
    - {name: leaf-b, tier: leaf, nodes: [n3]}
`)
	fromFile := filepath.Join(dir, "from-file")
	if err := os.Mkdir(fromFile, 0o755); err != nil {
		t.Fatal(err)
	}
	if r := runCmd(t, time.Minute, childEnv(), bins.toposched, "slurm-conf", "--cluster", cluster, "--out", fromFile); r.code != 0 {
		t.Fatalf("slurm-conf --cluster: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}

	port := freePort(t)
	startServe(t, "serve", cluster, port, t.TempDir())
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)
	fromStream := filepath.Join(dir, "from-stream")
	if err := os.Mkdir(fromStream, 0o755); err != nil {
		t.Fatal(err)
	}
	// Discovery publishes the nodes one by one: wait until all are there.
	waitFor(t, time.Minute, func() (bool, string) {
		r := runCmd(t, time.Minute, clientEnv(url), bins.toposched, "slurm-conf", "--nats-url", url, "--out", fromStream)
		if r.code != 0 {
			return false, fmt.Sprintf("slurm-conf --nats-url: exit %d: %s", r.code, r.stderr)
		}
		for _, f := range []string{"gres.conf", "topology.conf"} {
			want, err1 := os.ReadFile(filepath.Join(fromFile, f))
			got, err2 := os.ReadFile(filepath.Join(fromStream, f))
			if err := errors.Join(err1, err2); err != nil || string(got) != string(want) {
				return false, fmt.Sprintf("%s from the stream:\n%s\nfrom the cluster file:\n%s(%v)", f, got, want, err)
			}
		}
		return true, ""
	})
	// And --check reads the stream as well.
	if r := runCmd(t, time.Minute, clientEnv(url), bins.toposched, "slurm-conf", "--nats-url", url, "--out", fromFile, "--check"); r.code != 0 || !strings.Contains(r.stdout, "agree with the cluster") {
		t.Fatalf("slurm-conf --nats-url --check: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
}

// Node layouts as nvidia-smi topo -m prints them: the cluster file imports
// them, and toposched slurm-conf turns them into gres.conf's Cores= and
// Links=.
const (
	// topoPairsBySocket is the howto's node: NVLink pairs (0,1) and (2,3),
	// GPUs 0-1 on NUMA node 0 (CPUs 0-3), 2-3 on NUMA node 1 (CPUs 4-7).
	topoPairsBySocket = `        GPU0    GPU1    GPU2    GPU3    CPU Affinity    NUMA Affinity
GPU0     X      NV2     SYS     SYS     0-3             0
GPU1    NV2      X      SYS     SYS     0-3             0
GPU2    SYS     SYS      X      NV2     4-7             1
GPU3    SYS     SYS     NV2      X      4-7             1
`
	// topoPairsCrossed has NVLink pairs (0,2) and (1,3) and every GPU
	// close to every CPU, so that only Links= can steer Slurm's choice.
	topoPairsCrossed = `        GPU0    GPU1    GPU2    GPU3    CPU Affinity    NUMA Affinity
GPU0     X      PHB     NV2     PHB     0-7             0
GPU1    PHB      X      PHB     NV2     0-7             0
GPU2    NV2     PHB      X      PHB     0-7             0
GPU3    PHB     NV2     PHB      X      0-7             0
`
)

func writeSlurmFile(t *testing.T, path, data string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}
