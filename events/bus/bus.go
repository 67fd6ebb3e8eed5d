package bus

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toposched/toposched/events"
)

// Config says how to reach NATS and how this process signs its events.
type Config struct {
	// URL of the NATS server(s), comma separated.
	URL string
	// Prefix is the first token of every subject.
	Prefix string
	// Source is the CloudEvents source of what this process publishes,
	// such as urn:toposched:placement.
	Source string
	// Replicas of each stream: 1 on a single server, 3 on a cluster.
	Replicas int
	// ConnectTimeout bounds the first connection; zero means
	// DefaultConnectTimeout.
	ConnectTimeout time.Duration
	// SkipStreams leaves stream creation to the services: clients such as
	// topoctl or a launcher need no right to manage streams.
	SkipStreams bool
	// NATSOptions are extra connection options (credentials, TLS).
	NATSOptions []nats.Option
	Logger      *slog.Logger
	// Observer, if set, is told of every delivery handled and every event
	// published (metrics).
	Observer Observer
	// Transport tunes retries, back-offs, acknowledgements and batching;
	// the zero value is the defaults (see Transport).
	Transport Transport
	// Scope is the identity this process publishes identity-scoped events
	// under (events.Scope): a node agent's node, a tenant user's tenant;
	// zero for the services. WithScope overrides it per publish.
	Scope events.Scope
}

func (c *Config) setDefaults() {
	if c.Prefix == "" {
		c.Prefix = events.DefaultPrefix
	}
	if c.Source == "" {
		c.Source = "urn:toposched"
	}
	if c.Replicas == 0 {
		c.Replicas = 1
	}
	if c.ConnectTimeout == 0 {
		c.ConnectTimeout = DefaultConnectTimeout
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	c.Transport = c.Transport.withDefaults()
}

// Validate reports every problem at once.
func (c Config) Validate() error {
	var errs []error
	if c.URL == "" {
		errs = append(errs, errors.New("nats url: required"))
	}
	if strings.ContainsAny(c.Prefix, ".*> \t") {
		errs = append(errs, fmt.Errorf("subject prefix %q: must be one subject token", c.Prefix))
	}
	if c.Replicas < 0 || c.Replicas > 5 {
		errs = append(errs, fmt.Errorf("stream replicas %d: must be 1 to 5", c.Replicas))
	}
	if err := c.Transport.Validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Bus is one connection to NATS with the streams in place.
type Bus struct {
	cfg      Config
	nc       *nats.Conn
	js       jetstream.JetStream
	Subjects events.Subjects
	log      *slog.Logger
	// validated remembers bodies that met their schema (validate.go).
	validated *validationCache
	// denied ends a publish the server refused for permissions at once.
	denied *denials
}

// Connect dials NATS and creates or updates the streams.
func Connect(ctx context.Context, cfg Config) (*Bus, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("bus config: %w", err)
	}
	opts := append([]nats.Option{
		nats.Name(cfg.Source),
		nats.Timeout(cfg.ConnectTimeout),
		nats.MaxReconnects(cfg.Transport.MaxReconnects),
		nats.ReconnectWait(cfg.Transport.ReconnectWait),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				cfg.Logger.Warn("nats disconnected", "err", err)
			}
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			cfg.Logger.Info("nats reconnected", "url", nc.ConnectedUrlRedacted())
		}),
	}, cfg.NATSOptions...)
	denied := &denials{}
	opts = append(opts, nats.ErrorHandler(denied.handler(nil)))
	nc, err := nats.Connect(cfg.URL, opts...)
	if errors.Is(err, nats.ErrAuthorization) {
		return nil, fmt.Errorf("connect to nats %s: %w: the server requires credentials (--nats-nkey, --nats-creds or --nats-user; docs/security.md)", cfg.URL, err)
	}
	if err != nil {
		return nil, fmt.Errorf("connect to nats %s: %w", cfg.URL, err)
	}
	// An asynchronous publish whose acknowledgement never comes (the
	// connection lost with it) must still end: as a synchronous one would.
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncTimeout(cfg.Transport.HandlerTimeout))
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	b := &Bus{
		cfg: cfg, nc: nc, js: js, Subjects: events.NewSubjects(cfg.Prefix), log: cfg.Logger,
		validated: newValidationCache(validateCacheSize), denied: denied,
	}
	if cfg.SkipStreams {
		return b, nil
	}
	if err := b.EnsureStreams(ctx); err != nil {
		nc.Close()
		return nil, err
	}
	return b, nil
}

// Conn is the underlying NATS connection.
func (b *Bus) Conn() *nats.Conn { return b.nc }

// JetStream is the underlying JetStream context.
func (b *Bus) JetStream() jetstream.JetStream { return b.js }

// Replicas is how many copies of each stream the bus asks for; buckets
// created beside the streams (the policy KV) use it too.
func (b *Bus) Replicas() int { return b.cfg.Replicas }

// closePollInterval is how often Close looks whether the drain has ended;
// nats.go offers no channel for it without replacing the user's
// ClosedHandler.
const closePollInterval = 10 * time.Millisecond

// Close drains the connection: pending publishes are flushed first.
func (b *Bus) Close() error {
	if err := b.nc.Drain(); err != nil && !errors.Is(err, nats.ErrConnectionClosed) {
		return fmt.Errorf("drain nats connection: %w", err)
	}
	for !b.nc.IsClosed() {
		time.Sleep(closePollInterval)
	}
	return nil
}

// Stream limits. They are constants, not Transport settings: every process
// creates or updates the same streams at start-up, and two processes with
// different limits would rewrite each other's stream configuration.
const (
	// streamDuplicateWindow is how long JetStream remembers a Nats-Msg-Id
	// to drop a republished copy: a redelivered input republishes its
	// outputs under the same ids within it.
	streamDuplicateWindow = 2 * time.Minute
	// streamMaxMsgSize bounds one message; large gangs produce decisions
	// of a few hundred KB (the embedded server's MaxPayload is the same).
	streamMaxMsgSize = 8 << 20
	// longRetention keeps dead letters and runtime events for a month.
	longRetention = 30 * 24 * time.Hour
	// topologyPerSubject is the history kept per topology subject.
	topologyPerSubject = 1024
	// policyPerSubject bounds the policy audit trail per subject.
	policyPerSubject = 4096
)

// streamDomains are the domains that get a stream. The dead-letter stream
// keeps what no handler could take; the policy stream, which sets were
// applied and refused; the runtime stream, the optimizer's tuning and
// diagnoses and the jobs' telemetry.
var streamDomains = events.Domains

// StreamName is the JetStream stream that holds a domain's subjects. Stream
// names cannot hold dots, so they are not the subjects themselves.
func (b *Bus) StreamName(domain events.Domain) string {
	return strings.ToUpper(strings.NewReplacer("-", "_").Replace(b.cfg.Prefix) + "_" + string(domain))
}

func (b *Bus) streamConfig(domain events.Domain) jetstream.StreamConfig {
	cfg := jetstream.StreamConfig{
		Name:       b.StreamName(domain),
		Subjects:   []string{b.Subjects.Domain(domain)},
		Storage:    jetstream.FileStorage,
		Retention:  jetstream.LimitsPolicy,
		Replicas:   b.cfg.Replicas,
		Duplicates: streamDuplicateWindow,
		MaxMsgSize: streamMaxMsgSize,
	}
	switch domain {
	case events.DomainDLQ:
		cfg.Subjects = []string{b.Subjects.DeadLetter(), b.Subjects.DeadLetter() + ".>"}
		cfg.MaxAge = longRetention
	case events.DomainTopology:
		// A node's newest report is its description; keep a short history
		// for health changes, which replay applies in order.
		cfg.MaxMsgsPerSubject = topologyPerSubject
	case events.DomainPolicy:
		// An audit trail of policy changes, not a log to replay: bounded.
		cfg.MaxMsgsPerSubject = policyPerSubject
	case events.DomainRuntime:
		// Telemetry arrives every few steps from every job: keep a month,
		// which outlives the jobs whose diagnoses a restart reads back.
		cfg.MaxAge = longRetention
	case events.DomainAgent:
		// A registry of the node agents: each node's newest heartbeat.
		cfg.MaxMsgsPerSubject = 1
	}
	return cfg
}

// EnsureStreams creates the streams, or updates them to this configuration.
// Safe to run from every process at start-up.
func (b *Bus) EnsureStreams(ctx context.Context) error {
	for _, d := range streamDomains {
		cfg := b.streamConfig(d)
		err := b.retryJetStream(ctx, func(ctx context.Context) error {
			_, err := b.js.CreateOrUpdateStream(ctx, cfg)
			return err
		})
		if err != nil {
			return fmt.Errorf("create stream %s: %w", cfg.Name, err)
		}
	}
	return nil
}

func (b *Bus) streamOf(subject string) (string, error) {
	rest, ok := strings.CutPrefix(subject, b.cfg.Prefix+".")
	if !ok {
		return "", fmt.Errorf("subject %s: outside prefix %s", subject, b.cfg.Prefix)
	}
	tok, _, _ := strings.Cut(rest, ".")
	domain := events.Domain(tok)
	for _, d := range streamDomains {
		if d == domain {
			return b.StreamName(d), nil
		}
	}
	return "", fmt.Errorf("subject %s: no stream for domain %q", subject, domain)
}

type causeKey struct{}

// WithCause records the event being handled, so that what is published while
// handling it is derived from it (id, correlation, causation).
func WithCause(ctx context.Context, env events.Envelope) context.Context {
	return context.WithValue(ctx, causeKey{}, env)
}

// CauseFrom returns the event being handled, if any.
func CauseFrom(ctx context.Context) (events.Envelope, bool) {
	env, ok := ctx.Value(causeKey{}).(events.Envelope)
	return env, ok
}

type eventIDKey struct{}

// WithEventID gives the event published under ctx the id given, for a
// publisher with no event it handles (whose id the event's would derive
// from) that retries a publish whose acknowledgement did not come: the
// same id is the same Nats-Msg-Id, which JetStream stores once within
// its duplicate window, where a fresh id each try could store the event
// twice.
func WithEventID(ctx context.Context, id string) context.Context {
	return context.WithValue(ctx, eventIDKey{}, id)
}

// NewID returns a random event id.
func NewID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// Envelope builds the envelope of an event about to be published from ctx:
// derived from the event being handled, if any, else fresh.
func (b *Bus) Envelope(ctx context.Context, name events.Name, key string) events.Envelope {
	env := events.Envelope{
		Type:    name.CEType(),
		Source:  b.cfg.Source,
		Subject: key,
		Time:    time.Now().UTC(),
	}
	if id, ok := ctx.Value(eventIDKey{}).(string); ok {
		env.ID, env.CorrelationID = id, id
	} else if cause, ok := CauseFrom(ctx); ok {
		env.ID = events.DeriveID(cause.ID, name, key)
		env.CorrelationID = cause.CorrelationID
		env.CausationID = cause.ID
	} else {
		env.ID = NewID()
		env.CorrelationID = env.ID
	}
	return env
}

// Publish sends one event and waits until JetStream has stored it. The event
// must be a pointer to one of the catalogue's types. Under WithFence it is
// stored only while the fence's marker is the last on its subject, else
// it fails with ErrFenced.
func (b *Bus) Publish(ctx context.Context, v any) (events.Envelope, error) {
	env, _, err := b.PublishSeq(ctx, v)
	return env, err
}

// PublishSeq is Publish, also returning the stream sequence JetStream
// stored the event at (a fence marker's, for WithFence).
func (b *Bus) PublishSeq(ctx context.Context, v any) (events.Envelope, uint64, error) {
	name, env, msg, err := b.message(ctx, v)
	if err != nil {
		return env, 0, err
	}
	seq, dup, err := b.publishMsg(ctx, msg)
	if err != nil {
		return env, 0, err
	}
	b.published(ctx, name, env, dup)
	return env, seq, nil
}

// PublishAsync sends one event as Publish does, without waiting for
// JetStream to store it: Pending.Wait does. Events published on one bus
// are stored in the order they were sent, so a writer can send a batch
// and wait for the acknowledgements once (placement's decision cycle).
// An error here is one Publish would have returned before sending (an
// event that breaks its schema, a message over max_payload, a closed
// connection); a refusal by the stream (a fence, a duplicate's absence of
// one, storage) comes from Wait.
func (b *Bus) PublishAsync(ctx context.Context, v any) (events.Envelope, *Pending, error) {
	name, env, msg, err := b.message(ctx, v)
	if err != nil {
		return env, nil, err
	}
	fut, err := b.js.PublishMsgAsync(msg)
	if err != nil {
		return env, nil, b.publishError(msg, err)
	}
	return env, &Pending{fut: fut, done: func(dup bool) { b.published(ctx, name, env, dup) },
		fail: func(err error) error { return b.publishError(msg, err) }}, nil
}

// message encodes v, checks it against its schema and addresses it, with
// the fence of ctx, if any, in its headers.
func (b *Bus) message(ctx context.Context, v any) (events.Name, events.Envelope, *nats.Msg, error) {
	name, err := events.NameOf(v)
	if err != nil {
		return name, events.Envelope{}, nil, err
	}
	key := events.KeyOf(v)
	env := b.Envelope(ctx, name, key)
	body, err := json.Marshal(v)
	if err != nil {
		return name, env, nil, fmt.Errorf("encode %s: %w", name, err)
	}
	// What we send must meet the contract we ask of others.
	if err := b.validated.validate(name, body); err != nil {
		return name, env, nil, fmt.Errorf("publish %s %s: breaks its schema: %w", name, key, err)
	}
	subject := b.Subjects.Scoped(name, b.scopeOf(ctx, v))
	h := newHeader(events.MaxHeaders + fenceHeaders)
	env.EachHeader(h.set)
	if f, ok := fenceFrom(ctx); ok {
		f.headers(h.set)
	}
	msg := nats.NewMsg(subject)
	msg.Header, msg.Data = h.h, body
	return name, env, msg, nil
}

// header builds a message's NATS headers with room for n of them, the
// values in one array: nats.Header.Set makes a slice for each value,
// and every event sent carries ten.
type header struct {
	h    nats.Header
	vals []string
}

func newHeader(n int) *header {
	return &header{h: make(nats.Header, n), vals: make([]string, 0, n)}
}

// set is nats.Header.Set: one value under the key as given.
func (w *header) set(k, v string) {
	if len(w.vals) == cap(w.vals) {
		w.h.Set(k, v)
		return
	}
	w.vals = append(w.vals, v)
	n := len(w.vals)
	w.h[k] = w.vals[n-1 : n : n]
}

// published tells the observer of an event stored. A duplicate is the
// same event stored once: counting it would make a restart, whose
// redeliveries republish, inflate the metrics.
func (b *Bus) published(ctx context.Context, name events.Name, env events.Envelope, dup bool) {
	if b.cfg.Observer != nil && !dup {
		b.cfg.Observer.Published(ctx, name, env)
	}
}

// PublishRaw sends a body with the given headers and waits for the PubAck.
// Failures are Transient (the broker may be back in a moment), except a
// fenced publish's refusal, which is ErrFenced, and a message too large
// for the server or the stream, a *TooLargeError.
func (b *Bus) PublishRaw(ctx context.Context, subject string, headers map[string]string, body []byte) error {
	_, _, err := b.publishRaw(ctx, subject, headers, body)
	return err
}

// publishRaw publishes and returns the stored sequence, and whether
// JetStream dropped the message as a duplicate of one already stored
// under its Nats-Msg-Id (a republish after a crash or a redelivery).
func (b *Bus) publishRaw(ctx context.Context, subject string, headers map[string]string, body []byte) (uint64, bool, error) {
	return b.publishMsg(ctx, newMsg(subject, headers, body))
}

func newMsg(subject string, headers map[string]string, body []byte) *nats.Msg {
	msg := nats.NewMsg(subject)
	for k, v := range headers {
		msg.Header.Set(k, v)
	}
	msg.Data = body
	return msg
}

func (b *Bus) publishMsg(ctx context.Context, msg *nats.Msg) (uint64, bool, error) {
	ctx, stop := b.denied.watch(ctx, msg.Subject)
	ack, err := b.js.PublishMsg(ctx, msg)
	stop()
	var de *DeniedError
	if errors.As(context.Cause(ctx), &de) {
		return 0, false, de
	}
	if err != nil {
		return 0, false, b.publishError(msg, err)
	}
	return ack.Sequence, ack.Duplicate, nil
}

// publishError says why msg was not stored.
func (b *Bus) publishError(msg *nats.Msg, err error) error {
	subject := msg.Subject
	if fenced(err) {
		return fmt.Errorf("publish %s: %w (%w)", subject, ErrFenced, err)
	}
	if tooLarge(err) {
		return b.tooLargeError(msg, err)
	}
	if storageFull(err) {
		// Transient: the store may be freed. Said plainly, so that
		// topoctl submit does not report a bare API error.
		return Transient(fmt.Errorf("%w: publish %s: %w", ErrStorageFull, subject, err))
	}
	if inProcess(err) {
		// The stream is storing a write this one must follow (the same
		// message sent again, or another fenced on the same marker): it
		// has not said yet whether this one will be.
		return Transient(fmt.Errorf("publish %s: %w: %w", subject, ErrUnconfirmed, err))
	}
	return Transient(fmt.Errorf("publish %s: %w", subject, err))
}

// retryJetStream is RetryJetStream with this bus's Transport timings. A
// server whose JetStream API keeps finding no responder while the cluster
// is up (seen for minutes on a survivor of a node's death on a loaded
// machine, while the other servers answered; nats-server#5738 describes
// the same) is left: after noRespondersReconnect of nothing else, the
// connection moves to another server of its list, once per stretch.
func (b *Bus) retryJetStream(ctx context.Context, op func(context.Context) error) error {
	var since time.Time
	return retryJetStream(ctx, b.cfg.Transport, func(ctx context.Context) error {
		err := op(ctx)
		if !errors.Is(err, nats.ErrNoResponders) {
			since = time.Time{}
			return err
		}
		switch {
		case since.IsZero():
			since = time.Now()
		case time.Since(since) >= noRespondersReconnect && len(b.nc.Servers()) > 1:
			b.log.Warn("JetStream API finds no responder on this server: reconnecting to another",
				"server", b.nc.ConnectedUrlRedacted(), "for", time.Since(since).Round(time.Millisecond))
			if rerr := b.nc.ForceReconnect(); rerr != nil {
				b.log.Warn("reconnect", "err", rerr)
			}
			since = time.Time{}
		}
		return err
	})
}

// noRespondersReconnect is how long a server's JetStream API may find no
// responder, request after request, before the bus tries another server.
const noRespondersReconnect = 5 * time.Second

// Dial opens a second connection to the same servers with the same
// credentials, for traffic that must not queue behind this one's: a lease
// renewal waiting behind megabytes of a burst's publishes on one socket
// misses its deadline. It creates no streams; close it after use.
func (b *Bus) Dial(ctx context.Context, source string) (*Bus, error) {
	cfg := b.cfg
	cfg.Source, cfg.SkipStreams, cfg.Observer = source, true, nil
	return Connect(ctx, cfg)
}

// JetStream's answers to a message it has no room for (nats-server's
// errors.json): JSInsufficientResourcesErr, 503 "insufficient resources"
// (the server's max_file_store or max_memory_store reached),
// JSStorageResourcesExceededErr, "insufficient storage resources
// available", and JSAccountResourcesExceededErr, "resource limits
// exceeded for account" (an account's limit, which the embedded server
// lowers when its disk has less room than its own limit). nats.go names
// none of them.
const (
	errCodeInsufficientResources jetstream.ErrorCode = 10023
	errCodeStorageExceeded       jetstream.ErrorCode = 10047
	errCodeAccountExceeded       jetstream.ErrorCode = 10002
	// errCodeDuplicateInProcess: a message of the same id is being stored
	// (a clustered stream's proposal in flight) and may yet be.
	errCodeDuplicateInProcess jetstream.ErrorCode = 10158
)

// ErrStorageFull is a publish refused because the stream's store, the
// server's or the account's, has no room for it: transient, for room may
// be freed.
var ErrStorageFull = errors.New("JetStream storage full")

// storageFull reports whether a publish was refused for lack of storage.
func storageFull(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) &&
		(apiErr.ErrorCode == errCodeInsufficientResources || apiErr.ErrorCode == errCodeStorageExceeded ||
			apiErr.ErrorCode == errCodeAccountExceeded)
}

type scopeKey struct{}

// WithScope makes the identity-scoped events published with the returned
// context travel under scope (events.Scope): topoctl finishing a job under
// the job's tenant, say. A node-scoped event's own node and a
// jobs.submitted's own tenant always win: they are what NATS permissions
// check the sender against.
func WithScope(ctx context.Context, scope events.Scope) context.Context {
	return context.WithValue(ctx, scopeKey{}, scope)
}

// scopeOf is the scope v is published under.
func (b *Bus) scopeOf(ctx context.Context, v any) events.Scope {
	if s, ok := events.ScopeOf(v); ok {
		return s
	}
	if s, ok := ctx.Value(scopeKey{}).(events.Scope); ok {
		return s
	}
	return b.cfg.Scope
}

// filters are the filter subjects that read what subjects name: the bare
// subject of an identity-scoped event (events.Subjects.Of) stands for that
// event under every scope too, so that no reader of jobs.finished misses
// the finishes of tenants and agents.
func (b *Bus) filters(subjects []string) []string {
	var extra []string
	for _, s := range subjects {
		n, ok := b.Subjects.NameOfSubject(s)
		if ok && n.IdentityScoped() && s == b.Subjects.Of(n) && !slices.Contains(subjects, s+".>") {
			extra = append(extra, s+".>")
		}
	}
	if extra == nil {
		return subjects
	}
	return append(slices.Clone(subjects), extra...)
}
