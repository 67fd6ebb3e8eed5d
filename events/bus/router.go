package bus

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"

	"github.com/toposched/toposched/events"
)

// Router runs a service's handlers. Every service builds it with NewRouter,
// so every handler gets the same middleware stack.
type Router struct {
	b   *Bus
	r   *message.Router
	log *slog.Logger
	// abortCtx ends the contexts of handlers in flight when the router is
	// aborted (AbortOnClose, then Close); aborted is set first.
	abortCtx     context.Context
	abort        context.CancelFunc
	abortOnClose atomic.Bool
	aborted      atomic.Bool
	stacks       *warmStacks
}

// NewRouter builds a router with the one middleware stack, outermost first
// (each message's handling runs on a goroutine kept between messages, see
// warmStacks):
//
//  1. dead letters: a permanent error (anything not marked Transient, a
//     panic included) publishes the message to <prefix>.dlq with the error
//     in the toposched-error header, and the message is acked;
//  2. retry: Transient errors are retried with exponential backoff; when
//     retries run out the message is nacked and JetStream redelivers it
//     later, so a broker outage loses nothing and fills no dead letters;
//  3. timeout of one attempt;
//  4. recoverer: a panic becomes a permanent error carrying its stack.
//
// Correlation travels in the envelope: a handler's context carries the event
// it handles (WithCause), and Publish derives ids and correlation from it.
func (b *Bus) NewRouter() (*Router, error) {
	rlog := b.log.With("component", "router")
	wlog := fencedAsWarning{watermill.NewSlogLoggerWithLevelMapping(rlog,
		map[slog.Level]slog.Level{slog.LevelInfo: slog.LevelDebug}), rlog}
	t := b.cfg.Transport
	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: t.HandlerTimeout + t.CloseGrace}, wlog)
	if err != nil {
		return nil, fmt.Errorf("router: %w", err)
	}
	abortCtx, abort := context.WithCancel(context.Background())
	rt := &Router{b: b, r: r, log: b.log, abortCtx: abortCtx, abort: abort, stacks: newWarmStacks()}
	// An aborted handler's error is not the message's fault: it is nacked
	// and redelivered, never dead-lettered.
	dead, err := middleware.PoisonQueueWithFilter(deadLetters{publisher{b}}, b.Subjects.DeadLetter(),
		func(err error) bool { return !IsTransient(err) && !rt.aborted.Load() && !errors.Is(err, ErrFenced) })
	if err != nil {
		abort()
		return nil, fmt.Errorf("dead-letter middleware: %w", err)
	}
	retry := middleware.Retry{
		MaxRetries:      t.HandlerRetries,
		InitialInterval: t.HandlerRetryInitial,
		MaxInterval:     t.HandlerRetryMax,
		Multiplier:      t.HandlerRetryMultiplier,
		ShouldRetry:     func(p middleware.RetryParams) bool { return IsTransient(p.Err) && !rt.aborted.Load() },
		// Each attempt gets the message's own context back: the timeout
		// middleware inside cancels the one it made when an attempt ends,
		// and without this every retry would fail at once with "context
		// canceled" (and, not being Transient, be dead-lettered).
		ResetContextOnRetry: true,
		Logger:              retriesAsWarning{wlog},
	}
	r.AddMiddleware(rt.stacks.middleware, dead)
	if b.cfg.Observer != nil {
		r.AddMiddleware(b.observe)
	}
	r.AddMiddleware(retry.Middleware, middleware.Timeout(t.HandlerTimeout), middleware.Recoverer)
	return rt, nil
}

// fencedAsWarning logs a handler's ErrFenced, ErrUnconfirmed and ErrLater
// as a warning, not the error Watermill calls every handler error: a
// replica whose term a newer one ended is failover working as designed
// (the message is nacked for the new holder), as is an outcome a broker's
// failover left unconfirmed (sent again), and an operator's alert on
// level=ERROR must not fire on them.
type fencedAsWarning struct {
	watermill.LoggerAdapter
	log *slog.Logger
}

func (l fencedAsWarning) Error(msg string, err error, fields watermill.LogFields) {
	var why string
	switch {
	case errors.Is(err, ErrFenced):
		why = " (fenced: the message is left for the current term)"
	case errors.Is(err, ErrUnconfirmed), errors.Is(err, ErrLater):
		why = " (the message comes back for another try)"
	default:
		l.LoggerAdapter.Error(msg, err, fields)
		return
	}
	l.warn(msg+why, err, fields)
}

// Trace and Debug come several times a message (received, handled,
// acked): their fields become slog arguments only when the level is on.
// (Info is mapped to Debug above.)
func (l fencedAsWarning) Trace(msg string, fields watermill.LogFields) {
	if l.log.Enabled(context.Background(), watermill.LevelTrace) {
		l.LoggerAdapter.Trace(msg, fields)
	}
}

func (l fencedAsWarning) Debug(msg string, fields watermill.LogFields) {
	if l.log.Enabled(context.Background(), slog.LevelDebug) {
		l.LoggerAdapter.Debug(msg, fields)
	}
}

func (l fencedAsWarning) Info(msg string, fields watermill.LogFields) {
	if l.log.Enabled(context.Background(), slog.LevelDebug) {
		l.LoggerAdapter.Info(msg, fields)
	}
}

func (l fencedAsWarning) warn(msg string, err error, fields watermill.LogFields) {
	args := make([]any, 0, 2*len(fields)+2)
	for k, v := range fields {
		args = append(args, k, v)
	}
	l.log.Warn(msg, append(args, "error", err)...)
}

// retriesAsWarning is the retry middleware's logger. The middleware logs
// only before another attempt, of an error ShouldRetry called transient
// (a stream whose leader is being elected after a server's loss answers
// a catch-up late): a warning. An error the retries do not cure reaches
// the router, which logs it as the error it is, so an alert on
// level=ERROR fires on what failed, not on what was retried. (The
// cluster e2e failed on such a line: a catch-up with the topology stream
// timed out once after nats-1 was killed, and the retry succeeded.)
type retriesAsWarning struct{ fencedAsWarning }

func (l retriesAsWarning) Error(msg string, err error, fields watermill.LogFields) {
	l.warn(msg, err, fields)
}

func (l retriesAsWarning) With(fields watermill.LogFields) watermill.LoggerAdapter {
	return retriesAsWarning{l.fencedAsWarning.With(fields).(fencedAsWarning)}
}

// ErrLater is wrapped by a handler's error that leaves its message for a
// later delivery on purpose, as an outcome the stream has not confirmed
// (ErrUnconfirmed) does: it could not be handled in its time (a burst, a
// broker outage). Logged as a warning, not an error.
var ErrLater = errors.New("left for a later delivery")

func (l fencedAsWarning) With(fields watermill.LogFields) watermill.LoggerAdapter {
	args := make([]any, 0, 2*len(fields))
	for k, v := range fields {
		args = append(args, k, v)
	}
	return fencedAsWarning{l.LoggerAdapter.With(fields), l.log.With(args...)}
}

// deadLetters puts the error where people look for it, toposched-error,
// and keeps the original subject beside it. A dead letter always fits in
// one message (fitDeadLetter): one that did not would be refused, and its
// message redelivered every few seconds for ever.
type deadLetters struct{ p publisher }

func (d deadLetters) Publish(topic string, msgs ...*message.Message) error {
	for _, m := range msgs {
		m.Metadata.Set(events.HeaderError, m.Metadata.Get(middleware.ReasonForPoisonedKey))
		m.Metadata.Set(events.HeaderDeadSubject, m.Metadata.Get(metaSubject))
		if m.UUID == "" {
			m.UUID = NewID()
		}
		d.p.b.fitDeadLetter(m)
	}
	return d.p.Publish(topic, msgs...)
}

func (d deadLetters) Close() error { return nil }

// Run starts the handlers and blocks until ctx is done or Close is called.
func (r *Router) Run(ctx context.Context) error {
	if err := r.r.Run(ctx); err != nil {
		return fmt.Errorf("router: %w", err)
	}
	return nil
}

// Running is closed once every handler has subscribed.
func (r *Router) Running() chan struct{} { return r.r.Running() }

// Close stops taking messages, lets in-flight handlers finish and settle
// their messages, and returns. Messages not yet handled stay in the stream.
// After AbortOnClose, in-flight handlers are cancelled instead.
func (r *Router) Close() error {
	if r.abortOnClose.Load() {
		r.aborted.Store(true)
	}
	if r.aborted.Load() {
		r.abort()
	}
	defer r.abort()
	defer r.stacks.stop()
	return r.r.Close()
}

// AbortOnClose makes Close cancel the handlers in flight rather than wait
// for them: their contexts end, retries stop, and their messages are
// nacked for redelivery (never dead-lettered). For a service whose work
// must stop the moment it is told, such as a placement replica whose lease
// term ends: another replica decides what it held.
func (r *Router) AbortOnClose() { r.abortOnClose.Store(true) }

// Handler is a typed event handler. Its Name is the JetStream durable
// consumer name: renaming it makes the stream be consumed again from the
// start, so names are constants of the service that owns them.
type Handler[T any] struct {
	Name  string
	Event events.Name
	// Concurrency is how many messages are handled at once (default 1).
	Concurrency int
	// Fn handles a decoded, schema-valid event. Its context carries the
	// envelope (CauseFrom).
	Fn func(ctx context.Context, env events.Envelope, ev *T) error
	// Invalid, if set, is called before a malformed message goes to the
	// dead-letter subject, with the schema or decoding error, or an
	// *events.EnvelopeError for a ce-type that is not this event's; it may
	// answer the sender (env.Subject is the job id the body names).
	Invalid func(ctx context.Context, env events.Envelope, body []byte, err error) error
}

// Handle registers h on the router.
func Handle[T any](r *Router, h Handler[T]) {
	if name, err := events.NameOf(new(T)); err != nil || name != h.Event {
		panic(fmt.Sprintf("bus: handler %s: type %T does not carry %s", h.Name, new(T), h.Event))
	}
	if h.Concurrency < 1 {
		h.Concurrency = 1
	}
	sub := &subscriber{
		b: r.b, durable: h.Name, concurrency: h.Concurrency, nakDelay: r.b.cfg.Transport.NakDelay,
		log: r.log, closing: make(chan struct{}), abort: r.abortCtx,
	}
	topic := r.b.Subjects.Of(h.Event)
	r.r.AddConsumerHandler(h.Name, topic, sub, func(m *message.Message) error {
		env, body, err := r.b.envelopeOf(m)
		if err != nil {
			return invalidEnvelope(m, env, err, h.Invalid)
		}
		ctx := WithCause(m.Context(), env)
		if seq, err := strconv.ParseUint(m.Metadata.Get(metaSeq), 10, 64); err == nil {
			ctx = context.WithValue(ctx, seqKey{}, seq)
		}
		var ev T
		err = r.b.Decode(h.Event, body, &ev)
		if err == nil {
			// The body must agree with the subject NATS let its sender
			// publish on: a node speaks for itself, a tenant submits its
			// own jobs.
			err = events.CheckScope(env.Scope, &ev)
		}
		if err != nil {
			if h.Invalid != nil {
				if ierr := h.Invalid(ctx, env, body, err); ierr != nil {
					return ierr
				}
			}
			return err
		}
		return h.Fn(ctx, env, &ev)
	})
}

// DomainHandler handles every event of one domain on one durable
// consumer, in stream order: for a consumer whose state depends on the
// order between event types (a decision, then the release of its GPUs,
// then a decision that reuses them), which separate consumers per type
// cannot promise.
type DomainHandler struct {
	Name   string
	Domain events.Domain
	// Fn gets each event's envelope, name and body; it decodes with the
	// bus's Decode, which answers from its validation cache.
	Fn func(ctx context.Context, env events.Envelope, name events.Name, body []byte) error
}

// HandleDomain registers h on the router. It takes one message at a time,
// so handling follows the stream's order.
func HandleDomain(r *Router, h DomainHandler) {
	sub := &subscriber{
		b: r.b, durable: h.Name, concurrency: 1, nakDelay: r.b.cfg.Transport.NakDelay,
		log: r.log, closing: make(chan struct{}), abort: r.abortCtx,
	}
	r.r.AddConsumerHandler(h.Name, r.b.Subjects.Domain(h.Domain), sub, func(m *message.Message) error {
		env, body, err := r.b.envelopeOf(m)
		if err != nil {
			return fmt.Errorf("envelope: %w", err)
		}
		name, _ := events.NameOfCEType(env.Type)
		if err := events.CheckScopeOfBody(name, env.Scope, body); err != nil {
			return err
		}
		ctx := WithCause(m.Context(), env)
		if seq, err := strconv.ParseUint(m.Metadata.Get(metaSeq), 10, 64); err == nil {
			// As for typed handlers: a consumer that also replays its
			// domain skips what its replay already applied.
			ctx = context.WithValue(ctx, seqKey{}, seq)
		}
		return h.Fn(ctx, env, name, body)
	})
}

// envelopeOf reads the CloudEvents envelope from a message's metadata,
// fills in what a bare publisher left out, and writes it back so that a dead
// letter carries the full envelope.
func (b *Bus) envelopeOf(m *message.Message) (events.Envelope, []byte, error) {
	seq, _ := strconv.ParseUint(m.Metadata.Get(metaSeq), 10, 64)
	t, _ := time.Parse(time.RFC3339Nano, m.Metadata.Get(metaTime))
	d := events.Delivery{Subject: m.Metadata.Get(metaSubject), Stream: m.Metadata.Get(metaStream), Seq: seq, Time: t}
	env, _, err := events.ParseEnvelope(b.Subjects, m.Metadata, m.Payload, d)
	if err != nil {
		return env, nil, err
	}
	env.EachHeader(m.Metadata.Set)
	m.UUID = env.ID
	return env, m.Payload, nil
}

// Decode validates body against the event's JSON Schema and decodes it into
// v, a pointer to the event's Go type. A schema failure is a
// *schemas.ValidationError naming every field and rule (inside an
// *events.StructuredModeError for a CloudEvents structured-mode body); a
// value the schema takes but the Go type cannot hold (an integer past 64
// bits) is an *events.DecodeError. Integers may be written 8.0 or 7e9
// (events.DecodeJSON).
//
// It validates every time; (*Bus).Decode gives the same answers and skips
// the schema for bytes the bus has already seen pass, such as what a
// service of the same process published.
func Decode(name events.Name, body []byte, v any) error {
	return decode(nil, name, body, v)
}

// Decode is the package's Decode with this bus's validation cache: prefer
// it for events that may have been published or handled on this bus.
func (b *Bus) Decode(name events.Name, body []byte, v any) error {
	return decode(b.validated, name, body, v)
}

func decode(c *validationCache, name events.Name, body []byte, v any) error {
	if err := c.validate(name, body); err != nil {
		return events.ExplainStructured(body, err)
	}
	// The one decoder: 8.0 is an integer, as the schema says.
	if err := events.DecodeJSON(body, v); err != nil {
		return fmt.Errorf("%w %s: %w", ErrDecode, name, err)
	}
	return nil
}

// ErrDecode is a body that passed its schema but did not decode into its
// Go type; its text starts the message ("decode <event>: ...").
var ErrDecode = errors.New("decode")

type seqKey struct{}

// StreamSeq is the stream sequence of the message being handled, 0 outside
// a handler. A service that also replays a stream uses it to know how far
// its state has read.
func StreamSeq(ctx context.Context) uint64 {
	seq, _ := ctx.Value(seqKey{}).(uint64)
	return seq
}

// WithStreamSeq is ctx as a handler of the message at seq gets it, for a
// test that calls a handler directly.
func WithStreamSeq(ctx context.Context, seq uint64) context.Context {
	return context.WithValue(ctx, seqKey{}, seq)
}
