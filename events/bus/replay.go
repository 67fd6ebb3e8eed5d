package bus

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toposched/toposched/events"
)

// ErrStop, returned by a Replay callback, ends the replay early without error.
var ErrStop = errors.New("stop replay")

// Record is one stored event read back by Replay.
type Record struct {
	Env  events.Envelope
	Name events.Name
	Body []byte
	Seq  uint64
}

// Replay reads, in stream order, every message stored on the given subjects
// of one domain's stream up to the moment Replay starts, and calls fn for
// each. Services rebuild their state this way before they start handling:
// the streams, not the process, hold the truth.
func (b *Bus) Replay(ctx context.Context, domain events.Domain, subjects []string, fn func(Record) error) error {
	return b.ReplayFrom(ctx, domain, subjects, 0, fn)
}

// ReplayFrom is Replay starting after stream sequence after: it reads what
// was stored since a state last caught up.
func (b *Bus) ReplayFrom(ctx context.Context, domain events.Domain, subjects []string, after uint64, fn func(Record) error) error {
	stream := b.StreamName(domain)
	cfg := jetstream.OrderedConsumerConfig{FilterSubjects: subjects, DeliverPolicy: jetstream.DeliverAllPolicy}
	if after > 0 {
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, after+1
	}
	// Creating the consumer is a set-up request: while a cluster elects the
	// stream's leader it finds no responder for a while, which a replay at
	// start-up must wait out rather than fail the service on. Nothing has
	// been read yet, so asking again is safe.
	var cons jetstream.Consumer
	var remaining uint64
	err := b.retryJetStream(ctx, func(ctx context.Context) error {
		c, err := b.js.OrderedConsumer(ctx, stream, cfg)
		if err != nil {
			return err
		}
		info, err := c.Info(ctx)
		if err != nil {
			return fmt.Errorf("consumer info: %w", err)
		}
		cons, remaining = c, info.NumPending
		return nil
	})
	if err != nil {
		return fmt.Errorf("replay %s: %w", stream, err)
	}
	// A fetch that finds no responder (the stream's leader moving) is
	// asked again, with the set-up back-off, until the set-up deadline:
	// the ordered consumer resumes after the last message delivered, so
	// nothing is read twice.
	t := b.cfg.Transport
	deadline := time.Now().Add(t.SetupRetryFor)
	wait := t.SetupRetryInitial
	for remaining > 0 {
		batch, err := cons.Fetch(int(min(remaining, uint64(t.ReplayFetchSize))))
		if err != nil {
			return fmt.Errorf("replay %s: fetch: %w", stream, err)
		}
		for m := range batch.Messages() {
			remaining--
			r, ok, err := b.record(m, "replay")
			if err != nil {
				return fmt.Errorf("replay %s: %w", stream, err)
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
		if err := batch.Error(); err != nil {
			if !retryableJS(err) || time.Now().After(deadline) {
				return fmt.Errorf("replay %s: %w", stream, err)
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("replay %s: %w", stream, err)
			case <-time.After(wait):
			}
			wait = min(2*wait, t.SetupRetryMax)
		}
	}
	return nil
}

// record reads a stored message as a Record. A message whose envelope
// cannot be read is skipped (ok false), loudly: one bad message must not
// stop a replay or a follower.
func (b *Bus) record(m jetstream.Msg, what string) (r Record, ok bool, err error) {
	md, err := m.Metadata()
	if err != nil {
		return Record{}, false, err
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
		b.log.Warn(what+": skipping unreadable message", "stream", md.Stream, "seq", md.Sequence.Stream, "err", err)
		return Record{}, false, nil
	}
	return Record{Env: env, Name: name, Body: m.Data(), Seq: md.Sequence.Stream}, true, nil
}
