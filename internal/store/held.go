package store

import (
	"fmt"

	"github.com/toposched/toposched/events"
)

// SetHeld applies a node's topology.held report: the GPUs it lists are
// held outside toposched (not free, so never placed on), every other GPU
// of the node is not. A GPU that a toposched job holds as well keeps its
// job; the two are the Kubernetes service's to reconcile, not the store's.
// An index the node does not have is an error, and nothing is applied.
func (s *Store) SetHeld(h events.TopologyHeld) error {
	by := make(map[int]string, len(h.GPUs))
	for _, g := range h.GPUs {
		by[g.Index] = g.By
	}
	return s.writeTopology(func(w *writer) error {
		raw, err := w.txn.First(TableNodes, IndexID, h.Node)
		if err != nil {
			return err
		}
		if raw == nil {
			return fmt.Errorf("store: held GPUs of unknown node %q", h.Node)
		}
		gpus, err := gpusOfNode(w.txn, h.Node)
		if err != nil {
			return err
		}
		have := make(map[int]bool, len(gpus))
		for _, g := range gpus {
			have[g.Index] = true
			holder := by[g.Index]
			if g.HeldBy == holder {
				continue
			}
			upd := *g
			upd.HeldBy = holder
			if err := w.putGPU(g, &upd); err != nil {
				return err
			}
		}
		for _, g := range h.GPUs {
			if !have[g.Index] {
				return fmt.Errorf("store: held GPU %s: the node has no such GPU", GPUKey{h.Node, g.Index})
			}
		}
		return nil
	})
}
