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
	// ReserveAfter is how long the head of placement's queue waits before
	// nodes are held for it (placer.Reservation); nil for the default,
	// negative for never.
	ReserveAfter *time.Duration
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
	if c.LeaseTTL < 0 || (c.LeaseTTL > 0 && c.LeaseTTL < 500*time.Millisecond) {
		errs = append(errs, fmt.Errorf("lease ttl %s: at least 500ms", c.LeaseTTL))
	}
	if slices.Contains(c.Services, Discovery) && c.ClusterFile == "" {
		errs = append(errs, errors.New("cluster file: required by discovery (--cluster)"))
	}
	return errors.Join(errs...)
}

// Operator is a set of running services.
type Operator struct {
	router *bus.Router
	// Placement is the placement service of the term this replica led
	// when Start returned; nil when it started as a standby. A replica
	// that loses the lease and takes it again runs a new service:
	// PlacementService is the current one.
	Placement *placement.Service
	Optimizer *optimizer.Service

	terms *placementTerms
	lease *lease

	cancel   context.CancelFunc
	wg       sync.WaitGroup
	errMu    sync.Mutex
	firstErr error
	done     chan struct{}
}

// Start rebuilds the services' state from the streams, starts them, and
// returns once every handler is consuming.
func Start(ctx context.Context, b *bus.Bus, cfg Config, log *slog.Logger) (*Operator, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("operator config: %w", err)
	}
	if log == nil {
		log = slog.Default()
	}
	router, err := b.NewRouter()
	if err != nil {
		return nil, err
	}
	o := &Operator{done: make(chan struct{})}
	has := func(s string) bool { return slices.Contains(cfg.Services, s) }
	// Discovery publishes first, so that placement's rebuild below already
	// holds the whole cluster when the first job is handled.
	var disc *discovery.Service
	if has(Discovery) {
		disc = discovery.New(discovery.Config{ClusterFile: cfg.ClusterFile, Poll: cfg.Poll}, b, log)
		if err := disc.Init(ctx); err != nil {
			return nil, err
		}
	}
	if has(Analysis) {
		analysis.New(b, log).Register(router)
	}
	if has(Optimizer) {
		o.Optimizer = optimizer.New(b, log)
		if err := o.Optimizer.Rebuild(ctx); err != nil {
			return nil, err
		}
		o.Optimizer.Register(router)
	}
	// The services' own context outlives a signal: Stop closes the routers
	// first so that in-flight handlers finish with a live context.
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	o.cancel = cancel
	abort := func(err error) (*Operator, error) {
		cancel()
		o.wg.Wait()
		return nil, err
	}
	if has(Placement) {
		// The policy set is in force before the first job is handled;
		// placement itself runs only while this replica holds the lease.
		o.terms = &placementTerms{b: b, cfg: cfg, log: log, fail: o.fail, onTerm: cfg.OnPlacementTerm}
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
	if has(Analysis) || has(Optimizer) {
		o.router = router
		o.wg.Add(1)
		go func() {
			defer o.wg.Done()
			o.fail(router.Run(runCtx))
		}()
		select {
		case <-router.Running():
		case <-ctx.Done():
			_ = router.Close()
			return abort(ctx.Err())
		}
	}
	if disc != nil {
		o.wg.Add(1)
		go func() {
			defer o.wg.Done()
			o.fail(disc.Run(runCtx))
		}()
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
	// looks healthy and decides nothing.
	go o.Stop()
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
	var err error
	if o.router != nil {
		err = o.router.Close()
	}
	o.cancel()
	<-o.done
	if err != nil {
		return fmt.Errorf("stop router: %w", err)
	}
	return o.Err()
}
