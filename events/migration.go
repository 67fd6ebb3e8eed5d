package events

import "time"

// Migration moves a running job to a better placement. Three events and one
// field carry it:
//
//   - placement.migration: the optimizer proposes a placement for a running
//     job, with what it would gain and what it costs. It is advisory:
//     nothing changes until the user accepts. A newer proposal for the same
//     job supersedes the older ones.
//   - jobs.migration_accepted: the user accepts a job's proposal (the
//     latest, or one by id). Like every catalogue event it is named for the
//     fact it records (jobs.submitted, jobs.finished): the user accepted;
//     placement then applies or refuses.
//   - placement.decided with Migration set: placement applied it. The
//     decision replaces the job's previous one: the GPUs the job kept stay,
//     the new ones were reserved in the same store transaction that freed
//     the ones it left, so no GPU is held twice at any moment.
//   - placement.migration_refused: placement did not apply it (the job no
//     longer runs, the proposal is unknown or superseded, the job has moved
//     since it was made, a target GPU is no longer free and healthy); nothing
//     changed.
//
// # Gain and break-even
//
// Let T be the job's current step time (StepSeconds: measured, where
// telemetry gives it, else the job's step_compute_seconds plus the current
// communication time), g the communication time a step saves
// (GainSecondsPerStep) and R the time a restart costs (RestartCostSeconds:
// checkpoint, teardown, relaunch and reload). Without migrating the job does
// t/T steps in wall time t; migrating it does (t−R)/(T−g). The two are equal
// at
//
//	t = R·T/g = BreakEvenSeconds
//
// so a job that will run longer than BreakEvenSeconds after the decision
// finishes sooner if it migrates. The saving is counted against the
// measured communication time where the proposal rests on telemetry
// (congestion shows only there) and the predicted one otherwise.

// DefaultRestartCostSeconds is the restart cost a proposal assumes when the
// job's spec gives none (JobSubmitted.RestartCostSeconds): five minutes, to
// write a checkpoint, stop, relaunch, rendezvous, initialise NCCL and read
// the checkpoint back, typical of a large job.
const DefaultRestartCostSeconds = 300.0

// Where a proposal's restart cost came from, in
// PlacementMigration.RestartCostSource.
const (
	RestartCostFromJob     = "job"
	RestartCostFromDefault = "default"
)

// Reasons of a proposal, in PlacementMigration.Reason: what the optimizer
// found that a move would fix.
const (
	// MigrationCongestion: another job shares an uplink of the job's
	// placement and its measured communication is well below the predicted.
	MigrationCongestion = "congestion"
	// MigrationLinkDegraded: a link of the placement is degraded or down.
	MigrationLinkDegraded = "link_degraded"
	// MigrationNICAffinity: ranks use NICs far from their GPUs.
	MigrationNICAffinity = "nic_affinity"
	// MigrationBetterPlacement: GPUs freed or a link recovered, and a
	// placement the cost model predicts faster is free now.
	MigrationBetterPlacement = "better_placement"
)

// PlacementMigration proposes moving a running job (placement.migration).
// The proposed placement has the shape of placement.decided's; placement
// applies exactly these GPUs, in this rank order, or refuses.
type PlacementMigration struct {
	JobID string `json:"job_id"`
	// ProposalID names the proposal (unique; the optimizer makes it).
	ProposalID string `json:"proposal_id"`
	// Reason is one of the Migration constants.
	Reason string `json:"reason"`
	// Message says, for people, what was found and what the move does.
	Message string `json:"message"`
	// FindingID is the id of the diagnosis the proposal rests on, where
	// one was published.
	FindingID string `json:"finding_id,omitempty"`
	// CurrentNodes is the job's placement the proposal was made against:
	// a job that has moved since makes the proposal stale.
	CurrentNodes []NodePlacement `json:"current_nodes"`
	// Ranks and Nodes are the proposed placement, as in placement.decided.
	Ranks []RankPlacement `json:"ranks"`
	Nodes []NodePlacement `json:"nodes"`
	// CurrentCommSecondsPerStep is the cost model's prediction for the
	// current placement; MeasuredCommSecondsPerStep what telemetry shows
	// (0: none); ProposedCommSecondsPerStep the prediction for the proposed
	// one.
	CurrentCommSecondsPerStep  float64 `json:"current_comm_seconds_per_step"`
	MeasuredCommSecondsPerStep float64 `json:"measured_comm_seconds_per_step,omitempty"`
	ProposedCommSecondsPerStep float64 `json:"proposed_comm_seconds_per_step"`
	// GainSecondsPerStep is (measured, else current) minus proposed: what
	// each step saves. Where the optimizer weighs compute by GPU model
	// (a compute reference), the job's compute now (measured, else
	// predicted) less its predicted compute on the proposed GPUs is added
	// (Message gives both). Always positive: no gain, no proposal.
	GainSecondsPerStep float64 `json:"gain_seconds_per_step"`
	// StepSeconds is the current step time (see the package comment on
	// break-even).
	StepSeconds float64 `json:"step_seconds"`
	// RestartCostSeconds is what a restart costs: the job's own
	// restart_cost_seconds, else DefaultRestartCostSeconds;
	// RestartCostSource says which.
	RestartCostSeconds float64 `json:"restart_cost_seconds"`
	RestartCostSource  string  `json:"restart_cost_source"`
	// BreakEvenSeconds = RestartCostSeconds × StepSeconds /
	// GainSecondsPerStep: a job running longer than this after the move
	// finishes sooner for it.
	BreakEvenSeconds float64 `json:"break_even_seconds"`
	// ProposedAt is when the optimizer made it.
	ProposedAt time.Time `json:"proposed_at"`
}

// BreakEven is RestartCost × step / gain, the break-even time of a move;
// 0 when there is no gain.
func BreakEven(restartCost, stepSeconds, gainPerStep float64) float64 {
	if gainPerStep <= 0 {
		return 0
	}
	return restartCost * stepSeconds / gainPerStep
}

// JobMigrationAccepted asks placement to apply a job's migration proposal
// (jobs.migration_accepted). Placement answers with a placement.decided
// whose Migration.RequestID is this event's ce-id, or with a
// placement.migration_refused carrying the same RequestID.
type JobMigrationAccepted struct {
	JobID string `json:"job_id"`
	// ProposalID picks a proposal; empty means the job's latest.
	ProposalID string `json:"proposal_id,omitempty"`
}

// Migration, in a placement.decided, says the decision moved a running job.
type Migration struct {
	// ProposalID is the proposal applied.
	ProposalID string `json:"proposal_id"`
	// RequestID is the ce-id of the jobs.migration_accepted that asked.
	RequestID string `json:"request_id"`
	// PreviousNodes is the placement the job left (node, GPUs,
	// CUDA_VISIBLE_DEVICES); GPUs of it missing from the new decision are
	// free from this decision on.
	PreviousNodes []NodePlacement `json:"previous_nodes"`
	// Reason is the proposal's reason.
	Reason string `json:"reason,omitempty"`
}

// Codes of PlacementMigrationRefused's reasons.
const (
	// RefusedJobNotRunning: the job is not placed (finished, waiting,
	// rejected or unknown).
	RefusedJobNotRunning = "job_not_running"
	// RefusedNoProposal: no proposal for the job, or none with that id.
	RefusedNoProposal = "no_proposal"
	// RefusedSuperseded: a newer proposal for the job exists.
	RefusedSuperseded = "proposal_superseded"
	// RefusedPlacementChanged: the job's placement is no longer the one
	// the proposal was made against (it moved, or the proposal was
	// applied already).
	RefusedPlacementChanged = "placement_changed"
	// RefusedInvalid: the proposal does not place every rank of the job
	// exactly once.
	RefusedInvalid = "invalid_proposal"
	// RefusedGPUsUnavailable: a target GPU is gone, unhealthy or held by
	// another job.
	RefusedGPUsUnavailable = "gpus_unavailable"
	// RefusedReserved: a target node is held for an older waiting job.
	RefusedReserved = "reserved_for_older_job"
	// RefusedLaunched: the job names a command, so the node agents run
	// its ranks, and they do not move running ranks: a new decision would
	// free GPUs its ranks still use.
	RefusedLaunched = "launched_by_agents"
)

// PlacementMigrationRefused says placement did not apply a migration
// (placement.migration_refused); the job keeps its placement.
type PlacementMigrationRefused struct {
	JobID string `json:"job_id"`
	// ProposalID is the proposal asked for, or the latest when the request
	// named none; empty when there was none.
	ProposalID string `json:"proposal_id,omitempty"`
	// RequestID is the ce-id of the jobs.migration_accepted refused.
	RequestID string `json:"request_id"`
	// Reasons are every reason found, with the codes above.
	Reasons []Reason `json:"reasons"`
}
