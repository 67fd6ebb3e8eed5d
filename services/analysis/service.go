package analysis

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/events/bus"
	"github.com/toposched/toposched/internal/pattern"
)

// HandlerSubmitted is the durable consumer of jobs.submitted. It is part of
// the wire contract: renaming it re-reads the stream from the start.
const HandlerSubmitted = "analysis-jobs-submitted"

// Concurrency is how many submissions are analysed at once. A handler is
// a short computation, then a publish awaited for its PubAck, which on a
// busy server takes milliseconds: the handlers mostly wait, and analysis
// passes at most Concurrency jobs per PubAck time on to placement. With 4
// that held the whole pipeline back under a burst: placement's cycles got
// 11-12 jobs each, where 16 handlers give them 27-28, and the larger
// cycles cost less CPU a decision (BENCHMARKS.md, "analysis in step").
// Jobs analysed together may be stored out of their submission order, by
// fewer than Concurrency places; placement's arrival order is the order
// of jobs.analyzed.
const Concurrency = 16

// Config is the analysis service's configuration. It has none yet; the
// type keeps the shape every service shares.
type Config struct{}

// Validate reports every problem at once.
func (Config) Validate() error { return nil }

// Deps are the ports the service uses.
type Deps struct {
	Publish bus.Publisher
	Consume bus.Consumer
	// Log is nil for slog.Default.
	Log *slog.Logger
}

func (d Deps) validate() error {
	var errs []error
	if d.Publish == nil {
		errs = append(errs, errors.New("analysis: deps: Publish is required"))
	}
	if d.Consume == nil {
		errs = append(errs, errors.New("analysis: deps: Consume is required"))
	}
	return errors.Join(errs...)
}

// Service analyses every submitted job.
type Service struct {
	pub     bus.Publisher
	consume bus.Consumer
	log     *slog.Logger
	ready   chan struct{}
}

// New returns the analysis service.
func New(cfg Config, deps Deps) (*Service, error) {
	if err := errors.Join(cfg.Validate(), deps.validate()); err != nil {
		return nil, err
	}
	log := deps.Log
	if log == nil {
		log = slog.Default()
	}
	return &Service{pub: deps.Publish, consume: deps.Consume, log: log.With("component", "analysis"), ready: make(chan struct{})}, nil
}

// Ready is closed once the service's handlers are consuming.
func (s *Service) Ready() <-chan struct{} { return s.ready }

// Run consumes jobs.submitted until ctx ends (see bus.Serve).
func (s *Service) Run(ctx context.Context) error {
	r, err := s.consume.NewRouter()
	if err != nil {
		return fmt.Errorf("analysis: %w", err)
	}
	bus.Handle(r, bus.Handler[events.JobSubmitted]{
		Name:        HandlerSubmitted,
		Event:       events.NameJobSubmitted,
		Concurrency: Concurrency,
		Fn:          s.OnSubmitted,
		Invalid:     s.OnInvalid,
	})
	if err := bus.Serve(ctx, r, func() { close(s.ready) }); err != nil {
		return fmt.Errorf("analysis: %w", err)
	}
	return nil
}

// OnSubmitted analyses a job and publishes jobs.analyzed, or rejects it.
func (s *Service) OnSubmitted(ctx context.Context, env events.Envelope, job *events.JobSubmitted) error {
	log := s.log.With("job_id", job.JobID, "correlation_id", env.CorrelationID)
	analyzed, reasons := pattern.Analyze(*job)
	if len(reasons) > 0 {
		log.Info("job rejected", "reasons", len(reasons), "first", reasons[0].Message)
		_, err := s.pub.Publish(ctx, &events.PlacementRejected{JobID: job.JobID, Reasons: reasons})
		return err
	}
	if _, err := s.pub.Publish(ctx, &analyzed); err != nil {
		// NATS refusing the analysed job for its size will refuse it
		// every time: answer the job rather than retry it forever.
		// pattern.Analyze bounds the size before it builds the groups, so
		// this is the backstop for a server whose limit is below ours.
		var tl *bus.TooLargeError
		if !errors.As(err, &tl) {
			return err
		}
		reason := TooLargeReason(tl)
		log.Warn("analysed job too large to publish: rejected", "size", tl.Size, "limit", tl.Limit)
		_, perr := s.pub.Publish(ctx, &events.PlacementRejected{JobID: job.JobID, Reasons: []events.Reason{reason}})
		return perr
	}
	log.Debug("job analyzed", "gpus", job.GPUs, "groups", len(analyzed.Groups))
	return nil
}

// TooLargeReason is the rejection of a job whose analysed form the bus
// refused for its size.
func TooLargeReason(tl *bus.TooLargeError) events.Reason {
	return events.Reason{Code: CodeAnalysedTooLarge, Message: fmt.Sprintf(
		"the analysed job is %s (every rank of every group listed), over the limit of %s for one message: use fewer GPUs, fewer parallel dimensions or fewer explicit groups",
		mib(tl.Size), mib(tl.Limit))}
}

func mib(n int) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }

// Reason codes of the rejections analysis makes itself, beside
// pattern.Analyze's and the schema's (schema_<rule>).
const (
	// CodeAnalysedTooLarge: the analysed job is over one message (as
	// pattern.Analyze says it before building it).
	CodeAnalysedTooLarge = pattern.CodeAnalysedTooLarge
	// CodeWrongEventType: the ce-type header is not jobs.submitted's.
	CodeWrongEventType = bus.CodeWrongEventType
	// CodeStructuredMode: the body is a CloudEvents structured-mode event.
	CodeStructuredMode = bus.CodeStructuredMode
)

// OnInvalid answers a malformed submission whose job id can be read (from
// ce-subject, the body's job_id, or a structured-mode body's subject or
// data) with a rejection naming every field and rule, or what else is
// wrong: a ce-type that is not jobs.submitted's, a CloudEvents
// structured-mode body, a number past 64 bits. The message then goes to
// the dead-letter subject; one without a readable id goes there alone.
func (s *Service) OnInvalid(ctx context.Context, env events.Envelope, _ []byte, err error) error {
	if !events.ValidJobID(env.Subject) {
		s.log.Warn("malformed job without a usable job id: dead-lettered", "id", env.ID, "err", err)
		return nil
	}
	reasons := pattern.CapReasons(bus.ReasonsOf(err))
	s.log.Info("malformed job rejected", "job_id", env.Subject, "correlation_id", env.CorrelationID, "err", err)
	_, perr := s.pub.Publish(ctx, &events.PlacementRejected{JobID: env.Subject, Reasons: reasons})
	return perr
}
