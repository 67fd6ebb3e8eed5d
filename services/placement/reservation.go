package placement

import (
	"cmp"
	"context"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/internal/placer"
	"github.com/toposched/toposched/internal/placer/engine"
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
// for a reservation: a new head's hold is picked from the whole cluster,
// and a burst of submissions must not pay it each time.
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
	head, ok := snap.PendingHead()
	s.reserve(ctx, snap, head, ok)
}

// reserve keeps the reservation in line with the queue: held for the
// head once it has waited long enough, dropped otherwise. pending is
// false when no job waits.
func (s *Service) reserve(ctx context.Context, snap *store.Snapshot, head store.Job, pending bool) {
	if !pending || s.reserveAfter < 0 {
		s.reservation = nil
		return
	}
	since, ok := s.pendingSince[head.ID]
	if !ok {
		since = s.now()
		s.pendingSince[head.ID] = since
	}
	waited := s.now().Sub(since) >= s.reserveAfter
	if r := s.reservation; r != nil && (r.JobID == head.ID || !waited || head.Priority <= r.Priority) {
		// Nodes held stay held for their job while it waits and they can
		// hold it, though a job of its priority has come ahead of it in
		// the queue (ordered by expected ends, a short job that comes
		// later may): moving the hold would give what has drained for
		// the one to the next jobs of the queue, and the one would
		// start again from nothing. Only a job of a higher priority
		// that has waited long enough takes the hold.
		if j, ok := snap.Job(r.JobID); ok && j.State == store.JobPending && canHold(snap, j.Spec, r.Nodes) {
			return
		}
	}
	if !waited {
		s.reservation = nil
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
// then enumeration order; nil when all of them could not hold it. Where
// the placement policies would deny the job on them, it takes them leaf
// by leaf instead (byLeaf), if the policies allow that. Under the Compact
// rule a job spread over nodes is held nodes it would run on within the
// rule's bound where there are such (fastHold; its sets are not judged by
// the placement policies).
func (s *Service) pickReserved(ctx context.Context, snap *store.Snapshot, job events.JobAnalyzed) map[string]bool {
	model := job.Job.GPUModel
	pv := placer.NewPolicyCheck(ctx, snap, s.policies, job, s.log)
	var cands []store.Domain
	for d := range snap.EachDomainOfKind(store.DomainNode) {
		if usable(d, model, job.Job.GPUsPerNode) == 0 {
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
	first := holdFrom(cands, job)
	if first == nil {
		return nil
	}
	if pv.Judges() && !holdAllowed(snap, pv, job, cands, first) {
		// The fullest-free nodes may lie under more leaf switches than
		// the placement policies let the job span (the shipped
		// leaf_span: a 32-GPU job at most two): held there, they drain
		// to GPUs the head may not run on, and they stay held, kept
		// from every other job, while the head waits for room it may
		// use elsewhere. Filled leaf by leaf, the fewest leaves that
		// hold it, the hold is one it can start on.
		if packed := holdFrom(byLeaf(snap, cands, model), job); packed != nil && holdAllowed(snap, pv, job, cands, packed) {
			first = packed
		}
	}
	if c := s.compact(); c.Applies(job) {
		return fastHold(c, snap, job, cands, first)
	}
	return first
}

// byLeaf is cands grouped by leaf switch, the leaves with the most free
// GPUs of model first, each leaf's nodes in cands' order (nodes under no
// leaf last, as one group).
func byLeaf(snap *store.Snapshot, cands []store.Domain, model string) []store.Domain {
	leafOf := make(map[string]string, len(cands))
	free := map[string]int{}
	for _, d := range cands {
		leaf := ""
		for _, f := range snap.FabricDomains(d.Node) {
			if store.DomainKind(f) == store.DomainLeaf {
				leaf = f
				break
			}
		}
		leafOf[d.Node] = leaf
		free[leaf] += d.FreeOf(model)
	}
	out := slices.Clone(cands)
	slices.SortStableFunc(out, func(a, b store.Domain) int {
		la, lb := leafOf[a.Node], leafOf[b.Node]
		if la == lb {
			return 0
		}
		if la == "" || lb == "" {
			return strings.Compare(lb, la) // "" last
		}
		return cmp.Or(cmp.Compare(free[lb], free[la]), strings.Compare(la, lb))
	})
	return out
}

// holdAllowed reports whether the placement policies allow the job on
// the held nodes once they are empty: a placement of their usable GPUs
// in cands' order (node by node, so that tensor-parallel groups of up
// to a node's GPUs stay on one node), judged without a prediction
// (CommSeconds 0: a policy on the predicted time cannot deny it).
func holdAllowed(snap *store.Snapshot, pv placer.PolicyCheck, job events.JobAnalyzed, cands []store.Domain, nodes map[string]bool) bool {
	model, gpn, want := job.Job.GPUModel, job.Job.GPUsPerNode, job.Job.GPUs
	var gpus []store.GPUKey
	for _, d := range cands {
		if !nodes[d.Node] {
			continue
		}
		room := usable(d, model, gpn)
		for _, g := range snap.GPUs(d.Node) {
			if len(gpus) == want || room == 0 {
				break
			}
			if g.Healthy && (model == "" || g.Model == model) {
				gpus = append(gpus, g.Key())
				room--
			}
		}
	}
	if len(gpus) < want {
		return false
	}
	return !pv.Judge(engine.Candidate{GPUs: gpus}).Deny
}

// holdFrom is the shortest prefix of cands that holds job once emptied,
// nil when all of them do not.
func holdFrom(cands []store.Domain, job events.JobAnalyzed) map[string]bool {
	out := map[string]bool{}
	room := 0
	for _, d := range cands {
		if room >= job.Job.GPUs {
			break
		}
		out[d.Node] = true
		room += usable(d, job.Job.GPUModel, job.Job.GPUsPerNode)
	}
	if room < job.Job.GPUs {
		return nil
	}
	return out
}

// fastHoldSets bounds the sets of nodes fastHold predicts the job on
// (one topology-aware placement each, on the emptied cluster): the hold
// is made again only when the head changes or its nodes can no longer
// hold it, but a cluster of many leaves must not make that a second's
// work.
const fastHoldSets = 16

// fastHold keeps first, the nodes with the most free GPUs, when
// topology-aware would run the job there, once they drain, within the
// Compact rule's bound. Otherwise the head would wait for nodes on which
// it then starts several times as slow as it could run (on Philly's log,
// 16- and 32-GPU jobs ran 2.5 to 5.7 times as long, 58,000 GPU-hours on
// top of 34,000), so it is held the nodes of one kind (GPU model and
// links inside the node), under one leaf switch or anywhere, that
// would: of those sets, the one with the most free GPUs now; where none
// would, the set it would run fastest on.
func fastHold(c *placer.Compact, snap *store.Snapshot, job events.JobAnalyzed, cands []store.Domain, first map[string]bool) map[string]bool {
	best, bestStretch := first, c.StretchOn(job, first)
	if bestStretch <= c.MaxStretch {
		return first
	}
	bestFree := 0
	var keys []string
	groups := map[string][]store.Domain{}
	for _, d := range cands {
		n, ok := snap.Node(d.Node)
		if !ok {
			continue
		}
		kind := n.GPUModel + "|" + string(n.Links[:])
		leaf := ""
		if f := snap.FabricDomains(n.Name); len(f) > 0 {
			leaf = f[0]
		}
		ks := []string{kind}
		if leaf != "" {
			ks = append(ks, leaf+"|"+kind)
		}
		for _, k := range ks {
			if _, seen := groups[k]; !seen {
				keys = append(keys, k)
			}
			groups[k] = append(groups[k], d)
		}
	}
	tried := map[string]bool{}
	for _, k := range keys {
		set := holdFrom(groups[k], job)
		if set == nil {
			continue
		}
		id := strings.Join(slices.Sorted(maps.Keys(set)), ",")
		if tried[id] || len(tried) >= fastHoldSets {
			continue
		}
		tried[id] = true
		st := c.StretchOn(job, set)
		free := 0
		for _, d := range groups[k] {
			if set[d.Node] {
				free += d.FreeOf(job.Job.GPUModel)
			}
		}
		in, bestIn := st <= c.MaxStretch, bestStretch <= c.MaxStretch
		if (in && !bestIn) || (in && bestIn && free > bestFree) || (!in && !bestIn && st < bestStretch) {
			best, bestStretch, bestFree = set, st, free
		}
	}
	return best
}
