package analysis

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/events/bus"
	"github.com/toposched/toposched/internal/pattern"
	"github.com/toposched/toposched/schemas"
)

// HandlerSubmitted is the durable consumer of jobs.submitted. It is part of
// the wire contract: renaming it re-reads the stream from the start.
const HandlerSubmitted = "analysis-jobs-submitted"

// Service analyses every submitted job.
type Service struct {
	bus *bus.Bus
	log *slog.Logger
}

// New returns the analysis service on b.
func New(b *bus.Bus, log *slog.Logger) *Service {
	if b == nil {
		panic("analysis: nil bus")
	}
	if log == nil {
		log = slog.Default()
	}
	return &Service{bus: b, log: log.With("component", "analysis")}
}

// Register adds the service's handlers to r.
func (s *Service) Register(r *bus.Router) {
	bus.Handle(r, bus.Handler[events.JobSubmitted]{
		Name:        HandlerSubmitted,
		Event:       events.NameJobSubmitted,
		Concurrency: 4,
		Fn:          s.OnSubmitted,
		Invalid:     s.OnInvalid,
	})
}

// OnSubmitted analyses a job and publishes jobs.analyzed, or rejects it.
func (s *Service) OnSubmitted(ctx context.Context, env events.Envelope, job *events.JobSubmitted) error {
	log := s.log.With("job_id", job.JobID, "correlation_id", env.CorrelationID)
	analyzed, reasons := pattern.Analyze(*job)
	if len(reasons) > 0 {
		log.Info("job rejected", "reasons", len(reasons), "first", reasons[0].Message)
		_, err := s.bus.Publish(ctx, &events.PlacementRejected{JobID: job.JobID, Reasons: reasons})
		return err
	}
	if _, err := s.bus.Publish(ctx, &analyzed); err != nil {
		return err
	}
	log.Debug("job analyzed", "gpus", job.GPUs, "groups", len(analyzed.Groups))
	return nil
}

// OnInvalid answers a malformed submission whose job id can be read with a
// rejection naming every field and rule. The message then goes to the
// dead-letter subject; one without a readable id goes there alone.
func (s *Service) OnInvalid(ctx context.Context, env events.Envelope, _ []byte, err error) error {
	if !events.ValidJobID(env.Subject) {
		s.log.Warn("malformed job without a usable job id: dead-lettered", "id", env.ID, "err", err)
		return nil
	}
	reasons := ReasonsOf(err)
	s.log.Info("malformed job rejected", "job_id", env.Subject, "correlation_id", env.CorrelationID, "err", err)
	_, perr := s.bus.Publish(ctx, &events.PlacementRejected{JobID: env.Subject, Reasons: reasons})
	return perr
}

// ReasonsOf turns a schema error into rejection reasons, one per problem.
func ReasonsOf(err error) []events.Reason {
	var ve *schemas.ValidationError
	if !errors.As(err, &ve) {
		return []events.Reason{{Code: "invalid", Message: err.Error()}}
	}
	out := make([]events.Reason, 0, len(ve.Problems))
	for _, p := range ve.Problems {
		field := p.Field
		msg := p.Message
		if field != "" {
			msg = fmt.Sprintf("%s: %s", field, p.Message)
		}
		out = append(out, events.Reason{Code: "schema_" + p.Rule, Field: field, Message: msg})
	}
	return out
}
