package operator

import "github.com/toposched/toposched/internal/store"

// PlacementStats is the size of the leading placement replica's store, for
// metrics.
type PlacementStats struct {
	Nodes      int
	GPUs       int // on the cluster's nodes
	HealthyGPU int
	FreeGPUs   int
	// Jobs counts the jobs the store knows, by state: pending, placed,
	// rejected, finished.
	Jobs map[string]int
	// RebuildIgnored counts the placement events the term's rebuild did
	// not take in, by reason (placement.IgnoredUnfenced, ...).
	RebuildIgnored map[string]int
}

// PlacementStats reads the current term's store; ok is false on a standby
// or where placement does not run.
func (o *Operator) PlacementStats() (st PlacementStats, ok bool) {
	svc := o.PlacementService()
	if svc == nil {
		return st, false
	}
	snap := svc.Store().Snapshot()
	for range snap.EachNode() {
		st.Nodes++
	}
	st.GPUs, st.HealthyGPU = snap.Capacity("")
	st.FreeGPUs = snap.FreeCount()
	st.Jobs = map[string]int{}
	for _, s := range []store.JobState{store.JobPending, store.JobPlaced, store.JobRejected, store.JobFinished} {
		st.Jobs[string(s)] = len(snap.JobsInState(s))
	}
	st.RebuildIgnored = svc.RebuildIgnored()
	return st, true
}
