package launcher

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/events/bus"
	"github.com/toposched/toposched/internal/client"
)

// Defaults of Config.
const (
	DefaultHeartbeat  = 5 * time.Second
	DefaultGrace      = 10 * time.Second
	DefaultTuningWait = 3 * time.Second
)

// Config is one node agent's launcher.
type Config struct {
	// Node is the node's name as the decisions spell it.
	Node string
	// GPUs are the node's GPU indices; a decision naming another is
	// refused. Nil: not checked.
	GPUs []int
	// Address is where other nodes reach this one's ranks (MASTER_ADDR
	// when rank 0 runs here); "" means Node.
	Address string
	// StateDir holds each job's state file and its ranks' output.
	StateDir string
	// Heartbeat is how often the agent says it is alive; the watchdog's
	// TTL must be several of them.
	Heartbeat time.Duration
	// AgentTTL is the watchdog's (toposched serve --agent-ttl): how long
	// after the agent's last heartbeat the GPUs of its jobs may be given
	// away. The shims stop the ranks before (Silence); 0: they do not
	// watch the agent.
	AgentTTL time.Duration
	// Grace is how long a rank asked to stop (SIGTERM) has before SIGKILL.
	Grace time.Duration
	// TuningWait is how long a launch waits for the job's runtime.tuning
	// before starting without it.
	TuningWait time.Duration
	// TelemetryListen is the loopback address of the endpoint where ranks
	// report runtime.telemetry over HTTP (TOPOSCHED_TELEMETRY_URL); ""
	// turns it off.
	TelemetryListen string
	// Shim is the command line that runs a rank under the rank shim
	// (RunShim), the exit file and "--" then the rank's argv following;
	// nil starts ranks directly, and an adopted rank's exit code is then
	// not known.
	Shim []string
	// LogLineBytes and LogBytesPerRank bound the log stream (0: defaults).
	LogLineBytes    int
	LogBytesPerRank int64
	// RunAsAllow are the users a job's ranks may run as (run_as; see
	// runas.go); an agent running as root needs it. Nil: no list.
	RunAsAllow []string
	// RunAsDefault is the user the ranks of a job naming none run as;
	// "": the agent's own.
	RunAsDefault string
}

// Silence is how long the shims let the agent's alive file stand still
// before they stop its ranks: the TTL less the grace the ranks have to
// stop and a margin (one heartbeat, at least two polls of the shim) for
// the shim to notice. The alive file holds the start of the last
// heartbeat NATS took, which is before the watchdog heard it, so the ranks
// of a silent agent are gone by TTL - margin + poll after the watchdog last
// heard from it: before it frees their GPUs. 0 when AgentTTL is 0.
func (c Config) Silence() time.Duration {
	if c.AgentTTL == 0 {
		return 0
	}
	return c.AgentTTL - c.Grace - max(c.Heartbeat, 2*shimPoll)
}

// AliveFile is the file in the state dir whose mtime tells the shims the
// agent is alive.
func (c Config) AliveFile() string { return filepath.Join(c.StateDir, "agent.alive") }

func (c *Config) setDefaults() {
	if c.Address == "" {
		c.Address = c.Node
	}
	if c.Heartbeat == 0 {
		c.Heartbeat = DefaultHeartbeat
	}
	if c.Grace == 0 {
		c.Grace = DefaultGrace
	}
	if c.TuningWait == 0 {
		c.TuningWait = DefaultTuningWait
	}
	if c.LogLineBytes == 0 {
		c.LogLineBytes = DefaultLogLineBytes
	}
	if c.LogBytesPerRank == 0 {
		c.LogBytesPerRank = DefaultLogBytesPerRank
	}
}

// Validate names the first bad field.
func (c Config) Validate() error {
	switch {
	case c.Node == "":
		return errors.New("node: required")
	case c.StateDir == "":
		return errors.New("state dir: required")
	case c.Heartbeat < 0:
		return fmt.Errorf("heartbeat %s: must be positive", c.Heartbeat)
	case c.Grace < 0:
		return fmt.Errorf("grace %s: must not be negative", c.Grace)
	case c.AgentTTL < 0:
		return fmt.Errorf("agent ttl %s: must not be negative", c.AgentTTL)
	case c.AgentTTL > 0 && c.Silence() < 2*c.Heartbeat:
		// One late heartbeat must not stop the ranks.
		return fmt.Errorf("agent ttl %s: must be at least the grace (%s), two heartbeats (%s) and a margin of one more (%s) long, so that the ranks of a silent agent stop before the watchdog frees their GPUs",
			c.AgentTTL, c.Grace, 2*c.Heartbeat, max(c.Heartbeat, 2*shimPoll))
	case c.TuningWait < 0:
		return fmt.Errorf("tuning wait %s: must not be negative", c.TuningWait)
	case c.LogLineBytes < 0 || c.LogBytesPerRank < 0:
		return errors.New("log limits: must not be negative")
	}
	return nil
}

// Deps are what an agent, or the watchdog, talks to.
type Deps struct {
	// Bus is where it follows decisions and publishes what became of
	// them; only Run needs it, so a unit test of the parts may leave it
	// out.
	Bus *bus.Bus
	// Log is nil for slog.Default.
	Log *slog.Logger
}

func (d Deps) log() *slog.Logger {
	if d.Log == nil {
		return slog.Default()
	}
	return d.Log
}

// Agent starts and watches the ranks placed on one node.
type Agent struct {
	cfg     Config
	b       *bus.Bus
	log     *slog.Logger
	ready   chan struct{}
	id      string
	started time.Time
	numactl string
	runAs   *runAsPolicy
	// telemetryURL is the endpoint's, "" when it is off.
	telemetryURL string

	mu sync.Mutex
	// live are the decisions not released that put ranks here.
	live     map[string]*events.PlacementDecided
	released map[string]bool
	runs     map[string]*run
	tunings  map[string]*events.RuntimeTuning
	tuned    map[string]chan struct{}
	addrs    map[string]string
	reports  map[string]map[string]*events.RanksExited
	// finished are the jobs whose jobs.finished this agent published.
	finished map[string]bool

	// runsDone counts the runs' goroutines (execute).
	runsDone sync.WaitGroup

	// aliveMu orders the alive file's updates; aliveAt is its mtime.
	aliveMu sync.Mutex
	aliveAt time.Time
}

// New checks cfg and makes an agent publishing and following on the bus;
// Run starts it.
func New(cfg Config, deps Deps) (*Agent, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("launcher: %w", err)
	}
	// The shims run in the job's workdir: the paths they are given (the
	// alive and exit files) must not depend on it.
	dir, err := filepath.Abs(cfg.StateDir)
	if err != nil {
		return nil, fmt.Errorf("launcher: state dir: %w", err)
	}
	cfg.StateDir = dir
	self, err := currentAccount()
	if err != nil {
		return nil, fmt.Errorf("launcher: the agent's own user: %w", err)
	}
	runAs, err := newRunAsPolicy(self, cfg.RunAsAllow, cfg.RunAsDefault, lookupAccount)
	if err != nil {
		return nil, fmt.Errorf("launcher: %w", err)
	}
	var id [4]byte
	_, _ = rand.Read(id[:])
	numactl, _ := exec.LookPath("numactl")
	return &Agent{
		cfg: cfg, b: deps.Bus, log: deps.log().With("node", cfg.Node), ready: make(chan struct{}), id: cfg.Node + "-" + hex.EncodeToString(id[:]),
		started: time.Now().UTC(), numactl: numactl, runAs: runAs,
		live: map[string]*events.PlacementDecided{}, released: map[string]bool{}, runs: map[string]*run{},
		tunings: map[string]*events.RuntimeTuning{}, tuned: map[string]chan struct{}{}, addrs: map[string]string{},
		reports: map[string]map[string]*events.RanksExited{}, finished: map[string]bool{},
	}, nil
}

// Ready is closed once the agent follows the streams, has said it is
// alive and has adopted, reported or started what they hold for its node.
func (a *Agent) Ready() <-chan struct{} { return a.ready }

// Run follows the streams and runs ranks until ctx ends. Ranks still
// running then keep running: a restarted agent adopts them.
func (a *Agent) Run(ctx context.Context) error {
	if a.b == nil {
		return errors.New("launcher: deps: Bus is required to run")
	}
	if err := os.MkdirAll(a.cfg.StateDir, 0o755); err != nil {
		return fmt.Errorf("state dir: %w", err)
	}
	if err := checkCaseSensitive(a.cfg.StateDir); err != nil {
		return fmt.Errorf("state dir: %w", err)
	}
	if err := checkOwnDir(a.cfg.StateDir); err != nil {
		return fmt.Errorf("state dir: %w", err)
	}
	if a.numactl == "" {
		a.log.Info("numactl not found: ranks are not bound to their GPU's NUMA node")
	}
	if err := waitStreams(ctx, a.b, a.log, events.DomainJobs, events.DomainPlacement, events.DomainRuntime, events.DomainAgent); err != nil {
		return nil
	}
	// The runs stop with ctx (their ranks go on); a state file is not
	// touched once Run has returned, so a next agent may read it.
	defer a.runsDone.Wait()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if a.cfg.TelemetryListen != "" {
		url, err := a.serveTelemetry(ctx, a.cfg.TelemetryListen)
		if err != nil {
			return err
		}
		a.telemetryURL = url
	}
	recs := make(chan bus.Record, 256)
	errc := make(chan error, 3)
	follow := func(domain events.Domain, names ...events.Name) <-chan struct{} {
		return followInto(ctx, a.b, recs, errc, domain, names...)
	}
	// Follow first, then read what is stored: an event in both is
	// handled twice, which every handler allows; none falls between.
	readies := []<-chan struct{}{
		follow(events.DomainPlacement, events.NamePlacementDecided, events.NamePlacementReleased),
		follow(events.DomainRuntime, events.NameRuntimeTuning, events.NameRanksExited),
		follow(events.DomainAgent, events.NameAgentHeartbeat),
	}
	if err := awaitFollows(ctx, readies, errc); err != nil || ctx.Err() != nil {
		return err
	}
	a.heartbeat(ctx)
	if err := a.rebuild(ctx); err != nil {
		return err
	}
	go func() {
		tick := time.NewTicker(a.cfg.Heartbeat)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				a.heartbeat(ctx)
			}
		}
	}()
	close(a.ready)
	a.log.Info("launcher ready", "agent", a.id, "address", a.cfg.Address, "state_dir", a.cfg.StateDir, "telemetry", a.telemetryURL,
		"user", a.runAs.self.name, "run_as_allow", a.cfg.RunAsAllow, "run_as_default", a.cfg.RunAsDefault)
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-errc:
			if err = followEnded(ctx, err); err != nil {
				return fmt.Errorf("launcher: %w", err)
			}
			return nil
		case r := <-recs:
			a.handle(ctx, r)
		}
	}
}

// rebuild reads the placements and reports stored so far, adopts or
// reports the ranks a previous run of the agent left, and launches the
// live jobs it has not run yet.
func (a *Agent) rebuild(ctx context.Context) error {
	err := a.b.Replay(ctx, events.DomainPlacement, []string{a.b.Subjects.Of(events.NamePlacementDecided), a.b.Subjects.Of(events.NamePlacementReleased)},
		func(r bus.Record) error {
			a.apply(r)
			return nil
		})
	if err != nil {
		return fmt.Errorf("launcher: read placements: %w", err)
	}
	err = a.b.Replay(ctx, events.DomainRuntime, []string{a.b.Subjects.Of(events.NameRanksExited), a.b.Subjects.Of(events.NameRuntimeTuning)},
		func(r bus.Record) error {
			a.apply(r)
			return nil
		})
	if err != nil {
		return fmt.Errorf("launcher: read reports: %w", err)
	}
	a.mu.Lock()
	// Tunings and reports of jobs that ended or never ran here.
	maps.DeleteFunc(a.tunings, func(id string, _ *events.RuntimeTuning) bool { return a.live[id] == nil })
	maps.DeleteFunc(a.reports, func(id string, _ map[string]*events.RanksExited) bool { return a.live[id] == nil })
	a.mu.Unlock()
	// The other agents' addresses, for MASTER_ADDR.
	err = a.b.Replay(ctx, events.DomainAgent, []string{a.b.Subjects.Of(events.NameAgentHeartbeat)}, func(r bus.Record) error {
		a.apply(r)
		return nil
	})
	if err != nil {
		return fmt.Errorf("launcher: read heartbeats: %w", err)
	}
	states, errs := readStates(a.cfg.StateDir)
	for _, err := range errs {
		a.log.Warn("state file skipped", "err", err)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	// A job with a state here was started here: it is adopted (or
	// reported), never started again, even when its state cannot be read.
	adopted := map[string]bool{}
	for _, s := range states {
		adopted[s.JobID] = true
		d, ok := a.live[s.JobID]
		if !ok {
			// Released while the agent was away: nothing may run on
			// GPUs that are no longer the job's.
			a.log.Info("stopping ranks of a job released while the agent was down", "job_id", s.JobID)
			for _, r := range s.Ranks {
				if alive(r.PID, r.Start) {
					_ = signalGroup(r.PID, sigKill)
				}
			}
			if err := removeState(&s); err != nil {
				a.log.Warn("state file not removed", "job_id", s.JobID, "err", err)
			}
			continue
		}
		a.startRun(ctx, d, &s)
	}
	for id, d := range a.live {
		if adopted[id] {
			continue
		}
		if _, done := a.reports[id][a.cfg.Node]; done {
			// Ran here and reported: claim it until its release.
			a.runs[id] = &run{id: id, d: d, stop: make(chan struct{})}
			continue
		}
		a.startRun(ctx, d, nil)
	}
	for id := range a.live {
		a.maybeFinishLocked(ctx, id)
	}
	return nil
}

// apply folds one stored event into the state, without acting: the
// replay's half of handle.
func (a *Agent) apply(r bus.Record) {
	a.mu.Lock()
	defer a.mu.Unlock()
	switch r.Name {
	case events.NamePlacementDecided:
		var d events.PlacementDecided
		if bus.Decode(r.Name, r.Body, &d) != nil || a.released[d.JobID] || !onNode(&d, a.cfg.Node) {
			return
		}
		a.live[d.JobID] = &d
	case events.NamePlacementReleased:
		var rel events.PlacementReleased
		if bus.Decode(r.Name, r.Body, &rel) != nil {
			return
		}
		// Kept for good: a decision read again (the follow and the
		// replay overlap) must not revive the job.
		a.released[rel.JobID] = true
		delete(a.live, rel.JobID)
		delete(a.tunings, rel.JobID)
		delete(a.reports, rel.JobID)
	case events.NameRuntimeTuning:
		var t events.RuntimeTuning
		if bus.Decode(r.Name, r.Body, &t) != nil {
			return
		}
		a.tunings[t.JobID] = &t
		if c, ok := a.tuned[t.JobID]; ok {
			close(c)
			delete(a.tuned, t.JobID)
		}
	case events.NameRanksExited:
		var x events.RanksExited
		if bus.Decode(r.Name, r.Body, &x) != nil {
			return
		}
		if a.reports[x.JobID] == nil {
			a.reports[x.JobID] = map[string]*events.RanksExited{}
		}
		a.reports[x.JobID][x.Node] = &x
	case events.NameAgentHeartbeat:
		var h events.AgentHeartbeat
		if bus.Decode(r.Name, r.Body, &h) != nil {
			return
		}
		a.addrs[h.Node] = h.Address
	}
}

// handle applies one followed event and acts on it.
func (a *Agent) handle(ctx context.Context, r bus.Record) {
	a.apply(r)
	a.mu.Lock()
	defer a.mu.Unlock()
	switch r.Name {
	case events.NamePlacementDecided:
		id := r.Env.Subject
		if d, ok := a.live[id]; ok && a.runs[id] == nil {
			a.startRun(ctx, d, nil)
		}
	case events.NamePlacementReleased:
		id := r.Env.Subject
		if run, ok := a.runs[id]; ok {
			run.requestStop(events.ReasonCancelled)
			delete(a.runs, id)
		}
	case events.NameRanksExited:
		var x events.RanksExited
		if bus.Decode(r.Name, r.Body, &x) != nil {
			return
		}
		// Only a node the decision runs ranks on may stop them: the
		// report's node is its sender's (its subject, bus.checkScope).
		if run, ok := a.runs[x.JobID]; ok && x.Node != a.cfg.Node && x.Status == events.StatusFailed && onNode(run.d, x.Node) {
			run.requestStop(events.ReasonPeerFailed)
		}
		a.maybeFinishLocked(ctx, x.JobID)
	}
}

// startRun takes a job and launches (or adopts) its ranks here. a.mu is held.
func (a *Agent) startRun(ctx context.Context, d *events.PlacementDecided, adopt *jobState) {
	rn := &run{id: d.JobID, d: d, stop: make(chan struct{})}
	if adopt != nil {
		rn.token = adopt.TelemetryToken
	} else {
		rn.token = newToken()
	}
	a.runs[d.JobID] = rn
	a.runsDone.Go(func() { a.execute(ctx, rn, adopt) })
}

// heartbeat says the agent is alive, with the jobs it has taken.
func (a *Agent) heartbeat(ctx context.Context) {
	a.mu.Lock()
	hb := &events.AgentHeartbeat{Node: a.cfg.Node, Agent: a.id, StartedAt: a.started, SentAt: time.Now().UTC(),
		IntervalSeconds: a.cfg.Heartbeat.Seconds(), Address: a.cfg.Address}
	if s := a.cfg.Silence(); s > 0 {
		hb.RanksStopAfterSeconds = (s + a.cfg.Grace).Seconds()
	}
	for _, id := range slices.Sorted(maps.Keys(a.runs)) {
		rn := a.runs[id]
		if rn.external.Load() {
			continue
		}
		hb.Jobs = append(hb.Jobs, events.AgentJob{JobID: id, Ranks: ranksOn(rn.d, a.cfg.Node)})
	}
	a.mu.Unlock()
	if _, err := a.b.Publish(ctx, hb); err != nil {
		if ctx.Err() == nil {
			a.log.Warn("heartbeat not sent", "err", err)
		}
		return
	}
	a.markAlive(hb.SentAt)
}

// markAlive sets the alive file's mtime to at, the start of a heartbeat
// NATS took (so never later than the watchdog heard it), unless a later
// one is there already: heartbeats run side by side.
func (a *Agent) markAlive(at time.Time) {
	a.aliveMu.Lock()
	defer a.aliveMu.Unlock()
	if !at.After(a.aliveAt) {
		return
	}
	path := a.cfg.AliveFile()
	err := os.Chtimes(path, at, at)
	if errors.Is(err, os.ErrNotExist) {
		if err = os.WriteFile(path, nil, 0o644); err == nil {
			err = os.Chtimes(path, at, at)
		}
	}
	if err != nil {
		a.log.Warn("alive file not updated: the ranks stop once it is older than the silence", "path", path, "err", err)
		return
	}
	a.aliveAt = at
}

// maybeFinishLocked publishes jobs.finished once every node of a job has
// reported, from the agent of rank 0's node only. a.mu is held.
func (a *Agent) maybeFinishLocked(ctx context.Context, id string) {
	d, ok := a.live[id]
	if !ok || a.finished[id] || leadNode(d) != a.cfg.Node {
		return
	}
	reps := a.reports[id]
	for _, np := range d.Nodes {
		if reps[np.Node] == nil {
			return
		}
	}
	fin := &events.JobFinished{JobID: id, Status: events.StatusSucceeded, Reason: events.ReasonRanksExited}
	var cause *events.RanksExited
	for _, np := range d.Nodes {
		r := reps[np.Node]
		fin.Ranks = append(fin.Ranks, r.Ranks...)
		if r.Status != events.StatusFailed {
			continue
		}
		// The node where it went wrong, not one stopped because of it.
		if cause == nil || (cause.Reason == events.ReasonPeerFailed && r.Reason != events.ReasonPeerFailed) {
			cause = r
		}
	}
	slices.SortFunc(fin.Ranks, func(x, y events.RankExit) int { return x.Rank - y.Rank })
	if len(fin.Ranks) > events.MaxFinishRanks {
		fin.Ranks = slices.DeleteFunc(fin.Ranks, func(x events.RankExit) bool { return x.ExitCode == 0 && x.Signal == "" })
		fin.Ranks = fin.Ranks[:min(len(fin.Ranks), events.MaxFinishRanks)]
	}
	if cause != nil {
		fin.Status, fin.Reason, fin.Message = events.StatusFailed, cause.Reason, cause.Node+": "+cause.Message
	}
	a.finished[id] = true
	go func() {
		// Under this node's scope: placement takes a finish from the
		// node of rank 0 alone.
		if _, err := a.b.Publish(bus.WithScope(ctx, events.NodeScope(a.cfg.Node)), fin); err != nil {
			a.log.Error("jobs.finished not sent", "job_id", id, "err", err)
			return
		}
		a.log.Info("job finished", "job_id", id, "status", fin.Status, "reason", fin.Reason)
	}()
}

// onNode reports whether a decision puts a rank on node.
func onNode(d *events.PlacementDecided, node string) bool {
	return slices.ContainsFunc(d.Ranks, func(r events.RankPlacement) bool { return r.Node == node })
}

func ranksOn(d *events.PlacementDecided, node string) []int {
	var out []int
	for _, r := range d.Ranks {
		if r.Node == node {
			out = append(out, r.Rank)
		}
	}
	return out
}

// leadNode is the node of rank 0.
func leadNode(d *events.PlacementDecided) string {
	for _, r := range d.Ranks {
		if r.Rank == 0 {
			return r.Node
		}
	}
	return ""
}

// submission reads the job's jobs.submitted, retrying while NATS is away.
func (a *Agent) submission(ctx context.Context, id string) (*events.JobSubmitted, error) {
	var err error
	for wait := 100 * time.Millisecond; ; wait = min(2*wait, 5*time.Second) {
		var h *client.JobHistory
		h, err = client.History(ctx, a.b, id)
		if err == nil {
			return h.Submission(), nil
		}
		if errors.Is(err, client.ErrUnknownJob) {
			return nil, err
		}
		a.log.Warn("reading the job's submission", "job_id", id, "err", err)
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(wait):
		}
	}
}

// waitStreams waits until the operator has created the streams of
// domains: an agent may well start before it. It returns ctx's error if
// ctx ends first.
func waitStreams(ctx context.Context, b *bus.Bus, log *slog.Logger, domains ...events.Domain) error {
	for _, d := range domains {
		for wait, logged := 100*time.Millisecond, false; ; wait = min(2*wait, 5*time.Second) {
			_, err := b.JetStream().Stream(ctx, b.StreamName(d))
			if err == nil {
				break
			}
			if !logged {
				log.Info("waiting for the operator to create the streams", "stream", b.StreamName(d), "err", err)
				logged = true
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(wait):
			}
		}
	}
	return nil
}
