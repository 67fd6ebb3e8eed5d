package bus

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
)

// ErrUnconfirmed is wrapped by Pending.Wait's error when the stream's
// answer never came (the acknowledgement overdue, the connection lost,
// the wait's context ended): the event may or may not be stored.
// Publishing the same event again, under the same cause, settles it: its
// message id is the same, so JetStream stores it once.
var ErrUnconfirmed = errors.New("not confirmed by the stream")

// Pending is an event sent by PublishAsync whose acknowledgement has not
// been awaited yet.
type Pending struct {
	fut jetstream.PubAckFuture
	// done tells the observer; fail says why the stream refused.
	done func(dup bool)
	fail func(error) error
	// Settled: seq and err, with no future.
	seq uint64
	err error
}

// Settled is a Pending already answered, for a Publisher that stores at
// once (an in-memory fake).
func Settled(seq uint64, err error) *Pending { return &Pending{seq: seq, err: err} }

// Wait returns the stream sequence the event was stored at, or why it was
// not, with Publish's errors (ErrFenced, *TooLargeError, Transient), or,
// wrapping ErrUnconfirmed, that the stream never answered. It ends with
// ctx, or when the acknowledgement is overdue by the transport's handler
// timeout.
func (p *Pending) Wait(ctx context.Context) (uint64, error) {
	if p.fut == nil {
		return p.seq, p.err
	}
	// An answer already here wins over a context that has ended.
	select {
	case ack := <-p.fut.Ok():
		p.fut, p.seq = nil, ack.Sequence
		p.done(ack.Duplicate)
		return p.seq, nil
	default:
	}
	select {
	case ack := <-p.fut.Ok():
		p.fut, p.seq = nil, ack.Sequence
		p.done(ack.Duplicate)
	case err := <-p.fut.Err():
		var apiErr *jetstream.APIError
		if !errors.As(err, &apiErr) {
			// No answer from the stream, only the client's giving up.
			err = fmt.Errorf("%w: %w", ErrUnconfirmed, err)
		}
		p.fut, p.err = nil, p.fail(err)
	case <-ctx.Done():
		return 0, Transient(fmt.Errorf("%w: %w", ErrUnconfirmed, context.Cause(ctx)))
	}
	return p.seq, p.err
}
