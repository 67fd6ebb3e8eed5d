package analysis

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/events/bus"
	"github.com/toposched/toposched/events/eventstest"
	"github.com/toposched/toposched/internal/pattern"
)

// tooLarge publishes like eventstest.Memory, but refuses jobs.analyzed as
// NATS refuses a message over its max_payload.
type tooLarge struct {
	eventstest.Memory
}

func (p *tooLarge) Publish(ctx context.Context, v any) (events.Envelope, error) {
	if _, ok := v.(*events.JobAnalyzed); ok {
		return events.Envelope{}, &bus.TooLargeError{Subject: "toposched.jobs.analyzed", Size: 9 << 20, Limit: 8 << 20, Err: nats.ErrMaxPayload}
	}
	return p.Memory.Publish(ctx, v)
}

// TestTooLargeIsAnswered: an analysed job that NATS refuses for its size
// is answered with placement.rejected naming the size and the limit, and
// the submission is done with (not retried forever).
func TestTooLargeIsAnswered(t *testing.T) {
	t.Parallel()
	pub := &tooLarge{}
	s, err := New(Config{}, Deps{Publish: pub, Consume: stubConsumer{}})
	if err != nil {
		t.Fatal(err)
	}
	env := events.Envelope{ID: "sub-1", CorrelationID: "sub-1"}
	err = s.OnSubmitted(bus.WithCause(context.Background(), env), env, &events.JobSubmitted{JobID: "big", GPUs: 8})
	if err != nil {
		t.Fatalf("OnSubmitted = %v, want the job answered (nil)", err)
	}
	got := pub.Published()
	if len(got) != 1 {
		t.Fatalf("published %v, want one rejection", got)
	}
	r, ok := got[0].(*events.PlacementRejected)
	if !ok || r.JobID != "big" || len(r.Reasons) != 1 || r.Reasons[0].Code != "analysed_too_large" {
		t.Fatalf("published %+v, want placement.rejected analysed_too_large for big", got[0])
	}
	for _, w := range []string{"9.0 MiB", "8.0 MiB"} {
		if !strings.Contains(r.Reasons[0].Message, w) {
			t.Errorf("reason %q does not say %q", r.Reasons[0].Message, w)
		}
	}
}

type stubConsumer struct{}

func (stubConsumer) NewRouter() (*bus.Router, error) {
	return nil, errors.New("no router in unit tests")
}

// TestMalformedSubmissionsAreAnswered runs the service on a real server:
// each malformed submission that names its job is answered with
// placement.rejected saying what is wrong, and kept in the dead-letter
// stream; integers written 8.0 are taken.
func TestMalformedSubmissionsAreAnswered(t *testing.T) {
	t.Parallel()
	srv := eventstest.Server(t)
	b := eventstest.Bus(t, srv.ClientURL(), "analysis")
	s, err := New(Config{}, Deps{Publish: b, Consume: b})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("analysis: %v", err)
		}
	})
	select {
	case <-s.Ready():
	case err := <-done:
		t.Fatalf("analysis stopped: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("analysis not ready")
	}

	var mu sync.Mutex
	rejected := map[string]*events.PlacementRejected{}
	analyzed := map[string]*events.JobAnalyzed{}
	follow := func(domain events.Domain, subject string) {
		ready := make(chan struct{})
		go func() {
			_ = b.Follow(ctx, domain, []string{subject}, ready, func(r bus.Record) error {
				mu.Lock()
				defer mu.Unlock()
				switch r.Name {
				case events.NamePlacementRejected:
					var v events.PlacementRejected
					if b.Decode(r.Name, r.Body, &v) == nil {
						rejected[v.JobID] = &v
					}
				case events.NameJobAnalyzed:
					var v events.JobAnalyzed
					if b.Decode(r.Name, r.Body, &v) == nil {
						analyzed[v.Job.JobID] = &v
					}
				}
				return nil
			})
		}()
		<-ready
	}
	follow(events.DomainPlacement, b.Subjects.Of(events.NamePlacementRejected))
	follow(events.DomainJobs, b.Subjects.Of(events.NameJobAnalyzed))

	subject := b.Subjects.Of(events.NameJobSubmitted)
	tests := []struct {
		name    string
		headers map[string]string
		body    string
		job     string
		code    string
		field   string
		says    []string
		dead    bool
	}{
		{name: "wrong ce-type", headers: map[string]string{"ce-type": events.NameJobFinished.CEType()},
			body: `{"job_id":"wrong-type","gpus":8}`, job: "wrong-type", code: "wrong_event_type",
			says: []string{"ce-type", events.NameJobFinished.CEType(), events.NameJobSubmitted.CEType()}, dead: true},
		{name: "unknown ce-type", headers: map[string]string{"ce-type": "com.example.job.v1", "ce-subject": "by-header"},
			body: `{"job_id":"by-body","gpus":8}`, job: "by-header", code: "wrong_event_type",
			says: []string{"com.example.job.v1", events.NameJobSubmitted.CEType()}, dead: true},
		{name: "structured mode",
			body: `{"specversion":"1.0","type":"io.toposched.jobs.submitted.v1","source":"urn:x","id":"e1","datacontenttype":"application/json","data":{"job_id":"structured","gpus":8}}`,
			job:  "structured", code: "structured_mode", says: []string{"structured-mode", "binary mode", "ce-"}, dead: true},
		{name: "structured mode, subject attribute",
			body: `{"specversion":"1.0","type":"io.toposched.jobs.submitted.v1","subject":"structured-subject","data":{"gpus":8}}`,
			job:  "structured-subject", code: "structured_mode", dead: true},
		{name: "fraction", body: `{"job_id":"fraction","gpus":2.5}`, job: "fraction", code: "schema_type", field: "gpus",
			says: []string{"gpus: must be a whole number, got 2.5"}, dead: true},
		{name: "past 64 bits", body: `{"job_id":"huge","gpus":1e30}`, job: "huge", code: "out_of_range", field: "gpus",
			says: []string{"gpus is out of range: 1e30"}, dead: true},
		{name: "python's 8.0", body: `{"job_id":"python","gpus":8.0,"parallelism":{"tp":8.0}}`, job: "python"},
	}
	for _, tc := range tests {
		msg := nats.NewMsg(subject)
		for k, v := range tc.headers {
			msg.Header.Set(k, v)
		}
		msg.Data = []byte(tc.body)
		if _, err := b.JetStream().PublishMsg(ctx, msg); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			for {
				mu.Lock()
				r, a := rejected[tc.job], analyzed[tc.job]
				mu.Unlock()
				if tc.code == "" && a != nil {
					if a.Job.GPUs != 8 || a.Parallelism.TP != 8 {
						t.Fatalf("analysed %+v", a.Job)
					}
					return
				}
				if tc.code != "" && r != nil {
					if len(r.Reasons) != 1 || r.Reasons[0].Code != tc.code || r.Reasons[0].Field != tc.field {
						t.Fatalf("reasons %+v, want one %s on %q", r.Reasons, tc.code, tc.field)
					}
					for _, w := range tc.says {
						if !strings.Contains(r.Reasons[0].Message, w) {
							t.Errorf("reason %q does not say %q", r.Reasons[0].Message, w)
						}
					}
					return
				}
				if r != nil || a != nil {
					t.Fatalf("%s: rejected %+v, analysed %v", tc.job, r, a != nil)
				}
				if time.Now().After(deadline) {
					t.Fatalf("no answer for %s", tc.job)
				}
				time.Sleep(20 * time.Millisecond)
			}
		})
	}
	// Every malformed one is kept in the dead-letter stream too.
	want := map[string]bool{}
	for _, tc := range tests {
		if tc.dead {
			want[tc.body] = true
		}
	}
	cons, err := b.JetStream().OrderedConsumer(ctx, b.StreamName(events.DomainDLQ), jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	for len(want) > 0 {
		m, err := cons.Next(jetstream.FetchMaxWait(10 * time.Second))
		if err != nil {
			t.Fatalf("dead letters missing %v: %v", want, err)
		}
		delete(want, string(m.Data()))
	}
}

// TestInvalidAnswerIsBounded: a body with a schema problem in each of
// four thousand ranks gets a rejection of a hundred reasons at most,
// which NATS can carry. (A body of more values is answered with its first
// problem alone: schemas.Validate.)
func TestInvalidAnswerIsBounded(t *testing.T) {
	t.Parallel()
	pub := &eventstest.Memory{}
	s, err := New(Config{}, Deps{Publish: pub, Consume: stubConsumer{}})
	if err != nil {
		t.Fatal(err)
	}
	ranks := strings.TrimSuffix(strings.Repeat("-1,", 4_000), ",")
	body := []byte(`{"job_id":"neg","gpus":8,"groups":[{"name":"g","collective":"all_reduce","bytes":1,"ranks":[` + ranks + `]}]}`)
	derr := bus.Decode(events.NameJobSubmitted, body, new(events.JobSubmitted))
	if derr == nil {
		t.Fatal("decoded")
	}
	env := events.Envelope{ID: "e", Subject: "neg"}
	if err := s.OnInvalid(bus.WithCause(context.Background(), env), env, body, derr); err != nil {
		t.Fatal(err)
	}
	r := pub.Published()[0].(*events.PlacementRejected)
	if len(r.Reasons) != pattern.MaxReasons || r.Reasons[pattern.MaxReasons-1].Code != "more_problems" {
		t.Fatalf("%d reasons, the last %+v", len(r.Reasons), r.Reasons[len(r.Reasons)-1])
	}
}
