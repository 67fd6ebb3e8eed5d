package kube

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/toposched/toposched/events"
)

// The fabric from node labels: where no cluster file describes the
// switches, the labels a cluster's provisioning puts on its nodes (zone,
// block, rack) make the tree, and NVIDIA's GPU feature discovery's
// nvidia.com/gpu.clique the multi-node NVLink domains (GB200 NVL72).

// FabricCluster names the fabric this service publishes, so that it can
// tell its own from one a cluster file gave.
const FabricCluster = "kubernetes-node-labels"

// DefaultFabricLabels are the node labels of the fabric's levels, the
// widest first: the zone, then the block and the rack that provisioning
// tools label (set others with Config.FabricLabels).
var DefaultFabricLabels = []string{"topology.kubernetes.io/zone", "toposched.io/block", "toposched.io/rack"}

// LabelGPUClique is NVIDIA GPU feature discovery's label of a node's
// NVLink domain, "<cluster uuid>.<clique id>".
const LabelGPUClique = "nvidia.com/gpu.clique"

// fabricKey is the fabric work item.
const fabricKey = "fabric/"

// labelFabric builds the switch tree the nodes' labels describe: each
// node sits under a leaf named by the path of its label values (the
// finest level a leaf, the next a spine, the wider ones cores), and nodes
// of one clique share an NVLink domain. ok is false when no node has any
// of the labels.
func labelFabric(nodes []*corev1.Node, levels []string) (events.TopologyFabric, bool) {
	f := events.TopologyFabric{Cluster: FabricCluster}
	switches := map[string]*events.Switch{}
	var order []string
	get := func(name, tier string) *events.Switch {
		sw, ok := switches[name]
		if !ok {
			sw = &events.Switch{Name: name, Tier: tier}
			switches[name] = sw
			order = append(order, name)
		}
		return sw
	}
	found := false
	sorted := slices.Clone(nodes)
	slices.SortFunc(sorted, func(a, b *corev1.Node) int { return strings.Compare(a.Name, b.Name) })
	for _, n := range sorted {
		if c := n.Labels[LabelGPUClique]; c != "" {
			found = true
			sw := get("clique:"+c, "nvlink")
			sw.Nodes = append(sw.Nodes, n.Name)
		}
		// A level a node lacks is "-", so that every leaf is at the
		// finest level: a node without a rack label sits under the
		// leaf "<zone>/<block>/-" beside its block's racks.
		path := make([]string, len(levels))
		labelled := false
		for i, l := range levels {
			path[i] = "-"
			if v := n.Labels[l]; v != "" {
				path[i], labelled = v, true
			}
		}
		if !labelled {
			continue
		}
		found = true
		// The widest levels are cores, the finest a leaf, the one above
		// it a spine: the tiers the cost model knows.
		var parent *events.Switch
		for i := range path {
			name := strings.Join(path[:i+1], "/")
			tier := "core"
			switch len(path) - 1 - i {
			case 0:
				tier = "leaf"
			case 1:
				tier = "spine"
			}
			sw := get(name, tier)
			if parent != nil && !slices.Contains(parent.Switches, name) {
				parent.Switches = append(parent.Switches, name)
			}
			parent = sw
		}
		parent.Nodes = append(parent.Nodes, n.Name)
	}
	for _, name := range order {
		f.Switches = append(f.Switches, *switches[name])
	}
	return f, found
}

// syncFabric publishes the fabric of the nodes' labels where it changed,
// unless the fabric in force is another source's (a cluster file's).
func (s *Service) syncFabric(ctx context.Context) error {
	if len(s.cfg.FabricLabels) == 0 {
		return nil
	}
	var nodes []*corev1.Node
	s.mu.Lock()
	foreign := s.fabricForeign
	for _, o := range s.nodes.GetStore().List() {
		if n := o.(*corev1.Node); s.topo[n.Name] != nil {
			nodes = append(nodes, n)
		}
	}
	s.mu.Unlock()
	if foreign {
		return nil
	}
	f, ok := labelFabric(nodes, s.cfg.FabricLabels)
	if !ok {
		return nil
	}
	key, err := json.Marshal(f.Switches)
	if err != nil {
		return err
	}
	s.mu.Lock()
	same := string(key) == s.fabricSeen
	s.mu.Unlock()
	if same {
		return nil
	}
	if _, err := s.bus.Publish(ctx, &f); err != nil {
		return fmt.Errorf("publish the fabric of the node labels: %w", err)
	}
	s.mu.Lock()
	s.fabricSeen = string(key)
	s.mu.Unlock()
	s.log.Info("fabric published from node labels", "switches", len(f.Switches), "nodes", len(nodes))
	return nil
}
