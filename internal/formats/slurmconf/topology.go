package slurmconf

import (
	"bytes"
	"errors"
	"fmt"
	"regexp"
	"slices"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/internal/formats/fabric"
	"github.com/toposched/toposched/internal/topology"
)

// ErrNoFabric is WriteTopology's answer for a cluster whose fabric lists no
// switch of the network tree: there is no topology.conf to write, and
// slurm.conf should leave TopologyPlugin unset.
var ErrNoFabric = errors.New("the fabric has no network switches: no topology.conf to write (leave TopologyPlugin unset)")

// maxSwitchName is Slurm's limit on SwitchName.
const maxSwitchName = 64

// SlurmTree is the part of a fabric that a topology/tree topology.conf can
// hold, as ParseSlurm reads it back: the network switches with their nodes
// and child switches, leaves first, then each level above, each in the
// fabric's order, tiers from each switch's height (a leaf holds nodes, a
// spine leaves, a core anything higher). Two things cannot be written, and
// notes say so:
//
//   - Multi-node NVLink domains (tier nvlink) are left out: Slurm 22.05 has
//     only topology/tree (topology/block, which could hold them, came in
//     23.11).
//   - A node of a rail-optimized fabric is below one leaf per rail, but
//     Slurm keeps a node below one leaf: it stays below the leaf of its
//     lowest rail and is left out of the others.
//
// The fabric is checked as topology.NewFabric checks it; switch names must
// be at most 64 letters, digits, '.', '_', ':' or '-', as Slurm's are.
func SlurmTree(fab events.TopologyFabric) (events.TopologyFabric, []string, error) {
	if _, err := topology.NewFabric(fab); err != nil {
		return events.TopologyFabric{}, nil, err
	}
	var notes []string
	var tree []events.Switch
	var nvl []string
	for _, s := range fab.Switches {
		if s.Tier == topology.TierNVLink {
			nvl = append(nvl, s.Name)
			continue
		}
		tree = append(tree, s)
	}
	if len(nvl) > 0 {
		notes = append(notes, fmt.Sprintf("NVLink domains %s are not written: Slurm 22.05 has only topology/tree (topology/block came in 23.11)", fabric.CompressHostlist(nvl)))
	}
	if len(tree) == 0 {
		return events.TopologyFabric{}, notes, ErrNoFabric
	}
	var errs []error
	for _, s := range tree {
		if len(s.Name) > maxSwitchName || !switchNamePattern.MatchString(s.Name) {
			errs = append(errs, fmt.Errorf("fabric: switch %q: name: expected at most %d letters, digits, '.', '_', ':' or '-', as Slurm's SwitchName", abbreviate(s.Name), maxSwitchName))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return events.TopologyFabric{}, notes, err
	}

	// A node stays below the leaf of its lowest rail (or its only leaf).
	keep := map[string]int{} // node -> index in tree of its leaf
	rail := func(s events.Switch) int {
		if s.Rail == nil {
			return -1
		}
		return *s.Rail
	}
	for i, s := range tree {
		for _, n := range s.Nodes {
			if k, ok := keep[n]; !ok || rail(s) < rail(tree[k]) {
				keep[n] = i
			}
		}
	}
	folded := 0
	out := make([]events.Switch, len(tree))
	for i, s := range tree {
		out[i] = events.Switch{Name: s.Name, Switches: slices.Clone(s.Switches)}
		for _, n := range s.Nodes {
			if keep[n] == i {
				out[i].Nodes = append(out[i].Nodes, n)
			} else {
				folded++
			}
		}
	}
	if folded > 0 {
		notes = append(notes, fmt.Sprintf("rail-optimized fabric: each node is written below the leaf of its lowest rail only (%d leaf memberships left out): Slurm keeps a node below one leaf", folded))
	}

	// Heights, then the order: leaves first, each level in fabric order.
	index := make(map[string]int, len(out))
	for i, s := range out {
		index[s.Name] = i
	}
	height := make([]int, len(out))
	done := make([]bool, len(out))
	var visit func(i int) int
	visit = func(i int) int { // NewFabric found no cycle
		if done[i] {
			return height[i]
		}
		h := 0
		for _, c := range out[i].Switches {
			h = max(h, visit(index[c])+1)
		}
		height[i], done[i] = h, true
		return h
	}
	order := make([]int, len(out))
	for i := range out {
		visit(i)
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return height[a] - height[b] })
	res := events.TopologyFabric{Cluster: fab.Cluster, Switches: make([]events.Switch, 0, len(out))}
	for _, i := range order {
		s := out[i]
		switch height[i] {
		case 0:
			s.Tier = topology.TierLeaf
		case 1:
			s.Tier = topology.TierSpine
		default:
			s.Tier = topology.TierCore
		}
		res.Switches = append(res.Switches, s)
	}
	return res, notes, nil
}

// WriteTopology renders a topology.conf for topology/tree from a fabric:
// the switches SlurmTree gives, one SwitchName line each with its Nodes or
// Switches as a hostlist, after comments with SlurmTree's notes. A fabric
// without network switches is ErrNoFabric.
func WriteTopology(fab events.TopologyFabric) ([]byte, error) {
	tree, notes, err := SlurmTree(fab)
	if err != nil {
		return nil, err
	}
	var b bytes.Buffer
	b.WriteString("# topology.conf written by toposched slurm-conf from the cluster's fabric,\n")
	b.WriteString("# for slurm.conf's TopologyPlugin=topology/tree.\n")
	for _, n := range notes {
		fmt.Fprintf(&b, "# %s.\n", n)
	}
	b.WriteByte('\n')
	for _, s := range tree.Switches {
		fmt.Fprintf(&b, "SwitchName=%s", s.Name)
		switch {
		case len(s.Switches) > 0:
			fmt.Fprintf(&b, " Switches=%s", fabric.CompressHostlist(s.Switches))
		case len(s.Nodes) > 0:
			fmt.Fprintf(&b, " Nodes=%s", fabric.CompressHostlist(s.Nodes))
		}
		b.WriteByte('\n')
	}
	return b.Bytes(), nil
}

// switchNamePattern is a Slurm switch name as package fabric reads it (the
// length is checked apart).
var switchNamePattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:-]*$`)
