// Package operator wires toposched's services into one process: the
// all-in-one `toposched serve`, each `toposched <service>` on its own, the
// demo, the replays and the tests all run services through an Operator
// (New, then Run).
package operator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/toposched/toposched/events/bus"
	"github.com/toposched/toposched/internal/collective"
	"github.com/toposched/toposched/services/analysis"
	"github.com/toposched/toposched/services/discovery"
	"github.com/toposched/toposched/services/optimizer"
	"github.com/toposched/toposched/services/placement"
)

// Service names.
const (
	Discovery = "discovery"
	Analysis  = "analysis"
	Placement = "placement"
	Optimizer = "optimizer"
)

// All lists every service.
var All = []string{Discovery, Analysis, Placement, Optimizer}

// Config says which services run and how.
type Config struct {
	Services []string
	// Discovery is the discovery service's: the cluster file it publishes
	// and how often it looks for changes.
	Discovery discovery.Config
	// Placement is what each of placement's terms starts with: the
	// strategy, the reservation, the stretch bound, the search budget.
	// Its Policies, Bandwidths, Holder and LeaseRevision are the
	// operator's to set, from the policy and calibration loops, Replica
	// and the lease: Validate refuses them here.
	Placement placement.Config
	// Optimizer is the optimizer's. Its Bandwidths are the calibration
	// loop's (Calibration): Validate refuses them here.
	Optimizer optimizer.Config
	// Calibration is the cost model's base calibration for placement and
	// the optimizer (nil: the documented efficiencies), a --calibration
	// file's; the set in the calibration KV bucket overrides it while
	// there is one (see calibrations.go). CalibrationRevision names it in
	// events (calibration.Revision of the file).
	Calibration         *collective.Calibration
	CalibrationRevision string
	// OnlineCalibration lets the optimizer move the calibration in the
	// bucket from what jobs' telemetry measures (collective.Online).
	OnlineCalibration bool
	// Policies is placement's base policy set: a directory, reloaded when
	// its files change; PoliciesDefault ("") for the shipped set; or
	// PoliciesNone. A set pushed to the policy KV bucket overrides it when
	// newer (see policies.go).
	Policies string
	// PolicyPoll is how often the policy directory is read; 0 means
	// policies.DefaultWatchInterval.
	PolicyPoll time.Duration
	// Replica names this process in policy events and in placement's
	// lease; host name/pid when empty. Names must be unique among live
	// replicas (a pod name is): a replica restarted under its name takes
	// its lease back at once.
	Replica string
	// Sole says no other placement replica can reach this NATS server
	// (the private embedded server of serve, demo and replay): placement
	// then runs without a lease, which would only cost renewals that a
	// saturated single process can miss.
	Sole bool
	// LeaseTTL is how long placement's lease outlives its holder's last
	// renewal (leader.go); 0 means DefaultLeaseTTL. Every placement
	// replica should use the same value: the bucket keeps the last one set.
	LeaseTTL time.Duration
}

// Validate reports every problem at once.
func (c Config) Validate() error {
	var errs []error
	if len(c.Services) == 0 {
		errs = append(errs, errors.New("services: at least one"))
	}
	for _, s := range c.Services {
		if !slices.Contains(All, s) {
			errs = append(errs, fmt.Errorf("service %q: unknown (have %v)", s, All))
		}
	}
	if c.LeaseTTL < 0 || (c.LeaseTTL > 0 && c.LeaseTTL < MinLeaseTTL) {
		errs = append(errs, fmt.Errorf("lease ttl %s: at least %s", c.LeaseTTL, MinLeaseTTL))
	}
	if slices.Contains(c.Services, Placement) {
		if err := c.Placement.Validate(); err != nil {
			errs = append(errs, err)
		}
	} else if slices.Contains(c.Services, Optimizer) {
		// The optimizer alone takes placement's compute reference.
		if err := (optimizer.Config{ComputeReference: c.Placement.ComputeReference}).Validate(); err != nil {
			errs = append(errs, err)
		}
	}
	// The operator sets these on every term and on the optimizer: one
	// set here would be silently replaced.
	p := c.Placement
	if p.Policies != nil || p.Bandwidths != nil || p.Holder != "" || p.LeaseRevision != 0 {
		errs = append(errs, errors.New("placement: Policies, Bandwidths, Holder and LeaseRevision are the operator's (Policies, Calibration, Replica, the lease): leave them unset"))
	}
	if c.Optimizer.Bandwidths != nil {
		errs = append(errs, errors.New("optimizer: Bandwidths are the operator's (Calibration): leave them unset"))
	}
	if slices.Contains(c.Services, Discovery) && c.Discovery.ClusterFile == "" {
		errs = append(errs, errors.New("cluster file: required by discovery (--cluster)"))
	}
	return errors.Join(errs...)
}

// Deps are what the services talk to, and the hooks the harnesses and the
// metrics watch them through.
type Deps struct {
	// Bus is the services' connection to NATS.
	Bus *bus.Bus
	// Log is nil for slog.Default.
	Log *slog.Logger
	// PlacementNow is placement's clock, which its queue's waits and
	// reservations are counted on (nil: time.Now). A replay on a virtual
	// clock passes its own, so that --reserve-after counts trace time.
	PlacementNow func() time.Time
	// ObservePolicyEval, if set, is told how long each of placement's Rego
	// evaluations took (the metrics' histogram).
	ObservePolicyEval func(time.Duration)
	// OnPlacementTerm, if set, is told the placement service of each term
	// this replica leads, and nil when the term ends (metrics read the
	// store through it).
	OnPlacementTerm func(*placement.Service)
}

// Operator is a set of services run together.
type Operator struct {
	cfg Config
	b   *bus.Bus
	log *slog.Logger

	// disc, an and opt are the services that run for the operator's
	// life; nil where they do not run here. Placement runs one service a
	// term (terms; nil where it does not run here).
	disc  *discovery.Service
	an    *analysis.Service
	opt   *optimizer.Service
	terms *placementTerms
	// lease is placement's, set by Run; nil without one.
	lease atomic.Pointer[lease]
	// calibration is the calibration loop, set by Run before Ready where
	// the optimizer or placement runs.
	calibration *calibrationLoop

	ready    chan struct{}
	done     chan struct{}
	cancel   context.CancelFunc
	wg       sync.WaitGroup
	errMu    sync.Mutex
	firstErr error
}

// Part is what each of toposched's long-running parts is once built (a
// service, the operator, the launcher's agent and watchdog): Run until its
// context ends, Ready once it serves.
type Part interface {
	Run(ctx context.Context) error
	Ready() <-chan struct{}
}

// New checks cfg and builds the services; Run starts them.
func New(cfg Config, deps Deps) (*Operator, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("operator config: %w", err)
	}
	if deps.Bus == nil {
		return nil, errors.New("operator: deps: Bus is required")
	}
	log := deps.Log
	if log == nil {
		log = slog.Default()
	}
	b := deps.Bus
	o := &Operator{cfg: cfg, b: b, log: log, ready: make(chan struct{}), done: make(chan struct{})}
	has := func(s string) bool { return slices.Contains(cfg.Services, s) }
	var err error
	if has(Discovery) {
		o.disc, err = discovery.New(cfg.Discovery, discovery.Deps{Publish: b, Read: b, Subjects: b.Subjects, Log: log})
		if err != nil {
			return nil, err
		}
	}
	if has(Analysis) {
		o.an, err = analysis.New(analysis.Config{}, analysis.Deps{Publish: b, Consume: b, Log: log})
		if err != nil {
			return nil, err
		}
	}
	if has(Optimizer) {
		ocfg := cfg.Optimizer
		ocfg.Bandwidths = cfg.Calibration.Bandwidths(nil)
		// Moves and the online compute calibration weigh compute by GPU
		// model where placement does, on its reference.
		ocfg.ComputeReference = cfg.Placement.ComputeReference
		o.opt, err = optimizer.New(ocfg, optimizer.Deps{Publish: b, Read: b, Consume: b, Subjects: b.Subjects, Log: log})
		if err != nil {
			return nil, err
		}
	}
	if has(Placement) {
		o.terms = &placementTerms{cfg: cfg.Placement, holder: replicaName(cfg), fail: o.fail, onTerm: deps.OnPlacementTerm,
			deps: placement.Deps{Publish: b, Read: b, Consume: b, Subjects: b.Subjects, Log: log, Now: deps.PlacementNow, ObservePolicyEval: deps.ObservePolicyEval},
			bw:   cfg.Calibration.Bandwidths(nil)}
	}
	return o, nil
}

// run starts svc on ctx and returns once it is ready. An error before
// that is returned (the caller aborts the start); one after it stops the
// operator.
func (o *Operator) run(ctx context.Context, name string, svc Part) error {
	errc := make(chan error, 1)
	o.wg.Add(1)
	go func() {
		defer o.wg.Done()
		err := svc.Run(ctx)
		select {
		case <-svc.Ready():
			if err == nil && ctx.Err() == nil {
				err = errors.New("stopped on its own")
			}
			if err != nil {
				o.fail(fmt.Errorf("%s: %w", name, err))
			}
		default:
			errc <- err
		}
	}()
	select {
	case <-svc.Ready():
		return nil
	case err := <-errc:
		if err == nil {
			err = errors.New("stopped before it was ready")
		}
		return fmt.Errorf("%s: %w", name, err)
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Ready is closed once every service has rebuilt its state from the
// streams and every handler consumes (on a placement standby: once it
// campaigns).
func (o *Operator) Ready() <-chan struct{} { return o.ready }

// Run starts the services, each once the one before is ready, and runs
// them until ctx ends or one of them fails; then it stops them all (each
// closes its handlers, letting in-flight ones finish; messages not yet
// taken stay in the streams) and returns the first failure.
func (o *Operator) Run(ctx context.Context) error {
	ctx, o.cancel = context.WithCancel(ctx)
	defer close(o.done)
	err := o.start(ctx)
	if err != nil {
		o.cancel()
	} else {
		close(o.ready)
		o.log.Info("services running", "services", o.cfg.Services)
	}
	o.wg.Wait()
	o.cancel()
	if first := o.Err(); first != nil {
		return first
	}
	return err
}

// start starts the services and returns once every handler is consuming.
func (o *Operator) start(ctx context.Context) error {
	// Discovery publishes first, so that placement's rebuild below already
	// holds the whole cluster when the first job is handled.
	if o.disc != nil {
		if err := o.run(ctx, Discovery, o.disc); err != nil {
			return err
		}
	}
	if o.an != nil {
		if err := o.run(ctx, Analysis, o.an); err != nil {
			return err
		}
	}
	// The calibration is in force before the optimizer or placement
	// predicts anything.
	var targets []bandwidthTarget
	var predictors []string
	if o.opt != nil {
		targets, predictors = append(targets, o.opt), append(predictors, Optimizer)
	}
	if o.terms != nil {
		targets, predictors = append(targets, o.terms), append(predictors, Placement)
	}
	if len(targets) > 0 {
		cl, err := startCalibration(ctx, ctx, o.b, targets, predictors, o.cfg, o.log, &o.wg)
		if err != nil {
			return err
		}
		o.calibration = cl
		if o.opt != nil && o.cfg.OnlineCalibration {
			o.opt.CalibrateOnline(cl)
		}
	}
	if o.opt != nil {
		if err := o.run(ctx, Optimizer, o.opt); err != nil {
			return err
		}
	}
	if o.terms != nil {
		// The policy set is in force before the first job is handled;
		// placement itself runs only while this replica holds the lease.
		if err := startPolicies(ctx, ctx, o.b, o.terms, o.cfg, o.log, &o.wg); err != nil {
			return err
		}
		if o.cfg.Sole {
			return o.startSole(ctx)
		}
		return o.startLease(ctx)
	}
	return nil
}

// OptimizerService is the optimizer; nil where it does not run here.
func (o *Operator) OptimizerService() *optimizer.Service { return o.opt }

func (o *Operator) fail(err error) {
	if err == nil {
		return
	}
	o.errMu.Lock()
	if o.firstErr == nil {
		o.firstErr = err
	}
	o.errMu.Unlock()
	// One service failing stops them all: a half-running operator looks
	// healthy and decides nothing. Run returns the error recorded above.
	o.cancel()
}

// Done is closed when Run has stopped every service.
func (o *Operator) Done() <-chan struct{} { return o.done }

// Err is the first error a service stopped with; nil while none has.
func (o *Operator) Err() error {
	o.errMu.Lock()
	defer o.errMu.Unlock()
	return o.firstErr
}

// Background runs p until stop is called, and returns once p is ready: for
// the harnesses that work beside the services (the demo, the replays, the
// tests). The run does not end with ctx, which bounds the wait alone: stop
// ends it, letting it finish what it holds, and returns what Run
// returned. If p stops before it is ready, or ctx ends first, Background
// stops it and returns the error.
func Background(ctx context.Context, p Part) (stop func() error, err error) {
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	ran := make(chan error, 1)
	go func() { ran <- p.Run(runCtx) }()
	var once sync.Once
	var runErr error
	stop = func() error {
		once.Do(func() {
			cancel()
			runErr = <-ran
		})
		return runErr
	}
	select {
	case <-p.Ready():
		return stop, nil
	case err := <-ran:
		cancel()
		if err == nil {
			err = errors.New("stopped before it was ready")
		}
		return nil, err
	case <-ctx.Done():
		_ = stop()
		return nil, ctx.Err()
	}
}
