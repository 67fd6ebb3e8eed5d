package launcher

import (
	"context"

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
