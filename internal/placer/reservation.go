package placer

import (
	"time"

	"github.com/toposched/toposched/events"
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
// priority (which would be ahead of it in the queue). Under the Compact
// rule a job spread over nodes is held nodes on which it would run within
// the rule's bound where such nodes exist (services/placement's fastHold),
// which need not be the fullest-free. Those nodes drain
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

// Holds returns r when it keeps its nodes from job, nil otherwise.
func (r *Reservation) Holds(job events.JobAnalyzed) *Reservation {
	if r == nil || job.Job.JobID == r.JobID || job.Job.Priority > r.Priority {
		return nil
	}
	return r
}
