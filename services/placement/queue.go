package placement

import (
	"time"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/internal/store"
)

// turn is the place in the queue of a job that waits (store.Job.Turn, and
// the event's account of it). Ordered by expected ends, a job that
// waits for the first time is given now plus the run time learned for
// jobs of its size (internal/demand): the time it would end had it
// started now. Arrival order would put a one-hour job behind every
// day-long one that came before it; this order puts it behind those that
// would end first had both started at once, and never behind a job that
// came more than its own expected run time after it, so no job waits in
// the queue for ever. Before any job has ended, no run time is known and
// the order is the arrival order. A job that already waits (a
// resubmission of it) keeps its turn.
func (s *Service) turn(prev *store.Job, gpus int) (time.Time, *events.QueueTurn) {
	if prev != nil && prev.State == store.JobPending && !prev.Turn.IsZero() {
		run := time.Duration(0)
		if since, ok := s.pendingSince[prev.ID]; ok && prev.Turn.After(since) {
			run = prev.Turn.Sub(since)
		}
		return prev.Turn, &events.QueueTurn{At: prev.Turn.UTC(), ExpectedRunSeconds: run.Seconds()}
	}
	if !s.byEnd {
		return time.Time{}, nil
	}
	run, _ := s.demand.RunTime(gpus)
	at := s.now().Add(run)
	return at, &events.QueueTurn{At: at.UTC(), ExpectedRunSeconds: run.Seconds()}
}
