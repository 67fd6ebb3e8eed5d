package bus

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"

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
	// Fence is the fence the message was published under (WithFence),
	// zero when it carried none.
	Fence Fence
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
//
// It reads through one ephemeral consumer of its own (no acks, in memory,
// one replica: what nats.go's ordered consumer creates), deleted when the
// replay ends. Not the ordered consumer itself: that re-creates its
// server-side consumer on every fetch, so each replay cost two consumers,
// the first deleted in the background after the replay had returned, and,
// left to its default, retried a failed re-creation without end and
// without a word: while a cluster recovers from a node's death a rebuild
// hung there for minutes with the lease held (the cluster e2e's stall
// after "lease taken").
//
// It never waits for ever: a fetch that fails, or brings nothing while
// messages remain, is asked again from the last message read, with a
// fresh consumer and the set-up back-off, logged, until the set-up
// deadline; then the replay fails with the reason, and the service's own
// retry (a placement replica's campaign, say) takes over.
func (b *Bus) ReplayFrom(ctx context.Context, domain events.Domain, subjects []string, after uint64, fn func(Record) error) error {
	stream := b.StreamName(domain)
	t := b.cfg.Transport
	// open makes an ordered consumer from the message after last and says
	// how many messages it has to deliver now. Creating it is a set-up
	// request: while a cluster elects the stream's leader it finds no
	// responder for a while, which a replay at start-up must wait out
	// rather than fail the service on.
	open := func(last uint64) (jetstream.Consumer, uint64, error) {
		// Named, so that it is created on the API subject that names it
		// ($JS.API.CONSUMER.CREATE.<stream>.<name>[.<filter>]), the one the
		// roles of deploy/nats allow.
		cfg := jetstream.ConsumerConfig{Name: "replay_" + nuid.Next(), DeliverPolicy: jetstream.DeliverAllPolicy,
			AckPolicy: jetstream.AckNonePolicy, InactiveThreshold: replayInactive, Replicas: 1, MemoryStorage: true}
		if subjects := b.filters(subjects); len(subjects) == 1 {
			cfg.FilterSubject = subjects[0]
		} else {
			cfg.FilterSubjects = subjects
		}
		if last > 0 {
			cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, last+1
		}
		var cons jetstream.Consumer
		var pending uint64
		err := b.retryJetStream(ctx, func(ctx context.Context) error {
			c, err := b.js.CreateConsumer(ctx, stream, cfg)
			if err != nil {
				return err
			}
			// The pending count of the consumer as created, without
			// another request for its info.
			cons, pending = c, c.CachedInfo().NumPending
			return nil
		})
		return cons, pending, err
	}
	if after > 0 {
		// A catch-up (placement's, before it calls a job impossible)
		// usually finds nothing new: the stream's last sequence says so
		// without a consumer.
		if info, err := b.js.Stream(ctx, stream); err == nil && info.CachedInfo().State.LastSeq <= after {
			return nil
		}
	}
	cons, remaining, err := open(after)
	if err != nil {
		return fmt.Errorf("replay %s: %w", stream, err)
	}
	// Each replay's consumer is deleted when it is done: the server keeps
	// an idle one for its inactive threshold and allows 1,000 a stream,
	// which a replica catching up before every rejection reached in five
	// minutes (nats.go's default threshold).
	defer func() { b.deleteConsumer(stream, cons) }()
	last := after
	deadline := time.Now().Add(t.SetupRetryFor)
	wait := t.SetupRetryInitial
	for remaining > 0 {
		got := 0
		batch, err := cons.Fetch(int(min(remaining, uint64(t.ReplayFetchSize))), jetstream.FetchMaxWait(replayFetchWait))
		if err == nil {
			for m := range batch.Messages() {
				got++
				remaining--
				r, ok, err := b.record(m, "replay")
				if err != nil {
					return fmt.Errorf("replay %s: %w", stream, err)
				}
				if md, err := m.Metadata(); err == nil {
					last = md.Sequence.Stream
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
			err = batch.Error()
			if err == nil && got == 0 {
				err = errReplayStalled
			}
		}
		if err == nil {
			continue
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("replay %s after sequence %d, %d messages left: %w", stream, last, remaining, err)
		}
		b.log.Warn("replay: fetch failed; asking again from the last message read", "stream", stream, "after_seq", last, "remaining", remaining, "err", err)
		select {
		case <-ctx.Done():
			return fmt.Errorf("replay %s: %w", stream, ctx.Err())
		case <-time.After(wait):
		}
		wait = min(2*wait, t.SetupRetryMax)
		var pending uint64
		b.deleteConsumer(stream, cons)
		if cons, pending, err = open(last); err != nil {
			return fmt.Errorf("replay %s: %w", stream, err)
		}
		// Messages removed meanwhile (a stream's limits) are not waited
		// for; messages stored since the replay began are not read.
		remaining = min(remaining, pending)
	}
	return nil
}

// Bounds of Replay's consumer: how long a fetch waits for messages that
// are already stored.
const (
	replayFetchWait = 5 * time.Second
	// replayInactive is how long the server keeps a replay's consumer
	// that nothing reads (one left behind by a replica that died
	// mid-replay).
	replayInactive = 30 * time.Second
)

// deleteConsumer deletes a replay's consumer, best effort: one left is
// removed by the server after replayInactive.
func (b *Bus) deleteConsumer(stream string, cons jetstream.Consumer) {
	if cons == nil {
		return
	}
	info := cons.CachedInfo()
	if info == nil || info.Name == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), b.cfg.Transport.SetupAttemptTimeout)
	defer cancel()
	if err := b.js.DeleteConsumer(ctx, stream, info.Name); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
		b.log.Debug("replay: delete consumer", "stream", stream, "consumer", info.Name, "err", err)
	}
}

// errReplayStalled is a fetch that brought nothing while messages remain.
var errReplayStalled = errors.New("the fetch brought no message though some remain")

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
	if err := events.CheckScopeOfBody(name, env.Scope, m.Data()); err != nil {
		b.log.Warn(what+": skipping a message whose body is not its subject's", "stream", md.Stream, "seq", md.Sequence.Stream, "err", err)
		return Record{}, false, nil
	}
	return Record{Env: env, Name: name, Body: m.Data(), Seq: md.Sequence.Stream, Fence: fenceOf(h)}, true, nil
}
