package e2e

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
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
