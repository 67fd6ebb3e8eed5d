package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// The defects of issue 46 that one identity per agent and per tenant, and
// a server that requires credentials on loopback too, mend: each test runs
// serve (its embedded server, as a user starts it), two `toposched agent
// --exec` agents signed in as themselves, topoctl and the nats CLI, and
// tries what a careless or hostile user did.

// holdScript writes the rank's pid to $OUT/pid-<job>-<rank> and runs until
// $OUT/stop-<job> exists.
const holdScript = `echo $$ > "$OUT/pid-$TOPOSCHED_JOB_ID-$RANK"; while [ ! -e "$OUT/stop-$TOPOSCHED_JOB_ID" ]; do sleep 0.05; done; echo "done $RANK"`

// writeShellJob writes a job of gpus GPUs, perNode a node, running sh -c
// script with OUT=out in its environment, and extra lines.
func writeShellJob(t *testing.T, dir, id string, gpus, perNode int, script, out string, extra ...string) string {
	t.Helper()
	args, _ := json.Marshal([]string{"-c", script})
	body := fmt.Sprintf("job_id: %s\ngpus: %d\ngpus_per_node: %d\ncommand: sh\nargs: %s\nenv: [\"OUT=%s\"]\n%s\n",
		id, gpus, perNode, args, out, strings.Join(extra, "\n"))
	path := filepath.Join(dir, id+".yaml")
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// jobPIDs are the pids holdScript's ranks of job wrote in out, by rank file.
func jobPIDs(t *testing.T, out, job string) map[string]int {
	t.Helper()
	all := pidsIn(t, out)
	for f := range all {
		if !strings.HasPrefix(f, "pid-"+job+"-") {
			delete(all, f)
		}
	}
	return all
}

// waitRanks waits until n ranks of job have written their pids.
func waitRanks(t *testing.T, out, job string, n int, procs ...*proc) map[string]int {
	t.Helper()
	var pids map[string]int
	waitFor(t, 30*time.Second, func() (bool, string) {
		mustBeAlive(t, procs...)
		pids = jobPIDs(t, out, job)
		return len(pids) == n, fmt.Sprintf("%s's ranks started: %v, want %d", job, pids, n)
	})
	return pids
}

// stopJob lets holdScript's ranks of job end.
func stopJob(t *testing.T, out, job string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(out, "stop-"+job), nil, 0o600); err != nil {
		t.Fatal(err)
	}
}

// mustRun fails the test if a rank is gone.
func mustRun(t *testing.T, pids map[string]int, after string) {
	t.Helper()
	for f, pid := range pids {
		if processGone(pid) {
			t.Errorf("%s (%d) no longer runs after %s", f, pid, after)
		}
	}
}

// pubAs publishes body on subject through JetStream with the nats CLI,
// signed in with seed.
func pubAs(t *testing.T, url, seed, subject, body string) result {
	t.Helper()
	return natsCLIWith(t, url, []string{"--nkey", seed}, "--timeout", "2s", "pub", subject, body, "--jetstream")
}

// mustBeRefused fails the test unless the nats CLI's publish to subject
// was refused by the server's permissions.
func mustBeRefused(t *testing.T, r result, who, subject string) {
	t.Helper()
	if want := `Permissions Violation for Publish to "` + subject + `"`; r.code == 0 || !strings.Contains(r.stdout+r.stderr, want) {
		t.Errorf("%s publishing on %s: exit %d, want %q\nstdout:\n%s\nstderr:\n%s", who, subject, r.code, want, r.stdout, r.stderr)
	}
}

// mustBeStored fails the test unless the nats CLI's publish was stored.
func mustBeStored(t *testing.T, r result, who, subject string) {
	t.Helper()
	if r.code != 0 || !strings.Contains(r.stdout+r.stderr, "Stored in Stream") {
		t.Errorf("%s publishing on %s: exit %d, want it stored\nstdout:\n%s\nstderr:\n%s", who, subject, r.code, r.stdout, r.stderr)
	}
}

// storedOn is how many messages stream holds on subject.
func storedOn(t *testing.T, js jetstream.JetStream, stream, subject string) uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, stream)
	if err != nil {
		t.Fatalf("stream %s: %v", stream, err)
	}
	info, err := s.Info(ctx, jetstream.WithSubjectFilter(subject))
	if err != nil {
		t.Fatalf("stream %s: %v", stream, err)
	}
	return info.State.Subjects[subject]
}

// lastOn is the body of stream's last message on subject.
func lastOn(t *testing.T, js jetstream.JetStream, stream, subject string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, stream)
	if err != nil {
		t.Fatalf("stream %s: %v", stream, err)
	}
	m, err := s.GetLastMsgForSubject(ctx, subject)
	if err != nil {
		t.Fatalf("last message of %s on %s: %v", stream, subject, err)
	}
	return m.Data
}

// scrapeMetrics reads the /metrics at addr: each sample's value by its
// name and labels as written ("name{label=\"v\"}").
func scrapeMetrics(addr string) (map[string]float64, error) {
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get("http://" + addr + "/metrics")
	if err != nil {
		return nil, err
	}
	defer func() { _ = resp.Body.Close() }() // only read
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s/metrics: %s", addr, resp.Status)
	}
	out := map[string]float64{}
	for line := range strings.Lines(string(body)) {
		name, val, ok := strings.Cut(strings.TrimSpace(line), " ")
		if !ok || strings.HasPrefix(name, "#") {
			continue
		}
		if v, err := strconv.ParseFloat(val, 64); err == nil {
			out[name] = v
		}
	}
	return out, nil
}

// otherNode is the launch cluster's node that is not node.
func otherNode(node string) string {
	if node == launchNodes[0] {
		return launchNodes[1]
	}
	return launchNodes[0]
}

// skippedLine is what a reader logs of a message whose body is not its
// subject's (events/bus: wrong scope).
const skippedLine = "skipping a message whose body is not its subject's"

// TestSecurityLoopbackNeedsCredentials is issue 46's "anyone who can reach
// the default loopback listener is root on every exec agent and can write
// decisions": with no credentials a local client submitted a job whose
// command the agent ran, and published a decision for a GPU another job
// held, which placement's rebuild took in after a restart (41 jobs on 40
// GPUs). Now serve's default listener turns away a client without
// credentials (nats.go, topoctl run, the nats CLI) and nothing runs; a
// tenant may not publish a decision; and a decision the operator forges
// without placement's fencing, for a waiting job on GPUs another job
// holds, is left out by the rebuild after a restart, said by the metric:
// the four GPUs hold two jobs, and the waiting job gets the GPUs when
// they are freed.
func TestSecurityLoopbackNeedsCredentials(t *testing.T) {
	metrics := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	c := startSecureLaunchCluster(t, []string{"research"}, "--metrics-listen", metrics)
	dir, out := t.TempDir(), t.TempDir()
	killLeft(t, out)

	// No credentials: turned away at the door. topoctl runs without a
	// seed (no TOPOSCHED_DATA_DIR, and none in its working directory).
	if nc, err := nats.Connect(c.url, nats.Timeout(5*time.Second)); err == nil {
		nc.Close()
		t.Error("a client without credentials connected to serve's loopback listener")
	} else if !errors.Is(err, nats.ErrAuthorization) {
		t.Errorf("a client without credentials: %v, want an authorization violation", err)
	}
	pwned := filepath.Join(out, "pwned")
	job := writeShellJob(t, dir, "anon-exec", 1, 1, `touch "$OUT/pwned"`, out)
	r := runCmd(t, 60*time.Second, childEnv(), bins.topoctl, "--nats-url", c.url, "run", job)
	if r.code == 0 || !strings.Contains(r.stderr, "Authorization Violation") {
		t.Errorf("topoctl run without credentials: exit %d, want an authorization violation\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}
	r = natsCLIWith(t, c.url, nil, "--timeout", "2s", "pub", subjectSubmitted, `{"job_id":"anon-pub","gpus":1,"command":"sh"}`, "--jetstream")
	if r.code == 0 || !strings.Contains(r.stdout+r.stderr, "Authorization Violation") {
		t.Errorf("nats pub without credentials: exit %d, want an authorization violation\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}
	for _, id := range []string{"anon-exec", "anon-pub"} {
		if r := topoctl(t, c.url, "explain", id); r.code == 0 || !strings.Contains(r.stderr, "no events for job "+id) {
			t.Errorf("topoctl explain %s: exit %d, want no events\nstdout:\n%s\nstderr:\n%s", id, r.code, r.stdout, r.stderr)
		}
	}

	// Two jobs of the launcher hold the cluster's four GPUs, their ranks
	// run by the agents; a third, without a command (placed for a
	// launcher of its own), waits.
	holders := map[string]int{}
	for _, id := range []string{"hold-a", "hold-b"} {
		topoctlOK(t, c.url, "submit", writeShellJob(t, dir, id, 2, 2, holdScript, out))
		maps.Copy(holders, waitRanks(t, out, id, 2, c.serve, c.agents["node-001"], c.agents["node-002"]))
	}
	waiting := filepath.Join(dir, "waiting.yaml")
	if err := os.WriteFile(waiting, []byte("job_id: waiting\ngpus: 2\ngpus_per_node: 2\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	topoctlOK(t, c.url, "submit", waiting)
	js := jsConnect(t, c.url)
	if ev := waitOutcome(t, js, "waiting", c.serve); ev.subject != subjectPending {
		t.Fatalf("waiting on a full cluster: %s %s, want pending", ev.subject, ev.body)
	}

	// The forgeries place the waiting job on hold-a's GPUs: hold-a's own
	// decision, renamed, with no fence of a placement term.
	var holdA []byte
	for _, ev := range readPlacements(t, js) {
		if ev.subject == subjectDecided && ev.jobID == "hold-a" {
			holdA = ev.body
		}
	}
	forged := string(bytes.Replace(holdA, []byte(`"job_id":"hold-a"`), []byte(`"job_id":"waiting"`), 1))
	if !strings.Contains(forged, `"job_id":"waiting"`) {
		t.Fatalf("hold-a's decision names no job_id as the forgery expects: %s", holdA)
	}
	before := storedOn(t, js, streamPlacement, subjectDecided)
	// A tenant may not write a decision.
	mustBeRefused(t, pubAs(t, c.url, seedOf(t, c.url, "tenant-research"), subjectDecided, forged), "tenant research", subjectDecided)
	if after := storedOn(t, js, streamPlacement, subjectDecided); after != before {
		t.Fatalf("%d decisions stored after the tenant's forgery, %d before", after, before)
	}
	// The operator may write anything.
	mustBeStored(t, pubAs(t, c.url, seedOf(t, c.url, roleOperator), subjectDecided, forged), "the operator", subjectDecided)

	// serve restarts on its data dir: placement's rebuild reads the
	// placement stream again and leaves the forgery out, so that the four
	// GPUs hold two jobs and the third still waits.
	stopped := time.Now()
	c.serve.signal(t, syscall.SIGTERM)
	if code := c.serve.waitExit(t, 30*time.Second); code != 0 {
		t.Fatalf("serve exited %d on SIGTERM", code)
	}
	serve := c.startServe(t, "serve (restarted)")
	// The agents' ranks stop by themselves after launchSilence without a
	// heartbeat through: the restart must take less for them to run on.
	t.Logf("serve stopped and ready again in %s (the ranks stop after %s of silence)", time.Since(stopped).Round(time.Millisecond), launchSilence)
	waitFor(t, 30*time.Second, func() (bool, string) {
		mustBeAlive(t, serve)
		m, err := scrapeMetrics(metrics)
		if err != nil {
			return false, err.Error()
		}
		got := map[string]float64{}
		want := map[string]float64{
			`toposched_placement_rebuild_ignored_events{reason="unfenced"}`: 1,
			`toposched_placement_rebuild_ignored_events{reason="conflict"}`: 0,
			`toposched_store_jobs{state="placed"}`:                          2,
			`toposched_store_jobs{state="pending"}`:                         1,
			`toposched_store_gpus{kind="total"}`:                            4,
			`toposched_store_gpus{kind="free"}`:                             0,
		}
		for k := range want {
			got[k] = m[k]
		}
		return fmt.Sprint(got) == fmt.Sprint(want), fmt.Sprintf("metrics %v, want %v", got, want)
	})
	if !regexp.MustCompile(`rebuild: ignoring a placement outcome no placement term wrote.* job_id=waiting .*reason="no fence headers"`).MatchString(serve.output()) {
		t.Errorf("the restarted serve does not say it left the forged decision out:\n%s", serve.output())
	}
	mustRun(t, holders, "serve restarted")

	// hold-a ends; placement gives its GPUs to the waiting job, which no
	// forgery placed.
	stopJob(t, out, "hold-a")
	js = jsConnect(t, c.url)
	var decisions []decidedJSON
	waitFor(t, 30*time.Second, func() (bool, string) {
		mustBeAlive(t, serve)
		decisions = nil
		for _, ev := range readPlacements(t, js) {
			var d decidedJSON
			if ev.subject == subjectDecided && ev.jobID == "waiting" && json.Unmarshal(ev.body, &d) == nil {
				decisions = append(decisions, d)
			}
		}
		return len(decisions) == 2, fmt.Sprintf("%d decisions for waiting, want the forged one and placement's", len(decisions))
	})
	if got, want := sortedGPUs(decisions[1]), sortedGPUs(decisionOf(t, c, "hold-a")); !slices.Equal(got, want) {
		t.Errorf("waiting got %v, want hold-a's GPUs %v", got, want)
	}
	stopJob(t, out, "hold-b")
	if _, err := os.Stat(pwned); err == nil {
		t.Error("the job submitted without credentials ran")
	}
}

// TestSecurityHeartbeatsOfAnotherNode is issue 46's "a launcher client
// sent heartbeats for a dead node (its job held its GPUs 30 s past a 12 s
// TTL)": every agent and user shared the launcher role. Now node-001's
// agent, signed in as itself, is refused heartbeats on node-002's subject,
// and its heartbeats carrying node-002's name on its own subject are
// dropped (wrong scope); a tenant may publish no heartbeat. With node-002's
// agent killed, and node-001's forging its heartbeats the whole time, the
// job is lost as the TTL says.
func TestSecurityHeartbeatsOfAnotherNode(t *testing.T) {
	c := startSecureLaunchCluster(t, []string{"research"})
	dir, out := t.TempDir(), t.TempDir()
	killLeft(t, out)
	run := startTopoctl(t, "topoctl run", c.url, "run", writeLaunchJob(t, dir, "hb-job", holdScript, out, nil))
	waitRanks(t, out, "hb-job", 4, run, c.agents["node-001"], c.agents["node-002"])
	waitFor(t, 30*time.Second, func() (bool, string) {
		mustBeAlive(t, run)
		return strings.Contains(c.agents["node-002"].output(), `msg="ranks started" node=node-002 job_id=hb-job`), "node-002 has not started its ranks"
	})

	// node-002's real heartbeat, claiming hb-job, is what the forgeries
	// send.
	js := jsConnect(t, c.url)
	const streamAgent = "TOPOSCHED_AGENT"
	hbSubject := func(node string) string { return "toposched.agent.heartbeat." + node }
	var real []byte
	waitFor(t, 30*time.Second, func() (bool, string) {
		real = lastOn(t, js, streamAgent, hbSubject("node-002"))
		return bytes.Contains(real, []byte(`"hb-job"`)), fmt.Sprintf("node-002's last heartbeat %s does not claim hb-job", real)
	})
	seedA, seedT := seedOf(t, c.url, "agent-node-001"), seedOf(t, c.url, "tenant-research")
	mustBeRefused(t, pubAs(t, c.url, seedA, hbSubject("node-002"), string(real)), "node-001's agent", hbSubject("node-002"))
	for _, node := range launchNodes {
		mustBeRefused(t, pubAs(t, c.url, seedT, hbSubject(node), string(real)), "tenant research", hbSubject(node))
	}

	// node-002's agent dies; node-001's keeps its heartbeat going, both
	// ways, a few times a second, until the job is lost.
	forger := connectWith(t, c.url, "node-001's agent", nkeyOption(t, seedA))
	sentAt := regexp.MustCompile(`"sent_at":"[^"]*"`)
	stop := make(chan struct{})
	var forging sync.WaitGroup
	forging.Go(func() {
		tick := time.NewTicker(launchHeartbeat)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			body := sentAt.ReplaceAll(real, []byte(`"sent_at":"`+time.Now().UTC().Format(time.RFC3339Nano)+`"`))
			for _, node := range launchNodes {
				_ = forger.nc.Publish(hbSubject(node), body) // a refusal comes back as an async error
			}
		}
	})
	defer func() { close(stop); forging.Wait() }()
	c.agents["node-002"].signal(t, syscall.SIGKILL)
	killed := time.Now()
	if code := run.waitExit(t, launchTTL+20*time.Second); code != 3 {
		t.Fatalf("topoctl run: exit %d, want 3 (lost)\n%s", code, run.output())
	}
	t.Logf("lost %s after node-002's agent was killed (TTL %s), its heartbeats forged every %s", time.Since(killed).Round(time.Millisecond), launchTTL, launchHeartbeat)
	if !strings.Contains(run.output(), "hb-job: lost (agent_lost): the agent of node node-002 has been silent") {
		t.Errorf("topoctl run's status:\n%s", run.output())
	}
	if rel, ok := releasedOf(t, c, "hb-job"); !ok || rel["status"] != "lost" || rel["reason"] != "agent_lost" {
		t.Errorf("placement.released = %v, want status lost, reason agent_lost", rel)
	}
	if ok, why := forger.refused(hbSubject("node-002")); !ok {
		t.Errorf("node-001's agent forging node-002's heartbeats: %s", why)
	}
	// Those on its own subject were stored, and the watchdog dropped them.
	if !strings.Contains(c.serve.output(), skippedLine) {
		t.Errorf("serve's watchdog did not say it dropped node-001's heartbeats naming node-002:\n%s", c.serve.output())
	}
	noLiveJobs(t, c)
}

// TestSecurityRanksExitedOfAnotherNode is issue 46's "a runtime.ranks_exited
// for another user's running job, which the real agent obeyed and killed".
// A job runs on one node; the other node's agent, signed in as itself,
// says the job's ranks failed: on the job's node's subject it is refused,
// on its own subject naming the job's node it is dropped (wrong scope),
// and naming its own node it is ignored (no rank of the job runs there).
// The ranks keep running and the job then succeeds.
func TestSecurityRanksExitedOfAnotherNode(t *testing.T) {
	c := startSecureLaunchCluster(t, nil)
	dir, out := t.TempDir(), t.TempDir()
	killLeft(t, out)
	run := startTopoctl(t, "topoctl run", c.url, "run", writeShellJob(t, dir, "victim", 2, 2, holdScript, out))
	pids := waitRanks(t, out, "victim", 2, run, c.agents["node-001"], c.agents["node-002"])
	d := decisionOf(t, c, "victim")
	if len(d.Nodes) != 1 {
		t.Fatalf("victim placed on %d nodes, want 1: %+v", len(d.Nodes), d.Nodes)
	}
	node := d.Nodes[0].Node
	attacker := otherNode(node)
	seed := seedOf(t, c.url, "agent-"+attacker)
	exitedSubject := func(n string) string { return "toposched.runtime.ranks_exited." + n }
	failed := func(n string) string {
		return fmt.Sprintf(`{"job_id":"victim","node":%q,"status":"failed","reason":"rank_failed","message":"forged",`+
			`"ranks":[{"rank":0,"node":%[1]q,"exit_code":1},{"rank":1,"node":%[1]q,"exit_code":1}]}`, n)
	}
	js := jsConnect(t, c.url)

	// On the victim's node's subject: refused, nothing stored.
	mustBeRefused(t, pubAs(t, c.url, seed, exitedSubject(node), failed(node)), attacker+"'s agent", exitedSubject(node))
	if n := storedOn(t, js, "TOPOSCHED_RUNTIME", exitedSubject(node)); n != 0 {
		t.Errorf("%d ranks_exited stored on %s", n, exitedSubject(node))
	}
	// On its own subject, naming the victim's node: stored, and dropped
	// by the readers as its subject's scope is another node.
	skipped := strings.Count(c.agents[node].output(), skippedLine)
	mustBeStored(t, pubAs(t, c.url, seed, exitedSubject(attacker), failed(node)), attacker+"'s agent", exitedSubject(attacker))
	// Naming its own node: stored, and ignored, no rank of the job
	// running there.
	mustBeStored(t, pubAs(t, c.url, seed, exitedSubject(attacker), failed(attacker)), attacker+"'s agent", exitedSubject(attacker))
	// One more dropped one: once the victim's agent says it dropped it,
	// it has read the one before (it reads the stream in order).
	mustBeStored(t, pubAs(t, c.url, seed, exitedSubject(attacker), failed(node)), attacker+"'s agent", exitedSubject(attacker))
	waitFor(t, 30*time.Second, func() (bool, string) {
		mustBeAlive(t, run, c.agents[node])
		n := strings.Count(c.agents[node].output(), skippedLine) - skipped
		return n >= 2, fmt.Sprintf("the agent of %s has dropped %d of the 2 reports naming it from %s", node, n, attacker)
	})
	mustRun(t, pids, attacker+"'s agent said they failed")
	if strings.Contains(c.agents[node].output(), "peer_failed") {
		t.Errorf("the agent of %s stopped victim's ranks:\n%s", node, c.agents[node].output())
	}

	stopJob(t, out, "victim")
	if code := run.waitExit(t, 60*time.Second); code != 0 {
		t.Fatalf("topoctl run: exit %d, want 0\n%s", code, run.output())
	}
	if !strings.Contains(run.output(), "victim: succeeded (ranks_exited)") || !strings.Contains(run.output(), "exit codes by rank: 0 0") {
		t.Errorf("topoctl run's status:\n%s", run.output())
	}
	if rel, ok := releasedOf(t, c, "victim"); !ok || rel["status"] != "succeeded" {
		t.Errorf("placement.released = %v, want status succeeded", rel)
	}
}

// TestSecurityTenantsOwnJobsOnly: every user shared the launcher role, so
// any of them could finish or cancel another's job. Tenant research runs
// a job; tenant ads can neither submit a job as research (topoctl refuses
// the file, the server the subject, analysis a body naming research on
// ads' subject) nor finish or cancel research's job (placement answers
// not_permitted and the ranks keep running); research cancels its own.
func TestSecurityTenantsOwnJobsOnly(t *testing.T) {
	c := startSecureLaunchCluster(t, []string{"research", "ads"})
	dir, out := t.TempDir(), t.TempDir()
	killLeft(t, out)
	run := startTopoctl(t, "topoctl run (research)", c.url, "--tenant", "research", "run", writeShellJob(t, dir, "research-job", 2, 2, holdScript, out))
	pids := waitRanks(t, out, "research-job", 2, run, c.agents["node-001"], c.agents["node-002"])
	js := jsConnect(t, c.url)
	if sub := lastOn(t, js, streamJobs, "toposched.jobs.submitted.tenant.research"); !bytes.Contains(sub, []byte(`"tenant":"research"`)) {
		t.Errorf("research's submission on its tenant's subject: %s", sub)
	}

	// ads cannot submit as research.
	theirs := writeShellJob(t, t.TempDir(), "ads-as-research", 1, 1, holdScript, out, "tenant: research")
	if r := topoctl(t, c.url, "--tenant", "ads", "submit", theirs); r.code == 0 || !strings.Contains(r.stderr, "a tenant submits its own jobs only") {
		t.Errorf("topoctl --tenant ads submit of research's job: exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}
	adsSeed := seedOf(t, c.url, "tenant-ads")
	r := topoctl(t, c.url, "--tenant", "research", "--nats-nkey", adsSeed, "submit", theirs)
	if r.code == 0 || !strings.Contains(r.stderr, "toposched.jobs.submitted.tenant.research") {
		t.Errorf("topoctl --tenant research signed in as ads: exit %d, want the server's refusal\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}
	body := `{"job_id":"ads-as-research","gpus":1,"tenant":"research","command":"sh","args":["-c","true"]}`
	mustBeRefused(t, pubAs(t, c.url, adsSeed, "toposched.jobs.submitted.tenant.research", body), "tenant ads", "toposched.jobs.submitted.tenant.research")
	mustBeRefused(t, pubAs(t, c.url, adsSeed, subjectSubmitted, body), "tenant ads", subjectSubmitted)
	mustBeStored(t, pubAs(t, c.url, adsSeed, "toposched.jobs.submitted.tenant.ads", body), "tenant ads", "toposched.jobs.submitted.tenant.ads")
	ev := waitOutcome(t, js, "ads-as-research", c.serve)
	var rej reasonsJSON
	if err := json.Unmarshal(ev.body, &rej); err != nil || ev.subject != subjectRejected || len(rej.Reasons) != 1 || rej.Reasons[0].Code != "wrong_scope" || rej.Reasons[0].Field != "tenant" {
		t.Errorf("a job naming research on ads' subject: %s %s, want rejected wrong_scope on tenant", ev.subject, ev.body)
	}

	// ads cannot finish or cancel research's job.
	for _, status := range []string{"succeeded", "cancelled"} {
		r := topoctl(t, c.url, "--tenant", "ads", "finish", "research-job", "--status", status, "--wait", "30s")
		if r.code == 0 || !strings.Contains(r.stderr, "placement refused the finish of research-job") {
			t.Errorf("topoctl --tenant ads finish research-job --status %s: exit %d, want placement's refusal\nstdout:\n%s\nstderr:\n%s", status, r.code, r.stdout, r.stderr)
		}
	}
	var refusals []string
	for _, ev := range readPlacements(t, js) {
		if ev.subject == "toposched.placement.finish_refused" && ev.jobID == "research-job" {
			var rf reasonsJSON
			if err := json.Unmarshal(ev.body, &rf); err != nil {
				t.Fatal(err)
			}
			for _, r := range rf.Reasons {
				refusals = append(refusals, r.Code)
			}
		}
	}
	if !slices.Equal(refusals, []string{"not_permitted", "not_permitted"}) {
		t.Errorf("placement's refusals of ads' finishes: %v, want not_permitted twice", refusals)
	}
	mustRun(t, pids, "tenant ads finished and cancelled their job")
	mustBeAlive(t, run)

	// research cancels its own job.
	if out := topoctlOK(t, c.url, "--tenant", "research", "finish", "research-job", "--status", "cancelled", "--wait", "30s"); !strings.Contains(out, "finished research-job (cancelled)") {
		t.Errorf("topoctl --tenant research finish research-job --status cancelled printed %q", out)
	}
	if code := run.waitExit(t, 60*time.Second); code != 130 {
		t.Errorf("topoctl run: exit %d, want 130 (cancelled)\n%s", code, run.output())
	}
	waitFor(t, 30*time.Second, func() (bool, string) {
		for f, pid := range pids {
			if !processGone(pid) {
				return false, fmt.Sprintf("%s (%d) still runs after research cancelled its job", f, pid)
			}
		}
		return true, ""
	})
	if rel, ok := releasedOf(t, c, "research-job"); !ok || rel["status"] != "cancelled" {
		t.Errorf("placement.released = %v, want status cancelled", rel)
	}
}
