package placement

import (
	"cmp"
	"context"
	"slices"
	"strings"
	"time"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/internal/placer"
	"github.com/toposched/toposched/internal/store"
)

// DefaultReserveAfter is how long the head of the queue waits before nodes
// are held for it.
const DefaultReserveAfter = 5 * time.Minute

// Reservation returns the nodes held for the head of the queue, nil when
// none are.
func (s *Service) Reservation() *placer.Reservation {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.reservation
}

// reserveCheckEvery bounds how often a new submission looks at the queue
// for a reservation: the look walks the queue, and a burst of submissions
// must not pay it each time.
const reserveCheckEvery = time.Second

// maybeReserve updates the reservation before a new job is placed, at
// most every reserveCheckEvery, so that a head whose wait has just crossed
// ReserveAfter is protected from the next submission too, not only from
// the next retry.
func (s *Service) maybeReserve(ctx context.Context) {
	now := s.now()
	if s.reserveAfter < 0 || now.Before(s.nextReserve) || len(s.pendingSince) == 0 {
		return
	}
	s.nextReserve = now.Add(reserveCheckEvery)
	snap := s.store.Snapshot()
	s.reserve(ctx, snap, snap.PendingQueue())
}

// reserve keeps the reservation in line with the queue: held for the
// head once it has waited long enough, dropped otherwise.
func (s *Service) reserve(ctx context.Context, snap *store.Snapshot, queue []store.Job) {
	if len(queue) == 0 || s.reserveAfter < 0 {
		s.reservation = nil
		return
	}
	head := queue[0]
	since, ok := s.pendingSince[head.ID]
	if !ok {
		since = s.now()
		s.pendingSince[head.ID] = since
	}
	if s.now().Sub(since) < s.reserveAfter {
		s.reservation = nil
		return
	}
	if r := s.reservation; r != nil && r.JobID == head.ID && canHold(snap, head.Spec, r.Nodes) {
		return
	}
	nodes := s.pickReserved(ctx, snap, head.Spec)
	if nodes == nil {
		s.reservation = nil
		return
	}
	s.reservation = &placer.Reservation{JobID: head.ID, Priority: head.Priority, Since: since, Nodes: nodes}
	s.log.InfoContext(ctx, "nodes held for the head of the queue", "job_id", head.ID, "nodes", len(nodes), "waiting", s.now().Sub(since).Round(time.Second))
}

// usable is what a node can give a job of the given model and
// gpus_per_node once empty: its healthy GPUs, in whole gpn blocks.
func usable(d store.Domain, model string, gpn int) int {
	h := d.Count(model).Healthy
	if gpn > 0 {
		return h / gpn * gpn
	}
	return h
}

// canHold reports whether the nodes, emptied, hold the job.
func canHold(snap *store.Snapshot, job events.JobAnalyzed, nodes map[string]bool) bool {
	room := 0
	for n := range nodes {
		if d, ok := snap.Domain(store.DomainNode + ":" + n); ok {
			room += usable(d, job.Job.GPUModel, job.Job.GPUsPerNode)
		}
	}
	return room >= job.Job.GPUs
}

// pickReserved chooses the nodes to hold for job: allowed by its node
// policies, the most free GPUs of its model first (they drain soonest),
// then enumeration order; nil when all of them could not hold it.
func (s *Service) pickReserved(ctx context.Context, snap *store.Snapshot, job events.JobAnalyzed) map[string]bool {
	model, gpn := job.Job.GPUModel, job.Job.GPUsPerNode
	pv := placer.NewPolicyCheck(ctx, snap, s.policies, job, s.log)
	var cands []store.Domain
	for _, d := range snap.DomainsOfKind(store.DomainNode) {
		if usable(d, model, gpn) == 0 {
			continue
		}
		if n, ok := snap.Node(d.Node); !ok || !pv.AllowsNode(n) {
			continue
		}
		cands = append(cands, d)
	}
	slices.SortFunc(cands, func(a, b store.Domain) int {
		return cmp.Or(cmp.Compare(b.FreeOf(model), a.FreeOf(model)), cmp.Compare(a.Position, b.Position), strings.Compare(a.Node, b.Node))
	})
	out := map[string]bool{}
	room := 0
	for _, d := range cands {
		if room >= job.Job.GPUs {
			break
		}
		out[d.Node] = true
		room += usable(d, model, gpn)
	}
	if room < job.Job.GPUs {
		return nil
	}
	return out
}
