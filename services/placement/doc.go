// Package placement decides where each analysed job runs and keeps the GPU
// inventory it decides on.
//
//	jobs.analyzed (up to 128 at once) ─► intake ─┐
//	jobs.finished, topology.node/health ─────────┴─► (one lock) decision cycle:
//	    the strategy on one view of the store ─► one store transaction
//	    ─► placement.decided / pending / rejected, sent as decided, their
//	       acknowledgements awaited once per cycle (placement.released:
//	       each awaited)
//
// The store is a projection: at start-up the service replays the topology
// stream and its own placement stream, which is a complete, ordered log of
// every allocation (decided) and release (released), so a restarted replica
// holds exactly the allocations it held before, with no double booking.
//
// Decisions are made in cycles (cycle.go): the jobs that arrived while the
// last cycle ran are decided together, in priority and arrival order,
// against one view of the store that includes the cycle's earlier
// decisions, with their GPUs taken in one store transaction; outcomes are
// sent without waiting, and their acknowledgements awaited when the cycle
// ends (and before a job's pending is sent while it waits for GPUs the
// cycle's decisions took). A message is acked only once its outcome is
// stored. An outcome the stream refuses is undone in the store and its
// input retried; one whose answer never came is sent again under the same
// message id until the stream answers, so the stream and the store never
// disagree and nothing is stored twice. Every cycle, and every other
// handler, runs under one lock, so the placement stream is in the order
// the store changed.
//
// Pending jobs are retried, highest priority first and oldest first within a
// priority, whenever GPUs are freed or the topology changes. A job that does
// not fit now does not block smaller ones behind it (backfill); the
// reservation rule that stops large jobs from starving comes with the
// topology-aware strategy. A busy queue is mostly jobs of a few shapes:
// within one retry, a job identical but for its id to one that still
// waits is not planned again until a job leaves the queue, since nothing
// a plan reads tells them apart (retryPending's twins; not under the
// random strategy nor policies that read a job's id).
package placement
