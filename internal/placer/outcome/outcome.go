// Package outcome is the placement engine's vocabulary: what a strategy
// answers for a job (Verdict, Result and the reason codes it blames) and
// how an ordered GPU list becomes a placement decision (Decide). Every
// strategy, the planner, the placement service, the optimizer and the
// harnesses speak it; it imports nothing of theirs.
package outcome

import (
	"fmt"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/internal/store"
)

// Verdict is the outcome of a placement attempt.
type Verdict int

// Verdicts. The zero Verdict is none of them.
const (
	// Placed: Result.GPUs holds the job's GPUs, in rank order.
	Placed Verdict = iota + 1
	// Wait: no room now; the job may fit once GPUs free up or heal.
	Wait
	// Never: the job can never fit on the cluster as it is.
	Never
)

func (v Verdict) String() string {
	switch v {
	case Placed:
		return "placed"
	case Wait:
		return "wait"
	case Never:
		return "never"
	}
	return fmt.Sprintf("Verdict(%d)", int(v))
}

// Reason codes.
const (
	CodeInvalidGPUs           = "invalid_gpus"
	CodeInvalidGPUsPerNode    = "invalid_gpus_per_node"
	CodeUnknownGPUModel       = "unknown_gpu_model"
	CodeExceedsCluster        = "exceeds_cluster_capacity"
	CodeExceedsNodeSize       = "exceeds_node_size"
	CodeGPUsPerNodeNotDivisor = "gpus_per_node_not_divisor"
	CodeNotEnoughNodes        = "not_enough_nodes"
	CodeInsufficientFreeGPUs  = "insufficient_free_gpus"
	CodeInsufficientFreeNodes = "insufficient_free_nodes"
	// CodeDecisionTooLarge: the job fits, but its placement.decided
	// (every rank listed, even without its explanation and per-node NCCL
	// topology files) is over one message.
	CodeDecisionTooLarge = "decision_too_large"
)

// Fields blamed by the reasons (JSON paths of events.JobSubmitted within
// the job).
const (
	FieldGPUs        = "gpus"
	FieldGPUsPerNode = "gpus_per_node"
	FieldGPUModel    = "gpu_model"
)

// Result is what a strategy decided for one job.
type Result struct {
	Verdict Verdict
	// GPUs are the chosen GPUs in rank order (rank i on GPUs[i]); set only
	// when Placed.
	GPUs []store.GPUKey
	// Reasons explain Wait and Never; Never lists every reason that
	// applies.
	Reasons []events.Reason
}
