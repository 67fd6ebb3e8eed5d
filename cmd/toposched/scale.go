package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/toposched/toposched/internal/placer"
	"github.com/toposched/toposched/internal/textout"
	"github.com/toposched/toposched/sim/replay"
)

func newScale(g *globals) *cobra.Command {
	var (
		sizes    string
		burst    int
		strategy string
		seed     uint64
		report   string
		policies string
		stall    time.Duration
		profile  string
	)
	cmd := &cobra.Command{
		Use:   "scale",
		Short: "Burst submissions into synthetic clusters of growing size: decision rate, latency and memory",
		Long: `scale runs, for each cluster size, the equivalent of

  toposched replay --trace synthetic --gpus N --burst B

a synthetic rail-optimized cluster (HGX H100 pods, every 8th pod PCIe
L40S servers) with every service on an embedded NATS server, and B jobs
of the synthetic size mix submitted at once. It prints one row per size
and writes scale.json into --report.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if g.logLevel == "info" {
				g.logLevel = "warn"
			}
			log, err := g.logger()
			if err != nil {
				return err
			}
			stop, err := startCPUProfile(profile)
			if err != nil {
				return err
			}
			defer stop()
			var rows []replay.Summary
			out := cmd.OutOrStdout()
			for s := range strings.SplitSeq(sizes, ",") {
				gpus, err := strconv.Atoi(strings.TrimSpace(s))
				if err != nil || gpus < 1 {
					return fmt.Errorf("--gpus %q: expected sizes such as 1000,10000,100000", sizes)
				}
				f := replayFlags{trace: replay.KindSynthetic, gpus: gpus, burst: burst, seed: seed,
					durationMedian: time.Hour, durationSigma: 1.5, load: 0.9, wholeNodes: 0.5}
				sum, err := scaleOne(cmd.Context(), f, strategy, policies, stall, log)
				if err != nil {
					return err
				}
				if _, err := fmt.Fprintf(out, "%d GPUs: %.0f decisions/s, p99 %.2f s\n", sum.ClusterGPUs, sum.DecisionsPerSecond, sum.DecisionLatencyP99Seconds); err != nil {
					return err
				}
				rows = append(rows, *sum)
			}
			if _, err := fmt.Fprintln(out); err != nil {
				return err
			}
			if err := writeScaleTable(out, rows); err != nil {
				return err
			}
			if report != "" {
				if err := os.MkdirAll(report, 0o755); err != nil {
					return fmt.Errorf("scale: %w", err)
				}
				data, err := json.MarshalIndent(rows, "", "  ")
				if err != nil {
					return fmt.Errorf("scale: %w", err)
				}
				if err := os.WriteFile(filepath.Join(report, "scale.json"), append(data, '\n'), 0o644); err != nil {
					return fmt.Errorf("scale: %w", err)
				}
			}
			return nil
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&sizes, "gpus", "1000,10000,100000", "cluster sizes in GPUs, comma separated")
	fl.IntVar(&burst, "burst", 10000, "jobs submitted at once")
	fl.StringVar(&strategy, "strategy", placer.StrategyTopologyAware, "placement strategy: "+strings.Join(placer.Names(true), ", "))
	fl.Uint64Var(&seed, "seed", 1, "seed of the job mix")
	fl.StringVar(&report, "report", "", "directory for scale.json")
	fl.StringVar(&policies, "policies", "", "policy set: a directory, none, or empty for the shipped set")
	fl.DurationVar(&stall, "stall", 5*time.Minute, "give up when no outcome comes for this long")
	fl.StringVar(&profile, "cpu-profile", "", "write a CPU profile of the run to FILE (go tool pprof FILE)")
	return cmd
}

func scaleOne(ctx context.Context, f replayFlags, strategy, policies string, stall time.Duration, log *slog.Logger) (*replay.Summary, error) {
	p, err := prepareReplay(f)
	if err != nil {
		return nil, err
	}
	defer p.cleanup()
	cfg := replay.Config{ClusterFile: p.clusterFile, Inventory: p.inv, Trace: p.trace, Strategy: strategy,
		Burst: true, Seed: f.seed, Policies: policies, ReserveAfter: -1, Stall: stall, Log: log}
	if isTerminal(os.Stderr) {
		cfg.Progress = func(total int) replay.Progress { return newBar(total, fmt.Sprintf("%d GPUs", p.inv.GPUs)) }
	}
	r, err := replay.Run(ctx, cfg)
	if err != nil {
		return nil, err
	}
	return &r.Summary, nil
}

func writeScaleTable(w io.Writer, rows []replay.Summary) error {
	tw := textout.Table(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	tw.Println("GPUs\tnodes\tjobs\tplaced/pending/rejected\tsetup\tdecisions/s\tlatency p50\tp99\tpeak heap\tpeak RSS\t")
	for _, s := range rows {
		tw.Printf("%d\t%d\t%d\t%d/%d/%d\t%.1f s\t%.0f\t%.2f s\t%.2f s\t%d MiB\t%d MiB\t\n", s.ClusterGPUs, s.Nodes, s.JobsTotal,
			s.Placed, s.Pending, s.Rejected, s.SetupSeconds, s.DecisionsPerSecond, s.DecisionLatencyP50Seconds,
			s.DecisionLatencyP99Seconds, s.PeakHeapBytes>>20, s.PeakRSSBytes>>20)
	}
	return tw.Flush()
}
