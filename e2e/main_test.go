// Package e2e runs the real binaries (toposched, topoctl, nats-server and
// the nats CLI) as separate processes on loopback and checks what a user
// sees: decisions, rejections, dead letters, restarts.
//
// TestMain builds every binary once, with one `go build` from the module
// root, so that nats-server and the nats CLI are the versions go.mod pins
// with its tool directives, never whatever is on PATH. To save the build,
// point TOPOSCHED_E2E_NATS_SERVER and TOPOSCHED_E2E_NATS at prebuilt ones.
// With -short every test skips.
//
// The tests never sleep to synchronise: they poll a condition (a log line,
// a consumer's state, a CLI's answer) until a deadline.
package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Stream and consumer names of the wire contract, spelled out here rather
// than imported so that a rename in the product breaks these tests.
const (
	streamJobs      = "TOPOSCHED_JOBS"
	streamPlacement = "TOPOSCHED_PLACEMENT"
	streamTopology  = "TOPOSCHED_TOPOLOGY"
	streamDLQ       = "TOPOSCHED_DLQ"

	durableAnalysis          = "analysis-jobs-submitted"
	durablePlacementAnalyzed = "placement-jobs-analyzed"
	durablePlacementTopology = "placement-topology"
	durableOptimizerDecided  = "optimizer-placement"

	subjectSubmitted = "toposched.jobs.submitted"
	subjectDecided   = "toposched.placement.decided"
	subjectPending   = "toposched.placement.pending"
	subjectRejected  = "toposched.placement.rejected"
	subjectReleased  = "toposched.placement.released"
	// subjectTerm carries the placement replicas' term markers (fencing).
	subjectTerm = "toposched.placement.term"
)

// bins are the binaries under test, set by TestMain.
var bins struct {
	toposched, topoctl, natsServer, nats string
}

var (
	// moduleRoot is the directory holding go.mod.
	moduleRoot string
	// cliHome is HOME and XDG_CONFIG_HOME for the nats CLI, so that it
	// neither reads nor writes the user's contexts.
	cliHome string
	// skipReason is set when the binaries are not available.
	skipReason string
)

func TestMain(m *testing.M) {
	flag.Parse()
	os.Exit(run(m))
}

func run(m *testing.M) int {
	if testing.Short() {
		skipReason = "e2e needs the real binaries (toposched, topoctl, nats-server, nats) and is skipped with -short"
		return m.Run()
	}
	dir, err := os.MkdirTemp("", "toposched-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	defer func() {
		if err := os.RemoveAll(dir); err != nil {
			fmt.Fprintln(os.Stderr, "e2e:", err)
		}
	}()
	if err := build(dir); err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	return m.Run()
}

// build compiles the binaries into dir with one go build.
func build(dir string) error {
	root, err := findModuleRoot()
	if err != nil {
		return err
	}
	moduleRoot = root
	cliHome = filepath.Join(dir, "home")
	if err := os.MkdirAll(filepath.Join(cliHome, ".config"), 0o755); err != nil {
		return err
	}
	binDir := filepath.Join(dir, "bin")
	if err := os.MkdirAll(binDir, 0o755); err != nil {
		return err
	}
	exe := func(name string) string {
		if runtime.GOOS == "windows" {
			name += ".exe"
		}
		return filepath.Join(binDir, name)
	}
	pkgs := []string{"./cmd/toposched", "./cmd/topoctl"}
	bins.toposched, bins.topoctl = exe("toposched"), exe("topoctl")
	for _, tool := range []struct {
		env, pkg, name string
		dst            *string
	}{
		{"TOPOSCHED_E2E_NATS_SERVER", "github.com/nats-io/nats-server/v2", "nats-server", &bins.natsServer},
		{"TOPOSCHED_E2E_NATS", "github.com/nats-io/natscli/nats", "nats", &bins.nats},
	} {
		if p := os.Getenv(tool.env); p != "" {
			abs, err := filepath.Abs(p)
			if err != nil {
				return fmt.Errorf("%s: %w", tool.env, err)
			}
			st, err := os.Stat(abs)
			if err != nil {
				return fmt.Errorf("%s=%s: not a binary (%w)", tool.env, p, err)
			}
			if st.IsDir() {
				return fmt.Errorf("%s=%s: not a binary (a directory)", tool.env, p)
			}
			*tool.dst = abs
			fmt.Printf("e2e: %s from %s=%s\n", tool.name, tool.env, abs)
			continue
		}
		pkgs = append(pkgs, tool.pkg)
		*tool.dst = exe(tool.name)
	}
	args := append([]string{"build", "-o", binDir + string(os.PathSeparator)}, pkgs...)
	cmd := exec.Command("go", args...)
	cmd.Dir = root
	start := time.Now()
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("go %s (in %s): %w\n%s", strings.Join(args, " "), root, err, out)
	}
	fmt.Printf("e2e: built %s in %s\n", strings.Join(pkgs, " "), time.Since(start).Round(10*time.Millisecond))
	return nil
}

// findModuleRoot asks the go command for go.mod, else walks up to it.
func findModuleRoot() (string, error) {
	if out, err := exec.Command("go", "env", "GOMOD").Output(); err == nil {
		if gomod := strings.TrimSpace(string(out)); gomod != "" && gomod != os.DevNull {
			return filepath.Dir(gomod), nil
		}
	}
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod above the working directory")
		}
		dir = parent
	}
}

// needBinaries skips the test when TestMain built nothing.
func needBinaries(t testing.TB) {
	t.Helper()
	if skipReason != "" {
		t.Skip(skipReason)
	}
}

// testdata is the absolute path of a file under e2e/testdata.
func testdata(t *testing.T, name string) string {
	t.Helper()
	p, err := filepath.Abs(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// childEnv is the environment of every process the tests start: the
// caller's, minus anything that would point a binary elsewhere.
func childEnv(extra ...string) []string {
	override := map[string]bool{}
	for _, kv := range extra {
		k, _, _ := strings.Cut(kv, "=")
		override[k] = true
	}
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "NATS_") || strings.HasPrefix(k, "TOPOSCHED_") || override[k] {
			continue
		}
		env = append(env, kv)
	}
	return append(env, extra...)
}

// freePort returns a loopback TCP port that was free a moment ago, for a
// process the test starts to listen on.
//
// It hands out ports below the kernel's ephemeral range, each once per
// run, rather than asking the kernel for one (":0"): a port from the
// ephemeral range, closed again until the process binds it, may meanwhile
// become the local end of any connection on the machine, or another
// test's ":0" listener, and the process then fails to start ("bind:
// address already in use": once in CI, a NATS server's route port). The
// kernel gives out no port below its range on its own, so only a process
// that names one could take it.
func freePort(t testing.TB) int {
	t.Helper()
	ports.Lock()
	defer ports.Unlock()
	if ports.next == 0 {
		ports.lo, ports.hi = portRange()
		if ports.hi > ports.lo {
			ports.next = ports.lo + os.Getpid()%(ports.hi-ports.lo)
		}
	}
	for range ports.hi - ports.lo {
		p := ports.next
		if ports.next++; ports.next >= ports.hi {
			ports.next = ports.lo
		}
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
		if err != nil {
			continue // taken by something that names its port
		}
		if err := l.Close(); err != nil {
			t.Fatalf("free port: %v", err)
		}
		return p
	}
	// No range below the ephemeral one (a kernel configured so): the
	// kernel's choice, with the race above.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("free port: %v", err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	if err := l.Close(); err != nil {
		t.Fatalf("free port: %v", err)
	}
	return port
}

// ports is freePort's state: the next port to try in [lo, hi).
var ports struct {
	sync.Mutex
	lo, hi, next int
}

// portRange is where freePort takes ports: the 12,000 ports below the
// kernel's ephemeral range (Linux's ip_local_port_range; 32768 where it
// cannot be read), and none above 1024.
func portRange() (lo, hi int) {
	hi = 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if n, err := strconv.Atoi(f[0]); err == nil {
				hi = n
			}
		}
	}
	return max(1025, hi-12000), hi
}

// waitFor polls cond until it holds, failing the test after timeout with
// the last state cond described.
func waitFor(t testing.TB, timeout time.Duration, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(25 * time.Millisecond)
	defer tick.Stop()
	for {
		ok, state := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("not met after %s: %s", timeout, state)
		}
		<-tick.C
	}
}

// syncBuffer collects a process's output while it runs.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// proc is a long-running process under test.
type proc struct {
	name string
	cmd  *exec.Cmd
	out  *syncBuffer
	done chan struct{}
	err  error // valid once done is closed
}

// startProc starts bin with its output captured. It is killed and waited
// for when the test ends; if the test failed, its output is logged.
func startProc(t testing.TB, name string, env []string, bin string, args ...string) *proc {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = env
	out := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.WaitDelay = 5 * time.Second
	dieWithParent(cmd)
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	p := &proc{name: name, cmd: cmd, out: out, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		if !p.exited() {
			_ = cmd.Process.Kill()
		}
		<-p.done
		if t.Failed() {
			t.Logf("---- output of %s (%s):\n%s", name, strings.Join(cmd.Args, " "), out.String())
		}
	})
	return p
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// output is everything the process wrote so far.
func (p *proc) output() string { return p.out.String() }

// signal sends sig to the process.
func (p *proc) signal(t *testing.T, sig os.Signal) {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("signal %s to %s: %v", sig, p.name, err)
	}
}

// waitExit waits up to timeout for the process to end and returns its exit
// code.
func (p *proc) waitExit(t *testing.T, timeout time.Duration) int {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(timeout):
		t.Fatalf("%s still running %s after it was asked to stop", p.name, timeout)
	}
	var ee *exec.ExitError
	switch {
	case p.err == nil:
		return 0
	case errors.As(p.err, &ee):
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			t.Fatalf("%s killed by %s", p.name, ws.Signal())
		}
		return ee.ExitCode()
	}
	t.Fatalf("%s: %v", p.name, p.err)
	return -1
}

// mustBeAlive fails the test, with the process's output, if any of procs
// has exited.
func mustBeAlive(t testing.TB, procs ...*proc) {
	t.Helper()
	for _, p := range procs {
		if p.exited() {
			t.Fatalf("%s exited (%v); output:\n%s", p.name, p.err, p.output())
		}
	}
}

// result is what a short command did.
type result struct {
	stdout, stderr string
	code           int
}

// runCmd runs a short command to completion (at most timeout).
func runCmd(t testing.TB, timeout time.Duration, env []string, bin string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = env
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.WaitDelay = 5 * time.Second
	dieWithParent(cmd)
	err := cmd.Run()
	r := result{stdout: stdout.String(), stderr: stderr.String()}
	var ee *exec.ExitError
	switch {
	case ctx.Err() != nil:
		t.Fatalf("%s %s: still running after %s\nstdout:\n%s\nstderr:\n%s",
			filepath.Base(bin), strings.Join(args, " "), timeout, r.stdout, r.stderr)
	case errors.As(err, &ee):
		r.code = ee.ExitCode()
	case err != nil:
		t.Fatalf("%s %s: %v", filepath.Base(bin), strings.Join(args, " "), err)
	}
	return r
}

// natsServer starts a nats-server with JetStream on a free loopback port
// and returns its URL once it accepts connections.
func natsServer(t *testing.T) (string, *proc) {
	t.Helper()
	store := t.TempDir()
	port := freePort(t)
	p := startProc(t, "nats-server", childEnv(), bins.natsServer,
		"-js", "-sd", store, "-a", "127.0.0.1", "-p", fmt.Sprint(port))
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	waitFor(t, 20*time.Second, func() (bool, string) {
		mustBeAlive(t, p)
		if !strings.Contains(p.output(), "Server is ready") {
			return false, "nats-server has not logged 'Server is ready'"
		}
		return dialable(addr)
	})
	return "nats://" + addr, p
}

func dialable(addr string) (bool, string) {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return false, fmt.Sprintf("dial %s: %v", addr, err)
	}
	_ = c.Close()
	return true, ""
}

// natsCLI runs the real nats CLI against url and returns its stdout; a
// non-zero exit fails the test.
func natsCLI(t *testing.T, url string, args ...string) string {
	t.Helper()
	r := natsCLIResult(t, url, args...)
	if r.code != 0 {
		t.Fatalf("nats %s: exit %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), r.code, r.stdout, r.stderr)
	}
	return r.stdout
}

// natsCLIResult runs the nats CLI against url, as the operator of the
// serve there unless args sign in.
func natsCLIResult(t *testing.T, url string, args ...string) result {
	t.Helper()
	return natsCLIWith(t, url, natsCLIAuth(t, url, args), args...)
}

// natsCLIWith runs the nats CLI against url signed in with auth (its
// flags; none: anonymous).
func natsCLIWith(t *testing.T, url string, auth []string, args ...string) result {
	t.Helper()
	full := append(append([]string{"--server", url, "--no-context"}, auth...), args...)
	return runCmd(t, 30*time.Second,
		childEnv("HOME="+cliHome, "XDG_CONFIG_HOME="+filepath.Join(cliHome, ".config")), bins.nats, full...)
}

// topoctl runs the real topoctl against url, signed in as a user of the
// serve there (clientEnv): its administrator, or with --tenant in args
// that tenant's users.
func topoctl(t testing.TB, url string, args ...string) result {
	t.Helper()
	return runCmd(t, 60*time.Second, clientEnv(url), bins.topoctl, append([]string{"--nats-url", url}, args...)...)
}

// startTopoctl starts a long-running topoctl (watch, run) against url,
// signed in as topoctl would be.
func startTopoctl(t *testing.T, name, url string, args ...string) *proc {
	t.Helper()
	return startProc(t, name, clientEnv(url), bins.topoctl, append([]string{"--nats-url", url}, args...)...)
}

// topoctlOK runs topoctl and fails the test on a non-zero exit.
func topoctlOK(t testing.TB, url string, args ...string) string {
	t.Helper()
	r := topoctl(t, url, args...)
	if r.code != 0 {
		t.Fatalf("topoctl %s: exit %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), r.code, r.stdout, r.stderr)
	}
	return r.stdout
}

// jsConnect opens a nats.go connection, used only to wait for readiness
// and to audit streams (as a serve's operator, where url is a serve's);
// it is closed when the test ends.
func jsConnect(t testing.TB, url string) jetstream.JetStream {
	t.Helper()
	nc, err := nats.Connect(url, append(operatorOptions(t, url), nats.Timeout(5*time.Second), nats.Name("toposched-e2e"))...)
	if err != nil {
		t.Fatalf("connect %s: %v", url, err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatalf("jetstream: %v", err)
	}
	return js
}

func consumerInfo(js jetstream.JetStream, stream, name string) (*jetstream.ConsumerInfo, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	c, err := js.Consumer(ctx, stream, name)
	if err != nil {
		return nil, err
	}
	return c.Info(ctx)
}

// consumerExists is a waitFor condition.
func consumerExists(js jetstream.JetStream, stream, name string) (bool, string) {
	if _, err := consumerInfo(js, stream, name); err != nil {
		return false, fmt.Sprintf("consumer %s on %s: %v", name, stream, err)
	}
	return true, ""
}

// consumerDrained is a waitFor condition: the durable has acknowledged at
// least atLeast messages and holds nothing undelivered or unacknowledged.
func consumerDrained(js jetstream.JetStream, stream, name string, atLeast uint64) (bool, string) {
	ci, err := consumerInfo(js, stream, name)
	if err != nil {
		return false, fmt.Sprintf("consumer %s on %s: %v", name, stream, err)
	}
	if ci.NumPending > 0 || ci.NumAckPending > 0 || ci.AckFloor.Consumer < atLeast {
		return false, fmt.Sprintf("consumer %s on %s: pending %d, ack pending %d, acked %d of at least %d",
			name, stream, ci.NumPending, ci.NumAckPending, ci.AckFloor.Consumer, atLeast)
	}
	return true, ""
}

// streamMessages is how many messages stream holds.
func streamMessages(t *testing.T, js jetstream.JetStream, stream string) uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, stream)
	if err != nil {
		t.Fatalf("stream %s: %v", stream, err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatalf("stream %s: %v", stream, err)
	}
	return info.State.Msgs
}

// Wire shapes of the placement events, declared here rather than imported
// so that the tests read what is on the wire.
type (
	rankJSON struct {
		Rank      int    `json:"rank"`
		Node      string `json:"node"`
		GPU       int    `json:"gpu"`
		LocalRank int    `json:"local_rank"`
	}
	nodeJSON struct {
		Node               string `json:"node"`
		GPUs               []int  `json:"gpus"`
		CUDAVisibleDevices string `json:"cuda_visible_devices"`
	}
	launchJSON struct {
		MasterAddr string `json:"master_addr"`
		MasterPort int    `json:"master_port"`
	}
	decidedJSON struct {
		JobID    string      `json:"job_id"`
		Strategy string      `json:"strategy"`
		Ranks    []rankJSON  `json:"ranks"`
		Nodes    []nodeJSON  `json:"nodes"`
		Launch   *launchJSON `json:"launch"`
	}
	reasonJSON struct {
		Code    string `json:"code"`
		Message string `json:"message"`
		Field   string `json:"field"`
	}
	reasonsJSON struct {
		JobID   string       `json:"job_id"`
		Reasons []reasonJSON `json:"reasons"`
	}
)

// gpuKey is one GPU of the cluster.
type gpuKey struct {
	node string
	gpu  int
}

func (d decidedJSON) gpus() []gpuKey {
	out := make([]gpuKey, len(d.Ranks))
	for i, r := range d.Ranks {
		out[i] = gpuKey{r.Node, r.GPU}
	}
	return out
}

// placementEvent is one message of the placement stream.
type placementEvent struct {
	seq     uint64
	subject string
	jobID   string
	body    []byte
}

// readPlacements reads every message of the placement stream in order.
func readPlacements(t testing.TB, js jetstream.JetStream) []placementEvent {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, streamPlacement)
	if err != nil {
		t.Fatalf("stream %s: %v", streamPlacement, err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatalf("stream %s: %v", streamPlacement, err)
	}
	var out []placementEvent
	if info.State.Msgs == 0 {
		return nil
	}
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			t.Fatalf("get %s #%d: %v", streamPlacement, seq, err)
		}
		if m.Subject == subjectTerm {
			continue // a replica's term marker (fencing), about no job
		}
		var probe struct {
			JobID string `json:"job_id"`
		}
		if err := json.Unmarshal(m.Data, &probe); err != nil {
			t.Fatalf("%s #%d on %s: not JSON: %q", streamPlacement, seq, m.Subject, m.Data)
		}
		out = append(out, placementEvent{seq: seq, subject: m.Subject, jobID: probe.JobID, body: m.Data})
	}
	return out
}

// auditPlacements checks the placement log: no job decided twice, and no
// GPU in two live decisions at any point. It returns each job's last
// decision still live and the jobs whose last word is pending.
func auditPlacements(t *testing.T, evs []placementEvent) (live map[string]decidedJSON, pending map[string]bool) {
	t.Helper()
	live, pending = map[string]decidedJSON{}, map[string]bool{}
	decidedCount := map[string]int{}
	holder := map[gpuKey]string{}
	for _, ev := range evs {
		switch ev.subject {
		case subjectDecided:
			var d decidedJSON
			if err := json.Unmarshal(ev.body, &d); err != nil {
				t.Fatalf("decision #%d: %v", ev.seq, err)
			}
			decidedCount[d.JobID]++
			if decidedCount[d.JobID] > 1 {
				t.Errorf("job %s decided %d times (latest #%d)", d.JobID, decidedCount[d.JobID], ev.seq)
			}
			for _, g := range d.gpus() {
				if other, ok := holder[g]; ok {
					t.Errorf("GPU %s/%d given to %s (#%d) while %s holds it", g.node, g.gpu, d.JobID, ev.seq, other)
				}
				holder[g] = d.JobID
			}
			live[d.JobID] = d
			delete(pending, d.JobID)
		case subjectPending:
			if _, placed := live[ev.jobID]; placed {
				t.Errorf("job %s pending (#%d) while it holds a decision", ev.jobID, ev.seq)
			}
			pending[ev.jobID] = true
		case subjectReleased:
			if d, ok := live[ev.jobID]; ok {
				for _, g := range d.gpus() {
					delete(holder, g)
				}
			}
			delete(live, ev.jobID)
			delete(pending, ev.jobID)
		}
	}
	return live, pending
}

// keepJetStreamReachable moves nc to another server of its list when the
// one it is on finds no responder for JetStream requests for five seconds
// in a row, as the product's bus does (events/bus, retryJetStream): after a
// node's death on a loaded machine a survivor answered so for minutes
// while the other survivor served. It probes once a second until the test
// ends.
func keepJetStreamReachable(t *testing.T, nc *nats.Conn) {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done })
	go func() {
		defer close(done)
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		var since time.Time
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			rctx, rcancel := context.WithTimeout(ctx, 2*time.Second)
			_, err := js.AccountInfo(rctx)
			rcancel()
			switch {
			case !errors.Is(err, nats.ErrNoResponders):
				since = time.Time{}
			case since.IsZero():
				since = time.Now()
			case time.Since(since) >= 5*time.Second:
				t.Logf("%s: JetStream finds no responder on %s for %s: reconnecting to another server", time.Now().Format(time.TimeOnly), nc.ConnectedUrl(), time.Since(since).Round(time.Second))
				_ = nc.ForceReconnect()
				since = time.Time{}
			}
		}
	}()
}
