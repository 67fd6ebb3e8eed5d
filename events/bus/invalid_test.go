package bus_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/events/bus"
	"github.com/toposched/toposched/events/eventstest"
)

// TestInvalidSeesEveryMalformedMessage: a message the handler cannot take
// because of its envelope (a ce-type that is unknown, or another event's
// type on this subject) reaches the Invalid hook, with the job id read
// from the body, as a body that breaks its schema does; then it is kept
// in the dead-letter stream.
func TestInvalidSeesEveryMalformedMessage(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		headers map[string]string
		body    string
		subject string // of the envelope Invalid gets
		wantErr string
	}{
		{"another event's type", map[string]string{"ce-type": "io.toposched.jobs.submitted.v1"},
			`{"job_id":"j-wrong-type","status":"succeeded"}`, "j-wrong-type", "does not belong on subject"},
		{"unknown type", map[string]string{"ce-type": "io.toposched.jobs.finished.v2"},
			`{"job_id":"j-v2","status":"succeeded"}`, "j-v2", "unknown event type"},
		{"ce-subject wins", map[string]string{"ce-type": "com.example.finished", "ce-subject": "j-header"},
			`{"job_id":"j-body","status":"succeeded"}`, "j-header", "unknown event type"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var mu sync.Mutex
			var got []events.Envelope
			var gotErr []error
			h := start(t, ok, func(_ context.Context, env events.Envelope, body []byte, err error) error {
				mu.Lock()
				defer mu.Unlock()
				got, gotErr = append(got, env), append(gotErr, err)
				if string(body) == "" {
					return errors.New("Invalid got no body")
				}
				return nil
			})
			h.raw(t, "toposched.jobs.finished", tc.headers, tc.body)
			m := h.deadLetter(t)
			if string(m.Data()) != tc.body {
				t.Errorf("dead letter body %q, want the original", m.Data())
			}
			if e := m.Headers().Get(events.HeaderError); !strings.Contains(e, tc.wantErr) {
				t.Errorf("error header %q does not say %q", e, tc.wantErr)
			}
			deadline := time.Now().Add(5 * time.Second)
			for {
				mu.Lock()
				n := len(got)
				mu.Unlock()
				if n > 0 || time.Now().After(deadline) {
					break
				}
				time.Sleep(10 * time.Millisecond)
			}
			mu.Lock()
			defer mu.Unlock()
			if len(got) != 1 {
				t.Fatalf("Invalid called %d times, want 1", len(got))
			}
			if got[0].Subject != tc.subject || got[0].ID == "" {
				t.Errorf("Invalid got envelope %+v, want subject %q and an id", got[0], tc.subject)
			}
			var ee *events.EnvelopeError
			if !errors.As(gotErr[0], &ee) || ee.Header != events.HeaderType {
				t.Errorf("Invalid got %v, want an *events.EnvelopeError on %s", gotErr[0], events.HeaderType)
			}
		})
	}
}

// TestPublishTooLargeIsPermanent: a message over the server's max_payload
// is refused for good: a *bus.TooLargeError naming the size and the limit,
// not a Transient error that would be retried forever.
func TestPublishTooLargeIsPermanent(t *testing.T) {
	t.Parallel()
	srv := eventstest.Server(t)
	b := eventstest.Bus(t, srv.ClientURL(), "test")
	ctx := eventstest.Context(t, 20*time.Second)
	body := `{"job_id":"big","gpus":1,"tenant":"` + strings.Repeat("x", 9<<20) + `"}`
	err := b.PublishRaw(ctx, "toposched.jobs.submitted", nil, []byte(body))
	if err == nil {
		t.Fatal("a 9 MB message was published")
	}
	if bus.IsTransient(err) {
		t.Fatalf("error %v is Transient: it would be retried forever", err)
	}
	var tl *bus.TooLargeError
	if !errors.As(err, &tl) || tl.Size <= tl.Limit || tl.Limit != 8<<20 {
		t.Fatalf("error %v, want a *bus.TooLargeError over the 8 MiB limit", err)
	}
	if !bus.TooLarge(err) {
		t.Errorf("TooLarge(%v) = false", err)
	}
}
