package placer

import (
	"time"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/internal/demand"
	"github.com/toposched/toposched/internal/store"
)

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
// priority (which would be ahead of it in the queue). Where the
// placement policies would deny the job on those nodes once emptied (the
// shipped leaf_span, for one), the nodes are taken leaf switch by leaf
// switch instead, the leaves with the most free GPUs first
// (services/placement's holdAllowed and byLeaf): a hold the head cannot
// start on idles and starves it. Under the Compact
// rule a job spread over nodes is held nodes on which it would run within
// the rule's bound where such nodes exist (services/placement's fastHold),
// which need not be the fullest-free. Those nodes drain
// as their jobs finish, and the head is placed as soon as it fits,
// anywhere. The hold moves when another job becomes the head (a higher
// priority arrives, or the head is placed or withdrawn) and is recomputed
// when its nodes can no longer hold the job.
//
// The trade is the classic one of EASY backfilling: reserved GPUs may
// idle while they drain, in exchange for a bound on the head's wait (the
// longest remaining run time among the jobs on its nodes). A job kept off
// reserved nodes says so in its pending reasons (code
// reserved_for_older_job) and explanation (nodes_reserved).
//
// # Backfill onto held nodes
//
// Held GPUs that are free would idle until the last job on the held
// nodes ends. EASY backfilling lets a job run there when it will be gone
// by then, and so this rule does, with the run times placement learns
// (internal/demand) in place of the user's estimates EASY asks for: a
// job whose expected end (now plus the mean run time learned for its
// size) is no later than the latest expected end of the jobs running on
// the held nodes (each one's start plus its size's mean, or, once it has
// run past that, now plus as long again) may use them. Where one of
// those ends is not known (no job has ended yet, or a GPU is held
// outside toposched), nobody backfills. A mean is not a bound: a
// backfilled job that runs past the others delays the head by as much,
// the trade EASY makes with users' estimates too. It is off unless asked
// for (--backfill, Planner.Backfill).
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

// Holds returns r when it keeps its nodes from job, nil otherwise.
func (r *Reservation) Holds(job events.JobAnalyzed) *Reservation {
	if r == nil || job.Job.JobID == r.JobID || job.Job.Priority > r.Priority {
		return nil
	}
	return r
}

// backfill says whether job may run on the nodes res holds, nil when it
// may not: backfill is on, and the job, started now, is expected to end
// by the time the jobs on them are (drainedBy).
func (p *Planner) backfill(snap *store.Snapshot, job events.JobAnalyzed, res *Reservation) *events.Backfill {
	if !p.Backfill || p.Demand == nil {
		return nil
	}
	run, ok := p.Demand.RunTime(job.Job.GPUs)
	if !ok {
		return nil
	}
	until, ok := drainedBy(snap, p.Demand, res.Nodes, p.Now)
	if end := p.Now.Add(run); ok && !end.After(until) {
		return &events.Backfill{HeldFor: res.JobID, ExpectedEnd: end.UTC(), DrainedBy: until.UTC()}
	}
	return nil
}

// drainedBy is when the jobs running on nodes are expected to have
// ended, seen at now: the latest of their expected ends
// (demand.Forecast.ExpectedEnd). False when nothing runs there (the head
// waits for something else), and when an end is not known: a job the
// forecast does not track (it tracks a bounded number), no run time
// learned yet, or a GPU held outside toposched. It is worked out at each
// decision, on its clock, rather than kept with the hold: the ends move
// as jobs run past them, and a replay's decisions must not depend on
// when placement last looked at the queue.
func drainedBy(snap *store.Snapshot, f *demand.Forecast, nodes map[string]bool, now time.Time) (time.Time, bool) {
	var until time.Time
	seen := map[string]bool{}
	for n := range nodes {
		for g := range snap.EachGPU(n) {
			if g.HeldBy != "" {
				return time.Time{}, false
			}
			if g.JobID == "" || seen[g.JobID] {
				continue
			}
			seen[g.JobID] = true
			end, ok := f.ExpectedEnd(g.JobID, now)
			if !ok {
				return time.Time{}, false
			}
			if end.After(until) {
				until = end
			}
		}
	}
	return until, !until.IsZero()
}
