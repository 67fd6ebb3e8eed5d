package store

// Health: SetHealth's changes to GPUs, NVLinks and NICs, the health a
// node's new report carries over from its old row, and the effective
// topology (Node.Effective) that down links and NICs leave.

import (
	"cmp"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/internal/topology"
)

// reportedHealthy maps a reported health value to healthy or not: "" and
// "healthy" are healthy, anything else is not.
func reportedHealthy(h string) bool {
	return h == "" || h == events.HealthHealthy
}

// SetHealth applies a health change. Component "gpu" with ID the GPU's index
// (decimal) sets that GPU's health; component "node" sets the health of all
// the node's GPUs. Component "nvlink" with ID "<gpu index>/<link>" marks one
// NVLink of a GPU down or up again, "nic" with ID the NIC's name one NIC:
// the node's effective topology (Node.Effective) and its GPUs' islands and
// PCIe groups are recomputed in the same transaction (see
// topology.Node.WithHealth for what a down link does to a path); the GPUs
// stay free. Any other component is an error, as is an unknown node, GPU or
// NIC, or a malformed NVLink ID. A GPU kept only because a job holds it
// (ReasonMissing, ReasonNodeRemoved) stays unhealthy whatever the report
// says.
func (s *Store) SetHealth(h events.TopologyHealth) error {
	healthy := reportedHealthy(h.Health)
	reason := ""
	if !healthy {
		reason = cmp.Or(h.Reason, h.Health)
	}
	return s.writeTopology(func(w *writer) error {
		txn := w.txn
		raw, err := txn.First(TableNodes, IndexID, h.Node)
		if err != nil {
			return err
		}
		if raw == nil {
			return fmt.Errorf("store: health for unknown node %q", h.Node)
		}
		node := raw.(*Node)
		var targets []*GPU
		switch h.Component {
		case events.ComponentGPU:
			idx, err := strconv.Atoi(h.ID)
			if err != nil {
				return fmt.Errorf("store: health for GPU %q of node %q: GPU id is not an index", h.ID, h.Node)
			}
			g, err := txn.First(TableGPUs, IndexID, h.Node, idx)
			if err != nil {
				return err
			}
			if g == nil {
				return fmt.Errorf("store: health for unknown GPU %s", GPUKey{h.Node, idx})
			}
			targets = []*GPU{g.(*GPU)}
		case events.ComponentNode:
			if targets, err = gpusOfNode(txn, h.Node); err != nil {
				return err
			}
		case events.ComponentNVLink:
			return setNVLinkHealth(w, node, h.ID, healthy)
		case events.ComponentNIC:
			return setNICHealth(w, node, h.ID, healthy)
		default:
			return fmt.Errorf("store: health for unknown component %q of node %q", h.Component, h.Node)
		}
		for _, g := range targets {
			if g.HealthReason == ReasonMissing || g.HealthReason == ReasonNodeRemoved {
				continue
			}
			upd := *g
			upd.Healthy, upd.HealthReason = healthy, reason
			if err := w.putGPU(g, &upd); err != nil {
				return err
			}
		}
		return nil
	})
}

// setNVLinkHealth records one NVLink of a node down or up.
func setNVLinkHealth(w *writer, node *Node, id string, healthy bool) error {
	gpu, link, ok := strings.Cut(id, "/")
	idx, gerr := strconv.Atoi(gpu)
	num, lerr := strconv.Atoi(link)
	if !ok || gerr != nil || lerr != nil || idx < 0 || num < 0 {
		return fmt.Errorf("store: health for NVLink %q of node %q: id is not <gpu index>/<link>", id, node.Name)
	}
	g, err := w.txn.First(TableGPUs, IndexID, node.Name, idx)
	if err != nil {
		return err
	}
	if g == nil {
		return fmt.Errorf("store: health for NVLink %s of unknown GPU %s", id, GPUKey{node.Name, idx})
	}
	l := NVLinkID{GPU: idx, Link: num}
	i, down := slices.BinarySearchFunc(node.DownNVLinks, l, func(a, b NVLinkID) int {
		return cmp.Or(cmp.Compare(a.GPU, b.GPU), cmp.Compare(a.Link, b.Link))
	})
	if down != healthy {
		return nil // as recorded already
	}
	upd := *node
	if healthy {
		upd.DownNVLinks = slices.Delete(slices.Clone(node.DownNVLinks), i, i+1)
	} else {
		upd.DownNVLinks = slices.Insert(slices.Clone(node.DownNVLinks), i, l)
	}
	if len(upd.DownNVLinks) == 0 {
		upd.DownNVLinks = nil
	}
	return w.putNode(&upd)
}

// setNICHealth records one NIC of a node down or up.
func setNICHealth(w *writer, node *Node, name string, healthy bool) error {
	if node.Topology == nil || !slices.ContainsFunc(node.Topology.NICs, func(c topology.NIC) bool { return c.Name == name }) {
		return fmt.Errorf("store: health for unknown NIC %q of node %q", name, node.Name)
	}
	i, down := slices.BinarySearch(node.DownNICs, name)
	if down != healthy {
		return nil
	}
	upd := *node
	if healthy {
		upd.DownNICs = slices.Delete(slices.Clone(node.DownNICs), i, i+1)
	} else {
		upd.DownNICs = slices.Insert(slices.Clone(node.DownNICs), i, name)
	}
	if len(upd.DownNICs) == 0 {
		upd.DownNICs = nil
	}
	return w.putNode(&upd)
}

// putNode writes a node row whose topology or part health changed, with
// its effective topology, and recomputes its GPUs' domains.
func (w *writer) putNode(n *Node) error {
	n.Effective = effective(n)
	n.Links = n.Effective.LinksKey()
	if err := w.txn.Insert(TableNodes, n); err != nil {
		return err
	}
	if err := w.touchNode(n.Name); err != nil {
		return err
	}
	return w.redomain(n)
}

// effective returns the node's topology with its down parts taken out.
func effective(n *Node) *topology.Node {
	t := n.Topology
	if t == nil || (len(n.DownNVLinks) == 0 && len(n.DownNICs) == 0) {
		return t
	}
	var links map[int]int
	for p, g := range t.GPUs {
		for _, l := range n.DownNVLinks {
			if l.GPU == g.Index {
				if links == nil {
					links = map[int]int{}
				}
				links[p]++ // DownNVLinks has no duplicates
			}
		}
	}
	var nics map[int]bool
	for k, c := range t.NICs {
		if _, ok := slices.BinarySearch(n.DownNICs, c.Name); ok {
			if nics == nil {
				nics = map[int]bool{}
			}
			nics[k] = true
		}
	}
	if links == nil && nics == nil {
		return t
	}
	return t.WithHealth(links, nics)
}

// carryHealth returns the down NVLinks and NICs of a node's new row: see
// UpsertNode.
func carryHealth(old *Node, n events.TopologyNode, reported map[int]int, topo *topology.Node) ([]NVLinkID, []string) {
	hasNIC := func(name string) bool {
		return topo != nil && slices.ContainsFunc(topo.NICs, func(c topology.NIC) bool { return c.Name == name })
	}
	var links []NVLinkID
	var nics []string
	if old != nil {
		if len(old.DownNVLinks) > 0 && reflect.DeepEqual(old.Topology, topo) {
			for _, l := range old.DownNVLinks {
				if _, ok := reported[l.GPU]; ok {
					links = append(links, l)
				}
			}
		}
		for _, name := range old.DownNICs {
			if hasNIC(name) {
				nics = append(nics, name)
			}
		}
	}
	if topo != nil {
		for _, c := range n.NICs {
			switch {
			case c.Health == "":
			case reportedHealthy(c.Health):
				nics = slices.DeleteFunc(nics, func(name string) bool { return name == c.Name })
			case !slices.Contains(nics, c.Name):
				nics = append(nics, c.Name)
			}
		}
	}
	slices.Sort(nics)
	if len(nics) == 0 {
		nics = nil
	}
	return links, nics
}
