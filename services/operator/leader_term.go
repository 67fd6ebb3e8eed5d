package operator

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/toposched/toposched/events/bus"
	"github.com/toposched/toposched/internal/topology"
	"github.com/toposched/toposched/policies"
	"github.com/toposched/toposched/services/placement"
)

// policyTarget is what the policy loop puts sets in force on.
type policyTarget interface {
	SetPolicies(ctx context.Context, set *policies.Set) error
}

// placementTerms runs placement for as long as this replica leads: each
// term is a fresh service, rebuilt from the streams and with its own
// router, so nothing of an earlier term's store (which may have missed
// another leader's decisions) survives into the next.
type placementTerms struct {
	// cfg and deps are every term's service's; start sets the term's
	// policies, bandwidths, holder and lease revision on cfg.
	cfg  placement.Config
	deps placement.Deps
	// holder is this replica's name in the lease and in its terms.
	holder string
	// fail stops the operator when a term's handlers fail on their own.
	fail func(error)
	// onTerm, if set, is told each new term's service (nil when a term ends).
	onTerm func(*placement.Service)

	mu       sync.Mutex
	svc      *placement.Service // the current term's; nil on standby
	set      *policies.Set      // the policy set in force, for the next term
	setKnown bool
	bw       *topology.Bandwidths // the calibration in force, for the next term
}

// SetBandwidths records the calibration in force and puts it on the
// current term's service, if any.
func (p *placementTerms) SetBandwidths(bw *topology.Bandwidths) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.bw = bw
	if p.svc != nil {
		p.svc.SetBandwidths(bw)
	}
}

// SetPolicies records the set in force and puts it on the current term's
// service, if any. Lock order: placementTerms.mu, then the service's.
func (p *placementTerms) SetPolicies(ctx context.Context, set *policies.Set) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.set, p.setKnown = set, true
	if p.svc == nil {
		return nil
	}
	return p.svc.SetPolicies(ctx, set)
}

// current is the leading term's service; nil on standby.
func (p *placementTerms) current() *placement.Service {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.svc
}

func (p *placementTerms) setCurrent(svc *placement.Service) {
	p.mu.Lock()
	p.svc = svc
	p.mu.Unlock()
	if p.onTerm != nil {
		p.onTerm(svc)
	}
}

// start begins a term: a new service with the configured strategy and the
// policy set in force, rebuilt from the streams, then its handlers. It
// returns once the handlers consume.
func (p *placementTerms) start(ctx context.Context, leaseRevision uint64) (term, error) {
	p.mu.Lock()
	cfg := p.cfg
	cfg.Policies, cfg.Bandwidths, cfg.Holder, cfg.LeaseRevision = p.set, p.bw, p.holder, leaseRevision
	svc, err := placement.New(cfg, p.deps)
	if err != nil {
		p.mu.Unlock()
		return nil, err
	}
	// Policy changes from here on reach this service (SetPolicies); the
	// service's own lock orders them with its rebuild. Lock order:
	// placementTerms.mu, then the service's.
	p.svc = svc
	p.mu.Unlock()
	if p.onTerm != nil {
		p.onTerm(svc)
	}
	// The term's context ends the service; its handlers outlive it only
	// to finish what they hold (bus.Serve).
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	t := &placementTerm{cancel: cancel, finished: make(chan struct{}), terms: p}
	go func() {
		defer close(t.finished)
		t.err = svc.Run(runCtx)
		select {
		case <-svc.Ready():
		default:
			return // failed to start: start reports it and the lease is retried
		}
		// A fenced term ends for the lease loop to step down and campaign
		// again; any other failure of the handlers stops the operator.
		if t.err != nil && runCtx.Err() == nil && p.fail != nil && !errors.Is(t.err, bus.ErrFenced) {
			p.fail(fmt.Errorf("placement: %w", t.err))
		}
	}()
	select {
	case <-svc.Ready():
	case <-t.finished:
		cancel()
		p.setCurrent(nil)
		if t.err == nil {
			return nil, fmt.Errorf("placement stopped before it was ready")
		}
		return nil, t.err
	case <-ctx.Done():
		_ = t.stop()
		return nil, ctx.Err()
	}
	return t, nil
}

// placementTerm is one running term.
type placementTerm struct {
	cancel   context.CancelFunc
	finished chan struct{}
	err      error // valid once finished is closed
	terms    *placementTerms
	once     sync.Once
}

func (t *placementTerm) done() <-chan struct{} { return t.finished }

// stop ends the term's service (in-flight handlers finish and settle;
// untaken messages stay in the streams) and forgets it.
func (t *placementTerm) stop() error {
	var err error
	t.once.Do(func() {
		t.cancel()
		<-t.finished
		t.terms.setCurrent(nil)
		err = t.err
	})
	return err
}
