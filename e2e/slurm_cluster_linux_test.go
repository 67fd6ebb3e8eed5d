package e2e

// A real Slurm for the Slurm scenarios: one slurmctld and one slurmd per
// node, all on this host (Debian's slurm-wlm 22.05 is built with
// multiple-slurmd: `slurmd -N <node>`), on free loopback ports, with fake
// GPUs (character devices made with mknod in the test's directory, which
// slurmd only stats), auth/none and no cgroups. gres.conf and
// topology.conf are what `toposched slurm-conf` writes for a cluster file
// of those nodes; slurm.conf is the one of shared/howto/slurm. Every job
// runs as a local process, so `hostname` is the same on all "nodes":
// SLURMD_NODENAME tells them apart.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

const (
	// slurmStartTimeout bounds the cluster's start: about a second on two
	// idle cores, but a swapping machine once took 40 s (the howto).
	slurmStartTimeout = 2 * time.Minute
	// slurmCallTimeout bounds one client call (sinfo, squeue, sbatch...);
	// killing one early only makes errors, so it is generous.
	slurmCallTimeout = time.Minute
	// slurmGPUs is the number of fake GPUs of every node.
	slurmGPUs = 4
	// nvidiaMajor is the NVIDIA driver's character device major number.
	nvidiaMajor = 195
)

// slurmNode is one node of a test cluster: its name and its GPUs' layout
// (one of the topo* constants).
type slurmNode struct {
	name, topo string
}

// slurmCluster is a running Slurm.
type slurmCluster struct {
	// Dir holds the configuration (etc/), state, spool, device files
	// (dev/) and the daemons' logs.
	Dir string
	// Conf is slurm.conf's path: SLURM_CONF of every client.
	Conf string
	// ClusterFile is the toposched cluster file the Slurm files come from.
	ClusterFile string
	// Nodes are the node names, in the cluster file's order.
	Nodes []string
	// SlurmConfOutput is what toposched slurm-conf printed.
	SlurmConfOutput string

	ctld *kubeProc
}

// needSlurm skips the test where a real Slurm cannot run: it needs root
// (mknod for the fake GPUs, slurmd as root) and Debian's slurm-wlm.
func needSlurm(t *testing.T) {
	t.Helper()
	needBinaries(t)
	if os.Geteuid() != 0 {
		t.Skip("github.com/toposched/toposched/e2e: a real Slurm needs root (mknod of the fake GPUs, slurmd): run as root with slurm-wlm installed (.ci/run installs it)")
	}
	var missing []string
	for _, bin := range []string{"slurmctld", "slurmd", "sinfo", "squeue", "sbatch", "srun", "scancel", "scontrol"} {
		if _, err := exec.LookPath(bin); err != nil {
			missing = append(missing, bin)
		}
	}
	if len(missing) > 0 {
		t.Skipf("github.com/toposched/toposched/e2e: Slurm is not installed (%s not on PATH): apt-get install slurm-wlm (Debian's 22.05; .ci/run installs it when root)", strings.Join(missing, ", "))
	}
}

// startSlurm writes a cluster file of nodes (each below a leaf switch of
// its own, the leaves under one spine), has toposched slurm-conf write
// gres.conf and topology.conf from it (confArgs are added to its flags),
// writes slurm.conf, starts slurmctld and one slurmd per node, and returns
// once sinfo shows every node idle. The daemons are stopped when the test
// ends, after every job is cancelled, and their logs printed if it failed.
func startSlurm(t *testing.T, nodes []slurmNode, confArgs ...string) *slurmCluster {
	t.Helper()
	needSlurm(t)
	begin := time.Now()
	// Not t.TempDir(): slurmstepd makes Unix sockets in the spool
	// directory, whose paths may not exceed 107 bytes, and test names
	// make t.TempDir() long.
	dir, err := os.MkdirTemp("", "slurm-e2e-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := os.RemoveAll(dir); err != nil {
			t.Errorf("remove %s: %v", dir, err)
		}
	})
	c := &slurmCluster{Dir: dir, Conf: filepath.Join(dir, "etc", "slurm.conf"), ClusterFile: filepath.Join(dir, "cluster.yaml")}
	for _, d := range []string{"etc", "state", "dev", "log"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for i := range slurmGPUs {
		dev := filepath.Join(dir, "dev", fmt.Sprintf("nvidia%d", i))
		if err := syscall.Mknod(dev, syscall.S_IFCHR|0o666, nvidiaMajor<<8|i); err != nil {
			t.Skipf("github.com/toposched/toposched/e2e: mknod %s (fake GPU): %v: a real Slurm needs root with CAP_MKNOD", dev, err)
		}
	}

	// The cluster file, and toposched's Slurm files from it.
	var cf strings.Builder
	cf.WriteString("name: slurm-e2e\nnodes:\n")
	var leaves []string
	for _, n := range nodes {
		c.Nodes = append(c.Nodes, n.name)
		topo := n.name + "-topo.txt"
		writeSlurmFile(t, filepath.Join(dir, topo), n.topo)
		fmt.Fprintf(&cf, "  - {name: %s, nvidia_smi: %s, gpu_model: H100}\n", n.name, topo)
		leaves = append(leaves, "leaf-"+n.name)
	}
	fmt.Fprintf(&cf, "fabric:\n  switches:\n    - {name: spine, tier: spine, switches: [%s]}\n", strings.Join(leaves, ", "))
	for _, n := range nodes {
		fmt.Fprintf(&cf, "    - {name: leaf-%s, tier: leaf, nodes: [%s]}\n", n.name, n.name)
	}
	writeSlurmFile(t, c.ClusterFile, cf.String())
	args := append([]string{"slurm-conf", "--cluster", c.ClusterFile, "--out", filepath.Join(dir, "etc"),
		"--device-format", filepath.Join(dir, "dev", "nvidia%d")}, confArgs...)
	out, err := exec.Command(bins.toposched, args...).CombinedOutput()
	c.SlurmConfOutput = string(out)
	if err != nil {
		t.Fatalf("toposched %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	gres := slurmConfGres(t, c.SlurmConfOutput)

	// slurm.conf: the howto's, with this test's ports and directories. No
	// log files: with -D the daemons log to their output, which
	// startKubeProc keeps. No cgroup.conf: 22.05 has no
	// CgroupPlugin=disabled, and nothing is enforced with
	// proctrack/linuxproc and task/none.
	ctldPort := freePort(t)
	var conf strings.Builder
	fmt.Fprintf(&conf, `ClusterName=toposched-e2e
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=%d
SlurmUser=root
SlurmdUser=root
AuthType=auth/none
CredType=cred/none
StateSaveLocation=%[2]s/state
SlurmdSpoolDir=%[2]s/spool/%%n
SlurmctldPidFile=%[2]s/slurmctld.pid
SlurmdPidFile=%[2]s/slurmd-%%n.pid
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
TopologyPlugin=topology/tree
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MpiDefault=none
MailProg=/bin/true
ReturnToService=2
SlurmdParameters=config_overrides
MinJobAge=300
InactiveLimit=0
KillWait=5
SchedulerParameters=sched_interval=1,defer_batch
`, ctldPort, dir)
	for _, n := range c.Nodes {
		g, ok := gres[n]
		if !ok {
			t.Fatalf("toposched slurm-conf printed no Gres= for node %s:\n%s", n, c.SlurmConfOutput)
		}
		fmt.Fprintf(&conf, "NodeName=%s NodeHostname=localhost NodeAddr=127.0.0.1 Port=%d CPUs=8 Boards=1 SocketsPerBoard=2 CoresPerSocket=4 ThreadsPerCore=1 RealMemory=2000 Gres=%s State=UNKNOWN\n",
			n, freePort(t), g)
		if err := os.MkdirAll(filepath.Join(dir, "spool", n), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	fmt.Fprintf(&conf, "PartitionName=gpu Nodes=%s Default=YES MaxTime=INFINITE State=UP\n", strings.Join(c.Nodes, ","))
	writeSlurmFile(t, c.Conf, conf.String())
	configured := time.Since(begin)

	// Registered before the daemons start, so run once they are stopped.
	t.Cleanup(func() { c.killLeft(t) })
	// -D: in the foreground, as our child; -i: no state of an earlier run.
	c.ctld = c.startDaemon(t, "slurmctld", "-D", "-i", "-f", c.Conf)
	daemons := []*kubeProc{c.ctld}
	for _, n := range c.Nodes {
		daemons = append(daemons, c.startDaemon(t, "slurmd", "-D", "-N", n, "-f", c.Conf))
	}
	// Registered after the daemons, so run before they are stopped.
	t.Cleanup(func() { c.cancelAll(t) })

	want := make([]string, len(c.Nodes))
	for i, n := range c.Nodes {
		want[i] = n + " idle"
	}
	slices.Sort(want)
	waitFor(t, slurmStartTimeout, func() (bool, string) {
		for _, d := range daemons {
			d.mustRun(t)
		}
		out, err := c.run(t, "sinfo", "-h", "-N", "-o", "%N %t")
		if err != nil {
			return false, fmt.Sprintf("sinfo: %v", err)
		}
		got := strings.Split(strings.TrimSpace(out), "\n")
		slices.Sort(got)
		return slices.Equal(got, want), fmt.Sprintf("sinfo: %q, want %q", got, want)
	})
	t.Logf("Slurm up in %s: %d nodes (configuration written in %s, toposched slurm-conf included; daemons idle %s later)",
		ms(time.Since(begin)), len(c.Nodes), ms(configured), ms(time.Since(begin)-configured))
	return c
}

// slurmConfGres reads the Gres= of each node from toposched slurm-conf's
// "NodeName=<hostlist> ... Gres=<gres>" lines.
func slurmConfGres(t *testing.T, out string) map[string]string {
	t.Helper()
	gres := map[string]string{}
	for line := range strings.SplitSeq(out, "\n") {
		hl, rest, ok := strings.Cut(strings.TrimSpace(line), " ... Gres=")
		hl, isNode := strings.CutPrefix(hl, "NodeName=")
		if !ok || !isNode {
			continue
		}
		for _, n := range expandSlurmHostlist(t, hl) {
			gres[n] = rest
		}
	}
	return gres
}

// expandSlurmHostlist expands the hostlists Slurm and toposched write for
// these tests' node names: name,name and prefix[1-3,5].
func expandSlurmHostlist(t *testing.T, hl string) []string {
	t.Helper()
	var out []string
	for hl != "" {
		open := strings.IndexByte(hl, '[')
		comma := strings.IndexByte(hl, ',')
		if open < 0 || (comma >= 0 && comma < open) {
			entry, rest, _ := strings.Cut(hl, ",")
			out, hl = append(out, entry), rest
			continue
		}
		end := strings.IndexByte(hl, ']')
		if end < open {
			t.Fatalf("hostlist %q: no ']'", hl)
		}
		prefix := hl[:open]
		for r := range strings.SplitSeq(hl[open+1:end], ",") {
			lo, hi, isRange := strings.Cut(r, "-")
			if !isRange {
				hi = lo
			}
			l, err1 := strconv.Atoi(lo)
			h, err2 := strconv.Atoi(hi)
			if err := errors.Join(err1, err2); err != nil || l > h {
				t.Fatalf("hostlist %q: range %q: %v", hl, r, err)
			}
			for i := l; i <= h; i++ {
				out = append(out, fmt.Sprintf("%s%0*d", prefix, len(lo), i))
			}
		}
		hl = strings.TrimPrefix(hl[end+1:], ",")
	}
	return out
}

// marker is the environment variable every process of this cluster
// carries: the daemons, the job steps they start (slurmstepd inherits
// slurmd's environment) and the jobs' tasks (sbatch and srun pass on
// their own), so that killLeft can find what outlived the test.
func (c *slurmCluster) marker() string { return "TOPOSCHED_E2E_SLURM=" + c.Dir }

// startDaemon starts a Slurm daemon with its output in log/<name>.log (with
// -D and no log file configured, the daemons log there). When the test ends
// it gets SIGTERM, SIGKILL after kubeStopGrace, and if the test failed the
// tail of its log is printed.
func (c *slurmCluster) startDaemon(t *testing.T, bin string, args ...string) *kubeProc {
	t.Helper()
	name := bin
	if i := slices.Index(args, "-N"); i >= 0 && i+1 < len(args) {
		name += "-" + args[i+1]
	}
	p := &kubeProc{name: name, log: filepath.Join(c.Dir, "log", name+".log"), done: make(chan struct{})}
	f, err := os.Create(p.log)
	if err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	defer func() { _ = f.Close() }() // the child holds its own copy
	p.cmd = exec.Command(bin, args...)
	p.cmd.Dir = c.Dir
	p.cmd.Env = childEnv(c.marker())
	p.cmd.Stdout, p.cmd.Stderr = f, f
	dieWithParent(p.cmd)
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	go func() {
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.stop(t)
		if t.Failed() {
			t.Logf("---- %s (%s), last lines of %s:\n%s", name, strings.Join(p.cmd.Args, " "), p.log, tailFile(p.log, 60))
		}
	})
	return p
}

// killLeft kills, by pid, every process of the cluster still running once
// the daemons are stopped: a job step or task that outlived them
// (slurmstepd ignores SIGTERM while it cannot reach its slurmd). A process
// is the cluster's if it carries the marker in its environment (tasks) or
// works in the cluster's directory (the daemons' working directory, which
// slurmstepd keeps; it overwrites its environment with its process title).
// One is an error: cancelAll should have ended every job first.
func (c *slurmCluster) killLeft(t *testing.T) {
	procs, err := filepath.Glob("/proc/[0-9]*")
	if err != nil {
		t.Errorf("list processes: %v", err)
		return
	}
	var left []string
	for _, p := range procs {
		pid, err := strconv.Atoi(filepath.Base(p))
		if err != nil || pid == os.Getpid() {
			continue
		}
		env, _ := os.ReadFile(filepath.Join(p, "environ"))
		cwd, _ := os.Readlink(filepath.Join(p, "cwd"))
		ours := slices.Contains(strings.Split(string(env), "\x00"), c.marker()) ||
			cwd == c.Dir || strings.HasPrefix(cwd, c.Dir+"/")
		if !ours {
			continue // gone, a zombie, or not ours
		}
		cmdline, _ := os.ReadFile(filepath.Join(p, "cmdline"))
		left = append(left, fmt.Sprintf("%d (%s)", pid, strings.TrimSpace(strings.ReplaceAll(string(cmdline), "\x00", " "))))
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	if len(left) > 0 {
		t.Errorf("processes of the Slurm cluster outlived its daemons, killed: %s", strings.Join(left, ", "))
	}
}

// run runs a Slurm client against this cluster and returns its standard
// output; an error carries its standard error.
func (c *slurmCluster) run(t *testing.T, name string, args ...string) (string, error) {
	t.Helper()
	return c.runCtx(t.Context(), name, args...)
}

// runCtx is run under ctx (cleanups run once t.Context() is done).
func (c *slurmCluster) runCtx(ctx context.Context, name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, slurmCallTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = childEnv("SLURM_CONF="+c.Conf, c.marker())
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return string(out), fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return string(out), nil
}

// mustRun is run, failing the test on an error.
func (c *slurmCluster) mustRun(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := c.run(t, name, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// sbatch submits a batch job (sbatch --parsable args...) and returns its
// id.
func (c *slurmCluster) sbatch(t *testing.T, args ...string) int {
	t.Helper()
	out := c.mustRun(t, "sbatch", append([]string{"--parsable"}, args...)...)
	idText, _, _ := strings.Cut(strings.TrimSpace(out), ";") // id;cluster on a federation
	id, err := strconv.Atoi(idText)
	if err != nil {
		t.Fatalf("sbatch printed %q, not a job id", out)
	}
	return id
}

// slurmJob is a job as squeue --json shows it.
type slurmJob struct {
	ID    int
	State string
	// Nodes are the job's nodes in Slurm's order.
	Nodes []string
	// GPUs are the GRES indices of the GPUs the job holds on each node.
	GPUs map[string][]int
}

// jobs reads every job squeue shows (pending, running, completing).
func (c *slurmCluster) jobs(t *testing.T) []slurmJob {
	t.Helper()
	out := c.mustRun(t, "squeue", "--json")
	var doc struct {
		Jobs []struct {
			JobID      int      `json:"job_id"`
			JobState   string   `json:"job_state"`
			Nodes      string   `json:"nodes"`
			GresDetail []string `json:"gres_detail"`
		} `json:"jobs"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("squeue --json: %v\n%s", err, out)
	}
	jobs := make([]slurmJob, len(doc.Jobs))
	for i, j := range doc.Jobs {
		job := slurmJob{ID: j.JobID, State: j.JobState, GPUs: map[string][]int{}}
		if j.Nodes != "" {
			job.Nodes = expandSlurmHostlist(t, j.Nodes)
		}
		// gres_detail has one entry per node, in the order of nodes.
		for k, d := range j.GresDetail {
			if k < len(job.Nodes) {
				job.GPUs[job.Nodes[k]] = gresIndices(t, d)
			}
		}
		jobs[i] = job
	}
	return jobs
}

// gresIndices reads the GPU indices of a gres_detail entry:
// "gpu:h100:2(IDX:2-3)", or with a type per GPU
// "gpu:g0:0(IDX:),gpu:g1:1(IDX:1),gpu:g2:0(IDX:),gpu:g3:1(IDX:3)".
func gresIndices(t *testing.T, detail string) []int {
	t.Helper()
	var idx []int
	rest := detail
	for {
		_, after, ok := strings.Cut(rest, "(IDX:")
		if !ok {
			break
		}
		list, tail, ok := strings.Cut(after, ")")
		if !ok {
			t.Fatalf("gres_detail %q: no ')'", detail)
		}
		for part := range strings.SplitSeq(list, ",") {
			if part == "" {
				continue
			}
			lo, hi, isRange := strings.Cut(part, "-")
			if !isRange {
				hi = lo
			}
			l, err1 := strconv.Atoi(lo)
			h, err2 := strconv.Atoi(hi)
			if err := errors.Join(err1, err2); err != nil || l > h {
				t.Fatalf("gres_detail %q: %q: %v", detail, part, err)
			}
			for i := l; i <= h; i++ {
				idx = append(idx, i)
			}
		}
		rest = tail
	}
	slices.Sort(idx)
	return idx
}

// waitRunning waits until job id runs with its GPUs allocated, and returns
// it.
func (c *slurmCluster) waitRunning(t *testing.T, id int) slurmJob {
	t.Helper()
	var job slurmJob
	waitFor(t, slurmStartTimeout, func() (bool, string) {
		c.ctld.mustRun(t)
		for _, j := range c.jobs(t) {
			if j.ID != id {
				continue
			}
			job = j
			if j.State == "RUNNING" && len(j.GPUs) == len(j.Nodes) {
				return true, ""
			}
			return false, fmt.Sprintf("job %d: %s on %v, GPUs %v", id, j.State, j.Nodes, j.GPUs)
		}
		return false, fmt.Sprintf("job %d: not in squeue", id)
	})
	return job
}

// cancelAll cancels every job and waits until squeue shows none, so that
// no job step outlives the daemons.
func (c *slurmCluster) cancelAll(t *testing.T) {
	if c.ctld.exited() {
		return
	}
	// t.Context() is done by now.
	ctx := context.WithoutCancel(t.Context())
	if _, err := c.runCtx(ctx, "scancel", "--user=root"); err != nil {
		t.Errorf("scancel: %v", err)
		return
	}
	deadline := time.Now().Add(slurmCallTimeout)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for time.Now().Before(deadline) {
		out, err := c.runCtx(ctx, "squeue", "-h", "-o", "%i %T")
		if err != nil {
			t.Errorf("squeue: %v", err)
			return
		}
		if strings.TrimSpace(out) == "" {
			return
		}
		<-tick.C
	}
	t.Errorf("jobs still in squeue %s after scancel", slurmCallTimeout)
}

// exited reports whether the process has ended.
func (p *kubeProc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}
