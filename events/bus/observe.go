package bus

import (
	"context"
	"strconv"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

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
