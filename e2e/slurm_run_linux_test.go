package e2e

// topoctl run --slurm and topoctl slurm-args on a real Slurm, with serve
// beside it placing on a cluster file of the same nodes.

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// slurmServe is serve beside a Slurm cluster, on the cluster file of the
// same nodes (or cluster, when given).
type slurmServe struct {
	*slurmCluster
	url string
}

func startSlurmServe(t *testing.T, c *slurmCluster, cluster string) *slurmServe {
	t.Helper()
	if cluster == "" {
		cluster = c.ClusterFile
	}
	port := freePort(t)
	// No policies: the shipped leaf_span keeps a 4-GPU job on one leaf,
	// and these jobs are spread over two nodes on purpose.
	startServe(t, "serve", cluster, port, filepath.Join(t.TempDir(), "data"), "--policies", "none")
	return &slurmServe{slurmCluster: c, url: fmt.Sprintf("nats://127.0.0.1:%d", port)}
}

// topoctl runs topoctl with Slurm's clients pointed at this cluster.
func (s *slurmServe) topoctl(t *testing.T, args ...string) result {
	t.Helper()
	return runCmd(t, 2*time.Minute, clientEnv(s.url, "SLURM_CONF="+s.Conf, s.marker()), bins.topoctl, append([]string{"--nats-url", s.url}, args...)...)
}

// writeSlurmJob writes a job file of gpus H100s, perNode a node, running
// script with sh.
func writeSlurmJob(t *testing.T, dir, id string, gpus, perNode int, script string) string {
	t.Helper()
	path := filepath.Join(dir, id+".yaml")
	body := fmt.Sprintf("job_id: %s\ngpus: %d\ngpus_per_node: %d\ngpu_model: H100\ncommand: /bin/sh\nargs: [\"-c\", %q]\n", id, gpus, perNode, script)
	writeSlurmFile(t, path, body)
	return path
}

// decidedTable reads the NODE / RANKS / CUDA_VISIBLE_DEVICES table topoctl
// prints for a decision: node → CUDA_VISIBLE_DEVICES.
func decidedTable(out string, nodes []string) map[string]string {
	got := map[string]string{}
	for line := range strings.SplitSeq(out, "\n") {
		f := strings.Fields(line)
		if len(f) == 3 && slices.Contains(nodes, f[0]) {
			got[f[0]] = f[2]
		}
	}
	return got
}

// waitSqueueEmpty waits until Slurm holds no job: nothing was left behind.
func (c *slurmCluster) waitSqueueEmpty(t *testing.T) {
	t.Helper()
	waitFor(t, slurmCallTimeout, func() (bool, string) {
		out := c.mustRun(t, "squeue", "-h", "-o", "%i %j %T %k")
		return strings.TrimSpace(out) == "", "squeue: " + out
	})
}

// explain is topoctl explain JOB's output.
func (s *slurmServe) explain(t *testing.T, id string) string {
	t.Helper()
	r := s.topoctl(t, "explain", id)
	return r.stdout + r.stderr
}

// TestSlurmRun runs a 2-node job through topoctl run --slurm: every rank
// runs on its decided node with its decided GPUs and rank, the exit status
// comes back, and afterwards Slurm holds nothing and toposched has freed
// the GPUs (a job of all 8 GPUs is placed next, and fails with its
// command's exit status).
func TestSlurmRun(t *testing.T) {
	c := startSlurm(t, []slurmNode{{"n1", topoPairsBySocket}, {"n2", topoPairsBySocket}}, "--index-types")
	s := startSlurmServe(t, c, "")
	dir := t.TempDir()
	script := fmt.Sprintf(`echo "node=$SLURMD_NODENAME local=$LOCAL_RANK cvd=$CUDA_VISIBLE_DEVICES world=$WORLD_SIZE master=$MASTER_ADDR:$MASTER_PORT name=$SLURM_JOB_NAME" > %s/rank-$RANK; echo "hello from rank $RANK"`, dir)
	job := writeSlurmJob(t, dir, "slurm-2n", 4, 2, script)
	r := s.topoctl(t, "run", "--slurm", job)
	if r.code != 0 {
		t.Fatalf("topoctl run --slurm: exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}
	decided := decidedTable(r.stderr, c.Nodes)
	if len(decided) != 2 {
		t.Fatalf("decision table: %v, want both nodes:\n%s", decided, r.stderr)
	}
	for _, want := range []string{"hello from rank 0", "hello from rank 3"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("output has no %q:\n%s", want, r.stdout)
		}
	}
	// Ranks 0,1 on the decision's first node, 2,3 on its second.
	order := []string{}
	for line := range strings.SplitSeq(r.stderr, "\n") {
		if f := strings.Fields(line); len(f) == 3 && slices.Contains(c.Nodes, f[0]) {
			order = append(order, f[0])
		}
	}
	for rank := range 4 {
		b, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("rank-%d", rank)))
		if err != nil {
			t.Errorf("rank %d wrote nothing: %v", rank, err)
			continue
		}
		node := order[rank/2]
		gpus := strings.Split(decided[node], ",")
		// map_gpu gives each local rank its one GPU.
		want := fmt.Sprintf("node=%s local=%d cvd=%s world=4 master=%s:", node, rank%2, gpus[rank%2], order[0])
		if got := strings.TrimSpace(string(b)); !strings.HasPrefix(got, want) || !strings.HasSuffix(got, "name=slurm-2n") {
			t.Errorf("rank %d: %q, want %q...name=slurm-2n", rank, got, want)
		}
	}
	c.waitSqueueEmpty(t)
	if out := s.explain(t, "slurm-2n"); !strings.Contains(out, "succeeded (ranks_exited)") {
		t.Errorf("topoctl explain slurm-2n: not finished succeeded:\n%s", out)
	}

	// Every GPU of both nodes: placed only if the first job's are free.
	all := writeSlurmJob(t, dir, "slurm-all", 8, 4, `echo "rank $RANK on $SLURMD_NODENAME"; exit 3`)
	r = s.topoctl(t, "run", "--slurm", all)
	if r.code == 0 {
		t.Fatalf("topoctl run --slurm of a command exiting 3: exit 0\nstdout:\n%s\nstderr:\n%s", r.stdout, r.stderr)
	}
	if !strings.Contains(r.stderr, "slurm-all: failed") || strings.Count(r.stdout, "rank ") != 8 {
		t.Errorf("a failing job: stderr has no 'slurm-all: failed', or not 8 ranks ran:\nstdout:\n%s\nstderr:\n%s", r.stdout, r.stderr)
	}
	c.waitSqueueEmpty(t)
	if out := s.explain(t, "slurm-all"); !strings.Contains(out, "failed (rank_failed): srun: exit status 3") {
		t.Errorf("topoctl explain slurm-all: not finished failed:\n%s", out)
	}
}

// TestSlurmRunBadInput: a decided node Slurm does not know, GPUs Slurm
// cannot be asked for by index, and slurmctld down are each an error
// naming the node or the daemon; nothing is left in Slurm and the
// toposched job is finished (or never submitted).
func TestSlurmRunBadInput(t *testing.T) {
	c := startSlurm(t, []slurmNode{{"n1", topoPairsBySocket}, {"n2", topoPairsBySocket}}, "--index-types")
	// serve's cluster has a third node, n3, that Slurm has not.
	writeSlurmFile(t, filepath.Join(c.Dir, "n3-topo.txt"), topoPairsBySocket)
	cluster := filepath.Join(c.Dir, "cluster-n3.yaml")
	writeSlurmFile(t, cluster, `name: slurm-e2e
nodes:
  - {name: n1, nvidia_smi: n1-topo.txt, gpu_model: H100}
  - {name: n2, nvidia_smi: n2-topo.txt, gpu_model: H100}
  - {name: n3, nvidia_smi: n3-topo.txt, gpu_model: H100}
fabric:
  switches:
    - {name: spine, tier: spine, switches: [leaf-n1, leaf-n2, leaf-n3]}
    - {name: leaf-n1, tier: leaf, nodes: [n1]}
    - {name: leaf-n2, tier: leaf, nodes: [n2]}
    - {name: leaf-n3, tier: leaf, nodes: [n3]}
`)
	s := startSlurmServe(t, c, cluster)
	dir := t.TempDir()
	marker := filepath.Join(dir, "ran")
	job := writeSlurmJob(t, dir, "slurm-n3", 12, 4, "touch "+marker)
	r := s.topoctl(t, "run", "--slurm", job)
	if r.code == 0 || !strings.Contains(r.stderr, "node n3: Slurm does not know it") {
		t.Errorf("a decision on n3: exit %d, want an error naming n3\nstderr:\n%s", r.code, r.stderr)
	}
	c.waitSqueueEmpty(t)
	if out := s.explain(t, "slurm-n3"); !strings.Contains(out, "failed (launch_failed)") {
		t.Errorf("topoctl explain slurm-n3: not finished failed:\n%s", out)
	}
	// Its GPUs are free again: a job of all 12 is placed once more.
	job = writeSlurmJob(t, dir, "slurm-n3-again", 12, 4, "touch "+marker)
	if r := s.topoctl(t, "run", "--slurm", job); !strings.Contains(r.stderr, "slurm-n3-again: decided") {
		t.Errorf("the next job of 12 GPUs was not decided (the first one's GPUs leaked?):\n%s", r.stderr)
	}
	if _, err := os.Stat(marker); err == nil {
		t.Errorf("a rank ran although the decision named a node Slurm does not know")
	}

	// slurmctld down: refused before anything is submitted.
	c.ctld.stop(t)
	job = writeSlurmJob(t, dir, "slurm-noctld", 4, 2, "touch "+marker)
	r = s.topoctl(t, "run", "--slurm", job)
	if r.code == 0 || !strings.Contains(r.stderr, "slurmctld: not answering") {
		t.Errorf("slurmctld down: exit %d, want an error naming slurmctld\nstderr:\n%s", r.code, r.stderr)
	}
	if out := s.explain(t, "slurm-noctld"); !strings.Contains(out, "no events for job slurm-noctld") {
		t.Errorf("slurmctld down: the job reached toposched:\n%s", out)
	}
}

// TestSlurmRunGPUTypes: a Slurm whose gres.conf has one type for every GPU
// cannot be asked for the decided indices; topoctl run --slurm says so,
// naming the node and GPU, and finishes the job.
func TestSlurmRunGPUTypes(t *testing.T) {
	c := startSlurm(t, []slurmNode{{"n1", topoPairsBySocket}, {"n2", topoPairsBySocket}})
	s := startSlurmServe(t, c, "")
	dir := t.TempDir()
	job := writeSlurmJob(t, dir, "slurm-types", 2, 2, "true")
	r := s.topoctl(t, "run", "--slurm", job)
	if r.code == 0 || !strings.Contains(r.stderr, ": Slurm has no GRES gpu:g") || !strings.Contains(r.stderr, "--index-types") {
		t.Errorf("no per-index types: exit %d, want an error naming the node and GPU\nstderr:\n%s", r.code, r.stderr)
	}
	c.waitSqueueEmpty(t)
	if out := s.explain(t, "slurm-types"); !strings.Contains(out, "failed (launch_failed)") {
		t.Errorf("topoctl explain slurm-types: not finished failed:\n%s", out)
	}
}

// TestSlurmRunSubmitToRunning prints how long a 2-node job takes from
// submission to its first process running, through topoctl run --slurm
// and through Slurm's own sbatch, side by side on the same cluster (for
// BENCHMARKS.md; nothing is asserted on the figures).
func TestSlurmRunSubmitToRunning(t *testing.T) {
	c := startSlurm(t, []slurmNode{{"n1", topoPairsBySocket}, {"n2", topoPairsBySocket}}, "--index-types")
	s := startSlurmServe(t, c, "")
	dir := t.TempDir()
	const runs = 5
	var ours, theirs []time.Duration
	started := func(file string, begin time.Time) time.Duration {
		var at time.Duration
		waitFor(t, slurmStartTimeout, func() (bool, string) {
			st, err := os.Stat(file)
			if err != nil {
				return false, file + " not written"
			}
			at = st.ModTime().Sub(begin)
			return true, ""
		})
		return at
	}
	for i := range runs {
		file := filepath.Join(dir, fmt.Sprintf("topoctl-%d", i))
		job := writeSlurmJob(t, dir, fmt.Sprintf("bench-%d", i), 4, 2, `[ "$RANK" = 0 ] && touch `+file+`; true`)
		begin := time.Now()
		if r := s.topoctl(t, "run", "--slurm", job); r.code != 0 {
			t.Fatalf("topoctl run --slurm: exit %d\n%s", r.code, r.stderr)
		}
		ours = append(ours, started(file, begin))
		c.waitSqueueEmpty(t)

		file = filepath.Join(dir, fmt.Sprintf("sbatch-%d", i))
		begin = time.Now()
		c.sbatch(t, "-N2", "-w", "n1,n2", "--ntasks-per-node=2", "--gres=gpu:2", "-o", "/dev/null", "--wrap", "touch "+file)
		theirs = append(theirs, started(file, begin))
		c.waitSqueueEmpty(t)
	}
	t.Logf("submit-to-running of a 2-node job (4 GPUs), %d runs each:", runs)
	for i := range runs {
		t.Logf("  run %d: topoctl run --slurm %s   sbatch %s   difference %s", i+1, ms(ours[i]), ms(theirs[i]), ms(ours[i]-theirs[i]))
	}
	med := func(d []time.Duration) time.Duration {
		s := slices.Clone(d)
		slices.Sort(s)
		return s[len(s)/2]
	}
	t.Logf("  median: topoctl run --slurm %s   sbatch %s", ms(med(ours)), ms(med(theirs)))
}

// TestSlurmRunHeterogeneous: GPUs 0,1 of one node are held by a job placed
// by toposched and started by the sbatch script topoctl slurm-args prints
// (Slurm gives it exactly the decided GPUs), so a 2-node job next is
// decided on different GPUs per node and runs as a heterogeneous Slurm job,
// each rank on its decided node and GPU with RANK = SLURM_PROCID.
func TestSlurmRunHeterogeneous(t *testing.T) {
	c := startSlurm(t, []slurmNode{{"n1", topoPairsBySocket}, {"n2", topoPairsBySocket}}, "--index-types")
	s := startSlurmServe(t, c, "")
	dir := t.TempDir()

	hold := writeSlurmJob(t, dir, "hold", 2, 2, "sleep 600")
	if r := s.topoctl(t, "submit", "--wait", hold); r.code != 0 {
		t.Fatalf("topoctl submit hold: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	r := s.topoctl(t, "slurm-args", "hold", "--format", "sbatch")
	if r.code != 0 {
		t.Fatalf("topoctl slurm-args hold: exit %d\n%s", r.code, r.stderr)
	}
	script := filepath.Join(dir, "hold.sbatch")
	writeSlurmFile(t, script, r.stdout)
	var node string
	var want []int
	for line := range strings.SplitSeq(r.stdout, "\n") {
		if v, ok := strings.CutPrefix(line, "#SBATCH --nodelist="); ok {
			node = v
		}
		if v, ok := strings.CutPrefix(line, "#SBATCH --gres="); ok {
			for g := range strings.SplitSeq(v, ",") {
				var i int
				if _, err := fmt.Sscanf(g, "gpu:g%d:1", &i); err != nil {
					t.Fatalf("--gres=%s: %v", v, err)
				}
				want = append(want, i)
			}
		}
	}
	held := c.waitRunning(t, c.sbatch(t, "-o", "/dev/null", script))
	if got := held.GPUs[node]; !slices.Equal(got, want) || len(held.Nodes) != 1 {
		t.Fatalf("the slurm-args sbatch script got %v on %v, want GPUs %v of %s:\n%s", held.GPUs, held.Nodes, want, node, r.stdout)
	}

	out := fmt.Sprintf(`echo "node=$SLURMD_NODENAME procid=$SLURM_PROCID cvd=$CUDA_VISIBLE_DEVICES" > %s/rank-$RANK`, dir)
	job := writeSlurmJob(t, dir, "het", 4, 2, out)
	r = s.topoctl(t, "run", "--slurm", job)
	if r.code != 0 {
		t.Fatalf("topoctl run --slurm: exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}
	decided := decidedTable(r.stderr, c.Nodes)
	var order []string
	for line := range strings.SplitSeq(r.stderr, "\n") {
		if f := strings.Fields(line); len(f) == 3 && slices.Contains(c.Nodes, f[0]) {
			order = append(order, f[0])
		}
	}
	if len(order) != 2 || decided[order[0]] == decided[order[1]] {
		t.Fatalf("the job was not decided on different GPUs of two nodes:\n%s", r.stderr)
	}
	for rank := range 4 {
		b, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("rank-%d", rank)))
		if err != nil {
			t.Errorf("rank %d wrote nothing: %v", rank, err)
			continue
		}
		node := order[rank/2]
		want := fmt.Sprintf("node=%s procid=%d cvd=%s", node, rank, strings.Split(decided[node], ",")[rank%2])
		if got := strings.TrimSpace(string(b)); got != want {
			t.Errorf("rank %d: %q, want %q", rank, got, want)
		}
	}
	// squeue without --json lists pending, running and completing jobs
	// only: the hold alone is left.
	waitFor(t, slurmCallTimeout, func() (bool, string) {
		out := strings.TrimSpace(c.mustRun(t, "squeue", "-h", "-o", "%i %T"))
		return out == fmt.Sprintf("%d RUNNING", held.ID), "squeue: " + out
	})
}

// TestSlurmRunCancel: Ctrl-C on topoctl run --slurm of a running job stops
// the Slurm job (srun cancels it on SIGTERM), exits 130, and finishes the
// toposched job as cancelled.
//
// Ctrl-C waits until every rank has started, not merely until squeue says
// RUNNING: Slurm shows RUNNING once the allocation exists, before srun's
// step is launched, and Slurm 22.05 with proctrack/linuxproc (the test
// cluster's) does not kill tasks of a step cancelled half launched: they
// outlive the job, which stays COMPLETING for a minute.
func TestSlurmRunCancel(t *testing.T) {
	c := startSlurm(t, []slurmNode{{"n1", topoPairsBySocket}, {"n2", topoPairsBySocket}}, "--index-types")
	s := startSlurmServe(t, c, "")
	dir := t.TempDir()
	started := filepath.Join(dir, "started")
	job := writeSlurmJob(t, dir, "long", 4, 2, "touch "+started+".$SLURM_PROCID; exec sleep 600")
	p := startProc(t, "topoctl run --slurm", clientEnv(s.url, "SLURM_CONF="+c.Conf, c.marker()), bins.topoctl,
		"--nats-url", s.url, "run", "--slurm", job)
	waitFor(t, slurmStartTimeout, func() (bool, string) {
		mustBeAlive(t, p)
		ranks, _ := filepath.Glob(started + ".*")
		out := strings.TrimSpace(c.mustRun(t, "squeue", "-h", "-o", "%j %T"))
		return len(ranks) == 4 && out == "long RUNNING", fmt.Sprintf("%d of 4 ranks started; squeue: %s", len(ranks), out)
	})
	p.signal(t, os.Interrupt)
	if code := p.waitExit(t, slurmCallTimeout); code != 130 {
		t.Errorf("topoctl run --slurm after Ctrl-C: exit %d, want 130\n%s", code, p.output())
	}
	c.waitSqueueEmpty(t)
	if out := s.explain(t, "long"); !strings.Contains(out, "cancelled (cancelled)") {
		t.Errorf("topoctl explain long: not finished cancelled:\n%s", out)
	}
}

// TestSlurmRunGPUBeyondGres: serve's cluster file gives n1 eight GPUs,
// Slurm's gres.conf four: a decision on GPUs 4-7 of n1 is refused naming
// the node and the GPU, and the job is finished as failed.
func TestSlurmRunGPUBeyondGres(t *testing.T) {
	c := startSlurm(t, []slurmNode{{"n1", topoPairsBySocket}, {"n2", topoPairsBySocket}}, "--index-types")
	var topo strings.Builder
	topo.WriteString("      ")
	for i := range 8 {
		fmt.Fprintf(&topo, "  GPU%d", i)
	}
	topo.WriteString("  CPU Affinity  NUMA Affinity\n")
	for i := range 8 {
		fmt.Fprintf(&topo, "GPU%d", i)
		for j := range 8 {
			if i == j {
				topo.WriteString("     X")
			} else {
				topo.WriteString("   NV2")
			}
		}
		topo.WriteString("  0-7  0\n")
	}
	writeSlurmFile(t, filepath.Join(c.Dir, "n1-8-topo.txt"), topo.String())
	cluster := filepath.Join(c.Dir, "cluster-8.yaml")
	writeSlurmFile(t, cluster, `name: slurm-e2e
nodes:
  - {name: n1, nvidia_smi: n1-8-topo.txt, gpu_model: H100}
  - {name: n2, nvidia_smi: n2-topo.txt, gpu_model: H100}
fabric:
  switches:
    - {name: spine, tier: spine, switches: [leaf-n1, leaf-n2]}
    - {name: leaf-n1, tier: leaf, nodes: [n1]}
    - {name: leaf-n2, tier: leaf, nodes: [n2]}
`)
	s := startSlurmServe(t, c, cluster)
	job := writeSlurmJob(t, t.TempDir(), "eight", 8, 8, "true")
	r := s.topoctl(t, "run", "--slurm", job)
	if r.code == 0 || !strings.Contains(r.stderr, "node n1: GPU 4: Slurm has no GRES gpu:g4 there") {
		t.Errorf("GPUs beyond n1's GRES: exit %d, want an error naming n1 and GPU 4\nstderr:\n%s", r.code, r.stderr)
	}
	c.waitSqueueEmpty(t)
	if out := s.explain(t, "eight"); !strings.Contains(out, "failed (launch_failed)") {
		t.Errorf("topoctl explain eight: not finished failed:\n%s", out)
	}
}
