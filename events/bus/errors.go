package bus

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// transientError marks a failure worth retrying: the broker was unreachable,
// a publish timed out. Every other handler error is permanent and sends the
// message to the dead-letter subject.
type transientError struct{ err error }

func (e transientError) Error() string { return e.err.Error() }
func (e transientError) Unwrap() error { return e.err }

// Transient marks err as worth retrying; nil stays nil.
func Transient(err error) error {
	if err == nil {
		return nil
	}
	return transientError{err}
}

// IsTransient reports whether err, or an error it wraps, was marked Transient.
func IsTransient(err error) bool {
	var t transientError
	return errors.As(err, &t)
}

// The JetStream API's answers that the bus tells apart, where nats.go has no
// typed error or ErrorCode constant for them. Every other JetStream error is
// matched with errors.Is against nats.go's sentinels (jetstream.ErrNoHeartbeat,
// jetstream.ErrMsgIteratorClosed, jetstream.ErrStreamNotFound, ...) or by
// jetstream.APIError.ErrorCode against its JSErrCode constants.
const (
	// apiStatusUnavailable is APIError.Code 503, the HTTP-like status of
	// the server's "not now" answers (nats-server's errors.json): JetStream
	// system temporarily unavailable (err_code 10008, while a cluster has
	// no meta leader), JetStream not enabled (10076) or not enabled for the
	// account (10039), insufficient resources (10023), and the like.
	apiStatusUnavailable = 503
	// apiStatusTimeout is APIError.Code 408: the server timed the request
	// out.
	apiStatusTimeout = 408
	// errCodeReplicasNotSupported is nats-server's
	// JSStreamReplicasNotSupportedErr, err_code 10074 ("replicas > 1 not
	// supported in non-clustered mode"), which nats.go does not name: the
	// server's answer to a replicated request while it does not count
	// itself clustered. It is retried as a start-up answer, as it was
	// before it had a name; the comment of that time called 10074 "the
	// stream is still being created", which errors.json does not bear out.
	errCodeReplicasNotSupported jetstream.ErrorCode = 10074
)

// retryableJS reports whether a JetStream set-up request may succeed if
// asked again: it timed out, found no responder, hit a reconnection, or the
// server said "not now". Descriptions are never matched: every server
// answer whose text says "temporarily unavailable" carries status 503.
func retryableJS(err error) bool {
	switch {
	case errors.Is(err, context.DeadlineExceeded),
		errors.Is(err, nats.ErrTimeout),
		errors.Is(err, nats.ErrNoResponders),
		errors.Is(err, jetstream.ErrNoStreamResponse),
		errors.Is(err, nats.ErrConnectionReconnecting):
		return true
	}
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		switch {
		case apiErr.Code == apiStatusUnavailable, apiErr.Code == apiStatusTimeout,
			apiErr.ErrorCode == errCodeReplicasNotSupported:
			return true
		}
	}
	return false
}

// missedHeartbeat reports whether a consumer error is only a missed idle
// heartbeat, after which the consumer re-pulls by itself: worth a line at
// info, not a warning.
func missedHeartbeat(err error) bool { return errors.Is(err, jetstream.ErrNoHeartbeat) }

// iteratorClosed reports whether a message iterator ended because it was
// stopped, which is how a follower ends, not a failure.
func iteratorClosed(err error) bool { return errors.Is(err, jetstream.ErrMsgIteratorClosed) }

// RetryJetStream runs op until it succeeds, ctx ends, or a minute has
// passed, retrying the failures a JetStream cluster gives while it elects
// leaders or is busy creating other streams (retryableJS). Every replica of
// every service creates the streams at start-up: on a fresh R3 cluster they
// all do it at once. It uses the default Transport's timings; a Bus uses
// its own.
func RetryJetStream(ctx context.Context, op func(context.Context) error) error {
	return retryJetStream(ctx, DefaultTransport(), op)
}

// retryJetStream is RetryJetStream with the set-up timings of t (with its
// defaults filled in).
func retryJetStream(ctx context.Context, t Transport, op func(context.Context) error) error {
	deadline := time.Now().Add(t.SetupRetryFor)
	wait := t.SetupRetryInitial
	for {
		cctx, cancel := context.WithTimeout(ctx, t.SetupAttemptTimeout)
		err := op(cctx)
		cancel()
		if err == nil || !retryableJS(err) || ctx.Err() != nil || time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(wait):
		}
		wait = min(2*wait, t.SetupRetryMax)
	}
}
