package placement

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/events/bus"
	"github.com/toposched/toposched/internal/demand"
	"github.com/toposched/toposched/internal/gpuspeed"
	"github.com/toposched/toposched/internal/pattern"
	"github.com/toposched/toposched/internal/placer"
	"github.com/toposched/toposched/internal/placer/outcome"
	"github.com/toposched/toposched/internal/store"
	"github.com/toposched/toposched/internal/topology"
	"github.com/toposched/toposched/policies"
)

// Durable consumer names: part of the wire contract.
const (
	HandlerAnalyzed = "placement-jobs-analyzed"
	HandlerFinished = "placement-jobs-finished"
	// HandlerTopology takes every topology event on one consumer, in
	// stream order (see onTopology).
	HandlerTopology = "placement-topology"
)

// Config is the placement service's configuration.
type Config struct {
	// Strategy is one of placer.Names(true); "" is DefaultStrategy.
	Strategy string
	// ReserveAfter is how long the head of the queue waits before nodes
	// are held for it (see placer.Reservation): nil is
	// DefaultReserveAfter, 0 holds them at once, a negative duration never.
	ReserveAfter *time.Duration
	// Policies is the policy set in force from the start (nil: none);
	// SetPolicies changes it while the service runs.
	Policies *policies.Set
	// Holder and LeaseRevision name the term this service runs: the
	// replica and the revision of the lease it took (0 without a lease).
	// Run opens the term with a placement.term event and fences every
	// outcome on it (see bus.Fence).
	Holder        string
	LeaseRevision uint64
	// Bandwidths are the cost model's link rates and efficiencies (nil:
	// the defaults; a calibration's, collective.Calibration.Bandwidths).
	Bandwidths *topology.Bandwidths
	// SearchBudget bounds topology-aware's local search on the wall
	// clock (placer.Planner.SearchBudget: 0 the default, negative none,
	// the evaluation cap alone, as a replay on a virtual clock wants).
	SearchBudget time.Duration
	// MaxStretch is placer.Compact's bound for topology-aware jobs spread
	// over nodes: 0 is placer.DefaultMaxStretch, negative none.
	MaxStretch float64
	// ComputeReference, when set, weighs a job's compute by the GPU model
	// of each candidate (placer.Planner.ComputeReference).
	ComputeReference string
	// QueueOrder orders the waiting jobs of one priority: QueueByEnd
	// ("" too), QueueByWork or QueueByArrival.
	QueueOrder string
	// Backfill lets a job run on nodes held for the head of the queue
	// when it is expected to end before the jobs on them (see
	// placer.Reservation, "Backfill onto held nodes"). Off by default:
	// measured on the shared job logs it helps some and costs others
	// (BENCHMARKS.md, "Issue 51: backfill onto held nodes").
	Backfill bool
}

// Queue orders (Config.QueueOrder).
const (
	// QueueByWork tries waiting jobs of one priority in the order of
	// their first wait plus the work learned for their size, in node
	// hours: the run time learned for its size times its GPUs over a
	// node's (events.QueueTurn).
	QueueByWork = "expected-work"
	// QueueByEnd tries them in the order of the times they would end had
	// each started when it first waited: its first wait plus the run time
	// learned for its size, whatever its GPUs.
	QueueByEnd = "expected-end"
	// QueueByArrival tries them in the order they first waited.
	QueueByArrival = "arrival"
)

// DefaultStrategy is the strategy of a Config that names none.
const DefaultStrategy = placer.StrategyTopologyAware

// Validate reports every problem at once.
func (c Config) Validate() error {
	var errs []error
	if _, err := placer.Lookup(c.Strategy, true); err != nil {
		errs = append(errs, fmt.Errorf("placement: %w", err))
	}
	if math.IsNaN(c.MaxStretch) || math.IsInf(c.MaxStretch, 0) || (c.MaxStretch > 0 && c.MaxStretch < 1) {
		errs = append(errs, fmt.Errorf("placement: max stretch %v: want at least 1 (0: the default; negative: off)", c.MaxStretch))
	}
	if !slices.Contains([]string{"", QueueByWork, QueueByEnd, QueueByArrival}, c.QueueOrder) {
		errs = append(errs, fmt.Errorf("placement: queue order %q: want %s, %s or %s", c.QueueOrder, QueueByWork, QueueByEnd, QueueByArrival))
	}
	if c.ComputeReference != "" {
		if _, ok := gpuspeed.Lookup(c.ComputeReference); !ok {
			errs = append(errs, fmt.Errorf("placement: compute reference %q: no GPU model internal/gpuspeed knows (such as a100, h100, t4)", c.ComputeReference))
		}
	}
	return errors.Join(errs...)
}

// Deps are the ports the service uses.
type Deps struct {
	Publish bus.Publisher
	// Read rebuilds the store from the streams and catches up with them.
	Read     bus.Reader
	Consume  bus.Consumer
	Subjects events.Subjects
	// Log is nil for slog.Default; Now is nil for time.Now.
	Log *slog.Logger
	Now func() time.Time
	// ObservePolicyEval, if set, is told how long each Rego evaluation of
	// this service's decisions took (the metrics' histogram).
	ObservePolicyEval func(time.Duration)
}

func (d Deps) validate() error {
	var errs []error
	if d.Publish == nil {
		errs = append(errs, errors.New("placement: deps: Publish is required"))
	}
	if d.Read == nil {
		errs = append(errs, errors.New("placement: deps: Read is required"))
	}
	if d.Consume == nil {
		errs = append(errs, errors.New("placement: deps: Consume is required"))
	}
	return errors.Join(errs...)
}

// Service places jobs.
//
// Lock order: mu is the service's only lock and every handler, SetPolicies
// and the rebuild take it first; the store's own transactions and the
// policy set's node cache lock inside it, never the other way round.
type Service struct {
	pub      bus.Publisher
	read     bus.Reader
	consume  bus.Consumer
	subjects events.Subjects
	store    *store.Store
	log      *slog.Logger
	now      func() time.Time
	observe  func(time.Duration)
	ready    chan struct{}

	// mu serialises decisions and their publication, so the placement
	// stream is in the order the store changed. It guards topoSeq too.
	mu sync.Mutex
	// topoSeq is the last topology stream sequence the store has applied.
	topoSeq uint64
	// topoUnretried is set when a job's catch-up (decide) applied topology
	// the queue has not been retried on; the topology consumer retries it
	// when it reaches those events, which it then skips.
	topoUnretried bool
	// fabric is the newest switch tree; nil until one is reported.
	fabric *topology.Fabric
	// bandwidths of the cost model (Config.Bandwidths).
	bandwidths atomic.Pointer[topology.Bandwidths]
	strategy   string
	// computeReference is Config.ComputeReference.
	computeReference string
	// searchBudget is Config.SearchBudget.
	searchBudget time.Duration
	// policies is the policy set in force; nil means none.
	policies *policies.Set
	// reserveAfter is how long the head of the queue waits before nodes
	// are held for it (negative: never); reservation is the hold, nil
	// when none; pendingSince is when each waiting job first waited.
	reserveAfter time.Duration
	// byEnd is set for QueueByEnd and QueueByWork (jobs have turns),
	// byWork for QueueByWork; backfill is Config.Backfill.
	byEnd, byWork bool
	backfill      bool
	reservation   *placer.Reservation
	pendingSince  map[string]time.Time
	// maxStretch is Config.MaxStretch (0 and below: the rule is off);
	// ideals the ideal placements it compares with.
	maxStretch float64
	ideals     placer.Ideals
	// twins sorts the waiting jobs into sets identical but for their ids
	// (retryPending).
	twins twins
	// nextReserve is when a new submission next checks the queue's head
	// for a reservation (retries always do).
	nextReserve time.Time
	// mig holds the optimizer's migration proposals (migrate.go).
	mig migrations
	// demand is what the service expects to be asked for next, learned
	// from what it decides and releases (demand.go).
	demand *demand.Forecast
	// intake holds the jobs waiting for a decision cycle (cycle.go);
	// inDoubt the outcomes sent that the stream has not confirmed.
	intake  intake
	inDoubt []*sent
	// ackWait is defaultAckWait but in tests.
	ackWait time.Duration
	// life ends with the term (Run's context); Background until Run.
	life context.Context

	holder        string
	leaseRevision uint64
	// fence is the term's marker, set by Run before any handler runs;
	// fenced ends Run once a publish finds a newer term's marker.
	fence  bus.Fence
	fenced context.CancelCauseFunc
	// ignored counts what the rebuild did not take in, by reason.
	ignored map[string]int
}

// New returns the placement service with an empty store; Run rebuilds it
// from the streams.
func New(cfg Config, deps Deps) (*Service, error) {
	if err := errors.Join(cfg.Validate(), deps.validate()); err != nil {
		return nil, err
	}
	st, err := store.New()
	if err != nil {
		return nil, fmt.Errorf("placement: store schema: %w", err)
	}
	log := deps.Log
	if log == nil {
		log = slog.Default()
	}
	now := deps.Now
	if now == nil {
		now = time.Now
	}
	strategy, _ := placer.Lookup(cfg.Strategy, true)
	reserveAfter := DefaultReserveAfter
	if cfg.ReserveAfter != nil {
		reserveAfter = *cfg.ReserveAfter
	}
	svc := &Service{pub: deps.Publish, read: deps.Read, consume: deps.Consume, subjects: deps.Subjects,
		store: st, log: log.With("component", "placement"), now: now, observe: deps.ObservePolicyEval,
		ready: make(chan struct{}), strategy: strategy.Name(), searchBudget: cfg.SearchBudget, computeReference: cfg.ComputeReference, policies: cfg.Policies,
		reserveAfter: reserveAfter, byEnd: cfg.QueueOrder != QueueByArrival, byWork: cfg.QueueOrder == QueueByWork, backfill: cfg.Backfill, pendingSince: map[string]time.Time{},
		holder: cmp.Or(cfg.Holder, "placement"), leaseRevision: cfg.LeaseRevision, ackWait: defaultAckWait,
		life: context.Background(), demand: newDemand()}
	switch {
	case cfg.MaxStretch == 0:
		svc.maxStretch = placer.DefaultMaxStretch
	case cfg.MaxStretch > 0:
		svc.maxStretch = cfg.MaxStretch
	}
	svc.bandwidths.Store(cfg.Bandwidths)
	return svc, nil
}

// SetBandwidths puts a calibration's link rates and efficiencies in force
// (nil: the defaults); decisions after it choose and predict with them.
// Decisions already made keep the predictions they were made with.
func (s *Service) SetBandwidths(bw *topology.Bandwidths) { s.bandwidths.Store(bw) }

// Bandwidths is the calibration's link rates and efficiencies in force
// (nil: the defaults).
func (s *Service) Bandwidths() *topology.Bandwidths { return s.bandwidths.Load() }

// SetPolicies puts a compiled (and tested) policy set in force; nil turns
// policies off. Decisions after it use the new set, and the pending jobs
// are retried at once, since the new set may let some of them fit.
func (s *Service) SetPolicies(ctx context.Context, set *policies.Set) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.policies = set
	if set != nil {
		s.log.Info("policy set in force", "set", set.String())
	} else {
		s.log.Info("policies off")
	}
	return s.retryPending(ctx)
}

// Policies returns the policy set in force (nil: none).
func (s *Service) Policies() *policies.Set {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.policies
}

// Store is the service's inventory, for tests and read-only views.
func (s *Service) Store() *store.Store { return s.store }

// Ready is closed once the store is rebuilt and every handler consumes.
func (s *Service) Ready() <-chan struct{} { return s.ready }

// Run opens the term, rebuilds the store from the streams, then handles
// jobs, finishes, topology and migration acceptances until ctx ends (see
// bus.Serve), or until a publish is fenced: another replica has opened a
// newer term, and Run returns an error wrapping bus.ErrFenced.
func (s *Service) Run(ctx context.Context) error {
	// The marker comes before the rebuild: whatever an earlier leader
	// stored is before it in the stream, so the rebuild reads it, and
	// whatever that leader tries to store after it is refused.
	if err := s.openTerm(ctx); err != nil {
		return err
	}
	ctx, s.fenced = context.WithCancelCause(ctx)
	defer s.fenced(nil)
	s.life = ctx
	if err := s.rebuild(ctx); err != nil {
		return fmt.Errorf("rebuild placement: %w", err)
	}
	r, err := s.consume.NewRouter()
	if err != nil {
		return fmt.Errorf("placement: %w", err)
	}
	// When the term ends (the lease lost or handed over) this replica must
	// stop deciding at once, not finish what it holds through retries that
	// may last a broker outage: the next leader gets those messages again.
	r.AbortOnClose()
	bus.Handle(r, bus.Handler[events.JobAnalyzed]{Name: HandlerAnalyzed, Event: events.NameJobAnalyzed, Fn: s.OnAnalyzed,
		Concurrency: analyzedConcurrency})
	bus.Handle(r, bus.Handler[events.JobFinished]{Name: HandlerFinished, Event: events.NameJobFinished, Fn: s.OnFinished,
		Invalid: s.OnInvalidFinish})
	bus.HandleDomain(r, bus.DomainHandler{Name: HandlerTopology, Domain: events.DomainTopology, Fn: s.onTopology})
	bus.Handle(r, bus.Handler[events.JobMigrationAccepted]{Name: HandlerMigrate, Event: events.NameJobMigrationAccepted, Fn: s.OnMigrationAccepted,
		Invalid: s.OnInvalidMigrationAccept})
	if err := bus.Serve(ctx, r, func() { close(s.ready) }); err != nil {
		return fmt.Errorf("placement: %w", err)
	}
	if cause := context.Cause(ctx); errors.Is(cause, bus.ErrFenced) {
		return fmt.Errorf("placement: term of %s (lease revision %d) ended: %w", s.holder, s.leaseRevision, cause)
	}
	return nil
}

// openTerm publishes the term's marker and fences every outcome on it.
func (s *Service) openTerm(ctx context.Context) error {
	term := &events.PlacementTerm{Holder: s.holder, LeaseRevision: s.leaseRevision, StartedAt: s.now().UTC()}
	_, seq, err := s.pub.PublishSeq(ctx, term)
	if err != nil {
		return fmt.Errorf("placement: open the term: %w", err)
	}
	s.fence = bus.Fence{Subject: s.subjects.Of(events.NamePlacementTerm), Seq: seq}
	return nil
}

// publish stores an outcome of the term, fenced on its marker. A refusal
// means a newer term has started: the service stops at once (the message
// being handled is nacked for the new leader, not dead-lettered).
func (s *Service) publish(ctx context.Context, v any) (events.Envelope, error) {
	env, err := s.pub.Publish(bus.WithFence(ctx, s.fence), v)
	if errors.Is(err, bus.ErrFenced) && s.fenced != nil {
		s.log.WarnContext(ctx, "a newer placement term has started: this one stops", "holder", s.holder, "lease_revision", s.leaseRevision)
		s.fenced(err)
	}
	return env, err
}

// OnFinished frees a job's GPUs, or withdraws it from the queue, then
// retries the pending jobs. A finish for a job placement has not seen yet
// (cancelled while analysis still had it) wins: the job is recorded as
// finished, with a release that frees nothing, so that its analysis,
// arriving later, is a duplicate and the job is never placed.
func (s *Service) OnFinished(ctx context.Context, env events.Envelope, ev *events.JobFinished) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	// Read before the release is published: a replay moves its clock on
	// once it sees the release.
	at := s.now()
	j, ok := s.store.Snapshot().Job(ev.JobID)
	if why := mayFinish(env.Scope, j, ok); why != "" {
		refused := &events.PlacementFinishRefused{JobID: ev.JobID, RequestID: env.ID,
			Reasons: []events.Reason{{Code: events.CodeNotPermitted, Field: "job_id", Message: why}}}
		if _, err := s.publish(ctx, refused); err != nil {
			return err
		}
		s.log.Warn("finish refused: not the sender's part", "job_id", ev.JobID, "scope", env.Scope.String(), "reason", why, "correlation_id", env.CorrelationID)
		return nil
	}
	switch {
	case !ok:
		rel := &events.PlacementReleased{JobID: ev.JobID, Status: ev.Status, Reason: ev.Reason, Tenant: withdrawer(env.Scope)}
		if _, err := s.publish(ctx, rel); err != nil {
			return err
		}
		if err := s.applyReleased(rel); err != nil {
			return err
		}
		s.demand.Ended(ev.JobID, at)
		s.log.Info("job withdrawn before it was analysed: it will not be placed", "job_id", ev.JobID, "status", ev.Status, "correlation_id", env.CorrelationID)
	case j.State == store.JobPlaced || j.State == store.JobPending:
		rel := &events.PlacementReleased{JobID: j.ID, Status: ev.Status, Reason: ev.Reason}
		if j.Decision != nil {
			rel.Nodes = j.Decision.Nodes
		}
		if _, err := s.publish(ctx, rel); err != nil {
			return err
		}
		if err := s.applyReleased(rel); err != nil {
			return err
		}
		s.demand.Ended(j.ID, at)
		s.log.Info("job released", "job_id", j.ID, "status", ev.Status, "was", j.State, "correlation_id", env.CorrelationID)
	}
	// Retried even for a duplicate: a crash may have come between the
	// release and the retry.
	return s.retryPending(ctx)
}

// mayFinish says why the identity of scope may not finish job j (ok: the
// store knows it), or "" when it may: the services and administrators
// finish any job, a tenant its own jobs (and a job placement has not
// seen, which then stays withdrawn only for that tenant's job: see
// withdrawnFor), a node's agent the job whose rank 0 it runs.
func mayFinish(scope events.Scope, j store.Job, ok bool) string {
	switch scope.Kind {
	case events.ScopeTenant:
		if !ok || j.Spec.Job.JobID == "" {
			return "" // not seen yet, or withdrawn: its tenant is not known
		}
		if j.Spec.Job.Tenant != scope.Name {
			return fmt.Sprintf("tenant %s finishes its own jobs only, and %s is not one", scope.Name, j.ID)
		}
	case events.ScopeNode:
		if !ok || j.Decision == nil {
			return fmt.Sprintf("node %s's agent finishes the jobs whose rank 0 it runs, and %s runs no rank there", scope.Name, j.ID)
		}
		if lead := leadNode(j.Decision); lead != scope.Name {
			return fmt.Sprintf("node %s's agent finishes the jobs whose rank 0 it runs, and %s's rank 0 runs on %s", scope.Name, j.ID, lead)
		}
	}
	return ""
}

// withdrawer is the tenant whose finish withdraws a job placement has not
// seen, "" for the services'.
func withdrawer(scope events.Scope) string {
	if scope.Kind == events.ScopeTenant {
		return scope.Name
	}
	return ""
}

// leadNode is the node of a decision's rank 0.
func leadNode(d *events.PlacementDecided) string {
	for _, r := range d.Ranks {
		if r.Rank == 0 {
			return r.Node
		}
	}
	return ""
}

// OnInvalidFinish answers a jobs.finished that names a job (in ce-subject
// or its body) but cannot be read with placement.finish_refused, listing
// every field and rule that failed; nothing else changes. The message then
// goes to the dead letters, as one without a readable job id does alone.
func (s *Service) OnInvalidFinish(ctx context.Context, env events.Envelope, _ []byte, err error) error {
	return s.answerMalformed(ctx, env, err, "finish", func(reasons []events.Reason) any {
		return &events.PlacementFinishRefused{JobID: env.Subject, RequestID: env.ID, Reasons: reasons}
	})
}

// OnInvalidMigrationAccept answers a jobs.migration_accepted that names a
// job but cannot be read (a proposal_id that is no proposal id, say) with
// placement.migration_refused, its reasons those of the reading (schema
// rules, decoding problems), as a request that can be read and is refused
// is answered.
func (s *Service) OnInvalidMigrationAccept(ctx context.Context, env events.Envelope, _ []byte, err error) error {
	return s.answerMalformed(ctx, env, err, "migration acceptance", func(reasons []events.Reason) any {
		for i := range reasons {
			reasons[i].Message = "the request cannot be read: " + reasons[i].Message
		}
		return &events.PlacementMigrationRefused{JobID: env.Subject, RequestID: env.ID, Reasons: reasons}
	})
}

// answerMalformed publishes answer(the reasons err gives, bounded) about
// the job env names; a message naming none is left to the dead letters.
func (s *Service) answerMalformed(ctx context.Context, env events.Envelope, err error, what string, answer func([]events.Reason) any) error {
	if !events.ValidJobID(env.Subject) {
		s.log.Warn("malformed "+what+" without a usable job id: dead-lettered", "id", env.ID, "err", err)
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, perr := s.publish(ctx, answer(pattern.CapReasons(bus.ReasonsOf(err)))); perr != nil {
		return perr
	}
	s.log.Info("malformed "+what+" refused", "job_id", env.Subject, "request_id", env.ID, "correlation_id", env.CorrelationID, "err", err)
	return nil
}

// onTopology applies the topology stream in its own order, on one
// consumer. Separate consumers per event type would let a node's report
// overtake the health change published after it, and a report is the
// node's whole description: a GPU marked failed would be healthy again.
// An event is decoded first, so that a malformed one is dead-lettered even
// when a catch-up has already passed it; one the store applied already (a
// catch-up at start, or when a job found no node) is then skipped.
func (s *Service) onTopology(ctx context.Context, env events.Envelope, name events.Name, body []byte) error {
	switch name {
	case events.NameTopologyNode:
		var n events.TopologyNode
		if err := s.read.Decode(name, body, &n); err != nil {
			return err
		}
		return s.OnNode(ctx, env, &n)
	case events.NameTopologyHealth:
		var h events.TopologyHealth
		if err := s.read.Decode(name, body, &h); err != nil {
			return err
		}
		return s.OnHealth(ctx, env, &h)
	case events.NameTopologyHeld:
		var h events.TopologyHeld
		if err := s.read.Decode(name, body, &h); err != nil {
			return err
		}
		return s.OnHeld(ctx, env, &h)
	case events.NameTopologyFabric:
		var f events.TopologyFabric
		if err := s.read.Decode(name, body, &f); err != nil {
			return err
		}
		return s.OnFabric(ctx, env, &f)
	}
	return nil
}

// appliedTopology reports whether the topology event being handled (its
// stream sequence in ctx) is one the store has applied already; the
// caller holds mu. Only a consumer that follows the stream in order may
// skip on it: topoSeq is a watermark of that order.
func (s *Service) appliedTopology(ctx context.Context) bool {
	seq := bus.StreamSeq(ctx)
	return seq != 0 && seq <= s.topoSeq
}

// retryAfterCatchUp retries the queue once after topology that a job's
// catch-up applied: the rest of the queue may fit now too.
func (s *Service) retryAfterCatchUp(ctx context.Context) error {
	if !s.topoUnretried {
		return nil
	}
	s.topoUnretried = false
	return s.retryPending(ctx)
}

// changeTopology applies one topology event, unless a catch-up has
// already, then retries the pending jobs (a node came, a part recovered,
// a hold was given back: a job may fit now).
func (s *Service) changeTopology(ctx context.Context, apply func() error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.appliedTopology(ctx) {
		return s.retryAfterCatchUp(ctx)
	}
	if err := apply(); err != nil {
		return err
	}
	s.topoSeq = max(s.topoSeq, bus.StreamSeq(ctx))
	return s.retryPending(ctx)
}

// OnNode records a node's report, then retries the pending jobs.
func (s *Service) OnNode(ctx context.Context, _ events.Envelope, n *events.TopologyNode) error {
	return s.changeTopology(ctx, func() error {
		if err := s.store.UpsertNode(*n); err != nil {
			return fmt.Errorf("node %s: %w", n.Name, err)
		}
		return nil
	})
}

// OnHealth records a health change, then retries the pending jobs.
func (s *Service) OnHealth(ctx context.Context, _ events.Envelope, h *events.TopologyHealth) error {
	return s.changeTopology(ctx, func() error {
		if err := s.store.SetHealth(*h); err != nil {
			return fmt.Errorf("health of %s: %w", h.Node, err)
		}
		return nil
	})
}

// OnHeld records which GPUs of a node are held outside toposched, then
// retries the pending jobs (a hold given back frees GPUs).
func (s *Service) OnHeld(ctx context.Context, _ events.Envelope, h *events.TopologyHeld) error {
	return s.changeTopology(ctx, func() error {
		if err := s.store.SetHeld(*h); err != nil {
			return fmt.Errorf("held GPUs of %s: %w", h.Node, err)
		}
		return nil
	})
}

// OnFabric records the switch tree: every node's leaf, pod and core become
// domains of its GPUs. A tree that does not hold together is refused (and
// dead-lettered); the previous one stays.
func (s *Service) OnFabric(ctx context.Context, _ events.Envelope, ev *events.TopologyFabric) error {
	return s.changeTopology(ctx, func() error { return s.applyFabric(*ev) })
}

func (s *Service) applyFabric(ev events.TopologyFabric) error {
	f, err := s.store.ApplyFabric(ev)
	if err != nil {
		return err
	}
	s.fabric = f
	return nil
}

// decisionTooLarge is the reason a job that fits is rejected all the same.
func decisionTooLarge(ranks, nodes int, tl *bus.TooLargeError) events.Reason {
	return events.Reason{Code: outcome.CodeDecisionTooLarge, Field: outcome.FieldGPUs, Message: fmt.Sprintf(
		"the job fits, but its decision (%d ranks on %d nodes, each listed for the launchers) is %.1f MiB, over the limit of %.1f MiB for one message: split the job, or raise max_payload and the streams' max_msg_size",
		ranks, nodes, float64(tl.Size)/(1<<20), float64(tl.Limit)/(1<<20))}
}

// decide plans with the strategy and policies in force. Before it calls a
// job impossible it makes sure the store has caught up with the topology
// stream: topology and jobs arrive on separate consumers, and a job must
// not be rejected for lack of a node whose report is already stored but
// not yet handled. With no topology at all, a job waits rather than being
// rejected.
func (s *Service) decide(ctx context.Context, c *cycle, job events.JobAnalyzed, fresh bool) (placer.Plan, error) {
	o := placer.PlanOptions{Counterfactuals: fresh, Running: &c.running}
	if s.observe != nil {
		ctx = policies.WithEvalObserver(ctx, s.observe)
	}
	plan, err := s.planner().Plan(ctx, c.view(), job, o)
	if err != nil || plan.Verdict != outcome.Never {
		return plan, err
	}
	// The catch-up writes the store: the cycle's transaction ends first.
	if err := c.commit(); err != nil {
		return plan, err
	}
	c.catchUps++
	before := s.topoSeq
	if _, _, err := s.catchUpTopology(ctx); err != nil {
		return plan, bus.Transient(err)
	}
	s.topoUnretried = s.topoUnretried || s.topoSeq > before
	snap := c.view()
	if plan, err = s.planner().Plan(ctx, snap, job, o); err != nil || plan.Verdict != outcome.Never {
		return plan, err
	}
	for range snap.EachNode() {
		return plan, nil
	}
	return placer.Plan{Verdict: outcome.Wait, Reasons: []events.Reason{{
		Code: "no_topology", Field: "gpus",
		Message: "no node has reported yet; the job waits for the cluster's topology",
	}}}, nil
}

// planner is the Planner of the service's current state.
func (s *Service) planner() *placer.Planner {
	return &placer.Planner{Strategy: s.strategy, Fabric: s.fabric, Bandwidths: s.bandwidths.Load(), Policies: s.policies,
		Reservation: s.reservation, Backfill: s.backfill, Log: s.log, SearchBudget: s.searchBudget, Compact: s.compact(), ComputeReference: s.computeReference,
		Demand: s.demand, Now: s.now()}
}

// predict scores the chosen GPUs and, as the baseline, what blind first
// fit took on the same state (before the reservation), with the same cost
// model (placer.Predictions).
func (s *Service) predict(ctx context.Context, before *store.Snapshot, job events.JobAnalyzed, gpus []store.GPUKey, b outcome.Result) (ours, base *events.Prediction) {
	ours, base, err := placer.Predictions(before, job, gpus, b, s.fabric, s.bandwidths.Load(), s.strategy)
	if err != nil {
		s.log.WarnContext(ctx, "prediction failed", "job_id", job.Job.JobID, "strategy", s.strategy, "err", err)
	}
	if ref := s.computeReference; ref != "" {
		bw := s.bandwidths.Load()
		placer.ComputeByModel(ours, before, job, gpus, ref, bw)
		placer.ComputeByModel(base, before, job, b.GPUs, ref, bw)
	}
	return ours, base
}

// retryPending tries every queued job in queue order. A job asking for
// more GPUs than are free is skipped without walking the cluster, and so
// is the twin of a job this retry found still waiting (waiting). Before
// it, the head of the queue gets its reservation if it has waited long
// enough (see Reservation).
func (s *Service) retryPending(ctx context.Context) error {
	c := s.newCycle()
	snap := c.view()
	queue := snap.PendingQueue()
	var head store.Job
	if len(queue) > 0 {
		head = *queue[0]
	}
	s.reserve(ctx, snap, head, len(queue) > 0)
	free := snap.FreeCount()
	// A busy cluster's queue is mostly jobs of a few shapes, each tried
	// after every finish; where nothing a decision reads tells twins
	// apart, one wait answers for all of them (twins).
	waiting := map[int]bool{}
	share := s.strategy != placer.StrategyRandom && !s.policies.ReadsJobID()
	defer s.twins.keep(queue)
	for _, j := range queue {
		if free == 0 {
			break
		}
		if j.Spec.Job.GPUs > free {
			continue
		}
		held := s.reservation != nil && s.reservation.JobID == j.ID
		if share && !held && waiting[s.twins.class(j)] {
			if err := s.ended(j.ID); err != nil {
				return errors.Join(err, c.finish())
			}
			continue
		}
		catchUps := c.catchUps
		left, err := c.place(ctx, *j, false, nil)
		if err != nil {
			return errors.Join(err, c.finish())
		}
		switch {
		case left:
			if held {
				s.reservation = nil
			}
			free = c.view().FreeCount()
			clear(waiting) // the view changed
		case c.catchUps != catchUps:
			clear(waiting) // the view may have changed
		case share && !held:
			waiting[s.twins.class(j)] = true
		}
	}
	return c.finish()
}

// twins sorts waiting jobs into classes of jobs identical but for their
// ids. A retry that waits sends nothing and changes nothing, so until a
// job leaves the queue the view is the same for every job, and a job
// identical to one that waits but for its id waits too: a plan reads the
// job's id only for the reservation (the job it holds nodes for is never
// a twin), the random strategy and policies that name it, and the retry
// shares no wait under those (retryPending's share).
//
// A job's class is found by comparing its analysed job with one of each
// class, once per row of the store: rows are never changed in place, and
// a waiting job's row stays the same from one retry to the next, where
// the queue may hold thousands of jobs.
type twins struct {
	of map[*store.Job]int
	// reps are one job of each class, id cleared, by GPUs asked for.
	reps map[int][]twinRep
	n    int
}

type twinRep struct {
	job   events.JobAnalyzed
	class int
}

// twinsLimit bounds the classes kept: shapes are few, but nothing stops
// a stream of jobs from making each one new.
const twinsLimit = 4096

func (t *twins) class(j *store.Job) int {
	if c, ok := t.of[j]; ok {
		return c
	}
	if t.of == nil {
		t.of, t.reps = map[*store.Job]int{}, map[int][]twinRep{}
	}
	job := j.Spec
	job.Job.JobID = ""
	for _, r := range t.reps[job.Job.GPUs] {
		if reflect.DeepEqual(r.job, job) {
			t.of[j] = r.class
			return r.class
		}
	}
	c := t.n
	t.n++
	t.reps[job.Job.GPUs] = append(t.reps[job.Job.GPUs], twinRep{job, c})
	t.of[j] = c
	return c
}

// keep forgets the rows not in queue once they are as many again as
// those in it (a row kept longer is only memory: rows never change), and
// every class once there are more than twinsLimit.
func (t *twins) keep(queue []*store.Job) {
	if t.n > twinsLimit {
		*t = twins{}
		return
	}
	if len(t.of) <= 2*len(queue)+64 {
		return
	}
	of := make(map[*store.Job]int, len(t.of))
	for _, j := range queue {
		if c, ok := t.of[j]; ok {
			of[j] = c
		}
	}
	t.of = of
}

// applyReleased frees a released job's GPUs and records it finished, in
// one transaction: no reader sees the GPUs free while the job still holds
// them in its row.
func (s *Service) applyReleased(rel *events.PlacementReleased) error {
	t := s.store.Begin()
	if _, err := t.Release(rel.JobID); err != nil {
		t.Abort()
		return fmt.Errorf("release %s: %w", rel.JobID, err)
	}
	j, ok := t.Snapshot().Job(rel.JobID)
	if !ok {
		j = store.Job{ID: rel.JobID, WithdrawnBy: rel.Tenant}
	}
	j.State = store.JobFinished
	if err := t.UpsertJob(j); err != nil {
		t.Abort()
		return fmt.Errorf("record job %s: %w", rel.JobID, err)
	}
	if err := t.Commit(); err != nil {
		return fmt.Errorf("release %s: %w", rel.JobID, err)
	}
	delete(s.pendingSince, rel.JobID)
	s.forget(rel.JobID)
	return nil
}

// gpusOf lists the GPUs of a decision in rank order.
func gpusOf(d *events.PlacementDecided) []store.GPUKey {
	out := make([]store.GPUKey, len(d.Ranks))
	for i, r := range d.Ranks {
		out[i] = store.GPUKey{Node: r.Node, Index: r.GPU}
	}
	return out
}
