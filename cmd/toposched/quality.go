package main

import (
	"github.com/spf13/cobra"
	"github.com/toposched/toposched/sim/quality"
)

type qualityFlags struct {
	topologies, fabrics string
	seed                uint64
	quick               bool
	evals               int
	familyCases         int
	tables              string
	misses              bool
}

func newQuality(_ *globals) *cobra.Command {
	var f qualityFlags
	cmd := &cobra.Command{
		Use:   "quality",
		Short: "Measure placement quality: topology-aware against the optimum, blind first fit and random",
		Long: `quality scores placements with the cost model (predicted communication time
per training step) and prints four tables (--tables picks some).

(a) Single nodes: for every complete topology file (nvidia-smi topo -m or
NCCL XML; *.partial.* skipped) under --topologies, with the node empty and
with two seeded random occupancies, and every request of 2..free GPUs:
a data-parallel all-reduce of 1 GiB, and TP=2/4 x DP where they divide.
Topology-aware against the exhaustive optimum and blind first fit, and the
share of cases within 2% of the optimum (target: >= 95%).

(b) Fragmented clusters: 8-GPU DGX nodes on the fabrics under --fabrics
(Lingjun Clos CSV with DGX A100s, a Slurm tree with DGX H100s) at 30/50/70%
seeded random GPU occupancy; DP-only, TP8 x DP and TP8 x PP x DP jobs of
16..512 GPUs. Topology-aware against blind, a random feasible placement and
an ideal bound: the same job placed compactly on an empty cluster of the
same nodes under one non-blocking switch (no fragmentation, no
oversubscription; every group gets the best links a placement can give).
The median reduction of comm time against blind is the target (>= 25%).

(c) Generated nodes: --family-cases seeded nodes of the shapes files seldom
show (NVLink-bridged pairs NV1..NV12 on 2-4 sockets, NVLink quads, NVSwitch
NV12/NV18, PCIe switch trees), random occupancy, random tp/dp jobs;
topology-aware against the exhaustive optimum by family, split by whether
the exact in-node choice covers the case (target: all of those within 0.5%).

(d) Generated small clusters: 1,000 seeded clusters of two or three generated
nodes of one family, half to fully occupied, jobs of 2 to 6 GPUs (tp 1 or 2);
topology-aware against the exhaustive optimum over the cluster, by family
and by whether the optimum spans nodes (target: >= 98% within 2%).

The run is seeded and deterministic (local search is bounded by --evals,
not by time).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return quality.Run(cmd.OutOrStdout(), quality.Config{Topologies: f.topologies, Fabrics: f.fabrics, Seed: f.seed, Quick: f.quick, Evals: f.evals,
				FamilyCases: f.familyCases, Tables: f.tables, Misses: f.misses})
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.topologies, "topologies", "", "directory of node topology files (default: the project's copies in internal/formats/{nvsmi,ncclxml}/testdata)")
	fl.StringVar(&f.fabrics, "fabrics", "", "fabric directory with lingjun/topo.csv and slurm/*.conf.txt (default: the project's copy in internal/formats/fabric/testdata)")
	fl.Uint64Var(&f.seed, "seed", 1, "random seed of occupancies and random placements")
	fl.BoolVar(&f.quick, "quick", false, "a small, fast subset of both tables")
	fl.IntVar(&f.evals, "evals", 200, "cost-model evaluations the local search may make per placement")
	fl.IntVar(&f.familyCases, "family-cases", quality.DefaultFamilyCases, "generated single-node cases of table (c)")
	fl.StringVar(&f.tables, "tables", "abcd", "the tables to print, by letter (e.g. d: only the generated small clusters)")
	fl.BoolVar(&f.misses, "misses", false, "list the cases of tables (c) and (d) not within 0.5% and 2% of the optimum: nodes, occupancy, our GPUs and the optimum's")
	return cmd
}
