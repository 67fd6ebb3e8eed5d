// Package optimizer follows the jobs that are running and, from what they
// report, tunes their collectives and proposes better placements.
//
// So far it keeps the live placements (placement.decided until
// placement.released) as its working set and audits them independently of
// placement: a GPU held by two live decisions is reported as an error.
// Collective tuning and telemetry diagnosis build on this set.
package optimizer

import (
	"context"
	"log/slog"
	"sync"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/events/bus"
)

// HandlerPlacement is the durable consumer of the placement stream: part
// of the wire contract. One consumer, not one per event type, because the
// working set depends on the order of decisions and releases.
const HandlerPlacement = "optimizer-placement"

// Service is the optimizer.
type Service struct {
	log *slog.Logger

	mu     sync.Mutex
	live   map[string]*events.PlacementDecided
	holder map[gpuKey]string
}

type gpuKey struct {
	node string
	gpu  int
}

// New returns the optimizer.
func New(log *slog.Logger) *Service {
	if log == nil {
		log = slog.Default()
	}
	return &Service{
		log:    log.With("component", "optimizer"),
		live:   map[string]*events.PlacementDecided{},
		holder: map[gpuKey]string{},
	}
}

// Register adds the service's handler to r.
func (s *Service) Register(r *bus.Router) {
	bus.HandleDomain(r, bus.DomainHandler{Name: HandlerPlacement, Domain: "placement", Fn: s.onPlacement})
}

// onPlacement takes the placement stream in order: decisions and releases
// update the working set; waits and rejections do not concern it.
func (s *Service) onPlacement(ctx context.Context, env events.Envelope, name events.Name, body []byte) error {
	switch name {
	case events.NamePlacementDecided:
		var d events.PlacementDecided
		if err := bus.Decode(name, body, &d); err != nil {
			return err
		}
		return s.OnDecided(ctx, env, &d)
	case events.NamePlacementReleased:
		var rel events.PlacementReleased
		if err := bus.Decode(name, body, &rel); err != nil {
			return err
		}
		return s.OnReleased(ctx, env, &rel)
	}
	return nil
}

// OnDecided adds a placement to the working set.
func (s *Service) OnDecided(_ context.Context, env events.Envelope, d *events.PlacementDecided) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.live[d.JobID]; ok {
		return nil
	}
	for _, r := range d.Ranks {
		k := gpuKey{r.Node, r.GPU}
		if other, ok := s.holder[k]; ok && other != d.JobID {
			s.log.Error("double booking: GPU held by two live jobs", "node", r.Node, "gpu", r.GPU,
				"job_id", d.JobID, "other_job_id", other, "correlation_id", env.CorrelationID)
			continue
		}
		s.holder[k] = d.JobID
	}
	s.live[d.JobID] = d
	s.log.Debug("tracking placement", "job_id", d.JobID, "ranks", len(d.Ranks))
	return nil
}

// OnReleased drops a placement from the working set.
func (s *Service) OnReleased(_ context.Context, _ events.Envelope, rel *events.PlacementReleased) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	d, ok := s.live[rel.JobID]
	if !ok {
		return nil
	}
	for _, r := range d.Ranks {
		k := gpuKey{r.Node, r.GPU}
		if s.holder[k] == rel.JobID {
			delete(s.holder, k)
		}
	}
	delete(s.live, rel.JobID)
	return nil
}

// Live reports the number of live placements and GPUs they hold.
func (s *Service) Live() (jobs, gpus int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.live), len(s.holder)
}
