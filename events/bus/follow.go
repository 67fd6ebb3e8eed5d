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
	cfg := jetstream.OrderedConsumerConfig{FilterSubjects: b.filters(subjects)}
	if err := b.FromNow(ctx, stream, &cfg); err != nil {
		return fmt.Errorf("follow %s: %w", stream, err)
	}
	return b.follow(ctx, stream, cfg, ready, fn)
}

// FollowFrom is Follow from the message after stream sequence after (0:
// the stream's first), for a state that ReplayFrom has rebuilt up to
// after: no event stored in between is missed or seen twice. It keeps no
// durable state either, so a controller that reads a stream this way
// rebuilds from it when it starts, as an informer lists and then watches.
func (b *Bus) FollowFrom(ctx context.Context, domain events.Domain, subjects []string, after uint64, ready chan<- struct{}, fn func(Record) error) error {
	stream := b.StreamName(domain)
	cfg := jetstream.OrderedConsumerConfig{FilterSubjects: b.filters(subjects), DeliverPolicy: jetstream.DeliverAllPolicy}
	if after > 0 {
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, after+1
	}
	return b.follow(ctx, stream, cfg, ready, fn)
}

// follow runs an ordered consumer of cfg on the stream: see Follow.
func (b *Bus) follow(ctx context.Context, stream string, cfg jetstream.OrderedConsumerConfig, ready chan<- struct{}, fn func(Record) error) error {
	cons, err := b.js.OrderedConsumer(ctx, stream, cfg)
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

// FromNow starts an ordered consumer after the stream's last message. It
// names that sequence rather than asking for DeliverNew: an ordered
// consumer that resets before its first message (a missed heartbeat on a
// loaded machine, its consumer deleted) applies its deliver policy again,
// and with DeliverNew the messages stored in between, the answer its
// caller waits for, would be lost.
func (b *Bus) FromNow(ctx context.Context, stream string, cfg *jetstream.OrderedConsumerConfig) error {
	st, err := b.js.Stream(ctx, stream)
	if err != nil {
		return err
	}
	cfg.DeliverPolicy = jetstream.DeliverByStartSequencePolicy
	cfg.OptStartSeq = st.CachedInfo().State.LastSeq + 1
	return nil
}
