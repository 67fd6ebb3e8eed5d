package launcher

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/events/bus"
	"github.com/toposched/toposched/events/eventstest"
)

// These tests run the agent whole: an embedded NATS server, the events a
// placement would publish, and ranks that are real processes (sh scripts
// that record each start in a file).

// logRecord is one line an agent logged, its attributes as text.
type logRecord struct {
	msg   string
	attrs map[string]string
}

// logRecorder is a slog.Handler that keeps what an agent logs, for tests
// that wait on it.
type logRecorder struct {
	mu      *sync.Mutex
	records *[]logRecord
	attrs   []slog.Attr
}

func newLogRecorder() *logRecorder {
	return &logRecorder{mu: &sync.Mutex{}, records: &[]logRecord{}}
}

func (h *logRecorder) Enabled(context.Context, slog.Level) bool { return true }

func (h *logRecorder) Handle(_ context.Context, r slog.Record) error {
	rec := logRecord{msg: r.Message, attrs: map[string]string{}}
	for _, a := range h.attrs {
		rec.attrs[a.Key] = a.Value.String()
	}
	r.Attrs(func(a slog.Attr) bool {
		rec.attrs[a.Key] = a.Value.String()
		return true
	})
	h.mu.Lock()
	*h.records = append(*h.records, rec)
	h.mu.Unlock()
	return nil
}

func (h *logRecorder) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &logRecorder{mu: h.mu, records: h.records, attrs: append(slices.Clone(h.attrs), attrs...)}
}

func (h *logRecorder) WithGroup(string) slog.Handler { return h }

// find returns the records with message msg and, for each key of attrs,
// that value.
func (h *logRecorder) find(msg string, attrs ...string) []logRecord {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []logRecord
	for _, r := range *h.records {
		if r.msg != msg {
			continue
		}
		ok := true
		for i := 0; i+1 < len(attrs); i += 2 {
			ok = ok && r.attrs[attrs[i]] == attrs[i+1]
		}
		if ok {
			out = append(out, r)
		}
	}
	return out
}

func (h *logRecorder) String() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var sb strings.Builder
	for _, r := range *h.records {
		fmt.Fprintf(&sb, "%s %v\n", r.msg, r.attrs)
	}
	return sb.String()
}

// waitUntil polls cond until it holds, failing the test with what it
// says after d.
func waitUntil(t *testing.T, d time.Duration, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(d)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		ok, why := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %s: %s", d, why)
		}
		<-tick.C
	}
}

// agentEnv is a NATS server with the streams, a bus of the test's, and a
// node "a" whose agents share one state directory.
type agentEnv struct {
	url   string
	b     *bus.Bus
	ctx   context.Context
	state string
}

func newAgentEnv(t *testing.T) *agentEnv {
	t.Helper()
	srv := eventstest.Server(t)
	return &agentEnv{url: srv.ClientURL(), b: eventstest.Bus(t, srv.ClientURL(), "launcher-test"),
		ctx: eventstest.Context(t, 2*time.Minute), state: t.TempDir()}
}

// runningAgent is one agent run on the env.
type runningAgent struct {
	log  *logRecorder
	stop func()
}

// start runs an agent of node a until stop, and waits until it is ready.
func (e *agentEnv) start(t *testing.T, cfg Config) *runningAgent {
	t.Helper()
	cfg.Node, cfg.StateDir = "a", e.state
	if cfg.Heartbeat == 0 {
		cfg.Heartbeat = 100 * time.Millisecond
	}
	cfg.TuningWait = time.Millisecond
	if cfg.Shim == nil {
		cfg.Shim = testShim()
	}
	if cfg.RunAsAllow == nil {
		cfg.RunAsAllow = selfAllow(t)
	}
	rec := newLogRecorder()
	a, err := New(cfg, Deps{Bus: eventstest.Bus(t, e.url, "agent-a"), Log: slog.New(rec)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(e.ctx)
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	ra := &runningAgent{log: rec}
	var once sync.Once
	ra.stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("agent: %v", err)
			}
		})
	}
	t.Cleanup(ra.stop)
	select {
	case <-a.Ready():
	case err := <-done:
		done <- err // for stop
		t.Fatalf("agent ended before it was ready: %v\n%s", err, rec)
	case <-time.After(30 * time.Second):
		t.Fatalf("after 30s the agent is not ready\n%s", rec)
	}
	return ra
}

// submit publishes a 1-GPU job with a command and its decision on node a,
// GPU gpu.
func (e *agentEnv) submit(t *testing.T, job *events.JobSubmitted, gpu int) {
	t.Helper()
	job.GPUs = 1
	d := &events.PlacementDecided{JobID: job.JobID, Strategy: "topology-aware", DecidedAt: time.Now().UTC(),
		Ranks: []events.RankPlacement{{Rank: 0, Node: "a", GPU: gpu, LocalRank: 0}},
		Nodes: []events.NodePlacement{{Node: "a", GPUs: []int{gpu}, CUDAVisibleDevices: strconv.Itoa(gpu)}}}
	for _, v := range []any{job, d} {
		if _, err := e.b.Publish(e.ctx, v); err != nil {
			t.Fatalf("publish %T: %v", v, err)
		}
	}
}

// finished reads the jobs.finished published so far, by job.
func (e *agentEnv) finished(t *testing.T) map[string]*events.JobFinished {
	t.Helper()
	out := map[string]*events.JobFinished{}
	err := e.b.Replay(e.ctx, events.DomainJobs, []string{e.b.Subjects.Of(events.NameJobFinished)}, func(r bus.Record) error {
		var f events.JobFinished
		if err := bus.Decode(r.Name, r.Body, &f); err != nil {
			return err
		}
		out[f.JobID] = &f
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// startsScript is a rank that appends "JOB PID" to $OUT/starts when it
// starts, then runs until $OUT/stop exists.
const startsScript = `echo "$TOPOSCHED_JOB_ID $$" >> "$OUT/starts"; while [ ! -e "$OUT/stop" ]; do sleep 0.05; done`

// starts reads $OUT/starts: the pids started, by job.
func starts(t *testing.T, out string) map[string][]int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(out, "starts"))
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	got := map[string][]int{}
	for line := range strings.Lines(string(b)) {
		id, pid, ok := strings.Cut(strings.TrimSpace(line), " ")
		if !ok {
			continue
		}
		n, err := strconv.Atoi(pid)
		if err != nil {
			t.Fatalf("starts: %q", line)
		}
		got[id] = append(got[id], n)
	}
	return got
}

// killStarted kills, when the test ends, every rank recorded in
// $OUT/starts that still runs.
func killStarted(t *testing.T, out string) {
	t.Cleanup(func() {
		for _, pids := range starts(t, out) {
			for _, pid := range pids {
				_ = syscall.Kill(-pid, syscall.SIGKILL)
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	})
}

// TestAgentRestartNoDoubleStart: ids that differ only in punctuation, or
// that look like the agent's own file names, are separate jobs, before and
// after the agent restarts; the restarted agent adopts every one of them
// and starts none again. Before the state files were named injectively,
// r:1 and r_1 shared one: the restarted agent adopted one and started the
// other a second time while its first rank still ran; and zz.job.json's
// log directory stood where zz's state file had to go, so zz could not be
// launched.
func TestAgentRestartNoDoubleStart(t *testing.T) {
	t.Parallel()
	e := newAgentEnv(t)
	out := t.TempDir()
	killStarted(t, out)
	ids := []string{"r:1", "r_1", "r.1", "r-1", "zz.job.json", "zz", "x.job.json.tmp", "x", "rank-0.log"}
	first := e.start(t, Config{})
	for i, id := range ids {
		e.submit(t, &events.JobSubmitted{JobID: id, Command: "sh", Args: []string{"-c", startsScript}, Env: []string{"OUT=" + out}}, i)
	}
	waitUntil(t, 30*time.Second, func() (bool, string) {
		got := starts(t, out)
		return len(got) == len(ids), fmt.Sprintf("ranks started: %v", got)
	})
	first.stop()

	second := e.start(t, Config{})
	waitUntil(t, 30*time.Second, func() (bool, string) {
		var missing []string
		for _, id := range ids {
			if len(second.log.find("adopted running ranks", "job_id", id)) == 0 && len(second.log.find("ranks started", "job_id", id)) == 0 {
				missing = append(missing, id)
			}
		}
		return len(missing) == 0, fmt.Sprintf("the restarted agent has neither adopted nor started %v:\n%s", missing, second.log)
	})
	for _, id := range ids {
		if len(second.log.find("ranks started", "job_id", id)) > 0 {
			t.Errorf("the restarted agent started %s again", id)
		}
	}
	if err := os.WriteFile(filepath.Join(out, "stop"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 30*time.Second, func() (bool, string) {
		fin := e.finished(t)
		return len(fin) == len(ids), fmt.Sprintf("jobs finished: %v", fin)
	})
	for id, f := range e.finished(t) {
		if f.Status != events.StatusSucceeded {
			t.Errorf("%s finished %s (%s: %s), want succeeded", id, f.Status, f.Reason, f.Message)
		}
	}
	for id, pids := range starts(t, out) {
		if len(pids) != 1 {
			t.Errorf("%s started %d times (pids %v), want once", id, len(pids), pids)
		}
	}
}

// TestAgentAdoptsLegacyState: an agent upgraded while ranks run adopts
// those its predecessor recorded in the layout before jobs/, by the job_id
// in the file: r_1.job.json was r:1's, and r_1, which never ran, is
// started, once.
func TestAgentAdoptsLegacyState(t *testing.T) {
	t.Parallel()
	e := newAgentEnv(t)
	out := t.TempDir()
	killStarted(t, out)
	// What the older agent left: r:1's rank under its shim, its output
	// and exit file in r_1/, its state in r_1.job.json.
	old := filepath.Join(e.state, "r_1")
	if err := os.MkdirAll(old, 0o755); err != nil {
		t.Fatal(err)
	}
	exitFile := filepath.Join(old, "rank-0.exit")
	script := strings.NewReplacer("$TOPOSCHED_JOB_ID", "r:1", "$OUT", out).Replace(startsScript)
	shim := startShim(t, ShimConfig{ExitFile: exitFile}, "sh", "-c", script)
	waitUntil(t, 30*time.Second, func() (bool, string) {
		return len(starts(t, out)["r:1"]) == 1, "r:1's rank has not started"
	})
	start, err := procStart(shim.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	legacy := fmt.Sprintf(`{"job_id":"r:1","ranks":[{"rank":0,"pid":%d,"start":%d,"log":%q,"exit":%q}]}`,
		shim.Process.Pid, start, filepath.Join(old, "rank-0.log"), exitFile)
	if err := os.WriteFile(filepath.Join(e.state, "r_1.job.json"), []byte(legacy), 0o600); err != nil {
		t.Fatal(err)
	}
	go func() { _ = shim.Wait() }() // the test started it: reap it

	for i, id := range []string{"r:1", "r_1"} {
		e.submit(t, &events.JobSubmitted{JobID: id, Command: "sh", Args: []string{"-c", startsScript}, Env: []string{"OUT=" + out}}, i)
	}
	a := e.start(t, Config{})
	waitUntil(t, 30*time.Second, func() (bool, string) {
		return len(a.log.find("adopted running ranks", "job_id", "r:1")) == 1 && len(starts(t, out)["r_1"]) == 1,
			fmt.Sprintf("r:1 not adopted, or r_1 not started: %v\n%s", starts(t, out), a.log)
	})
	if err := os.WriteFile(filepath.Join(out, "stop"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 30*time.Second, func() (bool, string) {
		fin := e.finished(t)
		return len(fin) == 2, fmt.Sprintf("jobs finished: %v", fin)
	})
	if f := e.finished(t)["r:1"]; f.Status != events.StatusSucceeded {
		t.Errorf("r:1 finished %s (%s: %s), want succeeded: its shim's exit file was read", f.Status, f.Reason, f.Message)
	}
	for id, pids := range starts(t, out) {
		if len(pids) != 1 {
			t.Errorf("%s started %d times, want once", id, len(pids))
		}
	}
	if _, err := os.Stat(filepath.Join(e.state, "r_1.job.json")); !os.IsNotExist(err) {
		t.Errorf("the legacy state file is still there once r:1 ended: %v", err)
	}
}

// TestAgentReportsBeforeForgetting: ranks that end while NATS will not
// take the report, the agent then stopping, leave their state, so that
// the next agent reports them. Before, the state was removed whether the
// report went out or not, and the next agent, finding neither, started
// the job a second time.
func TestAgentReportsBeforeForgetting(t *testing.T) {
	t.Parallel()
	e := newAgentEnv(t)
	out := t.TempDir()
	killStarted(t, out)
	first := e.start(t, Config{})
	e.submit(t, &events.JobSubmitted{JobID: "once", Command: "sh", Args: []string{"-c", startsScript}, Env: []string{"OUT=" + out}}, 0)
	waitUntil(t, 30*time.Second, func() (bool, string) {
		return len(starts(t, out)["once"]) == 1, "the rank has not started"
	})
	// The runtime stream takes nothing more: the report cannot go out.
	js := e.b.JetStream()
	st, err := js.Stream(e.ctx, e.b.StreamName(events.DomainRuntime))
	if err != nil {
		t.Fatal(err)
	}
	cfg := st.CachedInfo().Config
	cfg.Sealed = true
	if _, err := js.UpdateStream(e.ctx, cfg); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(out, "stop"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 30*time.Second, func() (bool, string) {
		return len(first.log.find("ranks_exited not sent", "job_id", "once")) > 0, "the agent has not tried to report"
	})
	first.stop()
	// A new stream for the next agent, whose bus makes it.
	if err := js.DeleteStream(e.ctx, e.b.StreamName(events.DomainRuntime)); err != nil {
		t.Fatal(err)
	}
	second := e.start(t, Config{})
	waitUntil(t, 30*time.Second, func() (bool, string) {
		return e.finished(t)["once"] != nil, fmt.Sprintf("the job has not finished:\n%s", second.log)
	})
	if f := e.finished(t)["once"]; f.Status != events.StatusSucceeded {
		t.Errorf("finished %s (%s: %s), want succeeded: the next agent read the shim's exit file", f.Status, f.Reason, f.Message)
	}
	if n := len(starts(t, out)["once"]); n != 1 {
		t.Errorf("the job started %d times, want once", n)
	}
}

// TestAgentUnreadableState: a job whose state file cannot be read was
// started here: it is reported failed, not started again.
func TestAgentUnreadableState(t *testing.T) {
	t.Parallel()
	e := newAgentEnv(t)
	out := t.TempDir()
	killStarted(t, out)
	jd, err := makeJobDir(e.state, "torn:1")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(jd, stateFile), []byte(`{"job_id": "torn:1", "ranks": [{"ra`), 0o600); err != nil {
		t.Fatal(err)
	}
	e.submit(t, &events.JobSubmitted{JobID: "torn:1", Command: "sh", Args: []string{"-c", startsScript}, Env: []string{"OUT=" + out}}, 0)
	a := e.start(t, Config{})
	waitUntil(t, 30*time.Second, func() (bool, string) {
		return e.finished(t)["torn:1"] != nil, fmt.Sprintf("the job has not finished:\n%s", a.log)
	})
	if f := e.finished(t)["torn:1"]; f.Status != events.StatusFailed || f.Reason != events.ReasonRanksGone {
		t.Errorf("finished %s (%s), want failed (ranks_gone)", f.Status, f.Reason)
	}
	if got := starts(t, out); len(got) != 0 {
		t.Errorf("ranks started: %v, want none", got)
	}
}

// TestAgentLaunchErrorsPrivate: what a failed launch tells the submitter
// (runtime.ranks_exited, jobs.finished) names the job's field and value,
// never the agent's PATH or state directory; the agent's log has those.
// Before, a missing command returned the agent's PATH and a log file the
// agent could not open its state directory.
func TestAgentLaunchErrorsPrivate(t *testing.T) {
	t.Parallel()
	e := newAgentEnv(t)
	// Where rank 0's output of "no-log" would go, a directory.
	jd, err := makeJobDir(e.state, "no-log")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(rankLogPath(jd, 0), 0o700); err != nil {
		t.Fatal(err)
	}
	a := e.start(t, Config{})
	e.submit(t, &events.JobSubmitted{JobID: "no-command", Command: "no-such-program-46"}, 0)
	e.submit(t, &events.JobSubmitted{JobID: "no-log", Command: "sh", Args: []string{"-c", "true"}}, 1)
	waitUntil(t, 30*time.Second, func() (bool, string) {
		return len(e.finished(t)) == 2, fmt.Sprintf("jobs finished: %v", e.finished(t))
	})
	for id, want := range map[string]string{
		"no-command": "a: command: no-such-program-46: not found in the PATH of the agent's environment (the job's env may set PATH)",
		"no-log":     "a: rank 0: the agent could not open its output file (the agent's log says why)",
	} {
		f := e.finished(t)[id]
		if f.Status != events.StatusFailed || f.Reason != events.ReasonLaunchFailed || f.Message != want {
			t.Errorf("%s finished %s (%s): %q, want failed (launch_failed): %q", id, f.Status, f.Reason, f.Message, want)
		}
		for _, private := range []string{os.Getenv("PATH"), e.state} {
			if strings.Contains(f.Message, private) {
				t.Errorf("%s: the message %q holds %q", id, f.Message, private)
			}
		}
		logged := a.log.find("job not launched", "job_id", id)
		if len(logged) != 1 {
			t.Fatalf("%s: %d 'job not launched' lines logged, want 1:\n%s", id, len(logged), a.log)
		}
		if d := logged[0].attrs["detail"]; !strings.Contains(d, "PATH="+os.Getenv("PATH")) && !strings.Contains(d, e.state) {
			t.Errorf("%s: the log's detail %q says neither the PATH nor the file", id, d)
		}
	}
	var exited []*events.RanksExited
	err = e.b.Replay(e.ctx, events.DomainRuntime, []string{e.b.Subjects.Of(events.NameRanksExited)}, func(r bus.Record) error {
		var x events.RanksExited
		if err := bus.Decode(r.Name, r.Body, &x); err != nil {
			return err
		}
		exited = append(exited, &x)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	fields := map[string]string{}
	for _, x := range exited {
		fields[x.JobID] = x.Field
	}
	if want := map[string]string{"no-command": "command", "no-log": ""}; !reflect.DeepEqual(fields, want) {
		t.Errorf("ranks_exited fields %v, want %v", fields, want)
	}
}
