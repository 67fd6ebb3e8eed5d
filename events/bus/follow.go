package bus

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toposched/toposched/events"
)

// Follow calls fn for every event stored on the given subjects of one
// domain's stream from now on, until ctx ends (it then returns nil) or fn
// returns an error (ErrStop ends it quietly). It closes ready, if not nil,
// once its consumer exists, so an event published after ready is never
// missed: start Follow, wait on ready, then do what causes the event.
//
// It is Replay's counterpart for clients that wait for an answer, such as
// topoctl policy push waiting for policy.applied; it keeps no durable state.
func (b *Bus) Follow(ctx context.Context, domain events.Domain, subjects []string, ready chan<- struct{}, fn func(Record) error) error {
	stream := b.StreamName(domain)
	cons, err := b.js.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{
		FilterSubjects: subjects,
		DeliverPolicy:  jetstream.DeliverNewPolicy,
	})
	if err != nil {
		return fmt.Errorf("follow %s: %w", stream, err)
	}
	it, err := cons.Messages()
	if err != nil {
		return fmt.Errorf("follow %s: %w", stream, err)
	}
	defer it.Stop()
	if ready != nil {
		close(ready)
	}
	go func() {
		<-ctx.Done()
		it.Stop()
	}()
	for {
		m, err := it.Next()
		if err != nil {
			if ctx.Err() != nil || iteratorClosed(err) {
				return nil
			}
			return fmt.Errorf("follow %s: %w", stream, err)
		}
		r, ok, err := b.record(m, "follow")
		if err != nil {
			return fmt.Errorf("follow %s: %w", stream, err)
		}
		if !ok {
			continue
		}
		if err := fn(r); err != nil {
			if errors.Is(err, ErrStop) {
				return nil
			}
			return err
		}
	}
}
