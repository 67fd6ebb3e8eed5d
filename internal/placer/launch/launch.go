// Package launch completes a placement decision with what launchers need
// to start it without reading anything else: each rank's GPU UUID, NUMA
// node and nearest NIC; per node torchrun arguments, Slurm's --gpu-bind
// and an NCCL topology XML; the rendezvous (rank 0's node and a port of
// the job's own there); and an Open MPI rankfile and Slurm nodelist.
//
// torchrun and Slurm's block distribution number ranks node by node, so
// their arguments are given only when the decision's ranks are contiguous,
// equal blocks per node; the rankfile expresses any mapping.
package launch

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/internal/formats/ncclxml"
	"github.com/toposched/toposched/internal/store"
	"github.com/toposched/toposched/internal/topology"
)

// Rendezvous ports: a job's is MasterPortBase plus the index of rank 0's
// GPU (modulo MasterPorts). A GPU holds one job at a time, so two jobs
// running with rank 0 on one node never share a port (short of nodes with
// more than MasterPorts GPUs); a released job's port is the next one's on
// that GPU, and the port follows from the decision alone: a decision
// replayed, sent again or made by a dry run has the same, at no cost to
// the placement cycle. torchrun's default is the base, rank 0 on GPU 0.
const (
	MasterPortBase = 29500
	MasterPorts    = 1024
)

// MasterPort is decision d's rendezvous port: the one it carries, or for
// a decision made before it carried one, the same rule worked out here; 0
// for one without ranks.
func MasterPort(d *events.PlacementDecided) int {
	if d.Launch != nil && d.Launch.MasterPort > 0 {
		return d.Launch.MasterPort
	}
	return portOf(d)
}

// portOf is the rule: the base plus rank 0's GPU index.
func portOf(d *events.PlacementDecided) int {
	for _, r := range d.Ranks {
		if r.Rank == 0 {
			return MasterPortBase + r.GPU%MasterPorts
		}
	}
	return 0
}

// MaxXMLNodes bounds the decisions that carry an NCCL topology XML per
// node: beyond it the event would grow by megabytes for large jobs.
const MaxXMLNodes = 32

// Fill completes d from the store's view of its nodes.
func Fill(d *events.PlacementDecided, snap *store.Snapshot) {
	if len(d.Ranks) == 0 {
		return
	}
	topos := map[string]*topology.Node{}
	uuids := map[store.GPUKey]string{}
	for _, np := range d.Nodes {
		if n, ok := snap.Node(np.Node); ok {
			topos[np.Node] = n.Effective
			if topos[np.Node] == nil {
				topos[np.Node] = n.Topology
			}
		}
		for _, g := range snap.GPUs(np.Node) {
			if g.UUID != "" {
				uuids[g.Key()] = g.UUID
			}
		}
	}
	for i := range d.Ranks {
		r := &d.Ranks[i]
		r.UUID = uuids[store.GPUKey{Node: r.Node, Index: r.GPU}]
		if t := topos[r.Node]; t != nil {
			if pos := position(t, r.GPU); pos >= 0 {
				if numa := t.GPUs[pos].NUMA; numa >= 0 {
					r.NUMA = &numa
				}
				if k := t.NearestNIC(pos); k >= 0 {
					r.NIC = t.NICs[k].Name
				}
			}
		}
	}
	port := portOf(d)
	blocks := contiguousBlocks(d)
	var nodelist []string
	for i := range d.Nodes {
		np := &d.Nodes[i]
		nodelist = append(nodelist, np.Node)
		if blocks {
			np.Torchrun = []string{
				"--nnodes=" + strconv.Itoa(len(d.Nodes)),
				"--node_rank=" + strconv.Itoa(i),
				"--nproc_per_node=" + strconv.Itoa(len(np.GPUs)),
				"--master_addr=" + d.Ranks[0].Node,
				"--master_port=" + strconv.Itoa(port),
			}
		}
		np.SlurmGPUBind = "map_gpu:" + np.CUDAVisibleDevices
		if t := topos[np.Node]; t != nil && t.GPUPaths != nil && len(d.Nodes) <= MaxXMLNodes {
			var pos []int
			for _, g := range np.GPUs {
				if p := position(t, g); p >= 0 {
					pos = append(pos, p)
				}
			}
			if xml, err := ncclxml.Export(t, pos); err == nil {
				np.NCCLTopoXML = string(xml)
			}
		}
	}
	var rf strings.Builder
	for _, r := range d.Ranks {
		fmt.Fprintf(&rf, "rank %d=%s slot=%d\n", r.Rank, r.Node, r.LocalRank)
	}
	d.Launch = &events.Launch{
		MasterAddr:    d.Ranks[0].Node,
		MasterPort:    port,
		SlurmNodelist: strings.Join(nodelist, ","),
		MPIRankfile:   rf.String(),
	}
}

// position finds GPU index idx among a topology's GPUs.
func position(t *topology.Node, idx int) int {
	for i, g := range t.GPUs {
		if g.Index == idx {
			return i
		}
	}
	return -1
}

// contiguousBlocks reports whether ranks run node by node in equal blocks,
// local rank by local rank: the numbering torchrun and srun use.
func contiguousBlocks(d *events.PlacementDecided) bool {
	per := len(d.Nodes[0].GPUs)
	for _, np := range d.Nodes {
		if len(np.GPUs) != per {
			return false
		}
	}
	for i, r := range d.Ranks {
		if d.Nodes[i/per].Node != r.Node || r.LocalRank != i%per {
			return false
		}
	}
	return true
}
