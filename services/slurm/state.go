package slurm

import (
	"context"
	"fmt"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/events/bus"
)

// What the service knows from the streams: the jobs placement decided and
// nobody finished, the ids of those that ended, and each node's holds as
// last published. It is rebuilt
// from the streams at start (replayed, then followed), never stored.

// stream is one stream the service reads and the events it reads of it.
type stream struct {
	domain events.Domain
	names  []events.Name
}

// streams are the jobs' ends, placement's decisions and releases, and
// the nodes' holds.
var streams = []stream{
	{events.DomainJobs, []events.Name{events.NameJobFinished}},
	{events.DomainPlacement, []events.Name{events.NamePlacementDecided, events.NamePlacementReleased}},
	{events.DomainTopology, []events.Name{events.NameTopologyHeld}},
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

// rebuild reads each stream from its start and returns the last sequence
// read of each, for follow to go on from.
func (s *Service) rebuild(ctx context.Context) ([]uint64, error) {
	var last []uint64
	for _, st := range streams {
		var seq uint64
		err := s.bus.Replay(ctx, st.domain, s.subjectsOf(st.names), func(r bus.Record) error {
			seq = r.Seq
			s.mu.Lock()
			s.apply(r)
			s.mu.Unlock()
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("slurm: rebuild from %s: %w", st.domain, err)
		}
		last = append(last, seq)
	}
	return last, nil
}

// follow reads each stream on from where rebuild stopped until ctx ends;
// ready is closed once every follower has its consumer.
func (s *Service) follow(ctx context.Context, after []uint64, ready chan<- struct{}) error {
	errs := make(chan error, len(streams))
	readies := make([]chan struct{}, len(streams))
	for i, st := range streams {
		readies[i] = make(chan struct{})
		go func() {
			errs <- s.bus.FollowFrom(ctx, st.domain, s.subjectsOf(st.names), after[i], readies[i], func(r bus.Record) error {
				s.mu.Lock()
				s.apply(r)
				s.mu.Unlock()
				return nil
			})
		}()
	}
	for i := range readies {
		select {
		case <-readies[i]:
		case err := <-errs:
			return fmt.Errorf("slurm: follow: %w", err)
		case <-ctx.Done():
			return nil
		}
	}
	close(ready)
	for range streams {
		if err := <-errs; err != nil && ctx.Err() == nil {
			return fmt.Errorf("slurm: follow: %w", err)
		}
	}
	return nil
}

func (s *Service) subjectsOf(names []events.Name) []string {
	out := make([]string, 0, len(names))
	for _, n := range names {
		out = append(out, s.bus.Subjects.Of(n))
	}
	return out
}
