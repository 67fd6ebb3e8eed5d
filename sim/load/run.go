package load

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"runtime/metrics"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/events/bus"
	"github.com/toposched/toposched/events/natsserver"
	"github.com/toposched/toposched/internal/client"
	"github.com/toposched/toposched/internal/fixtures"
	"github.com/toposched/toposched/internal/placer"
	"github.com/toposched/toposched/internal/store"
	"github.com/toposched/toposched/policies"
	"github.com/toposched/toposched/services/discovery"
	"github.com/toposched/toposched/services/operator"
)

// Config is what Run measures.
type Config struct {
	// Clusters are the cluster sizes in GPUs (default 1k, 10k, 100k).
	Clusters []int
	// Jobs are the job sizes in GPUs, TP8 jobs (default 8, 64, 512, 4096).
	Jobs []int
	// Occupancy is the share of GPUs the fill holds (default 0.5).
	Occupancy float64
	// Seed draws the fill.
	Seed uint64
	// Model is the built-in node model (default dgx-h100).
	Model string
	// Strategies are the planner's strategies to time, side by side
	// (default topology-aware).
	Strategies []string
	// NoPolicies leaves the shipped policy set out.
	NoPolicies bool
	// Decisions is how many decisions to time per cell, at most (default
	// 200); a cell stops early after Budget (default 5 s), with at least
	// 5 decisions.
	Decisions int
	Budget    time.Duration

	// E2E, when above 0, also measures that many decisions end to end.
	E2E int
	// E2EGPUs is the end-to-end cluster size (default 10k).
	E2EGPUs int
	// E2EJobGPUs is the size of each end-to-end job (default 1).
	E2EJobGPUs int
	// E2EWindow is how many submissions may await their acknowledgement
	// at once (default AsyncWindow, as the raw measurement; 1 submits one
	// job at a time, as a script of topoctl submit calls would; at most
	// MaxE2EWindow).
	E2EWindow int
	// E2EOnly skips the decision table.
	E2EOnly bool
	// Log receives the services' logs in e2e mode (nil: discarded).
	Log *slog.Logger
	// Measured, if set, is called when the end-to-end run's timed window
	// opens, and what it returns when the window closes (a CPU profile
	// of the decisions alone, without building the cluster).
	Measured func() (closed func())
}

func (c *Config) defaults() {
	if len(c.Clusters) == 0 {
		c.Clusters = []int{1000, 10000, 100000}
	}
	if len(c.Jobs) == 0 {
		c.Jobs = []int{8, 64, 512, 4096}
	}
	if c.Occupancy == 0 {
		c.Occupancy = 0.5
	}
	if c.Model == "" {
		c.Model = "dgx-h100"
	}
	if len(c.Strategies) == 0 {
		c.Strategies = []string{placer.StrategyTopologyAware}
	}
	if c.Decisions <= 0 {
		c.Decisions = 200
	}
	if c.Budget <= 0 {
		c.Budget = 5 * time.Second
	}
	if c.E2EGPUs <= 0 {
		c.E2EGPUs = 10000
	}
	if c.E2EJobGPUs <= 0 {
		c.E2EJobGPUs = 1
	}
	if c.E2EWindow <= 0 {
		c.E2EWindow = AsyncWindow
	}
}

// Run measures and prints the tables.
func Run(ctx context.Context, out io.Writer, cfg Config) error {
	cfg.defaults()
	if _, err := fmt.Fprintf(out, "toposched load: %s nodes of %d GPUs, rail-optimized fabric (%d rails, %d nodes per pod), GOMAXPROCS %d\n",
		cfg.Model, NodeGPUs, Rails, NodesPerPod, runtime.GOMAXPROCS(0)); err != nil {
		return err
	}
	if !cfg.E2EOnly {
		if err := runDecisions(ctx, out, cfg); err != nil {
			return err
		}
	}
	if cfg.E2E > 0 {
		if !cfg.E2EOnly {
			if _, err := fmt.Fprintln(out); err != nil {
				return err
			}
		}
		return runE2E(ctx, out, cfg)
	}
	return nil
}

func loadPolicies(off bool) (*policies.Set, string, error) {
	if off {
		return nil, "off", nil
	}
	set, err := policies.Compile(policies.Default, "default")
	if err != nil {
		return nil, "", fmt.Errorf("shipped policy set: %w", err)
	}
	return set, "shipped set", nil
}

func runDecisions(ctx context.Context, out io.Writer, cfg Config) error {
	set, polName, err := loadPolicies(cfg.NoPolicies)
	if err != nil {
		return err
	}
	if _, err := fmt.Fprintf(out, "decision latency through placer.Planner.Plan, policies: %s; %.0f%% occupied by a seeded random job mix (seed %d); TP8 jobs; each cell repeats one decision on one snapshot, up to %d times or %v\n\n",
		polName, 100*cfg.Occupancy, cfg.Seed, cfg.Decisions, cfg.Budget); err != nil {
		return err
	}
	header := []string{"cluster", "build", "job", "strategy", "verdict", "n", "p50", "p99", "max", "alloc/decision"}
	var rows [][]string
	flush := func() error {
		err := table(out, header, rows)
		rows = nil
		return err
	}
	for ci, size := range cfg.Clusters {
		cl, err := BuildCluster(size, cfg.Model, cfg.Occupancy, cfg.Seed)
		if err != nil {
			return fmt.Errorf("cluster of %d GPUs: %w", size, err)
		}
		snap := cl.Store.Snapshot()
		build := fmt.Sprintf("%.1f s", cl.Build.Seconds())
		for _, n := range cfg.Jobs {
			job := fixtures.SyntheticJob(fmt.Sprintf("load-%d", n), n, min(n, 8), 1)
			for _, strategy := range cfg.Strategies {
				p := &placer.Planner{Strategy: strategy, Fabric: cl.Fabric, Policies: set, Log: slog.New(slog.DiscardHandler)}
				decide := func(ctx context.Context, snap *store.Snapshot, job events.JobAnalyzed) (string, error) {
					plan, err := p.Plan(ctx, snap, job, placer.PlanOptions{})
					return plan.Verdict.String(), err
				}
				// Bytes allocated per decision: nothing else runs while a
				// cell is timed.
				var before, after runtime.MemStats
				runtime.ReadMemStats(&before)
				lat, verdict, err := TimeDecisions(ctx, snap, job, decide, 5, cfg.Decisions, cfg.Budget)
				if err != nil {
					return fmt.Errorf("%d-GPU job on %d GPUs (%s): %w", n, cl.GPUs, strategy, err)
				}
				runtime.ReadMemStats(&after)
				s := StatsOf(lat)
				alloc := float64(after.TotalAlloc-before.TotalAlloc) / float64(max(s.N, 1))
				rows = append(rows, []string{FormatSize(cl.GPUs), build, fmt.Sprint(n), strategy, verdict, fmt.Sprint(s.N),
					FormatDuration(s.P50), FormatDuration(s.P99), FormatDuration(s.Max), formatKB(alloc)})
				build = ""
			}
		}
		if ci == len(cfg.Clusters)-1 {
			if err := flush(); err != nil {
				return err
			}
		}
	}
	return nil
}

// runE2E measures sustained decisions per second through NATS: an
// embedded server with file-backed streams, every service in this process
// (the shipped policies unless NoPolicies), the cluster published by
// discovery from a cluster file, then a burst of E2E jobs published as
// fast as JetStream acknowledges them, until a watcher has read every
// decision back.
func runE2E(ctx context.Context, out io.Writer, cfg Config) error {
	dir, err := os.MkdirTemp("", "toposched-load-")
	if err != nil {
		return err
	}
	defer func() { _ = os.RemoveAll(dir) }() // a temporary directory: best effort
	ncfg := natsserver.DefaultConfig()
	ncfg.Host, ncfg.Port, ncfg.StoreDir = "127.0.0.1", -1, filepath.Join(dir, "nats")
	srv, err := natsserver.Start(ncfg)
	if err != nil {
		return fmt.Errorf("embedded nats: %w", err)
	}
	defer srv.Shutdown()
	// What the messaging layer alone allows on this server, before any
	// service competes for the cores.
	raw, err := MeasureRaw(ctx, srv.ClientURL(), max(4*cfg.E2E, 20000))
	if err != nil {
		return err
	}
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	b, err := bus.Connect(ctx, bus.Config{URL: srv.ClientURL(), Source: "urn:toposched:load"})
	if err != nil {
		return err
	}
	defer func() { _ = b.Close() }() // after the measurement: JetStream acknowledged every job

	names := NodeNames(cfg.E2EGPUs / NodeGPUs)
	file := filepath.Join(dir, "cluster.yaml")
	if err := os.WriteFile(file, []byte(ClusterYAML(names, cfg.Model)), 0o600); err != nil {
		return err
	}
	pol := operator.PoliciesDefault
	polName := "shipped set"
	if cfg.NoPolicies {
		pol, polName = operator.PoliciesNone, "off"
	}
	op, err := operator.New(operator.Config{Services: operator.All, Discovery: discovery.Config{ClusterFile: file}, Policies: pol, Sole: true},
		operator.Deps{Bus: b, Log: log})
	if err != nil {
		return err
	}
	stop, err := operator.Background(ctx, op)
	if err != nil {
		return err
	}
	defer func() { _ = stop() }() // a service that failed shows as decisions that never came
	total := len(names) * NodeGPUs
	// Placement and the optimizer both hold the whole cluster, and its
	// fabric (published after the nodes), before the window opens: their
	// catch-up with the topology stream is the start's cost, not the
	// decisions'.
	for {
		place, opt := op.PlacementService().Store().Snapshot(), op.OptimizerService().Store().Snapshot()
		t, _ := place.Capacity("")
		o, _ := opt.Capacity("")
		if t == total && o == total && place.HasFabric() && opt.HasFabric() {
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}

	n := cfg.E2E
	sent := make([]time.Time, n)
	var mu sync.Mutex
	lat := make([]time.Duration, 0, n)
	other := 0
	ready := make(chan struct{})
	done := make(chan error, 1)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		done <- client.Watch(wctx, b, client.FromNow, ready, func(o client.Outcome) error {
			var i int
			if _, err := fmt.Sscanf(o.JobID(), "load-%d", &i); err != nil || i < 0 || i >= n {
				return nil
			}
			mu.Lock()
			defer mu.Unlock()
			if o.Decided != nil {
				lat = append(lat, time.Since(sent[i]))
			} else {
				other++
			}
			if len(lat)+other == n {
				return bus.ErrStop
			}
			return nil
		})
	}()
	select {
	case <-ready:
	case err := <-done:
		return fmt.Errorf("watch: %w", err)
	}
	closed := func() {}
	if cfg.Measured != nil {
		closed = cfg.Measured()
	}
	// Bytes allocated in the window by the whole process: the server, every
	// service and the submitter, as a deployment in one process would.
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	tuned0, err := tunings(ctx, b)
	if err != nil {
		return err
	}
	cpu0, cpuOK := processCPU()
	gc0 := gcCPU()
	start := time.Now()
	if err := submitAll(ctx, b, n, cfg.E2EJobGPUs, cfg.E2EWindow, func(i int) {
		mu.Lock()
		sent[i] = time.Now()
		mu.Unlock()
	}); err != nil {
		return err
	}
	if err := <-done; err != nil && ctx.Err() != nil {
		return ctx.Err()
	}
	elapsed := time.Since(start)
	cpu1, _ := processCPU()
	gc1 := gcCPU()
	runtime.ReadMemStats(&after)
	closed()
	tuning, err := awaitTuning(ctx, b, tuned0, len(lat), start, cpu0)
	if err != nil {
		return err
	}
	mu.Lock()
	defer mu.Unlock()
	s := StatsOf(lat)
	if _, err := fmt.Fprintf(out, "end to end through NATS: %d jobs of %d GPUs on %s GPUs (%s), all services in one process, file-backed embedded server, policies: %s, submissions awaiting acknowledgement at once: %d\n\n",
		n, cfg.E2EJobGPUs, FormatSize(total), cfg.Model, polName, cfg.E2EWindow); err != nil {
		return err
	}
	rate := float64(len(lat)) / elapsed.Seconds()
	alloc := float64(after.TotalAlloc-before.TotalAlloc) / float64(max(len(lat), 1))
	cpuPer, gcShare := "-", "-"
	if used := cpu1 - cpu0; cpuOK && used > 0 {
		cpuPer = FormatDuration(used / time.Duration(max(len(lat), 1)))
		gcShare = fmt.Sprintf("%.0f%%", 100*(gc1-gc0)/used.Seconds())
	}
	if err := table(out, []string{"decided", "other", "seconds", "decisions/s", "p50 latency", "p99 latency", "alloc/decision", "cpu/decision", "gc", "of raw async publish"}, [][]string{{
		fmt.Sprint(len(lat)), fmt.Sprint(other), fmt.Sprintf("%.2f", elapsed.Seconds()),
		fmt.Sprintf("%.0f", rate), FormatDuration(s.P50), FormatDuration(s.P99), formatKB(alloc), cpuPer, gcShare,
		fmt.Sprintf("%.2f%%", 100*rate/raw.AsyncPerSecond)}}); err != nil {
		return err
	}
	_, err = fmt.Fprintf(out, "\nalloc/decision: bytes the whole process (server, services, submitter) allocated in the window, per decision; cpu/decision: the process's CPU time (user and system) in the window, per decision, which moves less with a shared host's speed than decisions/s does; gc: the garbage collector's share of it (runtime/metrics' estimate).\nraw JetStream publish on the same server, same run, before the services started: %d messages of %d bytes to a file-backed stream: %.0f/s async (%d acknowledgements outstanding), %.0f/s sync. A decision costs about four events.\n",
		raw.Messages, raw.Bytes, raw.AsyncPerSecond, AsyncWindow, raw.SyncPerSecond)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(out, tuning.String(elapsed, len(lat), cpuOK))
	return err
}

// tuningWait bounds how long the run waits, after the last decision, for
// the optimizer to tune every decision.
const tuningWait = time.Minute

// tuningLag is how far the optimizer, which tunes each decision off the
// decision path, was behind when the last decision came.
type tuningLag struct {
	// atLast is how many decisions were tuned when the last was decided,
	// all how many were tuned by the end of the wait.
	atLast, all int
	// done is when the last was tuned, measured from the window's start;
	// cpu the process's CPU time from the window's start until then.
	done, cpu time.Duration
}

// String says what the window's figures leave out: the tuning still to
// come when the last decision came, and the CPU a decision costs once
// each is tuned too.
func (t tuningLag) String(window time.Duration, decided int, cpuOK bool) string {
	if t.all < decided {
		return fmt.Sprintf("tuning (the optimizer, off the decision path): %d of %d decisions tuned when the last was decided, %d within %s after it.",
			t.atLast, decided, t.all, tuningWait)
	}
	cpu := "-"
	if cpuOK && decided > 0 {
		cpu = FormatDuration(t.cpu / time.Duration(decided))
	}
	return fmt.Sprintf("tuning (the optimizer, off the decision path): %d of %d decisions tuned when the last was decided, all %.2f s later; cpu/decision with every decision tuned: %s.",
		t.atLast, decided, (t.done - window).Seconds(), cpu)
}

// awaitTuning waits until the runtime stream holds a tuning for each of
// the decided decisions past the tuned0 it held when the window opened.
func awaitTuning(ctx context.Context, b *bus.Bus, tuned0, decided int, start time.Time, cpu0 time.Duration) (tuningLag, error) {
	var t tuningLag
	n, err := tunings(ctx, b)
	if err != nil {
		return t, err
	}
	t.atLast, t.all = n-tuned0, n-tuned0
	deadline := time.Now().Add(tuningWait)
	for t.all < decided && time.Now().Before(deadline) {
		select {
		case <-ctx.Done():
			return t, ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
		if n, err = tunings(ctx, b); err != nil {
			return t, err
		}
		t.all = n - tuned0
	}
	t.done = time.Since(start)
	cpu, _ := processCPU()
	t.cpu = cpu - cpu0
	return t, nil
}

// tunings is how many runtime.tuning events the runtime stream holds.
func tunings(ctx context.Context, b *bus.Bus) (int, error) {
	subject := b.Subjects.Of(events.NameRuntimeTuning)
	st, err := b.JetStream().Stream(ctx, b.StreamName(events.DomainRuntime))
	if err != nil {
		return 0, fmt.Errorf("runtime stream: %w", err)
	}
	info, err := st.Info(ctx, jetstream.WithSubjectFilter(subject))
	if err != nil {
		return 0, fmt.Errorf("runtime stream: %w", err)
	}
	return int(info.State.Subjects[subject]), nil
}

// MaxE2EWindow bounds Config.E2EWindow: nats.go keeps at most 4,000
// asynchronous publishes outstanding on a connection, and the services
// share the submitter's.
const MaxE2EWindow = 2048

// submitAll publishes n jobs of gpus GPUs, with up to window of them
// awaiting JetStream's acknowledgement at once; sent is told before each.
// Events published on one bus are stored in the order sent, so the jobs
// arrive in order whatever the window.
func submitAll(ctx context.Context, b *bus.Bus, n, gpus, window int, sent func(i int)) error {
	inflight := make([]*bus.Pending, 0, window)
	for i := range n {
		if len(inflight) == window {
			if _, err := inflight[0].Wait(ctx); err != nil {
				return fmt.Errorf("submit: %w", err)
			}
			inflight = inflight[1:]
		}
		sent(i)
		job := &events.JobSubmitted{JobID: fmt.Sprintf("load-%d", i), GPUs: gpus}
		_, p, err := b.PublishAsync(ctx, job)
		if err != nil {
			return fmt.Errorf("submit %s: %w", job.JobID, err)
		}
		inflight = append(inflight, p)
	}
	for _, p := range inflight {
		if _, err := p.Wait(ctx); err != nil {
			return fmt.Errorf("submit: %w", err)
		}
	}
	return nil
}

// ClusterYAML is a cluster file of the nodes (one entry each, of the
// built-in model) with the rail-optimized fabric.
func ClusterYAML(names []string, model string) string {
	var b strings.Builder
	b.WriteString("name: load\nnodes:\n")
	for _, n := range names {
		fmt.Fprintf(&b, "  - {name: %s, model: %s}\n", n, model)
	}
	b.WriteString("fabric:\n  switches:\n")
	for _, sw := range FabricEvent(names).Switches {
		fmt.Fprintf(&b, "    - {name: %s, tier: %s", sw.Name, sw.Tier)
		if sw.LinkGbps > 0 {
			fmt.Fprintf(&b, ", link_gbps: %g", sw.LinkGbps)
		}
		if sw.Oversubscription > 0 {
			fmt.Fprintf(&b, ", oversubscription: %g", sw.Oversubscription)
		}
		if sw.Uplinks > 0 {
			fmt.Fprintf(&b, ", uplinks: %d, uplink_gbps: %g", sw.Uplinks, sw.UplinkGbps)
		}
		if sw.Rail != nil {
			fmt.Fprintf(&b, ", rail: %d", *sw.Rail)
		}
		if len(sw.Nodes) > 0 {
			fmt.Fprintf(&b, ", nodes: [%s]", strings.Join(sw.Nodes, ", "))
		}
		if len(sw.Switches) > 0 {
			fmt.Fprintf(&b, ", switches: [%s]", strings.Join(sw.Switches, ", "))
		}
		b.WriteString("}\n")
	}
	return b.String()
}

// gcCPU is runtime/metrics' estimate of the CPU time the garbage collector
// has used so far (its marking, by its own workers and by assists, and
// its pauses), in seconds.
func gcCPU() float64 {
	s := []metrics.Sample{{Name: "/cpu/classes/gc/total:cpu-seconds"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindFloat64 {
		return 0
	}
	return s[0].Value.Float64()
}
