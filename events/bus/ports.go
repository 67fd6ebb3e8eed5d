package bus

import (
	"context"
	"fmt"

	"github.com/toposched/toposched/events"
)

// The ports a service is given instead of the whole Bus. Each service's
// Deps names the few it uses, so a unit test hands it an in-memory fake
// (see eventstest) and production code needs no "no bus" branches. *Bus
// implements every one of them.

// Publisher stores one event on its subject (Publish), tells the stream
// sequence it was stored at (PublishSeq), or sends it without waiting for
// the stream (PublishAsync: Pending.Wait waits).
type Publisher interface {
	Publish(ctx context.Context, v any) (events.Envelope, error)
	PublishSeq(ctx context.Context, v any) (events.Envelope, uint64, error)
	PublishAsync(ctx context.Context, v any) (events.Envelope, *Pending, error)
}

// Reader reads what a domain's stream holds, in stream order (Replay,
// ReplayFrom), and decodes what it read (Decode: schema-checked, with the
// bus's cache of bodies already validated).
type Reader interface {
	Replay(ctx context.Context, domain events.Domain, subjects []string, fn func(Record) error) error
	ReplayFrom(ctx context.Context, domain events.Domain, subjects []string, after uint64, fn func(Record) error) error
	Decode(name events.Name, body []byte, v any) error
}

// Consumer builds the routers that run a service's durable consumers.
type Consumer interface {
	NewRouter() (*Router, error)
}

var (
	_ Publisher = (*Bus)(nil)
	_ Reader    = (*Bus)(nil)
	_ Consumer  = (*Bus)(nil)
)

// Serve runs r until ctx ends, then closes it and returns once its
// in-flight handlers have finished and settled. The handlers run on a
// context that outlives ctx, so a signal does not cancel the work in hand
// (unless r was set to AbortOnClose): messages not yet taken stay in the
// streams. ready, if not nil, is called
// once every handler is consuming. An error is returned when the router
// fails to start or stops on its own.
func Serve(ctx context.Context, r *Router, ready func()) error {
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- r.Run(runCtx) }()
	select {
	case <-r.Running():
		if ready != nil {
			ready()
		}
	case err := <-done:
		if err == nil {
			err = fmt.Errorf("router stopped before it ran")
		}
		return fmt.Errorf("start handlers: %w", err)
	case <-ctx.Done():
		_ = r.Close()
		<-done //nolint:errcheck // stopped while starting: a shutdown, not a failure to start
		return nil
	}
	select {
	case err := <-done:
		if err != nil {
			return fmt.Errorf("handlers: %w", err)
		}
		return fmt.Errorf("handlers stopped on their own")
	case <-ctx.Done():
		cerr := r.Close()
		err := <-done
		if cerr != nil {
			return fmt.Errorf("stop handlers: %w", cerr)
		}
		if err != nil {
			return fmt.Errorf("handlers: %w", err)
		}
		return nil
	}
}
