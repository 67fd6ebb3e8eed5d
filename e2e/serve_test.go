package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// startServe runs `toposched serve` (with extra flags) with its embedded
// NATS on port and returns once its services are running. Its server
// requires the credentials serve keeps in dataDir, as by default (with
// extra's --nats-config, the config's users must be those of dataDir's
// credentials): the helpers that talk to it sign in with them
// (registerServe).
func startServe(t testing.TB, name, cluster string, port int, dataDir string, extra ...string) *proc {
	t.Helper()
	return startServeEnv(t, name, nil, cluster, port, dataDir, extra...)
}

// startServeEnv is startServe with env added to serve's environment.
func startServeEnv(t testing.TB, name string, env []string, cluster string, port int, dataDir string, extra ...string) *proc {
	t.Helper()
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	if slices.Contains(extra, "--insecure-loopback") {
		t.Fatalf("startServe %s: --insecure-loopback: the e2e tests sign in as users do", name)
	}
	registerServe(t, addr, dataDir)
	p := startProc(t, name, childEnv(env...), bins.toposched,
		append([]string{"serve", "--cluster", cluster, "--listen", addr, "--data-dir", dataDir}, extra...)...)
	waitFor(t, 30*time.Second, func() (bool, string) {
		mustBeAlive(t, p)
		if !strings.Contains(p.output(), "services running") {
			return false, name + " has not logged 'services running'"
		}
		return dialable(addr)
	})
	return p
}

// writeJob writes a job file asking for gpus A100s, eight per node.
func writeJob(t *testing.T, dir, id string, gpus int) string {
	t.Helper()
	path := filepath.Join(dir, id+".yaml")
	body := fmt.Sprintf("job_id: %s\ngpus: %d\ngpus_per_node: 8\ngpu_model: A100-SXM4-80GB\nparallelism:\n  tp: 8\n", id, gpus)
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// topoctlEvent is one line of `topoctl -o json`.
type topoctlEvent struct {
	Event string          `json:"event"`
	ID    string          `json:"id"`
	Data  json.RawMessage `json:"data"`
}

// parseTopoctlJSON reads the complete lines of topoctl's JSON output.
func parseTopoctlJSON(t *testing.T, out string) []topoctlEvent {
	t.Helper()
	var evs []topoctlEvent
	for line := range strings.Lines(out) {
		if !strings.HasSuffix(line, "\n") || strings.TrimSpace(line) == "" {
			continue // still being written
		}
		var ev topoctlEvent
		if err := json.Unmarshal([]byte(line), &ev); err != nil {
			t.Fatalf("topoctl -o json line %q: %v", line, err)
		}
		evs = append(evs, ev)
	}
	return evs
}

// submitWaitDecided submits a job file with `topoctl submit --wait -o json`
// and returns its decision.
func submitWaitDecided(t *testing.T, url, file, id string) decidedJSON {
	t.Helper()
	out := topoctlOK(t, url, "submit", file, "--wait", "--timeout", "30s", "-o", "json")
	evs := parseTopoctlJSON(t, out)
	if len(evs) == 0 || evs[len(evs)-1].Event != "placement.decided" {
		t.Fatalf("topoctl submit %s --wait: want a decision last, got:\n%s", id, out)
	}
	var d decidedJSON
	if err := json.Unmarshal(evs[len(evs)-1].Data, &d); err != nil || d.JobID != id {
		t.Fatalf("topoctl submit %s --wait: decision %s: %v", id, evs[len(evs)-1].Data, err)
	}
	return d
}

// waitOutcome waits for the first decided, pending or rejected event about
// job in the placement stream.
func waitOutcome(t *testing.T, js jetstream.JetStream, job string, procs ...*proc) placementEvent {
	t.Helper()
	var got placementEvent
	waitFor(t, 30*time.Second, func() (bool, string) {
		mustBeAlive(t, procs...)
		for _, ev := range readPlacements(t, js) {
			if ev.jobID == job && ev.subject != subjectReleased {
				got = ev
				return true, ""
			}
		}
		return false, "no outcome for " + job + " in " + streamPlacement
	})
	return got
}

// TestServeRestartKeepsPendingAndAllocations fills a two-node cluster,
// leaves a job waiting, stops serve with SIGTERM and starts it again on the
// same data dir: the allocations and the queue must survive, and a finish
// after the restart must place the job that waited.
func TestServeRestartKeepsPendingAndAllocations(t *testing.T) {
	needBinaries(t)
	t.Parallel()

	dataDir, jobs := t.TempDir(), t.TempDir()
	port := freePort(t)
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)
	cluster := testdata(t, "two-nodes.yaml")

	serve1 := startServe(t, "serve (first run)", cluster, port, dataDir)
	js := jsConnect(t, url)
	waitFor(t, 30*time.Second, func() (bool, string) {
		mustBeAlive(t, serve1)
		return consumerDrained(js, streamTopology, durablePlacementTopology, 2)
	})

	// Fill both nodes, then queue a third job.
	first := map[string]decidedJSON{}
	for _, id := range []string{"keep-a", "keep-b"} {
		first[id] = submitWaitDecided(t, url, writeJob(t, jobs, id, 8), id)
	}
	if out := topoctlOK(t, url, "submit", writeJob(t, jobs, "keep-waiting", 8)); !strings.Contains(out, "submitted keep-waiting") {
		t.Errorf("topoctl submit without --wait printed %q, want 'submitted keep-waiting'", out)
	}
	if ev := waitOutcome(t, js, "keep-waiting", serve1); ev.subject != subjectPending {
		t.Fatalf("keep-waiting on a full cluster: got %s %s, want pending", ev.subject, ev.body)
	}

	// Graceful stop.
	serve1.signal(t, syscall.SIGTERM)
	if code := serve1.waitExit(t, 30*time.Second); code != 0 {
		t.Fatalf("serve exited %d after SIGTERM, want 0", code)
	}
	if !regexp.MustCompile(`msg="?stopped"?`).MatchString(serve1.output()) {
		t.Errorf("serve's log does not say it stopped:\n%s", serve1.output())
	}

	// Same data dir, same port.
	serve2 := startServe(t, "serve (after restart)", cluster, port, dataDir)
	js2 := jsConnect(t, url)
	live, pending := auditPlacements(t, readPlacements(t, js2))
	if _, ok := live["keep-waiting"]; ok || !pending["keep-waiting"] {
		t.Fatalf("after restart keep-waiting is not pending (live %v, pending %v)", keys(live), keys(pending))
	}
	// (a) A job that fits only if the allocations were forgotten waits.
	topoctlOK(t, url, "submit", writeJob(t, jobs, "keep-late", 8))
	if ev := waitOutcome(t, js2, "keep-late", serve2); ev.subject != subjectPending {
		t.Fatalf("after restart keep-late got %s %s, want pending: the allocations of keep-a and keep-b were lost",
			ev.subject, ev.body)
	}

	// (b) Finishing keep-a places the job that waited before the restart,
	// seen through `topoctl watch --all -o json`.
	watch := startTopoctl(t, "topoctl watch", url, "watch", "--all", "-o", "json")
	if out := topoctlOK(t, url, "finish", "keep-a"); !strings.Contains(out, "finished keep-a") {
		t.Errorf("topoctl finish printed %q, want 'finished keep-a'", out)
	}
	var waitingGot decidedJSON
	waitFor(t, 30*time.Second, func() (bool, string) {
		mustBeAlive(t, serve2, watch)
		var seen []string
		for _, ev := range parseTopoctlJSON(t, watch.output()) {
			var d decidedJSON
			if err := json.Unmarshal(ev.Data, &d); err != nil {
				t.Fatalf("topoctl watch: %s %s: %v", ev.Event, ev.Data, err)
			}
			if ev.Event == "placement.decided" && d.JobID == "keep-waiting" {
				waitingGot = d
				return true, ""
			}
			seen = append(seen, ev.Event+" "+d.JobID)
		}
		return false, fmt.Sprintf("topoctl watch has shown %v", seen)
	})
	watch.signal(t, os.Interrupt)
	if code := watch.waitExit(t, 10*time.Second); code != 0 {
		t.Errorf("topoctl watch exited %d on interrupt, want 0", code)
	}
	if !slices.Equal(sortedGPUs(waitingGot), sortedGPUs(first["keep-a"])) {
		t.Errorf("keep-waiting got %v, want the GPUs keep-a freed: %v", sortedGPUs(waitingGot), sortedGPUs(first["keep-a"]))
	}

	// The whole log: one decision at most per job, no GPU held twice,
	// and every job either decided once or still waiting.
	evs := readPlacements(t, js2)
	live, pending = auditPlacements(t, evs)
	decisions := map[string]int{}
	for _, ev := range evs {
		if ev.subject == subjectDecided {
			decisions[ev.jobID]++
		}
	}
	for _, c := range []struct {
		job       string
		decisions int
		live      bool
		pending   bool
	}{
		{"keep-a", 1, false, false},
		{"keep-b", 1, true, false},
		{"keep-waiting", 1, true, false},
		{"keep-late", 0, false, true},
	} {
		_, isLive := live[c.job]
		if decisions[c.job] != c.decisions || isLive != c.live || pending[c.job] != c.pending {
			t.Errorf("%s: %d decisions, live %v, pending %v; want %d, %v, %v",
				c.job, decisions[c.job], isLive, pending[c.job], c.decisions, c.live, c.pending)
		}
	}
	mustBeAlive(t, serve2)
	if strings.Contains(serve2.output(), "double booking") {
		t.Errorf("the optimizer found a double booking:\n%s", serve2.output())
	}
}

func sortedGPUs(d decidedJSON) []string {
	var out []string
	for _, g := range d.gpus() {
		out = append(out, fmt.Sprintf("%s/%d", g.node, g.gpu))
	}
	slices.Sort(out)
	return out
}

// TestTopoctlSubmitWaitPrintsTable checks what a person sees from topoctl:
// the decision table, schema errors caught before anything is sent, help.
func TestTopoctlSubmitWaitPrintsTable(t *testing.T) {
	needBinaries(t)
	t.Parallel()

	port := freePort(t)
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)
	serve := startServe(t, "serve", testdata(t, "cluster.yaml"), port, t.TempDir())
	js := jsConnect(t, url)
	waitFor(t, 30*time.Second, func() (bool, string) {
		mustBeAlive(t, serve)
		return consumerDrained(js, streamTopology, durablePlacementTopology, 6)
	})

	out := topoctlOK(t, url, "submit", filepath.Join(moduleRoot, "deploy", "examples", "jobs", "llm-tp8-dp2.yaml"),
		"--wait", "--timeout", "30s")
	for _, want := range []string{"llm-tp8-dp2: decided", "NODE", "CUDA_VISIBLE_DEVICES", "dgx-a100-001", "0-7"} {
		if !strings.Contains(out, want) {
			t.Errorf("topoctl submit --wait output lacks %q:\n%s", want, out)
		}
	}
	for _, row := range []string{
		`(?m)^\s*dgx-a100-001\s+0-7\s+0,1,2,3,4,5,6,7\s*$`,
		`(?m)^\s*dgx-a100-002\s+8-15\s+0,1,2,3,4,5,6,7\s*$`,
	} {
		if !regexp.MustCompile(row).MatchString(out) {
			t.Errorf("topoctl submit --wait output has no row matching %s:\n%s", row, out)
		}
	}

	// explain reads the job's events back from the real server's streams.
	out = topoctlOK(t, url, "explain", "llm-tp8-dp2")
	for _, want := range []string{"llm-tp8-dp2: decided at", "jobs.submitted", "jobs.analyzed", "placement.decided",
		"RANK  NODE", "predicted communication per step"} {
		if !strings.Contains(out, want) {
			t.Errorf("topoctl explain output lacks %q:\n%s", want, out)
		}
	}
	if r := topoctl(t, url, "explain", "never-submitted"); r.code == 0 || !strings.Contains(r.stderr, "no events for job never-submitted on toposched") {
		t.Errorf("topoctl explain of an unknown job: exit %d\n%s", r.code, r.stderr)
	}

	// A job file that breaks the schema fails before anything is sent:
	// nothing reaches the jobs stream, and it fails the same way when no
	// server is there at all.
	dir := t.TempDir()
	before := streamMessages(t, js, streamJobs)
	for _, c := range []struct{ file, body, field string }{
		{"typo.yaml", "job_id: schema-typo\ngpus: 8\ngpu_per_node: 8\n", "gpu_per_node"},
		{"zero.yaml", "job_id: schema-zero\ngpus: 0\n", "gpus"},
	} {
		path := filepath.Join(dir, c.file)
		if err := os.WriteFile(path, []byte(c.body), 0o600); err != nil {
			t.Fatal(err)
		}
		for _, target := range []string{url, "nats://127.0.0.1:1"} {
			r := topoctl(t, target, "submit", path, "--wait", "--timeout", "10s")
			if r.code == 0 {
				t.Errorf("topoctl submit %s (server %s) exited 0, want a failure\n%s", c.file, target, r.stdout)
				continue
			}
			if !strings.Contains(r.stderr, c.field) || !strings.Contains(r.stderr, c.file) {
				t.Errorf("topoctl submit %s (server %s): error does not name the file and field %q:\n%s",
					c.file, target, c.field, r.stderr)
			}
			if strings.Contains(r.stderr, "connect") {
				t.Errorf("topoctl submit %s (server %s): it tried to connect before checking the file:\n%s",
					c.file, target, r.stderr)
			}
		}
	}
	if after := streamMessages(t, js, streamJobs); after != before {
		t.Errorf("%s went from %d to %d messages: an invalid job file was sent", streamJobs, before, after)
	}

	for _, args := range [][]string{{"--help"}, {"submit", "--help"}} {
		r := runCmd(t, 10*time.Second, childEnv(), bins.topoctl, args...)
		if r.code != 0 || !strings.Contains(r.stdout, "submit") {
			t.Errorf("topoctl %s: exit %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), r.code, r.stdout, r.stderr)
		}
	}
	mustBeAlive(t, serve)
}

// TestDemo runs `toposched demo` to the end.
func TestDemo(t *testing.T) {
	needBinaries(t)
	t.Parallel()

	// The demo's own timeout is under ours, so that a demo stuck waiting
	// says so itself.
	start := time.Now()
	r := runCmd(t, 60*time.Second, childEnv(), bins.toposched, "demo", "--timeout", "45s")
	if r.code != 0 {
		t.Fatalf("toposched demo: exit %d after %s\nstdout:\n%s\nstderr:\n%s",
			r.code, time.Since(start).Round(time.Millisecond), r.stdout, r.stderr)
	}
	// Its embedded server is on loopback only.
	if !strings.Contains(r.stdout, "embedded NATS at nats://127.0.0.1:") {
		t.Errorf("toposched demo's embedded NATS is not on 127.0.0.1:\n%s", r.stdout)
	}
	for _, line := range []string{
		`(?m)^llm-tp8-dp2: decided\b`,
		`(?m)^moe-ep4: decided\b`,
		`(?m)^too-big: rejected\b`,
		`(?m)^bad-parallelism: rejected\b`,
	} {
		if !regexp.MustCompile(line).MatchString(r.stdout) {
			t.Errorf("toposched demo output has no line matching %s:\n%s", line, r.stdout)
		}
	}
	t.Logf("toposched demo took %s", time.Since(start).Round(time.Millisecond))
}
