package placement

import (
	"cmp"
	"context"
	"slices"
	"strings"
	"time"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/internal/store"
)

// DefaultReserveAfter is how long the head of the queue waits before nodes
// are held for it.
const DefaultReserveAfter = 5 * time.Minute

// Reservation holds nodes for the job at the head of the pending queue, so
// that small jobs do not starve it.
//
// # The rule
//
// The queue is ordered by priority, then age. Jobs behind the head are
// placed wherever they fit (backfill), which keeps GPUs busy but can keep
// a large head waiting for ever: every GPU that frees is taken by a small
// job before enough free up together. So once the head has waited
// ReserveAfter (--reserve-after, 5 minutes by default; 0 reserves at once,
// a negative duration never), placement picks for it the fewest nodes
// that could hold it — those allowed to it by its node policies, with the
// most free GPUs of its model first, enough healthy GPUs in all — and
// from then on places no other job on them, except jobs of higher
// priority (which would be ahead of it in the queue). Those nodes drain
// as their jobs finish, and the head is placed as soon as it fits,
// anywhere. The hold moves when another job becomes the head (a higher
// priority arrives, or the head is placed or withdrawn) and is recomputed
// when its nodes can no longer hold the job.
//
// The trade is the classic one of EASY backfilling without run-time
// estimates: reserved GPUs may idle while they drain, in exchange for a
// bound on the head's wait (the longest remaining run time among the jobs
// on its nodes). A job kept off reserved nodes says so in its pending
// reasons (code reserved_for_older_job) and explanation (nodes_reserved).
//
// The hold lives in the placement service's memory: after a restart the
// head's wait is taken from its first placement.pending event, and the
// hold is made again on the next retry.
type Reservation struct {
	JobID    string
	Priority int
	// Since is when the job first waited.
	Since time.Time
	// Nodes are the nodes held.
	Nodes map[string]bool
}

// holds returns r when it keeps its nodes from job, nil otherwise.
func (r *Reservation) holds(job events.JobAnalyzed) *Reservation {
	if r == nil || job.Job.JobID == r.JobID || job.Job.Priority > r.Priority {
		return nil
	}
	return r
}

// SetReserveAfter sets how long the head of the queue waits before nodes
// are held for it; 0 holds them at once, a negative duration never.
func (s *Service) SetReserveAfter(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reserveAfter = d
	if d < 0 {
		s.reservation = nil
	}
}

// Reservation returns the nodes held for the head of the queue, nil when
// none are.
func (s *Service) Reservation() *Reservation {
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
	s.reservation = &Reservation{JobID: head.ID, Priority: head.Priority, Since: since, Nodes: nodes}
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
	pv := newPolicyView(ctx, snap, s.policies, job, s.log)
	var cands []store.Domain
	for _, d := range snap.DomainsOfKind(store.DomainNode) {
		if usable(d, model, gpn) == 0 {
			continue
		}
		if n, ok := snap.Node(d.Node); !ok || !pv.evalNode(pv.viewOf(n), false) {
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
