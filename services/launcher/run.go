package launcher

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/internal/client"
)

// run is one job taken by the agent, from its decision to its release.
type run struct {
	id string
	d  *events.PlacementDecided
	// external is set for a job without a command: placed for a launcher
	// of its own, not this agent's to run or claim.
	external atomic.Bool

	// token is what the job's ranks show the telemetry endpoint
	// (EnvTelemetryToken), kept in the job's state file for an agent
	// that adopts them; "" for ranks an older agent started.
	token string

	stopOnce   sync.Once
	stop       chan struct{}
	stopReason string
}

// requestStop asks the ranks to stop (SIGTERM, then SIGKILL after the
// grace period); the first reason given is kept.
func (r *run) requestStop(reason string) {
	r.stopOnce.Do(func() {
		r.stopReason = reason
		close(r.stop)
	})
}

// rankProc is one rank the agent started or adopted.
type rankProc struct {
	rank int
	pid  int
	// exited is closed once the rank has ended and exit is set.
	exited chan struct{}
	exit   events.RankExit
	// stopped is set, by watch alone, when the agent asked the rank to stop.
	stopped bool
	// agentSilent: its shim stopped it, the agent having been silent.
	agentSilent bool
}

// execute launches (or adopts) a job's local ranks, watches them, stops
// them all when one fails or the job is stopped, and reports how they
// ended.
func (a *Agent) execute(ctx context.Context, rn *run, adopt *jobState) {
	log := a.log.With("job_id", rn.id)
	var procs []*rankProc
	var logs []func(stop <-chan struct{}) // tailers to run
	state := adopt
	if adopt != nil {
		procs, logs = a.adopt(ctx, rn, adopt)
		if len(procs) == 0 {
			rep := &events.RanksExited{Status: events.StatusFailed, Reason: events.ReasonRanksGone,
				Message: "the ranks ended while the agent was down; how is not known", Ranks: unknownExits(adopt.Ranks, a.cfg.Node)}
			if adopt.unreadable != nil {
				// Started here, so not to be started again; which
				// processes its ranks are is lost with the file.
				log.Error("the job's state file cannot be read: its ranks are not known, and the job is reported failed", "err", adopt.unreadable)
				rep.Message = "the agent lost its record of the ranks it started (its log says why); any still running are not watched"
				rep.Ranks = nil
				for _, r := range ranksOn(rn.d, a.cfg.Node) {
					rep.Ranks = append(rep.Ranks, events.RankExit{Rank: r, Node: a.cfg.Node, ExitCode: -1})
				}
			} else {
				log.Warn("ranks gone while the agent was down, with no word of how they ended")
			}
			a.finishRun(ctx, rn, adopt, rep)
			return
		}
		a.heartbeat(ctx) // claim the job at once: the watchdog counts from its decision
		log.Info("adopted running ranks", "ranks", len(procs))
	} else {
		var err error
		procs, logs, state, err = a.launch(ctx, rn)
		if err != nil {
			if errors.Is(err, errExternal) || ctx.Err() != nil {
				return
			}
			// Only a launchError's message is the submitter's: any
			// other error is the agent's, told in its log alone.
			var le *launchError
			if !errors.As(err, &le) {
				le = agentErr("the agent could not launch the job", err)
			}
			rep := &events.RanksExited{Status: events.StatusFailed, Reason: events.ReasonLaunchFailed, Message: le.Error(), Field: le.field}
			for _, r := range ranksOn(rn.d, a.cfg.Node) {
				rep.Ranks = append(rep.Ranks, events.RankExit{Rank: r, Node: a.cfg.Node, ExitCode: -1})
			}
			log.Warn("job not launched", "err", le.Error(), "detail", le.detail)
			a.report(ctx, rn, rep)
			return
		}
		a.heartbeat(ctx) // claim the job at once: the watchdog counts from its decision
		log.Info("ranks started", "ranks", len(procs))
	}
	tailStop := make(chan struct{})
	var tails sync.WaitGroup
	for _, t := range logs {
		tails.Go(func() { t(tailStop) })
	}
	a.watch(ctx, rn, procs)
	if ctx.Err() != nil {
		return // the agent stops; the ranks keep running for the next one
	}
	for _, p := range procs {
		p.exit.Stopped = p.stopped
	}
	close(tailStop)
	tails.Wait()

	rep := &events.RanksExited{Status: events.StatusSucceeded, Reason: events.ReasonRanksExited}
	var failed []string
	for _, p := range procs {
		rep.Ranks = append(rep.Ranks, p.exit)
		switch {
		case p.exit.Stopped:
		case p.agentSilent:
			failed = append(failed, fmt.Sprintf("rank %d stopped by its shim: the agent was silent too long (its GPUs were to be freed)", p.rank))
			rep.Reason = events.ReasonRankFailed
		case p.exit.ExitCode == -1 && p.exit.Signal == "":
			failed = append(failed, fmt.Sprintf("rank %d: ended while the agent was down, how is not known", p.rank))
			rep.Reason = events.ReasonRanksGone
		case p.exit.Signal != "":
			failed = append(failed, fmt.Sprintf("rank %d killed by signal %s", p.rank, p.exit.Signal))
			rep.Reason = events.ReasonRankFailed
		case p.exit.ExitCode != 0:
			failed = append(failed, fmt.Sprintf("rank %d exited with status %d", p.rank, p.exit.ExitCode))
			rep.Reason = events.ReasonRankFailed
		}
	}
	stopped := slices.ContainsFunc(rep.Ranks, func(x events.RankExit) bool { return x.Stopped })
	switch {
	case len(failed) > 0:
		rep.Status, rep.Message = events.StatusFailed, strings.Join(failed, "; ")
		if stopped {
			rep.Message += "; the other ranks were stopped"
		}
	case stopped:
		rep.Status, rep.Reason = events.StatusFailed, rn.stopReason
		rep.Message = "ranks stopped: " + rn.stopReason
	}
	a.finishRun(ctx, rn, state, rep)
}

// finishRun reports how the node's ranks ended and then removes the job's
// state, in that order: a restarted agent that finds the state adopts
// the job (and reports it), one that finds the report claims it; one that
// found neither would start the job again.
func (a *Agent) finishRun(ctx context.Context, rn *run, st *jobState, rep *events.RanksExited) {
	if !a.report(ctx, rn, rep) {
		return // the agent stops: the next one reports from the state
	}
	if err := removeState(st); err != nil {
		a.log.Warn("state file not removed", "job_id", rn.id, "err", err)
	}
	if err := removeTuningFiles(a.cfg.StateDir, rn.id); err != nil {
		a.log.Warn("tuning files not removed", "job_id", rn.id, "err", err)
	}
}

// errExternal: the job has no command; another launcher runs it.
var errExternal = errors.New("no command: launched by someone else")

// launch checks the job and starts its local ranks.
func (a *Agent) launch(ctx context.Context, rn *run) ([]*rankProc, []func(<-chan struct{}), *jobState, error) {
	job, err := a.submission(ctx, rn.id)
	if err != nil {
		if errors.Is(err, ctx.Err()) {
			return nil, nil, nil, err
		}
		if errors.Is(err, client.ErrUnknownJob) {
			return nil, nil, nil, &launchError{err: errors.New("the agent found no jobs.submitted for the job"), detail: err.Error()}
		}
		return nil, nil, nil, agentErr("the agent could not read the job's submission", err)
	}
	if job == nil || job.Command == "" {
		rn.external.Store(true)
		return nil, nil, nil, errExternal
	}
	user, err := a.runAs.resolve(job.RunAs)
	if err != nil {
		return nil, nil, nil, err
	}
	tuning := a.waitTuning(ctx, rn.id)
	p, err := makePlan(planInput{
		node: a.cfg.Node, gpus: a.cfg.GPUs, job: job, decision: rn.d, tuning: tuning,
		masterAddr: a.masterAddr(ctx, rn.d), baseEnv: os.Environ(), telemetryURL: a.telemetryURL, telemetryToken: rn.token,
		numactl: a.numactl, numaNodes: numaNodeExists, user: user,
	})
	if err != nil {
		return nil, nil, nil, err
	}
	for _, w := range p.warnings {
		a.log.Warn(w, "job_id", rn.id)
	}
	if _, err := jobFileName(rn.id); err != nil {
		return nil, nil, nil, &launchError{field: "job_id", err: errors.New("too long to name the agent's files"), detail: err.Error()}
	}
	if len(p.files) > 0 {
		moved, err := writeTuningFiles(a.cfg.StateDir, rn.id, p.files)
		if err != nil {
			a.log.Warn("tuning files not written: the ranks start without them", "job_id", rn.id, "err", err)
		}
		p.relocate(moved)
	}
	dir, err := makeJobDir(a.cfg.StateDir, rn.id)
	if err != nil {
		return nil, nil, nil, agentErr("the agent could not make the job's directory", err)
	}
	st := &jobState{JobID: rn.id, TelemetryToken: rn.token}
	var procs []*rankProc
	var cmds []*exec.Cmd
	// The shims start their rank once the state is written: a byte each
	// on the gate. The agent's end closes it (the write end is not
	// inherited), so no rank runs that a next agent would not know of.
	var gate, gateOpen *os.File
	if len(a.cfg.Shim) > 0 {
		var err error
		if gateOpen, gate, err = os.Pipe(); err != nil {
			return nil, nil, nil, agentErr("the agent could not start the ranks", err)
		}
		defer func() { _ = gateOpen.Close() }() // the shims hold their own
		defer func() { _ = gate.Close() }()     // written, or the shims must end
	}
	fail := func(err error) ([]*rankProc, []func(<-chan struct{}), *jobState, error) {
		if gate != nil {
			_ = gate.Close() // the shims end without starting a rank
		}
		for _, c := range cmds {
			_ = signalGroup(c.Process.Pid, sigKill)
			_ = c.Wait()
		}
		if rerr := removeState(st); rerr != nil {
			a.log.Warn("state file not removed", "job_id", rn.id, "err", rerr)
		}
		return nil, nil, nil, err
	}
	for _, rs := range p.ranks {
		path := rankLogPath(dir, rs.rank.Rank)
		out, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
		if err != nil {
			return fail(agentErr(fmt.Sprintf("rank %d: the agent could not open its output file", rs.rank.Rank), err))
		}
		argv, exitFile := rs.argv, ""
		var extra []*os.File
		if len(a.cfg.Shim) > 0 {
			exitFile = rankExitPath(dir, rs.rank.Rank)
			_ = os.Remove(exitFile) // a previous run's
			sc := ShimConfig{ExitFile: exitFile, GateFD: 3, User: rs.user}
			if silence := a.cfg.Silence(); silence > 0 {
				sc.AliveFile, sc.Silence, sc.Grace = a.cfg.AliveFile(), silence, a.cfg.Grace
			}
			argv = append(slices.Clone(a.cfg.Shim), sc.Args(argv)...)
			extra = []*os.File{gateOpen} // fd 3
		}
		cmd := exec.Command(argv[0], argv[1:]...)
		cmd.Env, cmd.Dir, cmd.Stdout, cmd.Stderr, cmd.ExtraFiles = rs.env, rs.dir, out, out, extra
		detach(cmd)
		if len(a.cfg.Shim) == 0 && rs.user != nil {
			// No shim to switch for it (tests): the rank itself.
			err = asUser(cmd, rs.user)
		}
		if err == nil {
			err = cmd.Start()
		}
		_ = out.Close() // the rank holds its own descriptor
		switch {
		case err != nil && len(a.cfg.Shim) > 0:
			return fail(agentErr(fmt.Sprintf("rank %d: the agent could not start its shim", rs.rank.Rank), err))
		case err != nil:
			return fail(&launchError{field: "command", err: fmt.Errorf("rank %d could not be started: %s", rs.rank.Rank, pathErrText(err)), detail: err.Error()})
		}
		cmds = append(cmds, cmd)
		start, _ := procStart(cmd.Process.Pid)
		st.Ranks = append(st.Ranks, rankState{Rank: rs.rank.Rank, PID: cmd.Process.Pid, Start: start, Log: path, Exit: exitFile})
	}
	if err := writeState(a.cfg.StateDir, st); err != nil {
		return fail(agentErr("the agent could not record the job's state", err))
	}
	if gate != nil {
		if _, err := gate.Write(make([]byte, len(cmds))); err != nil {
			return fail(agentErr("the agent could not start the ranks", err))
		}
	}
	var tails []func(<-chan struct{})
	for i, cmd := range cmds {
		p := &rankProc{rank: st.Ranks[i].Rank, pid: cmd.Process.Pid, exited: make(chan struct{})}
		p.exit = events.RankExit{Rank: p.rank, Node: a.cfg.Node}
		exitFile := st.Ranks[i].Exit
		go func() {
			_ = cmd.Wait()
			p.exit.ExitCode, p.exit.Signal = exitOf(cmd.ProcessState)
			// The shim's word is the rank's; without it (no shim, or
			// the shim killed with the rank) the shim's status stands.
			if e, ok := readShimExit(exitFile); ok {
				p.exit.ExitCode, p.exit.Signal, p.agentSilent = e.ExitCode, e.Signal, e.AgentSilent
			}
			close(p.exited)
		}()
		procs = append(procs, p)
		tails = append(tails, a.tail(ctx, rn.id, st.Ranks[i], 0))
	}
	return procs, tails, st, nil
}

// adopt takes the ranks a previous run of the agent started that still
// run. They are not this process's children, so they cannot be waited
// for: the agent watches their shim's pid and reads the exit file it
// leaves (without a shim, how they ended is unknown).
func (a *Agent) adopt(ctx context.Context, rn *run, st *jobState) ([]*rankProc, []func(<-chan struct{})) {
	var procs []*rankProc
	var tails []func(<-chan struct{})
	if !slices.ContainsFunc(st.Ranks, func(r rankState) bool {
		_, exited := readShimExit(r.Exit)
		return exited || alive(r.PID, r.Start)
	}) {
		return nil, nil
	}
	for _, r := range st.Ranks {
		p := &rankProc{rank: r.Rank, pid: r.PID, exited: make(chan struct{}),
			exit: events.RankExit{Rank: r.Rank, Node: a.cfg.Node, ExitCode: -1}}
		procs = append(procs, p)
		ended := func() {
			if e, ok := readShimExit(r.Exit); ok {
				p.exit.ExitCode, p.exit.Signal, p.agentSilent = e.ExitCode, e.Signal, e.AgentSilent
			}
			close(p.exited)
		}
		if !alive(r.PID, r.Start) {
			ended()
			continue
		}
		go func() {
			tick := time.NewTicker(250 * time.Millisecond)
			defer tick.Stop()
			for alive(r.PID, r.Start) {
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
				}
			}
			ended()
		}()
		// What was written while no agent read it is in the file; the
		// stream goes on from where it stands now.
		var off int64
		if fi, err := os.Stat(r.Log); err == nil {
			off = fi.Size()
		}
		tails = append(tails, a.tail(ctx, rn.id, r, off))
	}
	return procs, tails
}

// watch waits for every rank to end. The first rank to fail, or a stop
// request (release, a peer's failure), stops the others: SIGTERM, then
// SIGKILL after the grace period.
func (a *Agent) watch(ctx context.Context, rn *run, procs []*rankProc) {
	var stopping bool
	var kill <-chan time.Time
	stop := rn.stop
	// One wake-up per rank that ends.
	ended := make(chan struct{}, len(procs))
	for _, p := range procs {
		go func() {
			<-p.exited
			ended <- struct{}{}
		}()
	}
	stopAll := func(reason string) {
		rn.requestStop(reason)
		if stopping {
			return
		}
		stopping = true
		for _, p := range procs {
			select {
			case <-p.exited:
			default:
				p.stopped = true
				_ = signalGroup(p.pid, sigTerm)
			}
		}
		kill = time.After(a.cfg.Grace)
	}
	for {
		pending := 0
		var failed bool
		for _, p := range procs {
			select {
			case <-p.exited:
				if !p.stopped && (p.exit.ExitCode != 0 || p.exit.Signal != "") {
					failed = true
				}
			default:
				pending++
			}
		}
		if pending == 0 {
			return
		}
		if failed && !stopping {
			stopAll(events.ReasonRankFailed)
			continue
		}
		select {
		case <-ctx.Done():
			return
		case <-stop:
			if !stopping {
				stopAll(rn.stopReason)
			}
			stop = nil // closed for good: wait on the ranks now
		case <-kill:
			for _, p := range procs {
				select {
				case <-p.exited:
				default:
					_ = signalGroup(p.pid, sigKill)
				}
			}
			kill = nil
		case <-ended:
		}
	}
}

// report publishes how the node's ranks ended, retrying until NATS takes
// it or the agent stops: the job's other agents and its lead wait on it.
// It reports whether NATS took it.
func (a *Agent) report(ctx context.Context, rn *run, rep *events.RanksExited) bool {
	rep.JobID, rep.Node = rn.id, a.cfg.Node
	if rep.Ranks == nil {
		rep.Ranks = []events.RankExit{}
	}
	for wait := 100 * time.Millisecond; ; wait = min(2*wait, 5*time.Second) {
		_, err := a.b.Publish(ctx, rep)
		if err == nil {
			a.log.Info("ranks exited", "job_id", rn.id, "status", rep.Status, "reason", rep.Reason, "message", rep.Message)
			return true
		}
		a.log.Warn("ranks_exited not sent", "job_id", rn.id, "err", err)
		select {
		case <-ctx.Done():
			return false
		case <-time.After(wait):
		}
	}
}

// tail makes the tailer of one rank's output.
func (a *Agent) tail(ctx context.Context, job string, r rankState, offset int64) func(<-chan struct{}) {
	t := &tailer{job: job, rank: r.Rank, node: a.cfg.Node, lineBytes: a.cfg.LogLineBytes, budget: a.cfg.LogBytesPerRank,
		publish: func(ctx context.Context, ev *events.RankLog) error {
			_, err := a.b.Publish(ctx, ev)
			return err
		}}
	return func(stop <-chan struct{}) { t.run(ctx, r.Log, offset, stop) }
}

// waitTuning waits up to TuningWait for the job's runtime.tuning.
func (a *Agent) waitTuning(ctx context.Context, id string) *events.RuntimeTuning {
	a.mu.Lock()
	if t, ok := a.tunings[id]; ok {
		a.mu.Unlock()
		return t
	}
	c, ok := a.tuned[id]
	if !ok {
		c = make(chan struct{})
		a.tuned[id] = c
	}
	a.mu.Unlock()
	select {
	case <-c:
	case <-time.After(a.cfg.TuningWait):
		a.log.Info("no runtime.tuning for the job: starting without it", "job_id", id, "waited", a.cfg.TuningWait)
	case <-ctx.Done():
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.tunings[id]
}

// masterAddr is the address of rank 0's node as its agent advertises it,
// waited for up to three heartbeats; else the node's name.
func (a *Agent) masterAddr(ctx context.Context, d *events.PlacementDecided) string {
	lead := leadNode(d)
	if lead == a.cfg.Node {
		return a.cfg.Address
	}
	deadline := time.Now().Add(3 * a.cfg.Heartbeat)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		a.mu.Lock()
		addr, ok := a.addrs[lead]
		a.mu.Unlock()
		if ok {
			return addr
		}
		if time.Now().After(deadline) {
			a.log.Warn("no heartbeat from rank 0's node: MASTER_ADDR is its name", "job_id", d.JobID, "node", lead)
			return lead
		}
		select {
		case <-ctx.Done():
			return lead
		case <-tick.C:
		}
	}
}

func unknownExits(rs []rankState, node string) []events.RankExit {
	out := make([]events.RankExit, len(rs))
	for i, r := range rs {
		out[i] = events.RankExit{Rank: r.Rank, Node: node, ExitCode: -1}
	}
	return out
}

// tuningDir holds, in the state directory, each job's tuning files.
const tuningDir = "tuning"

// writeTuningFiles writes a job's tuning files (NCCL_TOPO_FILE's XML) into
// a directory of the agent's own, StateDir/tuning/<job>/, not at the path
// the event names: an agent running as root that wrote where a published
// event said, following links, in a directory such as /tmp where anyone
// may have put a link, would write any file of the machine. The files are
// readable by the ranks, whoever they run as. It returns each file's new
// path by the path the event named; a file it could not write is left out.
func writeTuningFiles(stateDir, job string, files []events.TuningFile) (map[string]string, error) {
	name, err := jobFileName(job)
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(stateDir, tuningDir, name)
	if err := os.MkdirAll(filepath.Join(stateDir, tuningDir), 0o755); err != nil {
		return nil, err
	}
	// A previous run's files go: they may be another decision's.
	if err := os.RemoveAll(dir); err != nil {
		return nil, err
	}
	if err := os.Mkdir(dir, 0o755); err != nil {
		return nil, err
	}
	moved := map[string]string{}
	var errs []error
	for i, f := range files {
		base, err := jobFileName(filepath.Base(f.Path))
		if err != nil {
			base = "file"
		}
		p := filepath.Join(dir, fmt.Sprintf("%d-%s", i, base))
		// O_EXCL: a fresh file in a fresh directory, never through a link.
		out, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
		if err == nil {
			_, err = out.WriteString(f.Content)
			err = errors.Join(err, out.Close())
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", f.Path, err))
			continue
		}
		moved[f.Path] = p
	}
	return moved, errors.Join(errs...)
}

// removeTuningFiles removes a job's tuning files once its ranks are done.
func removeTuningFiles(stateDir, job string) error {
	name, err := jobFileName(job)
	if err != nil {
		return nil // none were written
	}
	return os.RemoveAll(filepath.Join(stateDir, tuningDir, name))
}

// numaNodeExists reports whether this machine has NUMA node n.
func numaNodeExists(n int) bool {
	_, err := os.Stat(fmt.Sprintf("/sys/devices/system/node/node%d", n))
	return err == nil
}
