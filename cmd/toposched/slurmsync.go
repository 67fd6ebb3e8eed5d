package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync/atomic"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/toposched/toposched/events/bus"
	"github.com/toposched/toposched/metrics"
	"github.com/toposched/toposched/services/operator"
	"github.com/toposched/toposched/services/slurm"
)

// roleSlurm is the Slurm sync service's NATS role and lease key.
const roleSlurm = "slurm"

// slurmFlags are the Slurm sync service's flags, on serve and on
// slurm-sync.
type slurmFlags struct {
	// on: serve runs the service (--slurm); slurm-sync always does.
	on  bool
	cfg slurm.Config
}

func (f *slurmFlags) register(fs *pflag.FlagSet, standalone bool) {
	if !standalone {
		fs.BoolVar(&f.on, "slurm", false, "run the Slurm sync service too: keep the GPUs Slurm gives its own jobs held, and finish toposched's jobs whose Slurm job ended (squeue reads SLURM_CONF)")
	}
	fs.StringVar(&f.cfg.Squeue, "squeue", slurm.DefaultSqueue, "the squeue command polled (a path, or a name on PATH)")
	fs.DurationVar(&f.cfg.Interval, "slurm-poll-interval", slurm.DefaultInterval, "how often squeue --json is read")
	fs.Int64Var(&f.cfg.MaxOutput, "squeue-max-output", slurm.DefaultMaxOutput, "the most bytes of squeue --json output read; a larger output is a failed read")
	fs.DurationVar(&f.cfg.Timeout, "squeue-timeout", slurm.DefaultTimeout, "the longest one squeue call may take")
}

// slurmRun is the Slurm sync service across the terms of its lease.
type slurmRun struct {
	met *slurm.Metrics // nil: no metrics
	// cur is the service of the term this replica leads, nil on a
	// standby.
	cur atomic.Pointer[slurm.Service]
}

// ready is nil once this replica either stands by or leads with its state
// rebuilt and the queue read once.
func (r *slurmRun) ready() error {
	svc := r.cur.Load()
	if svc == nil {
		return nil
	}
	select {
	case <-svc.Ready():
		return nil
	default:
		return errors.New("slurm sync service: rebuilding from the streams and reading the queue")
	}
}

// runSlurm runs the Slurm sync service, one replica at a time (the lease
// named roleSlurm), until ctx ends.
func runSlurm(ctx context.Context, b *bus.Bus, f *slurmFlags, ops *opsFlags, run *slurmRun, log *slog.Logger) error {
	holder := ops.replica
	if holder == "" {
		host, _ := os.Hostname()
		holder = host + "/" + fmt.Sprint(os.Getpid()) + "/" + bus.NewID()[:8]
	}
	log = log.With("service", roleSlurm)
	return operator.Lead(ctx, b, roleSlurm, holder, ops.leaseTTL, log, func(ctx context.Context) error {
		svc, err := slurm.New(f.cfg, slurm.Deps{Bus: b, Log: log, Metrics: run.met})
		if err != nil {
			return err
		}
		run.cur.Store(svc)
		defer run.cur.Store(nil)
		return svc.Run(ctx)
	})
}

func newSlurmSync(g *globals) *cobra.Command {
	var f slurmFlags
	var ops opsFlags
	cmd := &cobra.Command{
		Use:   "slurm-sync",
		Short: "Run the Slurm sync service: keep toposched's GPUs in step with Slurm's allocations",
		Long: `slurm-sync polls squeue --json (--squeue, every --slurm-poll-interval) and
keeps toposched's view of the GPUs in step with slurmctld's:

  - the GPUs Slurm gave to jobs that are not toposched's are published held
    (topology.held.<node>, each node's whole list), so placement never gives
    them out, and freed once those jobs end;
  - a toposched job's Slurm job (its comment is toposched-job=<job id>) that
    ended finishes the toposched job (jobs.finished, the status Slurm gives),
    so placement frees its GPUs;
  - a toposched job that Slurm runs on other nodes or GPUs than decided is
    logged at WARN and counted (toposched_slurm_placement_mismatches_total).

Node names are Slurm's NodeName, GPU indices its GRES indices. squeue reads
SLURM_CONF from the environment. A failed read (slurmctld down) is logged once
per outage and publishes nothing. One replica acts at a time: the holder of the
lease "slurm".`,
		Example: `  SLURM_CONF=/etc/slurm/slurm.conf toposched slurm-sync --nats-url nats://toposched:4222
  toposched serve --cluster cluster.yaml --slurm`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, err := g.logger()
			if err != nil {
				return err
			}
			if err := ops.applyMemoryLimit(log); err != nil {
				return err
			}
			run := &slurmRun{}
			return runLeased(cmd.Context(), g, &ops, g.natsURLOrLocal(), leased{
				role:    roleSlurm,
				metrics: func(m *metrics.Metrics) { run.met = slurm.NewMetrics(m.Registry()) },
				ready:   run.ready,
				run:     func(ctx context.Context, b *bus.Bus) error { return runSlurm(ctx, b, &f, &ops, run, log) },
			}, log)
		},
	}
	f.register(cmd.Flags(), true)
	cmd.Flags().StringVar(&ops.replica, "replica", os.Getenv("TOPOSCHED_REPLICA"),
		"this replica's name in the lease, unique among live replicas (env TOPOSCHED_REPLICA; default host/pid)")
	cmd.Flags().DurationVar(&ops.leaseTTL, "lease-ttl", operator.DefaultLeaseTTL, "the lease bucket's TTL: the same as placement's --lease-ttl")
	cmd.Flags().StringVar(&ops.memoryLimit, "memory-limit", "", "the Go runtime's soft memory limit (0: none; default GOMEMLIMIT, else 1GiB)")
	cmd.Flags().StringVar(&ops.metricsListen, "metrics-listen", "", "serve /metrics (Prometheus), /healthz and /readyz on HOST:PORT (empty: off)")
	return cmd
}
