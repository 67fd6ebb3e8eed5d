// Package placer decides where a job goes, on a snapshot of the store and
// changing nothing: the Planner runs one of the registered strategies
// (topology-aware, the blind baseline and the peers) under the policies in
// force, with the queue's two rules: the Reservation that keeps a starving
// head from being passed over for ever, and Compact, which keeps a
// topology-aware job spread over nodes from starting far slower than its
// Ideals placement. It also holds the predictions decisions carry and
// the dry run. The placement service commits what the Planner plans.
package placer
