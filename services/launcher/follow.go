package launcher

import (
	"context"
	"errors"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/events/bus"
)

// followInto follows the named events of a domain into recs until ctx
// ends, its error (if it stops for one) into errc; the channel returned is
// closed once the follow reads events stored from now on (bus.Follow's
// ready). The agent and the watchdog merge several domains into one
// channel with it.
func followInto(ctx context.Context, b *bus.Bus, recs chan<- bus.Record, errc chan<- error, domain events.Domain, names ...events.Name) <-chan struct{} {
	ready := make(chan struct{})
	subjects := make([]string, len(names))
	for i, n := range names {
		subjects[i] = b.Subjects.Of(n)
	}
	go func() {
		errc <- b.Follow(ctx, domain, subjects, ready, func(r bus.Record) error {
			select {
			case recs <- r:
				return nil
			case <-ctx.Done():
				return bus.ErrStop
			}
		})
	}()
	return ready
}

// awaitFollows waits until every follow reads new events; it returns a
// follow's error, or nil when ctx ends first.
func awaitFollows(ctx context.Context, readies []<-chan struct{}, errc <-chan error) error {
	for _, r := range readies {
		select {
		case <-r:
		case err := <-errc:
			return err
		case <-ctx.Done():
			return nil
		}
	}
	return nil
}

// followEnded is why a follow ended, nil when ctx did.
func followEnded(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return nil
	}
	if err == nil {
		err = errors.New("stopped following")
	}
	return err
}
