package clusterfile

import (
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/internal/topology"
)

// GPUState says, for `topoctl topology show`, what a GPU is doing: "free",
// "used by JOB" or "unhealthy (reason)".
type GPUState func(node string, gpu int) string

// WriteTree prints a cluster as a tree: cluster → switches → nodes →
// NUMA nodes → GPUs and NICs, each GPU with its state.
func WriteTree(w io.Writer, c Cluster, state GPUState) error {
	var b strings.Builder
	fmt.Fprintf(&b, "cluster %s (%d nodes, %d GPUs)\n", c.Name, len(c.Nodes), countGPUs(c))
	byName := map[string]*events.TopologyNode{}
	for i := range c.Nodes {
		byName[c.Nodes[i].Name] = &c.Nodes[i]
	}
	switches := map[string]events.Switch{}
	child := map[string]bool{}
	// NVLink domains stand beside the tree: a node says which it is in.
	nvl := map[string]string{}
	var tree []events.Switch
	for _, sw := range c.Fabric.Switches {
		if sw.Tier == topology.TierNVLink {
			for _, n := range sw.Nodes {
				nvl[n] = sw.Name
			}
			continue
		}
		tree = append(tree, sw)
	}
	for _, sw := range tree {
		switches[sw.Name] = sw
		for _, s := range sw.Switches {
			child[s] = true
		}
	}
	placed := map[string]bool{}
	var walk func(sw events.Switch, indent string)
	walk = func(sw events.Switch, indent string) {
		fmt.Fprintf(&b, "%s%s %s\n", indent, sw.Tier, sw.Name)
		for _, s := range sw.Switches {
			if sub, ok := switches[s]; ok {
				walk(sub, indent+"  ")
			}
		}
		for _, n := range sw.Nodes {
			if node, ok := byName[n]; ok && !placed[n] {
				placed[n] = true
				writeNode(&b, node, indent+"  ", nvl[n], state)
			}
		}
	}
	for _, sw := range tree {
		if !child[sw.Name] {
			walk(sw, "  ")
		}
	}
	var loose []string
	for _, n := range c.Nodes {
		if !placed[n.Name] {
			loose = append(loose, n.Name)
		}
	}
	if len(loose) > 0 {
		indent := "  "
		if len(tree) > 0 {
			b.WriteString("  (not under any switch)\n")
			indent = "    "
		}
		for _, n := range loose {
			writeNode(&b, byName[n], indent, nvl[n], state)
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func countGPUs(c Cluster) int {
	n := 0
	for _, node := range c.Nodes {
		n += len(node.GPUs)
	}
	return n
}

func writeNode(b *strings.Builder, n *events.TopologyNode, indent, nvlDomain string, state GPUState) {
	model := n.GPUModel
	if model == "" {
		model = "GPU"
	}
	note := ""
	if nvlDomain != "" {
		note = " (NVLink domain " + nvlDomain + ")"
	}
	fmt.Fprintf(b, "%snode %s: %d x %s%s\n", indent, n.Name, len(n.GPUs), model, note)
	topo, err := topology.FromEvent(*n)
	if err != nil || topo.GPUPaths == nil {
		for _, g := range n.GPUs {
			fmt.Fprintf(b, "%s  GPU%d %s\n", indent, g.Index, state(n.Name, g.Index))
		}
		return
	}
	// Group GPUs and NICs by NUMA node; -1 (unknown) last.
	numas := map[int]bool{}
	for _, g := range topo.GPUs {
		numas[g.NUMA] = true
	}
	for _, nic := range topo.NICs {
		numas[nic.NUMA] = true
	}
	order := make([]int, 0, len(numas))
	for k := range numas {
		order = append(order, k)
	}
	slices.SortFunc(order, func(a, c int) int {
		if (a < 0) != (c < 0) {
			return map[bool]int{true: 1, false: -1}[a < 0]
		}
		return a - c
	})
	for _, numa := range order {
		label := fmt.Sprintf("NUMA %d", numa)
		if numa < 0 {
			label = "NUMA unknown"
		}
		fmt.Fprintf(b, "%s  %s\n", indent, label)
		for i, g := range topo.GPUs {
			if g.NUMA != numa {
				continue
			}
			nic := ""
			if k := topo.NearestNIC(i); k >= 0 {
				nic = fmt.Sprintf(", nearest NIC %s (%s)", topo.NICs[k].Name, topo.NICPaths[i][k])
			}
			fmt.Fprintf(b, "%s    GPU%d %s%s\n", indent, g.Index, state(n.Name, g.Index), nic)
		}
		for _, nic := range topo.NICs {
			if nic.NUMA == numa {
				rate := ""
				if nic.RateGbps > 0 {
					rate = fmt.Sprintf(" %g Gb/s", nic.RateGbps)
				}
				fmt.Fprintf(b, "%s    NIC %s%s\n", indent, nic.Name, rate)
			}
		}
	}
	if topo.NVSwitches > 0 || topo.NVLinkGen > 0 {
		fmt.Fprintf(b, "%s  NVLink gen %d, %d NVSwitches\n", indent, topo.NVLinkGen, topo.NVSwitches)
	}
	for _, w := range n.Warnings {
		fmt.Fprintf(b, "%s  ! %s\n", indent, w)
	}
}
