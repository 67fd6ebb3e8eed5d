package eventstest

import (
	"context"
	"sync"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/events/bus"
)

// Memory is an in-memory stand-in for the bus's Publisher and Reader
// ports, for unit tests that drive a service's handlers by hand: it
// records what is published and holds no streams (every replay is empty).
type Memory struct {
	mu        sync.Mutex
	published []any
}

var (
	_ bus.Publisher = (*Memory)(nil)
	_ bus.Reader    = (*Memory)(nil)
)

// Publish records v with the envelope a bus would give it (ids derived
// from the event handled, as bus.Envelope does).
func (m *Memory) Publish(ctx context.Context, v any) (events.Envelope, error) {
	name, err := events.NameOf(v)
	if err != nil {
		return events.Envelope{}, err
	}
	key := events.KeyOf(v)
	env := events.Envelope{Type: name.CEType(), Source: "urn:toposched:test", Subject: key}
	if cause, ok := bus.CauseFrom(ctx); ok {
		env.ID = events.DeriveID(cause.ID, name, key)
		env.CorrelationID, env.CausationID = cause.CorrelationID, cause.ID
	} else {
		env.ID = bus.NewID()
		env.CorrelationID = env.ID
	}
	m.mu.Lock()
	m.published = append(m.published, v)
	m.mu.Unlock()
	return env, nil
}

// PublishSeq is Publish; the sequence counts what was published.
func (m *Memory) PublishSeq(ctx context.Context, v any) (events.Envelope, uint64, error) {
	env, err := m.Publish(ctx, v)
	if err != nil {
		return env, 0, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return env, uint64(len(m.published)), nil
}

// PublishAsync is PublishSeq, answered at once.
func (m *Memory) PublishAsync(ctx context.Context, v any) (events.Envelope, *bus.Pending, error) {
	env, seq, err := m.PublishSeq(ctx, v)
	if err != nil {
		return env, nil, err
	}
	return env, bus.Settled(seq, nil), nil
}

// Published returns what was published, in order.
func (m *Memory) Published() []any {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]any(nil), m.published...)
}

// Replay reads nothing: Memory holds no streams.
func (m *Memory) Replay(context.Context, events.Domain, []string, func(bus.Record) error) error {
	return nil
}

// Decode is bus.Decode: schema-checked, uncached.
func (m *Memory) Decode(name events.Name, body []byte, v any) error { return bus.Decode(name, body, v) }

// ReplayFrom reads nothing: Memory holds no streams.
func (m *Memory) ReplayFrom(context.Context, events.Domain, []string, uint64, func(bus.Record) error) error {
	return nil
}
