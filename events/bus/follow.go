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
func (b *Bus) Follow(ctx context.Context, domain string, subjects []string, ready chan<- struct{}, fn func(Record) error) error {
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
			if ctx.Err() != nil || errors.Is(err, jetstream.ErrMsgIteratorClosed) {
				return nil
			}
			return fmt.Errorf("follow %s: %w", stream, err)
		}
		md, err := m.Metadata()
		if err != nil {
			return fmt.Errorf("follow %s: %w", stream, err)
		}
		h := make(map[string]string, len(m.Headers()))
		for k, v := range m.Headers() {
			if len(v) > 0 {
				h[normalizeHeader(k)] = v[0]
			}
		}
		d := events.Delivery{Subject: m.Subject(), Stream: md.Stream, Seq: md.Sequence.Stream, Time: md.Timestamp}
		env, name, err := events.ParseEnvelope(b.Subjects, h, m.Data(), d)
		if err != nil {
			b.log.Warn("follow: skipping unreadable message", "stream", stream, "seq", md.Sequence.Stream, "err", err)
			continue
		}
		if err := fn(Record{Env: env, Name: name, Body: m.Data(), Seq: md.Sequence.Stream}); err != nil {
			if errors.Is(err, ErrStop) {
				return nil
			}
			return err
		}
	}
}
