package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// A job toposched has pending while topoctl run --slurm waits stands in
// Slurm's queue as a held placeholder: seen in squeue, cancelled with
// scancel.

// slurmHeldSetup is a Slurm with serve's Slurm sync service beside it and
// a native sbatch job holding every GPU of both nodes, held in toposched
// too, so that a toposched job waits. It returns the cluster, serve's
// client side and the native job's id; the native job ends with the test.
func slurmHeldSetup(t *testing.T) (*slurmServe, int) {
	t.Helper()
	c := startSlurm(t, []slurmNode{{"n1", topoPairsBySocket}, {"n2", topoPairsBySocket}}, "--index-types")
	// No policies: the jobs are spread over both nodes on purpose.
	serve, url := startSlurmSync(t, c, "--policies", "none")
	native := c.sbatch(t, "-N2", "-w", "n1,n2", "--ntasks-per-node=1", "--gres=gpu:4", "-J", "native", "-o", "/dev/null", "--wrap", untilStopped(c, "native"))
	// Registered after the cluster's: run before its jobs are cancelled,
	// so that the batch script's loop ends even if a scancel missed it.
	t.Cleanup(func() { stop(t, c, "native") })
	c.waitRunning(t, native)
	js := jsConnect(t, url)
	for _, n := range c.Nodes {
		waitHeld(t, js, serve, n, []int{0, 1, 2, 3})
	}
	return &slurmServe{slurmCluster: c, url: url}, native
}

// waitPlaceholder waits until squeue shows the held placeholder of
// toposched job id, named for it, with the link to it, and returns its
// Slurm job id.
func waitPlaceholder(t *testing.T, s *slurmServe, p *proc, id string) int {
	t.Helper()
	var hold int
	waitFor(t, slurmStartTimeout, func() (bool, string) {
		mustBeAlive(t, p)
		out := s.mustRun(t, "squeue", "-h", "-o", "%i|%j|%T|%r|%k")
		for line := range strings.SplitSeq(strings.TrimSpace(out), "\n") {
			f := strings.Split(line, "|")
			if len(f) == 5 && f[1] == id && f[2] == "PENDING" && strings.HasPrefix(f[3], "JobHeld") && f[4] == "toposched-job="+id+" (placeholder)" {
				hold, _ = strconv.Atoi(f[0])
				t.Logf("squeue -o '%%i|%%j|%%T|%%r|%%k': %s", line)
				return true, ""
			}
		}
		return false, "squeue: " + out + "\ntopoctl:\n" + p.output()
	})
	return hold
}

// slurmState is a Slurm job's state, in whatever state it is.
func slurmState(t *testing.T, c *slurmCluster, id int) string {
	t.Helper()
	return strings.TrimSpace(c.mustRun(t, "squeue", "-h", "-t", "all", "-j", strconv.Itoa(id), "-o", "%T"))
}

// TestSlurmRunHeld: with every GPU held by a native sbatch job, topoctl
// run --slurm of a job leaves it pending in toposched and shows it held in
// squeue; once the native job is scancelled the placeholder is cancelled,
// and the job runs on its decided GPUs and succeeds (the sync service does
// not take the placeholder's end for the job's).
func TestSlurmRunHeld(t *testing.T) {
	s, native := slurmHeldSetup(t)
	dir := t.TempDir()
	job := writeSlurmJob(t, dir, "waits", 4, 2, fmt.Sprintf(`echo "node=$SLURMD_NODENAME cvd=$CUDA_VISIBLE_DEVICES" > %s/rank-$RANK`, dir))
	p := startProc(t, "topoctl run --slurm", clientEnv(s.url, "SLURM_CONF="+s.Conf, s.marker()), bins.topoctl,
		"--nats-url", s.url, "run", "--slurm", job)
	hold := waitPlaceholder(t, s, p, "waits")
	if out := s.explain(t, "waits"); !strings.Contains(out, "pending") {
		t.Errorf("topoctl explain waits: not pending while its placeholder is held:\n%s", out)
	}

	s.mustRun(t, "scancel", strconv.Itoa(native))
	if code := p.waitExit(t, slurmStartTimeout); code != 0 {
		t.Fatalf("topoctl run --slurm: exit %d\n%s", code, p.output())
	}
	out := p.output()
	if !strings.Contains(out, fmt.Sprintf("waits in Slurm's queue as held job %d", hold)) {
		t.Errorf("topoctl did not say which Slurm job holds its place:\n%s", out)
	}
	if st := slurmState(t, s.slurmCluster, hold); st != "CANCELLED" {
		t.Errorf("placeholder %d: %s, want CANCELLED", hold, st)
	}
	decided := decidedTable(out, s.Nodes)
	var order []string
	for line := range strings.SplitSeq(out, "\n") {
		if f := strings.Fields(line); len(f) == 3 && decided[f[0]] != "" {
			order = append(order, f[0])
		}
	}
	if len(order) != 2 {
		t.Fatalf("decision table: %v, want both nodes:\n%s", decided, out)
	}
	for rank := range 4 {
		b, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("rank-%d", rank)))
		if err != nil {
			t.Errorf("rank %d wrote nothing: %v", rank, err)
			continue
		}
		node := order[rank/2]
		want := fmt.Sprintf("node=%s cvd=%s", node, strings.Split(decided[node], ",")[rank%2])
		if got := strings.TrimSpace(string(b)); got != want {
			t.Errorf("rank %d: %q, want %q", rank, got, want)
		}
	}
	s.waitSqueueEmpty(t)
	if out := s.explain(t, "waits"); !strings.Contains(out, "succeeded (ranks_exited)") {
		t.Errorf("topoctl explain waits: not finished succeeded:\n%s", out)
	}
}

// TestSlurmRunHeldCancel: a scancel of the placeholder cancels the job
// (topoctl exits as on Ctrl-C, explain says cancelled), and Ctrl-C on a
// job that waits removes its placeholder.
func TestSlurmRunHeldCancel(t *testing.T) {
	s, _ := slurmHeldSetup(t)
	dir := t.TempDir()
	marker := filepath.Join(dir, "ran")
	env := clientEnv(s.url, "SLURM_CONF="+s.Conf, s.marker())

	job := writeSlurmJob(t, dir, "scancelled", 4, 2, "touch "+marker)
	p := startProc(t, "topoctl run --slurm", env, bins.topoctl, "--nats-url", s.url, "run", "--slurm", job)
	hold := waitPlaceholder(t, s, p, "scancelled")
	s.mustRun(t, "scancel", strconv.Itoa(hold))
	if code := p.waitExit(t, slurmCallTimeout); code != 130 {
		t.Errorf("topoctl run --slurm after its placeholder's scancel: exit %d, want 130\n%s", code, p.output())
	}
	if want := fmt.Sprintf("placeholder Slurm job %d is CANCELLED in Slurm", hold); !strings.Contains(p.output(), want) {
		t.Errorf("topoctl did not say %q:\n%s", want, p.output())
	}
	if out := s.explain(t, "scancelled"); !strings.Contains(out, "cancelled (cancelled)") {
		t.Errorf("topoctl explain scancelled: not finished cancelled:\n%s", out)
	}

	job = writeSlurmJob(t, dir, "interrupted", 4, 2, "touch "+marker)
	p = startProc(t, "topoctl run --slurm", env, bins.topoctl, "--nats-url", s.url, "run", "--slurm", job)
	hold = waitPlaceholder(t, s, p, "interrupted")
	p.signal(t, os.Interrupt)
	if code := p.waitExit(t, slurmCallTimeout); code != 130 {
		t.Errorf("topoctl run --slurm after Ctrl-C: exit %d, want 130\n%s", code, p.output())
	}
	if st := slurmState(t, s.slurmCluster, hold); st != "CANCELLED" {
		t.Errorf("placeholder %d after Ctrl-C: %s, want CANCELLED", hold, st)
	}
	if out := s.explain(t, "interrupted"); !strings.Contains(out, "cancelled (cancelled)") {
		t.Errorf("topoctl explain interrupted: not finished cancelled:\n%s", out)
	}
	if _, err := os.Stat(marker); err == nil {
		t.Errorf("a rank of a cancelled job ran")
	}
}
