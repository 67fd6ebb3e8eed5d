package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"

	"github.com/toposched/toposched/internal/gpuspeed"
	"github.com/toposched/toposched/internal/placer"
	"github.com/toposched/toposched/internal/textout"
	"github.com/toposched/toposched/services/placement"
	"github.com/toposched/toposched/sim/replay"
)

type replayFlags struct {
	trace, nodes, jobs, cluster string
	speed                       string
	strategy                    string
	compare                     string
	seed                        uint64
	limit                       int
	report                      string
	policies                    string
	reserveAfter                time.Duration
	maxStretch                  float64
	queueOrder                  string
	backfill                    bool
	compute, computeReference   string
	dataDir                     string
	noProgress                  bool
	hold                        bool
	stall                       time.Duration
	cpuProfile                  string
	// synthetic
	seeds          string
	gpus           int
	count, burst   int
	sizes          string
	durationMedian time.Duration
	durationSigma  float64
	rate, load     float64
	wholeNodes     float64
}

func newReplay(g *globals) *cobra.Command {
	f := replayFlags{}
	cmd := &cobra.Command{
		Use:   "replay",
		Short: "Replay a job trace on a cluster through every service and report placement, queueing, fragmentation and speed",
		Long: `replay starts an embedded NATS server and every service (policies on, as
serve runs them), publishes the cluster, submits the trace's jobs at their
arrival times and sends jobs.finished when each ends, then reports.

Traces (read by path; nothing is copied):
  --trace alibaba-openb --nodes openb_node_list_gpu_node.csv --jobs openb_pod_list_default.csv
  --trace itp|philly|helios --jobs FILE --cluster CLUSTERFILE
  --trace synthetic [--cluster FILE | --gpus N] --count N --seed S   (Poisson arrivals)
  --trace synthetic --gpus N --burst 10000    (N jobs at once: throughput and latency)
  --trace synthetic ... --seeds 1-10 --compare aware,blind,...   (one trace per seed: who wins how often)

--speed max (default) replays on a virtual clock, one event at a time,
waiting for every outcome an event causes; --speed N paces the wall clock
at N trace seconds per second. --compare replays the trace once per
strategy and reports them side by side: --compare aware,blind, or
--compare aware,blind,binpack,gpuallocator,random for what peers'
schedulers would do (spread too). A job's run time is
its trace duration scaled by the cost model's step time on the placement
it got over that on an ideal placement of its size, so placement changes
completion times. The report directory gets summary.json, jobs.csv,
timeline.csv, replay.svg (allocation and fragmentation over time),
jct.svg (completion-time distribution) and slowdown.svg (slowdown by job
size). With blind in --compare, each strategy's mean JCT is also given
over blind's, by job size, with the share it captured of the gain blind
would have had with every run ideal (summary.json's vs_blind). The model (clocks, run time, fragmentation, how jobs get a
parallelism) is in sim/replay's package doc.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if g.logLevel == "info" {
				g.logLevel = "warn" // the output is the report
			}
			stop, err := startCPUProfile(f.cpuProfile)
			if err != nil {
				return err
			}
			defer stop()
			if f.seeds != "" {
				if f.trace != replay.KindSynthetic || f.burst > 0 {
					return errors.New("replay --seeds: for --trace synthetic on the virtual clock (not --burst)")
				}
				seeds, err := parseSeeds(f.seeds)
				if err != nil {
					return err
				}
				return runSeeds(cmd.Context(), g, f, seeds, cmd.OutOrStdout())
			}
			return runReplay(cmd.Context(), g, f, cmd.OutOrStdout())
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.trace, "trace", "", "alibaba-openb, itp, philly, helios or synthetic")
	fl.StringVar(&f.nodes, "nodes", "", "alibaba-openb: the node list (openb_node_list_gpu_node.csv)")
	fl.StringVar(&f.jobs, "jobs", "", "the pod list or job log")
	fl.StringVar(&f.cluster, "cluster", "", "cluster file (job logs; synthetic instead of --gpus)")
	fl.StringVar(&f.speed, "speed", "max", "max (virtual clock) or trace seconds per wall second")
	fl.StringVar(&f.strategy, "strategy", placer.StrategyTopologyAware, "placement strategy: "+strings.Join(placer.Names(true), ", "))
	fl.StringVar(&f.compare, "compare", "", "replay once per strategy of this comma-separated list (aware = topology-aware), e.g. aware,blind, and report them side by side")
	fl.BoolVar(&f.hold, "hold", false, "jobs never finish: the cluster fills in arrival order (the ATC'23 fragmentation study's method)")
	fl.Uint64Var(&f.seed, "seed", 1, "seed of the synthetic trace and of the jobs' parallelism and models")
	fl.IntVar(&f.limit, "limit", 0, "replay only the first N jobs by arrival (0: all)")
	fl.StringVar(&f.report, "report", "", "directory for summary.json, jobs.csv, timeline.csv and the plots (replay.svg, jct.svg, slowdown.svg)")
	fl.StringVar(&f.policies, "policies", "", "policy set: a directory, none, or empty for the shipped set")
	maxStretchFlag(fl, &f.maxStretch)
	queueOrderFlag(fl, &f.queueOrder)
	backfillFlag(fl, &f.backfill)
	fl.DurationVar(&f.reserveAfter, "reserve-after", placement.DefaultReserveAfter, "placement's reservation for the queue's head, as serve's --reserve-after, counted on the virtual clock (negative: off; every strategy honours it, see sim/replay's package doc)")
	fl.StringVar(&f.compute, "compute", computeBlind, "run time's compute: blind (the trace's, whatever GPU model a job lands on), per-model "+
		"(scaled to the model a job lands on from --compute-reference's, and weighed by placement; see sim/replay's package doc, Run time) "+
		"or charge-only (scaled, but placement does not weigh it)")
	fl.StringVar(&f.computeReference, "compute-reference", "a100", "--compute per-model: the GPU model the trace's durations were measured on (a name internal/gpuspeed knows, such as a100, v100, h100)")
	fl.StringVar(&f.dataDir, "data-dir", "", "where the embedded server keeps its streams (default: a temporary directory)")
	fl.BoolVar(&f.noProgress, "no-progress", false, "no progress bar (it is off anyway when stderr is not a terminal)")
	fl.StringVar(&f.cpuProfile, "cpu-profile", "", "write a CPU profile of the run to FILE (go tool pprof FILE)")
	fl.DurationVar(&f.stall, "stall", 2*time.Minute, "give up when no outcome comes for this long")
	fl.IntVar(&f.gpus, "gpus", 1024, "synthetic: GPUs of the generated cluster (whole pods of 32 8-GPU nodes)")
	fl.StringVar(&f.seeds, "seeds", "", "synthetic: replay one trace per seed (1-10, or 1,4,9) under each --compare strategy and report which has the lowest mean JCT, per seed and over all")
	fl.IntVar(&f.count, "count", 1000, "synthetic: jobs to draw")
	fl.IntVar(&f.burst, "burst", 0, "synthetic: submit this many jobs at once, send no finish, measure throughput and latency")
	fl.StringVar(&f.sizes, "sizes", "", "synthetic: job-size mix GPUS:WEIGHT,... (default 1:40,2:10,4:10,8:20,16:8,32:6,64:4,128:2)")
	fl.DurationVar(&f.durationMedian, "duration-median", time.Hour, "synthetic: median run time (log-normal)")
	fl.Float64Var(&f.durationSigma, "duration-sigma", 1.5, "synthetic: sigma of the log-normal run time")
	fl.Float64Var(&f.rate, "rate", 0, "synthetic: arrivals per hour (0: from --load)")
	fl.Float64Var(&f.load, "load", 0.9, "synthetic: offered load that sets the arrival rate")
	fl.Float64Var(&f.wholeNodes, "whole-nodes", 0.5, "synthetic: share of multi-node jobs that ask for whole nodes")
	return cmd
}

// prepared is a cluster and a trace ready to replay.
type prepared struct {
	clusterFile string
	inv         *replay.Inventory
	trace       *replay.Trace
	cleanup     func()
}

func prepareReplay(f replayFlags) (*prepared, error) {
	work, err := os.MkdirTemp("", "toposched-replay-")
	if err != nil {
		return nil, fmt.Errorf("replay: %w", err)
	}
	p := &prepared{cleanup: func() { _ = os.RemoveAll(work) }} // a temporary directory: best effort
	fail := func(err error) (*prepared, error) {
		p.cleanup()
		return nil, err
	}
	need := func(flag, v string) error {
		if v == "" {
			return fmt.Errorf("replay --trace %s: %s is required", f.trace, flag)
		}
		return nil
	}
	writeCluster := func(c *replay.ClusterSpec) error {
		p.clusterFile = filepath.Join(work, "cluster.yaml")
		return c.WriteFile(p.clusterFile)
	}
	var notes []string
	switch f.trace {
	case replay.KindAlibaba:
		if err := errors.Join(need("--nodes", f.nodes), need("--jobs", f.jobs)); err != nil {
			return fail(err)
		}
		if f.cluster != "" {
			return fail(errors.New("replay --trace alibaba-openb: the cluster comes from --nodes; --cluster is not used"))
		}
		nodes, n, err := replay.LoadAlibabaNodes(f.nodes)
		if err != nil {
			return fail(err)
		}
		notes = n
		if err := writeCluster(replay.AlibabaCluster(nodes, filepath.Base(f.nodes))); err != nil {
			return fail(err)
		}
	case replay.KindITP, replay.KindPhilly, replay.KindHelios:
		if err := errors.Join(need("--jobs", f.jobs), need("--cluster", f.cluster)); err != nil {
			return fail(err)
		}
		p.clusterFile = f.cluster
	case replay.KindSynthetic:
		if f.cluster != "" {
			p.clusterFile = f.cluster
		} else if err := writeCluster(replay.SyntheticCluster(f.gpus)); err != nil {
			return fail(err)
		}
	default:
		return fail(fmt.Errorf("replay --trace %q: expected alibaba-openb, itp, philly, helios or synthetic", f.trace))
	}
	if p.inv, err = replay.LoadInventory(p.clusterFile); err != nil {
		return fail(err)
	}
	if f.trace == replay.KindSynthetic {
		cfg := replay.SynthConfig{Jobs: f.count, Seed: f.seed, WholeNodes: f.wholeNodes,
			DurationMedian: f.durationMedian.Seconds(), DurationSigma: f.durationSigma, RatePerHour: f.rate, Load: f.load}
		if f.burst > 0 {
			cfg.Jobs = f.burst
		}
		if f.sizes != "" {
			if cfg.Sizes, err = replay.ParseSizes(f.sizes); err != nil {
				return fail(err)
			}
		}
		p.trace, err = replay.Generate(cfg, p.inv.GPUs, p.inv.MaxNodeGPUs)
	} else {
		if f.burst > 0 {
			return fail(errors.New("replay: --burst is for --trace synthetic"))
		}
		p.trace, err = replay.LoadTrace(f.trace, f.jobs)
		if err == nil && f.trace != replay.KindAlibaba {
			replay.SingleNode(p.trace, p.inv.MaxNodeGPUs)
		}
	}
	if err != nil {
		return fail(err)
	}
	p.trace.Notes = append(notes, p.trace.Notes...)
	if f.reserveAfter >= 0 {
		p.trace.Notes = append(p.trace.Notes, fmt.Sprintf("placement holds nodes for the queue's head once it has waited %v (--reserve-after), under every strategy", f.reserveAfter))
	} else {
		p.trace.Notes = append(p.trace.Notes, "--reserve-after off: no nodes are held for a starving job")
	}
	if f.reserveAfter >= 0 && f.maxStretch > 0 {
		p.trace.Notes = append(p.trace.Notes, fmt.Sprintf("topology-aware starts a job spread over nodes only where it is predicted at most %.2f times as slow as on an ideal placement, "+
			"or once nodes held for it hold it (--max-stretch; the peers start it on any placement)", f.maxStretch))
	}
	switch f.queueOrder {
	case placement.QueueByArrival:
		p.trace.Notes = append(p.trace.Notes, "placement tries the waiting jobs in arrival order (--queue-order arrival), under every strategy")
	case placement.QueueByWork:
		p.trace.Notes = append(p.trace.Notes, "placement tries the waiting jobs in the order of their first waits plus their expected work, the run time it learns for each size "+
			"times the job's share of a node (--queue-order expected-work), under every strategy")
	default:
		p.trace.Notes = append(p.trace.Notes, "placement tries the waiting jobs in the order they would end had each started when it first waited, from the run times it learns "+
			"for each size (--queue-order expected-end), under every strategy")
	}
	if f.reserveAfter >= 0 && f.backfill {
		p.trace.Notes = append(p.trace.Notes, "a job runs on held nodes when it is expected to end before the jobs on them, from the run times placement learns (--backfill), under every strategy")
	}
	if f.hold {
		replay.Hold(p.trace)
	}
	p.trace.Limit(f.limit)
	return p, nil
}

func parseSpeed(s string) (float64, error) {
	if s == "max" || s == "" {
		return 0, nil
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil || !(v > 0) || v > 1e12 {
		return 0, fmt.Errorf("--speed %q: expected max or a positive number of trace seconds per second", s)
	}
	return v, nil
}

// replaySettings are what every replay of one command shares.
type replaySettings struct {
	log        *slog.Logger
	speed      float64
	strategies []string
	// computeReference is replay.Config's ("" compute-blind).
	computeReference string
}

func newReplaySettings(g *globals, f replayFlags) (replaySettings, error) {
	var rs replaySettings
	var err error
	if rs.log, err = g.logger(); err != nil {
		return rs, err
	}
	if rs.speed, err = parseSpeed(f.speed); err != nil {
		return rs, err
	}
	if rs.computeReference, err = computeReference(f); err != nil {
		return rs, err
	}
	rs.strategies, err = replayStrategies(f)
	return rs, err
}

// --compute's values.
const (
	computeBlind      = "blind"
	computePerModel   = "per-model"
	computeChargeOnly = "charge-only"
)

// computeReference is replay.Config.ComputeReference from --compute and
// --compute-reference: "" when compute is blind.
func computeReference(f replayFlags) (string, error) {
	switch f.compute {
	case computeBlind:
		return "", nil
	case computePerModel, computeChargeOnly:
		if _, ok := gpuspeed.Lookup(f.computeReference); !ok {
			names := []string{}
			for _, s := range gpuspeed.Models() {
				names = append(names, s.Name)
			}
			return "", fmt.Errorf("replay: --compute-reference %q is no GPU model the table knows: expected one of %s", f.computeReference, strings.Join(names, ", "))
		}
		return f.computeReference, nil
	}
	return "", fmt.Errorf("replay: --compute %q: expected %s, %s or %s", f.compute, computeBlind, computePerModel, computeChargeOnly)
}

// config is the replay of p under one strategy, its data in dataDir.
func (rs replaySettings) config(f replayFlags, p *prepared, strategy, dataDir string) replay.Config {
	return replay.Config{ClusterFile: p.clusterFile, Inventory: p.inv, Trace: p.trace, Strategy: strategy, Speed: rs.speed,
		Burst: f.burst > 0, Seed: f.seed, Policies: f.policies, ReserveAfter: f.reserveAfter, MaxStretch: maxStretch(f.maxStretch), QueueOrder: f.queueOrder, Backfill: f.backfill, DataDir: dataDir,
		ComputeReference: rs.computeReference, ChargeOnly: f.compute == computeChargeOnly, Stall: f.stall, Log: rs.log}
}

func runReplay(ctx context.Context, g *globals, f replayFlags, out io.Writer) error {
	rs, err := newReplaySettings(g, f)
	if err != nil {
		return err
	}
	p, err := prepareReplay(f)
	if err != nil {
		return err
	}
	defer p.cleanup()
	tr := p.trace
	w := textout.New(out)
	w.Printf("replay: %s (%d records, %d jobs", tr.Source, tr.Records, len(tr.Jobs))
	if n := tr.SkippedTotal(); n > 0 {
		w.Printf(", %d skipped", n)
	}
	w.Printf(") on %s: %d nodes, %d GPUs\n", p.inv.Name, len(p.inv.Nodes), p.inv.GPUs)
	for reason, n := range tr.Skipped {
		w.Printf("  skipped %d: %s\n", n, reason)
	}
	for _, n := range tr.Notes {
		w.Printf("  note: %s\n", n)
	}
	if err := w.Err(); err != nil {
		return err
	}
	var results []*replay.Result
	for _, s := range rs.strategies {
		cfg := rs.config(f, p, s, f.dataDir)
		if !f.noProgress && isTerminal(os.Stderr) {
			cfg.Progress = func(total int) replay.Progress { return newBar(total, s) }
		}
		r, err := replay.Run(ctx, cfg)
		if err != nil {
			return err
		}
		results = append(results, r)
	}
	if _, err := fmt.Fprintln(out); err != nil {
		return err
	}
	var sums []*replay.Summary
	for _, r := range results {
		sums = append(sums, &r.Summary)
	}
	replay.CompareWithBlind(sums...)
	if err := replay.WriteTable(out, sums...); err != nil {
		return err
	}
	if f.report != "" {
		if err := replay.WriteReport(f.report, results...); err != nil {
			return err
		}
		if _, err := fmt.Fprintf(out, "\nreport: %s\n", strings.Join([]string{
			filepath.Join(f.report, "summary.json"), "jobs.csv", "timeline.csv", "replay.svg", "jct.svg", "slowdown.svg"}, ", ")); err != nil {
			return err
		}
	}
	return nil
}

// replayStrategies is --strategy, or --compare's list: names the
// placement service runs ("aware" for topology-aware), each once.
func replayStrategies(f replayFlags) ([]string, error) {
	list := []string{f.strategy}
	flag := "--strategy"
	if f.compare != "" {
		list, flag = strings.Split(f.compare, ","), "--compare"
	}
	var out []string
	for _, name := range list {
		name = strings.TrimSpace(name)
		if name == "aware" {
			name = placer.StrategyTopologyAware
		}
		if _, err := placer.Lookup(name, true); err != nil {
			return nil, fmt.Errorf("%s: %w", flag, err)
		}
		if slices.Contains(out, name) {
			return nil, fmt.Errorf("%s: %s is listed twice", flag, name)
		}
		out = append(out, name)
	}
	return out, nil
}

func isTerminal(f *os.File) bool {
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// bar is the progress bar: one step per job submitted and per finish sent.
type bar struct{ b *progressbar.ProgressBar }

func newBar(total int, label string) replay.Progress {
	return bar{progressbar.NewOptions(total, progressbar.OptionSetWriter(os.Stderr), progressbar.OptionSetDescription(label),
		progressbar.OptionShowCount(), progressbar.OptionThrottle(200*time.Millisecond), progressbar.OptionSetWidth(30),
		progressbar.OptionClearOnFinish())}
}

func (b bar) Add(n int) { _ = b.b.Add(n) }
func (b bar) Finish()   { _ = b.b.Finish() }
