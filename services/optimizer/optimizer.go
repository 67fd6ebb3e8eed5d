// Package optimizer follows the jobs that are running and, from what they
// report, tunes their collectives and proposes better placements.
//
// # State
//
// The optimizer keeps its own view of the cluster, built only from the
// streams, so that any replica (or a restarted one) holds the same:
//
//   - a store (internal/store) fed by the topology stream on one
//     ordered consumer (nodes, health changes and the fabric, in stream
//     order, as placement's store is), with every live job's GPUs
//     allocated in it, so that it can plan what-ifs with placement's
//     planner (the allocations are written back in batches, before the
//     what-ifs read them: writeback.go);
//   - the analysed jobs (jobs.analyzed), kept until the job is released or
//     rejected: tuning and diagnosis need each job's groups and volumes;
//   - the live decisions (placement.decided until placement.released), on
//     one ordered consumer of the placement stream, audited independently
//     of placement: a GPU held by two live decisions is reported as an
//     error.
//
// # Ordering between consumers
//
// Topology, analyses and decisions arrive on separate consumers, so a
// decision may be handled before its job's analysis or before the report
// of a node it uses. The optimizer never tunes on such partial data: like
// placement's catchUpTopology, it first reads what the streams hold beyond
// what it has applied (ReplayFrom the last sequence it applied, per
// stream). The analysis of a decided job is always in the jobs stream
// before the decision is in the placement stream (placement decides on the
// analysis it consumed), so catching up finds it; if it still does not
// (a decision published by hand, a stream purged by hand), the decision
// is not placement's: the handler fails with ErrUnknownJob, which
// dead-letters it once (a Transient error had it redelivered every few
// seconds for ever), and the job is never tuned. Each
// consumer skips the events its catch-up already applied (by stream
// sequence), so an event is applied once and in stream order, and an old
// health change redelivered late cannot undo a newer one.
//
// # Restarts
//
// Rebuild replays the topology, jobs and placement streams into a fresh
// state before the handlers start, as placement's Rebuild does, and the
// runtime stream for the last finding published per job (so a restart
// does not repeat a diagnosis). Outputs carry ids derived from their
// input's id, so a decision redelivered after a crash republishes the same
// tuning event and JetStream drops the copy.
package optimizer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/events/bus"
	"github.com/toposched/toposched/internal/collective"
	"github.com/toposched/toposched/internal/gpuspeed"
	"github.com/toposched/toposched/internal/placer/aware"
	"github.com/toposched/toposched/internal/store"
	"github.com/toposched/toposched/internal/topology"
	"github.com/toposched/toposched/services/optimizer/tuning"
)

// Durable consumer names: part of the wire contract.
const (
	// HandlerPlacement is one consumer of the whole placement stream, not
	// one per event type, because the working set depends on the order of
	// decisions and releases.
	HandlerPlacement = "optimizer-placement"
	// HandlerTopology is one consumer of the whole topology stream, for the
	// same reason: a health change applies to the node report before it.
	HandlerTopology = "optimizer-topology"
	// HandlerAnalyzed keeps the analysed jobs.
	HandlerAnalyzed = "optimizer-jobs-analyzed"
)

// Config is the optimizer's configuration.
type Config struct {
	// Bandwidths are the cost model's link rates and efficiencies (nil:
	// the defaults; a calibration's, collective.Calibration.Bandwidths).
	Bandwidths *topology.Bandwidths
	// NoMigrations stops placement.migration proposals. A replay sets it:
	// nothing there accepts a move, and planning one for every spread-out
	// job after every release was 38% of the CPU of blind's whole-Philly
	// replay (BENCHMARKS.md).
	NoMigrations bool
	// ComputeReference is placement's (placement.Config.ComputeReference):
	// where set, migration proposals weigh a job's compute on each GPU
	// model as placement does, and the online calibration (CalibrateOnline)
	// learns the models' compute factors from the jobs' measured compute.
	// "": both blind to the model, as placement is then.
	ComputeReference string
}

// Validate reports every problem at once.
func (c Config) Validate() error {
	if c.ComputeReference != "" {
		if _, ok := gpuspeed.Lookup(c.ComputeReference); !ok {
			return fmt.Errorf("optimizer: compute reference %q: no GPU model internal/gpuspeed knows (such as a100, h100, t4)", c.ComputeReference)
		}
	}
	return nil
}

// Deps are the ports the optimizer uses.
type Deps struct {
	Publish bus.Publisher
	// Read catches up with the topology, jobs, placement and runtime
	// streams.
	Read bus.Reader
	// Consume runs the handlers; only Run needs it, so a unit test that
	// drives the handlers by hand may leave it out.
	Consume  bus.Consumer
	Subjects events.Subjects
	// Log is nil for slog.Default; Now is nil for time.Now.
	Log *slog.Logger
	Now func() time.Time
}

func (d Deps) validate() error {
	var errs []error
	if d.Publish == nil {
		errs = append(errs, errors.New("optimizer: deps: Publish is required"))
	}
	if d.Read == nil {
		errs = append(errs, errors.New("optimizer: deps: Read is required"))
	}
	return errors.Join(errs...)
}

// Service is the optimizer.
type Service struct {
	// bandwidths of the cost model (Config.Bandwidths).
	bandwidths atomic.Pointer[topology.Bandwidths]
	// calibrator and online are the online calibration (CalibrateOnline);
	// nil when off.
	calibrator Calibrator
	online     *collective.Online
	// onlineCompute learns the GPU models' compute factors; nil where
	// the online calibration is off or compute is blind to the model.
	onlineCompute *collective.OnlineCompute
	// computeRef is Config.ComputeReference.
	computeRef string
	pub        bus.Publisher
	read       bus.Reader
	consume    bus.Consumer
	subjects   events.Subjects
	log        *slog.Logger
	now        func() time.Time
	serving    chan struct{}
	// noMigrations is Config.NoMigrations.
	noMigrations bool

	// mu serialises every handler: they share the state below, and a
	// catch-up from one handler applies events another would have.
	mu    sync.Mutex
	store *store.Store
	// fabric is the newest switch tree; nil until one is reported.
	fabric *topology.Fabric
	// health holds, per node, the parts last reported unhealthy (key
	// component/id), as evidence for a diagnosis.
	health map[string]map[string]events.TopologyHealth
	// The last stream sequence applied, per stream.
	topoSeq, jobsSeq, placementSeq uint64
	// placementSynced is when this replica last knew it had applied the
	// whole placement stream.
	placementSynced time.Time

	analyses map[string]*events.JobAnalyzed
	live     map[string]*liveJob
	holder   map[gpuKey]string
	// unwritten is the placement changes the store has yet to be told
	// (writeback.go).
	unwritten []storeChange
}

// liveJob is one running job as the optimizer sees it.
type liveJob struct {
	decision *events.PlacementDecided
	// spec is the job's analysis; nil until it has been read.
	spec *events.JobAnalyzed
	// tuning is what was published for the decision; nil until tuned.
	// plan is the tuner's result behind it, and tunedWith the bandwidths
	// it was worked out with: after a calibration change, diagnoses
	// compare with the prediction worked out again (OnTelemetry).
	tuning    *events.RuntimeTuning
	plan      tuning.Plan
	tunedWith *topology.Bandwidths
	// finding is the last diagnosis published ("" before the first),
	// diagnosisID its event id.
	finding     string
	diagnosis   *events.RuntimeDiagnosis
	diagnosisID string
	// telemetry is the latest telemetry received.
	telemetry *events.RuntimeTelemetry
	// proposed is the GPUs of the last migration proposed, as keyOf.
	proposed string
	// unknown: the streams hold no analysis or node report for the
	// decision (ErrUnknownJob); it is never tuned.
	unknown bool
	// compute is placement's prediction of the job's compute where it
	// observes its GPU model's speed (computeObservation), kept while the
	// calibration in force and the topology are the ones it was worked
	// out with: telemetry comes every few steps, the prediction changes
	// with neither.
	compute *computePrediction
}

// computePrediction is a live job's compute prediction and what it was
// worked out with.
type computePrediction struct {
	with    *topology.Bandwidths
	topoSeq uint64
	model   string
	est     aware.ComputeEstimate
	ok      bool
}

type gpuKey struct {
	node string
	gpu  int
}

// New returns the optimizer with an empty state; Run rebuilds it from the
// streams.
func New(cfg Config, deps Deps) (*Service, error) {
	if err := errors.Join(cfg.Validate(), deps.validate()); err != nil {
		return nil, err
	}
	st, err := store.New()
	if err != nil {
		return nil, fmt.Errorf("optimizer: store schema: %w", err)
	}
	log := deps.Log
	if log == nil {
		log = slog.Default()
	}
	now := deps.Now
	if now == nil {
		now = time.Now
	}
	svc := &Service{
		pub:      deps.Publish,
		read:     deps.Read,
		consume:  deps.Consume,
		subjects: deps.Subjects,
		log:      log.With("component", "optimizer"),
		now:      now,
		serving:  make(chan struct{}),
		store:    st,
		health:   map[string]map[string]events.TopologyHealth{},
		analyses: map[string]*events.JobAnalyzed{},
		live:     map[string]*liveJob{},
		holder:   map[gpuKey]string{},

		noMigrations: cfg.NoMigrations,
		computeRef:   cfg.ComputeReference,
	}
	svc.bandwidths.Store(cfg.Bandwidths)
	return svc, nil
}

// SetBandwidths puts a calibration's link rates and efficiencies in force
// (nil: the defaults): tunings and diagnoses after it use them.
func (s *Service) SetBandwidths(bw *topology.Bandwidths) { s.bandwidths.Store(bw) }

// Bandwidths is the calibration's link rates and efficiencies in force
// (nil: the defaults).
func (s *Service) Bandwidths() *topology.Bandwidths { return s.bandwidths.Load() }

// Store is the optimizer's inventory, every placement applied so far
// written to it, for tests and read-only views.
func (s *Service) Store() *store.Store {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.occupancy()
}

// Ready is closed once the state is rebuilt and every handler consumes.
func (s *Service) Ready() <-chan struct{} { return s.serving }

// Run rebuilds the state from the streams, then follows topology, jobs,
// decisions and telemetry until ctx ends (see bus.Serve).
func (s *Service) Run(ctx context.Context) error {
	if s.consume == nil {
		return errors.New("optimizer: deps: Consume is required to run")
	}
	if err := s.rebuild(ctx); err != nil {
		return err
	}
	r, err := s.consume.NewRouter()
	if err != nil {
		return fmt.Errorf("optimizer: %w", err)
	}
	bus.HandleDomain(r, bus.DomainHandler{Name: HandlerTopology, Domain: events.DomainTopology, Fn: s.onTopology})
	bus.Handle(r, bus.Handler[events.JobAnalyzed]{Name: HandlerAnalyzed, Event: events.NameJobAnalyzed, Fn: s.OnAnalyzed})
	bus.HandleDomain(r, bus.DomainHandler{Name: HandlerPlacement, Domain: events.DomainPlacement, Fn: s.onPlacement})
	bus.Handle(r, bus.Handler[events.RuntimeTelemetry]{Name: HandlerTelemetry, Event: events.NameRuntimeTelemetry, Fn: s.OnTelemetry})
	if err := bus.Serve(ctx, r, func() { close(s.serving) }); err != nil {
		return fmt.Errorf("optimizer: %w", err)
	}
	return nil
}

// onTopology applies the topology stream in order.
func (s *Service) onTopology(ctx context.Context, _ events.Envelope, name events.Name, body []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	seq := bus.StreamSeq(ctx)
	if seq != 0 && seq <= s.topoSeq {
		return nil // a catch-up applied it already
	}
	if behind(seq, s.topoSeq) {
		if err := s.catchUpTopology(ctx); err != nil {
			return err
		}
		if seq <= s.topoSeq {
			return s.reconsider(ctx)
		}
	}
	if err := s.applyTopology(name, body); err != nil {
		return err
	}
	s.topoSeq = max(s.topoSeq, seq)
	// A part recovered, or a node came: a better placement may exist.
	return s.reconsider(ctx)
}

// applyTopology applies one topology event. Errors are permanent: the
// event goes to the dead letters, as it does in placement.
func (s *Service) applyTopology(name events.Name, body []byte) error {
	switch name {
	case events.NameTopologyNode:
		var n events.TopologyNode
		if err := s.read.Decode(name, body, &n); err != nil {
			return err
		}
		if err := s.occupancy().UpsertNode(n); err != nil {
			return fmt.Errorf("node %s: %w", n.Name, err)
		}
		if n.Removed {
			delete(s.health, n.Name)
		}
	case events.NameTopologyHealth:
		var h events.TopologyHealth
		if err := s.read.Decode(name, body, &h); err != nil {
			return err
		}
		if err := s.occupancy().SetHealth(h); err != nil {
			return fmt.Errorf("health of %s: %w", h.Node, err)
		}
		key := h.Component + "/" + h.ID
		if h.Health == events.HealthHealthy || h.Health == "" {
			delete(s.health[h.Node], key)
		} else {
			if s.health[h.Node] == nil {
				s.health[h.Node] = map[string]events.TopologyHealth{}
			}
			s.health[h.Node][key] = h
		}
	case events.NameTopologyHeld:
		var h events.TopologyHeld
		if err := s.read.Decode(name, body, &h); err != nil {
			return err
		}
		if err := s.occupancy().SetHeld(h); err != nil {
			return fmt.Errorf("held GPUs of %s: %w", h.Node, err)
		}
	case events.NameTopologyFabric:
		var f events.TopologyFabric
		if err := s.read.Decode(name, body, &f); err != nil {
			return err
		}
		return s.applyFabric(f)
	}
	return nil
}

func (s *Service) applyFabric(ev events.TopologyFabric) error {
	f, err := s.occupancy().ApplyFabric(ev)
	if err != nil {
		return err
	}
	s.fabric = f
	return nil
}

// OnAnalyzed keeps a job's analysis until the job is released.
func (s *Service) OnAnalyzed(ctx context.Context, _ events.Envelope, a *events.JobAnalyzed) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	seq := bus.StreamSeq(ctx)
	if seq != 0 && seq <= s.jobsSeq {
		return nil
	}
	s.applyAnalyzed(a)
	s.jobsSeq = max(s.jobsSeq, seq)
	return nil
}

// applyAnalyzed keeps the newest analysis of a job that does not run: a
// resubmission of a running job changes nothing in placement, so it must
// not change what the optimizer thinks the job does.
func (s *Service) applyAnalyzed(a *events.JobAnalyzed) {
	id := a.Job.JobID
	if lj, ok := s.live[id]; ok {
		if lj.spec == nil {
			lj.spec = a
		}
		return
	}
	s.analyses[id] = a
}

// onPlacement takes the placement stream in order: decisions and releases
// update the working set; a decision is then tuned.
func (s *Service) onPlacement(ctx context.Context, env events.Envelope, name events.Name, body []byte) error {
	switch name {
	case events.NamePlacementDecided:
		var d events.PlacementDecided
		if err := s.read.Decode(name, body, &d); err != nil {
			return err
		}
		return s.OnDecided(ctx, env, &d)
	case events.NamePlacementReleased:
		var rel events.PlacementReleased
		if err := s.read.Decode(name, body, &rel); err != nil {
			return err
		}
		return s.OnReleased(ctx, env, &rel)
	case events.NamePlacementRejected:
		var rej events.PlacementRejected
		if err := s.read.Decode(name, body, &rej); err != nil {
			return err
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		if err := s.syncPlacement(ctx); err != nil {
			return err
		}
		s.applyPlacement(bus.StreamSeq(ctx), &rej)
	}
	return nil
}

// OnDecided adds a placement to the working set, then tunes it.
func (s *Service) OnDecided(ctx context.Context, env events.Envelope, d *events.PlacementDecided) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.syncPlacement(ctx); err != nil {
		return err
	}
	s.applyPlacement(bus.StreamSeq(ctx), d)
	return s.tune(ctx, env, d)
}

// OnReleased drops a placement from the working set.
func (s *Service) OnReleased(ctx context.Context, _ events.Envelope, rel *events.PlacementReleased) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.syncPlacement(ctx); err != nil {
		return err
	}
	s.applyPlacement(bus.StreamSeq(ctx), rel)
	// GPUs were freed: a better placement may exist.
	return s.reconsider(ctx)
}

// behind reports whether the event at seq comes after events of its
// stream this replica has not applied: replicas share each durable
// consumer, so another replica handled them, and this one reads them
// from the stream (in order) before it acts on seq.
func behind(seq, applied uint64) bool { return seq > applied+1 }

// placementFresh bounds how old a replica's view of the placement stream
// may be when telemetry, which comes on another stream, is diagnosed
// against it (the live jobs and who shares a link).
const placementFresh = time.Second

// syncPlacement catches up with the placement stream when the event being
// handled (its sequence in ctx) comes after events not applied here.
func (s *Service) syncPlacement(ctx context.Context) error {
	seq := bus.StreamSeq(ctx)
	if !behind(seq, s.placementSeq) {
		s.placementSynced = time.Now()
		return nil
	}
	return s.catchUpPlacement(ctx)
}

// applyPlacement applies one placement event unless a catch-up already
// did (seq at or below what was applied; 0: unknown, applied).
func (s *Service) applyPlacement(seq uint64, v any) {
	if seq != 0 && seq <= s.placementSeq {
		return
	}
	s.placementSeq = max(s.placementSeq, seq)
	switch ev := v.(type) {
	case *events.PlacementDecided:
		s.applyDecided(ev)
	case *events.PlacementReleased:
		s.applyReleased(ev.JobID)
	case *events.PlacementRejected:
		if _, ok := s.live[ev.JobID]; !ok {
			delete(s.analyses, ev.JobID)
		}
	}
}

func (s *Service) applyDecided(d *events.PlacementDecided) {
	spec := s.analyses[d.JobID]
	if old, ok := s.live[d.JobID]; ok {
		if d.Migration == nil || sameDecision(old.decision, d) {
			return // a redelivery, or a decision placement ignored
		}
		// An applied migration replaces the job's decision: its old GPUs
		// are free from here on, and the job keeps its analysis.
		spec = old.spec
		s.dropLive(d.JobID)
		s.log.Info("job migrated", "job_id", d.JobID, "proposal_id", d.Migration.ProposalID)
	}
	for _, r := range d.Ranks {
		k := gpuKey{r.Node, r.GPU}
		if other, ok := s.holder[k]; ok && other != d.JobID {
			s.log.Error("double booking: GPU held by two live jobs", "node", r.Node, "gpu", r.GPU,
				"job_id", d.JobID, "other_job_id", other)
			continue
		}
		s.holder[k] = d.JobID
	}
	lj := &liveJob{decision: d, spec: spec}
	delete(s.analyses, d.JobID)
	s.live[d.JobID] = lj
	s.later(storeChange{kind: changePlaced, job: d.JobID, gpus: gpusOf(d), lj: lj})
	s.log.Debug("tracking placement", "job_id", d.JobID, "ranks", len(d.Ranks))
}

// recordJob keeps a live job in the store (in t), where the planner's
// what-ifs read it.
func (s *Service) recordJob(t *store.Txn, lj *liveJob) {
	j := store.Job{ID: lj.decision.JobID, State: store.JobPlaced, Decision: lj.decision}
	if lj.spec != nil {
		j.Spec, j.Priority = *lj.spec, lj.spec.Job.Priority
	}
	if err := t.UpsertJob(j); err != nil {
		s.log.Warn("store: job not recorded", "job_id", j.ID, "err", err)
	}
}

func (s *Service) applyReleased(job string) {
	delete(s.analyses, job)
	s.dropLive(job)
}

// dropLive forgets a live job and frees its GPUs.
func (s *Service) dropLive(job string) {
	lj, ok := s.live[job]
	if !ok {
		return
	}
	for _, r := range lj.decision.Ranks {
		k := gpuKey{r.Node, r.GPU}
		if s.holder[k] == job {
			delete(s.holder, k)
		}
	}
	delete(s.live, job)
	s.later(storeChange{kind: changeReleased, job: job})
}

// Live reports the number of live placements and GPUs they hold.
func (s *Service) Live() (jobs, gpus int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.live), len(s.holder)
}

// gpusOf lists the GPUs of a decision in rank order.
func gpusOf(d *events.PlacementDecided) []store.GPUKey {
	out := make([]store.GPUKey, len(d.Ranks))
	for i, r := range d.Ranks {
		out[i] = store.GPUKey{Node: r.Node, Index: r.GPU}
	}
	return out
}

// sameDecision reports whether a and b are the same decision (a
// redelivery), not a later one for the same job id.
func sameDecision(a, b *events.PlacementDecided) bool {
	if a == b {
		return true
	}
	if a == nil || b == nil || a.JobID != b.JobID || !a.DecidedAt.Equal(b.DecidedAt) || len(a.Ranks) != len(b.Ranks) {
		return false
	}
	return slices.EqualFunc(a.Ranks, b.Ranks, func(x, y events.RankPlacement) bool {
		return x.Node == y.Node && x.GPU == y.GPU && x.Rank == y.Rank
	})
}
