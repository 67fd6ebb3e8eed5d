package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

// The trust soak's settings.
const (
	// soakDefaultMinutes is its length without TOPOSCHED_E2E_SOAK_MINUTES:
	// with start-up and the final drain, about a minute and a half on two
	// cores.
	soakDefaultMinutes = 0.75
	// soakSubmitEvery paces the tenant's valid jobs; soakHostileEvery the
	// hostile acts, in submissions.
	soakSubmitEvery  = 300 * time.Millisecond
	soakHostileEvery = 3
	// soakCheckEvery is how often the invariants are checked while it
	// runs; soakDrain bounds the wait for every job's end.
	soakCheckEvery = 3 * time.Second
	soakDrain      = 120 * time.Second
	// soakRSSBound is serve's resident memory bound, with --memory-limit
	// serveMemoryLimit: its own start-up (about 60 MB), the hostile bodies
	// one at a time, the jobs.
	soakRSSBound = serveRSSBound
)

// soakJob is a job the soak submitted, and what must become of it.
type soakJob struct {
	id     string
	gpus   int
	ranks  int
	status string // the jobs.finished status its release must carry
}

// TestTrustSoak runs `toposched serve`, two `--exec` agents and a tenant's
// steady stream of jobs (each rank writes its start to a file) for
// minutes, while other identities send what a hostile or careless user of
// a shared cluster would, all signed in as themselves: another tenant's
// submissions in the first tenant's name and finishes of its jobs, one
// node's agent's heartbeats for the other node and failed rank exits for
// jobs it has no part in, and the bodies of TestServeBoundsHostileBodies
// with fuzzed ones, one at a time. Every few seconds, and at the end, it
// checks issue 46's invariants:
//   - every job one outcome: each valid job decided once and released once,
//     with the status its command gives (succeeded, or failed for a job
//     whose run_as the agents refuse); no hostile job ever decided;
//   - no GPU in two live jobs at any point of the placement log;
//   - no rank started twice, and every rank of a succeeded job started;
//   - serve's resident memory under soakRSSBound;
//   - every process alive, no message delivered twice to analysis.
//
// TOPOSCHED_E2E_SOAK_MINUTES sets its length, TOPOSCHED_E2E_SEED its seed.
func TestTrustSoak(t *testing.T) {
	needBinaries(t)
	if runtime.GOOS != "linux" {
		t.Skip("reads serve's memory from /proc")
	}
	minutes := soakDefaultMinutes
	if v := os.Getenv("TOPOSCHED_E2E_SOAK_MINUTES"); v != "" {
		m, err := strconv.ParseFloat(v, 64)
		if err != nil || m <= 0 {
			t.Fatalf("TOPOSCHED_E2E_SOAK_MINUTES=%q: want a positive number", v)
		}
		minutes = m
	}
	seed := uint64(time.Now().UnixNano())
	if v := os.Getenv("TOPOSCHED_E2E_SEED"); v != "" {
		s, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("TOPOSCHED_E2E_SEED=%q: %v", v, err)
		}
		seed = s
	}
	t.Logf("soak: %.2f minutes, seed %d (TOPOSCHED_E2E_SEED=%d to run it again)", minutes, seed, seed)
	rng := rand.New(rand.NewPCG(seed, 46))

	c := startSecureCluster(t, "soak.yaml", []string{"research", "ads"}, "--memory-limit", serveMemoryLimit)
	js := jsConnect(t, c.url)
	creds := credentialsDir(c.dataDir)
	research := connectWith(t, c.url, "tenant-research", nkeyOption(t, seedIn(t, creds, "tenant-research")))
	ads := connectWith(t, c.url, "tenant-ads", nkeyOption(t, seedIn(t, creds, "tenant-ads")))
	agent1 := connectWith(t, c.url, "agent-node-001", nkeyOption(t, seedIn(t, creds, "agent-node-001")))
	launcher := connectWith(t, c.url, "launcher", nkeyOption(t, seedIn(t, creds, roleLauncher)))
	starts := filepath.Join(t.TempDir(), "starts")

	jobs := map[string]*soakJob{}
	hostile := map[string]bool{}
	var acts []string
	submit := func(j *soakJob, runAs string) {
		t.Helper()
		script := fmt.Sprintf(`echo "$TOPOSCHED_JOB_ID $RANK" >> %s; sleep 0.%d`, starts, 2+rng.IntN(8))
		body := map[string]any{"job_id": j.id, "gpus": j.gpus, "tenant": "research", "command": "sh", "args": []string{"-c", script}}
		if runAs != "" {
			body["run_as"] = runAs
		}
		b, err := json.Marshal(body)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := research.js.Publish(ctx, "toposched.jobs.submitted.tenant.research", b); err != nil {
			t.Fatalf("submit %s: %v", j.id, err)
		}
		jobs[j.id] = j
	}
	// live is the jobs holding GPUs at the last check, by node.
	var live map[string]decidedJSON
	liveJob := func(not string) (decidedJSON, bool) {
		ids := slices.Sorted(maps.Keys(live))
		rng.Shuffle(len(ids), func(i, k int) { ids[i], ids[k] = ids[k], ids[i] })
		for _, id := range ids {
			d := live[id]
			if not == "" || !slices.ContainsFunc(d.Ranks, func(r rankJSON) bool { return r.Node == not }) {
				return d, true
			}
		}
		return decidedJSON{}, false
	}
	bodies := hostileBodies(0, rng)
	hostileAct := func(n int) {
		t.Helper()
		switch k := rng.IntN(8); k {
		case 0: // another tenant submits in research's name: refused by NATS on research's subject
			id := fmt.Sprintf("x-as-research-%d", n)
			hostile[id] = true
			_ = ads.publish("toposched.jobs.submitted.tenant.research", fmt.Sprintf(`{"job_id":%q,"gpus":1,"tenant":"research","command":"true"}`, id))
			acts = append(acts, "ads submits on research's subject")
		case 1: // ... and on its own subject with research's tenant: analysis refuses it (wrong_scope)
			id := fmt.Sprintf("x-wrong-scope-%d", n)
			hostile[id] = true
			if err := ads.publish("toposched.jobs.submitted.tenant.ads", fmt.Sprintf(`{"job_id":%q,"gpus":1,"tenant":"research","command":"true"}`, id)); err != nil {
				t.Fatalf("ads on its own subject: %v", err)
			}
			acts = append(acts, "ads submits research's job on its own subject")
		case 2: // another tenant finishes research's running job: refused by placement
			if d, ok := liveJob(""); ok {
				if err := ads.publish("toposched.jobs.finished.tenant.ads", fmt.Sprintf(`{"job_id":%q,"status":"cancelled"}`, d.JobID)); err != nil {
					t.Fatalf("ads's finish: %v", err)
				}
				acts = append(acts, "ads finishes a research job")
			}
		case 3: // node-001's agent speaks for node-002: refused on node-002's subject
			_ = agent1.publish("toposched.agent.heartbeat.node-002", `{"node":"node-002","agent":"forged","started_at":"2026-01-01T00:00:00Z","sent_at":"2026-01-01T00:00:00Z","interval_seconds":1,"jobs":[]}`)
			acts = append(acts, "agent-001 beats for node-002")
		case 4: // ... and on its own subject in node-002's name: dropped (wrong_scope)
			if d, ok := liveJob(launchNodes[0]); ok {
				_ = agent1.publish("toposched.runtime.ranks_exited.node-001",
					fmt.Sprintf(`{"job_id":%q,"node":"node-002","status":"failed","reason":"rank_failed","ranks":[]}`, d.JobID))
				acts = append(acts, "agent-001 reports node-002's ranks failed")
			}
		case 5: // ... for a job it runs no rank of, in its own name: ignored by the job's agents
			if d, ok := liveJob(launchNodes[0]); ok {
				_ = agent1.publish("toposched.runtime.ranks_exited.node-001",
					fmt.Sprintf(`{"job_id":%q,"node":"node-001","status":"failed","reason":"rank_failed","ranks":[]}`, d.JobID))
				_ = agent1.publish("toposched.jobs.finished.node.node-001", fmt.Sprintf(`{"job_id":%q,"status":"failed"}`, d.JobID))
				acts = append(acts, "agent-001 fails a job it does not run")
			}
		case 6: // an administrator's careless or hostile bodies, one at a time
			h := bodies[n%len(bodies)]
			id := fmt.Sprintf("%s-%d", h.id, n)
			hostile[id] = true
			m := nats.NewMsg("toposched.jobs.submitted")
			m.Header.Set("ce-subject", id)
			m.Data = h.body
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			if _, err := launcher.js.PublishMsg(ctx, m); err != nil {
				t.Fatalf("hostile body %s (%d bytes): %v", id, len(h.body), err)
			}
			cancel()
			acts = append(acts, "launcher sends "+h.id)
		case 7: // a valid job whose run_as no agent allows: it fails, once
			j := &soakJob{id: fmt.Sprintf("runas-%d", n), gpus: 1, ranks: 1, status: "failed"}
			submit(j, "daemon")
			acts = append(acts, "research runs as daemon")
		}
	}

	check := func(final bool) {
		t.Helper()
		mustBeAlive(t, append([]*proc{c.serve}, slices.Collect(maps.Values(c.agents))...)...)
		evs := readPlacements(t, js)
		live, _ = auditPlacements(t, evs)
		for _, ev := range evs {
			if ev.subject == subjectDecided && hostile[ev.jobID] {
				t.Errorf("hostile job %s was decided (#%d)", ev.jobID, ev.seq)
			}
		}
		if _, hwm := memoryOf(t, c.serve); hwm > soakRSSBound {
			t.Errorf("serve reached %d MB resident (VmHWM), over the soak's bound of %d MB", hwm>>20, soakRSSBound>>20)
		}
		startsOnce(t, starts, jobs, final)
	}

	deadline := time.Now().Add(time.Duration(minutes * float64(time.Minute)))
	tick := time.NewTicker(soakSubmitEvery)
	defer tick.Stop()
	nextCheck := time.Now().Add(soakCheckEvery)
	for n := 0; time.Now().Before(deadline); n++ {
		<-tick.C
		j := &soakJob{id: fmt.Sprintf("soak-%d", n), status: "succeeded"}
		j.gpus = []int{1, 1, 2, 2, 4}[rng.IntN(5)]
		j.ranks = j.gpus
		submit(j, "")
		if n%soakHostileEvery == soakHostileEvery-1 {
			hostileAct(n)
		}
		if time.Now().After(nextCheck) {
			check(false)
			nextCheck = time.Now().Add(soakCheckEvery)
			if t.Failed() {
				break
			}
		}
	}
	tick.Stop()
	t.Logf("soak: %d jobs, %d hostile acts: %s", len(jobs), len(acts), summarise(acts))

	// Drain: every job released.
	waitFor(t, soakDrain, func() (bool, string) {
		mustBeAlive(t, append([]*proc{c.serve}, slices.Collect(maps.Values(c.agents))...)...)
		released := map[string]bool{}
		for _, ev := range readPlacements(t, js) {
			if ev.subject == subjectReleased {
				released[ev.jobID] = true
			}
		}
		var missing []string
		for id := range jobs {
			if !released[id] {
				missing = append(missing, id)
			}
		}
		slices.Sort(missing)
		return len(missing) == 0, fmt.Sprintf("%d of %d jobs not released: %v", len(missing), len(jobs), first(missing, 10))
	})
	check(true)
	counts := map[string]map[string]int{}
	status := map[string]string{}
	for _, ev := range readPlacements(t, js) {
		if counts[ev.jobID] == nil {
			counts[ev.jobID] = map[string]int{}
		}
		counts[ev.jobID][ev.subject]++
		if ev.subject == subjectReleased {
			var rel struct {
				Status string `json:"status"`
			}
			if err := json.Unmarshal(ev.body, &rel); err != nil {
				t.Fatal(err)
			}
			status[ev.jobID] = rel.Status
		}
	}
	for id, j := range jobs {
		if n := counts[id][subjectDecided]; n != 1 {
			t.Errorf("%s decided %d times, want once", id, n)
		}
		if n := counts[id][subjectReleased]; n != 1 {
			t.Errorf("%s released %d times, want once", id, n)
		}
		if status[id] != j.status {
			t.Errorf("%s released %q, want %q (a forged finish or rank exit ended it, or its run_as was taken)", id, status[id], j.status)
		}
	}
	for id := range hostile {
		if counts[id][subjectDecided] > 0 {
			t.Errorf("hostile job %s decided", id)
		}
	}
	if ci, err := consumerInfo(js, streamJobs, durableAnalysis); err != nil || ci.NumRedelivered != 0 {
		t.Errorf("analysis consumer: %v", describeRedelivered(ci, err))
	}
	_, hwm := memoryOf(t, c.serve)
	t.Logf("soak: serve's peak VmHWM %d MB (bound %d MB)", hwm>>20, soakRSSBound>>20)
}

// startsOnce checks the ranks' start file: no rank of a job started twice,
// and, at the end, every rank of every job that succeeded started.
func startsOnce(t *testing.T, path string, jobs map[string]*soakJob, final bool) {
	t.Helper()
	f, err := os.Open(path)
	if os.IsNotExist(err) && !final {
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }() // read only
	seen := map[string]int{}
	perJob := map[string]int{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		seen[line]++
		if seen[line] == 2 {
			t.Errorf("rank started twice: %q", line)
		}
		if job, _, ok := strings.Cut(line, " "); ok && seen[line] == 1 {
			perJob[job]++
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if !final {
		return
	}
	for id, j := range jobs {
		want := j.ranks
		if j.status != "succeeded" {
			want = 0
		}
		if perJob[id] != want {
			t.Errorf("%s: %d ranks started, want %d", id, perJob[id], want)
		}
	}
}

// summarise counts acts by kind.
func summarise(acts []string) string {
	n := map[string]int{}
	for _, a := range acts {
		n[a]++
	}
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(n)) {
		parts = append(parts, fmt.Sprintf("%s ×%d", k, n[k]))
	}
	return strings.Join(parts, ", ")
}

func first(s []string, n int) []string { return s[:min(n, len(s))] }
