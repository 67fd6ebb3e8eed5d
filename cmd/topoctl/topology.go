package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/events/bus"
	"github.com/toposched/toposched/internal/formats/clusterfile"
)

func newTopology(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "topology",
		Short: "Show the cluster's topology: the switch tree, nodes, GPUs and NICs, and path matrices",
	}
	cmd.AddCommand(newTopologyShow(g), newTopologyMatrix(g))
	return cmd
}

func newTopologyShow(g *globals) *cobra.Command {
	var cluster string
	cmd := &cobra.Command{
		Use:   "show [--cluster FILE]",
		Short: "Print the cluster as a tree: switches, nodes, NUMA nodes, GPUs (free, used, unhealthy) and NICs",
		Long: `show prints the cluster as a tree: fabric switches, nodes under them, each
node's NUMA nodes with their GPUs and NICs, each GPU marked free, used by a job,
or unhealthy.

With --cluster it reads a cluster file offline (every GPU free); without it
reads the running operator's topology and placement streams. --format dot
writes a Graphviz graph (render with: dot -Tsvg), --format json the nodes and
fabric as topology events.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, state, err := loadCluster(cmd.Context(), g, cluster)
			if err != nil {
				return err
			}
			switch g.format {
			case "dot":
				return clusterfile.WriteDot(cmd.OutOrStdout(), c, state)
			case "json":
				return writeJSON(cmd.OutOrStdout(), c)
			}
			return clusterfile.WriteTree(cmd.OutOrStdout(), c, state)
		},
	}
	cmd.Flags().StringVar(&cluster, "cluster", "", "read this cluster file instead of the running operator")
	return cmd
}

func newTopologyMatrix(g *globals) *cobra.Command {
	var cluster, file string
	var bandwidth bool
	var opts clusterfile.NodeFileOptions
	cmd := &cobra.Command{
		Use:   "matrix [NODE] [--file FILE | --cluster FILE]",
		Short: "Print a node's GPU×GPU path-class matrix in nvidia-smi's shape",
		Long: `matrix prints the path class between every two GPUs of a node (X, NV#, NVB,
PIX, PXB, PHB, NODE, SYS) and from each GPU to each NIC, then one line per GPU
with its NUMA node and nearest NIC.

--file imports an nvidia-smi topo -m output or an NCCL topology XML offline; the
format is recognised from the content. Otherwise NODE names a node of --cluster
or of the running operator. --bandwidth adds each pair's bandwidth in GB/s.`,
		Example: `  topoctl topology matrix --file nvidia-smi-topo.txt
  topoctl topology matrix --file topo.xml -o json
  topoctl topology matrix dgx-a100-001 --cluster deploy/examples/cluster.yaml --bandwidth`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var node events.TopologyNode
			switch {
			case file != "":
				n, err := clusterfile.LoadNodeFile(file, opts)
				if err != nil {
					return err
				}
				node = n
			case len(args) == 1:
				c, _, err := loadCluster(cmd.Context(), g, cluster)
				if err != nil {
					return err
				}
				if node, err = c.Node(args[0]); err != nil {
					return err
				}
			default:
				return fmt.Errorf("name a NODE or give --file FILE")
			}
			if g.format == "dot" {
				return fmt.Errorf("--format dot: topology show draws the cluster; matrix prints table or json")
			}
			return clusterfile.WriteMatrix(cmd.OutOrStdout(), node, g.format == "json", bandwidth)
		},
	}
	cmd.Flags().StringVar(&file, "file", "", "nvidia-smi topo -m output or NCCL topology XML to import offline")
	cmd.Flags().StringVar(&cluster, "cluster", "", "read NODE from this cluster file instead of the running operator")
	cmd.Flags().BoolVar(&bandwidth, "bandwidth", false, "show each GPU pair's bandwidth per direction in GB/s")
	cmd.Flags().StringVar(&opts.GPUModel, "gpu-model", "", "for an NCCL XML without NVLink: the GPU model, whose board's NVLinks are then added")
	cmd.Flags().IntVar(&opts.NVLinks, "nvlinks", 0, "for an NCCL XML without NVLink: NVLinks between every GPU pair (an NVSwitch board)")
	return cmd
}

// loadCluster reads a cluster file, or rebuilds the live cluster and its
// GPUs' states from the operator's streams.
func loadCluster(ctx context.Context, g *globals, file string) (clusterfile.Cluster, clusterfile.GPUState, error) {
	if file != "" {
		c, err := clusterfile.LoadCluster(file)
		return c, func(string, int) string { return "free" }, err
	}
	b, err := g.connect(ctx)
	if err != nil {
		return clusterfile.Cluster{}, nil, err
	}
	defer closeBus(b)
	return liveCluster(ctx, b)
}

func liveCluster(ctx context.Context, b *bus.Bus) (clusterfile.Cluster, clusterfile.GPUState, error) {
	nodes := map[string]events.TopologyNode{}
	var fabric events.TopologyFabric
	unhealthy := map[string]string{}
	parts := map[string]string{} // node NUL "nvlink 3/5" or "nic mlx5_0" -> reason
	key := func(node string, gpu int) string { return node + "/" + strconv.Itoa(gpu) }
	err := b.Replay(ctx, events.DomainTopology, []string{b.Subjects.Domain(events.DomainTopology)}, func(r bus.Record) error {
		switch r.Name {
		case events.NameTopologyNode:
			var n events.TopologyNode
			if bus.Decode(r.Name, r.Body, &n) == nil {
				if n.Removed {
					delete(nodes, n.Name)
				} else {
					nodes[n.Name] = n
				}
			}
		case events.NameTopologyFabric:
			_ = bus.Decode(r.Name, r.Body, &fabric)
		case events.NameTopologyHealth:
			var h events.TopologyHealth
			if bus.Decode(r.Name, r.Body, &h) != nil {
				return nil
			}
			switch h.Component {
			case events.ComponentGPU:
				if i, err := strconv.Atoi(h.ID); err == nil {
					if h.Health == events.HealthUnhealthy {
						unhealthy[key(h.Node, i)] = h.Reason
					} else {
						delete(unhealthy, key(h.Node, i))
					}
				}
			case events.ComponentNVLink, events.ComponentNIC:
				// Parts below a GPU are shown on their node.
				k := h.Node + "\x00" + h.Component + " " + h.ID
				if h.Health == events.HealthUnhealthy {
					parts[k] = h.Reason
				} else {
					delete(parts, k)
				}
			}
		}
		return nil
	})
	if err != nil {
		return clusterfile.Cluster{}, nil, err
	}
	used := map[string]string{}
	err = b.Replay(ctx, events.DomainPlacement, []string{b.Subjects.Domain(events.DomainPlacement)}, func(r bus.Record) error {
		switch r.Name {
		case events.NamePlacementDecided:
			var d events.PlacementDecided
			if bus.Decode(r.Name, r.Body, &d) == nil {
				// A job decided again (a migration) left its old GPUs.
				for k, j := range used {
					if j == d.JobID {
						delete(used, k)
					}
				}
				for _, rk := range d.Ranks {
					used[key(rk.Node, rk.GPU)] = d.JobID
				}
			}
		case events.NamePlacementReleased:
			for k, j := range used {
				if j == r.Env.Subject {
					delete(used, k)
				}
			}
		}
		return nil
	})
	if err != nil {
		return clusterfile.Cluster{}, nil, err
	}
	c := clusterfile.Cluster{Name: fabric.Cluster, Fabric: fabric}
	if c.Name == "" {
		c.Name = "live"
	}
	for k, why := range parts {
		node, part, _ := strings.Cut(k, "\x00")
		if n, ok := nodes[node]; ok {
			n.Warnings = append(slices.Clone(n.Warnings), fmt.Sprintf("%s down: %s", part, why))
			nodes[node] = n
		}
	}
	for _, n := range nodes {
		slices.Sort(n.Warnings)
		for _, gpu := range n.GPUs {
			if gpu.Health == events.HealthUnhealthy {
				unhealthy[key(n.Name, gpu.Index)] = "reported unhealthy"
			}
		}
		c.Nodes = append(c.Nodes, n)
	}
	slices.SortFunc(c.Nodes, func(a, b events.TopologyNode) int {
		if a.Position != b.Position {
			return a.Position - b.Position
		}
		return strings.Compare(a.Name, b.Name)
	})
	state := func(node string, gpu int) string {
		if why, ok := unhealthy[key(node, gpu)]; ok {
			return "unhealthy (" + why + ")"
		}
		if j, ok := used[key(node, gpu)]; ok {
			return "used by " + j
		}
		return "free"
	}
	return c, state, nil
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
