package replay

// Run and its runner: the configuration, the embedded server and services
// a replay starts, each job's state, and the timeline it samples. The
// clocks that drive it are in clocks.go.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/events/bus"
	"github.com/toposched/toposched/events/natsserver"
	"github.com/toposched/toposched/internal/client"
	"github.com/toposched/toposched/services/discovery"
	"github.com/toposched/toposched/services/operator"
	"github.com/toposched/toposched/services/optimizer"
	"github.com/toposched/toposched/services/placement"
)

// Config says what one replay runs.
type Config struct {
	// ClusterFile is given to discovery; Inventory is the same cluster
	// as the replay sees it (LoadInventory).
	ClusterFile string
	Inventory   *Inventory
	Trace       *Trace
	// Strategy is placement's: topology-aware or blind.
	Strategy string
	// Speed is trace seconds per wall second; 0 replays as fast as
	// possible on a virtual clock (see the package doc).
	Speed float64
	// Burst submits every job at once, sends no finish, and measures
	// throughput and latency (arrival times are ignored).
	Burst bool
	// Seed draws the jobs' parallelism and models (Shape).
	Seed uint64
	// Policies is the operator's policy set: "" the shipped set, "none",
	// or a directory.
	Policies string
	// ReserveAfter is placement's --reserve-after (negative: never).
	ReserveAfter time.Duration
	// MaxStretch is placement's --max-stretch (0: the default; negative:
	// off).
	MaxStretch float64
	// QueueOrder is placement's --queue-order ("": its default).
	QueueOrder string
	// Backfill is placement's --backfill.
	Backfill bool
	// ComputeReference, when set, charges compute by GPU model (the
	// package doc, "Run time"): the trace's durations are taken as
	// measured on this model (a name package gpuspeed knows, such as
	// a100), and a job's compute is scaled to the slowest model it lands
	// on. "" keeps run time compute-blind.
	ComputeReference string
	// ChargeOnly charges compute per model (ComputeReference) while
	// placement does not weigh it, to measure what weighing it adds.
	ChargeOnly bool
	// DataDir holds the embedded server's streams; "" a temporary one.
	DataDir string
	// Samples is the number of points of the timeline (default 400).
	Samples int
	// Progress receives a progress bar; nil for none.
	Progress func(total int) Progress
	// Stall is how long the replay waits for an outcome before it gives
	// up (default 2 minutes).
	Stall time.Duration
	Log   *slog.Logger
}

// Progress is told about every event handled.
type Progress interface {
	Add(n int)
	Finish()
}

// probeID names the barrier job of the virtual clock (see the package
// doc); it asks for a GPU model no cluster has, so it is always rejected.
const (
	probeID    = "replay-barrier"
	probeModel = "replay-barrier-no-such-model"
)

// job states.
const (
	stNone = iota
	stPlaced
	stPending
	stRejected
)

type jobState struct {
	job   Job
	state int
	// wall times of the submission and of the first outcome.
	submitted, decided time.Time
	// virtual start (placement) time; -1 until placed.
	start        float64
	waited       bool
	nodes        []nodeAlloc
	released     bool
	finishSent   bool
	pred, base   float64
	hasPred      bool
	reason       string
	nodesSpanned int
	// ideal is the job's communication per step on an ideal placement
	// (NaN: none found), comm what its decision predicted (NaN: none),
	// compute its compute per step (ComputeSeconds).
	ideal, comm, compute float64
	// computeOn is its compute per step on the GPU model it landed on
	// (Config.ComputeReference; NaN: compute-blind, or a model the table
	// does not know).
	computeOn float64
	// runtime is how long the job runs once placed, virtual seconds: its
	// trace duration times stretch (see runtime.go); scaled says the
	// stretch came from the cost model rather than defaulting to 1.
	runtime, stretch float64
	scaled           bool
}

type nodeAlloc struct{ node, gpus int }

// finishHeap orders planned finishes by virtual time, then by job order.
type finish struct {
	at  float64
	job int
}
type finishHeap []finish

func (h finishHeap) Len() int { return len(h) }
func (h finishHeap) Less(i, j int) bool {
	return h[i].at < h[j].at || (h[i].at == h[j].at && h[i].job < h[j].job)
}
func (h finishHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *finishHeap) Push(x any)   { *h = append(*h, x.(finish)) }
func (h *finishHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// runner is one replay in progress.
type runner struct {
	cfg Config
	b   *bus.Bus
	log *slog.Logger
	// runID prefixes the ids of the events the replay sends (publish).
	runID string
	jobs  []jobState
	byID  map[string]int
	subs  []events.JobSubmitted
	occ   *occupancy
	work  []jobClass
	queue map[int]bool // pending jobs

	outcomes chan client.Outcome
	finishes finishHeap
	now      float64 // virtual seconds
	// clock is r.now as placement reads it (virtual clock only; nil
	// otherwise): see advance.
	clock   *virtualClock
	wall0   time.Time
	probes  int
	probeOK int
	decs    int // outcomes placement published for trace jobs
	retries int // decisions of waiting jobs

	// timeline sampling
	step     float64
	nextSamp float64
	timeline []Point
	progress Progress
}

// Point is the cluster's state at one time of the replay.
type Point struct {
	// T is virtual seconds from the trace's start.
	T float64 `json:"t"`
	// Allocated is the share of GPUs allocated.
	Allocated float64 `json:"allocated"`
	// Fragmentation is the expected share of free GPUs a job of the
	// trace's mix cannot use (see the package doc).
	Fragmentation float64 `json:"fragmentation"`
	// Queue is the number of jobs waiting.
	Queue int `json:"queue"`
}

// Run replays cfg.Trace on cfg.ClusterFile through every service on an
// embedded NATS server and returns the measurements.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Samples <= 0 {
		cfg.Samples = 400
	}
	if cfg.Stall <= 0 {
		cfg.Stall = 2 * time.Minute
	}
	if cfg.Inventory == nil || cfg.Trace == nil {
		return nil, errors.New("replay: a cluster and a trace are required")
	}
	if len(cfg.Trace.Jobs) == 0 {
		return nil, fmt.Errorf("replay: trace %s has no job to replay", cfg.Trace.Source)
	}
	setup := time.Now()
	dir := cfg.DataDir
	if dir == "" {
		d, err := os.MkdirTemp("", "toposched-replay-")
		if err != nil {
			return nil, fmt.Errorf("replay: %w", err)
		}
		defer func() { _ = os.RemoveAll(d) }() // a temporary directory: best effort
		dir = d
	}
	ncfg := natsserver.DefaultConfig()
	ncfg.Port, ncfg.StoreDir = -1, filepath.Join(dir, "nats-"+cfg.Strategy)
	// An earlier replay's streams would answer this one's jobs as seen
	// before, and the replay would wait in vain for their outcomes.
	if entries, err := os.ReadDir(ncfg.StoreDir); err == nil && len(entries) > 0 {
		return nil, fmt.Errorf("replay: %s holds an earlier replay's streams: give an empty or new data directory", ncfg.StoreDir)
	}
	srv, err := natsserver.Start(ncfg)
	if err != nil {
		return nil, fmt.Errorf("replay: %w", err)
	}
	defer srv.Shutdown()
	b, err := bus.Connect(ctx, bus.Config{URL: srv.ClientURL(), Prefix: events.DefaultPrefix, Source: "urn:toposched:replay", Logger: cfg.Log})
	if err != nil {
		return nil, fmt.Errorf("replay: %w", err)
	}
	defer func() { _ = b.Close() }() // after the replay: JetStream acknowledged all it published
	ra := cfg.ReserveAfter
	ocfg := operator.Config{Services: operator.All, Discovery: discovery.Config{ClusterFile: cfg.ClusterFile}, Sole: true,
		Placement: placement.Config{Strategy: cfg.Strategy, ReserveAfter: &ra, MaxStretch: cfg.MaxStretch, ComputeReference: cfg.placementCompute(),
			QueueOrder: cfg.QueueOrder, Backfill: cfg.Backfill},
		// Nothing in a replay accepts a move (see the package doc).
		Optimizer: optimizer.Config{NoMigrations: true},
		Policies:  cfg.Policies, Replica: "replay"}
	deps := operator.Deps{Bus: b, Log: cfg.Log}
	var clock *virtualClock
	if !cfg.Burst && cfg.Speed <= 0 {
		// Placement counts its queue's waits on the virtual clock, so that
		// the reservation for a starving job comes when it would have.
		clock = &virtualClock{epoch: time.Now()}
		deps.PlacementNow = clock.now
		// Nor does its local search stop on the wall clock: each
		// decision is bounded by cost-model evaluations alone, so the
		// replay decides alike on an idle machine and a loaded one.
		ocfg.Placement.SearchBudget = -1
	}
	op, err := operator.New(ocfg, deps)
	if err != nil {
		return nil, fmt.Errorf("replay: %w", err)
	}
	stop, err := operator.Background(ctx, op)
	if err != nil {
		return nil, fmt.Errorf("replay: %w", err)
	}
	defer func() { _ = stop() }() // a service's failure is reported from op.Err below
	ideal, err := newIdealModel(cfg.ClusterFile)
	if err != nil {
		return nil, fmt.Errorf("replay: %w", err)
	}
	if err := awaitTopology(ctx, op, cfg.Inventory.GPUs, ideal.fabric != nil); err != nil {
		return nil, err
	}
	r := newRunner(cfg, b, ideal)
	r.clock = clock
	watchCtx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	ready := make(chan struct{})
	watchErr := make(chan error, 1)
	go func() {
		watchErr <- client.Watch(watchCtx, b, client.FromNow, ready, func(o client.Outcome) error {
			select {
			case r.outcomes <- o:
				return nil
			case <-watchCtx.Done():
				return bus.ErrStop
			}
		})
	}()
	select {
	case <-ready:
	case err := <-watchErr:
		return nil, fmt.Errorf("replay: %w", err)
	}
	var mem memSampler
	mem.start()
	if cfg.Progress != nil {
		total := len(r.jobs)
		if !cfg.Burst {
			total *= 2
		}
		r.progress = cfg.Progress(total)
	}
	setupTook := time.Since(setup)
	r.wall0 = time.Now()
	switch {
	case cfg.Burst:
		err = r.burst(ctx)
	case cfg.Speed > 0:
		err = r.paced(ctx)
	default:
		err = r.virtual(ctx)
	}
	wall := time.Since(r.wall0)
	if r.progress != nil {
		r.progress.Finish()
	}
	mem.stop()
	if err != nil {
		return nil, err
	}
	if err := op.Err(); err != nil {
		return nil, fmt.Errorf("replay: a service failed: %w", err)
	}
	return r.result(wall, setupTook, mem.peak()), nil
}

// awaitTopology returns once placement holds the cluster's want GPUs and,
// with fabric, its fabric, which discovery publishes after the nodes: the
// first job is not to be decided on a cluster without its network.
func awaitTopology(ctx context.Context, op *operator.Operator, want int, fabric bool) error {
	deadline := time.Now().Add(2 * time.Minute)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		snap := op.PlacementService().Store().Snapshot()
		total, _ := snap.Capacity("")
		if total >= want && (!fabric || snap.HasFabric()) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("replay: placement holds %d of the cluster's %d GPUs (fabric: %v of %v) after 2 minutes", total, want, snap.HasFabric(), fabric)
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func newRunner(cfg Config, b *bus.Bus, ideal *idealModel) *runner {
	r := &runner{cfg: cfg, b: b, log: cfg.Log, runID: bus.NewID(), byID: map[string]int{}, queue: map[int]bool{},
		outcomes: make(chan client.Outcome, 1024), occ: newOccupancy(cfg.Inventory)}
	r.jobs = make([]jobState, len(cfg.Trace.Jobs))
	r.subs = make([]events.JobSubmitted, len(cfg.Trace.Jobs))
	for i, j := range cfg.Trace.Jobs {
		r.subs[i] = Shape(j, i, cfg.Inventory.MaxNodeGPUs, cfg.Seed)
		s := jobState{job: j, start: -1, ideal: ideal.comm(r.subs[i]), comm: math.NaN(), stretch: 1, computeOn: math.NaN()}
		s.compute = ComputeSeconds(r.subs[i], s.ideal)
		r.jobs[i] = s
		r.byID[j.ID] = i
	}
	r.work = workloadClasses(cfg.Trace.Jobs)
	r.step = max(cfg.Trace.Span(), 1) / float64(cfg.Samples)
	return r
}

// virtualClock is the replay's virtual time as placement reads it, from
// its own goroutines: epoch plus the virtual seconds reached.
type virtualClock struct {
	epoch time.Time
	secs  atomic.Uint64 // math.Float64bits of the virtual seconds
}

func (c *virtualClock) set(secs float64) { c.secs.Store(math.Float64bits(secs)) }

func (c *virtualClock) now() time.Time {
	return c.epoch.Add(time.Duration(math.Float64frombits(c.secs.Load()) * float64(time.Second)))
}

// advance moves the virtual clock to t (never back) and tells placement.
func (r *runner) advance(t float64) {
	r.now = max(r.now, t)
	if r.clock != nil {
		r.clock.set(r.now)
	}
}

// sample records the state, unchanged since the last event, at every
// timeline point before t.
func (r *runner) sample(t float64) {
	if r.nextSamp > t {
		return
	}
	p := r.point()
	for ; r.nextSamp <= t; r.nextSamp += r.step {
		p.T = r.nextSamp
		r.timeline = append(r.timeline, p)
	}
}

func (r *runner) point() Point {
	exp := r.occ.fragmentation(r.work)
	p := Point{T: r.now, Allocated: float64(r.occ.alloc) / float64(r.cfg.Inventory.GPUs), Queue: len(r.queue)}
	if free := r.occ.free(); free > 0 {
		p.Fragmentation = exp / float64(free)
	}
	return p
}

// placementCompute is placement's compute reference: the replay's, but
// with ChargeOnly.
func (cfg Config) placementCompute() string {
	if cfg.ChargeOnly {
		return ""
	}
	return cfg.ComputeReference
}
