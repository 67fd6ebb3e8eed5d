package bus

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// What the bus puts back by itself while it runs: a service's durable
// consumer deleted under it, and a stream deleted (KeepStreams; a durable
// on it waits for it). A deleted stream's messages are gone; what comes
// back is a service that handles what is published next.
//
// Where a durable created again starts matters. A new durable reads its
// stream from the start (DeliverAll): right for a service that has never
// read it. One created again must neither skip a message that was stored
// but not yet handled (published while it was missing, or delivered and
// not yet acknowledged) nor replay everything the stream keeps: the jobs
// stream holds every submission, and analysing them all again would
// publish new analyses past the stream's duplicate window. So it starts
// after the ack floor the old one had when last looked up (every
// HealCheck, 10 s): it delivers again at most what was handled since,
// which the handlers take as any redelivery after a crash (outputs carry
// ids derived from the input's, and JetStream drops the copies within its
// two-minute duplicate window).

// createOrUpdate creates the durable, or brings an existing one to this
// version's settings. Where an existing one starts stays as it is: the
// server refuses to change it, and one created again after a deletion
// starts after what had been handled, not at the stream's first message.
func (s *subscriber) createOrUpdate(ctx context.Context) (jetstream.Consumer, error) {
	var cons jetstream.Consumer
	err := s.b.retryJetStream(ctx, func(ctx context.Context) error {
		st, err := s.b.js.Stream(ctx, s.stream)
		if err != nil {
			return err
		}
		cfg := s.consumerConfig()
		old, err := s.b.js.Consumer(ctx, s.stream, s.durable)
		switch {
		case err == nil:
			oc := old.CachedInfo().Config
			cfg.DeliverPolicy, cfg.OptStartSeq, cfg.OptStartTime = oc.DeliverPolicy, oc.OptStartSeq, oc.OptStartTime
		case !errors.Is(err, jetstream.ErrConsumerNotFound):
			return err
		}
		cons, err = s.b.js.CreateOrUpdateConsumer(ctx, s.stream, cfg)
		if err != nil {
			return err
		}
		s.streamCreated, s.floor = st.CachedInfo().Created, cons.CachedInfo().AckFloor.Stream
		return nil
	})
	return cons, err
}

// watch keeps the durable consumed until ctx ends or the subscriber
// closes, and returns the consume in use then. The consume ends by itself
// when the server says the durable was deleted; a durable gone without a
// word (no pull request was waiting) is found by looking it up every
// HealCheck, or at once after a consume error.
func (s *subscriber) watch(ctx context.Context, cons jetstream.Consumer, cc jetstream.ConsumeContext, work chan<- jetstream.Msg) jetstream.ConsumeContext {
	// Lookups and creations end as soon as the subscriber closes.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-s.closing:
			cancel()
		case <-ctx.Done():
		}
	}()
	tick := time.NewTicker(s.b.cfg.Transport.HealCheck)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return cc
		case <-cc.Closed():
			// Or the connection closes for good.
			if s.b.nc.IsClosed() || s.b.nc.IsDraining() {
				return cc
			}
		case <-tick.C:
			if !s.gone(ctx, cons) {
				continue
			}
		case <-s.poke:
			if !s.gone(ctx, cons) {
				continue
			}
		}
		cc.Stop()
		next, ncc, ok := s.recreate(ctx, work)
		if !ok {
			return cc
		}
		cons, cc = next, ncc
	}
}

// gone looks the durable up: true if the server says it does not exist.
// Otherwise it remembers its ack floor; a lookup that fails otherwise (a
// broker outage) says nothing.
func (s *subscriber) gone(ctx context.Context, cons jetstream.Consumer) bool {
	ctx, cancel := context.WithTimeout(ctx, s.b.cfg.Transport.SetupAttemptTimeout)
	defer cancel()
	info, err := cons.Info(ctx)
	switch {
	case err == nil:
		s.floor = info.AckFloor.Stream
		return false
	case errors.Is(err, jetstream.ErrConsumerNotFound), errors.Is(err, jetstream.ErrStreamNotFound):
		return true
	}
	s.log.Debug("durable consumer: lookup failed", "durable", s.durable, "stream", s.stream, "err", err)
	return false
}

// recreate creates the durable again and consumes it, trying until it
// succeeds or ctx ends (false).
func (s *subscriber) recreate(ctx context.Context, work chan<- jetstream.Msg) (jetstream.Consumer, jetstream.ConsumeContext, bool) {
	s.log.Warn("durable consumer missing: creating it again", "durable", s.durable, "stream", s.stream, "acked_up_to", s.floor)
	for {
		cons, err := s.createAgain(ctx)
		if err == nil {
			var cc jetstream.ConsumeContext
			if cc, err = s.consume(cons, work); err == nil {
				return cons, cc, true
			}
		}
		if ctx.Err() != nil {
			return nil, nil, false
		}
		s.log.Warn("durable consumer missing: could not create it again; trying again", "durable", s.durable, "stream", s.stream,
			"in", s.b.cfg.Transport.HealCheck, "err", err)
		select {
		case <-ctx.Done():
			return nil, nil, false
		case <-time.After(s.b.cfg.Transport.HealCheck):
		}
	}
}

// errNotYet is an attempt to create a durable again that may succeed a
// moment later.
var errNotYet = errors.New("not yet")

// createAgain creates the durable with its configuration, starting after
// the ack floor last seen, unless the stream is a new one (created again
// after a deletion: its sequences start again from 1). A durable that
// exists already (another replica created it first, or it was not
// deleted) is taken as it is. It waits, retrying, for a stream deleted
// with the durable to be created again (KeepStreams).
func (s *subscriber) createAgain(ctx context.Context) (jetstream.Consumer, error) {
	t := s.b.cfg.Transport
	deadline, wait := time.Now().Add(t.SetupRetryFor), t.SetupRetryInitial
	for {
		var cons jetstream.Consumer
		err := s.b.retryJetStream(ctx, func(ctx context.Context) error {
			var err error
			cons, err = s.createAgainOnce(ctx)
			return err
		})
		if !errors.Is(err, errNotYet) || time.Now().After(deadline) || ctx.Err() != nil {
			return cons, err
		}
		s.log.Debug("durable consumer: creating it again", "durable", s.durable, "stream", s.stream, "err", err)
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(wait):
		}
		wait = min(2*wait, t.SetupRetryMax)
	}
}

func (s *subscriber) createAgainOnce(ctx context.Context) (jetstream.Consumer, error) {
	st, err := s.b.js.Stream(ctx, s.stream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		// Deleted with the stream: KeepStreams creates the stream again.
		return nil, fmt.Errorf("%w: %w", errNotYet, err)
	}
	if err != nil {
		return nil, err
	}
	if created := st.CachedInfo().Created; !created.Equal(s.streamCreated) {
		s.streamCreated, s.floor = created, 0
	}
	// The server answers a deleted durable's pull requests before it
	// removes it, and its files after that: one created under the same
	// name before they are gone takes up their state. So it is made only
	// once the server has said twice, a retry apart, that it has none.
	cons, err := s.b.js.Consumer(ctx, s.stream, s.durable)
	if err == nil {
		s.notFound = false
		s.log.Info("durable consumer exists again: consuming it", "durable", s.durable, "stream", s.stream)
		return cons, nil
	}
	if !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return nil, err
	}
	if !s.notFound {
		s.notFound = true
		return nil, fmt.Errorf("%w: the deletion may still be under way", errNotYet)
	}
	cfg := s.consumerConfig()
	start := uint64(1)
	if s.floor > 0 {
		start = s.floor + 1
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, start
	}
	// Unique, so that a durable another replica creates at the same
	// moment is an error here (ErrConsumerExists), not taken for ours.
	cfg.Description = fmt.Sprintf("created again by %s (%s) after a deletion, from stream sequence %d", s.b.cfg.Source, NewID()[:8], start)
	cons, err = s.b.js.CreateConsumer(ctx, s.stream, cfg)
	if errors.Is(err, jetstream.ErrConsumerExists) {
		return nil, fmt.Errorf("%w: another replica is creating it: %w", errNotYet, err)
	}
	if err != nil {
		return nil, err
	}
	if info := cons.CachedInfo(); info.Delivered.Consumer != 0 || info.AckFloor.Consumer != 0 || info.NumAckPending != 0 {
		// Made before the deleted one's files were removed, it took up
		// their state: remove it and make it again.
		if derr := s.b.js.DeleteConsumer(ctx, s.stream, s.durable); derr != nil && !errors.Is(derr, jetstream.ErrConsumerNotFound) {
			return nil, derr
		}
		return nil, fmt.Errorf("%w: created on the deleted durable's leftover state (delivered %d)", errNotYet, info.Delivered.Consumer)
	}
	s.notFound = false
	s.log.Info("durable consumer created again", "durable", s.durable, "stream", s.stream, "from_seq", start)
	return cons, nil
}

// ensureStream creates the stream of the bus named name with its
// configuration, logging it: it was found missing.
func (b *Bus) ensureStream(ctx context.Context, name string) (jetstream.Stream, error) {
	for _, d := range streamDomains {
		if b.StreamName(d) != name {
			continue
		}
		st, err := b.js.CreateOrUpdateStream(ctx, b.streamConfig(d))
		if err != nil {
			return nil, fmt.Errorf("create stream %s again: %w", name, err)
		}
		b.log.Warn("stream missing: created again (what it held is gone)", "stream", name)
		return st, nil
	}
	return nil, fmt.Errorf("stream %s: not one of the bus's streams", name)
}

// KeepStreams creates again, until ctx ends, any stream of the bus found
// missing on two looks in a row, HealCheck apart, so that publishes to it,
// its durables (which wait for it) and /readyz work again without a
// restart. Not at the first look: the server takes a stream out of its
// list before it has removed its files, and one created under the same
// name in between loses its files to the deletion (its publishes then time
// out). A bus that leaves streams to the services (SkipStreams) keeps none.
func (b *Bus) KeepStreams(ctx context.Context) {
	if b.cfg.SkipStreams {
		return
	}
	tick := time.NewTicker(b.cfg.Transport.HealCheck)
	defer tick.Stop()
	var missing map[string]bool
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		var err error
		if missing, err = b.ensureMissingStreams(ctx, missing); err != nil && ctx.Err() == nil {
			b.log.Warn("streams: cannot create a missing one again", "err", err)
		}
	}
}

// ensureMissingStreams creates the streams the server does not list that
// were missing before too, and returns those missing now.
func (b *Bus) ensureMissingStreams(ctx context.Context, before map[string]bool) (map[string]bool, error) {
	ctx, cancel := context.WithTimeout(ctx, b.cfg.Transport.SetupAttemptTimeout)
	defer cancel()
	have := map[string]bool{}
	names := b.js.StreamNames(ctx)
	for name := range names.Name() {
		have[name] = true
	}
	if err := names.Err(); err != nil {
		return before, fmt.Errorf("list streams: %w", err)
	}
	missing := map[string]bool{}
	var errs []error
	for _, d := range streamDomains {
		name := b.StreamName(d)
		switch {
		case have[name]:
		case !before[name]:
			missing[name] = true
		default:
			if _, err := b.ensureStream(ctx, name); err != nil {
				missing[name] = true
				errs = append(errs, err)
			}
		}
	}
	return missing, errors.Join(errs...)
}
