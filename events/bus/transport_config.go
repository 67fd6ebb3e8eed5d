package bus

import (
	"errors"
	"fmt"
	"time"
)

// Defaults of Transport. They are what the bus always used; a zero field
// of Transport means its default, so Config{} behaves as before.
const (
	// DefaultConnectTimeout bounds the first connection to NATS
	// (Config.ConnectTimeout).
	DefaultConnectTimeout = 10 * time.Second
	// DefaultReconnectWait is the pause between reconnection attempts: short,
	// since a service without its broker does nothing useful.
	DefaultReconnectWait = 250 * time.Millisecond
	// DefaultMaxReconnects is -1: reconnect for ever. A service outliving a
	// NATS outage must come back by itself, not exit.
	DefaultMaxReconnects = -1

	// DefaultSetupRetryFor is how long stream and consumer set-up
	// (RetryJetStream) keeps retrying: long enough for a fresh R3 cluster
	// to elect its leaders while every replica of every service creates
	// the streams at once.
	DefaultSetupRetryFor = time.Minute
	// DefaultSetupAttemptTimeout bounds one set-up request.
	DefaultSetupAttemptTimeout = 10 * time.Second
	// DefaultSetupRetryInitial is the first pause between set-up attempts;
	// it doubles up to DefaultSetupRetryMax.
	DefaultSetupRetryInitial = 100 * time.Millisecond
	// DefaultSetupRetryMax caps the pause between set-up attempts.
	DefaultSetupRetryMax = 2 * time.Second

	// DefaultHandlerTimeout bounds one attempt of a handler.
	DefaultHandlerTimeout = 30 * time.Second
	// DefaultCloseGrace is how long, beyond HandlerTimeout, a closing
	// router waits for in-flight handlers to settle their messages.
	DefaultCloseGrace = 5 * time.Second
	// DefaultHandlerRetries is how many times a handler's Transient error
	// is retried in place, after the first attempt, before the message is
	// nacked for JetStream to redeliver later.
	DefaultHandlerRetries = 5
	// DefaultHandlerRetryInitial is the first pause between those retries.
	DefaultHandlerRetryInitial = 100 * time.Millisecond
	// DefaultHandlerRetryMax caps the pause between those retries.
	DefaultHandlerRetryMax = 5 * time.Second
	// DefaultHandlerRetryMultiplier grows the pause after each retry.
	DefaultHandlerRetryMultiplier = 2.0
	// DefaultNakDelay is how long JetStream holds back a nacked message
	// (retries ran out, or the subscriber closed) before redelivering it,
	// so a broken dependency is not hammered.
	DefaultNakDelay = 2 * time.Second
	// DefaultDeadLetterTimeout bounds the publish of one dead letter; it
	// runs on a context of its own, as the handler's may be spent.
	DefaultDeadLetterTimeout = 10 * time.Second

	// DefaultAckWait is how long JetStream waits for a delivery to be acked
	// before redelivering it; it equals DefaultHandlerTimeout.
	DefaultAckWait = 30 * time.Second
	// DefaultMaxAckPending bounds the unacked deliveries of one durable
	// consumer over all replicas of its service.
	DefaultMaxAckPending = 1024
	// DefaultMaxDeliver is -1: JetStream redelivers without limit. Only
	// Transient errors are nacked (anything else is dead-lettered and
	// acked), so a broker or dependency outage loses nothing.
	DefaultMaxDeliver = -1
	// DefaultPullExpiry is how long one pull request of a consumer waits
	// at the server.
	DefaultPullExpiry = 5 * time.Second
	// DefaultPullPerWorker and DefaultPullBase size a consumer's buffer of
	// pulled messages: PullPerWorker × concurrency + PullBase, so that
	// every worker has the next message at hand.
	DefaultPullPerWorker = 2
	DefaultPullBase      = 8

	// DefaultReplayFetchSize is the largest batch Replay fetches at once.
	DefaultReplayFetchSize = 256

	// DefaultHealCheck is how often a durable consumer is looked up (gone:
	// created again; there: its ack floor remembered) and KeepStreams
	// looks for a missing stream. A deletion the server announces is
	// acted on at once.
	DefaultHealCheck = 10 * time.Second
)

// Transport holds the bus's retry, back-off, acknowledgement and batching
// settings. A zero field takes its Default constant, so the zero Transport
// is the bus's long-standing behaviour; set a field only to change it.
// Counts cannot be set to zero through it (zero means the default).
type Transport struct {
	// ReconnectWait is the pause between reconnection attempts.
	ReconnectWait time.Duration
	// MaxReconnects bounds reconnection attempts; -1 retries for ever.
	MaxReconnects int

	// SetupRetryFor is how long RetryJetStream-style set-up of streams and
	// consumers keeps retrying the failures of a cluster electing leaders.
	SetupRetryFor time.Duration
	// SetupAttemptTimeout bounds one set-up request.
	SetupAttemptTimeout time.Duration
	// SetupRetryInitial is the first pause between set-up attempts; it
	// doubles up to SetupRetryMax.
	SetupRetryInitial time.Duration
	SetupRetryMax     time.Duration

	// HandlerTimeout bounds one attempt of a handler.
	HandlerTimeout time.Duration
	// CloseGrace is added to HandlerTimeout for a closing router's wait.
	CloseGrace time.Duration
	// HandlerRetries is how many times a Transient error is retried in
	// place after the first attempt; then the message is nacked.
	HandlerRetries int
	// HandlerRetryInitial is the first pause between in-place retries; it
	// grows by HandlerRetryMultiplier up to HandlerRetryMax.
	HandlerRetryInitial    time.Duration
	HandlerRetryMax        time.Duration
	HandlerRetryMultiplier float64
	// NakDelay is how long JetStream holds back a nacked message.
	NakDelay time.Duration
	// DeadLetterTimeout bounds the publish of one dead letter.
	DeadLetterTimeout time.Duration

	// AckWait is how long JetStream waits for an ack before redelivering.
	AckWait time.Duration
	// MaxAckPending bounds a durable's unacked deliveries; -1 for no bound.
	MaxAckPending int
	// MaxDeliver bounds the deliveries of one message; -1 for no bound.
	MaxDeliver int
	// PullExpiry is how long one pull request waits at the server.
	PullExpiry time.Duration
	// PullPerWorker × concurrency + PullBase messages are kept pulled.
	PullPerWorker int
	PullBase      int

	// ReplayFetchSize is the largest batch Replay fetches at once.
	ReplayFetchSize int

	// HealCheck is how often a durable consumer is looked up and
	// KeepStreams looks for missing streams (heal.go).
	HealCheck time.Duration
}

// DefaultTransport is the zero Transport with every default filled in.
func DefaultTransport() Transport { return Transport{}.withDefaults() }

// withDefaults fills every zero field with its default.
func (t Transport) withDefaults() Transport {
	setDur := func(v *time.Duration, d time.Duration) {
		if *v == 0 {
			*v = d
		}
	}
	setInt := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	setDur(&t.ReconnectWait, DefaultReconnectWait)
	setInt(&t.MaxReconnects, DefaultMaxReconnects)
	setDur(&t.SetupRetryFor, DefaultSetupRetryFor)
	setDur(&t.SetupAttemptTimeout, DefaultSetupAttemptTimeout)
	setDur(&t.SetupRetryInitial, DefaultSetupRetryInitial)
	setDur(&t.SetupRetryMax, DefaultSetupRetryMax)
	setDur(&t.HandlerTimeout, DefaultHandlerTimeout)
	setDur(&t.CloseGrace, DefaultCloseGrace)
	setInt(&t.HandlerRetries, DefaultHandlerRetries)
	setDur(&t.HandlerRetryInitial, DefaultHandlerRetryInitial)
	setDur(&t.HandlerRetryMax, DefaultHandlerRetryMax)
	if t.HandlerRetryMultiplier == 0 {
		t.HandlerRetryMultiplier = DefaultHandlerRetryMultiplier
	}
	setDur(&t.NakDelay, DefaultNakDelay)
	setDur(&t.DeadLetterTimeout, DefaultDeadLetterTimeout)
	setDur(&t.AckWait, DefaultAckWait)
	setInt(&t.MaxAckPending, DefaultMaxAckPending)
	setInt(&t.MaxDeliver, DefaultMaxDeliver)
	setDur(&t.PullExpiry, DefaultPullExpiry)
	setInt(&t.PullPerWorker, DefaultPullPerWorker)
	setInt(&t.PullBase, DefaultPullBase)
	setInt(&t.ReplayFetchSize, DefaultReplayFetchSize)
	setDur(&t.HealCheck, DefaultHealCheck)
	return t
}

// Validate reports every bad field at once, each by its name, judging the
// settings with their defaults filled in: a zero field is always valid.
func (t Transport) Validate() error {
	t = t.withDefaults()
	var errs []error
	positive := func(name string, d time.Duration) {
		if d < 0 {
			errs = append(errs, fmt.Errorf("transport %s %v: must be positive", name, d))
		}
	}
	positive("ReconnectWait", t.ReconnectWait)
	positive("SetupRetryFor", t.SetupRetryFor)
	positive("SetupAttemptTimeout", t.SetupAttemptTimeout)
	positive("SetupRetryInitial", t.SetupRetryInitial)
	positive("SetupRetryMax", t.SetupRetryMax)
	positive("HandlerTimeout", t.HandlerTimeout)
	positive("CloseGrace", t.CloseGrace)
	positive("HandlerRetryInitial", t.HandlerRetryInitial)
	positive("HandlerRetryMax", t.HandlerRetryMax)
	positive("NakDelay", t.NakDelay)
	positive("DeadLetterTimeout", t.DeadLetterTimeout)
	positive("AckWait", t.AckWait)
	positive("PullExpiry", t.PullExpiry)
	positive("HealCheck", t.HealCheck)
	if t.SetupRetryInitial > t.SetupRetryMax {
		errs = append(errs, fmt.Errorf("transport SetupRetryInitial %v: above SetupRetryMax %v", t.SetupRetryInitial, t.SetupRetryMax))
	}
	if t.HandlerRetryInitial > t.HandlerRetryMax {
		errs = append(errs, fmt.Errorf("transport HandlerRetryInitial %v: above HandlerRetryMax %v", t.HandlerRetryInitial, t.HandlerRetryMax))
	}
	if t.HandlerRetryMultiplier < 1 {
		errs = append(errs, fmt.Errorf("transport HandlerRetryMultiplier %g: must be at least 1", t.HandlerRetryMultiplier))
	}
	atLeast := func(name string, v, lo int) {
		if v < lo {
			errs = append(errs, fmt.Errorf("transport %s %d: must be at least %d", name, v, lo))
		}
	}
	atLeast("HandlerRetries", t.HandlerRetries, 0)
	atLeast("PullPerWorker", t.PullPerWorker, 1)
	atLeast("PullBase", t.PullBase, 0)
	atLeast("ReplayFetchSize", t.ReplayFetchSize, 1)
	unboundedOr := func(name string, v int) {
		if v < -1 {
			errs = append(errs, fmt.Errorf("transport %s %d: must be -1 (no limit) or positive", name, v))
		}
	}
	unboundedOr("MaxReconnects", t.MaxReconnects)
	unboundedOr("MaxAckPending", t.MaxAckPending)
	unboundedOr("MaxDeliver", t.MaxDeliver)
	return errors.Join(errs...)
}

// pullMaxMessages is the buffer of pulled messages for concurrency workers.
func (t Transport) pullMaxMessages(concurrency int) int {
	return t.PullPerWorker*concurrency + t.PullBase
}
