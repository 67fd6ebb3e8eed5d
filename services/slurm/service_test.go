package slurm

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/events/bus"
	"github.com/toposched/toposched/events/eventstest"
)

const waitTimeout = 30 * time.Second

// fakeSqueue is a squeue script whose output the test sets: the file
// out.json, or a failure while the file fail exists. Each call adds a line
// to calls, so that the test can wait for polls instead of sleeping.
type fakeSqueue struct {
	t    *testing.T
	dir  string
	path string
}

func newFakeSqueue(t *testing.T) *fakeSqueue {
	dir := t.TempDir()
	f := &fakeSqueue{t: t, dir: dir, path: filepath.Join(dir, "squeue")}
	script := fmt.Sprintf(`#!/bin/sh
echo x >> %[1]s/calls
if [ -f %[1]s/fail ]; then echo "squeue: error: Unable to contact slurm controller (connect failure)" >&2; exit 1; fi
cat %[1]s/out.json
`, dir)
	if err := os.WriteFile(f.path, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	f.set(`{"errors":[],"jobs":[]}`)
	return f
}

// set makes the next calls print doc (renamed into place, so that no call
// reads half of it).
func (f *fakeSqueue) set(doc string) {
	tmp := filepath.Join(f.dir, "out.json.tmp")
	if err := os.WriteFile(tmp, []byte(doc), 0o600); err != nil {
		f.t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(f.dir, "out.json")); err != nil {
		f.t.Fatal(err)
	}
}

// fail makes the next calls fail (on) or answer (off).
func (f *fakeSqueue) fail(on bool) {
	p := filepath.Join(f.dir, "fail")
	if on {
		if err := os.WriteFile(p, nil, 0o600); err != nil {
			f.t.Fatal(err)
		}
	} else if err := os.Remove(p); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fakeSqueue) calls() int {
	b, _ := os.ReadFile(filepath.Join(f.dir, "calls"))
	return bytes.Count(b, []byte("\n"))
}

// waitPolls waits until squeue was called n more times than now, and then
// once more, so that the service has handled the n-th call's output.
func (f *fakeSqueue) waitPolls(n int) {
	f.t.Helper()
	want := f.calls() + n + 1
	eventually(f.t, fmt.Sprintf("%d polls", n), func() (bool, string) {
		return f.calls() >= want, fmt.Sprintf("%d calls", f.calls())
	})
}

// syncLog is the service's log, kept for the test to read.
type syncLog struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *syncLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *syncLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// env is the service polling a fake squeue, on an embedded NATS server,
// with the test's own connection reading what it publishes.
type env struct {
	t      *testing.T
	squeue *fakeSqueue
	b      *bus.Bus
	log    *syncLog
	ctx    context.Context

	mu   sync.Mutex
	pubs []bus.Record // topology.held and jobs.finished, in order
}

func startEnv(t *testing.T, cfg Config, before ...any) *env {
	t.Helper()
	srv := eventstest.Server(t)
	e := &env{t: t, squeue: newFakeSqueue(t), b: eventstest.Bus(t, srv.ClientURL(), "test"), log: &syncLog{}}
	e.ctx = eventstest.Context(t, 2*time.Minute)
	for _, ev := range before {
		if _, err := e.b.Publish(e.ctx, ev); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []struct {
		domain events.Domain
		name   events.Name
	}{{events.DomainTopology, events.NameTopologyHeld}, {events.DomainJobs, events.NameJobFinished}} {
		ctx, cancel := context.WithCancel(e.ctx)
		done := make(chan error, 1)
		go func() {
			done <- e.b.FollowFrom(ctx, f.domain, []string{e.b.Subjects.Of(f.name)}, 0, nil, func(r bus.Record) error {
				e.mu.Lock()
				e.pubs = append(e.pubs, r)
				e.mu.Unlock()
				return nil
			})
		}()
		t.Cleanup(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("follow %s: %v", f.name, err)
			}
		})
	}
	cfg.Squeue, cfg.Interval = e.squeue.path, 10*time.Millisecond
	log := slog.New(slog.NewTextHandler(e.log, &slog.HandlerOptions{Level: slog.LevelDebug}))
	svc, err := New(cfg, Deps{Bus: eventstest.Bus(t, srv.ClientURL(), "slurm"), Log: log})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(e.ctx)
	ran := make(chan error, 1)
	go func() { ran <- svc.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-ran; err != nil {
			t.Errorf("service: %v", err)
		}
		if t.Failed() {
			t.Logf("service log:\n%s", e.log.String())
		}
	})
	select {
	case <-svc.Ready():
	case err := <-ran:
		ran <- err
		t.Fatalf("service ended before it was ready: %v", err)
	case <-time.After(waitTimeout):
		t.Fatalf("service not ready within %s", waitTimeout)
	}
	return e
}

// published returns what the service published so far, as text: "held
// <node> <index>=<by>;..." and "finished <job> <status>".
func (e *env) published() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []string
	for _, r := range e.pubs {
		switch r.Name {
		case events.NameTopologyHeld:
			var ev events.TopologyHeld
			if err := e.b.Decode(r.Name, r.Body, &ev); err != nil {
				e.t.Fatal(err)
			}
			out = append(out, "held "+ev.Node+" "+heldKey(ev.GPUs))
		case events.NameJobFinished:
			var ev events.JobFinished
			if err := e.b.Decode(r.Name, r.Body, &ev); err != nil {
				e.t.Fatal(err)
			}
			out = append(out, "finished "+ev.JobID+" "+string(ev.Status))
		}
	}
	return out
}

// waitPublished waits until the service has published exactly want, in
// any order: the two streams are followed apart, so their records
// interleave as they come.
func (e *env) waitPublished(want ...string) {
	e.t.Helper()
	want = slices.Sorted(slices.Values(want))
	eventually(e.t, "published "+strings.Join(want, ", "), func() (bool, string) {
		got := slices.Sorted(slices.Values(e.published()))
		return slices.Equal(got, want), fmt.Sprintf("published %q", got)
	})
}

func eventually(t *testing.T, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		ok, state := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s: %s", what, waitTimeout, state)
		}
		<-tick.C
	}
}

// squeueDoc is a squeue --json document of jobs, each
// "id state user comment nodes gres_detail;gres_detail...".
func squeueJSON(jobs ...string) string {
	var parts []string
	for _, j := range jobs {
		f := strings.Fields(j)
		comment := f[3]
		if comment == "-" {
			comment = ""
		}
		var details []string
		for d := range strings.SplitSeq(f[5], ";") {
			details = append(details, fmt.Sprintf("%q", d))
		}
		parts = append(parts, fmt.Sprintf(`{"job_id":%s,"job_state":%q,"user_name":%q,"comment":%q,"nodes":%q,"gres_detail":[%s]}`,
			f[0], f[1], f[2], comment, f[4], strings.Join(details, ",")))
	}
	return `{"errors":[],"jobs":[` + strings.Join(parts, ",") + `]}`
}

func TestServiceHoldsAndFreesForeignJobs(t *testing.T) {
	e := startEnv(t, Config{})
	e.squeue.set(squeueJSON("5 RUNNING alice - n[1-2] gpu:h100:2(IDX:0-1);gpu:h100:1(IDX:3)"))
	e.waitPublished("held n1 0=slurm job 5 (alice);1=slurm job 5 (alice);", "held n2 3=slurm job 5 (alice);")
	// The same queue again: nothing new.
	e.squeue.waitPolls(3)
	e.squeue.set(squeueJSON("5 COMPLETED alice - n[1-2] gpu:h100:2(IDX:0-1);gpu:h100:1(IDX:3)"))
	e.waitPublished("held n1 0=slurm job 5 (alice);1=slurm job 5 (alice);", "held n2 3=slurm job 5 (alice);",
		"held n1 ", "held n2 ")
}

// A failed read publishes nothing, not even the freeing of what was held,
// and is logged once per outage.
func TestServiceOutagePublishesNothing(t *testing.T) {
	e := startEnv(t, Config{})
	e.squeue.set(squeueJSON("5 RUNNING alice - n1 gpu:h100:1(IDX:2)"))
	e.waitPublished("held n1 2=slurm job 5 (alice);")

	// slurmctld down, as squeue 22.05 says it: exit 0, no jobs, errors.
	down, err := os.ReadFile("testdata/squeue-ctld-down.json")
	if err != nil {
		t.Fatal(err)
	}
	e.squeue.set(string(down))
	e.squeue.waitPolls(5)
	// squeue failing outright.
	e.squeue.fail(true)
	e.squeue.waitPolls(5)
	if got := e.published(); len(got) != 1 {
		t.Errorf("published during the outage: %q", got[1:])
	}
	if n := strings.Count(e.log.String(), "cannot read the queue"); n != 1 {
		t.Errorf("outage logged %d times, want once:\n%s", n, e.log.String())
	}
	e.squeue.fail(false)
	e.squeue.set(squeueJSON())
	e.waitPublished("held n1 2=slurm job 5 (alice);", "held n1 ")
	if !strings.Contains(e.log.String(), "squeue answers again") {
		t.Errorf("the end of the outage not logged:\n%s", e.log.String())
	}
}

func TestServiceOutputBound(t *testing.T) {
	e := startEnv(t, Config{MaxOutput: 100})
	e.squeue.set(squeueJSON("5 RUNNING alice - n1 gpu:h100:1(IDX:2)", "6 RUNNING bob - n1 gpu:h100:1(IDX:3)"))
	e.squeue.waitPolls(3)
	if got := e.published(); len(got) != 0 {
		t.Errorf("published from an output over the bound: %q", got)
	}
	if !strings.Contains(e.log.String(), "output over 100 bytes") {
		t.Errorf("the bound not logged:\n%s", e.log.String())
	}
}

func decision(id, node string, gpus ...int) *events.PlacementDecided {
	d := &events.PlacementDecided{JobID: id, Strategy: "ddp", DecidedAt: time.Unix(0, 0).UTC(),
		Nodes: []events.NodePlacement{{Node: node, GPUs: gpus}}}
	var cvd []string
	for i, g := range gpus {
		cvd = append(cvd, fmt.Sprint(g))
		d.Ranks = append(d.Ranks, events.RankPlacement{Rank: i, Node: node, GPU: g, LocalRank: i})
	}
	d.Nodes[0].CUDAVisibleDevices = strings.Join(cvd, ",")
	return d
}

// A decided job's Slurm job: its GPUs are not held, it is finished once
// when it ends, with Slurm's state; a job toposched does not know of is
// not finished, and its GPUs are held.
func TestServiceFinishesDecidedJobsOnce(t *testing.T) {
	e := startEnv(t, Config{}, decision("tj1", "n1", 0, 1), decision("tj2", "n1", 2), &events.JobFinished{JobID: "tj2", Status: events.StatusSucceeded})
	e.squeue.set(squeueJSON("7 RUNNING bob toposched-job=tj1 n1 gpu:g0:1(IDX:0),gpu:g1:1(IDX:1)",
		"8 RUNNING bob toposched-job=tj2 n2 gpu:h100:1(IDX:0)"))
	// tj2 finished in toposched (the test's jobs.finished, read before
	// its decision at rebuild): its Slurm job's GPUs are Slurm's.
	e.waitPublished("finished tj2 succeeded", "held n2 0=slurm job 8 (bob);")
	e.squeue.set(squeueJSON("7 FAILED bob toposched-job=tj1 n1 gpu:g0:1(IDX:0),gpu:g1:1(IDX:1)",
		"8 COMPLETED bob toposched-job=tj2 n2 gpu:h100:1(IDX:0)"))
	e.waitPublished("finished tj2 succeeded", "held n2 0=slurm job 8 (bob);", "finished tj1 failed", "held n2 ")
	e.squeue.waitPolls(3)
	e.squeue.set(squeueJSON())
	e.squeue.waitPolls(3)
	e.waitPublished("finished tj2 succeeded", "held n2 0=slurm job 8 (bob);", "finished tj1 failed", "held n2 ")
	if strings.Contains(e.log.String(), "elsewhere than decided") {
		t.Errorf("tj1 ran where decided, yet reported:\n%s", e.log.String())
	}
}

// A Slurm job that leaves the queue before a poll saw it end finishes
// its job as lost; one on other GPUs than decided is reported once and
// not stopped.
func TestServiceLostAndMismatch(t *testing.T) {
	e := startEnv(t, Config{}, decision("tj1", "n1", 0, 1))
	e.squeue.set(squeueJSON("7 RUNNING bob toposched-job=tj1 n1 gpu:h100:2(IDX:1-2)"))
	// GPU 2 is outside the decision: held, so that placement does not
	// give it out as well.
	e.waitPublished("held n1 2=slurm job 7 (bob);")
	e.squeue.waitPolls(3)
	if n := strings.Count(e.log.String(), "elsewhere than decided"); n != 1 {
		t.Errorf("mismatch reported %d times, want once:\n%s", n, e.log.String())
	}
	if !strings.Contains(e.log.String(), "n1: decided GPUs [0 1], Slurm gave [1 2]") {
		t.Errorf("the mismatch's report does not say what differs:\n%s", e.log.String())
	}
	e.squeue.set(squeueJSON())
	e.waitPublished("held n1 2=slurm job 7 (bob);", "finished tj1 lost", "held n1 ")
}

// placeholderJSON is a squeue --json job of the placeholder of toposched
// job id: held, so pending on no node, or ended.
func placeholderJSON(slurmID int, state, id string) string {
	return fmt.Sprintf(`{"job_id":%d,"job_state":%q,"user_name":"bob","comment":%q,"nodes":"","gres_detail":[]}`,
		slurmID, state, CommentPrefix+id+PlaceholderSuffix)
}

// A placeholder's end is not its job's: cancelled as its job is decided
// (topoctl run --slurm cancels it, then starts srun), or gone from the
// queue, it finishes nothing; pending it holds nothing. The job's own
// Slurm job after it is the job's as before.
func TestServicePlaceholderIsNotTheJob(t *testing.T) {
	e := startEnv(t, Config{}, decision("tj1", "n1", 0, 1))
	doc := func(jobs ...string) string { return `{"errors":[],"jobs":[` + strings.Join(jobs, ",") + `]}` }
	e.squeue.set(doc(placeholderJSON(7, "PENDING", "tj1"), placeholderJSON(8, "PENDING", "tj2")))
	e.squeue.waitPolls(3)
	e.squeue.set(doc(placeholderJSON(7, "CANCELLED", "tj1"), placeholderJSON(8, "CANCELLED", "tj2")))
	e.squeue.waitPolls(3)
	e.squeue.set(doc())
	e.squeue.waitPolls(3)
	if got := e.published(); len(got) != 0 {
		t.Fatalf("published for placeholders: %q", got)
	}
	e.squeue.set(doc(placeholderJSON(7, "CANCELLED", "tj1"),
		`{"job_id":9,"job_state":"RUNNING","user_name":"bob","comment":"toposched-job=tj1","nodes":"n1","gres_detail":["gpu:g0:1(IDX:0),gpu:g1:1(IDX:1)"]}`))
	e.squeue.waitPolls(3)
	if got := e.published(); len(got) != 0 {
		t.Fatalf("published for a job running where decided: %q", got)
	}
	e.squeue.set(doc(placeholderJSON(7, "CANCELLED", "tj1"),
		`{"job_id":9,"job_state":"COMPLETED","user_name":"bob","comment":"toposched-job=tj1","nodes":"n1","gres_detail":["gpu:g0:1(IDX:0),gpu:g1:1(IDX:1)"]}`))
	e.waitPublished("finished tj1 succeeded")
}
