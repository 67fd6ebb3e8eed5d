package operator

import (
	"context"
	"fmt"
	"log/slog"
	"sync"

	"github.com/toposched/toposched/events/bus"
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
	b   *bus.Bus
	cfg Config
	log *slog.Logger
	// fail stops the operator when a term's handlers fail on their own.
	fail func(error)
	// onTerm, if set, is told each new term's service (nil when a term ends).
	onTerm func(*placement.Service)

	mu       sync.Mutex
	svc      *placement.Service // the current term's; nil on standby
	set      *policies.Set      // the policy set in force, for the next term
	setKnown bool
}

// SetPolicies records the set in force and puts it on the current term's
// service, if any.
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
// policy set in force, rebuilt from the streams, then its handlers.
func (p *placementTerms) start(ctx context.Context) (term, error) {
	svc := placement.New(p.b, p.log)
	if p.cfg.ReserveAfter != nil {
		svc.SetReserveAfter(*p.cfg.ReserveAfter)
	}
	if p.cfg.Strategy != "" {
		if err := svc.SetStrategy(p.cfg.Strategy); err != nil {
			return nil, err
		}
	}
	p.mu.Lock()
	if p.setKnown {
		// On an empty store: nothing to retry yet.
		if err := svc.SetPolicies(ctx, p.set); err != nil {
			p.mu.Unlock()
			return nil, err
		}
	}
	p.mu.Unlock()
	// Policy changes from here on reach this service; the service's own
	// lock orders them with the rebuild.
	p.setCurrent(svc)
	if err := svc.Rebuild(ctx); err != nil {
		p.setCurrent(nil)
		return nil, fmt.Errorf("rebuild placement: %w", err)
	}
	router, err := p.b.NewRouter()
	if err != nil {
		p.setCurrent(nil)
		return nil, err
	}
	svc.Register(router)
	// The handlers' context outlives the term's: stop closes the router
	// first so that in-flight handlers finish with a live context.
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	t := &placementTerm{router: router, cancel: cancel, finished: make(chan struct{}), terms: p}
	go func() {
		defer close(t.finished)
		t.err = router.Run(runCtx)
		select {
		case <-router.Running():
		default:
			return // failed to start: start reports it and the lease is retried
		}
		if t.err != nil && runCtx.Err() == nil && p.fail != nil {
			p.fail(fmt.Errorf("placement: %w", t.err))
		}
	}()
	select {
	case <-router.Running():
	case <-t.finished:
		cancel()
		p.setCurrent(nil)
		return nil, fmt.Errorf("placement handlers: %w", t.err)
	case <-ctx.Done():
		_ = t.stop()
		return nil, ctx.Err()
	}
	return t, nil
}

// placementTerm is one running term.
type placementTerm struct {
	router   *bus.Router
	cancel   context.CancelFunc
	finished chan struct{}
	err      error // valid once finished is closed
	terms    *placementTerms
	once     sync.Once
}

func (t *placementTerm) done() <-chan struct{} { return t.finished }

// stop closes the handlers (in-flight ones finish and settle; untaken
// messages stay in the streams) and forgets the service.
func (t *placementTerm) stop() error {
	var err error
	t.once.Do(func() {
		err = t.router.Close()
		t.cancel()
		<-t.finished
		t.terms.setCurrent(nil)
		if err == nil {
			err = t.err
		}
	})
	return err
}
