package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/events/bus"
	"github.com/toposched/toposched/internal/formats/clusterfile"
	"github.com/toposched/toposched/internal/formats/fabric"
	"github.com/toposched/toposched/internal/formats/slurmconf"
	"github.com/toposched/toposched/internal/textout"
)

// slurmConfFlags are slurm-conf's flags.
type slurmConfFlags struct {
	cluster string
	out     string
	check   bool
	opts    slurmconf.Options
}

func newSlurmConf(g *globals) *cobra.Command {
	var f slurmConfFlags
	cmd := &cobra.Command{
		Use:   "slurm-conf --cluster FILE | --nats-url URL [--out DIR]",
		Short: "Write Slurm's gres.conf and topology.conf from the cluster's topology, or check existing ones",
		Long: `slurm-conf writes the two Slurm configuration files that carry the cluster's
topology to Slurm 22.05 (select/cons_tres), into --out. The topology comes
from a cluster file (--cluster) or, without one, from the running operator's
topology stream (--nats-url, signed in as topoctl is: what discovery has
published, nodes removed since left out):

  gres.conf      one line per GPU: Type (the GPU model, or g<index> with
                 --index-types), File (/dev/nvidia<index>), Cores= (the cores of
                 the GPU's NUMA node, from its CPU affinity) and Links= (its
                 NVLinks to each GPU of the node), so that Slurm's own choice of
                 GPUs for a job it places alone follows NVLink
  topology.conf  the fabric's switch tree for TopologyPlugin=topology/tree
                 (Slurm 22.05 has no topology/block; NVLink domains are not
                 written, and a rail-optimized node stays below one leaf)

Each file is read back and compared with the cluster before it is written.
It prints the slurm.conf settings the files need: GresTypes=gpu, each node's
Gres= and the topology plugin. With --check it writes nothing: it reads the
files in --out and lists where they differ from the cluster, failing if they
do.`,
		Example: `  toposched slurm-conf --cluster cluster.yaml --out /etc/slurm
  toposched slurm-conf --cluster cluster.yaml --out /etc/slurm --check
  toposched slurm-conf --nats-url nats://ops:4222 --out /etc/slurm
  toposched slurm-conf --cluster cluster.yaml --out . --index-types --threads-per-core 2 --cores-per-node 96`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if f.opts.ThreadsPerCore > 1 && f.opts.CoresPerNode == 0 {
				return fmt.Errorf("slurm-conf: --threads-per-core %d needs --cores-per-node: Cores= takes Slurm's core indices, not CPU numbers", f.opts.ThreadsPerCore)
			}
			c, err := slurmConfCluster(cmd.Context(), g, f.cluster)
			if err != nil {
				return fmt.Errorf("slurm-conf: %w", err)
			}
			return runSlurmConf(cmd.OutOrStdout(), c, f)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.cluster, "cluster", "", "cluster file (default: the running operator's topology, at --nats-url)")
	fl.StringVar(&f.out, "out", ".", "directory to write gres.conf and topology.conf into (with --check: to read them from)")
	fl.BoolVar(&f.check, "check", false, "write nothing: compare the files in --out with the cluster")
	fl.StringVar(&f.opts.DeviceFormat, "device-format", slurmconf.DefaultDeviceFormat, "device file of GPU i, with %d for i")
	fl.BoolVar(&f.opts.IndexTypes, "index-types", false, "give every GPU a type of its own, g<index>, so that jobs can ask for exact GPUs (--gres=gpu:g1:1,gpu:g3:1)")
	fl.IntVar(&f.opts.ThreadsPerCore, "threads-per-core", 1, "hardware threads per core of the nodes (slurm.conf's ThreadsPerCore); more than 1 needs --cores-per-node")
	fl.IntVar(&f.opts.CoresPerNode, "cores-per-node", 0, "cores per node (Sockets x CoresPerSocket): CPU c of a GPU's affinity is core c mod this (0: CPUs are cores)")
	return cmd
}

// slurmConfCluster is the cluster file at path, or without one the
// cluster as the operator's topology stream has it.
func slurmConfCluster(ctx context.Context, g *globals, path string) (clusterfile.Cluster, error) {
	if path != "" {
		return clusterfile.LoadCluster(path)
	}
	if g.natsURL == "" {
		return clusterfile.Cluster{}, errors.New("give --cluster FILE, or --nats-url of a running operator to read its topology")
	}
	conn := g.conn
	conn.Role = "launcher" // topoctl's: an administrator's reads of the streams
	opts, err := conn.Options()
	if err != nil {
		return clusterfile.Cluster{}, err
	}
	b, err := bus.Connect(ctx, bus.Config{URL: g.natsURL, Prefix: g.prefix, Source: "urn:toposched:slurm-conf",
		ConnectTimeout: 5 * time.Second, SkipStreams: true, NATSOptions: opts})
	if err != nil {
		return clusterfile.Cluster{}, conn.Explain(err)
	}
	defer func() { _ = b.Close() }()
	return streamCluster(ctx, b)
}

// streamCluster replays the topology stream: each node's newest report
// (a removed node left out) in enumeration order, and the newest fabric.
func streamCluster(ctx context.Context, b *bus.Bus) (clusterfile.Cluster, error) {
	nodes := map[string]events.TopologyNode{}
	var fab events.TopologyFabric
	err := b.Replay(ctx, events.DomainTopology, []string{b.Subjects.Domain(events.DomainTopology)}, func(r bus.Record) error {
		switch r.Name {
		case events.NameTopologyNode:
			var n events.TopologyNode
			if err := bus.Decode(r.Name, r.Body, &n); err != nil {
				return nil // refused when published: not part of the cluster
			}
			if n.Removed {
				delete(nodes, n.Name)
			} else {
				nodes[n.Name] = n
			}
		case events.NameTopologyFabric:
			var f events.TopologyFabric
			if bus.Decode(r.Name, r.Body, &f) == nil {
				fab = f
			}
		}
		return nil
	})
	if err != nil {
		return clusterfile.Cluster{}, fmt.Errorf("read the topology stream: %w", err)
	}
	if len(nodes) == 0 {
		return clusterfile.Cluster{}, errors.New("the topology stream has no nodes: is discovery running?")
	}
	c := clusterfile.Cluster{Name: fab.Cluster, Fabric: fab}
	for _, n := range nodes {
		c.Nodes = append(c.Nodes, n)
	}
	slices.SortFunc(c.Nodes, func(a, b events.TopologyNode) int {
		return cmp.Or(cmp.Compare(a.Position, b.Position), cmp.Compare(a.Name, b.Name))
	})
	return c, nil
}

// runSlurmConf writes (or with --check compares) the files for c.
func runSlurmConf(out io.Writer, c clusterfile.Cluster, f slurmConfFlags) error {
	gresPath, topoPath := filepath.Join(f.out, "gres.conf"), filepath.Join(f.out, "topology.conf")
	if f.check {
		return checkSlurmConf(out, c, f.opts, gresPath, topoPath)
	}

	gres, err := slurmconf.WriteGres(c.Nodes, f.opts)
	if err != nil {
		return fmt.Errorf("slurm-conf: gres.conf: %w", err)
	}
	topo, err := slurmconf.WriteTopology(c.Fabric)
	noFabric := errors.Is(err, slurmconf.ErrNoFabric)
	if err != nil && !noFabric {
		return fmt.Errorf("slurm-conf: topology.conf: %w", err)
	}
	// Read both back before writing either: a file Slurm would read
	// differently from what the cluster says is never written.
	var diffs []string
	g, err := slurmconf.ParseGres(gresPath, gres)
	if err != nil {
		return fmt.Errorf("slurm-conf: gres.conf as written does not read back: %w", err)
	}
	d, err := slurmconf.DiffGres(c.Nodes, f.opts, g)
	if err != nil {
		return fmt.Errorf("slurm-conf: %w", err)
	}
	diffs = append(diffs, d...)
	if !noFabric {
		fab, err := fabric.ParseSlurm(topoPath, topo)
		if err != nil {
			return fmt.Errorf("slurm-conf: topology.conf as written does not read back: %w", err)
		}
		d, err := slurmconf.DiffTopology(c.Fabric, fab)
		if err != nil {
			return fmt.Errorf("slurm-conf: %w", err)
		}
		diffs = append(diffs, d...)
	}
	if len(diffs) > 0 {
		return fmt.Errorf("slurm-conf: the files as written read back differently from the cluster:\n  %s", strings.Join(diffs, "\n  "))
	}

	if err := writeFileAtomic(gresPath, gres); err != nil {
		return fmt.Errorf("slurm-conf: %w", err)
	}
	w := textout.New(out)
	w.Printf("wrote %s: %d nodes\n", gresPath, len(g.Order))
	if noFabric {
		w.Printf("no %s: %v\n", topoPath, slurmconf.ErrNoFabric)
	} else {
		if err := writeFileAtomic(topoPath, topo); err != nil {
			return fmt.Errorf("slurm-conf: %w", err)
		}
		w.Printf("wrote %s\n", topoPath)
	}
	w.Println("\nslurm.conf needs:")
	w.Println("  SelectType=select/cons_tres")
	w.Println("  GresTypes=gpu")
	if !noFabric {
		w.Println("  TopologyPlugin=topology/tree")
	}
	for _, line := range nodeGresLines(c.Nodes, f.opts) {
		w.Println("  " + line)
	}
	return w.Err()
}

// nodeGresLines are the Gres= of each group of nodes alike, as slurm.conf's
// NodeName lines must give it.
func nodeGresLines(nodes []events.TopologyNode, opts slurmconf.Options) []string {
	var order []string
	names := map[string][]string{}
	for _, n := range nodes {
		if n.Removed || len(n.GPUs) == 0 {
			continue
		}
		gpus, err := slurmconf.NodeGPUs(n, opts)
		if err != nil {
			continue // WriteGres reported it already
		}
		v := slurmconf.GresValue(gpus)
		if names[v] == nil {
			order = append(order, v)
		}
		names[v] = append(names[v], n.Name)
	}
	lines := make([]string, len(order))
	for i, v := range order {
		lines[i] = fmt.Sprintf("NodeName=%s ... Gres=%s", fabric.CompressHostlist(names[v]), v)
	}
	return lines
}

// checkSlurmConf reads gres.conf and topology.conf and lists where they
// differ from the cluster.
func checkSlurmConf(out io.Writer, c clusterfile.Cluster, opts slurmconf.Options, gresPath, topoPath string) error {
	var diffs []string
	data, err := os.ReadFile(gresPath)
	if err != nil {
		return fmt.Errorf("slurm-conf --check: %w", err)
	}
	g, err := slurmconf.ParseGres(gresPath, data)
	if err != nil {
		return fmt.Errorf("slurm-conf --check: %w", err)
	}
	d, err := slurmconf.DiffGres(c.Nodes, opts, g)
	if err != nil {
		return fmt.Errorf("slurm-conf --check: %w", err)
	}
	for _, s := range d {
		diffs = append(diffs, gresPath+": "+s)
	}
	if _, _, err := slurmconf.SlurmTree(c.Fabric); !errors.Is(err, slurmconf.ErrNoFabric) {
		data, err := os.ReadFile(topoPath)
		if err != nil {
			return fmt.Errorf("slurm-conf --check: %w", err)
		}
		fab, err := fabric.ParseSlurm(topoPath, data)
		if err != nil {
			return fmt.Errorf("slurm-conf --check: %w", err)
		}
		d, err := slurmconf.DiffTopology(c.Fabric, fab)
		if err != nil {
			return fmt.Errorf("slurm-conf --check: %w", err)
		}
		for _, s := range d {
			diffs = append(diffs, topoPath+": "+s)
		}
	}
	if len(diffs) > 0 {
		return fmt.Errorf("slurm-conf --check: %d differences from the cluster:\n  %s", len(diffs), strings.Join(diffs, "\n  "))
	}
	w := textout.New(out)
	w.Printf("%s and %s agree with the cluster\n", gresPath, topoPath)
	return w.Err()
}

// writeFileAtomic writes data to path through a temporary file in the same
// directory, so that a daemon reading path never sees half a file.
func writeFileAtomic(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer func() { _ = os.Remove(tmp.Name()) }() // gone already once renamed
	if _, err := tmp.Write(data); err != nil {
		_ = tmp.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := tmp.Chmod(0o644); err != nil {
		_ = tmp.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
