package main

import (
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

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/services/launcher"
	"github.com/toposched/toposched/services/slurm"
)

// hostile are values a tuning event could carry that a careless wrapper
// would let the shell run: each must reach the rank as it is.
var hostile = []string{
	`it's`, `"double" $HOME`, "$(touch PWNED)", "`touch PWNED`", `a\nb\\c`, "line1\nline2", "; touch PWNED #", "' ; touch PWNED ; '", "%s %d", "-n",
}

// slurmTuningOf is a tuning of slurmDecided: for all ranks a protocol
// list with a comma, a bucket size, a variable the job's env sets and a
// reserved one; each node's NCCL_TOPO_FILE; rank 0's NIC and numactl, rank
// 3's hostile values; and files the decision does not use.
func slurmTuningOf(d *events.PlacementDecided) *events.RuntimeTuning {
	t := &events.RuntimeTuning{JobID: d.JobID, DecidedAt: d.DecidedAt, Env: events.TuningEnv{
		All: map[string]string{"NCCL_PROTO": "allreduce:ll128,simple", events.EnvBucketCapMB: "100", "NCCL_ALGO": "allreduce:tree", "RANK": "9"},
		Nodes: map[string]map[string]string{
			"n1": {"NCCL_TOPO_FILE": "/tmp/toposched/tp2-dp2/n1.xml"},
			"n2": {"NCCL_TOPO_FILE": "/tmp/toposched/tp2-dp2/n2.xml", "NCCL_SOCKET_IFNAME": "eth0"},
		},
		Ranks: map[string]map[string]string{
			"0": {"NCCL_IB_HCA": "=mlx5_0", events.EnvNumactl: "--cpunodebind=0 --membind=0"},
			"9": {"NEVER": "no such rank"},
		},
	}, Files: []events.TuningFile{
		{Node: "n1", Path: "/tmp/toposched/tp2-dp2/n1.xml", Content: "<system version='1'>\n  <cpu numaid=\"0\"/>\n</system>\n"},
		{Node: "n2", Path: "/tmp/toposched/tp2-dp2/n2.xml", Content: "<system n2/>"},
		{Node: "n2", Path: "/tmp/toposched/tp2-dp2/unused.xml", Content: "<unused/>"},
		{Node: "n3", Path: "/tmp/toposched/tp2-dp2/n3.xml", Content: "<n3/>"},
	}}
	r3 := map[string]string{}
	for i, v := range hostile {
		r3["HOSTILE_"+strconv.Itoa(i)] = v
	}
	t.Env.Ranks["3"] = r3
	return t
}

func TestSlurmArgsTuned(t *testing.T) {
	t.Parallel()
	job := &events.JobSubmitted{JobID: "tp2-dp2", Command: "python3", Args: []string{"train.py"}, Env: []string{"NCCL_ALGO=Ring"}}
	for _, tc := range []struct {
		name, format string
		d            *events.PlacementDecided
	}{
		{"srun-tuned", "srun", slurmDecided(true)},
		{"srun-uniform-tuned", "srun", slurmUniform()},
		{"sbatch-tuned", "sbatch", slurmDecided(true)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			comps, err := slurmComponents(tc.d, job, slurmTuningOf(tc.d))
			if err != nil {
				t.Fatal(err)
			}
			var b strings.Builder
			if tc.format == "sbatch" {
				if err := writeSbatch(&b, comps); err != nil {
					t.Fatal(err)
				}
			} else {
				b.WriteString(shellJoin(append([]string{"srun"}, srunArgv(comps)...)) + "\n")
			}
			golden(t, filepath.Join("testdata", "slurm-args", tc.name+".txt"), b.String())
		})
	}
}

// golden compares got with a golden file (rewritten with -update).
func golden(t *testing.T, path, got string) {
	t.Helper()
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if got != string(want) {
		t.Errorf("got:\n%s\nwant (%s):\n%s", got, path, want)
	}
}

// TestSlurmTunedWrapperRuns runs each rank's wrapper with /bin/sh as
// slurmstepd would (Slurm's task variables, --export's variables set):
// every rank sees the tuning in the agents' order, hostile values as they
// are, its node's file's content at NCCL_TOPO_FILE in a fresh temp file
// that is gone once the rank exits, and nothing the shell was tricked
// into running.
func TestSlurmTunedWrapperRuns(t *testing.T) {
	for _, tc := range []struct {
		name string
		d    *events.PlacementDecided
	}{{"heterogeneous", slurmDecided(true)}, {"uniform", slurmUniform()}} {
		t.Run(tc.name, func(t *testing.T) {
			d := tc.d
			tuning := slurmTuningOf(d)
			work := t.TempDir()
			job := &events.JobSubmitted{JobID: d.JobID, Command: "/bin/sh", Env: []string{"NCCL_ALGO=Ring"},
				Args: []string{"-c", `env; cp "$NCCL_TOPO_FILE" "$1/topo-$RANK"`, "sh", work}}
			comps, err := slurmComponents(d, job, tuning)
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range d.Ranks {
				comp := comps[0]
				if len(comps) > 1 {
					comp = comps[slices.IndexFunc(d.Nodes, func(n events.NodePlacement) bool { return n.Node == r.Node })]
				}
				tmp := t.TempDir()
				env := []string{"PATH=" + os.Getenv("PATH"), "TMPDIR=" + tmp, "SLURMD_NODENAME=" + r.Node,
					"SLURM_LOCALID=" + strconv.Itoa(r.LocalRank), "SLURM_PROCID=" + strconv.Itoa(r.Rank),
					// One inherited from the environment is never removed.
					"toposched_f0=" + filepath.Join(work, "keep")}
				if err := os.WriteFile(filepath.Join(work, "keep"), nil, 0o600); err != nil {
					t.Fatal(err)
				}
				for _, o := range comp.Step {
					if list, ok := strings.CutPrefix(o, "--export=ALL,"); ok {
						env = append(env, strings.Split(list, ",")...)
					}
				}
				cmd := exec.Command(comp.Command[0], comp.Command[1:]...)
				cmd.Env, cmd.Dir = env, work
				out, err := cmd.CombinedOutput()
				if err != nil {
					t.Fatalf("rank %d: %v\n%s", r.Rank, err, out)
				}
				got := map[string]string{}
				for _, line := range strings.Split(string(out), "\n") {
					if k, v, ok := strings.Cut(line, "="); ok {
						got[k] = v
					}
				}
				file, err := os.ReadFile(filepath.Join(work, "topo-"+strconv.Itoa(r.Rank)))
				if err != nil {
					t.Errorf("rank %d: NCCL_TOPO_FILE not read: %v\n%s", r.Rank, err, out)
				}
				want := map[string]string{
					"RANK": strconv.Itoa(r.Rank), "LOCAL_RANK": strconv.Itoa(r.LocalRank),
					"NCCL_ALGO": "Ring", "NCCL_PROTO": "allreduce:ll128,simple", events.EnvBucketCapMB: "100",
				}
				if r.Node == "n2" {
					want["NCCL_SOCKET_IFNAME"] = "eth0"
				}
				if r.Rank == 0 {
					want["NCCL_IB_HCA"], want[events.EnvNumactl] = "=mlx5_0", "--cpunodebind=0 --membind=0"
				}
				for k, v := range want {
					if got[k] != v {
						t.Errorf("rank %d: %s=%q, want %q", r.Rank, k, got[k], v)
					}
				}
				if r.Rank == 3 {
					// env prints a value with a newline over two lines.
					for i, v := range hostile {
						name := "HOSTILE_" + strconv.Itoa(i)
						if !strings.Contains(string(out), name+"="+v+"\n") {
							t.Errorf("rank 3: %s is not %q:\n%s", name, v, out)
						}
					}
				}
				if _, ok := got["NEVER"]; ok {
					t.Errorf("rank %d got the variables of a rank the decision has not", r.Rank)
				}
				topo := got["NCCL_TOPO_FILE"]
				if !strings.HasPrefix(topo, tmp+"/toposched-tuning.") {
					t.Errorf("rank %d: NCCL_TOPO_FILE=%q, want a temp file in %s", r.Rank, topo, tmp)
				}
				var content string
				for _, f := range tuning.Files {
					if f.Node == r.Node && strings.HasSuffix(f.Path, "/"+r.Node+".xml") {
						content = f.Content
					}
				}
				if string(file) != content {
					t.Errorf("rank %d: NCCL_TOPO_FILE holds %q, want %q", r.Rank, file, content)
				}
				if left, _ := os.ReadDir(tmp); len(left) != 0 {
					t.Errorf("rank %d: left in TMPDIR: %v", r.Rank, left)
				}
				if _, err := os.Stat(filepath.Join(work, "keep")); err != nil {
					t.Errorf("rank %d: the inherited toposched_f0's file was removed: %v", r.Rank, err)
				}
			}
			if _, err := os.Stat(filepath.Join(work, "PWNED")); err == nil {
				t.Errorf("a hostile value ran a command")
			}
		})
	}
}

// A rank killed with SIGTERM, as Slurm stops a step, leaves no file.
func TestSlurmTunedWrapperTerminated(t *testing.T) {
	d := slurmDecided(false)
	tmp := t.TempDir()
	started := filepath.Join(t.TempDir(), "started")
	job := &events.JobSubmitted{JobID: d.JobID, Command: "/bin/sh", Args: []string{"-c", `touch ` + started + `; exec sleep 600`}}
	comps, err := slurmComponents(d, job, slurmTuningOf(d))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(comps[0].Command[0], comps[0].Command[1:]...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "TMPDIR=" + tmp, "SLURMD_NODENAME=n1", "SLURM_LOCALID=0", "SLURM_PROCID=0"}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	var rank int
	for {
		// The rank is the wrapper's child, once it has started.
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%[1]d/children", cmd.Process.Pid))
		_, err := os.Stat(started)
		if f := strings.Fields(string(b)); err == nil && len(f) == 1 {
			rank, _ = strconv.Atoi(f[0])
			break
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			t.Fatalf("the rank did not start within 30s (children %q)", b)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if left, _ := os.ReadDir(tmp); len(left) != 1 {
		t.Fatalf("TMPDIR holds %v, want the tuning file", left)
	}
	// Slurm signals every process of the step: the wrapper and its rank.
	for _, pid := range []int{cmd.Process.Pid, rank} {
		if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
			t.Fatalf("SIGTERM %d: %v", pid, err)
		}
	}
	err = cmd.Wait()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 143 {
		t.Errorf("the wrapper after SIGTERM: %v, want exit status 143", err)
	}
	if left, _ := os.ReadDir(tmp); len(left) != 0 {
		t.Errorf("left in TMPDIR after SIGTERM: %v", left)
	}
}

// A tuning file the wrapper cannot write fails the rank, saying which.
func TestSlurmTunedWrapperCannotWrite(t *testing.T) {
	d := slurmDecided(false)
	marker := filepath.Join(t.TempDir(), "ran")
	job := &events.JobSubmitted{JobID: d.JobID, Command: "touch", Args: []string{marker}}
	comps, err := slurmComponents(d, job, slurmTuningOf(d))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(comps[0].Command[0], comps[0].Command[1:]...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "TMPDIR=" + filepath.Join(t.TempDir(), "missing"), "SLURMD_NODENAME=n1", "SLURM_LOCALID=0", "SLURM_PROCID=0"}
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 || !strings.Contains(string(out), "toposched: node n1: cannot write the tuning file /tmp/toposched/tp2-dp2/n1.xml\n") {
		t.Errorf("a tuning file not written: %v, want exit 1 naming it:\n%s", err, out)
	}
	if _, err := os.Stat(marker); err == nil {
		t.Errorf("the rank ran without its tuning file")
	}
}

func TestSlurmTuningRefused(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		edit func(*events.RuntimeTuning)
		want string
	}{
		{"name with a shell word", func(tu *events.RuntimeTuning) { tu.Env.Nodes["n1"]["X;touch PWNED"] = "1" },
			`runtime.tuning env nodes.n1 "X;touch PWNED": not a variable name`},
		{"the wrapper's own name", func(tu *events.RuntimeTuning) { tu.Env.All["toposched_f0"] = "/etc/passwd" },
			`runtime.tuning env all "toposched_f0": not a variable name`},
		{"NUL in a value", func(tu *events.RuntimeTuning) { tu.Env.Ranks["0"]["NCCL_IB_HCA"] = "a\x00b" },
			"runtime.tuning env ranks.0 NCCL_IB_HCA: a NUL byte"},
		{"files over one argument", func(tu *events.RuntimeTuning) {
			tu.Files[0].Content = strings.Repeat("<gpu/>", maxArgBytes/6)
		}, "the rank wrapper's script (sh -c), with the runtime.tuning's variables and files, is"},
		{"All over one argument", func(tu *events.RuntimeTuning) {
			tu.Env.All["BIG"] = strings.Repeat("x", maxArgBytes)
		}, "--export is"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			d := slurmDecided(false)
			tu := slurmTuningOf(d)
			tc.edit(tu)
			_, err := slurmComponents(d, &events.JobSubmitted{JobID: d.JobID, Command: "true"}, tu)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %v, want %q", err, tc.want)
			}
		})
	}
}

// The Slurm launch waits for the tuning as long as the agents do.
func TestDefaultTuningWaitIsTheAgents(t *testing.T) {
	if defaultTuningWait != launcher.DefaultTuningWait {
		t.Errorf("topoctl waits %s for runtime.tuning, the agents %s", defaultTuningWait, launcher.DefaultTuningWait)
	}
}

// The placeholder's comment is what the Slurm sync service reads as a
// placeholder of the job, and its sbatch asks for the job's tasks and GPUs.
func TestPlaceholderComment(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		job  events.JobSubmitted
		want string
	}{
		{events.JobSubmitted{JobID: "tp8-dp2", GPUs: 16, GPUsPerNode: 8}, "--nodes=2 --ntasks-per-node=8 --gres=gpu:8"},
		{events.JobSubmitted{JobID: "any", GPUs: 3}, "--ntasks=3 --gpus=3"},
		{events.JobSubmitted{JobID: "uneven", GPUs: 6, GPUsPerNode: 4}, "--ntasks=6 --gpus=6"},
	} {
		args := placeholderArgs(&tc.job)
		joined := strings.Join(args, " ")
		if !strings.Contains(joined, "--hold --job-name="+tc.job.JobID+" ") || !strings.Contains(joined, tc.want) || args[len(args)-1] != "--wrap=true" {
			t.Errorf("%s: sbatch %s, want --hold, --job-name, %s and --wrap=true", tc.job.JobID, joined, tc.want)
		}
		var comment string
		for _, a := range args {
			if c, ok := strings.CutPrefix(a, "--comment="); ok {
				comment = c
			}
		}
		doc := fmt.Sprintf(`{"jobs":[{"job_id":7,"job_state":"PENDING","comment":%q}]}`, comment)
		jobs, err := slurm.ParseSqueue([]byte(doc))
		if err != nil {
			t.Fatal(err)
		}
		if j := jobs[0]; j.ToposchedJob != tc.job.JobID || !j.Placeholder {
			t.Errorf("comment %q: the sync service reads job %q placeholder %v", comment, j.ToposchedJob, j.Placeholder)
		}
	}
}

// The wait takes the tuning of the decision it launches, not an earlier
// decision's, whenever it comes within the wait; none: nil once the wait
// is over.
func TestTuningFollowerWait(t *testing.T) {
	t.Parallel()
	d := slurmDecided(false)
	d.DecidedAt = time.Unix(100, 5).UTC()
	f := newTuningFollower(d.JobID)
	keep := func(at time.Time) *events.RuntimeTuning {
		tu := &events.RuntimeTuning{JobID: d.JobID, DecidedAt: at}
		f.mu.Lock()
		f.got = append(f.got, tu)
		close(f.more)
		f.more = make(chan struct{})
		f.mu.Unlock()
		return tu
	}
	keep(time.Unix(50, 0)) // an earlier decision's
	if tu, err := f.wait(t.Context(), d, 20*time.Millisecond); tu != nil || err != nil {
		t.Fatalf("wait with only an earlier decision's tuning: %v %v, want none", tu, err)
	}
	want := make(chan *events.RuntimeTuning, 1)
	go func() { want <- keep(d.DecidedAt.Local()) }() // the same instant, another location
	tu, err := f.wait(t.Context(), d, time.Minute)
	if w := <-want; tu != w || err != nil {
		t.Errorf("wait: %v %v, want the decision's tuning", tu, err)
	}
}
