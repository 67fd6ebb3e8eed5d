package bus

import (
	"context"
	"errors"
	"fmt"
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

// errCodeMessageTooLarge is JetStream's answer to a message over a
// stream's max_msg_size (nats-server's JSStreamMessageExceedsMaximumErr,
// "message size exceeds maximum allowed"); nats.go names it
// JSErrCodeStreamMessageExceedsMaximum.
const errCodeMessageTooLarge = jetstream.JSErrCodeStreamMessageExceedsMaximum

// TooLargeError is a publish refused for its size: by the client, against
// the server's max_payload (nats.ErrMaxPayload), or by the stream, against
// its max_msg_size. Asking again can never succeed, so it is not Transient:
// a handler that meets it answers or dead-letters its input instead of
// retrying it forever.
type TooLargeError struct {
	Subject string
	// Size is the message's size in bytes, body and headers; Limit the
	// most the server or stream takes.
	Size, Limit int
	Err         error
}

func (e *TooLargeError) Error() string {
	return fmt.Sprintf("publish %s: the message is %d bytes, over the limit of %d: %v", e.Subject, e.Size, e.Limit, e.Err)
}

func (e *TooLargeError) Unwrap() error { return e.Err }

// TooLarge reports whether err says a message was refused for its size.
func TooLarge(err error) bool {
	var tl *TooLargeError
	return errors.As(err, &tl) || tooLarge(err)
}

// tooLarge reports whether a publish error is the client's or the
// stream's refusal of the message's size.
func tooLarge(err error) bool {
	if errors.Is(err, nats.ErrMaxPayload) {
		return true
	}
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == errCodeMessageTooLarge
}

// tooLargeError describes a publish that tooLarge refused: its size and
// the limit it met (the server's max_payload for the client's refusal, the
// streams' max_msg_size for the stream's).
func (b *Bus) tooLargeError(msg *nats.Msg, err error) *TooLargeError {
	size := len(msg.Data)
	for k, vs := range msg.Header {
		for _, v := range vs {
			size += len(k) + len(v) + len(": \r\n")
		}
	}
	limit := streamMaxMsgSize
	if errors.Is(err, nats.ErrMaxPayload) {
		limit = int(b.nc.MaxPayload())
	}
	return &TooLargeError{Subject: msg.Subject, Size: size, Limit: limit, Err: err}
}
