package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/internal/client"
)

// slurmCallTimeout bounds one Slurm client call of the checks before the
// job starts (sinfo): slurmctld answers in milliseconds, or not at all.
const slurmCallTimeout = 30 * time.Second

// runSlurm submits the job to toposched without its command, waits for the
// decision, checks that Slurm knows every decided node and GPU, and runs
// the job through srun in the foreground on exactly those: srun prints the
// ranks' output and its exit status is the job's, which finishes the
// toposched job and frees its GPUs there. The submission carries no
// command so that no node agent starts it and the launch watchdog, which
// waits for an agent to take jobs with one, leaves it alone.
//
// While toposched has the job pending, a held placeholder stands for it in
// Slurm's queue (slurmPlaceholder): a scancel of it cancels the job. Once
// decided, the ranks get the decision's runtime.tuning, waited for up to
// tuningWait, as the node agents do.
func (g *globals) runSlurm(ctx context.Context, stdout, stderr io.Writer, job *events.JobSubmitted, tuningWait time.Duration) error {
	if tuningWait < 0 {
		return fmt.Errorf("--tuning-wait %s: must not be negative", tuningWait)
	}
	// Before anything is submitted: with slurmctld down, nothing starts.
	if _, err := slurmNodes(ctx); err != nil {
		return err
	}
	bctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	b, err := g.connect(bctx)
	if err != nil {
		stop()
		return err
	}
	defer func() {
		stop()
		closeBus(b)
	}()
	id := job.JobID
	switch h, err := client.History(bctx, b, id); {
	case errors.Is(err, client.ErrUnknownJob):
	case err != nil:
		return fmt.Errorf("job_id %s: %w", id, err)
	case h.State != client.StateRejected:
		return fmt.Errorf("job_id %s: already submitted (%s): give the job another id", id, h.State)
	}
	placed := *job
	placed.Command, placed.Args, placed.Env, placed.Workdir = "", nil, nil, ""

	outcomes := make(chan client.Outcome, 16)
	readies := []chan struct{}{make(chan struct{}), make(chan struct{})}
	errc := make(chan error, 2)
	go func() {
		errc <- client.Watch(bctx, b, client.FromNow, readies[0], func(o client.Outcome) error {
			if o.JobID() != id {
				return nil
			}
			select {
			case outcomes <- o:
				return nil
			case <-bctx.Done():
				return bctx.Err()
			}
		})
	}()
	// The tuning follows the decision on another stream: followed from
	// before the submission, so that it is never missed.
	tunings := newTuningFollower(id)
	go func() {
		err := b.Follow(bctx, events.DomainRuntime, []string{b.Subjects.Of(events.NameRuntimeTuning)}, readies[1], tunings.record(b))
		tunings.end(err)
		if err != nil {
			errc <- err
		}
	}()
	for _, r := range readies {
		select {
		case <-r:
		case err := <-errc:
			return fmt.Errorf("follow the job: %w", err)
		}
	}
	if _, err := client.Submit(bctx, b, &placed); err != nil {
		return fmt.Errorf("submit: %w", err)
	}
	finish := func(status events.JobStatus, reason, msg string) error {
		_, err := b.Publish(bctx, &events.JobFinished{JobID: id, Status: status, Reason: reason, Message: msg})
		if err != nil {
			return fmt.Errorf("finish %s: %w", id, err)
		}
		return nil
	}

	// The placeholder, once submitted, is removed however the wait ends.
	var hold *slurmPlaceholder
	var poll <-chan time.Time
	unhold := func() {
		if hold == nil {
			return
		}
		if err := hold.cancel(bctx); err != nil {
			_, _ = fmt.Fprintf(stderr, "%s: placeholder Slurm job %d not removed: %v\n", id, hold.id, err)
		}
		hold, poll = nil, nil
	}
	defer unhold()
	// held: a placeholder was asked for (once); pollFailed: the last
	// poll's squeue failed, said once.
	held, pollFailed := false, false

	var d *events.PlacementDecided
	for d == nil {
		select {
		case err := <-errc:
			return fmt.Errorf("follow the job: %w", err)
		case <-ctx.Done():
			_, _ = fmt.Fprintf(stderr, "%s: cancelled while waiting for its decision\n", id)
			unhold()
			if err := finish(events.StatusCancelled, events.ReasonCancelled, "cancelled by topoctl run --slurm"); err != nil {
				return err
			}
			return &exitError{code: exitCancelled}
		case <-poll:
			st, err := hold.state(bctx)
			switch {
			case err != nil:
				// slurmctld not answering: asked again at the next tick.
				if !pollFailed {
					pollFailed = true
					_, _ = fmt.Fprintf(stderr, "%s: cannot ask Slurm for placeholder job %d: %v\n", id, hold.id, err)
				}
			case st == "PENDING":
				pollFailed = false
			default:
				gone := "is " + st
				if st == "" {
					gone = "has left the queue"
				}
				msg := fmt.Sprintf("placeholder Slurm job %d %s in Slurm: the job is cancelled", hold.id, gone)
				hold, poll = nil, nil
				if err := finish(events.StatusCancelled, events.ReasonCancelled, msg); err != nil {
					return err
				}
				return runResult(stderr, &events.JobFinished{JobID: id, Status: events.StatusCancelled, Reason: events.ReasonCancelled, Message: msg}, true)
			}
		case o := <-outcomes:
			switch {
			case o.Decided != nil:
				d = o.Decided
				_ = client.WriteOutcome(stderr, o)
			case o.Pending != nil:
				_ = client.WriteOutcome(stderr, o)
				if !held {
					held = true
					h, err := submitPlaceholder(bctx, job)
					if err != nil {
						// Only the queue's view is missing: the job still
						// runs once decided.
						_, _ = fmt.Fprintf(stderr, "%s: no placeholder in Slurm's queue: %v\n", id, err)
						break
					}
					hold = h
					tick := time.NewTicker(placeholderPoll)
					defer tick.Stop()
					poll = tick.C
					_, _ = fmt.Fprintf(stderr, "%s: waits in Slurm's queue as held job %d (scancel %d cancels it)\n", id, hold.id, hold.id)
				}
			case o.Rejected != nil:
				_ = client.WriteOutcome(stderr, o)
				return &exitError{code: exitRejected}
			}
		}
	}
	// Out of the queue before the job's own Slurm job enters it.
	unhold()

	tuning, err := tunings.wait(ctx, d, tuningWait)
	if err != nil {
		_, _ = fmt.Fprintf(stderr, "%s: cancelled while waiting for its runtime.tuning\n", id)
		if err := finish(events.StatusCancelled, events.ReasonCancelled, "cancelled by topoctl run --slurm"); err != nil {
			return err
		}
		return &exitError{code: exitCancelled}
	}
	if tuning == nil {
		if _, _, _, ferr := tunings.find(d.DecidedAt); ferr != nil {
			_, _ = fmt.Fprintf(stderr, "%s: runtime.tuning not followed (%v): starting without it\n", id, ferr)
		} else {
			_, _ = fmt.Fprintf(stderr, "%s: no runtime.tuning for its decision within %s: starting without it\n", id, tuningWait)
		}
	}
	argv, err := slurmPrepare(ctx, d, job, tuning)
	if err != nil {
		// Nothing reached Slurm: the GPUs go back to placement.
		if ferr := finish(events.StatusFailed, events.ReasonLaunchFailed, err.Error()); ferr != nil {
			return errors.Join(err, ferr)
		}
		return err
	}
	cmd := exec.Command("srun", argv...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = nil, stdout, stderr
	if err := cmd.Start(); err != nil {
		err = fmt.Errorf("srun: %w", err)
		if ferr := finish(events.StatusFailed, events.ReasonLaunchFailed, err.Error()); ferr != nil {
			return errors.Join(err, ferr)
		}
		return err
	}
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()
	cancelled := false
	var werr error
	for done := false; !done; {
		select {
		case <-ctx.Done():
			if !cancelled {
				// srun cancels the job on SIGTERM (SIGINT only asks for its
				// status).
				cancelled = true
				_, _ = fmt.Fprintf(stderr, "%s: cancelling: srun stops the Slurm job\n", id)
				_ = cmd.Process.Signal(syscall.SIGTERM)
			}
			ctx = context.Background()
		case werr = <-waited:
			done = true
		}
	}
	f := &events.JobFinished{JobID: id, Status: events.StatusSucceeded, Reason: events.ReasonRanksExited}
	var exit *exec.ExitError
	switch {
	case cancelled:
		f.Status, f.Reason, f.Message = events.StatusCancelled, events.ReasonCancelled, "cancelled by topoctl run --slurm"
	case errors.As(werr, &exit):
		f.Status, f.Reason, f.Message = events.StatusFailed, events.ReasonRankFailed, "srun: "+exit.String()
	case werr != nil:
		f.Status, f.Reason, f.Message = events.StatusFailed, events.ReasonRankFailed, "srun: "+werr.Error()
	}
	if _, err := b.Publish(bctx, f); err != nil {
		return fmt.Errorf("finish %s: %w", id, err)
	}
	return runResult(stderr, f, cancelled)
}

// slurmPrepare checks the decision against what Slurm knows of its nodes
// and renders srun's arguments.
func slurmPrepare(ctx context.Context, d *events.PlacementDecided, job *events.JobSubmitted, tuning *events.RuntimeTuning) ([]string, error) {
	comps, err := slurmComponents(d, job, tuning)
	if err != nil {
		return nil, err
	}
	nodes, err := slurmNodes(ctx)
	if err != nil {
		return nil, err
	}
	for _, np := range d.Nodes {
		gres, ok := nodes[np.Node]
		if !ok {
			return nil, fmt.Errorf("node %s: Slurm does not know it (sinfo lists %s)", np.Node, strings.Join(slices.Sorted(maps.Keys(nodes)), ", "))
		}
		for _, g := range np.GPUs {
			if !slices.Contains(gres, "g"+strconv.Itoa(g)) {
				return nil, fmt.Errorf("node %s: GPU %d: Slurm has no GRES gpu:g%d there (its GPU types: %s; gres.conf from toposched slurm-conf --index-types gives one per index)",
					np.Node, g, g, strings.Join(gres, ","))
			}
		}
	}
	return srunArgv(comps), nil
}

// gresType finds the types of a node's GPU GRES in sinfo's %G:
// gpu:g0:1(S:0),gpu:g1:1(S:0) or gpu:h100:4(S:0-1).
var gresType = regexp.MustCompile(`(?:^|,)gpu:([^:,()]+):[0-9]+`)

// slurmNodes asks slurmctld (sinfo) for its nodes and the types of each
// one's GPUs.
func slurmNodes(ctx context.Context) (map[string][]string, error) {
	ctx, cancel := context.WithTimeout(ctx, slurmCallTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "sinfo", "--noheader", "--Node", "--format=%N|%G")
	var errb strings.Builder
	cmd.Stderr = &errb
	out, err := cmd.Output()
	if err != nil {
		msg := strings.TrimSpace(errb.String())
		if errors.Is(err, exec.ErrNotFound) {
			msg = "Slurm's clients are not on PATH"
		}
		return nil, fmt.Errorf("slurmctld: not answering (sinfo: %w): %s", err, msg)
	}
	nodes := parseSinfoGres(string(out))
	if len(nodes) == 0 {
		return nil, fmt.Errorf("slurmctld: sinfo lists no node (SLURM_CONF=%s)", os.Getenv("SLURM_CONF"))
	}
	return nodes, nil
}

// parseSinfoGres reads sinfo --Node --format=%N|%G: node → the types of
// its GPU GRES, in sinfo's order. Lines without a node are skipped.
func parseSinfoGres(out string) map[string][]string {
	nodes := map[string][]string{}
	for line := range strings.SplitSeq(strings.TrimSpace(out), "\n") {
		name, gres, ok := strings.Cut(strings.TrimSpace(line), "|")
		if !ok || name == "" {
			continue
		}
		types := nodes[name]
		for _, m := range gresType.FindAllStringSubmatch(gres, -1) {
			if !slices.Contains(types, m[1]) {
				types = append(types, m[1])
			}
		}
		nodes[name] = types
	}
	return nodes
}
