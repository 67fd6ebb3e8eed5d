package store

// Node reports: UpsertNode writes a node's row and its GPUs' rows from its
// report, and removes a node the report says is gone. How the health of
// its parts carries over is in health.go.

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/internal/topology"
)

// UpsertNode applies a node's report: the node and its GPUs are inserted or
// updated. GPUs keep the job holding them. A GPU missing from the report is
// deleted if free; if a job holds it, it is kept but marked unhealthy
// (ReasonMissing) so nothing new lands on it, and deleted when released. A
// GPU without a model takes the node's. If the report has Removed set, the
// node and its free GPUs are removed; allocated GPUs stay, unhealthy
// (ReasonNodeRemoved), until released.
//
// A report is the node's whole current description, and its parts' health
// follows it as its GPUs' does: a NIC the report marks healthy or
// unhealthy is so, one it says nothing of (Health "") keeps what health
// reports said, and one it no longer lists is forgotten. Down NVLinks are
// kept while the report's topology is the one they were reported against,
// and forgotten when it changes: a source that looks again (NVML counts the
// links that are up) reports the degraded matrix itself, and subtracting
// the down links from it again would count them twice. The GPUs' domains
// are computed from the result in the same transaction.
func (s *Store) UpsertNode(n events.TopologyNode) error {
	if n.Name == "" {
		return errors.New("store: node report without a name")
	}
	reported := make(map[int]int, len(n.GPUs)) // GPU index -> position in n.GPUs
	if !n.Removed {
		for i, g := range n.GPUs {
			if _, dup := reported[g.Index]; dup {
				return fmt.Errorf("store: node %q reports GPU %d twice", n.Name, g.Index)
			}
			reported[g.Index] = i
		}
	}
	var topo *topology.Node
	if !n.Removed && n.GPUPaths != nil {
		t, err := topology.FromEvent(n)
		if err != nil {
			return fmt.Errorf("store: %w", err)
		}
		topo = t
	}
	return s.writeTopology(func(w *writer) error {
		txn := w.txn
		existing, err := gpusOfNode(txn, n.Name)
		if err != nil {
			return err
		}
		if n.Removed {
			return removeNode(w, n.Name, existing)
		}

		var oldNode *Node
		if raw, err := txn.First(TableNodes, IndexID, n.Name); err != nil {
			return err
		} else if raw != nil {
			oldNode = raw.(*Node)
		}
		node := &Node{
			Name:     n.Name,
			Position: n.Position,
			GPUModel: n.GPUModel,
			Labels:   maps.Clone(n.Labels),
			GPUCount: len(n.GPUs),
			Topology: topo,
		}
		node.DownNVLinks, node.DownNICs = carryHealth(oldNode, n, reported, topo)
		node.Effective = effective(node)
		node.Links = node.Effective.LinksKey()
		if oldNode != nil && nodeEqual(oldNode, node) {
			node = oldNode // keep the stored row, and its Effective
		} else if err := txn.Insert(TableNodes, node); err != nil {
			return err
		} else if err := w.touchNode(node.Name); err != nil {
			return err
		}

		// The node's GPU rows as they are to be (olds[i] -> rows[i]): first
		// those that disappeared from the report, then the reported ones.
		var olds, rows []*GPU
		for _, g := range existing {
			if _, ok := reported[g.Index]; ok {
				continue
			}
			if g.JobID == "" {
				if err := w.putGPU(g, nil); err != nil {
					return err
				}
				continue
			}
			upd := *g
			upd.Healthy, upd.HealthReason, upd.NodePosition = false, ReasonMissing, n.Position
			upd.Model = cmp.Or(upd.Model, n.GPUModel) // as for a reported GPU
			olds, rows = append(olds, g), append(rows, &upd)
		}
		// existing is sorted by index; look old ones up by binary search
		// rather than building a second map.
		for _, rg := range n.GPUs {
			var old *GPU
			if i, ok := slices.BinarySearchFunc(existing, rg.Index, func(g *GPU, idx int) int {
				return cmp.Compare(g.Index, idx)
			}); ok {
				old = existing[i]
			}
			upd := &GPU{
				Node:         n.Name,
				Index:        rg.Index,
				UUID:         rg.UUID,
				Model:        cmp.Or(rg.Model, n.GPUModel),
				MemoryMiB:    rg.MemoryMiB,
				Healthy:      reportedHealthy(rg.Health),
				NodePosition: n.Position,
				NUMA:         -1,
			}
			if rg.NUMA != nil && *rg.NUMA >= 0 {
				upd.NUMA = *rg.NUMA
			}
			if !upd.Healthy {
				upd.HealthReason = "node report: " + rg.Health
			}
			if old != nil {
				upd.JobID, upd.HeldBy = old.JobID, old.HeldBy
			}
			olds, rows = append(olds, old), append(rows, upd)
		}
		fabric, err := fabricOf(txn, n.Name)
		if err != nil {
			return err
		}
		doms := nodeDomains(node, rows, fabric)
		for i, ds := range doms {
			rows[i].Domains = ds
			if err := w.putGPU(olds[i], rows[i]); err != nil {
				return err
			}
		}
		return w.setOutside(node.Name, outsideOf(rows, doms))
	})
}

// removeNode deletes a node and its free GPUs, and marks its allocated GPUs
// unhealthy, in no domain.
func removeNode(w *writer, name string, gpus []*GPU) error {
	if _, err := w.txn.DeleteAll(TableNodes, IndexID, name); err != nil {
		return err
	}
	for _, g := range gpus {
		if g.JobID == "" {
			if err := w.putGPU(g, nil); err != nil {
				return err
			}
			continue
		}
		upd := *g
		upd.Healthy, upd.HealthReason, upd.Domains = false, ReasonNodeRemoved, nil
		if err := w.putGPU(g, &upd); err != nil {
			return err
		}
	}
	return nil
}

func nodeEqual(a, b *Node) bool {
	return a.Name == b.Name && a.Position == b.Position && a.GPUModel == b.GPUModel &&
		a.GPUCount == b.GPUCount && maps.Equal(a.Labels, b.Labels) &&
		slices.Equal(a.DownNVLinks, b.DownNVLinks) && slices.Equal(a.DownNICs, b.DownNICs) &&
		reflect.DeepEqual(a.Topology, b.Topology)
}
