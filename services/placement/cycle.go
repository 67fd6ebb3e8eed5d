package placement

// Decision cycles. Jobs are decided in batches, as Kueue and Volcano
// schedule: the jobs.analyzed handlers (many at once, analyzedConcurrency)
// each put their job in the intake and take the service's lock; whichever
// gets it first decides every job the intake holds then, in priority and
// arrival order, against one view of the store that includes the cycle's
// earlier decisions, in one store transaction. Outcomes are published
// asynchronously as they are decided, and their acknowledgements awaited
// once, when the cycle ends (and before a pending is sent for a job that
// waits for GPUs the cycle's decisions took); only then are the handlers
// answered, so a message is acked only once its outcome is stored. A
// cycle takes new jobs for cycleBudget. Retries of the queue (after a
// finish, a node report, a policy change) are cycles too.
//
// Nothing is lost or decided twice by a crash mid-cycle: a job whose
// outcome is not stored is not acked and comes back to the next leader,
// which rebuilt its store from the placement stream (the outcomes that
// were stored) and sees the job as new; one whose outcome was stored is a
// duplicate there. Each outcome's message id derives from the message that
// caused it (bus.Envelope), so an outcome sent again is stored once
// (confirm, doubt). An outcome the stream refuses is rolled back in the
// store, and its message is nacked for another try.

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/events/bus"
	"github.com/toposched/toposched/internal/placer"
	"github.com/toposched/toposched/internal/placer/launch"
	"github.com/toposched/toposched/internal/placer/outcome"
	"github.com/toposched/toposched/internal/store"
)

// analyzedConcurrency is how many jobs.analyzed messages are handled at
// once: the most a cycle can decide. Half of them can arrive while a cycle
// of the other half runs, so the next cycle starts full. A cycle ends with
// a wait for its outcomes' PubAcks, with the lock held, so the more jobs
// share a cycle the less of that wait each carries: with 128 handlers a
// burst of one-GPU jobs costs some 10% less CPU a decision than with 64
// (BENCHMARKS.md, "analysis in step"). All of them wait for their decision
// within the handler's time (30 s), which 128 decisions of 4,096-GPU jobs
// on 100k GPUs leave room for (p99 some 100-150 ms each, BENCHMARKS.md;
// and a cycle takes new jobs for cycleBudget only).
const analyzedConcurrency = 128

// cycleBudget is how long a cycle takes new jobs: those left go back to
// the intake, first, for the next cycle, so that a cycle of large
// decisions does not keep its first outcomes' acknowledgements (and their
// messages' acks) waiting.
const cycleBudget = time.Second

// ended is the error of a decision the term's end cut short: its node
// policies and topology catch-up fail once the term's life ends, so
// what it decided is not sent; the message is left, fenced, for the
// current term. Nil while the term lasts.
func (s *Service) ended(job string) error {
	if s.life.Err() == nil {
		return nil
	}
	return fmt.Errorf("job %s: the placement term ended mid-decision (%w): %w", job, context.Cause(s.life), bus.ErrFenced)
}

// decisionTimeout bounds one decision's policy evaluations (decision):
// past it a policy that runs away fails closed, as policies do.
const decisionTimeout = 10 * time.Second

// decision is the context a job is decided under: ctx's values (its
// cause, its logs' correlation) without its deadline, the term's life,
// and decisionTimeout. A handler's deadline is not the decision's: a job
// that waited in the intake behind a long cycle would have its node
// policies cut off mid-walk, each failing closed, and could be told to
// wait, or refused, for a timeout of its handler's.
func (s *Service) decision(ctx context.Context) (context.Context, context.CancelFunc) {
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), decisionTimeout)
	stop := context.AfterFunc(s.life, cancel)
	return dctx, func() {
		stop()
		cancel()
	}
}

// defaultAckWait bounds the wait for one outcome's acknowledgement, and
// confirm's sending again (Service.ackWait): its own, not the handler's,
// whose time may be nearly spent by the time the cycle ends.
const defaultAckWait = 10 * time.Second

// request is a jobs.analyzed waiting for the cycle that decides it.
type request struct {
	ctx  context.Context
	env  events.Envelope
	job  *events.JobAnalyzed
	seq  uint64 // the stream's: arrival order
	done chan error
}

// intake holds the requests that arrived since the last cycle began. It
// has its own lock so that a handler can queue while a cycle holds the
// service's.
type intake struct {
	mu   sync.Mutex
	reqs []*request
	// queued, if set, is told of each request added (tests).
	queued chan<- struct{}
}

func (in *intake) add(r *request) {
	in.mu.Lock()
	in.reqs = append(in.reqs, r)
	in.mu.Unlock()
	if in.queued != nil {
		select {
		case in.queued <- struct{}{}:
		default:
		}
	}
}

// putBack returns requests a cycle did not reach to the front, in order.
func (in *intake) putBack(rs []*request) {
	in.mu.Lock()
	in.reqs = append(slices.Clone(rs), in.reqs...)
	in.mu.Unlock()
}

func (in *intake) take() []*request {
	in.mu.Lock()
	defer in.mu.Unlock()
	out := in.reqs
	in.reqs = nil
	return out
}

// OnAnalyzed places a new job. A job id already known has no second effect,
// unless the job was rejected: a corrected job may be submitted again.
func (s *Service) OnAnalyzed(ctx context.Context, env events.Envelope, job *events.JobAnalyzed) error {
	r := &request{ctx: ctx, env: env, job: job, seq: bus.StreamSeq(ctx), done: make(chan error, 1)}
	s.intake.add(r)
	s.mu.Lock()
	// Every lock holder runs cycles until its own request is answered, so
	// a request in the intake is always one whose goroutine has not taken
	// the lock yet (or the holder's): either a cycle took r and answered
	// it, or r is still in the intake (a cycle may put it back, see
	// cycleBudget) and this one takes it.
	for len(r.done) == 0 {
		batch := s.intake.take()
		if len(batch) == 0 {
			break
		}
		s.decideBatch(batch)
	}
	s.mu.Unlock()
	return <-r.done
}

// decideBatch decides the batch in one cycle and answers every request.
func (s *Service) decideBatch(batch []*request) {
	slices.SortStableFunc(batch, func(a, b *request) int {
		return cmp.Or(cmp.Compare(b.job.Job.Priority, a.job.Job.Priority), cmp.Compare(a.seq, b.seq))
	})
	s.maybeReserve(batch[0].ctx)
	c := s.newCycle()
	start := s.now()
	for i, r := range batch {
		if i > 0 && s.now().Sub(start) > cycleBudget {
			// Their goroutines have not taken the lock yet, or one is
			// this cycle's, which runs another (see OnAnalyzed).
			s.intake.putBack(batch[i:])
			break
		}
		if err := r.ctx.Err(); err != nil {
			// Its handler's time ran out in the intake: the message
			// comes back.
			r.done <- bus.Transient(fmt.Errorf("job %s: not decided in its handler's time (%w): %w", r.job.Job.JobID, err, bus.ErrLater))
			continue
		}
		id := r.job.Job.JobID
		if j, ok := c.view().Job(id); ok && j.State != store.JobRejected && !withdrawnForAnother(j, r.job.Job.Tenant) {
			if o := s.doubted(id); o != nil {
				// Acked now, the job would be lost if its outcome was
				// not stored and this replica stopped: it is answered
				// with the outcome sent again in this cycle, or, when
				// this cycle has already waited for that, at once, for
				// another try (no later cycle may come to answer it).
				if slices.Contains(c.sent[c.settled:], o) {
					o.dups = append(o.dups, r.done)
				} else {
					r.done <- bus.Transient(fmt.Errorf("job %s: its outcome is %w yet", id, bus.ErrUnconfirmed))
				}
				continue
			}
			s.log.Info("duplicate submission ignored", "job_id", id, "state", j.State, "correlation_id", r.env.CorrelationID)
			r.done <- nil
			continue
		}
		if _, err := c.place(r.ctx, store.Job{ID: id, Priority: r.job.Job.Priority, Spec: *r.job}, true, r.done); err != nil {
			r.done <- err
		}
	}
	// The requests' answers are their outcomes'; the cycle's error is
	// theirs too.
	_ = c.finish()
}

// withdrawnForAnother reports whether j is a withdrawal by another tenant
// than the job's: a tenant's finish of a job placement had not seen holds
// for that tenant's job alone.
func withdrawnForAnother(j store.Job, tenant string) bool {
	return j.State == store.JobFinished && j.Spec.Job.JobID == "" && j.WithdrawnBy != "" && j.WithdrawnBy != tenant
}

// cycle is one pass of decisions: the store transaction they share and
// the outcomes sent whose acknowledgements are still to be awaited.
type cycle struct {
	s    *Service
	tx   *store.Txn
	sent []*sent
	// settled counts the outcomes of sent settled, decided the decisions
	// sent since; errs are the errors of those without a request to
	// answer.
	settled, decided int
	errs             []error
	// running is the running jobs the waiting jobs' counterfactuals
	// weigh, kept while no placed job changes (placer.Running).
	running placer.Running
	// catchUps counts the decisions that caught up with the topology
	// stream (decide): the view may have changed under them.
	catchUps int
}

// sent is an outcome published in the cycle, with what undoes it in the
// store should the stream refuse it.
type sent struct {
	ctx  context.Context
	ev   any
	wait *bus.Pending
	err  error // PublishAsync's own
	// job is the row the cycle recorded, prev the one before (nil: none);
	// since is the job's pendingSince before (zero: none).
	job   store.Job
	prev  *store.Job
	since time.Time
	// done answers the request (nil for a retry, whose cycle's caller
	// gets the error, and for an outcome sent again: see doubt); dups
	// answer the deliveries of its job that came while it was in doubt.
	done chan<- error
	dups []chan<- error
	// resent: sent again from doubt, where it stays while unconfirmed.
	resent bool
	log    *slog.Logger
	msg    string
	args   []any
}

// newCycle begins a cycle by sending again the outcomes still in doubt
// (see doubt).
func (s *Service) newCycle() *cycle {
	c := &cycle{s: s}
	for _, o := range s.inDoubt {
		o.resent = true
		_, o.wait, o.err = s.pub.PublishAsync(bus.WithFence(o.ctx, s.fence), o.ev)
		if o.err != nil {
			// Not sent again (the connection down): the first may
			// still have been stored.
			o.err = fmt.Errorf("%w: %w", bus.ErrUnconfirmed, o.err)
		}
		c.sent = append(c.sent, o)
		if o.job.State == store.JobPlaced {
			c.decided++
		}
	}
	return c
}

// doubtsDecision reports whether a decision is in doubt: its GPUs are
// held though the stream may not have it.
func (s *Service) doubtsDecision() bool {
	return slices.ContainsFunc(s.inDoubt, func(o *sent) bool { return o.job.State == store.JobPlaced })
}

// confirm sends o again, under the same cause and so the same message id
// (stored once), until the stream answers or ctx ends: pending
// acknowledgements are failed when the connection moves to another
// server, and the answer to the same message comes at once from there.
func (s *Service) confirm(ctx context.Context, o *sent) error {
	// o's context carries its cause, whose id the message's derives from.
	send := bus.WithFence(context.WithoutCancel(o.ctx), s.fence)
	backoff := 20 * time.Millisecond
	for {
		_, p, err := s.pub.PublishAsync(send, o.ev)
		if err == nil {
			_, err = p.Wait(ctx)
		} else {
			err = fmt.Errorf("%w: %w", bus.ErrUnconfirmed, err)
		}
		if !errors.Is(err, bus.ErrUnconfirmed) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, time.Second)
	}
}

// doubt keeps an outcome whose storing the stream did not confirm within
// s.ackWait (confirm: a broker outage). The store keeps it as if stored
// (its GPUs held: given to another job, they could be booked twice if it
// was stored), its message is nacked, and every later cycle sends it
// again, under the same cause and so the same message id, until the
// stream answers: stored once either way. A release of the job ends the
// doubt (forget): it comes after the outcome in the stream whichever way
// the doubt would have gone.
func (s *Service) doubt(o *sent) {
	if slices.Contains(s.inDoubt, o) {
		return
	}
	o.ctx, o.done = context.WithoutCancel(o.ctx), nil
	s.inDoubt = append(s.inDoubt, o)
	o.log.Warn("outcome not confirmed by the stream: it is sent again with the next cycle", "outcome", o.msg)
}

// doubted is the outcome in doubt of a job, nil when none.
func (s *Service) doubted(jobID string) *sent {
	for _, o := range s.inDoubt {
		if o.job.ID == jobID {
			return o
		}
	}
	return nil
}

// settled ends the doubt of o, if it was in doubt.
func (s *Service) settled(o *sent) {
	s.inDoubt = slices.DeleteFunc(s.inDoubt, func(d *sent) bool { return d == o })
}

func (s *Service) forget(jobID string) {
	s.inDoubt = slices.DeleteFunc(s.inDoubt, func(o *sent) bool { return o.job.ID == jobID })
}

// view is the store as the cycle has changed it so far.
func (c *cycle) view() *store.Snapshot {
	if c.tx == nil {
		c.tx = c.s.store.Begin()
	}
	return c.tx.Snapshot()
}

// commit ends the cycle's transaction; the next view opens another. The
// transaction holds the store's only writer, so it ends before anything
// else writes (a catch-up with the topology stream) and before the cycle
// waits on the stream.
func (c *cycle) commit() error {
	if c.tx == nil {
		return nil
	}
	err := c.tx.Commit()
	c.tx = nil
	return err
}

// place decides for one job and sends the outcome. fresh is false for a
// retry from the queue, which sends nothing while the job still waits.
// It reports whether the job leaves the queue (if its outcome is stored).
// An error means nothing was sent or recorded for the job.
func (c *cycle) place(ctx context.Context, job store.Job, fresh bool, done chan<- error) (bool, error) {
	s := c.s
	dctx, cancel := s.decision(ctx)
	defer cancel()
	plan, err := s.decide(dctx, c, job.Spec, fresh)
	if err := s.ended(job.ID); err != nil {
		return false, err
	}
	if err != nil {
		return false, err
	}
	if plan.Verdict == outcome.Wait && !fresh {
		return false, nil
	}
	// A job waits for GPUs the cycle's earlier decisions took: those are
	// stored before its pending is sent, so the stream never says it
	// waits while the stream's own state has room for it. One that was
	// not stored after all is undone, and the job decided again.
	if plan.Verdict == outcome.Wait && c.decided > 0 && c.settle() {
		plan, err = s.decide(dctx, c, job.Spec, fresh)
		if err := s.ended(job.ID); err != nil {
			return false, err
		}
		if err != nil {
			return false, err
		}
	}
	if plan.Verdict == outcome.Wait && s.doubtsDecision() {
		// Nor while a decision is in doubt: the job comes back once the
		// stream has said.
		return false, bus.Transient(fmt.Errorf("job %s would wait while a decision is not confirmed by the stream: %w", job.ID, bus.ErrLater))
	}
	log := s.log.With("job_id", job.ID)
	if cause, ok := bus.CauseFrom(ctx); ok {
		log = log.With("correlation_id", cause.CorrelationID)
	}
	before := c.view()
	out := &sent{ctx: ctx, done: done, log: log, since: s.pendingSince[job.ID]}
	if prev, ok := before.Job(job.ID); ok {
		out.prev = &prev
	}
	switch plan.Verdict {
	case outcome.Placed:
		// before is the cycle's transaction itself (Txn.Snapshot): what
		// reads the state before the allocation reads it first.
		d := outcome.Decide(job.ID, plan.GPUs, s.strategy)
		d.DecidedAt = s.now().UTC()
		launch.Fill(&d, before)
		d.Prediction, d.Baseline = s.predict(dctx, before, job.Spec, plan.GPUs, plan.Baseline)
		d.Warnings, d.Explanation = plan.Warnings, plan.Explanation
		// Allocate re-checks, in the cycle's transaction, that every GPU
		// is still free and healthy.
		if err := c.tx.Allocate(job.ID, plan.GPUs); err != nil {
			return false, fmt.Errorf("reserve GPUs for %s: %w", job.ID, err)
		}
		job.State, job.Decision, job.Reasons = store.JobPlaced, &d, nil
		out.ev, out.msg = &d, "job placed"
		out.args = []any{"strategy", d.Strategy, "gpus", len(d.Ranks), "nodes", len(d.Nodes), "warnings", len(d.Warnings)}
	case outcome.Wait:
		p := &events.PlacementPending{JobID: job.ID, Reasons: plan.Reasons, Counterfactuals: plan.Counterfactuals, Explanation: plan.Explanation}
		job.State, job.Reasons = store.JobPending, plan.Reasons
		job.Turn, p.Turn = s.turn(before, out.prev, job.Spec)
		out.ev = p
		out.msg, out.args = "job pending", []any{"reason", plan.Reasons[0].Message}
	case outcome.Never:
		out.ev = &events.PlacementRejected{JobID: job.ID, Reasons: plan.Reasons, Counterfactuals: plan.Counterfactuals, Explanation: plan.Explanation}
		job.State, job.Reasons = store.JobRejected, plan.Reasons
		out.msg, out.args = "job rejected", []any{"reason", plan.Reasons[0].Message}
	}
	if err := c.tx.UpsertJob(job); err != nil {
		// The transaction is spoiled (the allocation with it): the
		// cycle's outcomes fail at finish.
		return false, fmt.Errorf("record job %s: %w", job.ID, err)
	}
	out.job = job
	s.noteDecision(before, job, plan, fresh)
	if plan.Verdict == outcome.Wait {
		if out.since.IsZero() {
			s.pendingSince[job.ID] = s.now()
		}
	} else {
		delete(s.pendingSince, job.ID)
	}
	_, out.wait, out.err = s.pub.PublishAsync(bus.WithFence(ctx, s.fence), out.ev)
	c.sent = append(c.sent, out)
	if plan.Verdict == outcome.Placed {
		c.decided++
	}
	return plan.Verdict != outcome.Wait, nil
}

// finish settles the cycle's outcomes and returns the errors of those
// without a request to answer (a retry's).
func (c *cycle) finish() error {
	c.settle()
	errs := c.errs
	c.errs = nil
	return errors.Join(errs...)
}

// settle commits the cycle's transaction (the next view opens another)
// and waits, in the order they were sent, for the outcomes not yet
// settled: an answered one is logged, one whose answer never came is sent
// again until it comes (confirm) or kept in doubt, one the stream refused
// is undone in the store; then their requests are answered. It reports
// whether an outcome was undone: what was decided after it in the cycle
// assumed it.
func (c *cycle) settle() (undone bool) {
	s := c.s
	cerr := c.commit()
	if cerr != nil {
		// A store bug: the outcomes may be stored while the store holds
		// none of them. Every request fails; the service's restart
		// rebuilds from the streams.
		s.log.Error("placement cycle's store transaction failed", "err", cerr)
	}
	// One deadline for the whole settle, and the term's life rather than
	// the handlers': the lock is held meanwhile, and a term that ends (its
	// lease lost) must stop at once, not after each outcome's wait.
	wctx, cancel := context.WithTimeout(s.life, s.ackWait)
	defer cancel()
	for _, o := range c.sent[c.settled:] {
		err, done := o.err, o.done
		if err == nil {
			_, err = o.wait.Wait(wctx)
		}
		if errors.Is(err, bus.ErrUnconfirmed) && !o.resent && cerr == nil {
			err = s.confirm(wctx, o)
		}
		switch {
		case cerr != nil:
			err = cerr
		case err == nil:
			s.settled(o)
			o.log.Info(o.msg, o.args...)
		case errors.Is(err, bus.ErrUnconfirmed):
			s.doubt(o)
		default:
			s.settled(o)
			err = s.refused(o, err)
			undone = true
		}
		for _, d := range o.dups {
			d <- err
		}
		o.dups = nil
		if done != nil {
			done <- err
		} else if err != nil {
			c.errs = append(c.errs, err)
		}
	}
	c.settled, c.decided = len(c.sent), 0
	return undone
}

// refused handles an outcome the stream did not store: a decision over
// one message's size is sent again without what a launcher can do
// without, or its job rejected (asking again cannot help); anything else
// is undone in the store and returned, for the message to come back.
func (s *Service) refused(o *sent, err error) error {
	if errors.Is(err, bus.ErrFenced) && s.fenced != nil {
		s.log.WarnContext(o.ctx, "a newer placement term has started: this one stops", "holder", s.holder, "lease_revision", s.leaseRevision)
		s.fenced(err)
	}
	d, isDecision := o.ev.(*events.PlacementDecided)
	var tl *bus.TooLargeError
	if !isDecision || !errors.As(err, &tl) {
		return errors.Join(err, s.undo(o))
	}
	slim := *d
	slim.Explanation = nil
	slim.Nodes = slices.Clone(d.Nodes)
	for i := range slim.Nodes {
		slim.Nodes[i].NCCLTopoXML = ""
	}
	if _, err = s.publish(o.ctx, &slim); err == nil {
		o.log.Warn("decision over one message: published without its explanation and NCCL topology files", "size", tl.Size, "limit", tl.Limit)
		j := o.job
		j.Decision = &slim
		return s.store.UpsertJob(j)
	}
	if !errors.As(err, &tl) {
		return errors.Join(err, s.undo(o))
	}
	if err := s.undo(o); err != nil {
		return err
	}
	reasons := []events.Reason{decisionTooLarge(len(d.Ranks), len(d.Nodes), tl)}
	rej := &events.PlacementRejected{JobID: d.JobID, Reasons: reasons}
	if _, err := s.publish(o.ctx, rej); err != nil {
		return err
	}
	o.log.Info("job rejected", "reason", reasons[0].Message)
	j := o.job
	j.State, j.Decision, j.Reasons = store.JobRejected, nil, reasons
	delete(s.pendingSince, j.ID)
	return s.store.UpsertJob(j)
}

// undo takes an outcome the stream refused out of the store: its GPUs
// freed, its job as it was before.
func (s *Service) undo(o *sent) error {
	if o.job.State == store.JobPlaced {
		if _, err := s.store.Release(o.job.ID); err != nil {
			return fmt.Errorf("roll back reservation of %s: %w", o.job.ID, err)
		}
	}
	if o.since.IsZero() {
		delete(s.pendingSince, o.job.ID)
	} else {
		s.pendingSince[o.job.ID] = o.since
	}
	if o.prev == nil {
		return s.store.DeleteJob(o.job.ID)
	}
	return s.store.UpsertJob(*o.prev)
}
