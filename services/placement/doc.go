// Package placement decides where each analysed job runs and keeps the GPU
// inventory it decides on.
//
//	topology.node/health ─┐
//	jobs.analyzed ────────┼─► (one lock) strategy on the store ─► reserve in store
//	jobs.finished ────────┘          │                                 │
//	                                 ▼                                 ▼
//	          placement.decided / pending / rejected / released (PubAck awaited)
//
// The store is a projection: at start-up the service replays the topology
// stream and its own placement stream, which is a complete, ordered log of
// every allocation (decided) and release (released), so a restarted replica
// holds exactly the allocations it held before, with no double booking.
//
// Every decision, and its publication, happens under one lock, in the order
// of the placement stream. Reservation happens first, in one store
// transaction that re-checks that every GPU is still free and healthy; if
// the publication then fails, the reservation is rolled back and the input
// is retried, so the stream and the store never disagree.
//
// Pending jobs are retried, highest priority first and oldest first within a
// priority, whenever GPUs are freed or the topology changes. A job that does
// not fit now does not block smaller ones behind it (backfill); the
// reservation rule that stops large jobs from starving comes with the
// topology-aware strategy.
package placement
