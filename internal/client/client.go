// Package client is the small typed client a launcher or CLI imports to
// submit jobs, finish them, and follow placement outcomes.
//
// It sits on the internal floor, above events: it is built from the event
// types, the bus and textout's writer, and only the launcher, the harnesses
// and the commands use it, so nothing below has reason to import it.
package client

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/events/bus"
	"github.com/toposched/toposched/schemas"
)

// Outcome is one placement event about a job.
type Outcome struct {
	Name     events.Name
	Env      events.Envelope
	Decided  *events.PlacementDecided
	Pending  *events.PlacementPending
	Rejected *events.PlacementRejected
	Released *events.PlacementReleased
	// FinishRefused answers a finish placement could not read.
	FinishRefused *events.PlacementFinishRefused
}

// JobID is the job the outcome is about.
func (o Outcome) JobID() string { return o.Env.Subject }

// Final reports whether no further outcome is expected until the user acts:
// decided or rejected. Pending is followed by a decision later.
func (o Outcome) Final() bool { return o.Decided != nil || o.Rejected != nil }

// From says where a watch starts.
type From int

// Watch starting points.
const (
	FromNow From = iota
	FromStart
)

// Watch calls fn for every placement outcome, from now or from the start of
// the stream, until ctx ends or fn returns an error (bus.ErrStop ends it
// quietly). It is ready before it returns its first call, so an outcome of a
// job submitted after Watch started is never missed: call Watch, wait on
// ready, then submit.
func Watch(ctx context.Context, b *bus.Bus, from From, ready chan<- struct{}, fn func(Outcome) error) error {
	name := b.StreamName(events.DomainPlacement)
	cfg := jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{b.Subjects.Domain(events.DomainPlacement)},
		DeliverPolicy:  jetstream.DeliverAllPolicy,
	}
	if from == FromNow {
		if err := b.FromNow(ctx, name, &cfg); err != nil {
			return fmt.Errorf("watch placements: %w", err)
		}
	}
	cons, err := b.JetStream().OrderedConsumer(ctx, name, cfg)
	if err != nil {
		return fmt.Errorf("watch placements: %w", err)
	}
	it, err := cons.Messages()
	if err != nil {
		return fmt.Errorf("watch placements: %w", err)
	}
	defer it.Stop()
	if ready != nil {
		close(ready)
	}
	go func() {
		<-ctx.Done()
		it.Stop()
	}()
	for {
		m, err := it.Next()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, jetstream.ErrMsgIteratorClosed) {
				return ctx.Err()
			}
			return fmt.Errorf("watch placements: %w", err)
		}
		o, err := decodeOutcome(b, m)
		if err != nil {
			continue // not ours to judge; the services dead-letter it
		}
		if err := fn(o); err != nil {
			if errors.Is(err, bus.ErrStop) {
				return nil
			}
			return err
		}
	}
}

func decodeOutcome(b *bus.Bus, m jetstream.Msg) (Outcome, error) {
	h := make(map[string]string, len(m.Headers()))
	for k, v := range m.Headers() {
		if len(v) > 0 {
			h[strings.ToLower(k)] = v[0]
		}
	}
	md, err := m.Metadata()
	if err != nil {
		return Outcome{}, err
	}
	env, name, err := events.ParseEnvelope(b.Subjects, h, m.Data(),
		events.Delivery{Subject: m.Subject(), Stream: md.Stream, Seq: md.Sequence.Stream, Time: md.Timestamp})
	if err != nil {
		return Outcome{}, err
	}
	o := Outcome{Name: name, Env: env}
	var v any
	switch name {
	case events.NamePlacementDecided:
		o.Decided = new(events.PlacementDecided)
		v = o.Decided
	case events.NamePlacementPending:
		o.Pending = new(events.PlacementPending)
		v = o.Pending
	case events.NamePlacementRejected:
		o.Rejected = new(events.PlacementRejected)
		v = o.Rejected
	case events.NamePlacementReleased:
		o.Released = new(events.PlacementReleased)
		v = o.Released
	case events.NamePlacementFinishRefused:
		o.FinishRefused = new(events.PlacementFinishRefused)
		v = o.FinishRefused
	default:
		return Outcome{}, fmt.Errorf("not an outcome: %s", name)
	}
	if err := b.Decode(name, m.Data(), v); err != nil {
		return Outcome{}, err
	}
	return o, nil
}

// Submit publishes a job.
func Submit(ctx context.Context, b *bus.Bus, job *events.JobSubmitted) (events.Envelope, error) {
	return b.Publish(ctx, job)
}

// Finish says a job ended (or withdraws it while it waits).
func Finish(ctx context.Context, b *bus.Bus, jobID string, status events.JobStatus) (events.Envelope, error) {
	return b.Publish(ctx, &events.JobFinished{JobID: jobID, Status: status})
}

// LoadJob reads a job file (YAML or JSON) and checks it against the
// jobs.submitted schema, so a mistake is reported before anything is sent.
func LoadJob(path string) (*events.JobSubmitted, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("job file: %w", err)
	}
	return ParseJob(filepath.Base(path), data)
}

// ParseJob parses a job (YAML or JSON) and validates it against its schema.
// Numbers are read as written (YAMLToJSON) by the events decoder, as the
// services read them: gpus: 8.0 is 8, and 2.5 or 1e30 is refused naming
// the field.
func ParseJob(file string, data []byte) (*events.JobSubmitted, error) {
	body, err := YAMLToJSON(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	if err := schemas.Validate(string(events.NameJobSubmitted), body); err != nil {
		return nil, fmt.Errorf("%s: %w", file, events.ExplainStructured(body, err))
	}
	var job events.JobSubmitted
	if err := events.DecodeJSON(body, &job); err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	return &job, nil
}
