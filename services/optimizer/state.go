package optimizer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/events/bus"
)

// ErrUnknownJob is returned (wrapped) for a decision the streams cannot
// back: its job has no analysis in the jobs stream, or a node of it no
// report in the topology stream, though both were read to the end.
// Placement decides only jobs it analysed on nodes reported before, so
// such a decision was published by someone else (by hand, forged): it
// stays in the working set (its GPUs held, as placement holds them) but
// is not tuned, and the error, being permanent, dead-letters the decision
// once instead of having it redelivered for ever.
var ErrUnknownJob = errors.New("the streams hold no analysis or node report for it: not published by placement")

// rebuild restores the state from the streams: the topology, the analysed
// jobs, then every decision and release in the order placement published
// them. Run it before Register's handlers start.
func (s *Service) rebuild(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.catchUpTopology(ctx); err != nil {
		return err
	}
	if err := s.catchUpJobs(ctx); err != nil {
		return err
	}
	if err := s.catchUpPlacement(ctx); err != nil {
		return err
	}
	if err := s.rebuildRuntime(ctx); err != nil {
		return err
	}
	s.log.Info("state rebuilt from streams", "nodes", len(s.store.Snapshot().Nodes()), "live_jobs", len(s.live),
		"analysed_jobs_waiting", len(s.analyses), "topology_seq", s.topoSeq, "jobs_seq", s.jobsSeq, "placement_seq", s.placementSeq)
	return nil
}

// catchUpTopology applies what the topology stream holds beyond what the
// state has applied. An event that no longer applies (a health change for
// a node since removed) is skipped, loudly: a rebuild must not stop on it.
func (s *Service) catchUpTopology(ctx context.Context) error {
	subj := s.subjects
	err := s.read.ReplayFrom(ctx, events.DomainTopology, []string{subj.Domain(events.DomainTopology)}, s.topoSeq, func(r bus.Record) error {
		s.topoSeq = max(s.topoSeq, r.Seq)
		if err := s.applyTopology(r.Name, r.Body); err != nil {
			s.log.Warn("catch-up: topology event skipped", "event", r.Name, "seq", r.Seq, "err", err)
		}
		return nil
	})
	if err != nil {
		return bus.Transient(fmt.Errorf("optimizer: catch up with topology: %w", err))
	}
	return nil
}

// catchUpJobs applies the analyses the jobs stream holds beyond what the
// state has applied.
func (s *Service) catchUpJobs(ctx context.Context) error { return s.replayJobs(ctx, s.jobsSeq, "") }

// replayJobs applies the analyses the jobs stream holds after sequence
// after, of job only ("" for every job). Applying one twice changes
// nothing (applyAnalyzed keeps a live job's first and a waiting job's
// newest, as a replay in order does).
func (s *Service) replayJobs(ctx context.Context, after uint64, only string) error {
	err := s.read.ReplayFrom(ctx, events.DomainJobs, []string{s.subjects.Of(events.NameJobAnalyzed)}, after, func(r bus.Record) error {
		if only != "" {
			// Looking for one job's analysis, by its ce-subject: what
			// else this reads is applied, or not, by the consumer.
			if r.Env.Subject != only {
				return nil
			}
		} else {
			s.jobsSeq = max(s.jobsSeq, r.Seq)
		}
		var a events.JobAnalyzed
		if err := s.read.Decode(r.Name, r.Body, &a); err != nil {
			s.log.Warn("catch-up: analysis skipped", "seq", r.Seq, "err", err)
			return nil
		}
		s.applyAnalyzed(&a)
		return nil
	})
	if err != nil {
		return bus.Transient(fmt.Errorf("optimizer: catch up with jobs: %w", err))
	}
	return nil
}

// catchUpPlacement applies the decisions and releases the placement stream
// holds beyond what the state has applied. It publishes nothing: the
// placement consumer, which skips applying them again, tunes each decision
// it delivers whose job still runs.
func (s *Service) catchUpPlacement(ctx context.Context) error {
	err := s.read.ReplayFrom(ctx, events.DomainPlacement, []string{s.subjects.Domain(events.DomainPlacement)}, s.placementSeq, func(r bus.Record) error {
		var v any
		switch r.Name {
		case events.NamePlacementDecided:
			v = new(events.PlacementDecided)
		case events.NamePlacementReleased:
			v = new(events.PlacementReleased)
		case events.NamePlacementRejected:
			v = new(events.PlacementRejected)
		default:
			s.placementSeq = max(s.placementSeq, r.Seq)
			return nil
		}
		if err := s.read.Decode(r.Name, r.Body, v); err != nil {
			s.log.Warn("catch-up: placement event skipped", "event", r.Name, "seq", r.Seq, "err", err)
			s.placementSeq = max(s.placementSeq, r.Seq)
			return nil
		}
		s.applyPlacement(r.Seq, v)
		return nil
	})
	if err == nil {
		s.placementSynced = time.Now()
	}
	if err != nil {
		return bus.Transient(fmt.Errorf("optimizer: catch up with placement: %w", err))
	}
	return nil
}

// ready makes sure a live job can be tuned on whole data: its analysis and
// the reports of every node it runs on, catching up with the streams
// where they are missing. When they are still missing, the streams read
// to their end, the decision is not placement's: it fails with
// ErrUnknownJob, permanently, rather than be tuned on partial data or
// retried for ever.
func (s *Service) ready(ctx context.Context, lj *liveJob) error {
	d := lj.decision
	if lj.unknown {
		return fmt.Errorf("optimizer: job %s: %w", d.JobID, ErrUnknownJob)
	}
	if lj.spec == nil {
		if err := s.catchUpJobs(ctx); err != nil {
			return err
		}
	}
	if lj.spec == nil {
		// The other replica handled this job's analysis, and this one
		// has since applied a later one (the jobs consumer is shared), so
		// the analysis lies before jobsSeq: read the stream from the
		// start. Rare, and bounded by the stream.
		if err := s.replayJobs(ctx, 0, d.JobID); err != nil {
			return err
		}
		if lj.spec == nil {
			// The whole jobs stream was read: the analysis is not late,
			// there is none.
			return s.unknown(ctx, lj, "no analysis in the jobs stream")
		}
		s.later(storeChange{kind: changeRecorded, job: d.JobID, lj: lj})
	}
	if s.topologyMissing(d) || (len(d.Nodes) > 1 && s.fabric == nil) {
		if err := s.catchUpTopology(ctx); err != nil {
			return err
		}
		if s.topologyMissing(d) {
			return s.unknown(ctx, lj, "a node of the decision has no report in the topology stream")
		}
		// No fabric after catching up: the cluster has none, and the
		// model takes the nodes as one non-blocking leaf, as placement
		// did.
	}
	return nil
}

// unknown marks a live job whose decision the streams cannot back, once:
// it is never tuned, and later deliveries about it read no stream again.
func (s *Service) unknown(ctx context.Context, lj *liveJob, why string) error {
	lj.unknown = true
	s.log.WarnContext(ctx, "decision the streams cannot back: not tuned (published by hand?)", "job_id", lj.decision.JobID, "why", why)
	return fmt.Errorf("optimizer: job %s: %s: %w", lj.decision.JobID, why, ErrUnknownJob)
}

// topologyMissing reports whether a node or GPU of the decision has no
// report in the store.
func (s *Service) topologyMissing(d *events.PlacementDecided) bool {
	snap := s.store.Snapshot()
	for _, np := range d.Nodes {
		n, ok := snap.Node(np.Node)
		if !ok || n.GPUCount == 0 {
			return true
		}
	}
	return false
}
