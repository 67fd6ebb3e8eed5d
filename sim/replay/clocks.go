package replay

// The clocks a replay runs on (see the package doc): the virtual clock
// with its barrier, the paced wall clock, and burst; and how each outcome
// placement publishes is applied to the replay's view of the jobs.

import (
	"container/heap"
	"context"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/events/bus"
	"github.com/toposched/toposched/internal/client"
	"github.com/toposched/toposched/services/placement"
)

// virtual replays on the virtual clock: one event at a time, each
// followed by a barrier that waits for every outcome it causes.
func (r *runner) virtual(ctx context.Context) error {
	next := 0
	for next < len(r.jobs) || r.finishes.Len() > 0 {
		if r.finishDue(next) {
			if len(r.queue) == 0 && !oneAtATime {
				if err := r.finishRun(ctx, next); err != nil {
					return err
				}
				continue
			}
			f := heap.Pop(&r.finishes).(finish)
			r.sample(f.at)
			r.advance(f.at)
			if err := r.finish(ctx, f.job); err != nil {
				return err
			}
			id := r.jobs[f.job].job.ID
			if err := r.await(ctx, "release of "+id, func() bool { return r.jobs[f.job].released }); err != nil {
				return err
			}
			if r.queueMayMove() {
				if err := r.barrier(ctx); err != nil {
					return err
				}
			}
			continue
		}
		i := next
		next++
		r.sample(r.jobs[i].job.Arrival)
		r.advance(r.jobs[i].job.Arrival)
		if err := r.submit(ctx, i); err != nil {
			return err
		}
		if err := r.await(ctx, "outcome of "+r.jobs[i].job.ID, func() bool { return r.jobs[i].state != stNone }); err != nil {
			return err
		}
	}
	r.sample(r.now)
	r.timeline = append(r.timeline, r.point())
	return nil
}

// finishDue reports whether the next event is a planned finish rather
// than the arrival of job next: finishes at the same time as an arrival
// go first, so the GPUs are free when the job arrives.
func (r *runner) finishDue(next int) bool {
	return r.finishes.Len() > 0 && (next == len(r.jobs) || r.finishes[0].at <= r.jobs[next].job.Arrival)
}

// finishRun sends, while no job waits, every finish due before the next
// arrival (at most finishRunMax), each once the last one's release is
// seen, and sends no barrier: with nobody waiting a release decides
// nothing. Each release is still awaited before the clock moves on, since
// placement learns a job's run time from the clock when it handles the
// release (its forecast of demand, internal/demand): releases handled
// later, on a clock that had moved on, would teach it longer runs, by how
// much depending on the machine's speed. The replay's own view frees each
// job's GPUs as its finish is sent, so that the timeline sampled at the
// next finish is the one the one-at-a-time replay records.
func (r *runner) finishRun(ctx context.Context, next int) error {
	for n := 0; n < finishRunMax && r.finishDue(next); n++ {
		f := heap.Pop(&r.finishes).(finish)
		r.sample(f.at)
		r.advance(f.at)
		r.freeJob(&r.jobs[f.job])
		if err := r.finish(ctx, f.job); err != nil {
			return err
		}
		if err := r.await(ctx, "release of "+r.jobs[f.job].job.ID, func() bool { return r.jobs[f.job].released }); err != nil {
			return err
		}
	}
	return nil
}

// finishRunMax bounds the finishes of one finishRun.
const finishRunMax = 256

// oneAtATime turns off the virtual clock's two shortcuts, finish runs and
// barriers left out once the reservation is settled, for the tests that
// check they change nothing.
var oneAtATime bool

// queueMayMove reports whether a waiting job may fit in the GPUs free
// now. When none can, placement decides nothing on a release and the
// barrier is not needed: barriers cost placement a consumer each (see
// Run), and a busy replay would send one per finish. With the
// reservation on, placement's retry after a release also looks at the
// head's wait on the virtual clock, and must do so before the clock
// moves on: any waiting job then calls for the barrier.
func (r *runner) queueMayMove() bool {
	if r.cfg.ReserveAfter >= 0 && len(r.queue) > 0 && !r.reservationSettled() {
		return true
	}
	for i := range r.queue {
		if j := r.jobs[i].job; r.occ.mayFit(j.GPUs, j.GPUsPerNode) {
			return true
		}
	}
	return false
}

// reservationSettled reports whether the head of placement's queue has
// waited longer than ReserveAfter by now. Placement's look at the queue
// after a release (services/placement, reserve) reads only the head's
// wait: once it is past ReserveAfter the answer is "hold nodes for it"
// now and at any later time, and which nodes are held depends on the
// GPUs free, not on the clock. So the retry's reservation is the same
// whether or not the clock has moved on when placement makes it, and only
// a job that may fit calls for the barrier, as without the reservation;
// a job that fits would change the head. In arrival order the head is
// placement's: the highest priority, then the first to wait (the store's
// job sequence, which follows the replay's submissions, one at a time, in
// job order).
// A job waits from its arrival (placement's pending-since is the virtual
// time of its first outcome, which the replay awaits at its arrival); a
// millisecond's margin keeps float seconds and placement's durations
// from disagreeing at the boundary.
func (r *runner) reservationSettled() bool {
	if oneAtATime || len(r.queue) == 0 {
		return false
	}
	if r.cfg.QueueOrder != placement.QueueByArrival {
		// Ordered by expected ends, the head is the job whose turn
		// comes first, from run times placement learns: the replay
		// cannot name it, but once every waiting job has waited past
		// ReserveAfter, whichever it is has. A turn is fixed when the
		// job first waits, so the head changes only as jobs come and
		// go, each with its own barrier.
		for i := range r.queue {
			if r.now-r.jobs[i].job.Arrival <= r.cfg.ReserveAfter.Seconds()+1e-3 {
				return false
			}
		}
		return true
	}
	head := -1
	for i := range r.queue {
		if head < 0 || r.subs[i].Priority > r.subs[head].Priority || (r.subs[i].Priority == r.subs[head].Priority && i < head) {
			head = i
		}
	}
	return r.now-r.jobs[head].job.Arrival > r.cfg.ReserveAfter.Seconds()+1e-3
}

// paced replays on the wall clock, speed trace seconds per second.
func (r *runner) paced(ctx context.Context) error {
	next := 0
	timer := time.NewTimer(0)
	defer timer.Stop()
	tick := time.NewTicker(max(time.Duration(r.step/r.cfg.Speed*float64(time.Second)), 10*time.Millisecond))
	defer tick.Stop()
	for {
		r.now = time.Since(r.wall0).Seconds() * r.cfg.Speed
		r.sample(r.now)
		due := math.Inf(1)
		if next < len(r.jobs) {
			due = r.jobs[next].job.Arrival
		}
		if r.finishes.Len() > 0 {
			due = min(due, r.finishes[0].at)
		}
		if math.IsInf(due, 1) {
			// Nothing planned: wait for every outcome, then let the
			// queue settle; a decision may plan a new finish.
			if err := r.await(ctx, "outstanding outcomes", r.allDecided); err != nil {
				return err
			}
			if len(r.queue) > 0 {
				if err := r.barrier(ctx); err != nil {
					return err
				}
			}
			if r.finishes.Len() == 0 {
				r.timeline = append(r.timeline, r.point())
				return nil
			}
			continue
		}
		if due <= r.now {
			if r.finishes.Len() > 0 && r.finishes[0].at <= due {
				f := heap.Pop(&r.finishes).(finish)
				if err := r.finish(ctx, f.job); err != nil {
					return err
				}
			} else {
				if err := r.submit(ctx, next); err != nil {
					return err
				}
				next++
			}
			continue
		}
		timer.Reset(time.Duration((due - r.now) / r.cfg.Speed * float64(time.Second)))
		select {
		case o := <-r.outcomes:
			r.handle(o)
		case <-timer.C:
		case <-tick.C:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// burst submits every job as fast as JetStream acknowledges, then waits
// for every outcome.
func (r *runner) burst(ctx context.Context) error {
	errc := make(chan error, 1)
	var mu sync.Mutex
	go func() {
		for i := range r.jobs {
			mu.Lock()
			r.jobs[i].submitted = time.Now()
			mu.Unlock()
			if err := r.publish(ctx, "submit/"+r.jobs[i].job.ID, &r.subs[i]); err != nil {
				errc <- fmt.Errorf("submit %s: %w", r.jobs[i].job.ID, err)
				return
			}
		}
		errc <- nil
	}()
	stall := time.NewTimer(r.cfg.Stall)
	defer stall.Stop()
	published := false
	for !published || !r.allDecided() {
		select {
		case o := <-r.outcomes:
			mu.Lock()
			r.handle(o)
			mu.Unlock()
			stall.Reset(r.cfg.Stall)
		case err := <-errc:
			if err != nil {
				return err
			}
			published = true
		case <-stall.C:
			return fmt.Errorf("replay: no outcome for %s", r.cfg.Stall)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	r.timeline = append(r.timeline, r.point())
	return nil
}

func (r *runner) allDecided() bool {
	for i := range r.jobs {
		if r.jobs[i].state == stNone {
			return false
		}
	}
	return true
}

func (r *runner) submit(ctx context.Context, i int) error {
	r.jobs[i].submitted = time.Now()
	if err := r.publish(ctx, "submit/"+r.jobs[i].job.ID, &r.subs[i]); err != nil {
		return fmt.Errorf("replay: submit %s: %w", r.jobs[i].job.ID, err)
	}
	return nil
}

func (r *runner) finish(ctx context.Context, i int) error {
	r.jobs[i].finishSent = true
	id := r.jobs[i].job.ID
	if err := r.publish(ctx, "finish/"+id, &events.JobFinished{JobID: id, Status: events.StatusSucceeded}); err != nil {
		return fmt.Errorf("replay: finish %s: %w", r.jobs[i].job.ID, err)
	}
	if r.progress != nil {
		r.progress.Add(1)
	}
	return nil
}

// barrier submits the probe job and waits for its rejection. Placement
// handles one event at a time and publishes a release's follow-up
// decisions before it takes the next, so everything the last finish
// caused is seen before the probe's rejection.
func (r *runner) barrier(ctx context.Context) error {
	r.probes++
	want := r.probes
	probe := &events.JobSubmitted{JobID: probeID, GPUs: 1, GPUModel: probeModel, Labels: map[string]string{"replay.barrier": "true"}}
	if err := r.publish(ctx, fmt.Sprintf("barrier/%d", want), probe); err != nil {
		return fmt.Errorf("replay: barrier: %w", err)
	}
	return r.await(ctx, "barrier", func() bool { return r.probeOK >= want })
}

// publish sends one of the replay's events, named what (unique within
// the replay), and retries a failure that may pass (a PubAck that did not
// come in time on a loaded machine) under the same event id: JetStream
// stores it once, where a job, a finish or a barrier sent twice would be
// two, and a barrier's second rejection would let the next barrier
// through before its own outcomes.
func (r *runner) publish(ctx context.Context, what string, v any) error {
	pctx := bus.WithEventID(ctx, r.runID+"/"+what)
	wait := publishRetryInitial
	for attempt := 1; ; attempt++ {
		_, err := r.b.Publish(pctx, v)
		if err == nil || !bus.IsTransient(err) || attempt == publishAttempts {
			return err
		}
		r.log.Warn("replay: publish failed, sending it again", "event", what, "attempt", attempt, "err", err)
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return ctx.Err()
		}
		wait = min(2*wait, publishRetryMax)
	}
}

// How often, and after what pauses, publish tries one event.
const (
	publishAttempts     = 5
	publishRetryInitial = 100 * time.Millisecond
	publishRetryMax     = 2 * time.Second
)

// await handles outcomes until done holds.
func (r *runner) await(ctx context.Context, what string, done func() bool) error {
	stall := time.NewTimer(r.cfg.Stall)
	defer stall.Stop()
	for !done() {
		select {
		case o := <-r.outcomes:
			r.handle(o)
		case <-stall.C:
			return fmt.Errorf("replay: waited %s for the %s", r.cfg.Stall, what)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// handle applies one placement outcome to the replay's view.
func (r *runner) handle(o client.Outcome) {
	id := o.JobID()
	if id == probeID {
		if o.Rejected != nil || o.Pending != nil || o.Decided != nil {
			r.probeOK++
		}
		return
	}
	i, ok := r.byID[id]
	if !ok {
		return
	}
	s := &r.jobs[i]
	now := r.now
	if r.cfg.Speed > 0 {
		now = time.Since(r.wall0).Seconds() * r.cfg.Speed
	}
	first := func() {
		if s.decided.IsZero() {
			s.decided = time.Now()
			if r.progress != nil {
				r.progress.Add(1)
			}
		}
	}
	switch {
	case o.Decided != nil:
		r.decs++
		r.freeJob(s)
		if s.state == stPending {
			r.retries++
		}
		first()
		// A job decided again while it runs (moved) keeps its planned
		// finish.
		moved := s.state == stPlaced
		if !moved {
			s.start = now
		}
		s.state, s.released = stPlaced, false
		delete(r.queue, i)
		for _, n := range o.Decided.Nodes {
			if k, ok := r.cfg.Inventory.index[n.Node]; ok {
				s.nodes = append(s.nodes, nodeAlloc{k, len(n.GPUs)})
				r.occ.add(k, len(n.GPUs))
			}
		}
		s.nodesSpanned = len(o.Decided.Nodes)
		if p, bl := o.Decided.Prediction, o.Decided.Baseline; p != nil && bl != nil {
			s.pred, s.base, s.hasPred = p.CommSecondsPerStep, bl.CommSecondsPerStep, true
		}
		if moved {
			break
		}
		if p := o.Decided.Prediction; p != nil {
			s.comm = p.CommSecondsPerStep
		}
		if r.cfg.ComputeReference == "" {
			s.stretch, s.scaled = Stretch(s.compute, s.comm, s.ideal)
		} else {
			s.computeOn = r.computeOn(i, o.Decided.Nodes)
			s.stretch, s.scaled = StretchOn(s.compute, s.computeOn, s.comm, s.ideal, s.job.GPUs)
		}
		s.runtime = s.job.Duration * s.stretch
		if !r.cfg.Burst && s.job.Duration >= 0 {
			heap.Push(&r.finishes, finish{at: now + s.runtime, job: i})
		}
	case o.Pending != nil:
		r.decs++
		first()
		if s.state == stNone {
			s.state, s.waited = stPending, true
			r.queue[i] = true
			if len(o.Pending.Reasons) > 0 {
				s.reason = o.Pending.Reasons[0].Code
			}
		}
	case o.Rejected != nil:
		r.decs++
		first()
		r.freeJob(s)
		s.state = stRejected
		delete(r.queue, i)
		if len(o.Rejected.Reasons) > 0 {
			s.reason = o.Rejected.Reasons[0].Code
		}
	case o.Released != nil:
		r.freeJob(s)
		s.released = true
	}
}

func (r *runner) freeJob(s *jobState) {
	for _, n := range s.nodes {
		r.occ.add(n.node, -n.gpus)
	}
	s.nodes = nil
}
