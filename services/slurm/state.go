package slurm

import (
	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/events/bus"
)

// What the service knows from the streams: the jobs placement decided and
// nobody finished, the ids of those that ended, and each node's holds as
// last published. It is rebuilt
// from the streams at start (replayed, then followed), never stored.

// sources are the jobs' ends, placement's decisions and releases, and
// the nodes' holds.
var sources = []bus.Source{
	{Domain: events.DomainJobs, Names: []events.Name{events.NameJobFinished}},
	{Domain: events.DomainPlacement, Names: []events.Name{events.NamePlacementDecided, events.NamePlacementReleased}},
	{Domain: events.DomainTopology, Names: []events.Name{events.NameTopologyHeld}},
}

// apply takes one record into the state; the caller holds mu.
func (s *Service) apply(r bus.Record) {
	switch r.Name {
	case events.NamePlacementDecided:
		var ev events.PlacementDecided
		if s.decode(r, &ev) && !s.ended[ev.JobID] {
			s.decided[ev.JobID] = &ev
		}
	case events.NameJobFinished:
		var ev events.JobFinished
		if s.decode(r, &ev) {
			delete(s.decided, ev.JobID)
			s.ended[ev.JobID] = true
		}
	case events.NamePlacementReleased:
		var ev events.PlacementReleased
		if s.decode(r, &ev) {
			delete(s.decided, ev.JobID)
			s.ended[ev.JobID] = true
		}
	case events.NameTopologyHeld:
		var ev events.TopologyHeld
		if !s.decode(r, &ev) {
			return
		}
		if ourHolds(ev.GPUs) {
			s.heldSeen[ev.Node] = heldKey(ev.GPUs)
		} else {
			delete(s.heldSeen, ev.Node)
		}
	}
}

// decode reads a record's body; one that does not decode is left alone
// (the services that own the event dead-letter it).
func (s *Service) decode(r bus.Record, v any) bool {
	if err := s.bus.Decode(r.Name, r.Body, v); err != nil {
		s.log.Debug("event skipped", "event", r.Name, "seq", r.Seq, "err", err)
		return false
	}
	return true
}

// applyLocked takes one record into the state.
func (s *Service) applyLocked(r bus.Record) {
	s.mu.Lock()
	s.apply(r)
	s.mu.Unlock()
}
