package main

import (
	"fmt"
	"log/slog"
	"math"
	"os"
	"runtime/debug"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/spf13/pflag"

	"github.com/toposched/toposched/events/bus"
	"github.com/toposched/toposched/events/natsserver"
	"github.com/toposched/toposched/metrics"
	"github.com/toposched/toposched/services/operator"
)

// registerOps adds the flags of a production deployment that every command
// shares: NATS credentials and TLS, and stream replication.
func (g *globals) registerOps(pf *pflag.FlagSet) {
	g.conn.Register(pf)
	replicas := 1
	if v, err := strconv.Atoi(os.Getenv("TOPOSCHED_STREAM_REPLICAS")); err == nil {
		replicas = v
	}
	pf.IntVar(&g.replicas, "replicas", replicas,
		"copies of each JetStream stream and KV bucket the services create: 1 on one server, 3 on a 3-node cluster (env TOPOSCHED_STREAM_REPLICAS)")
}

// natsOptions are the connection's credentials and TLS. A flag error
// becomes an option that fails the connection with it, so that every
// command reports it where it connects.
func (g *globals) natsOptions() []nats.Option {
	opts, err := g.conn.Options()
	if err != nil {
		return []nats.Option{func(*nats.Options) error { return err }}
	}
	return opts
}

// opsFlags are the operator's production flags: metrics and placement's
// lease.
type opsFlags struct {
	metricsListen string
	replica       string
	leaseTTL      time.Duration
	calibration   string
	online        bool
	// agentTTL is the launch watchdog's: 0 turns it off.
	agentTTL time.Duration
	// memoryLimit is the Go runtime's soft memory limit (--memory-limit).
	memoryLimit string
	// kube is serve's Kubernetes service, off unless --kubeconfig.
	kube kubeFlags
	// slurm is serve's Slurm sync service, off unless --slurm.
	slurm slurmFlags
}

// defaultMemoryLimit is the soft memory limit of serve and the services
// unless GOMEMLIMIT or --memory-limit says otherwise. Without one, the
// garbage of a flood of large hostile bodies (each copied on its way
// through the embedded NATS server and the consumers) was collected only
// once the heap had doubled: serve reached 570-730 MB on a few 8 MB
// bodies, under 410 MB with a limit of 384 MiB (BENCHMARKS.md). It is
// soft: past it the collector runs more often, nothing fails; a cluster
// whose state needs more (about 340 MB of heap at 100,000 GPUs) raises it.
const defaultMemoryLimit = 1 << 30

// applyMemoryLimit sets the runtime's soft memory limit: --memory-limit
// (0: none), else GOMEMLIMIT where set, else defaultMemoryLimit.
func (f *opsFlags) applyMemoryLimit(log *slog.Logger) error {
	limit := int64(defaultMemoryLimit)
	switch {
	case f.memoryLimit != "":
		n, err := parseBytes(f.memoryLimit)
		if err != nil || n >= math.MaxInt64 {
			return fmt.Errorf("--memory-limit %q: want a size such as 768MiB or 2GiB (0: none)", f.memoryLimit)
		}
		limit = int64(n)
	case os.Getenv("GOMEMLIMIT") != "":
		return nil // the runtime read it
	}
	if limit == 0 {
		limit = math.MaxInt64
	}
	debug.SetMemoryLimit(limit)
	log.Info("memory limit", "soft_limit_bytes", limit)
	return nil
}

func (f *opsFlags) register(fs *pflag.FlagSet, placement bool) {
	fs.StringVar(&f.metricsListen, "metrics-listen", "",
		"serve /metrics (Prometheus), /healthz and /readyz on HOST:PORT (empty: off)")
	fs.StringVar(&f.memoryLimit, "memory-limit", "",
		"the Go runtime's soft memory limit, such as 768MiB or 4GiB: the collector works harder near it, so that a flood of large bodies does not grow the heap (0: none; default GOMEMLIMIT, else 1GiB)")
	fs.StringVar(&f.calibration, "calibration", "",
		"base calibration set (toposched model calibrate --out) of placement's and the optimizer's cost model, until one is pushed to the calibration bucket (topoctl calibration push) (default: the documented efficiencies)")
	fs.BoolVar(&f.online, "online-calibration", true,
		"let the optimizer move the calibration in the bucket from jobs' telemetry (bounded, outlier-robust steps)")
	if placement {
		fs.StringVar(&f.replica, "replica", os.Getenv("TOPOSCHED_REPLICA"),
			"this replica's name in placement's lease and policy events, unique among live replicas, such as the pod name (env TOPOSCHED_REPLICA; default host/pid)")
		fs.DurationVar(&f.leaseTTL, "lease-ttl", operator.DefaultLeaseTTL,
			"how long placement's lease outlives its holder's last renewal: the failover time after a crash (same on every replica)")
		fs.DurationVar(&f.agentTTL, "agent-ttl", defaultAgentTTL,
			"how long a node agent (toposched agent --exec) may be silent before its jobs are finished as lost and their GPUs freed; also how long a job with a command may wait for an agent to take it; give the agents the same --agent-ttl, so that their ranks stop before (0: no watchdog)")
	}
}

// startMetrics installs the metrics observers and, when asked, serves them.
// It returns the bus observer (nil when metrics are off) and a function
// that, once the operator runs, starts serving; stop ends it.
type metricsRun struct {
	m   *metrics.Metrics
	srv *metrics.Server
}

func newMetricsRun(f *opsFlags) *metricsRun {
	if f.metricsListen == "" {
		return nil
	}
	return &metricsRun{m: metrics.New()}
}

// observe makes the bus and placement report to the metrics.
func (r *metricsRun) observe(bcfg *bus.Config, deps *operator.Deps) {
	if r != nil {
		bcfg.Observer = r.m
		deps.ObservePolicyEval = r.m.PolicyEvaluated
	}
}

// serve starts the endpoint for a running operator of the given services;
// embedded is the embedded NATS server, nil with --nats-url.
func (r *metricsRun) serve(f *opsFlags, b *bus.Bus, op *operator.Operator, services []string, embedded *natsserver.Server, g *globals, extra ...func() error) error {
	if r == nil {
		return nil
	}
	r.m.Watch(operatorStats(op))
	log, _ := g.logger()
	ready := newReadiness(b, op, services, embedded)
	ready.extra = extra
	srv, err := metrics.Listen(f.metricsListen, r.m.Handler(ready.check), log)
	if err != nil {
		return err
	}
	r.srv = srv
	if log != nil {
		log.Info("metrics endpoint ready", "addr", srv.Addr().String(), "paths", "/metrics /healthz /readyz")
	}
	return nil
}

func (r *metricsRun) close() error {
	if r == nil || r.srv == nil {
		return nil
	}
	return r.srv.Close()
}

// operatorStats reads what the metrics show of a running operator: the
// lease, and the leading placement replica's store.
func operatorStats(op *operator.Operator) func() metrics.Stats {
	return func() metrics.Stats {
		var st metrics.Stats
		if ls, ok := op.LeaderStatus(); ok {
			st.LeaseKnown, st.Leader, st.Terms = true, ls.Role == operator.RoleLeader, ls.Terms
		}
		if ps, ok := op.PlacementStats(); ok {
			st.StoreKnown = true
			st.Nodes, st.GPUs, st.HealthyGPU, st.FreeGPUs, st.Jobs = ps.Nodes, ps.GPUs, ps.HealthyGPU, ps.FreeGPUs, ps.Jobs
			st.RebuildIgnored = ps.RebuildIgnored
		}
		return st
	}
}
