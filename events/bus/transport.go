package bus

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/nats-io/nats.go/jetstream"
)

// Metadata keys the subscriber sets from the transport. They start with an
// underscore and never travel back out as headers.
const (
	metaSubject   = "_subject"
	metaStream    = "_stream"
	metaSeq       = "_seq"
	metaTime      = "_time"
	metaDelivered = "_delivered"
)

// pullMaxBytes bounds what one pull of a consumer brings: two of the
// largest messages a stream takes.
const pullMaxBytes = 2 * streamMaxMsgSize

// publisher is Watermill's Publisher on JetStream: metadata become headers,
// the message UUID becomes Nats-Msg-Id. The router uses it for dead letters.
type publisher struct{ b *Bus }

func (p publisher) Publish(topic string, msgs ...*message.Message) error {
	for _, m := range msgs {
		h := make(map[string]string, len(m.Metadata)+1)
		for k, v := range m.Metadata {
			if !strings.HasPrefix(k, "_") {
				h[k] = v
			}
		}
		h["Nats-Msg-Id"] = m.UUID
		// The message's context may be spent (the timeout middleware
		// cancels it on return) and a dead letter must still be sent.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(m.Context()), p.b.cfg.Transport.DeadLetterTimeout)
		err := p.b.PublishRaw(ctx, topic, h, m.Payload)
		cancel()
		if err != nil {
			return err
		}
	}
	return nil
}

func (publisher) Close() error { return nil }

// subscriber feeds one durable pull consumer to the router. Replicas of a
// service share the durable, so each message goes to one of them. A
// durable deleted under it (nats consumer rm, or with its stream) is
// created again, starting after what it had had acknowledged (heal.go).
type subscriber struct {
	b           *Bus
	durable     string
	concurrency int
	nakDelay    time.Duration
	log         *slog.Logger

	closing   chan struct{}
	closeOnce sync.Once
	done      sync.WaitGroup
	// abort, when it ends, ends the contexts of the handlers in flight
	// (Router.AbortOnClose); nil never does.
	abort context.Context

	// The consumer's stream and filter, set by Subscribe. The fields
	// below them belong to the goroutine that watches the consumer.
	stream, topic string
	// floor is the durable's ack floor (the stream sequence up to which
	// every message was acknowledged) when last looked up, and
	// streamCreated the stream's creation time then: a new stream of the
	// same name starts its sequences again.
	floor         uint64
	streamCreated time.Time
	// notFound: the last lookup of the durable, while creating it again,
	// found none.
	notFound bool
	// poke asks for a look at the consumer now: a consume error hints
	// that it may be gone.
	poke chan struct{}
}

func (s *subscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	stream, err := s.b.streamOf(topic)
	if err != nil {
		return nil, err
	}
	s.stream, s.topic, s.poke = stream, topic, make(chan struct{}, 1)
	// Retried: a replica starting while the stream elects a leader (a
	// cluster node just died) must wait for it, not exit.
	cons, err := s.createOrUpdate(ctx)
	if err != nil {
		return nil, fmt.Errorf("consumer %s on %s: %w", s.durable, stream, err)
	}
	out := make(chan *message.Message)
	work := make(chan jetstream.Msg)
	var workers sync.WaitGroup
	for range s.concurrency {
		workers.Add(1)
		go func() {
			defer workers.Done()
			for m := range work {
				s.deliver(ctx, m, out)
			}
		}()
	}
	cc, err := s.consume(cons, work)
	if err != nil {
		close(work)
		return nil, fmt.Errorf("consume %s: %w", s.durable, err)
	}
	s.done.Add(1)
	go func() {
		defer s.done.Done()
		cc = s.watch(ctx, cons, cc, work)
		// Drain hands the messages already pulled to the callback, which
		// nacks them now that closing is set; in-flight ones finish.
		cc.Drain()
		<-cc.Closed()
		close(work)
		workers.Wait()
		close(out)
	}()
	return out, nil
}

// consumerConfig is the durable's configuration. A new durable reads its
// stream from the start: a service added to a running system, or a
// renamed handler, takes in what was published before it.
func (s *subscriber) consumerConfig() jetstream.ConsumerConfig {
	t := s.b.cfg.Transport
	cfg := jetstream.ConsumerConfig{
		Durable:       s.durable,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       t.AckWait,
		MaxAckPending: t.MaxAckPending,
		MaxDeliver:    t.MaxDeliver,
		DeliverPolicy: jetstream.DeliverAllPolicy,
	}
	if filters := s.b.filters([]string{s.topic}); len(filters) == 1 {
		cfg.FilterSubject = s.topic
	} else {
		// An identity-scoped event: its bare subject and its scopes.
		cfg.FilterSubjects = filters
	}
	return cfg
}

// consume pulls the consumer's messages onto work.
func (s *subscriber) consume(cons jetstream.Consumer, work chan<- jetstream.Msg) (jetstream.ConsumeContext, error) {
	t := s.b.cfg.Transport
	return cons.Consume(func(m jetstream.Msg) {
		select {
		case work <- m:
		case <-s.closing:
			_ = m.Nak()
		}
	},
		// Each pull asks for at most pullMaxBytes: a consumer's buffer of
		// messages near max_payload (a flood of hostile 8 MB bodies) held
		// its whole message count of them, 40 for analysis, 320 MB. Two
		// messages of the largest size fit one pull, so none stalls.
		jetstream.PullMaxMessagesWithBytesLimit(t.pullMaxMessages(s.concurrency), pullMaxBytes),
		jetstream.PullExpiry(t.PullExpiry),
		jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
			// Any of them may mean the consumer is gone (its pull
			// requests find no responder): have it looked up.
			select {
			case s.poke <- struct{}{}:
			default:
			}
			if !missedHeartbeat(err) {
				s.log.Warn("consume", "durable", s.durable, "err", err)
				return
			}
			s.log.Info("consume: missed heartbeat, reconnecting", "durable", s.durable)
		}))
}

// deliver hands one message to the router and settles it with JetStream.
func (s *subscriber) deliver(ctx context.Context, m jetstream.Msg, out chan<- *message.Message) {
	wm := toWatermill(m)
	// The router cancels ctx as soon as it starts closing; a handler
	// already given its message must finish with a live context (bounded
	// by the timeout middleware), or a stop in the middle of a decision
	// turns into a failed, dead-lettered one.
	mctx := context.WithoutCancel(ctx)
	if s.abort != nil {
		var cancel context.CancelFunc
		mctx, cancel = context.WithCancel(mctx)
		defer cancel()
		defer context.AfterFunc(s.abort, cancel)()
	}
	wm.SetContext(mctx)
	select {
	case out <- wm:
	case <-s.closing:
		_ = m.Nak()
		return
	}
	select {
	case <-wm.Acked():
		if err := m.Ack(); err != nil {
			s.log.Warn("ack", "durable", s.durable, "err", err)
		}
	case <-wm.Nacked():
		if err := m.NakWithDelay(s.nakDelay); err != nil {
			s.log.Warn("nak", "durable", s.durable, "err", err)
		}
	}
}

func (s *subscriber) Close() error {
	s.closeOnce.Do(func() { close(s.closing) })
	s.done.Wait()
	return nil
}

// toWatermill copies headers into metadata, plus the transport's facts
// under underscore keys.
func toWatermill(m jetstream.Msg) *message.Message {
	wm := message.NewMessage("", m.Data())
	// Sized once: the headers, the five facts below, and the few
	// envelopeOf fills in for a bare publisher.
	wm.Metadata = make(message.Metadata, len(m.Headers())+transportFacts)
	for k, v := range m.Headers() {
		if len(v) == 0 {
			continue
		}
		wm.Metadata.Set(normalizeHeader(k), v[0])
	}
	wm.Metadata.Set(metaSubject, m.Subject())
	if md, err := m.Metadata(); err == nil {
		wm.Metadata.Set(metaStream, md.Stream)
		wm.Metadata.Set(metaSeq, strconv.FormatUint(md.Sequence.Stream, 10))
		wm.Metadata.Set(metaTime, md.Timestamp.UTC().Format(time.RFC3339Nano))
		wm.Metadata.Set(metaDelivered, strconv.FormatUint(md.NumDelivered, 10))
	}
	wm.UUID = wm.Metadata.Get("ce-id")
	return wm
}

// transportFacts is room in a message's metadata beyond its headers: the
// subject, stream, sequence, time and deliveries toWatermill sets, and
// three envelope headers a bare publisher may have left out.
const transportFacts = 8

// normalizeHeader lower-cases CloudEvents headers: their binding is
// case-insensitive, NATS headers are not.
func normalizeHeader(k string) string {
	lk := strings.ToLower(k)
	if strings.HasPrefix(lk, "ce-") || lk == "content-type" {
		return lk
	}
	return k
}
