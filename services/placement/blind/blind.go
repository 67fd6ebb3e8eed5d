// Package blind is the topology-blind first-fit placement strategy: the
// baseline every later strategy is measured against.
//
// It fills nodes in enumeration order (the order of the cluster file) and
// each node's GPUs in index order, taking the first free healthy GPUs of the
// requested model, blind to NVLink, PCIe and the network fabric. It is kept
// as a named strategy (Name), not a placeholder: benchmarks and operators
// select it to compare topology-aware strategies against what a naive
// scheduler would do.
package blind

import (
	"fmt"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/services/internal/store"
)

// Name is the strategy's name, as recorded in PlacementDecided.Strategy.
const Name = "blind"

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
)

// Fields blamed by the reasons (JSON paths of events.JobSubmitted within
// the job).
const (
	FieldGPUs        = "gpus"
	FieldGPUsPerNode = "gpus_per_node"
	FieldGPUModel    = "gpu_model"
)

// Result is the outcome of Place.
type Result struct {
	Verdict Verdict
	// GPUs are the chosen GPUs in rank order (rank i on GPUs[i]); set only
	// when Placed.
	GPUs []store.GPUKey
	// Reasons explain Wait and Never; Never lists every reason that
	// applies.
	Reasons []events.Reason
}

// Place decides where job goes on snap, first fit in enumeration order.
//
// Never, with every reason that applies: a model is asked for and the
// cluster has no GPU of it; more GPUs than the cluster's healthy GPUs of the
// model; more GPUs per node than the largest node has of the model;
// gpus_per_node not dividing gpus; fewer nodes with gpus_per_node healthy
// GPUs of the model than gpus/gpus_per_node. Reasons that only restate
// another are left out: with an unknown model the capacity reasons are
// implied, and not_enough_nodes is implied by exceeds_node_size and
// meaningless without a divisor.
//
// Otherwise it walks nodes in enumeration order and GPUs in index order,
// taking free healthy GPUs of the model until it has gpus of them; with
// gpus_per_node it takes the first gpus_per_node free GPUs of each node that
// has that many, until it has gpus/gpus_per_node nodes. Placed if that
// works, else Wait.
//
// Place is deterministic (the same snapshot gives the same result) and
// takes O(nodes + GPUs) time in one pass over the snapshot.
func Place(snap *store.Snapshot, job events.JobAnalyzed) Result {
	n, gpn, model := job.Job.GPUs, job.Job.GPUsPerNode, job.Job.GPUModel

	var invalid []events.Reason
	if n <= 0 {
		invalid = append(invalid, events.Reason{Code: CodeInvalidGPUs, Field: FieldGPUs,
			Message: fmt.Sprintf("job asks for %d GPUs; it needs at least 1", n)})
	}
	if gpn < 0 {
		invalid = append(invalid, events.Reason{Code: CodeInvalidGPUsPerNode, Field: FieldGPUsPerNode,
			Message: fmt.Sprintf("gpus_per_node is %d; it must be positive or left out", gpn)})
	}
	if len(invalid) > 0 {
		return Result{Verdict: Never, Reasons: invalid}
	}

	var (
		total, healthy int // GPUs of the model in the cluster
		free           int // free GPUs of the model in the cluster
		maxPerNode     int // most GPUs of the model on one node
		healthyNodes   int // nodes with >= gpn healthy GPUs of the model
		freeNodes      int // nodes with >= gpn free GPUs of the model
		taken          = make([]store.GPUKey, 0, min(n, 1024))
		nodeFree       []int // free GPU indices of the current node; reused
	)
	need := n
	if gpn > 0 {
		need = n / gpn * gpn // with a bad divisor nothing is placed anyway
	}
	for node, gpus := range snap.EachNodeWithGPUs() {
		nodeTotal, nodeHealthy := 0, 0
		nodeFree = nodeFree[:0]
		for _, g := range gpus {
			if model != "" {
				m := g.Model
				if m == "" {
					m = node.GPUModel
				}
				if m != model {
					continue
				}
			}
			nodeTotal++
			if !g.Healthy {
				continue
			}
			nodeHealthy++
			if g.JobID != "" {
				continue
			}
			free++
			if gpn == 0 {
				if len(taken) < need {
					taken = append(taken, store.GPUKey{Node: node.Name, Index: g.Index})
				}
			} else if len(nodeFree) < gpn {
				nodeFree = append(nodeFree, g.Index)
			}
		}
		total += nodeTotal
		healthy += nodeHealthy
		maxPerNode = max(maxPerNode, nodeTotal)
		if gpn > 0 {
			if nodeHealthy >= gpn {
				healthyNodes++
			}
			if len(nodeFree) == gpn {
				freeNodes++
				if len(taken) < need {
					for _, idx := range nodeFree {
						taken = append(taken, store.GPUKey{Node: node.Name, Index: idx})
					}
				}
			}
		}
	}

	// Never.
	var never []events.Reason
	of := ""
	if model != "" {
		of = " of model " + model
	}
	if model != "" && total == 0 {
		never = append(never, events.Reason{Code: CodeUnknownGPUModel, Field: FieldGPUModel,
			Message: fmt.Sprintf("the cluster has no GPU of model %s", model)})
	}
	if gpn > 0 && n%gpn != 0 {
		never = append(never, events.Reason{Code: CodeGPUsPerNodeNotDivisor, Field: FieldGPUsPerNode,
			Message: fmt.Sprintf("gpus_per_node %d does not divide gpus %d", gpn, n)})
	}
	if model == "" || total > 0 {
		if n > healthy {
			never = append(never, events.Reason{Code: CodeExceedsCluster, Field: FieldGPUs,
				Message: fmt.Sprintf("job asks for %d GPUs; the cluster has %d healthy GPUs%s", n, healthy, of)})
		}
		tooBig := gpn > maxPerNode
		if tooBig {
			never = append(never, events.Reason{Code: CodeExceedsNodeSize, Field: FieldGPUsPerNode,
				Message: fmt.Sprintf("job asks for %d GPUs per node; the largest node has %d GPUs%s", gpn, maxPerNode, of)})
		}
		if gpn > 0 && !tooBig && n%gpn == 0 && healthyNodes < n/gpn {
			never = append(never, events.Reason{Code: CodeNotEnoughNodes, Field: FieldGPUsPerNode,
				Message: fmt.Sprintf("job needs %s with %d healthy GPUs%s each; the cluster has %d",
					nodes(n/gpn), gpn, of, healthyNodes)})
		}
	}
	if len(never) > 0 {
		return Result{Verdict: Never, Reasons: never}
	}

	// Wait or Placed.
	if len(taken) < n {
		if gpn > 0 {
			return Result{Verdict: Wait, Reasons: []events.Reason{{Code: CodeInsufficientFreeNodes, Field: FieldGPUsPerNode,
				Message: fmt.Sprintf("needs %s with %d free GPUs%s each, %d such nodes now", nodes(n/gpn), gpn, of, freeNodes)}}}
		}
		return Result{Verdict: Wait, Reasons: []events.Reason{{Code: CodeInsufficientFreeGPUs, Field: FieldGPUs,
			Message: fmt.Sprintf("needs %d free GPUs%s, %d free now", n, of, free)}}}
	}
	return Result{Verdict: Placed, GPUs: taken}
}

// nodes says "1 node" or "n nodes".
func nodes(n int) string {
	if n == 1 {
		return "1 node"
	}
	return fmt.Sprintf("%d nodes", n)
}
