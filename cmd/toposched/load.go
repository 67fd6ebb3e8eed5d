package main

import (
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/toposched/toposched/internal/placer"
	"github.com/toposched/toposched/sim/load"
)

type loadFlags struct {
	clusters, jobs, strategies          string
	occupancy                           float64
	seed                                uint64
	model                               string
	noPolicies                          bool
	decisions                           int
	budget                              time.Duration
	e2e, e2eGPUs, e2eJobGPUs, e2eWindow int
	cpuProfile, memProfile              string
	e2eOnly                             bool
}

func newLoad(g *globals) *cobra.Command {
	var f loadFlags
	cmd := &cobra.Command{
		Use:   "load",
		Short: "Measure placement speed: decision latency on 1k-100k GPU clusters, and decisions/s end to end through NATS",
		Long: `load builds synthetic clusters (8-GPU NVSwitch nodes of a built-in model on a
rail-optimized leaf/spine fabric: pods of 32 nodes, 8 rails, 16 pods per
core), fills them to --occupancy with a seeded random mix of 1- to 64-GPU
jobs, puts the shipped policy set in force (--no-policies leaves it out),
and times the placement planner (the function the service and
topoctl place --dry-run decide with) on TP8 jobs of each --jobs size: p50,
p99 and max over repeated decisions on one snapshot, and the bytes each
decision allocated.

With --e2e N it also starts an embedded NATS server and every service in
this process on a --e2e-gpus cluster, publishes N jobs of --e2e-job-gpus
with up to --e2e-window of them awaiting JetStream's acknowledgement at once
(as the raw measurement it prints beside them) and reports the sustained
decisions per second and the publish-to-decision latency; then it waits
for the optimizer, which tunes each decision off the decision path, and
says how far behind it was and the CPU a decision costs with its tuning.

Targets (issue 5): p99 <= 10 ms for jobs of up to 64 GPUs on 10k GPUs at 50%
occupancy with policies on; >= 500 decisions/s end to end.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) (err error) {
			clusters, err := parseSizes(f.clusters)
			if err != nil {
				return fmt.Errorf("--clusters: %w", err)
			}
			jobs, err := parseSizes(f.jobs)
			if err != nil {
				return fmt.Errorf("--jobs: %w", err)
			}
			if f.e2eWindow > load.MaxE2EWindow {
				return fmt.Errorf("--e2e-window %d: at most %d (the asynchronous publishes nats.go keeps outstanding)", f.e2eWindow, load.MaxE2EWindow)
			}
			cfg := load.Config{
				Clusters: clusters, Jobs: jobs, Occupancy: f.occupancy, Seed: f.seed, Model: f.model,
				Strategies: strings.Split(f.strategies, ","), NoPolicies: f.noPolicies,
				Decisions: f.decisions, Budget: f.budget,
				E2E: f.e2e, E2EGPUs: f.e2eGPUs, E2EJobGPUs: f.e2eJobGPUs, E2EWindow: f.e2eWindow, E2EOnly: f.e2eOnly,
			}
			if f.e2eOnly && f.e2e <= 0 {
				return fmt.Errorf("--e2e-only needs --e2e N")
			}
			if f.memProfile != "" {
				// Sampled finer than the default 512 KB: a decision
				// allocates a few hundred KB.
				runtime.MemProfileRate = 64 << 10
				var merr error
				snap := func(file string) {
					if err := writeAllocs(file); err != nil && merr == nil {
						merr = err
					}
				}
				defer func() {
					if !f.e2eOnly {
						snap(f.memProfile)
					}
				}()
				if f.e2eOnly {
					inner := cfg.Measured
					cfg.Measured = func() func() {
						snap(f.memProfile + ".base")
						closed := func() {}
						if inner != nil {
							closed = inner()
						}
						return func() {
							closed()
							snap(f.memProfile)
						}
					}
				}
				defer func() {
					if merr != nil {
						err = fmt.Errorf("--mem-profile: %w", merr)
					}
				}()
			}
			if f.e2eOnly && f.cpuProfile != "" {
				// The decisions alone: building and filling the cluster,
				// and the services' catch-up, would be most of the profile.
				pf, err := os.Create(f.cpuProfile)
				if err != nil {
					return fmt.Errorf("--cpu-profile: %w", err)
				}
				defer func() { _ = pf.Close() }() // written once the window closes
				var perr error
				cfg.Measured = func() func() {
					if perr = pprof.StartCPUProfile(pf); perr != nil {
						return func() {}
					}
					return pprof.StopCPUProfile
				}
				if err := load.Run(cmd.Context(), cmd.OutOrStdout(), cfg); err != nil {
					return err
				}
				if perr != nil {
					return fmt.Errorf("--cpu-profile: %w", perr)
				}
				return nil
			}
			stop, err := startCPUProfile(f.cpuProfile)
			if err != nil {
				return err
			}
			defer stop()
			return load.Run(cmd.Context(), cmd.OutOrStdout(), cfg)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.clusters, "clusters", "1k,10k,100k", "cluster sizes in GPUs, comma separated (k = 1000)")
	fl.StringVar(&f.jobs, "jobs", "8,64,512,4096", "job sizes in GPUs (TP8), comma separated")
	fl.StringVar(&f.strategies, "strategy", "topology-aware", "strategies to time side by side, comma separated: "+strings.Join(placer.Names(true), ", "))
	fl.Float64Var(&f.occupancy, "occupancy", 0.5, "share of GPUs held by the fill")
	fl.Uint64Var(&f.seed, "seed", 1, "seed of the fill")
	fl.StringVar(&f.model, "model", "dgx-h100", "built-in node model (8 GPUs)")
	fl.BoolVar(&f.noPolicies, "no-policies", false, "time without the shipped policy set")
	fl.IntVar(&f.decisions, "decisions", 200, "decisions timed per cell, at most")
	fl.DurationVar(&f.budget, "budget", 5*time.Second, "time per cell, after at least 5 decisions")
	fl.IntVar(&f.e2e, "e2e", 0, "also measure N decisions end to end through NATS")
	fl.IntVar(&f.e2eGPUs, "e2e-gpus", 10000, "cluster size of the end-to-end run")
	fl.IntVar(&f.e2eJobGPUs, "e2e-job-gpus", 1, "GPUs of each end-to-end job")
	fl.IntVar(&f.e2eWindow, "e2e-window", load.AsyncWindow, "end-to-end submissions awaiting their acknowledgement at once (1: one job at a time)")
	fl.BoolVar(&f.e2eOnly, "e2e-only", false, "skip the decision table")
	fl.StringVar(&f.cpuProfile, "cpu-profile", "", "write a CPU profile of the run to FILE (go tool pprof FILE); with --e2e-only, of the timed window alone")
	fl.StringVar(&f.memProfile, "mem-profile", "", "write the run's allocations to FILE (go tool pprof -sample_index=alloc_space FILE); with --e2e-only also FILE.base at the timed window's start, for go tool pprof -base FILE.base FILE")
	_ = g
	return cmd
}

// parseSizes reads "1k,10k,512" as 1000, 10000, 512.
func parseSizes(s string) ([]int, error) {
	var out []int
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		mult := 1
		if rest, ok := strings.CutSuffix(part, "k"); ok {
			part, mult = rest, 1000
		}
		n, err := strconv.Atoi(part)
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("%q is not a positive size", part)
		}
		out = append(out, n*mult)
	}
	return out, nil
}

// startCPUProfile starts a CPU profile into file (none when file is
// empty); stop ends it and closes the file.
func startCPUProfile(file string) (stop func(), err error) {
	if file == "" {
		return func() {}, nil
	}
	pf, err := os.Create(file)
	if err != nil {
		return nil, fmt.Errorf("--cpu-profile: %w", err)
	}
	if err := pprof.StartCPUProfile(pf); err != nil {
		_ = pf.Close()
		return nil, fmt.Errorf("--cpu-profile: %w", err)
	}
	return func() {
		pprof.StopCPUProfile()
		_ = pf.Close()
	}, nil
}

// writeAllocs writes the allocation profile so far to file. It collects
// garbage first: the profile counts an allocation only once a collection
// has ended after it, so a window's profile would otherwise hold what was
// allocated before it (the services' catch-up) and miss its own last
// allocations.
func writeAllocs(file string) error {
	runtime.GC()
	pf, err := os.Create(file)
	if err != nil {
		return err
	}
	if err := pprof.Lookup("allocs").WriteTo(pf, 0); err != nil {
		_ = pf.Close()
		return err
	}
	return pf.Close()
}
