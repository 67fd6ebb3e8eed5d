package bus

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toposched/toposched/events"
)

// Observer is told what the bus does, for metrics. Its methods are called
// on the handlers' goroutines and must be quick.
type Observer interface {
	// Handled is called once per delivery a handler took, after its
	// retries: err is what it finally returned (a permanent error is then
	// dead-lettered, a transient one redelivered), delivered how many
	// times JetStream has delivered the message (above 1: a redelivery).
	Handled(handler string, took time.Duration, err error, delivered uint64)
	// Published is called after an event is stored. ctx carries the event
	// being handled, if any (CauseFrom).
	Published(ctx context.Context, name events.Name, env events.Envelope)
}

// observe is the router middleware that reports each delivery to the
// observer; it sits inside the dead-letter middleware, so it sees the
// errors that are dead-lettered.
func (b *Bus) observe(h message.HandlerFunc) message.HandlerFunc {
	return func(m *message.Message) ([]*message.Message, error) {
		start := time.Now()
		out, err := h(m)
		delivered, _ := strconv.ParseUint(m.Metadata.Get(metaDelivered), 10, 64)
		b.cfg.Observer.Handled(message.HandlerNameFromCtx(m.Context()), time.Since(start), err, delivered)
		return out, err
	}
}

// RetryJetStream runs op until it succeeds, ctx ends, or a minute has
// passed, retrying the failures a JetStream cluster gives while it elects
// leaders or is busy creating other streams (timeouts, "temporarily
// unavailable", no responders). Every replica of every service creates
// the streams at start-up: on a fresh R3 cluster they all do it at once.
func RetryJetStream(ctx context.Context, op func(context.Context) error) error {
	deadline := time.Now().Add(time.Minute)
	wait := 100 * time.Millisecond
	for {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
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
		wait = min(2*wait, 2*time.Second)
	}
}

func retryableJS(err error) bool {
	var apiErr *jetstream.APIError
	switch {
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, nats.ErrTimeout), errors.Is(err, nats.ErrNoResponders),
		errors.Is(err, jetstream.ErrNoStreamResponse), errors.Is(err, nats.ErrConnectionReconnecting):
		return true
	case errors.As(err, &apiErr):
		// 503: JetStream (or the cluster's meta leader) temporarily
		// unavailable; 10074: the stream is still being created.
		return apiErr.Code == 503 || apiErr.Code == 408 || apiErr.ErrorCode == 10074 || strings.Contains(apiErr.Description, "temporarily unavailable")
	}
	return false
}
