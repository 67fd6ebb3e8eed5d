package client

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/events/bus"
	"github.com/toposched/toposched/schemas"
)

// Job states of JobHistory.State, from the job's latest event.
const (
	StateSubmitted = "submitted" // published, not yet analysed
	StateAnalyzed  = "analyzed"  // analysed, waiting for placement's answer
	StatePending   = "pending"
	StateDecided   = "decided"
	StateRejected  = "rejected"
	StateFinished  = "finished"
)

// HistoryEvent is one stored event about a job.
type HistoryEvent struct {
	Name events.Name `json:"event"`
	ID   string      `json:"id"`
	// Time is the event's ce-time (the publisher's clock); Stored is when
	// JetStream stored it.
	Time   time.Time `json:"time"`
	Stored time.Time `json:"stored"`
	Source string    `json:"source,omitempty"`
	Stream string    `json:"stream"`
	Seq    uint64    `json:"seq"`
	// Data is a pointer to the event's Go type (*events.PlacementDecided
	// and so on); nil when the body could not be read, see Error.
	Data  any    `json:"data"`
	Error string `json:"error,omitempty"`
	// Invalid says why the body breaks its event's schema (its first
	// problems), for an event the services refused: a submission they
	// rejected, a finish placement refused.
	Invalid string `json:"invalid,omitempty"`
	// Body stands for a body too large to show that breaks its schema:
	// it is summarised, not decoded (Data is nil).
	Body *BodySummary `json:"body,omitempty"`
	// Ignored marks an event placement takes no action on: a second
	// submission of a job that was not rejected, a finish of a job it
	// neither placed nor queued, or one it refused.
	Ignored bool `json:"ignored,omitempty"`
}

// BodySummary is what explain shows of a body too large to show: its
// size, its SHA-256 and its first bytes.
type BodySummary struct {
	Size   int    `json:"size"`
	SHA256 string `json:"sha256"`
	// Head is the body's first bytes, as text.
	Head string `json:"head"`
}

// Bounds of what History decodes of a body that breaks its schema: one
// above maxShownBody is summarised (the first summaryHead bytes kept),
// not decoded. A body the schema takes is decoded whatever its size: the
// schema bounds every array in it.
const (
	maxShownBody = 64 << 10
	summaryHead  = 256
)

// summarise is a body's BodySummary.
func summarise(body []byte) *BodySummary {
	sum := sha256.Sum256(body)
	head := body[:min(len(body), summaryHead)]
	for len(head) > 0 && !utf8.Valid(head) {
		head = head[:len(head)-1] // a character cut in two
	}
	return &BodySummary{Size: len(body), SHA256: hex.EncodeToString(sum[:]), Head: string(head)}
}

// firstProblems is why a body breaks its schema, in one bounded line.
func firstProblems(err error) string {
	var ve *schemas.ValidationError
	if !errors.As(err, &ve) || len(ve.Problems) == 0 {
		return err.Error()
	}
	s := ve.Problems[0].String()
	if more := len(ve.Problems) - 1; more > 0 {
		s += fmt.Sprintf(" (and %d more problems)", more)
	}
	return s
}

// UnmarshalJSON decodes Data into the Go type of the event's name, so that
// a history read back from JSON has the same shape as one read from NATS.
func (e *HistoryEvent) UnmarshalJSON(b []byte) error {
	type plain HistoryEvent
	var raw struct {
		plain
		Data json.RawMessage `json:"data"`
	}
	if err := json.Unmarshal(b, &raw); err != nil {
		return err
	}
	*e = HistoryEvent(raw.plain)
	e.Data = nil
	if v := raw.Name.New(); v != nil && len(raw.Data) > 0 && string(raw.Data) != "null" {
		if err := events.DecodeJSON(raw.Data, v); err != nil {
			return fmt.Errorf("%s data: %w", raw.Name, err)
		}
		e.Data = v
	}
	return nil
}

// JobHistory is every event about one job, in the order JetStream stored
// them, and the state they leave the job in.
type JobHistory struct {
	JobID string `json:"job_id"`
	// State is one of the State constants; Since is the time of the event
	// that put the job in it.
	State string    `json:"state"`
	Since time.Time `json:"since"`
	// Status is how the job ended, for state finished.
	Status events.JobStatus `json:"status,omitempty"`
	Events []HistoryEvent   `json:"events"`
}

// UnknownJobError says no event names the job.
type UnknownJobError struct {
	JobID, Prefix string
}

func (e *UnknownJobError) Error() string {
	return fmt.Sprintf("no events for job %s on %s", e.JobID, e.Prefix)
}

// ErrUnknownJob matches an *UnknownJobError with errors.Is.
var ErrUnknownJob = errors.New("unknown job")

// Is makes errors.Is(err, ErrUnknownJob) hold.
func (e *UnknownJobError) Is(target error) bool { return target == ErrUnknownJob }

// historyDomains are the streams that hold a job's events.
var historyDomains = []events.Domain{events.DomainJobs, events.DomainPlacement}

// History reads every event about jobID from the jobs and placement streams
// as they stand when it starts. The event subjects do not carry the job id,
// and JetStream cannot filter a consumer by header, so each stream's headers
// are read once, in order, by an ordered consumer; only the messages whose
// ce-subject header (or, for a message published without one, the body's job
// id) names the job are fetched whole and decoded. The two streams are read
// side by side and merged by the time JetStream stored each event. A job no
// event names gives an *UnknownJobError.
func History(ctx context.Context, b *bus.Bus, jobID string) (*JobHistory, error) {
	type result struct {
		evs []HistoryEvent
		err error
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	results := make([]chan result, len(historyDomains))
	for i, d := range historyDomains {
		results[i] = make(chan result, 1)
		go func() {
			evs, err := streamHistory(ctx, b, d, jobID)
			results[i] <- result{evs, err}
		}()
	}
	h := &JobHistory{JobID: jobID}
	var errs []error
	for _, c := range results {
		r := <-c
		if r.err != nil {
			cancel() // the other stream's reading is of no use now
			errs = append(errs, r.err)
		}
		h.Events = append(h.Events, r.evs...)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("history of %s: %w", jobID, err)
	}
	if len(h.Events) == 0 {
		return nil, &UnknownJobError{JobID: jobID, Prefix: b.Subjects.Prefix}
	}
	// Stable: on equal times the jobs stream, where causes live, comes first.
	slices.SortStableFunc(h.Events, func(a, b HistoryEvent) int { return a.Stored.Compare(b.Stored) })
	h.settle()
	return h, nil
}

// streamHistory reads one domain's stream up to its last message at the
// start and keeps the events about jobID. The scan asks for headers only:
// decisions and analyses of large jobs run to megabytes, and nearly all of
// them are other jobs'. The job's own bodies are then got by sequence.
func streamHistory(ctx context.Context, b *bus.Bus, domain events.Domain, jobID string) ([]HistoryEvent, error) {
	name := b.StreamName(domain)
	stream, err := b.JetStream().Stream(ctx, name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, nil // nothing was ever published there
	}
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", name, err)
	}
	seqs, err := scanHeaders(ctx, stream, jobID)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", name, err)
	}
	msgs, err := getMsgs(ctx, stream, seqs)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", name, err)
	}
	var evs []HistoryEvent
	for _, m := range msgs {
		if m != nil && about(b.Subjects, m, jobID) {
			evs = append(evs, historyEvent(b.Subjects, name, m))
		}
	}
	return evs, nil
}

// scanHeaders returns, in order, the sequences of the messages whose
// ce-subject names the job or that have none (a hand-published message
// whose body has to say), up to the stream's last message at the start.
func scanHeaders(ctx context.Context, stream jetstream.Stream, jobID string) ([]uint64, error) {
	state := stream.CachedInfo().State
	if state.Msgs == 0 {
		return nil, nil
	}
	last := state.LastSeq
	// The server drops the ephemeral consumer soon after a reader dies;
	// a reader that ends deletes it at once, as an explain is short.
	cons, err := stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
		DeliverPolicy:     jetstream.DeliverAllPolicy,
		HeadersOnly:       true,
		InactiveThreshold: 30 * time.Second,
	})
	if err != nil {
		return nil, err
	}
	defer func() {
		if info := cons.CachedInfo(); info != nil {
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
			_ = stream.DeleteConsumer(dctx, info.Name)
			cancel()
		}
	}()
	// A deep pull buffer keeps the server streaming while we filter.
	it, err := cons.Messages(jetstream.PullMaxMessages(1024))
	if err != nil {
		return nil, err
	}
	defer it.Stop()
	var seqs []uint64
	for {
		m, err := it.Next(jetstream.NextContext(ctx))
		if err != nil {
			return nil, err
		}
		md, err := m.Metadata()
		if err != nil {
			return nil, err
		}
		if s, ok := header(m.Headers(), events.HeaderSubject); !ok || s == jobID {
			seqs = append(seqs, md.Sequence.Stream)
		}
		// The end is the last message stored when we started; NumPending 0
		// also ends it should that message have been deleted since.
		if md.Sequence.Stream >= last || md.NumPending == 0 {
			return seqs, nil
		}
	}
}

// getMsgs gets the messages of seqs, a few requests in flight so that a
// job with hundreds of events does not wait out as many round trips. A
// message deleted since the scan is left nil.
func getMsgs(ctx context.Context, stream jetstream.Stream, seqs []uint64) ([]*jetstream.RawStreamMsg, error) {
	const inFlight = 16
	msgs := make([]*jetstream.RawStreamMsg, len(seqs))
	errs := make([]error, len(seqs))
	sem := make(chan struct{}, inFlight)
	var wg sync.WaitGroup
	for i, seq := range seqs {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			m, err := stream.GetMsg(ctx, seq)
			if errors.Is(err, jetstream.ErrMsgNotFound) {
				return
			}
			msgs[i], errs[i] = m, err
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return msgs, nil
}

// about reports whether a message is about the job, looking at the body
// only when the publisher left out the ce-subject header.
func about(subjects events.Subjects, m *jetstream.RawStreamMsg, jobID string) bool {
	if s, ok := header(m.Header, events.HeaderSubject); ok {
		return s == jobID
	}
	name, ok := subjects.NameOfSubject(m.Subject)
	return ok && events.KeyOfBody(name, m.Data) == jobID
}

// header reads a header the bus writes in lower case, in any case a
// hand-written publisher chose.
func header(h nats.Header, key string) (string, bool) {
	if v := h[key]; len(v) > 0 {
		return v[0], true
	}
	for k, v := range h {
		if len(v) > 0 && strings.EqualFold(k, key) {
			return v[0], true
		}
	}
	return "", false
}

// historyEvent decodes a message about the job. A body that breaks its
// schema is decoded all the same, as far as it can be (a malformed
// submission is part of what happened), unless it is larger than
// maxShownBody: then it is summarised. Both checks are bounded whatever
// the body (schemas.Validate, events.DecodeJSON), so that explain of a
// job submitted as 8 MB of numbers answers at once.
func historyEvent(subjects events.Subjects, stream string, m *jetstream.RawStreamMsg) HistoryEvent {
	h := make(map[string]string, len(m.Header))
	for k, v := range m.Header {
		if len(v) > 0 {
			h[strings.ToLower(k)] = v[0]
		}
	}
	e := HistoryEvent{Stored: m.Time, Stream: stream, Seq: m.Sequence}
	env, name, err := events.ParseEnvelope(subjects, h, m.Data,
		events.Delivery{Subject: m.Subject, Stream: stream, Seq: m.Sequence, Time: m.Time})
	if err != nil {
		e.Name, e.ID, e.Time, e.Error = events.Name(m.Subject), fmt.Sprintf("%s-%d", stream, m.Sequence), m.Time, err.Error()
		return e
	}
	e.Name, e.ID, e.Time, e.Source = name, env.ID, env.Time, env.Source
	if err := schemas.Validate(string(name), m.Data); err != nil {
		e.Invalid = firstProblems(err)
		if len(m.Data) > maxShownBody {
			e.Body = summarise(m.Data)
			return e
		}
	}
	v := name.New()
	if err := events.DecodeJSON(m.Data, v); err != nil {
		e.Error = fmt.Sprintf("unreadable body: %v", err)
		return e
	}
	e.Data = v
	return e
}

// settle sets the state the events leave the job in, by the rules the
// placement service applies: a second submission counts only after a
// rejection, and a finish only for a job placement has placed or queued
// (placement.released confirms it).
func (h *JobHistory) settle() {
	// A finish placement refused (placement.finish_refused names it by
	// its ce-id) changed nothing, nor did one that breaks its schema,
	// which placement refuses.
	refused := map[string]bool{}
	for _, e := range h.Events {
		if r, ok := e.Data.(*events.PlacementFinishRefused); ok && r.RequestID != "" {
			refused[r.RequestID] = true
		}
	}
	for i := range h.Events {
		e := &h.Events[i]
		prev := h.State
		switch d := e.Data.(type) {
		case *events.JobSubmitted:
			if h.State != "" && h.State != StateRejected {
				e.Ignored = true
				continue
			}
			h.State, h.Status = StateSubmitted, ""
		case *events.JobAnalyzed:
			if h.State != StateSubmitted {
				e.Ignored = true // the analysis of an ignored submission
				continue
			}
			h.State = StateAnalyzed
		case *events.PlacementPending:
			h.State = StatePending
		case *events.PlacementDecided:
			h.State = StateDecided
		case *events.PlacementRejected:
			h.State = StateRejected
		case *events.JobFinished:
			// Placement applies a finish to a job it has placed, queued,
			// or not seen yet (withdrawn before analysis reached it);
			// only a job already finished or rejected is left as it is.
			if h.State == StateFinished || h.State == StateRejected || refused[e.ID] || e.Invalid != "" {
				e.Ignored = true
				continue
			}
			h.State, h.Status = StateFinished, d.Status
		case *events.PlacementReleased:
			if h.State == StateFinished {
				continue // the release of the finish just seen
			}
			h.State, h.Status = StateFinished, d.Status
		default:
			continue
		}
		if h.State != prev {
			h.Since = e.Time // a job pending for an hour waits since the first answer
		}
	}
}

// LastOutcome is the job's latest decision, wait or rejection, or nil.
func (h *JobHistory) LastOutcome() *HistoryEvent {
	for i := len(h.Events) - 1; i >= 0; i-- {
		switch h.Events[i].Data.(type) {
		case *events.PlacementDecided, *events.PlacementPending, *events.PlacementRejected:
			return &h.Events[i]
		}
	}
	return nil
}

// Submission is the job as placement holds it: the last submission it
// took, not a resubmission it ignored; nil when there is none.
func (h *JobHistory) Submission() *events.JobSubmitted {
	var job *events.JobSubmitted
	for _, e := range h.Events {
		if e.Ignored {
			continue
		}
		switch d := e.Data.(type) {
		case *events.JobSubmitted:
			job = d
		case *events.JobAnalyzed:
			if job == nil {
				job = &d.Job
			}
		}
	}
	return job
}
