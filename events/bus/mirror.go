package bus

import (
	"context"
	"fmt"

	"github.com/toposched/toposched/events"
)

// Source is one stream a controller mirrors: its domain and the events of
// it that the controller reads.
type Source struct {
	Domain events.Domain
	Names  []events.Name
}

// Mirror is a controller's copy of several streams kept as an informer
// keeps its cache: Rebuild reads each source from its start, then Follow
// reads each on from where Rebuild stopped, so no event is missed or seen
// twice. It keeps no durable state: a controller rebuilds when it starts.
type Mirror struct {
	Bus     *Bus
	Sources []Source
	// last is the last sequence Rebuild read of each source.
	last []uint64
}

// Rebuild calls fn for every stored event of the sources, a source after
// the other, and notes where each ended.
func (m *Mirror) Rebuild(ctx context.Context, fn func(Record)) error {
	m.last = make([]uint64, len(m.Sources))
	for i, src := range m.Sources {
		err := m.Bus.Replay(ctx, src.Domain, m.subjects(src), func(r Record) error {
			m.last[i] = r.Seq
			fn(r)
			return nil
		})
		if err != nil {
			return fmt.Errorf("rebuild from %s: %w", src.Domain, err)
		}
	}
	return nil
}

// Follow calls fn for every event of the sources stored after Rebuild's
// until ctx ends (it then returns nil), each source in its own goroutine;
// ready is closed once every source has its consumer.
func (m *Mirror) Follow(ctx context.Context, ready chan<- struct{}, fn func(Record)) error {
	if len(m.last) != len(m.Sources) {
		return fmt.Errorf("follow: Rebuild has not run")
	}
	errs := make(chan error, len(m.Sources))
	readies := make([]chan struct{}, len(m.Sources))
	for i, src := range m.Sources {
		readies[i] = make(chan struct{})
		go func() {
			errs <- m.Bus.FollowFrom(ctx, src.Domain, m.subjects(src), m.last[i], readies[i], func(r Record) error {
				fn(r)
				return nil
			})
		}()
	}
	for i := range readies {
		select {
		case <-readies[i]:
		case err := <-errs:
			return fmt.Errorf("follow: %w", err)
		case <-ctx.Done():
			return nil
		}
	}
	close(ready)
	for range m.Sources {
		if err := <-errs; err != nil && ctx.Err() == nil {
			return fmt.Errorf("follow: %w", err)
		}
	}
	return nil
}

func (m *Mirror) subjects(src Source) []string {
	out := make([]string, 0, len(src.Names))
	for _, n := range src.Names {
		out = append(out, m.Bus.Subjects.Of(n))
	}
	return out
}
