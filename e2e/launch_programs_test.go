package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The launch tests that run the real programs Debian packages: PyTorch
// (python3-torch, CPU build, gloo) and Open MPI's mpirun (openmpi-bin).
// .ci/run installs them when it runs as root; elsewhere these tests skip,
// naming the package.

// torchPython is a python that imports torch: Debian's /usr/bin/python3
// first (python3 on PATH may be a virtual environment or pyenv shim
// without it).
func torchPython(t *testing.T) string {
	t.Helper()
	candidates := []string{"/usr/bin/python3"}
	if p, err := exec.LookPath("python3"); err == nil {
		candidates = append(candidates, p)
	}
	for _, p := range candidates {
		if exec.Command(p, "-c", "import torch, torch.distributed").Run() == nil {
			return p
		}
	}
	t.Skipf("needs PyTorch: no python among %v imports torch (apt-get install python3-torch)", candidates)
	return ""
}

func TestLaunchPyTorchDDP(t *testing.T) {
	needBinaries(t)
	python := torchPython(t)
	c := startLaunchCluster(t)
	dir := t.TempDir()
	const steps = 10
	job := filepath.Join(dir, "ddp-job.yaml")
	// The decision's port is 29500 (rank 0 on GPU 0), which a test run
	// beside this one on the machine would share: the job's own wins.
	body := fmt.Sprintf(`job_id: ddp-job
gpus: 4
gpus_per_node: 2
command: %s
args: [%q, "%d"]
env: ["PYTHONPATH=%s", "GLOO_SOCKET_IFNAME=lo", "OMP_NUM_THREADS=1", "MASTER_PORT=%d"]
`, python, testdata(t, "ddp_train.py"), steps, filepath.Join(moduleRoot, "deploy", "examples", "telemetry"), freePort(t))
	if err := os.WriteFile(job, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	r := runCmd(t, 5*time.Minute, clientEnv(c.url), bins.topoctl, "--nats-url", c.url, "run", job)
	if r.code != 0 {
		t.Fatalf("topoctl run: exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}
	t.Logf("DDP job of 4 ranks on 2 agents ran in %s", time.Since(start).Round(time.Millisecond))
	for rank := range 4 {
		if want := fmt.Sprintf("[rank %d] all_reduce ok: 10\n", rank); !strings.Contains(r.stdout, want) {
			t.Errorf("output lacks %q", want)
		}
		if want := fmt.Sprintf("[rank %d] step %d loss", rank, steps-1); !strings.Contains(r.stdout, want) {
			t.Errorf("output lacks %q", want)
		}
	}
	if want := fmt.Sprintf("[rank 0] telemetry reports sent: %d\n", steps); !strings.Contains(r.stdout, want) {
		t.Errorf("output lacks %q:\n%s", want, r.stdout)
	}
	if !strings.Contains(r.stderr, "ddp-job: succeeded (ranks_exited)") {
		t.Errorf("status:\n%s", r.stderr)
	}
	// The reports went through the agent to the optimizer, which compared
	// the first with its prediction.
	waitFor(t, 30*time.Second, func() (bool, string) {
		return strings.Contains(c.serve.output(), `msg="job diagnosed" component=optimizer job_id=ddp-job`),
			"the optimizer has not diagnosed ddp-job from its telemetry"
	})
	noLiveJobs(t, c)
}

func TestLaunchArgsMpirunRankfile(t *testing.T) {
	needBinaries(t)
	mpirun, err := exec.LookPath("mpirun")
	if err != nil {
		t.Skip("needs Open MPI's mpirun (apt-get install openmpi-bin)")
	}
	port := freePort(t)
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)
	startServe(t, "serve", testdata(t, "localhost.yaml"), port, t.TempDir(), "--poll", "0")
	dir := t.TempDir()
	job := filepath.Join(dir, "mpi-job.yaml")
	script := `echo "rank=$OMPI_COMM_WORLD_RANK local=$OMPI_COMM_WORLD_LOCAL_RANK devices=$CUDA_VISIBLE_DEVICES $(grep Cpus_allowed_list /proc/self/status)"`
	if err := os.WriteFile(job, fmt.Appendf(nil, "job_id: mpi-job\ngpus: 2\ncommand: sh\nargs: [\"-c\", %q]\n", script), 0o600); err != nil {
		t.Fatal(err)
	}
	d := submitWaitDecided(t, url, job, "mpi-job")
	rankfile := filepath.Join(dir, "mpi-job.rankfile")
	line := strings.TrimSpace(topoctlOK(t, url, "launch-args", "mpi-job", "--for", "mpirun", "--rankfile", rankfile))
	if !strings.HasPrefix(line, "mpirun -np 2 --rankfile "+rankfile+" ") {
		t.Fatalf("launch-args --for mpirun printed:\n%s", line)
	}
	rf, err := os.ReadFile(rankfile)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("rankfile:\n%s", rf)
	// Run the printed line as a user would, with the mpirun found here.
	line = mpirun + strings.TrimPrefix(line, "mpirun")
	r := runCmd(t, 2*time.Minute, childEnv("OMPI_ALLOW_RUN_AS_ROOT=1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1"), "/bin/sh", "-c", line)
	if r.code != 0 {
		t.Fatalf("%s: exit %d\nstdout:\n%s\nstderr:\n%s", line, r.code, r.stdout, r.stderr)
	}
	got := regexp.MustCompile(`rank=(\d+) local=(\d+) devices=(\S+) Cpus_allowed_list:\s+(\S+)`).FindAllStringSubmatch(r.stdout, -1)
	if len(got) != len(d.Ranks) {
		t.Fatalf("%d ranks reported, want %d:\n%s", len(got), len(d.Ranks), r.stdout)
	}
	for _, m := range got {
		rank, err := strconv.Atoi(m[1])
		if err != nil || rank >= len(d.Ranks) {
			t.Fatalf("rank %q: not one of the decision's", m[1])
		}
		want := d.Ranks[rank]
		// The rankfile's slot is the rank's local rank: Open MPI binds it
		// to that core.
		if m[2] != fmt.Sprint(want.LocalRank) || m[4] != fmt.Sprint(want.LocalRank) || m[3] != d.Nodes[0].CUDAVisibleDevices {
			t.Errorf("rank %d ran with local rank %s on CPUs %s with devices %s; the decision: local rank %d (slot %d), devices %s",
				rank, m[2], m[4], m[3], want.LocalRank, want.LocalRank, d.Nodes[0].CUDAVisibleDevices)
		}
	}
}

func TestLaunchArgsTorchrun(t *testing.T) {
	needBinaries(t)
	python := torchPython(t)
	torchrun := filepath.Join(filepath.Dir(python), "torchrun")
	if _, err := os.Stat(torchrun); err != nil {
		t.Skipf("needs torchrun beside %s (apt-get install python3-torch)", python)
	}
	port := freePort(t)
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)
	startServe(t, "serve", testdata(t, "localhost.yaml"), port, t.TempDir(), "--poll", "0")
	dir := t.TempDir()
	job := filepath.Join(dir, "torchrun-job.yaml")
	// The job's own port, as in TestLaunchPyTorchDDP: launch-args puts it
	// in torchrun's --master_port.
	rdv := freePort(t)
	body := fmt.Sprintf("job_id: torchrun-job\ngpus: 2\ncommand: python3\nargs: [%q, \"2\"]\nenv: [\"PYTHONPATH=%s\", \"GLOO_SOCKET_IFNAME=lo\", \"OMP_NUM_THREADS=1\", \"MASTER_PORT=%d\"]\n",
		testdata(t, "ddp_train.py"), filepath.Join(moduleRoot, "deploy", "examples", "telemetry"), rdv)
	if err := os.WriteFile(job, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	submitWaitDecided(t, url, job, "torchrun-job")
	out := topoctlOK(t, url, "launch-args", "torchrun-job", "--for", "torchrun")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 || lines[0] != "# on localhost" || !strings.Contains(lines[1], fmt.Sprintf(" --master_port=%d ", rdv)) {
		t.Fatalf("launch-args --for torchrun printed (want --master_port=%d):\n%s", rdv, out)
	}
	// The node's line as a user would run it there, with this torchrun.
	// Debian bookworm's torch 1.13 on Python 3.11 cannot parse its own
	// default --redirects 0 (Python 3.11 no longer iterates a zero
	// IntFlag member): any other setting avoids it.
	line := strings.Replace(lines[1], " torchrun ", " "+torchrun+" --redirects 2 --tee 2 ", 1)
	r := runCmd(t, 3*time.Minute, childEnv(), "/bin/sh", "-c", line)
	if r.code != 0 {
		t.Fatalf("%s: exit %d\nstdout:\n%s\nstderr:\n%s", line, r.code, r.stdout, r.stderr)
	}
	// Both ranks write to torchrun's one stdout: lines may interleave.
	if n := strings.Count(r.stdout, "all_reduce ok: 3"); n != 2 {
		t.Errorf("%d ranks completed the all-reduce, want 2:\n%s\n%s", n, r.stdout, r.stderr)
	}
}
