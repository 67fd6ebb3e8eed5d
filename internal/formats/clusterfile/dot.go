package clusterfile

import (
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/toposched/toposched/internal/topology"
)

// WriteDot draws a cluster for Graphviz: switches, nodes as boxes holding
// their GPUs (filled by state: free white, used grey, unhealthy red) and
// NICs, NVLink edges labelled NV#, each GPU's edge to its nearest NIC, and
// the switch tree down to the nodes.
func WriteDot(w io.Writer, c Cluster, state GPUState) error {
	var b strings.Builder
	fmt.Fprintf(&b, "graph %s {\n  rankdir=TB;\n  node [fontname=\"Helvetica\", fontsize=10];\n", quote(c.Name))
	for _, sw := range c.Fabric.Switches {
		fmt.Fprintf(&b, "  %s [shape=box, style=rounded, label=%s];\n", quote("sw:"+sw.Name), quote(sw.Tier+" "+sw.Name))
		for _, child := range sw.Switches {
			fmt.Fprintf(&b, "  %s -- %s;\n", quote("sw:"+sw.Name), quote("sw:"+child))
		}
		for _, n := range sw.Nodes {
			fmt.Fprintf(&b, "  %s -- %s [lhead=%s];\n", quote("sw:"+sw.Name), quote("node:"+n), quote("cluster_"+n))
		}
	}
	for _, ev := range c.Nodes {
		fmt.Fprintf(&b, "  subgraph %s {\n    label=%s;\n    style=rounded;\n", quote("cluster_"+ev.Name), quote(ev.Name))
		fmt.Fprintf(&b, "    %s [shape=point, style=invis];\n", quote("node:"+ev.Name))
		for _, g := range ev.GPUs {
			st := state(ev.Name, g.Index)
			fill := "white"
			switch {
			case strings.HasPrefix(st, "used"):
				fill = "gray80"
			case strings.HasPrefix(st, "unhealthy"):
				fill = "tomato"
			}
			fmt.Fprintf(&b, "    %s [shape=box, style=filled, fillcolor=%s, label=%s, tooltip=%s];\n",
				gpuID(ev.Name, g.Index), fill, quote("GPU"+strconv.Itoa(g.Index)), quote(st))
		}
		topo, err := topology.FromEvent(ev)
		if err == nil && topo.GPUPaths != nil {
			for _, nic := range topo.NICs {
				fmt.Fprintf(&b, "    %s [shape=ellipse, label=%s];\n", quote("nic:"+ev.Name+"/"+nic.Name), quote(nic.Name))
			}
			// Through NVSwitches every pair is NV#: draw the switch, as the
			// hardware is, rather than n·(n-1)/2 edges.
			viaSwitch := topo.NVSwitches > 0
			if viaSwitch {
				sw := quote("nvswitch:" + ev.Name)
				fmt.Fprintf(&b, "    %s [shape=hexagon, label=%s];\n", sw, quote(strconv.Itoa(topo.NVSwitches)+" NVSwitch"))
				for i, g := range topo.GPUs {
					if j := (i + 1) % len(topo.GPUs); j != i {
						fmt.Fprintf(&b, "    %s -- %s [label=%s, color=darkgreen];\n", gpuID(ev.Name, g.Index), sw, quote(topo.GPUPaths[i][j].String()))
					}
				}
			}
			for i := range topo.GPUs {
				for j := i + 1; j < len(topo.GPUs) && !viaSwitch; j++ {
					if l := topo.GPUPaths[i][j]; l.Class.NVLink() {
						fmt.Fprintf(&b, "    %s -- %s [label=%s, color=darkgreen];\n",
							gpuID(ev.Name, topo.GPUs[i].Index), gpuID(ev.Name, topo.GPUs[j].Index), quote(l.String()))
					}
				}
				if k := topo.NearestNIC(i); k >= 0 {
					fmt.Fprintf(&b, "    %s -- %s [style=dashed, label=%s];\n", gpuID(ev.Name, topo.GPUs[i].Index),
						quote("nic:"+ev.Name+"/"+topo.NICs[k].Name), quote(topo.NICPaths[i][k].String()))
				}
			}
		}
		b.WriteString("  }\n")
	}
	b.WriteString("}\n")
	_, err := io.WriteString(w, b.String())
	return err
}

func gpuID(node string, gpu int) string { return quote("gpu:" + node + "/" + strconv.Itoa(gpu)) }

// quote makes a Graphviz ID string.
func quote(s string) string { return strconv.Quote(s) }
