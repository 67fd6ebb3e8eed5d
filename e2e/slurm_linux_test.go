package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestSlurmStartsFromGeneratedFiles starts slurmctld and three slurmd with
// the gres.conf and topology.conf toposched slurm-conf wrote, as written,
// and checks that Slurm took them: every node idle with its four GPUs, the
// switch tree as the cluster file has it, and a two-node job getting its
// GPUs.
func TestSlurmStartsFromGeneratedFiles(t *testing.T) {
	c := startSlurm(t, []slurmNode{{"n1", topoPairsBySocket}, {"n2", topoPairsCrossed}, {"n3", topoPairsBySocket}})

	gres, err := os.ReadFile(filepath.Join(c.Dir, "etc", "gres.conf"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(gres), "written by toposched slurm-conf") {
		t.Fatalf("gres.conf is not toposched's:\n%s", gres)
	}
	t.Logf("gres.conf as toposched wrote it:\n%s", gres)

	out := c.mustRun(t, "sinfo", "-h", "-N", "-o", "%N %G")
	for _, n := range c.Nodes {
		if !strings.Contains(out, n+" gpu:h100:4(S:") {
			t.Errorf("sinfo: node %s lacks gpu:h100:4 with its sockets:\n%s", n, out)
		}
	}
	// n1's GPUs 0-1 are on socket 0 and 2-3 on socket 1 (Cores=0-3 and
	// 4-7); slurmctld shows the node's GRES per socket.
	if node := c.mustRun(t, "scontrol", "show", "node", "n1"); !strings.Contains(node, "Gres=gpu:h100:4(S:0-1)") {
		t.Errorf("scontrol show node n1: want Gres=gpu:h100:4(S:0-1):\n%s", node)
	}
	topo := c.mustRun(t, "scontrol", "show", "topology")
	for _, want := range []string{
		"SwitchName=leaf-n1 Level=0 LinkSpeed=1 Nodes=n1",
		"SwitchName=leaf-n2 Level=0 LinkSpeed=1 Nodes=n2",
		"SwitchName=leaf-n3 Level=0 LinkSpeed=1 Nodes=n3",
		"SwitchName=spine Level=1 LinkSpeed=1 Nodes=n[1-3] Switches=leaf-n[1-3]",
	} {
		if !strings.Contains(topo, want) {
			t.Errorf("scontrol show topology lacks %q:\n%s", want, topo)
		}
	}

	// A two-node step: each task sees two GPUs of its node.
	start := time.Now()
	out = c.mustRun(t, "srun", "-N2", "-w", "n1,n3", "--ntasks-per-node=1", "--gres=gpu:2",
		"bash", "-c", "echo $SLURMD_NODENAME CVD=$CUDA_VISIBLE_DEVICES")
	took := time.Since(start)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	slices.Sort(lines)
	if want := []string{"n1 CVD=0,1", "n3 CVD=0,1"}; !slices.Equal(lines, want) {
		t.Errorf("srun -N2 --gres=gpu:2: %q, want %q", lines, want)
	}
	t.Logf("srun -N2 --gres=gpu:2 (submit, run, end): %s", ms(took))
}

// TestSlurmLinksPickNVLinkPair checks that the Links= toposched writes
// steers Slurm's own choice of GPUs for a job toposched never saw: with a
// node's GPU 0 busy, a job asking for two GPUs gets the free NVLink pair,
// not the lowest free indices (1,2).
func TestSlurmLinksPickNVLinkPair(t *testing.T) {
	c := startSlurm(t, []slurmNode{{"n1", topoPairsBySocket}, {"n2", topoPairsCrossed}})
	tests := []struct {
		node string
		want []int
		why  string
	}{
		// The howto's case: pairs (0,1) and (2,3), each pair on its own
		// socket.
		{"n1", []int{2, 3}, "pairs (0,1),(2,3)"},
		// Pairs (0,2) and (1,3), every GPU close to every core: only
		// Links= tells 1,3 from the lowest free, 1,2 (without Links= this
		// node gets 1,2; n1 gets 2,3 from its sockets alone).
		{"n2", []int{1, 3}, "pairs (0,2),(1,3), no socket preference"},
	}
	for _, tt := range tests {
		hold := c.sbatch(t, "-w", tt.node, "-n1", "--gres=gpu:1", "-o", "/dev/null", "--wrap", "sleep 600")
		if got := c.waitRunning(t, hold).GPUs[tt.node]; !slices.Equal(got, []int{0}) {
			t.Fatalf("%s: the job holding one GPU got %v, want [0]", tt.node, got)
		}
		outFile := filepath.Join(c.Dir, "pair-"+tt.node+".out")
		start := time.Now()
		pair := c.sbatch(t, "-w", tt.node, "-n1", "--gres=gpu:2", "-o", outFile, "--wrap", "echo CVD=$CUDA_VISIBLE_DEVICES; sleep 600")
		job := c.waitRunning(t, pair)
		t.Logf("%s: sbatch to RUNNING (squeue): %s", tt.node, ms(time.Since(start)))
		if got := job.GPUs[tt.node]; !slices.Equal(got, tt.want) {
			t.Errorf("%s (%s), GPU 0 busy: Slurm gave a 2-GPU job GPUs %v, want the NVLink pair %v", tt.node, tt.why, got, tt.want)
		}
		// What the job itself sees agrees with squeue.
		var idx []string
		for _, g := range job.GPUs[tt.node] {
			idx = append(idx, strconv.Itoa(g))
		}
		want := "CVD=" + strings.Join(idx, ",")
		waitFor(t, slurmCallTimeout, func() (bool, string) {
			b, err := os.ReadFile(outFile)
			return strings.TrimSpace(string(b)) == want, fmt.Sprintf("%s: %q (%v), want %q", outFile, b, err, want)
		})
	}
}

// TestSlurmIndexTypesForceGPUs checks what --index-types is for: Slurm
// 22.05 cannot be asked for GPU indices, but with one GRES type per index
// a job asking for gpu:g1:1,gpu:g3:1 gets exactly GPUs 1 and 3.
func TestSlurmIndexTypesForceGPUs(t *testing.T) {
	c := startSlurm(t, []slurmNode{{"n1", topoPairsBySocket}}, "--index-types")
	if !strings.Contains(c.SlurmConfOutput, "Gres=gpu:g0:1,gpu:g1:1,gpu:g2:1,gpu:g3:1") {
		t.Fatalf("toposched slurm-conf --index-types: no per-index Gres=:\n%s", c.SlurmConfOutput)
	}
	hold := c.sbatch(t, "-w", "n1", "-n1", "--gres=gpu:1", "-o", "/dev/null", "--wrap", "sleep 600")
	if got := c.waitRunning(t, hold).GPUs["n1"]; !slices.Equal(got, []int{0}) {
		t.Fatalf("the job holding one GPU got %v, want [0]", got)
	}
	outFile := filepath.Join(c.Dir, "exact.out")
	exact := c.sbatch(t, "-w", "n1", "-n1", "--gres=gpu:g1:1,gpu:g3:1", "-o", outFile, "--wrap", "echo CVD=$CUDA_VISIBLE_DEVICES; sleep 600")
	if got := c.waitRunning(t, exact).GPUs["n1"]; !slices.Equal(got, []int{1, 3}) {
		t.Errorf("--gres=gpu:g1:1,gpu:g3:1 got GPUs %v, want [1 3]", got)
	}
	waitFor(t, slurmCallTimeout, func() (bool, string) {
		b, err := os.ReadFile(outFile)
		return strings.TrimSpace(string(b)) == "CVD=1,3", fmt.Sprintf("%s: %q (%v), want CVD=1,3", outFile, b, err)
	})
}
