package clusterfile

import (
	"encoding/json"
	"fmt"
	"io"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/internal/topology"
)

// Node returns the node of the cluster with the given name.
func (c Cluster) Node(name string) (events.TopologyNode, error) {
	for _, n := range c.Nodes {
		if n.Name == name {
			return n, nil
		}
	}
	return events.TopologyNode{}, fmt.Errorf("cluster %s has no node %q", c.Name, name)
}

// WriteMatrix prints a node's path matrix in nvidia-smi's shape (with each
// GPU pair's bandwidth when bandwidth is set), or as JSON: gpus, nics,
// matrix.
func WriteMatrix(w io.Writer, ev events.TopologyNode, asJSON, bandwidth bool) error {
	n, err := topology.FromEvent(ev)
	if err != nil {
		return err
	}
	if n.GPUPaths == nil {
		return fmt.Errorf("node %s: its description has no paths between GPUs (give it a model, nvidia_smi or nccl_xml)", ev.Name)
	}
	if asJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(n.JSON())
	}
	var bw *topology.Bandwidths
	if bandwidth {
		bw = topology.DefaultBandwidths()
	}
	return topology.WriteMatrix(w, n, bw)
}
