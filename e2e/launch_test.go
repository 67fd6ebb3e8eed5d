package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// launchTTL is the watchdog's agent TTL in these tests: short, so that a
// lost agent is seen quickly, and many heartbeats (launchHeartbeat) long,
// so that a loaded machine does not lose a live one. The agents are told
// it too: their ranks stop by themselves launchSilence after their last
// heartbeat, the time a restarted agent has to adopt them.
const (
	launchTTL       = 6 * time.Second
	launchHeartbeat = 250 * time.Millisecond
	launchGrace     = time.Second
	launchSilence   = launchTTL - launchGrace - launchHeartbeat
)

// launchCluster is nats-server, toposched serve on it and one agent with
// --exec per node of e2e/testdata/launch.yaml (two nodes of two GPUs); or
// (startSecureLaunchCluster) serve's own embedded server, which every
// agent and user signs in to with a role of its own.
type launchCluster struct {
	url     string
	cluster string
	agents  map[string]*proc
	states  map[string]string
	serve   *proc
	// t is the test that started the cluster: an agent restarted in a
	// subtest must outlive it.
	t *testing.T
	// The embedded server's port, serve's data dir (its credentials) and
	// extra flags, to start serve again; port 0 with nats-server.
	port      int
	dataDir   string
	serveArgs []string
}

// launchNodes are the nodes of testdata/launch.yaml.
var launchNodes = []string{"node-001", "node-002"}

func startLaunchCluster(t *testing.T) *launchCluster {
	t.Helper()
	needBinaries(t)
	url, _ := natsServer(t)
	c := &launchCluster{url: url, cluster: testdata(t, "launch.yaml"), agents: map[string]*proc{}, states: map[string]string{}, t: t}
	c.serve = startProc(t, "serve", childEnv(), bins.toposched, "--nats-url", url, "serve", "--cluster", c.cluster,
		"--poll", "0", "--agent-ttl", launchTTL.String())
	waitFor(t, 30*time.Second, func() (bool, string) {
		mustBeAlive(t, c.serve)
		return strings.Contains(c.serve.output(), "watchdog ready") && strings.Contains(c.serve.output(), "services running"),
			"serve has not logged 'services running' and 'watchdog ready'"
	})
	c.startAgents(t)
	return c
}

// startSecureLaunchCluster runs serve with its embedded server on a free
// loopback port, as a user runs it: clients must sign in (the default).
// Before serve starts, the real `toposched roles issue` writes a seed per
// node's agent and per tenant into serve's credentials directory; each
// agent signs in with its own (it finds agent-<node>.nk through
// TOPOSCHED_DATA_DIR), topoctl as the launcher or with --tenant T as
// tenant T. serveExtra are more flags for serve.
func startSecureLaunchCluster(t *testing.T, tenants []string, serveExtra ...string) *launchCluster {
	t.Helper()
	return startSecureCluster(t, "launch.yaml", tenants, serveExtra...)
}

// startSecureCluster is startSecureLaunchCluster on another cluster file of
// e2e/testdata, whose nodes are launchNodes.
func startSecureCluster(t *testing.T, clusterFile string, tenants []string, serveExtra ...string) *launchCluster {
	t.Helper()
	needBinaries(t)
	c := &launchCluster{cluster: testdata(t, clusterFile), agents: map[string]*proc{}, states: map[string]string{}, t: t,
		port: freePort(t), dataDir: t.TempDir()}
	c.url = fmt.Sprintf("nats://127.0.0.1:%d", c.port)
	var issue []string
	for _, n := range launchNodes {
		issue = append(issue, "--agent", n)
	}
	for _, tn := range tenants {
		issue = append(issue, "--tenant", tn)
	}
	issueRoles(t, credentialsDir(c.dataDir), issue...)
	c.serveArgs = append([]string{"--poll", "0", "--agent-ttl", launchTTL.String()}, serveExtra...)
	c.startServe(t, "serve")
	c.startAgents(t)
	return c
}

// startServe starts (or restarts) the secure cluster's serve on its port
// and data dir and waits for its watchdog.
func (c *launchCluster) startServe(t *testing.T, name string) *proc {
	t.Helper()
	c.serve = startServe(c.t, name, c.cluster, c.port, c.dataDir, c.serveArgs...)
	waitFor(t, 30*time.Second, func() (bool, string) {
		mustBeAlive(t, c.serve)
		return strings.Contains(c.serve.output(), "watchdog ready"), "serve has not logged 'watchdog ready'"
	})
	return c.serve
}

// startAgents starts an agent per node, each on a state directory of its
// own.
func (c *launchCluster) startAgents(t *testing.T) {
	t.Helper()
	for _, node := range launchNodes {
		c.states[node] = t.TempDir()
		c.startAgent(t, node)
	}
}

// runAsAllow is the agents' --run-as-allow: the user the tests run as
// (in CI root, so this is the explicit opt-in an agent running as root
// needs to run ranks as root), and nobody besides where that is root, for
// the run_as test.
func runAsAllow(t *testing.T) string {
	t.Helper()
	u, err := user.Current()
	if err != nil {
		t.Fatal(err)
	}
	if os.Geteuid() == 0 {
		return u.Username + ",nobody"
	}
	return u.Username
}

// startAgent starts (or restarts) the agent of node, on the state
// directory it had, and waits until it follows the streams.
func (c *launchCluster) startAgent(t *testing.T, node string) *proc {
	t.Helper()
	env := clientEnv(c.url)
	if c.dataDir != "" && node == launchNodes[1] {
		// Signed in as deploy/systemd/toposched-agent.service does; the
		// other finds its seed in TOPOSCHED_DATA_DIR.
		env = childEnv("TOPOSCHED_NATS_NKEY=" + seedIn(t, credentialsDir(c.dataDir), "agent-"+node))
	}
	p := startProc(c.t, "agent "+node, env, bins.toposched, "--nats-url", c.url, "agent", "--node", node,
		"--exec", "--cluster", c.cluster, "--state-dir", c.states[node], "--address", "127.0.0.1",
		"--heartbeat", launchHeartbeat.String(), "--grace", launchGrace.String(), "--agent-ttl", launchTTL.String(),
		"--run-as-allow", runAsAllow(t))
	waitFor(t, 30*time.Second, func() (bool, string) {
		mustBeAlive(t, p)
		return strings.Contains(p.output(), "launcher ready"), "agent " + node + " has not logged 'launcher ready'"
	})
	c.agents[node] = p
	return p
}

// writeLaunchJob writes a 4-GPU job (two ranks on each node) running sh -c
// script, with OUT=out and env in its env, and extra lines.
func writeLaunchJob(t *testing.T, dir, id, script, out string, env []string, extra ...string) string {
	t.Helper()
	args, _ := json.Marshal([]string{"-c", script})
	envJSON, _ := json.Marshal(append([]string{"OUT=" + out}, env...))
	body := fmt.Sprintf("job_id: %s\ngpus: 4\ngpus_per_node: 2\ncommand: sh\nargs: %s\nenv: %s\n%s\n", id, args, envJSON, strings.Join(extra, "\n"))
	path := filepath.Join(dir, id+".yaml")
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// decisionOf reads the job's decision from the placement stream.
func decisionOf(t testing.TB, c *launchCluster, id string) decidedJSON {
	t.Helper()
	for _, ev := range readPlacements(t, jsConnect(t, c.url)) {
		if ev.subject == subjectDecided && ev.jobID == id {
			var d decidedJSON
			if err := json.Unmarshal(ev.body, &d); err != nil {
				t.Fatal(err)
			}
			return d
		}
	}
	t.Fatalf("no decision for %s", id)
	return decidedJSON{}
}

// released is the job's placement.released, if there is one.
func releasedOf(t *testing.T, c *launchCluster, id string) (map[string]any, bool) {
	t.Helper()
	return releasedIn(t, jsConnect(t, c.url), id)
}

// releasedIn is the job's placement.released in js's placement stream, if
// there is one.
func releasedIn(t *testing.T, js jetstream.JetStream, id string) (map[string]any, bool) {
	t.Helper()
	for _, ev := range readPlacements(t, js) {
		if ev.subject == subjectReleased && ev.jobID == id {
			var m map[string]any
			if err := json.Unmarshal(ev.body, &m); err != nil {
				t.Fatal(err)
			}
			return m, true
		}
	}
	return nil, false
}

// noLiveJobs checks that no job holds a GPU.
func noLiveJobs(t *testing.T, c *launchCluster) {
	t.Helper()
	live, _ := auditPlacements(t, readPlacements(t, jsConnect(t, c.url)))
	if len(live) > 0 {
		t.Errorf("jobs still holding GPUs: %v", live)
	}
}

// readEnvFile reads a NAME=value per line file.
func readEnvFile(t *testing.T, path string) map[string]string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{}
	for line := range strings.Lines(string(b)) {
		if k, v, ok := strings.Cut(strings.TrimSuffix(line, "\n"), "="); ok {
			env[k] = v
		}
	}
	return env
}

// pidsIn reads the pid-* files the ranks have written.
func pidsIn(t *testing.T, dir string) map[string]int {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(dir, "pid-*"))
	out := map[string]int{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasSuffix(string(b), "\n") {
			continue // still being written
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		out[filepath.Base(f)] = pid
	}
	return out
}

func processGone(pid int) bool {
	err := syscall.Kill(pid, 0)
	if err != nil {
		return true
	}
	// A zombie is gone too; only its parent can reap it.
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i > 0 && strings.HasPrefix(s[i+1:], " Z")
}

// postTelemetry posts a runtime.telemetry report for job to an agent's
// endpoint with token ("" none) and returns the HTTP status.
func postTelemetry(t *testing.T, url, token, job string) int {
	t.Helper()
	body := fmt.Sprintf(`{"job_id": %q, "step": 10, "step_seconds": 0.3, "compute_seconds": 0.2}`, job)
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	defer func() { _ = resp.Body.Close() }() // read to the end: nothing left to report
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode
}

// killLeft kills, when the test ends, any rank left running.
func killLeft(t *testing.T, dir string) {
	t.Cleanup(func() {
		for _, pid := range pidsIn(t, dir) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	})
}

func TestLaunch(t *testing.T) {
	c := startLaunchCluster(t)
	dir := t.TempDir()

	t.Run("environment matches the decision", func(t *testing.T) {
		out := t.TempDir()
		job := writeLaunchJob(t, dir, "env-job", `env > "$OUT/env-$RANK"; echo "hello from rank $RANK"`, out, nil)
		r := topoctl(t, c.url, "run", job)
		if r.code != 0 {
			t.Fatalf("topoctl run: exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
		}
		d := decisionOf(t, c, "env-job")
		if len(d.Ranks) != 4 {
			t.Fatalf("decision has %d ranks, want 4", len(d.Ranks))
		}
		devices := map[string]string{}
		for _, n := range d.Nodes {
			devices[n.Node] = n.CUDAVisibleDevices
		}
		perNode := map[string]int{}
		for _, rk := range d.Ranks {
			perNode[rk.Node]++
		}
		var port string
		for _, rk := range d.Ranks {
			env := readEnvFile(t, filepath.Join(out, fmt.Sprintf("env-%d", rk.Rank)))
			want := map[string]string{
				"RANK": strconv.Itoa(rk.Rank), "WORLD_SIZE": "4", "LOCAL_RANK": strconv.Itoa(rk.LocalRank),
				"LOCAL_WORLD_SIZE": strconv.Itoa(perNode[rk.Node]), "MASTER_ADDR": "127.0.0.1",
				"CUDA_VISIBLE_DEVICES": devices[rk.Node], "TOPOSCHED_NODE": rk.Node, "TOPOSCHED_GPU": strconv.Itoa(rk.GPU),
				"OUT": out,
			}
			for k, v := range want {
				if env[k] != v {
					t.Errorf("rank %d: %s=%q, want %q", rk.Rank, k, env[k], v)
				}
			}
			if port == "" {
				if d.Launch == nil || d.Launch.MasterPort == 0 {
					t.Fatalf("the decision carries no master port: %+v", d.Launch)
				}
				port = strconv.Itoa(d.Launch.MasterPort)
			}
			if env["MASTER_PORT"] != port {
				t.Errorf("rank %d: MASTER_PORT=%q, want the decision's %s", rk.Rank, env["MASTER_PORT"], port)
			}
			if line := fmt.Sprintf("[rank %d] hello from rank %d\n", rk.Rank, rk.Rank); !strings.Contains(r.stdout, line) {
				t.Errorf("topoctl run's output lacks %q:\n%s", line, r.stdout)
			}
		}
		if !strings.Contains(r.stderr, "env-job: succeeded (ranks_exited)") || !strings.Contains(r.stderr, "exit codes by rank: 0 0 0 0") {
			t.Errorf("topoctl run's status:\n%s", r.stderr)
		}
		noLiveJobs(t, c)
		// The agents were given the watchdog's TTL.
		if strings.Contains(c.serve.output(), "agent outlives the TTL") {
			t.Errorf("the watchdog warns of an agent outliving its TTL:\n%s", c.serve.output())
		}
		// The id is taken: a second run would wait on the first job.
		if again := topoctl(t, c.url, "run", job); again.code != 1 || !strings.Contains(again.stderr, "job_id env-job: already submitted (finished)") {
			t.Errorf("second topoctl run of env-job: exit %d\n%s", again.code, again.stderr)
		}
	})

	t.Run("jobs running at once with rank 0 on one node have ports of their own", func(t *testing.T) {
		out := t.TempDir()
		killLeft(t, out)
		// Three 1-GPU jobs on two nodes: two at least share rank 0's node.
		ids := []string{"port-a", "port-b", "port-c"}
		script := `env > "$OUT/env-$TOPOSCHED_JOB_ID"; echo $$ > "$OUT/pid-$TOPOSCHED_JOB_ID"; while [ ! -e "$OUT/stop" ]; do sleep 0.05; done`
		args, _ := json.Marshal([]string{"-c", script})
		runs := map[string]*proc{}
		for _, id := range ids {
			job := filepath.Join(dir, id+".yaml")
			body := fmt.Sprintf("job_id: %s\ngpus: 1\ncommand: sh\nargs: %s\nenv: [\"OUT=%s\"]\n", id, args, out)
			if err := os.WriteFile(job, []byte(body), 0o600); err != nil {
				t.Fatal(err)
			}
			runs[id] = startTopoctl(t, "topoctl run "+id, c.url, "run", job)
		}
		waitFor(t, 30*time.Second, func() (bool, string) {
			for _, r := range runs {
				mustBeAlive(t, r)
			}
			return len(pidsIn(t, out)) == len(ids), fmt.Sprintf("ranks started: %v", pidsIn(t, out))
		})
		byNode := map[string]map[int]string{} // master node -> port -> job
		for _, id := range ids {
			d := decisionOf(t, c, id)
			env := readEnvFile(t, filepath.Join(out, "env-"+id))
			if got, want := env["MASTER_PORT"], strconv.Itoa(d.Launch.MasterPort); got != want {
				t.Errorf("%s: MASTER_PORT=%s, want the decision's %s", id, got, want)
			}
			node := d.Launch.MasterAddr
			if byNode[node] == nil {
				byNode[node] = map[int]string{}
			}
			if other, ok := byNode[node][d.Launch.MasterPort]; ok {
				t.Errorf("%s and %s both rendezvous on %s:%d", other, id, node, d.Launch.MasterPort)
			}
			byNode[node][d.Launch.MasterPort] = id
		}
		t.Logf("ports by master node: %v", byNode)

		// The agent's telemetry endpoint takes port-a's reports with
		// port-a's token only: another local user has none.
		a, b := readEnvFile(t, filepath.Join(out, "env-port-a")), readEnvFile(t, filepath.Join(out, "env-port-b"))
		for _, tc := range []struct {
			name, token string
			want        int
		}{
			{"no token", "", 401},
			{"port-b's token", b["TOPOSCHED_TELEMETRY_TOKEN"], 401},
			{"port-a's token", a["TOPOSCHED_TELEMETRY_TOKEN"], 202},
		} {
			if got := postTelemetry(t, a["TOPOSCHED_TELEMETRY_URL"], tc.token, "port-a"); got != tc.want {
				t.Errorf("telemetry for port-a with %s: HTTP %d, want %d", tc.name, got, tc.want)
			}
		}
		if err := os.WriteFile(filepath.Join(out, "stop"), nil, 0o600); err != nil {
			t.Fatal(err)
		}
		for id, r := range runs {
			if code := r.waitExit(t, 30*time.Second); code != 0 {
				t.Errorf("topoctl run %s: exit %d\n%s", id, code, r.output())
			}
		}
		noLiveJobs(t, c)
	})

	t.Run("one rank fails: the job fails and the others are stopped", func(t *testing.T) {
		out := t.TempDir()
		killLeft(t, out)
		// Rank 3 waits until every rank has written its pid, so that the
		// others are surely running when it fails.
		script := `echo $$ > "$OUT/pid-$RANK"; if [ "$RANK" = 3 ]; then while [ $(ls "$OUT" | wc -l) -lt 4 ]; do sleep 0.05; done; echo failing; exit 1; fi; exec sleep 300`
		job := writeLaunchJob(t, dir, "fail-job", script, out, nil)
		r := topoctl(t, c.url, "run", job)
		if r.code != 1 {
			t.Fatalf("topoctl run: exit %d, want 1\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
		}
		for _, want := range []string{"fail-job: failed (rank_failed)", "rank 3 exited with status 1", "the other ranks were stopped"} {
			if !strings.Contains(r.stderr, want) {
				t.Errorf("topoctl run's status lacks %q:\n%s", want, r.stderr)
			}
		}
		if !strings.Contains(r.stdout, "[rank 3] failing") {
			t.Errorf("rank 3's output missing:\n%s", r.stdout)
		}
		pids := pidsIn(t, out)
		if len(pids) != 4 {
			t.Fatalf("pids written: %v, want 4", pids)
		}
		for f, pid := range pids {
			if !processGone(pid) {
				t.Errorf("%s (%d) still runs after the job failed", f, pid)
			}
		}
		noLiveJobs(t, c)
	})

	t.Run("bad input is refused naming the field", func(t *testing.T) {
		out := t.TempDir()
		for _, tc := range []struct {
			name  string
			env   []string
			extra []string
			args  []string
			want  []string
		}{
			{name: "missing-command", args: []string{"--", "/no/such/program"},
				want: []string{"failed (launch_failed)", "command: /no/such/program"}},
			{name: "missing-workdir", extra: []string{"workdir: /no/such/dir"},
				want: []string{"failed (launch_failed)", "workdir: /no/such/dir"}},
			// Refused before it is sent, as analysis would refuse it.
			{name: "env-not-name-value", env: []string{"NO_EQUALS_SIGN"}, want: []string{"env[1]"}},
			{name: "relative-workdir", extra: []string{"workdir: srv/train"}, want: []string{"workdir"}},
			{name: "run-as-not-allowed", extra: []string{"run_as: daemon"},
				want: []string{"failed (launch_failed)", "run_as: daemon: not a user this agent may run ranks as"}},
			{name: "nul-in-env", env: []string{"A=x\x00y"}, want: []string{"env[1]"}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				job := writeLaunchJob(t, dir, tc.name, "true", out, tc.env, tc.extra...)
				r := topoctl(t, c.url, append([]string{"run", job}, tc.args...)...)
				if r.code != 1 {
					t.Fatalf("topoctl run: exit %d, want 1\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
				}
				for _, w := range tc.want {
					if !strings.Contains(r.stderr, w) {
						t.Errorf("stderr lacks %q:\n%s", w, r.stderr)
					}
				}
				mustBeAlive(t, c.agents["node-001"], c.agents["node-002"], c.serve)
			})
		}
		noLiveJobs(t, c)
	})

	t.Run("run_as runs the ranks as the job's user", func(t *testing.T) {
		if os.Geteuid() != 0 {
			t.Skip("the agents do not run as root, so they run ranks only as themselves (CI runs this as root)")
		}
		nobody, err := user.Lookup("nobody")
		if err != nil {
			t.Fatal(err)
		}
		out := t.TempDir()
		// nobody writes in out, which it must reach.
		for dir, mode := range map[string]os.FileMode{filepath.Dir(out): 0o711, out: 0o777} {
			if err := os.Chmod(dir, mode); err != nil {
				t.Fatal(err)
			}
		}
		job := writeLaunchJob(t, dir, "nobody-job", `id -u > "$OUT/uid-$RANK"; echo "rank $RANK is $(id -un)"`, out, nil,
			"run_as: nobody", "workdir: "+out)
		r := topoctl(t, c.url, "run", job)
		if r.code != 0 {
			t.Fatalf("topoctl run: exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
		}
		for rank := range 4 {
			b, err := os.ReadFile(filepath.Join(out, fmt.Sprintf("uid-%d", rank)))
			if err != nil || strings.TrimSpace(string(b)) != nobody.Uid {
				t.Errorf("rank %d ran as uid %q (%v), want nobody's %s", rank, b, err, nobody.Uid)
			}
			if line := fmt.Sprintf("[rank %d] rank %d is nobody\n", rank, rank); !strings.Contains(r.stdout, line) {
				t.Errorf("topoctl run's output lacks %q:\n%s", line, r.stdout)
			}
		}
		noLiveJobs(t, c)
	})

	t.Run("Ctrl-C cancels the job: ranks stopped, GPUs freed", func(t *testing.T) {
		out := t.TempDir()
		killLeft(t, out)
		job := writeLaunchJob(t, dir, "cancel-job", `echo $$ > "$OUT/pid-$RANK"; exec sleep 300`, out, nil)
		run := startTopoctl(t, "topoctl run", c.url, "run", job)
		waitFor(t, 30*time.Second, func() (bool, string) {
			mustBeAlive(t, run)
			return len(pidsIn(t, out)) == 4, fmt.Sprintf("pids written: %v", pidsIn(t, out))
		})
		run.signal(t, os.Interrupt)
		if code := run.waitExit(t, 30*time.Second); code != 130 {
			t.Fatalf("topoctl run: exit %d after Ctrl-C, want 130\n%s", code, run.output())
		}
		for f, pid := range pidsIn(t, out) {
			if !processGone(pid) {
				t.Errorf("%s (%d) still runs after the job was cancelled", f, pid)
			}
		}
		if rel, ok := releasedOf(t, c, "cancel-job"); !ok || rel["status"] != "cancelled" {
			t.Errorf("placement.released = %v, want status cancelled", rel)
		}
		noLiveJobs(t, c)
	})

	t.Run("a restarted agent adopts the ranks still running", func(t *testing.T) {
		out := t.TempDir()
		killLeft(t, out)
		script := `env > "$OUT/env-$RANK"; echo $$ > "$OUT/pid-$RANK"; while [ ! -e "$OUT/stop" ]; do sleep 0.05; done; echo "done $RANK"`
		job := writeLaunchJob(t, dir, "adopt-job", script, out, nil)
		run := startTopoctl(t, "topoctl run", c.url, "run", job)
		waitFor(t, 30*time.Second, func() (bool, string) {
			mustBeAlive(t, run)
			started := strings.Contains(c.agents["node-002"].output(), `msg="ranks started" node=node-002 job_id=adopt-job`)
			return started && len(pidsIn(t, out)) == 4, fmt.Sprintf("agent node-002 started its ranks: %v; pids written: %v", started, pidsIn(t, out))
		})
		// A graceful stop (an upgrade, say) leaves the ranks running.
		old := c.agents["node-002"]
		old.signal(t, syscall.SIGTERM)
		if code := old.waitExit(t, 30*time.Second); code != 0 {
			t.Fatalf("agent node-002 exited %d on SIGTERM", code)
		}
		for f, pid := range pidsIn(t, out) {
			if processGone(pid) {
				t.Fatalf("%s (%d) ended with its agent", f, pid)
			}
		}
		stopped := time.Now()
		p := c.startAgent(t, "node-002")
		waitFor(t, 30*time.Second, func() (bool, string) {
			return strings.Contains(p.output(), `msg="adopted running ranks" node=node-002 job_id=adopt-job`),
				"the restarted agent has not adopted adopt-job's ranks"
		})
		// Ranks whose agent stays away longer stop by themselves.
		t.Logf("adopted %s after the agent stopped (the ranks would have stopped after %s)", time.Since(stopped).Round(time.Millisecond), launchSilence)
		// The restarted agent listens where its ranks know, and knows
		// their job's token.
		for _, rk := range decisionOf(t, c, "adopt-job").Ranks {
			if rk.Node != "node-002" {
				continue
			}
			env := readEnvFile(t, filepath.Join(out, fmt.Sprintf("env-%d", rk.Rank)))
			if code := postTelemetry(t, env["TOPOSCHED_TELEMETRY_URL"], env["TOPOSCHED_TELEMETRY_TOKEN"], "adopt-job"); code != 202 {
				t.Errorf("rank %d's telemetry to the restarted agent: HTTP %d, want 202", rk.Rank, code)
			}
		}
		if err := os.WriteFile(filepath.Join(out, "stop"), nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if code := run.waitExit(t, 60*time.Second); code != 0 {
			t.Fatalf("topoctl run: exit %d, want 0\n%s", code, run.output())
		}
		// The adopted ranks' exit codes come from their shim's files, and
		// their output after the restart is streamed.
		for _, want := range []string{"adopt-job: succeeded (ranks_exited)", "exit codes by rank: 0 0 0 0", "[rank 3] done 3"} {
			if !strings.Contains(run.output(), want) {
				t.Errorf("topoctl run's output lacks %q:\n%s", want, run.output())
			}
		}
		noLiveJobs(t, c)
	})

	t.Run("an agent killed mid-run: its ranks stop, then the job is lost and its GPUs freed", func(t *testing.T) {
		out := t.TempDir()
		killLeft(t, out)
		job := writeLaunchJob(t, dir, "lost-job", `echo $$ > "$OUT/pid-$RANK"; echo started; exec sleep 300`, out, nil)
		run := startTopoctl(t, "topoctl run", c.url, "run", job)
		// The agent logs it once its heartbeat has claimed the job.
		waitFor(t, 30*time.Second, func() (bool, string) {
			mustBeAlive(t, run)
			started := strings.Contains(c.agents["node-002"].output(), `msg="ranks started" node=node-002 job_id=lost-job`)
			return started && len(pidsIn(t, out)) == 4, fmt.Sprintf("agent node-002 started its ranks: %v; pids written: %v", started, pidsIn(t, out))
		})
		c.agents["node-002"].signal(t, syscall.SIGKILL)
		killed := time.Now()
		if code := run.waitExit(t, launchTTL+20*time.Second); code != 3 {
			t.Fatalf("topoctl run: exit %d, want 3 (lost)\n%s", code, run.output())
		}
		t.Logf("lost after %s (TTL %s)", time.Since(killed).Round(time.Millisecond), launchTTL)
		// The ranks of the silent agent stopped themselves before the
		// watchdog gave their GPUs away: gone now, as the job is lost, and
		// their shims say why.
		pids := pidsIn(t, out)
		d := decisionOf(t, c, "lost-job")
		for _, rk := range d.Ranks {
			if rk.Node != "node-002" {
				continue
			}
			if pid := pids[fmt.Sprintf("pid-%d", rk.Rank)]; !processGone(pid) {
				t.Errorf("rank %d (%d) of the silent agent still runs when its job is lost", rk.Rank, pid)
			}
			exitFile := filepath.Join(c.states["node-002"], "jobs", "lost-job", fmt.Sprintf("rank-%d.exit", rk.Rank))
			b, err := os.ReadFile(exitFile)
			if err != nil || !strings.Contains(string(b), `"agent_silent":true`) {
				t.Errorf("rank %d's exit file: %s (%v), want agent_silent", rk.Rank, b, err)
			}
			if fi, err := os.Stat(exitFile); err == nil {
				t.Logf("rank %d stopped by its shim %s after the kill (silence %s)", rk.Rank, fi.ModTime().Sub(killed).Round(time.Millisecond), launchSilence)
			}
		}
		if !strings.Contains(run.output(), "lost-job: lost (agent_lost): the agent of node node-002 has been silent") {
			t.Errorf("topoctl run's status:\n%s", run.output())
		}
		rel, ok := releasedOf(t, c, "lost-job")
		if !ok || rel["status"] != "lost" || rel["reason"] != "agent_lost" {
			t.Errorf("placement.released = %v, want status lost, reason agent_lost", rel)
		}
		noLiveJobs(t, c)
		// node-001's ranks stop on the release; the restarted node-002
		// finds the job released and its state file gone with it.
		c.startAgent(t, "node-002")
		waitFor(t, 30*time.Second, func() (bool, string) {
			for f, pid := range pids {
				if !processGone(pid) {
					return false, fmt.Sprintf("%s (%d) still runs", f, pid)
				}
			}
			return true, ""
		})
		if !strings.Contains(c.agents["node-002"].output(), "stopping ranks of a job released while the agent was down") {
			t.Errorf("the restarted agent did not say it cleared the job's ranks:\n%s", c.agents["node-002"].output())
		}
	})

	t.Run("no agent for a node: the job is reported, not left holding GPUs", func(t *testing.T) {
		old := c.agents["node-002"]
		old.signal(t, syscall.SIGTERM)
		if code := old.waitExit(t, 30*time.Second); code != 0 {
			t.Fatalf("agent node-002 exited %d on SIGTERM", code)
		}
		out := t.TempDir()
		killLeft(t, out)
		job := writeLaunchJob(t, dir, "orphan-job", `echo $$ > "$OUT/pid-$RANK"; exec sleep 300`, out, nil)
		r := runCmd(t, launchTTL+30*time.Second, clientEnv(c.url), bins.topoctl, "--nats-url", c.url, "run", job)
		if r.code != 3 || !strings.Contains(r.stderr, "orphan-job: lost (no_agent): no agent took the job's ranks on node node-002") {
			t.Fatalf("topoctl run: exit %d, want 3 (lost, no_agent)\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
		}
		// node-001's ranks, started, are stopped on the release.
		waitFor(t, 30*time.Second, func() (bool, string) {
			for f, pid := range pidsIn(t, out) {
				if !processGone(pid) {
					return false, fmt.Sprintf("%s (%d) still runs", f, pid)
				}
			}
			return true, ""
		})
		noLiveJobs(t, c)
	})
}
