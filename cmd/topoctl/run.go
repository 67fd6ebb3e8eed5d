package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/events/bus"
	"github.com/toposched/toposched/internal/client"
	"github.com/toposched/toposched/schemas"
)

// Exit codes of topoctl run beyond 0 (succeeded) and 1 (failed, or an
// error of topoctl's own).
const (
	exitRejected  = 2
	exitLost      = 3
	exitCancelled = 130
)

// exitError ends topoctl with a code of its own; its message, if any, is
// printed first.
type exitError struct {
	code int
	msg  string
}

func (e *exitError) Error() string { return e.msg }

func newRun(g *globals) *cobra.Command {
	var (
		drain      time.Duration
		slurm      bool
		tuningWait time.Duration
	)
	cmd := &cobra.Command{
		Use:   "run JOBFILE [-- COMMAND ARGS...]",
		Short: "Submit a job with a command, stream its ranks' output, and exit with its status",
		Long: `run submits a job whose ranks the node agents (toposched agent --exec) start,
waits for its decision, prints every rank's output prefixed with its rank, and
exits with the job's status: 0 succeeded, 1 failed, 2 rejected, 3 lost (its
agent fell silent, or none took it), 130 cancelled.

The command, its args, env (NAME=value entries) and workdir come from the job
file; a command after -- replaces the file's command and args. Ctrl-C cancels
the job: its ranks are stopped and its GPUs freed.

With --slurm the ranks run through Slurm instead of the agents: once decided,
the job runs as srun in the foreground (as topoctl slurm-args prints it: one
heterogeneous component per node, exactly the decided GPUs by their per-index
GRES types), srun's output is printed as it comes, and its exit status
finishes the job. The ranks get the decision's runtime.tuning as with the
agents (waited for up to --tuning-wait; see topoctl slurm-args). While
toposched has the job pending, a held placeholder Slurm job of the same name
(comment "toposched-job=JOB (placeholder)") stands for it in squeue; a
scancel of it cancels the job, and it is removed once the job is decided or
cancelled. A decided node or GPU Slurm does not have, or slurmctld not
answering, is an error before anything starts in Slurm, and the job is
finished as failed. SLURM_CONF and PATH are Slurm's clients' own.`,
		Example: `  topoctl run job.yaml
  topoctl run job.yaml -- python3 train.py --steps 100
  topoctl run --slurm job.yaml`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			dash := cmd.ArgsLenAtDash()
			if (dash < 0 && len(args) != 1) || dash > 1 {
				return errors.New("expected one job file, then optionally -- COMMAND ARGS")
			}
			job, err := g.loadJob(args[0])
			if err != nil {
				return err
			}
			if dash == 1 {
				if len(args) < 2 {
					return errors.New("nothing after --: expected COMMAND ARGS")
				}
				job.Command, job.Args = args[1], args[2:]
			}
			if job.Command == "" {
				return fmt.Errorf("%s: command: the job names none; give one in the file or after --", args[0])
			}
			body, err := json.Marshal(job)
			if err != nil {
				return err
			}
			if err := schemas.Validate(string(events.NameJobSubmitted), body); err != nil {
				return fmt.Errorf("%s: %w", args[0], events.ExplainStructured(body, err))
			}
			if slurm {
				return g.runSlurm(cmd.Context(), cmd.OutOrStdout(), cmd.ErrOrStderr(), job, tuningWait)
			}
			return g.run(cmd.Context(), cmd.OutOrStdout(), cmd.ErrOrStderr(), job, drain)
		},
	}
	cmd.Flags().DurationVar(&drain, "drain", 15*time.Second,
		"after the job ends, how long to wait for the output of nodes that have not reported yet")
	cmd.Flags().BoolVar(&slurm, "slurm", false, "run the job's ranks through Slurm's srun where it is decided, not through the node agents")
	cmd.Flags().DurationVar(&tuningWait, "tuning-wait", defaultTuningWait,
		"with --slurm, how long to wait for the decision's runtime.tuning before starting without it (the agents wait as long)")
	return cmd
}

// runEvent is one event about the job, from whichever stream.
type runEvent struct {
	outcome  *client.Outcome
	log      *events.RankLog
	exited   *events.RanksExited
	finished *events.JobFinished
}

// run follows the job from submission to its end. ctx is the user's:
// its end (Ctrl-C) cancels the job, and the streams are followed on until
// the cancellation is through.
func (g *globals) run(ctx context.Context, stdout, stderr io.Writer, job *events.JobSubmitted, drain time.Duration) error {
	bctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	b, err := g.connect(bctx)
	if err != nil {
		stop()
		return err
	}
	defer func() {
		stop() // the followers first, then the connection they use
		closeBus(b)
	}()
	id := job.JobID
	// A job id is taken for good once placed (only a rejected job may be
	// sent again): a second run under it would wait on an old job.
	switch h, err := client.History(bctx, b, id); {
	case errors.Is(err, client.ErrUnknownJob):
	case err != nil:
		return fmt.Errorf("job_id %s: %w", id, err)
	case h.State != client.StateRejected:
		return fmt.Errorf("job_id %s: already submitted (%s): give the job another id", id, h.State)
	}
	evs := make(chan runEvent, 1024)
	errc := make(chan error, 3)
	send := func(e runEvent) error {
		select {
		case evs <- e:
			return nil
		case <-bctx.Done():
			return bus.ErrStop
		}
	}
	readies := []chan struct{}{make(chan struct{}), make(chan struct{}), make(chan struct{})}
	go func() {
		errc <- client.Watch(bctx, b, client.FromNow, readies[0], func(o client.Outcome) error {
			if o.JobID() != id {
				return nil
			}
			return send(runEvent{outcome: &o})
		})
	}()
	go func() {
		errc <- b.Follow(bctx, events.DomainRuntime, []string{b.Subjects.Of(events.NameRankLog), b.Subjects.Of(events.NameRanksExited)}, readies[1],
			func(r bus.Record) error {
				if r.Env.Subject != id {
					return nil
				}
				var e runEvent
				if r.Name == events.NameRankLog {
					e.log = new(events.RankLog)
					if b.Decode(r.Name, r.Body, e.log) != nil {
						return nil
					}
				} else {
					e.exited = new(events.RanksExited)
					if b.Decode(r.Name, r.Body, e.exited) != nil {
						return nil
					}
				}
				return send(e)
			})
	}()
	go func() {
		errc <- b.Follow(bctx, events.DomainJobs, []string{b.Subjects.Of(events.NameJobFinished)}, readies[2], func(r bus.Record) error {
			if r.Env.Subject != id {
				return nil
			}
			var f events.JobFinished
			if b.Decode(r.Name, r.Body, &f) != nil {
				return nil
			}
			return send(runEvent{finished: &f})
		})
	}()
	for _, r := range readies {
		select {
		case <-r:
		case err := <-errc:
			return fmt.Errorf("follow the job: %w", err)
		}
	}
	if _, err := client.Submit(bctx, b, job); err != nil {
		return fmt.Errorf("submit: %w", err)
	}

	var (
		decision *events.PlacementDecided
		reported = map[string]bool{}
		finished *events.JobFinished
		released bool
		// what the release said, should its finish not be seen
		releasedStatus events.JobStatus
		releasedReason string
		cancelled      bool
		deadline       <-chan time.Time
	)
	userDone := ctx.Done()
	allReported := func() bool {
		if decision == nil {
			return false
		}
		for _, n := range decision.Nodes {
			if !reported[n.Node] {
				return false
			}
		}
		return true
	}
	for {
		if released && finished == nil && deadline == nil {
			// The finish travels on another stream than the release.
			deadline = time.After(drain)
		}
		if finished != nil && released {
			// Lost ranks report nothing; others have sent all their
			// output before their report.
			if finished.Status == events.StatusLost || decision == nil || allReported() {
				break
			}
			if deadline == nil {
				deadline = time.After(drain)
			}
		}
		select {
		case err := <-errc:
			if err == nil {
				err = errors.New("stopped following")
			}
			return fmt.Errorf("follow the job: %w", err)
		case <-userDone:
			userDone = nil
			cancelled = true
			_, _ = fmt.Fprintf(stderr, "%s: cancelling: the ranks are stopped and the GPUs freed\n", id)
			if _, err := b.Publish(bctx, &events.JobFinished{JobID: id, Status: events.StatusCancelled, Reason: events.ReasonCancelled,
				Message: "cancelled by topoctl run"}); err != nil {
				return fmt.Errorf("cancel: %w", err)
			}
		case <-deadline:
			if finished == nil {
				finished = &events.JobFinished{JobID: id, Status: releasedStatus, Reason: releasedReason}
			} else {
				_, _ = fmt.Fprintf(stderr, "%s: no output report from some nodes after %s\n", id, drain)
				finished.Message += " (output of some nodes may be missing)"
			}
			return runResult(stderr, finished, cancelled)
		case e := <-evs:
			switch {
			case e.outcome != nil:
				o := e.outcome
				switch {
				case o.Decided != nil:
					decision = o.Decided
					_ = client.WriteOutcome(stderr, *o)
				case o.Pending != nil:
					_ = client.WriteOutcome(stderr, *o)
				case o.Rejected != nil:
					_ = client.WriteOutcome(stderr, *o)
					return &exitError{code: exitRejected}
				case o.Released != nil:
					released = true
					releasedStatus, releasedReason = o.Released.Status, o.Released.Reason
				}
			case e.log != nil:
				if err := writeRankLog(stdout, e.log); err != nil {
					return fmt.Errorf("output: %w", err)
				}
			case e.exited != nil:
				reported[e.exited.Node] = true
			case e.finished != nil:
				finished = e.finished
			}
		}
	}
	return runResult(stderr, finished, cancelled)
}

// writeRankLog prints a batch of a rank's output, each line prefixed with
// the rank.
func writeRankLog(w io.Writer, l *events.RankLog) error {
	var b strings.Builder
	if l.Dropped > 0 {
		fmt.Fprintf(&b, "[rank %d] ... %d lines dropped\n", l.Rank, l.Dropped)
	}
	for _, line := range l.Lines {
		fmt.Fprintf(&b, "[rank %d] %s\n", l.Rank, line)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// runResult prints how the job ended and turns it into the exit code.
func runResult(stderr io.Writer, f *events.JobFinished, cancelled bool) error {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %s", f.JobID, f.Status)
	if f.Reason != "" {
		fmt.Fprintf(&b, " (%s)", f.Reason)
	}
	if f.Message != "" {
		fmt.Fprintf(&b, ": %s", f.Message)
	}
	if len(f.Ranks) > 0 {
		codes := make([]string, len(f.Ranks))
		for i, r := range f.Ranks {
			codes[i] = fmt.Sprint(r.ExitCode)
			if r.Signal != "" {
				codes[i] = r.Signal
			}
		}
		fmt.Fprintf(&b, "\n  exit codes by rank: %s", strings.Join(codes, " "))
	}
	_, _ = fmt.Fprintln(stderr, b.String())
	switch {
	case cancelled || f.Status == events.StatusCancelled:
		return &exitError{code: exitCancelled}
	case f.Status == events.StatusSucceeded:
		return nil
	case f.Status == events.StatusLost:
		return &exitError{code: exitLost}
	}
	return &exitError{code: 1}
}
