// Package operator wires toposched's services into one process: the
// all-in-one `toposched serve`, each `toposched <service>` on its own, the
// demo and the tests all start services through Start.
package operator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
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

// Config says which services run and what they read.
type Config struct {
	Services []string
	// ClusterFile is read by discovery.
	ClusterFile string
	// Poll is how often discovery checks the cluster file for changes.
	Poll time.Duration
	// Strategy is placement's: topology-aware (default) or blind.
	Strategy string
	// Calibration is the cost model's base calibration for placement and
	// the optimizer (nil: the documented efficiencies), a --calibration
	// file's; the set in the calibration KV bucket overrides it while
	// there is one (see calibrations.go). CalibrationRevision names it in
	// events (calibration.Revision of the file).
	Calibration         *collective.Calibration
	CalibrationRevision string
	// OptimizerNoMigrations is the optimizer's optimizer.Config.NoMigrations.
	OptimizerNoMigrations bool
	// OnlineCalibration lets the optimizer move the calibration in the
	// bucket from what jobs' telemetry measures (collective.Online).
	OnlineCalibration bool
	// ReserveAfter is how long the head of placement's queue waits before
	// nodes are held for it (placer.Reservation); nil for the default,
	// negative for never.
	ReserveAfter *time.Duration
	// MaxStretch is placement's placement.Config.MaxStretch (0: the
	// default; negative: off).
	MaxStretch float64
	// PlacementNow is placement's clock, which its queue's waits and
	// reservations are counted on (nil: time.Now). A replay on a virtual
	// clock passes its own, so that --reserve-after counts trace time.
	PlacementNow func() time.Time
	// PlacementSearchBudget is placement's placement.Config.SearchBudget:
	// a replay on a virtual clock passes a negative one, so that its
	// decisions follow the trace and not the machine's load.
	PlacementSearchBudget time.Duration
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
	// ObservePolicyEval, if set, is told how long each of placement's Rego
	// evaluations took (the metrics' histogram).
	ObservePolicyEval func(time.Duration)
	// OnPlacementTerm, if set, is told the placement service of each term
	// this replica leads, and nil when the term ends (metrics read the
	// store through it).
	OnPlacementTerm func(*placement.Service)
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
		if err := (placement.Config{Strategy: c.Strategy}).Validate(); err != nil {
			errs = append(errs, err)
		}
	}
	if slices.Contains(c.Services, Discovery) && c.ClusterFile == "" {
		errs = append(errs, errors.New("cluster file: required by discovery (--cluster)"))
	}
	return errors.Join(errs...)
}

// Operator is a set of running services.
type Operator struct {
	// Placement is the placement service of the term this replica led
	// when Start returned; nil when it started as a standby. A replica
	// that loses the lease and takes it again runs a new service:
	// PlacementService is the current one.
	Placement *placement.Service
	Optimizer *optimizer.Service

	terms       *placementTerms
	lease       *lease
	calibration *calibrationLoop

	cancel   context.CancelFunc
	wg       sync.WaitGroup
	errMu    sync.Mutex
	firstErr error
	done     chan struct{}
}

// service is what every service is once built: Run until its context ends,
// Ready once it serves.
type service interface {
	Run(ctx context.Context) error
	Ready() <-chan struct{}
}

// run starts svc on runCtx and returns once it is ready. An error before
// that is returned (the caller aborts the start); one after it stops the
// operator.
func (o *Operator) run(ctx, runCtx context.Context, name string, svc service) error {
	errc := make(chan error, 1)
	o.wg.Add(1)
	go func() {
		defer o.wg.Done()
		err := svc.Run(runCtx)
		select {
		case <-svc.Ready():
			if err == nil && runCtx.Err() == nil {
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

// Start builds the services, rebuilds their state from the streams, and
// returns once every handler is consuming.
func Start(ctx context.Context, b *bus.Bus, cfg Config, log *slog.Logger) (*Operator, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("operator config: %w", err)
	}
	if log == nil {
		log = slog.Default()
	}
	o := &Operator{done: make(chan struct{})}
	has := func(s string) bool { return slices.Contains(cfg.Services, s) }
	// The services' own context outlives a signal: Stop cancels it, and
	// each service then closes its handlers, letting in-flight ones finish
	// with a live context.
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	o.cancel = cancel
	abort := func(err error) (*Operator, error) {
		cancel()
		o.wg.Wait()
		return nil, err
	}
	// Discovery publishes first, so that placement's rebuild below already
	// holds the whole cluster when the first job is handled.
	if has(Discovery) {
		disc, err := discovery.New(discovery.Config{ClusterFile: cfg.ClusterFile, Poll: cfg.Poll},
			discovery.Deps{Publish: b, Read: b, Subjects: b.Subjects, Log: log})
		if err != nil {
			return abort(err)
		}
		if err := o.run(ctx, runCtx, Discovery, disc); err != nil {
			return abort(err)
		}
	}
	if has(Analysis) {
		an, err := analysis.New(analysis.Config{}, analysis.Deps{Publish: b, Consume: b, Log: log})
		if err != nil {
			return abort(err)
		}
		if err := o.run(ctx, runCtx, Analysis, an); err != nil {
			return abort(err)
		}
	}
	// The calibration is in force before the optimizer or placement
	// predicts anything.
	var targets []bandwidthTarget
	var predictors []string
	var opt *optimizer.Service
	if has(Optimizer) {
		var err error
		opt, err = optimizer.New(optimizer.Config{Bandwidths: cfg.Calibration.Bandwidths(nil), NoMigrations: cfg.OptimizerNoMigrations},
			optimizer.Deps{Publish: b, Read: b, Consume: b, Subjects: b.Subjects, Log: log})
		if err != nil {
			return abort(err)
		}
		targets, predictors = append(targets, opt), append(predictors, Optimizer)
	}
	if has(Placement) {
		o.terms = &placementTerms{b: b, cfg: cfg, log: log, holder: replicaName(cfg), fail: o.fail, onTerm: cfg.OnPlacementTerm,
			bw: cfg.Calibration.Bandwidths(nil)}
		targets, predictors = append(targets, o.terms), append(predictors, Placement)
	}
	if len(targets) > 0 {
		cl, err := startCalibration(ctx, runCtx, b, targets, predictors, cfg, log, &o.wg)
		if err != nil {
			return abort(err)
		}
		o.calibration = cl
		if opt != nil && cfg.OnlineCalibration {
			opt.CalibrateOnline(cl)
		}
	}
	if opt != nil {
		if err := o.run(ctx, runCtx, Optimizer, opt); err != nil {
			return abort(err)
		}
		o.Optimizer = opt
	}
	if has(Placement) {
		// The policy set is in force before the first job is handled;
		// placement itself runs only while this replica holds the lease.
		if err := startPolicies(ctx, runCtx, b, o.terms, cfg, log, &o.wg); err != nil {
			return abort(err)
		}
		start := o.startLease
		if cfg.Sole {
			start = o.startSole
		}
		if err := start(ctx, runCtx, b, cfg, log); err != nil {
			return abort(err)
		}
	}
	go func() {
		o.wg.Wait()
		close(o.done)
	}()
	log.Info("services running", "services", cfg.Services)
	return o, nil
}

func (o *Operator) fail(err error) {
	if err == nil {
		return
	}
	o.errMu.Lock()
	if o.firstErr == nil {
		o.firstErr = err
	}
	o.errMu.Unlock()
	// One service failing stops the process: a half-running operator
	// looks healthy and decides nothing. Stop waits for every service,
	// the caller's included, so it runs on its own; what it returns is
	// the error recorded above, which Err and the owner's Stop report.
	go func() { _ = o.Stop() }()
}

// Done is closed when every service has stopped.
func (o *Operator) Done() <-chan struct{} { return o.done }

// Err is the first error a service stopped with.
func (o *Operator) Err() error {
	o.errMu.Lock()
	defer o.errMu.Unlock()
	return o.firstErr
}

// Stop stops taking new messages, lets in-flight handlers finish and settle,
// and waits for every service. Messages not yet taken stay in the streams.
func (o *Operator) Stop() error {
	o.cancel()
	<-o.done
	return o.Err()
}
