package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// The Slurm sync service (toposched serve --slurm) beside a real Slurm:
// jobs submitted straight to Slurm make their GPUs held in toposched, and
// toposched's jobs run as Slurm jobs (comment toposched-job=<id>) are
// finished when their Slurm job ends.

// slurmSyncRuns is how many foreign jobs TestSlurmSyncHoldsForeignJobs
// times, for BENCHMARKS.md's p50/p99.
const slurmSyncRuns = 30

// startSlurmSync starts serve with the Slurm sync service on c's nodes
// (the cluster file c's Slurm files came from), with extra flags, and
// returns it and its URL once the service polls. Its squeue is a script
// that names c's slurm.conf, as --squeue allows.
func startSlurmSync(t *testing.T, c *slurmCluster, extra ...string) (*proc, string) {
	t.Helper()
	squeue := filepath.Join(c.Dir, "squeue.sh")
	script := fmt.Sprintf("#!/bin/sh\nSLURM_CONF=%s exec squeue \"$@\"\n", c.Conf)
	if err := os.WriteFile(squeue, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	port := freePort(t)
	serve := startServe(t, "serve", c.ClusterFile, port, filepath.Join(t.TempDir(), "data"),
		append([]string{"--slurm", "--squeue", squeue}, extra...)...)
	waitFor(t, time.Minute, func() (bool, string) {
		mustBeAlive(t, serve)
		return strings.Contains(serve.output(), "syncing with Slurm"), "serve has not logged 'syncing with Slurm'"
	})
	return serve, fmt.Sprintf("nats://127.0.0.1:%d", port)
}

// heldMsg is one topology.held.<node> as the topology stream stored it.
type heldMsg struct {
	GPUs   []int
	By     []string
	Stored time.Time
}

// streamMsgs returns a stream's messages whose subject starts with
// prefix, in order.
func streamMsgs(t *testing.T, js jetstream.JetStream, stream, prefix string) []*jetstream.RawStreamMsg {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, stream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil
	}
	if err != nil {
		t.Fatalf("stream %s: %v", stream, err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatalf("stream %s: %v", stream, err)
	}
	var out []*jetstream.RawStreamMsg
	for seq := info.State.FirstSeq; info.State.Msgs > 0 && seq <= info.State.LastSeq; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			t.Fatalf("get %s #%d: %v", stream, seq, err)
		}
		if strings.HasPrefix(m.Subject, prefix) {
			out = append(out, m)
		}
	}
	return out
}

// helds returns a node's topology.held messages, in order.
func helds(t *testing.T, js jetstream.JetStream, node string) []heldMsg {
	t.Helper()
	var out []heldMsg
	for _, m := range streamMsgs(t, js, streamTopology, "toposched.topology.held."+node) {
		if m.Subject != "toposched.topology.held."+node {
			continue
		}
		var ev struct {
			GPUs []struct {
				Index int    `json:"index"`
				By    string `json:"by"`
			} `json:"gpus"`
		}
		if err := json.Unmarshal(m.Data, &ev); err != nil {
			t.Fatalf("topology.held.%s: %v: %s", node, err, m.Data)
		}
		h := heldMsg{Stored: m.Time}
		for _, g := range ev.GPUs {
			h.GPUs = append(h.GPUs, g.Index)
			h.By = append(h.By, g.By)
		}
		out = append(out, h)
	}
	return out
}

// waitHeld waits until a node's last topology.held lists exactly want
// (none: the node's GPUs freed) and returns it.
func waitHeld(t *testing.T, js jetstream.JetStream, serve *proc, node string, want []int) heldMsg {
	t.Helper()
	var last heldMsg
	waitFor(t, 30*time.Second, func() (bool, string) {
		mustBeAlive(t, serve)
		hs := helds(t, js, node)
		if len(hs) == 0 {
			return false, "no topology.held." + node
		}
		last = hs[len(hs)-1]
		return slices.Equal(last.GPUs, want), fmt.Sprintf("topology.held.%s lists %v, want %v", node, last.GPUs, want)
	})
	return last
}

// waitSlurm waits until cond holds of the job's squeue entry (nil: the
// job is not in squeue) and returns when a poll first saw it.
func waitSlurm(t *testing.T, c *slurmCluster, id int, what string, cond func(j *slurmJob) bool) time.Time {
	t.Helper()
	var seen time.Time
	waitFor(t, slurmStartTimeout, func() (bool, string) {
		c.ctld.mustRun(t)
		jobs := c.jobs(t)
		at := time.Now()
		var job *slurmJob
		for i := range jobs {
			if jobs[i].ID == id {
				job = &jobs[i]
			}
		}
		if cond(job) {
			seen = at
			return true, ""
		}
		return false, fmt.Sprintf("slurm job %d: not %s: %+v", id, what, job)
	})
	return seen
}

// slurmSyncJob writes a toposched job file asking for gpus H100s, all on
// one node.
func slurmSyncJob(t *testing.T, id string, gpus int) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), id+".yaml")
	body := fmt.Sprintf("job_id: %s\ngpus: %d\ngpus_per_node: %d\ngpu_model: H100\nparallelism:\n  tp: %d\n", id, gpus, gpus, gpus)
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// untilStopped is a batch script that runs until stop(name) is called:
// jobs that end by themselves leave no task behind, where a cancelled
// sleep was seen to outlive its job.
func untilStopped(c *slurmCluster, name string) string {
	return fmt.Sprintf("while [ ! -e %s ]; do sleep 0.05; done", filepath.Join(c.Dir, "stop-"+name))
}

// stop ends the job running untilStopped(c, name).
func stop(t *testing.T, c *slurmCluster, name string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(c.Dir, "stop-"+name), nil, 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestSlurmSyncHoldsForeignJobs: GPUs Slurm gives to jobs toposched
// never saw are held in toposched within a few seconds, and free once the
// jobs end; a toposched decision made meanwhile avoids them. It prints the
// delay from squeue first showing a job running to its GPUs' holds stored
// in the topology stream, and the same for their release.
func TestSlurmSyncHoldsForeignJobs(t *testing.T) {
	c := startSlurm(t, []slurmNode{{"n1", topoPairsBySocket}, {"n2", topoPairsBySocket}})
	// The default poll interval (1 s): the delays printed are those of a
	// default deployment.
	serve, url := startSlurmSync(t, c)
	js := jsConnect(t, url)

	// Slurm's own jobs: all of n2, two GPUs of n1.
	whole := c.sbatch(t, "-w", "n2", "--gres=gpu:4", "-J", "foreign-n2", "-o", "/dev/null", "--wrap", untilStopped(c, "n2"))
	pair := c.sbatch(t, "-w", "n1", "--gres=gpu:2", "-J", "foreign-n1", "-o", "/dev/null", "--wrap", untilStopped(c, "n1"))
	onN2 := c.waitRunning(t, whole).GPUs["n2"]
	onN1 := c.waitRunning(t, pair).GPUs["n1"]
	h := waitHeld(t, js, serve, "n2", onN2)
	if want := fmt.Sprintf("slurm job %d (root)", whole); h.By[0] != want {
		t.Errorf("topology.held.n2 by %q, want %q", h.By[0], want)
	}
	waitHeld(t, js, serve, "n1", onN1)

	// Only n1's other two GPUs are free in toposched now.
	d := submitWaitDecided(t, url, slurmSyncJob(t, "sync-free-pair", 2), "sync-free-pair")
	for _, r := range d.Ranks {
		if r.Node != "n1" || slices.Contains(onN1, r.GPU) {
			t.Errorf("rank %d on %s GPU %d: Slurm's job %d holds n1's %v and job %d all of n2", r.Rank, r.Node, r.GPU, pair, onN1, whole)
		}
	}

	// Ended: freed.
	stop(t, c, "n1")
	stop(t, c, "n2")
	waitHeld(t, js, serve, "n1", nil)
	waitHeld(t, js, serve, "n2", nil)

	// Timed: a two-GPU job on n2, run after run.
	var held, freed []time.Duration
	for i := range slurmSyncRuns {
		// Not a wait for anything: a random pause, so that the jobs start
		// at every phase of the service's poll rather than locked to it
		// (each run would otherwise start about one poll after the last).
		time.Sleep(rand.N(time.Second))
		name := fmt.Sprintf("timed-%d", i)
		id := c.sbatch(t, "-w", "n2", "--gres=gpu:2", "-J", name, "-o", "/dev/null", "--wrap", untilStopped(c, name))
		shown := waitSlurm(t, c, id, "running with GPUs", func(j *slurmJob) bool {
			return j != nil && j.State == "RUNNING" && len(j.GPUs["n2"]) == 2
		})
		gpus := c.waitRunning(t, id).GPUs["n2"]
		h := waitHeld(t, js, serve, "n2", gpus)
		held = append(held, h.Stored.Sub(shown))
		time.Sleep(rand.N(time.Second)) // the end at a random phase too
		stop(t, c, name)
		ended := waitSlurm(t, c, id, "ended", func(j *slurmJob) bool {
			return j == nil || (j.State != "RUNNING" && j.State != "COMPLETING" && j.State != "PENDING")
		})
		h = waitHeld(t, js, serve, "n2", nil)
		freed = append(freed, h.Stored.Sub(ended))
	}
	t.Logf("slurm sync, %d runs, poll every 1s (the default): squeue shows a job running -> topology.held stored: p50 %s p99 %s max %s; squeue shows it ended -> empty held stored: p50 %s p99 %s max %s (the test's own squeue poll runs every 25 ms: a negative delay is the service seeing the change first)",
		slurmSyncRuns, ms(percentile(held, 50)), ms(percentile(held, 99)), ms(slices.Max(held)),
		ms(percentile(freed, 50)), ms(percentile(freed, 99)), ms(slices.Max(freed)))
}

// finishedOf returns the jobs.finished messages of a job.
func finishedOf(t *testing.T, js jetstream.JetStream, id string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, m := range streamMsgs(t, js, streamJobs, "toposched.jobs.finished") {
		var ev map[string]any
		if err := json.Unmarshal(m.Data, &ev); err != nil {
			t.Fatalf("jobs.finished: %v: %s", err, m.Data)
		}
		if ev["job_id"] == id {
			out = append(out, ev)
		}
	}
	return out
}

// gresOf is the --gres of exactly a node's GPUs with a type per index
// (toposched slurm-conf --index-types).
func gresOf(gpus []int) string {
	parts := make([]string, len(gpus))
	for i, g := range gpus {
		parts[i] = fmt.Sprintf("gpu:g%d:1", g)
	}
	return "--gres=" + strings.Join(parts, ",")
}

// TestSlurmSyncFinishesToposchedJobs: a toposched job run as a Slurm job
// (comment toposched-job=<id>) is finished once, with Slurm's state, when
// that Slurm job ends, and placement releases its GPUs; its GPUs are never
// published held. A Slurm job on other GPUs than decided is reported.
func TestSlurmSyncFinishesToposchedJobs(t *testing.T) {
	c := startSlurm(t, []slurmNode{{"n1", topoPairsBySocket}, {"n2", topoPairsBySocket}}, "--index-types")
	serve, url := startSlurmSync(t, c, "--slurm-poll-interval", "200ms")
	js := jsConnect(t, url)

	// On the decided GPUs: it completes, and is finished as succeeded.
	d := submitWaitDecided(t, url, slurmSyncJob(t, "sync-ok", 2), "sync-ok")
	node, gpus := d.Nodes[0].Node, slices.Sorted(slices.Values(d.Nodes[0].GPUs))
	id := c.sbatch(t, "-w", node, gresOf(gpus), "-J", "sync-ok", "--comment", "toposched-job=sync-ok", "-o", "/dev/null", "--wrap", "sleep 1")
	if got := c.waitRunning(t, id).GPUs[node]; !slices.Equal(got, gpus) {
		t.Fatalf("slurm job %d got %s's GPUs %v, asked for %v", id, node, got, gpus)
	}
	waitFor(t, 30*time.Second, func() (bool, string) {
		mustBeAlive(t, serve)
		_, ok := releasedIn(t, js, "sync-ok")
		return ok, "sync-ok not released"
	})
	fin := finishedOf(t, js, "sync-ok")
	if len(fin) != 1 || fin[0]["status"] != "succeeded" {
		t.Errorf("jobs.finished of sync-ok: %v, want one, succeeded", fin)
	}
	for _, h := range helds(t, js, node) {
		if len(h.GPUs) > 0 {
			t.Errorf("topology.held.%s lists %v by %v: sync-ok's GPUs are placement's", node, h.GPUs, h.By)
		}
	}

	// On other GPUs than decided: reported, not stopped, its GPUs held,
	// and finished (cancelled) once cancelled. Its task is stopped too: scancel alone
	// was seen to leave the task behind.
	d = submitWaitDecided(t, url, slurmSyncJob(t, "sync-moved", 2), "sync-moved")
	node, gpus = d.Nodes[0].Node, d.Nodes[0].GPUs
	var other []int
	for g := range slurmGPUs {
		if !slices.Contains(gpus, g) && len(other) < len(gpus) {
			other = append(other, g)
		}
	}
	id = c.sbatch(t, "-w", node, gresOf(other), "-J", "sync-moved", "--comment", "toposched-job=sync-moved", "-o", "/dev/null", "--wrap", untilStopped(c, "moved"))
	c.waitRunning(t, id)
	waitFor(t, 30*time.Second, func() (bool, string) {
		mustBeAlive(t, serve)
		out := serve.output()
		return strings.Contains(out, "job runs elsewhere than decided") && strings.Contains(out, "sync-moved"),
			"serve has not reported sync-moved running elsewhere than decided"
	})
	if j := c.waitRunning(t, id); j.State != "RUNNING" {
		t.Errorf("slurm job %d of sync-moved: %s, want it left running", id, j.State)
	}
	// The GPUs it holds are none of its decision's: held, so that
	// placement does not give them out too.
	waitHeld(t, js, serve, node, other)
	c.mustRun(t, "scancel", fmt.Sprint(id))
	stop(t, c, "moved")
	waitFor(t, 30*time.Second, func() (bool, string) {
		mustBeAlive(t, serve)
		_, ok := releasedIn(t, js, "sync-moved")
		return ok, "sync-moved not released"
	})
	if fin := finishedOf(t, js, "sync-moved"); len(fin) != 1 || fin[0]["status"] != "cancelled" {
		t.Errorf("jobs.finished of sync-moved: %v, want one, cancelled", fin)
	}
	waitHeld(t, js, serve, node, nil)
}

// TestSlurmSyncApart runs the service as toposched slurm-sync beside
// serve, signed in as its own NATS role (slurm): it may publish the holds
// and take its lease, and a job sbatch'ed to Slurm is held, then freed.
func TestSlurmSyncApart(t *testing.T) {
	c := startSlurm(t, []slurmNode{{"n1", topoPairsBySocket}})
	dataDir := filepath.Join(t.TempDir(), "data")
	// The service's seed, slurm.nk, as an administrator issues it before
	// serve starts.
	issueRoles(t, credentialsDir(dataDir), "--services")
	port := freePort(t)
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)
	startServe(t, "serve", c.ClusterFile, port, dataDir)
	syncer := startProc(t, "slurm-sync", childEnv("TOPOSCHED_DATA_DIR="+dataDir, "SLURM_CONF="+c.Conf), bins.toposched,
		"slurm-sync", "--nats-url", url, "--lease-ttl", "2s")
	waitFor(t, time.Minute, func() (bool, string) {
		mustBeAlive(t, syncer)
		return strings.Contains(syncer.output(), "syncing with Slurm"), "slurm-sync has not logged 'syncing with Slurm'"
	})
	js := jsConnect(t, url)
	id := c.sbatch(t, "-w", "n1", "--gres=gpu:3", "-J", "foreign", "-o", "/dev/null", "--wrap", untilStopped(c, "apart"))
	gpus := c.waitRunning(t, id).GPUs["n1"]
	h := waitHeld(t, js, syncer, "n1", gpus)
	if want := fmt.Sprintf("slurm job %d (root)", id); h.By[0] != want {
		t.Errorf("topology.held.n1 by %q, want %q", h.By[0], want)
	}
	stop(t, c, "apart")
	waitHeld(t, js, syncer, "n1", nil)
}
