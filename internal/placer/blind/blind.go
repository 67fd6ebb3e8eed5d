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
	"github.com/toposched/toposched/internal/placer/engine"
	"github.com/toposched/toposched/internal/placer/outcome"
	"github.com/toposched/toposched/internal/store"
)

// Name is the strategy's name, as recorded in PlacementDecided.Strategy.
const Name = "blind"

// Place decides where job goes on snap, first fit in enumeration order.
//
// outcome.Never, with every reason that applies: a model is asked for and the
// cluster has no GPU of it; more GPUs than the cluster's healthy GPUs of the
// model; more GPUs per node than the largest node has of the model;
// gpus_per_node not dividing gpus; fewer nodes with gpus_per_node healthy
// GPUs of the model than gpus/gpus_per_node. Reasons that only restate
// another are left out: with an unknown model the capacity reasons are
// implied, and not_enough_nodes is implied by exceeds_node_size and
// meaningless without a divisor.
//
// Otherwise it takes, in enumeration order of nodes and index order of
// GPUs, free healthy GPUs of the model until it has gpus of them; with
// gpus_per_node it takes the first gpus_per_node free GPUs of each node that
// has that many, until it has gpus/gpus_per_node nodes. outcome.Placed if that
// works, else outcome.Wait.
//
// Place is deterministic (the same snapshot gives the same result). It
// does not walk the cluster: the counts behind its reasons are the store's
// (the cluster domain's, and its node counts by model), and the first fit
// is a walk of the store's free GPUs (or of its nodes with enough free
// GPUs) in enumeration order that stops at the job's size, so it costs
// O(gpus) index steps however large the cluster.
func Place(snap *store.Snapshot, job events.JobAnalyzed) outcome.Result {
	return PlaceOn(snap, job, nil)
}

// PlaceOn is Place on the nodes keep keeps. The reasons to reject (Never)
// are the whole cluster's, as Place's, since a node filter changes with
// time and policies; a job the cluster could hold now but the kept nodes
// cannot waits. With keep nil it is Place: nodes are walked only when a
// filter must be asked of them.
func PlaceOn(snap *store.Snapshot, job events.JobAnalyzed, keep engine.Keep) outcome.Result {
	n, gpn, model := job.Job.GPUs, job.Job.GPUsPerNode, job.Job.GPUModel

	var invalid []events.Reason
	if n <= 0 {
		invalid = append(invalid, events.Reason{Code: outcome.CodeInvalidGPUs, Field: outcome.FieldGPUs,
			Message: fmt.Sprintf("job asks for %d GPUs; it needs at least 1", n)})
	}
	if gpn < 0 {
		invalid = append(invalid, events.Reason{Code: outcome.CodeInvalidGPUsPerNode, Field: outcome.FieldGPUsPerNode,
			Message: fmt.Sprintf("gpus_per_node is %d; it must be positive or left out", gpn)})
	}
	if len(invalid) > 0 {
		return outcome.Result{Verdict: outcome.Never, Reasons: invalid}
	}

	of := ""
	if model != "" {
		of = " of model " + model
	}
	if never := neverFits(snap, n, gpn, model, of); len(never) > 0 {
		return outcome.Result{Verdict: outcome.Never, Reasons: never}
	}

	// outcome.Wait.
	if gpn > 0 {
		if freeNodes := snap.NodeCounts(model).FreeAtLeast(gpn); freeNodes < n/gpn {
			return outcome.Result{Verdict: outcome.Wait, Reasons: []events.Reason{{Code: outcome.CodeInsufficientFreeNodes, Field: outcome.FieldGPUsPerNode,
				Message: fmt.Sprintf("needs %s with %d free GPUs%s each, %d such nodes now", nodes(n/gpn), gpn, of, freeNodes)}}}
		}
	}
	if gpn == 0 {
		cluster, _ := snap.Domain(store.ClusterDomain)
		if free := cluster.Count(model).Free; free < n {
			return outcome.Result{Verdict: outcome.Wait, Reasons: []events.Reason{{Code: outcome.CodeInsufficientFreeGPUs, Field: outcome.FieldGPUs,
				Message: fmt.Sprintf("needs %d free GPUs%s, %d free now", n, of, free)}}}
		}
	}

	// outcome.Placed: first fit.
	if keep != nil {
		return takeKept(snap, n, gpn, model, of, keep)
	}
	return firstFit(snap, n, gpn, model, of)
}

// neverFits lists every reason the job can never fit on the cluster as
// it is (PlaceOn), from the counts a walk of every node would give: a
// GPU's model is its own, or its node's when it has none, as the store
// records it. of names the model for the messages.
func neverFits(snap *store.Snapshot, n, gpn int, model, of string) []events.Reason {
	cluster, _ := snap.Domain(store.ClusterDomain)
	c := cluster.Count(model)
	total, healthy := c.Total, c.Healthy
	nc := snap.NodeCounts(model)
	maxPerNode := nc.MaxTotal() // most GPUs of the model on one node
	var healthyNodes int
	if gpn > 0 {
		healthyNodes = nc.HealthyAtLeast(gpn) // nodes with >= gpn healthy GPUs of the model
	}
	var never []events.Reason
	if model != "" && total == 0 {
		never = append(never, events.Reason{Code: outcome.CodeUnknownGPUModel, Field: outcome.FieldGPUModel,
			Message: fmt.Sprintf("the cluster has no GPU of model %s", model)})
	}
	if gpn > 0 && n%gpn != 0 {
		never = append(never, events.Reason{Code: outcome.CodeGPUsPerNodeNotDivisor, Field: outcome.FieldGPUsPerNode,
			Message: fmt.Sprintf("gpus_per_node %d does not divide gpus %d", gpn, n)})
	}
	if model == "" || total > 0 {
		if n > healthy {
			never = append(never, events.Reason{Code: outcome.CodeExceedsCluster, Field: outcome.FieldGPUs,
				Message: fmt.Sprintf("job asks for %d GPUs; the cluster has %d healthy GPUs%s", n, healthy, of)})
		}
		tooBig := gpn > maxPerNode
		if tooBig {
			never = append(never, events.Reason{Code: outcome.CodeExceedsNodeSize, Field: outcome.FieldGPUsPerNode,
				Message: fmt.Sprintf("job asks for %d GPUs per node; the largest node has %d GPUs%s", gpn, maxPerNode, of)})
		}
		if gpn > 0 && !tooBig && n%gpn == 0 && healthyNodes < n/gpn {
			never = append(never, events.Reason{Code: outcome.CodeNotEnoughNodes, Field: outcome.FieldGPUsPerNode,
				Message: fmt.Sprintf("job needs %s with %d healthy GPUs%s each; the cluster has %d",
					nodes(n/gpn), gpn, of, healthyNodes)})
		}
	}
	return never
}

// firstFit takes the first free GPUs of the model in enumeration order,
// or with gpn the first gpn of each node that has that many, once the
// counts have said there is room.
func firstFit(snap *store.Snapshot, n, gpn int, model, of string) outcome.Result {
	taken := make([]store.GPUKey, 0, n)
	if gpn == 0 {
		for g := range snap.EachFreeGPUIn(store.ClusterDomain, model) {
			taken = append(taken, g.Key())
			if len(taken) == n {
				break
			}
		}
	} else {
	nodes:
		for d := range snap.NodesWithFree(model, gpn) {
			k := 0
			for g := range snap.EachGPU(d.Node) {
				if g.Free() && (model == "" || g.Model == model) {
					taken = append(taken, g.Key())
					if k++; k == gpn {
						break
					}
				}
			}
			if len(taken) == n {
				break nodes
			}
		}
	}
	if len(taken) < n {
		// The counts said there was room: they and the walks read one
		// snapshot, so this is a store bug. outcome.Wait rather than place wrong.
		return outcome.Result{Verdict: outcome.Wait, Reasons: []events.Reason{{Code: outcome.CodeInsufficientFreeGPUs, Field: outcome.FieldGPUs,
			Message: fmt.Sprintf("needs %d free GPUs%s, %d found now", n, of, len(taken))}}}
	}
	return outcome.Result{Verdict: outcome.Placed, GPUs: taken}
}

// takeKept is Place's first fit over the nodes keep keeps, in enumeration
// order, each node's free GPUs by index.
func takeKept(snap *store.Snapshot, n, gpn int, model, of string, keep engine.Keep) outcome.Result {
	taken := make([]store.GPUKey, 0, n)
	nodesKept := 0
	for node, free := range snap.EachNodeFree(model) {
		if (gpn > 0 && len(free) < gpn) || !keep(node, free) {
			continue
		}
		k := min(len(free), n-len(taken))
		if gpn > 0 {
			k = gpn
			nodesKept++
		}
		for _, g := range free[:k] {
			taken = append(taken, g.Key())
		}
		if len(taken) == n {
			return outcome.Result{Verdict: outcome.Placed, GPUs: taken}
		}
	}
	if gpn > 0 {
		return outcome.Result{Verdict: outcome.Wait, Reasons: []events.Reason{{Code: outcome.CodeInsufficientFreeNodes, Field: outcome.FieldGPUsPerNode,
			Message: fmt.Sprintf("needs %s with %d free GPUs%s each, %d such nodes now that the node policies and any reservation allow", nodes(n/gpn), gpn, of, nodesKept)}}}
	}
	return outcome.Result{Verdict: outcome.Wait, Reasons: []events.Reason{{Code: outcome.CodeInsufficientFreeGPUs, Field: outcome.FieldGPUs,
		Message: fmt.Sprintf("needs %d free GPUs%s, %d free now on the nodes the node policies and any reservation allow", n, of, len(taken))}}}
}

// nodes says "1 node" or "n nodes".
func nodes(n int) string {
	if n == 1 {
		return "1 node"
	}
	return fmt.Sprintf("%d nodes", n)
}
