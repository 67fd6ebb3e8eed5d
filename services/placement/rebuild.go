package placement

import (
	"context"
	"fmt"
	"maps"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/events/bus"
	"github.com/toposched/toposched/internal/store"
)

// rebuild restores the store from the streams: the topology, then every
// allocation and release in the order placement published them, then the
// specs of the jobs still waiting. Run calls it before the handlers start.
func (s *Service) rebuild(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	subj := s.subjects
	s.topoSeq = 0
	s.mig = migrations{} // proposals are read again when a user accepts one
	var placed, pending int
	nodeEvents, health, err := s.catchUpTopology(ctx)
	if err != nil {
		return err
	}
	s.ignored = map[string]int{}
	terms := map[uint64]bool{}
	err = s.read.Replay(ctx, events.DomainPlacement, []string{subj.Domain(events.DomainPlacement)}, func(r bus.Record) error {
		if r.Name == events.NamePlacementTerm {
			terms[r.Seq] = true
			return nil
		}
		if why := s.unfenced(r, terms); why != "" {
			s.ignored[IgnoredUnfenced]++
			s.log.Warn("rebuild: ignoring a placement outcome no placement term wrote", "event", r.Name, "job_id", r.Env.Subject,
				"seq", r.Seq, "source", r.Env.Source, "reason", why)
			return nil
		}
		return s.replayPlacement(r)
	})
	if err != nil {
		return fmt.Errorf("rebuild placements: %w", err)
	}
	waiting := map[string]bool{}
	for _, j := range s.store.Snapshot().JobsInState(store.JobPending) {
		waiting[j.ID] = true
	}
	if len(waiting) > 0 {
		err = s.read.Replay(ctx, events.DomainJobs, []string{subj.Of(events.NameJobAnalyzed)}, func(r bus.Record) error {
			if !waiting[r.Env.Subject] {
				return nil
			}
			a, ok := decode[events.JobAnalyzed](s, r)
			if !ok {
				return nil
			}
			j, _ := s.store.Snapshot().Job(a.Job.JobID)
			if j.State != store.JobPending || j.Spec.Job.JobID != "" {
				return nil // the first analysis is the one that was queued
			}
			j.Spec, j.Priority = *a, a.Job.Priority
			return s.store.UpsertJob(j)
		})
		if err != nil {
			return fmt.Errorf("rebuild pending jobs: %w", err)
		}
	}
	for _, j := range s.store.Snapshot().JobsInState(store.JobPending) {
		if j.Spec.Job.JobID == "" {
			s.log.Error("rebuild: pending job has no analysis left in the jobs stream; dropped", "job_id", j.ID)
			if err := s.store.DeleteJob(j.ID); err != nil {
				return err
			}
			continue
		}
		pending++
	}
	snap := s.store.Snapshot()
	placed = len(snap.JobsInState(store.JobPlaced))
	s.seedDemand(snap)
	// The nodes are the store's, not the node events read: the stream
	// keeps a history per node (every start of discovery publishes each
	// node again), so a 6-node cluster read back twice is 12 events.
	s.log.Info("state rebuilt from streams", "nodes", len(snap.Nodes()), "node_events", nodeEvents, "health_events", health,
		"placed_jobs", placed, "pending_jobs", pending, "free_gpus", snap.FreeCount())
	return nil
}

// catchUpTopology applies what the topology stream holds beyond what the
// store has seen. The topology consumer skips what it applied (an event
// applied again out of order would undo a later one: onTopology).
// It returns how many node and health events it applied.
func (s *Service) catchUpTopology(ctx context.Context) (nodes, health int, err error) {
	subj := s.subjects
	err = s.read.ReplayFrom(ctx, events.DomainTopology,
		[]string{subj.Of(events.NameTopologyNode), subj.Of(events.NameTopologyHealth), subj.Of(events.NameTopologyHeld),
			subj.Of(events.NameTopologyFabric)}, s.topoSeq,
		func(r bus.Record) error {
			s.topoSeq = max(s.topoSeq, r.Seq)
			switch r.Name {
			case events.NameTopologyNode:
				n, ok := decode[events.TopologyNode](s, r)
				if !ok {
					return nil
				}
				nodes++
				return s.store.UpsertNode(*n)
			case events.NameTopologyHealth:
				h, ok := decode[events.TopologyHealth](s, r)
				if !ok {
					return nil
				}
				health++
				if err := s.store.SetHealth(*h); err != nil {
					s.log.Warn("health for an unknown part", "node", h.Node, "err", err)
				}
			case events.NameTopologyHeld:
				h, ok := decode[events.TopologyHeld](s, r)
				if !ok {
					return nil
				}
				health++
				if err := s.store.SetHeld(*h); err != nil {
					s.log.Warn("held GPUs of an unknown part", "node", h.Node, "err", err)
				}
			case events.NameTopologyFabric:
				f, ok := decode[events.TopologyFabric](s, r)
				if !ok {
					return nil
				}
				if err := s.applyFabric(*f); err != nil {
					s.log.Warn("fabric refused", "err", err)
				}
			}
			return nil
		})
	if err != nil {
		return nodes, health, fmt.Errorf("catch up with topology: %w", err)
	}
	return nodes, health, nil
}

// Why a rebuild ignored placement events (Service.RebuildIgnored).
const (
	// IgnoredUnfenced: a decision, wait or release that carries no
	// fence of a placement term stored before it. Every outcome placement
	// publishes is fenced on its term's marker (bus.WithFence), so such an
	// event was written by someone else (a credential that may publish
	// placement events but is not placement: only an administrator's).
	IgnoredUnfenced = "unfenced"
	// IgnoredConflict: a decision for GPUs another placed job holds.
	IgnoredConflict = "conflict"
)

// unfenced says why a stored outcome is not one a placement term wrote,
// "" when it is: decisions, waits and releases are published fenced on a
// term marker stored earlier in the stream (terms: the markers read so
// far). Rejections are not checked: analysis rejects invalid jobs too,
// unfenced, and a rejection frees and takes nothing.
func (s *Service) unfenced(r bus.Record, terms map[uint64]bool) string {
	switch r.Name {
	case events.NamePlacementDecided, events.NamePlacementPending, events.NamePlacementReleased:
	default:
		return ""
	}
	switch {
	case r.Fence.Subject == "":
		return "no fence headers"
	case r.Fence.Subject != s.subjects.Of(events.NamePlacementTerm):
		return "fenced on " + r.Fence.Subject + ", not on placement's terms"
	case !terms[r.Fence.Seq]:
		return fmt.Sprintf("fenced on sequence %d, which holds no placement term", r.Fence.Seq)
	}
	return ""
}

// RebuildIgnored counts, by reason (IgnoredUnfenced, IgnoredConflict), the
// placement events this term's rebuild did not take in.
func (s *Service) RebuildIgnored() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.ignored)
}

// replayPlacement applies one event of placement's own log.
func (s *Service) replayPlacement(r bus.Record) error {
	switch r.Name {
	case events.NamePlacementDecided:
		d, ok := decode[events.PlacementDecided](s, r)
		if !ok {
			return nil
		}
		// Restore, not Allocate: a GPU that has failed or left since the
		// decision is still held by the job until it is released. A job
		// decided again (a migration) moves: the new decision replaces
		// the old one's GPUs, as it did live.
		if _, err := s.store.RestoreMove(d.JobID, gpusOf(d)); err != nil {
			// Placement never gives one GPU twice: a decision that would
			// is not its own, and taking it in would double-book.
			s.ignored[IgnoredConflict]++
			s.log.Error("rebuild: ignoring a decision whose GPUs another job holds", "job_id", d.JobID, "seq", r.Seq, "err", err)
			return nil
		}
		delete(s.pendingSince, d.JobID)
		j, _ := s.store.Snapshot().Job(d.JobID)
		j.ID, j.State, j.Decision, j.Reasons = d.JobID, store.JobPlaced, d, nil
		return s.store.UpsertJob(j)
	case events.NamePlacementPending:
		p, ok := decode[events.PlacementPending](s, r)
		if !ok {
			return nil
		}
		j, _ := s.store.Snapshot().Job(p.JobID)
		if s.byEnd && p.Turn != nil && (j.State != store.JobPending || j.Turn.IsZero()) {
			// The turn it was given when it first waited: a rebuilt
			// queue is in the order it had.
			j.Turn = p.Turn.At
		}
		j.ID, j.State, j.Reasons = p.JobID, store.JobPending, p.Reasons
		if _, ok := s.pendingSince[p.JobID]; !ok && !r.Env.Time.IsZero() {
			s.pendingSince[p.JobID] = r.Env.Time
		}
		return s.store.UpsertJob(j)
	case events.NamePlacementRejected:
		p, ok := decode[events.PlacementRejected](s, r)
		if !ok {
			return nil
		}
		j, _ := s.store.Snapshot().Job(p.JobID)
		switch j.State {
		case store.JobPlaced, store.JobPending:
			return nil // a rejected resubmission of a live job changes nothing
		case store.JobFinished:
			// Analysis rejecting a job withdrawn before it was analysed
			// (or a finished job submitted again): the leader that stored
			// the release never reads analysis's rejections and kept it
			// finished; so does the rebuild, or a new term would count
			// one finished job fewer than the log.
			return nil
		}
		j.ID, j.State, j.Reasons = p.JobID, store.JobRejected, p.Reasons
		return s.store.UpsertJob(j)
	case events.NamePlacementReleased:
		rel, ok := decode[events.PlacementReleased](s, r)
		if !ok {
			return nil
		}
		return s.applyReleased(rel)
	}
	return nil
}

// decode reads a stored event. Every event was validated when it was first
// handled or published, so one that no longer decodes is skipped, loudly.
func decode[T any](s *Service, r bus.Record) (*T, bool) {
	v := new(T)
	if err := s.read.Decode(r.Name, r.Body, v); err != nil {
		s.log.Warn("rebuild: skipping an event that does not decode", "event", r.Name, "seq", r.Seq, "err", err)
		return nil, false
	}
	return v, true
}
