package placement

import (
	"context"
	"testing"
	"time"

	"github.com/toposched/toposched/events/bus"
	"github.com/toposched/toposched/internal/demand"
)

// Rebuild is rebuild, for the tests that look at a store rebuilt from the
// streams without running the handlers (they call them by hand).
func (s *Service) Rebuild(ctx context.Context) error { return s.rebuild(ctx) }

// NewOnBus is New with every port on b, failing the test on an error. It
// opens the service's term, as Run does first: the outcomes it publishes
// when a test calls its handlers by hand are fenced on the term, as in
// production, and so a rebuild takes them in.
func NewOnBus(t testing.TB, b *bus.Bus, cfg Config) *Service {
	t.Helper()
	s, err := New(cfg, Deps{Publish: b, Read: b, Consume: b, Subjects: b.Subjects})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.openTerm(t.Context()); err != nil {
		t.Fatal(err)
	}
	return s
}

// HoldCycles keeps every decision cycle from starting until release is
// called, so that the jobs handed in meanwhile are decided in one cycle.
func (s *Service) HoldCycles() (release func()) {
	s.mu.Lock()
	return s.mu.Unlock
}

// NotifyQueued makes the service tell ch of every job put in the intake;
// set it before any handler runs.
func (s *Service) NotifyQueued(ch chan<- struct{}) { s.intake.queued = ch }

// SetAckWait sets how long an outcome's acknowledgement is waited for, and
// sent again for, before it is kept in doubt. It takes the service's lock,
// which every cycle holds, so a test may change it between cycles.
func (s *Service) SetAckWait(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ackWait = d
}

// Decision is the context a job is decided under, given its handler's.
func (s *Service) Decision(ctx context.Context) (context.Context, context.CancelFunc) {
	return s.decision(ctx)
}

// SetLife sets the term's life, as Run does.
func (s *Service) SetLife(ctx context.Context) { s.life = ctx }

// NewStandby is New with every port on b and no term of its own: a replica
// that rebuilds and reads while another leads (what NewOnBus's service
// publishes is fenced on that one's term).
func NewStandby(t testing.TB, b *bus.Bus, cfg Config) *Service {
	t.Helper()
	s, err := New(cfg, Deps{Publish: b, Read: b, Consume: b, Subjects: b.Subjects})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// Demand is the service's forecast of demand.
func (s *Service) Demand() *demand.Forecast { return s.demand }

// ReseedDemand gives the service a new forecast of demand seeded from its
// store, as its rebuild does, and returns it; the old one is left as it
// was.
func (s *Service) ReseedDemand() *demand.Forecast {
	s.demand = newDemand()
	s.seedDemand(s.store.Snapshot())
	return s.demand
}
