package outcome

import (
	"strconv"
	"strings"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/internal/store"
)

// Decide turns an ordered GPU list into a placement decision: rank i runs on
// gpus[i], and its local rank is its index among the ranks on the same node.
// Nodes are listed in order of first appearance, each with its GPUs in rank
// order, so that with CUDA_VISIBLE_DEVICES set to CUDAVisibleDevices the
// process of local rank r uses device r. DecidedAt is left zero: the caller
// stamps it. Decide does not check gpus (a GPU listed twice gets two ranks);
// any strategy may use it.
func Decide(jobID string, gpus []store.GPUKey, strategy string) events.PlacementDecided {
	d := events.PlacementDecided{
		JobID:    jobID,
		Strategy: strategy,
		Ranks:    make([]events.RankPlacement, len(gpus)),
		Nodes:    []events.NodePlacement{},
	}
	at := make(map[string]int) // node -> index in d.Nodes
	for i, g := range gpus {
		j, ok := at[g.Node]
		if !ok {
			j = len(d.Nodes)
			at[g.Node] = j
			d.Nodes = append(d.Nodes, events.NodePlacement{Node: g.Node})
		}
		np := &d.Nodes[j]
		d.Ranks[i] = events.RankPlacement{Rank: i, Node: g.Node, GPU: g.Index, LocalRank: len(np.GPUs)}
		np.GPUs = append(np.GPUs, g.Index)
	}
	var b strings.Builder
	for i := range d.Nodes {
		b.Reset()
		for k, idx := range d.Nodes[i].GPUs {
			if k > 0 {
				b.WriteByte(',')
			}
			b.WriteString(strconv.Itoa(idx))
		}
		d.Nodes[i].CUDAVisibleDevices = b.String()
	}
	return d
}
