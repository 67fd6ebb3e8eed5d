package placement

import (
	"time"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/internal/store"
)

// turn is the place in the queue of a job that waits (store.Job.Turn, and
// the event's account of it).
//
// Ordered by expected ends (QueueByEnd, the default), a job that waits
// for the first time is given now plus the run time learned for jobs of
// its size (internal/demand): the time it would end had it started now.
// Ordered by expected work (QueueByWork), that run time is weighed by the
// job's share of a node: its GPUs over the most GPUs of its model on one
// node of the cluster. A job of one whole node is given its run time; a
// one-GPU job of an 8-GPU cluster an eighth of it; a job of four nodes
// four times it.
//
// Either way arrival order would put a one-hour job behind every day-long
// one that came before it; these orders put it behind those whose turns
// come first, and never behind a job that came more than its own weighed
// run time after it, so no job waits in the queue for ever. Weighing by
// the work is the order that minimises mean completion time on one
// machine (Smith's rule, shortest processing time first) taken to a
// cluster: what a job takes from the others is its GPUs for its run time.
// BENCHMARKS.md ("Issue 51: the queue ordered by expected work") measures
// it against the order by ends on every log. Before any job has ended, no
// run time is known and the order is the arrival order. A job that
// already waits (a resubmission of it) keeps its turn.
func (s *Service) turn(snap *store.Snapshot, prev *store.Job, job events.JobAnalyzed) (time.Time, *events.QueueTurn) {
	share := 1.0
	if s.byWork {
		share = nodeShare(snap, job)
	}
	if prev != nil && prev.State == store.JobPending && !prev.Turn.IsZero() {
		run := time.Duration(0)
		if since, ok := s.pendingSince[prev.ID]; ok && prev.Turn.After(since) {
			run = time.Duration(float64(prev.Turn.Sub(since)) / share)
		}
		return prev.Turn, queueTurn(prev.Turn, run, share, s.byWork)
	}
	if !s.byEnd {
		return time.Time{}, nil
	}
	run, _ := s.demand.RunTime(job.Job.GPUs)
	at := s.now().Add(time.Duration(float64(run) * share))
	return at, queueTurn(at, run, share, s.byWork)
}

// nodeShare is the job's GPUs over the most GPUs of its model (of any
// model when it names none) on one node; 1 on a cluster without nodes.
func nodeShare(snap *store.Snapshot, job events.JobAnalyzed) float64 {
	per := snap.MaxGPUsPerNode(job.Job.GPUModel)
	if per <= 0 {
		return 1
	}
	return float64(job.Job.GPUs) / float64(per)
}

func queueTurn(at time.Time, run time.Duration, share float64, byWork bool) *events.QueueTurn {
	t := &events.QueueTurn{At: at.UTC(), ExpectedRunSeconds: run.Seconds()}
	if byWork {
		t.NodeShare = share
	}
	return t
}
