package aware

// Stage 3b, after the local search: a job spread over nodes gets, node by
// node, the node-level optimum of its share with the other nodes' GPUs
// fixed (exactShares), where that is affordable.

import (
	"math"
	"slices"

	"github.com/toposched/toposched/internal/store"
)

// sharesMaxGPUs is the largest job whose shares are chosen exactly: an
// evaluation of a larger job costs more than the choice can repay, and
// the nodes of large jobs are usually taken whole.
const sharesMaxGPUs = 16

// exactShares makes each node's share of a job over several nodes (the
// GPUs of its ranks there, and which rank gets which) the one the cost
// model scores fastest with the other nodes' GPUs as they are: every
// order of as many of the node's free GPUs on those ranks, twins once
// (twins here also have the same path to every NIC, since the share's
// traffic leaves the node), node after node in the order of their first
// rank, while the choices fit in a quarter of Options.NodeExact. A change
// is kept only when faster by 0.5%. t is gpus' predicted time (NaN:
// unknown).
func (p *placer) exactShares(gpus []store.GPUKey, t float64) ([]store.GPUKey, float64) {
	if len(gpus) > sharesMaxGPUs || len(p.e.groups) == 0 {
		return gpus, t
	}
	var order []string
	pos := map[string][]int{}
	for i, g := range gpus {
		if _, ok := pos[g.Node]; !ok {
			order = append(order, g.Node)
		}
		pos[g.Node] = append(pos[g.Node], i)
	}
	if len(order) < 2 {
		return gpus, t
	}
	nodes := map[string]*candNode{}
	for _, c := range p.cands {
		if _, ok := pos[c.node.Name]; ok {
			nodes[c.node.Name] = c
		}
	}
	budget := float64(nodeExact(p.opts) / 4)
	if math.IsNaN(t) {
		t = p.e.cost(gpus)
	}
	cur := gpus
	for _, name := range order {
		c := nodes[name]
		if c == nil {
			continue
		}
		nt, err := p.e.res.node(name)
		if err != nil || len(nt.topo.GPUPaths) == 0 {
			continue
		}
		ranks := pos[name]
		class, _ := twins(nt, c.free, p.holes(c))
		class, sizes := splitByNIC(nt, c.free, class)
		count := canonicalOrders(sizes, len(ranks))
		if count <= 1 || count > budget {
			continue
		}
		budget -= count
		trial := slices.Clone(cur)
		var best []store.GPUKey
		bestT := t
		eachTwinOrder(class, len(ranks), func(at []int) {
			for j, i := range at {
				trial[ranks[j]] = c.free[i].Key()
			}
			if tt := p.e.cost(trial); tt < bestT*(1-0.005) {
				best, bestT = append(best[:0], trial...), tt
			}
		})
		if best != nil {
			cur, t = best, bestT
		}
	}
	return cur, t
}

// splitByNIC refines twin classes so that twins also share their path to
// every NIC of the node; sizes counts the new classes.
func splitByNIC(nt *nodeTopo, free []store.FreeGPU, class []int) ([]int, []int) {
	return classify(len(class), func(a, b int) bool {
		if class[a] != class[b] {
			return false
		}
		if len(nt.topo.NICPaths) == 0 {
			return true
		}
		return slices.Equal(nt.topo.NICPaths[nt.pos[free[a].Index]], nt.topo.NICPaths[nt.pos[free[b].Index]])
	})
}
