package collective

import (
	"fmt"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/internal/topology"
)

// PredictNode predicts a collective on some GPUs (by position; all when
// none is given) of one node given as its topology.node event.
func PredictNode(ev events.TopologyNode, gpus []int, c Collective, bytes float64, opt Options) (Result, error) {
	n, err := topology.FromEvent(ev)
	if err != nil {
		return Result{}, err
	}
	for _, g := range gpus {
		if g < 0 || g >= len(n.GPUs) {
			return Result{}, fmt.Errorf("GPU %d: the node has GPUs 0 to %d", g, len(n.GPUs)-1)
		}
	}
	return Predict(Placement{Ranks: NodeRanks(n, gpus...), Bandwidths: opt.Bandwidths}, c, bytes, opt)
}

// PredictCluster predicts a collective on the first gpusPerNode GPUs of
// each of the given nodes, across the fabric (no switches: one
// non-blocking leaf).
func PredictCluster(nodes []events.TopologyNode, fabric events.TopologyFabric, gpusPerNode int, c Collective, bytes float64, opt Options) (Result, error) {
	var ns []*topology.Node
	for _, ev := range nodes {
		n, err := topology.FromEvent(ev)
		if err != nil {
			return Result{}, fmt.Errorf("node %q: %w", ev.Name, err)
		}
		if len(n.GPUs) < gpusPerNode {
			return Result{}, fmt.Errorf("node %q has %d GPUs, %d asked per node", ev.Name, len(n.GPUs), gpusPerNode)
		}
		ns = append(ns, n)
	}
	p := Placement{Ranks: NodesRanks(ns, gpusPerNode), Bandwidths: opt.Bandwidths}
	if len(fabric.Switches) > 0 {
		f, err := topology.NewFabric(fabric)
		if err != nil {
			return Result{}, err
		}
		p.Fabric = f
	}
	return Predict(p, c, bytes, opt)
}
