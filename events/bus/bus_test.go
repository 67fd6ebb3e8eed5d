package bus_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/events/bus"
	"github.com/toposched/toposched/events/eventstest"
)

// harness runs one handler of jobs.finished on a fresh server.
type harness struct {
	b   *bus.Bus
	url string
	got chan events.Envelope
}

func start(t *testing.T, fn func(ctx context.Context, env events.Envelope, ev *events.JobFinished) error,
	invalid func(ctx context.Context, env events.Envelope, body []byte, err error) error) *harness {
	t.Helper()
	srv := eventstest.Server(t)
	b := eventstest.Bus(t, srv.ClientURL(), "test")
	r, err := b.NewRouter()
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{b: b, url: srv.ClientURL(), got: make(chan events.Envelope, 16)}
	bus.Handle(r, bus.Handler[events.JobFinished]{
		Name: "test-finished", Event: events.NameJobFinished, Concurrency: 2,
		Fn: func(ctx context.Context, env events.Envelope, ev *events.JobFinished) error {
			if err := fn(ctx, env, ev); err != nil {
				return err
			}
			h.got <- env
			return nil
		},
		Invalid: invalid,
	})
	go func() { _ = r.Run(context.Background()) }()
	<-r.Running()
	t.Cleanup(func() { _ = r.Close() })
	return h
}

func ok(context.Context, events.Envelope, *events.JobFinished) error { return nil }

// raw publishes a body with the given headers, as a person with the nats
// CLI would.
func (h *harness) raw(t *testing.T, subject string, headers map[string]string, body string) {
	t.Helper()
	msg := nats.NewMsg(subject)
	for k, v := range headers {
		msg.Header.Set(k, v)
	}
	msg.Data = []byte(body)
	if _, err := h.b.JetStream().PublishMsg(context.Background(), msg); err != nil {
		t.Fatal(err)
	}
}

func (h *harness) wait(t *testing.T) events.Envelope {
	t.Helper()
	select {
	case env := <-h.got:
		return env
	case <-time.After(20 * time.Second):
		t.Fatal("no message handled")
	}
	return events.Envelope{}
}

// deadLetter reads the next message kept in the dead-letter stream.
func (h *harness) deadLetter(t *testing.T) jetstream.Msg {
	t.Helper()
	ctx := eventstest.Context(t, 20*time.Second)
	cons, err := h.b.JetStream().OrderedConsumer(ctx, h.b.StreamName(events.DomainDLQ), jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	m, err := cons.Next(jetstream.FetchMaxWait(20 * time.Second))
	if err != nil {
		t.Fatalf("no dead letter: %v", err)
	}
	return m
}

func TestEnvelopeFilledForBarePublisher(t *testing.T) {
	t.Parallel()
	h := start(t, ok, nil)
	h.raw(t, "toposched.jobs.finished", nil, `{"job_id":"j1","status":"succeeded"}`)
	env := h.wait(t)
	if env.Type != "io.toposched.jobs.finished.v1" || env.Subject != "j1" || env.ID == "" ||
		env.Source == "" || env.Time.IsZero() || env.CorrelationID != env.ID {
		t.Fatalf("envelope not filled in: %+v", env)
	}
}

func TestEnvelopeFromCloudEventsHeaders(t *testing.T) {
	t.Parallel()
	h := start(t, ok, nil)
	h.raw(t, "toposched.jobs.finished", map[string]string{
		"ce-specversion": "1.0", "ce-type": "io.toposched.jobs.finished.v1", "ce-source": "urn:launcher",
		"ce-id": "abc-1", "ce-time": "2026-11-29T10:00:00Z", "ce-subject": "j2", "Nats-Msg-Id": "abc-1",
	}, `{"job_id":"j2","status":"failed"}`)
	env := h.wait(t)
	want := time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)
	if env.ID != "abc-1" || env.Source != "urn:launcher" || !env.Time.Equal(want) || env.Subject != "j2" {
		t.Fatalf("envelope: %+v", env)
	}
}

func TestDuplicateCEIDHasNoSecondEffect(t *testing.T) {
	t.Parallel()
	var n atomic.Int32
	h := start(t, func(context.Context, events.Envelope, *events.JobFinished) error { n.Add(1); return nil }, nil)
	hdr := map[string]string{"ce-id": "same", "Nats-Msg-Id": "same"}
	h.raw(t, "toposched.jobs.finished", hdr, `{"job_id":"j3","status":"succeeded"}`)
	h.raw(t, "toposched.jobs.finished", hdr, `{"job_id":"j3","status":"succeeded"}`)
	h.raw(t, "toposched.jobs.finished", nil, `{"job_id":"marker","status":"succeeded"}`)
	seen := map[string]bool{h.wait(t).Subject: true, h.wait(t).Subject: true}
	if !seen["j3"] || !seen["marker"] {
		t.Fatalf("handled %v, want j3 and the marker", seen)
	}
	if got := n.Load(); got != 2 {
		t.Fatalf("handled %d messages, want 2 (the duplicate dropped)", got)
	}
}

func TestMalformedGoesToDeadLetters(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, body, wantErr string
	}{
		{"not json", `{"job_id": "j4",`, "json"},
		{"schema", `{"job_id":"j5","status":"exploded"}`, "status"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var invalid atomic.Int32
			h := start(t, ok, func(context.Context, events.Envelope, []byte, error) error { invalid.Add(1); return nil })
			h.raw(t, "toposched.jobs.finished", nil, tc.body)
			m := h.deadLetter(t)
			if string(m.Data()) != tc.body {
				t.Errorf("dead letter body %q, want the original", m.Data())
			}
			if e := m.Headers().Get(events.HeaderError); !strings.Contains(e, tc.wantErr) {
				t.Errorf("error header %q does not mention %q", e, tc.wantErr)
			}
			if s := m.Headers().Get(events.HeaderDeadSubject); s != "toposched.jobs.finished" {
				t.Errorf("dead subject header %q", s)
			}
			if invalid.Load() != 1 {
				t.Errorf("Invalid called %d times, want 1", invalid.Load())
			}
		})
	}
}

func TestPanicGoesToDeadLetters(t *testing.T) {
	t.Parallel()
	h := start(t, func(context.Context, events.Envelope, *events.JobFinished) error { panic("boom") }, nil)
	h.raw(t, "toposched.jobs.finished", nil, `{"job_id":"j6","status":"succeeded"}`)
	m := h.deadLetter(t)
	if e := m.Headers().Get(events.HeaderError); !strings.Contains(e, "boom") {
		t.Fatalf("error header %q does not carry the panic", e)
	}
}

func TestTransientErrorsAreRetried(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	h := start(t, func(context.Context, events.Envelope, *events.JobFinished) error {
		if calls.Add(1) < 3 {
			return bus.Transient(errors.New("broker away"))
		}
		return nil
	}, nil)
	h.raw(t, "toposched.jobs.finished", nil, `{"job_id":"j7","status":"succeeded"}`)
	h.wait(t)
	if calls.Load() != 3 {
		t.Fatalf("handler ran %d times, want 3", calls.Load())
	}
}

func TestPublishDerivesFromCause(t *testing.T) {
	t.Parallel()
	srv := eventstest.Server(t)
	b := eventstest.Bus(t, srv.ClientURL(), "test")
	cause := events.Envelope{ID: "cause-1", CorrelationID: "corr-1"}
	ctx := bus.WithCause(context.Background(), cause)
	a, err := b.Publish(ctx, &events.PlacementPending{JobID: "j8", Reasons: []events.Reason{{Code: "x", Message: "y"}}})
	if err != nil {
		t.Fatal(err)
	}
	again, err := b.Publish(ctx, &events.PlacementPending{JobID: "j8", Reasons: []events.Reason{{Code: "x", Message: "y"}}})
	if err != nil {
		t.Fatal(err)
	}
	if a.ID != again.ID || a.CausationID != "cause-1" || a.CorrelationID != "corr-1" {
		t.Fatalf("derived envelopes %+v and %+v", a, again)
	}
	info, err := b.JetStream().Stream(ctx, b.StreamName(events.DomainPlacement))
	if err != nil {
		t.Fatal(err)
	}
	if n := info.CachedInfo().State.Msgs; n != 1 {
		t.Fatalf("stream holds %d messages, want 1: the republished event is a duplicate", n)
	}
}

// TestPublishWithEventID: a publisher with no cause that sends an event
// again under the id it chose (a retry after a lost acknowledgement) has
// it stored once; another id is another event.
func TestPublishWithEventID(t *testing.T) {
	t.Parallel()
	srv := eventstest.Server(t)
	b := eventstest.Bus(t, srv.ClientURL(), "test")
	ctx := bus.WithEventID(context.Background(), "replay-1/finish/j9")
	ev := &events.JobFinished{JobID: "j9", Status: events.StatusSucceeded}
	a, err := b.Publish(ctx, ev)
	if err != nil {
		t.Fatal(err)
	}
	again, err := b.Publish(ctx, ev)
	if err != nil {
		t.Fatal(err)
	}
	if a.ID != "replay-1/finish/j9" || again.ID != a.ID || a.CorrelationID != a.ID || a.CausationID != "" {
		t.Fatalf("envelopes %+v and %+v", a, again)
	}
	if _, err := b.Publish(bus.WithEventID(context.Background(), "replay-1/finish/j10"), ev); err != nil {
		t.Fatal(err)
	}
	info, err := b.JetStream().Stream(ctx, b.StreamName(events.DomainJobs))
	if err != nil {
		t.Fatal(err)
	}
	if n := info.CachedInfo().State.Msgs; n != 2 {
		t.Fatalf("stream holds %d messages, want 2: the event sent again is a duplicate, the other id another event", n)
	}
}

func TestReplayReadsInOrder(t *testing.T) {
	t.Parallel()
	srv := eventstest.Server(t)
	b := eventstest.Bus(t, srv.ClientURL(), "test")
	ctx := eventstest.Context(t, 30*time.Second)
	for _, id := range []string{"a", "b", "c"} {
		if _, err := b.Publish(ctx, &events.JobFinished{JobID: id, Status: "succeeded"}); err != nil {
			t.Fatal(err)
		}
	}
	var got []string
	err := b.Replay(ctx, events.DomainJobs, []string{b.Subjects.Of(events.NameJobFinished)}, func(r bus.Record) error {
		got = append(got, r.Env.Subject)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(got, "") != "abc" {
		t.Fatalf("replayed %v", got)
	}
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	err := bus.Config{Prefix: "a.b", Replicas: 9}.Validate()
	for _, want := range []string{"nats url", "prefix", "replicas"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate() = %v, want it to name %s", err, want)
		}
	}
}

// A replay whose messages go away while it reads (a stream's limits, or a
// purge) ends with what is left, rather than fetching for ever: before, the
// count taken at its start was waited for without end, and a fetch that
// brought nothing was asked again with no deadline (the cluster e2e's
// rebuild that hung after "lease taken").
func TestReplayEndsWhenMessagesGoAway(t *testing.T) {
	t.Parallel()
	srv := eventstest.Server(t)
	ctx := eventstest.Context(t, 60*time.Second)
	b, err := bus.Connect(ctx, bus.Config{URL: srv.ClientURL(), Source: "urn:toposched:test",
		Transport: bus.Transport{ReplayFetchSize: 1, SetupRetryInitial: 10 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	for _, id := range []string{"a", "b", "c", "d"} {
		if _, err := b.Publish(ctx, &events.JobFinished{JobID: id, Status: "succeeded"}); err != nil {
			t.Fatal(err)
		}
	}
	st, err := b.JetStream().Stream(ctx, b.StreamName(events.DomainJobs))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	err = b.Replay(ctx, events.DomainJobs, []string{b.Subjects.Of(events.NameJobFinished)}, func(r bus.Record) error {
		got = append(got, r.Env.Subject)
		if len(got) == 1 {
			return st.Purge(ctx)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(got, "") != "a" {
		t.Fatalf("replayed %v, want only what was read before the purge", got)
	}
}

// Replays leave no consumer behind: placement catches up with the
// topology stream before every rejection, and the server allows 1,000
// consumers a stream (a Philly replay's rejections reached it while each
// replay's consumer stayed for five minutes). A catch-up with nothing
// new makes none at all.
func TestReplaysLeaveNoConsumers(t *testing.T) {
	t.Parallel()
	srv := eventstest.Server(t)
	b := eventstest.Bus(t, srv.ClientURL(), "test")
	ctx := eventstest.Context(t, 30*time.Second)
	var last uint64
	for _, id := range []string{"a", "b"} {
		_, seq, err := b.PublishSeq(ctx, &events.JobFinished{JobID: id, Status: "succeeded"})
		if err != nil {
			t.Fatal(err)
		}
		last = seq
	}
	subjects := []string{b.Subjects.Of(events.NameJobFinished)}
	for i := range 20 {
		read := 0
		after := uint64(0)
		if i%2 == 1 {
			after = last // a catch-up that finds nothing new
		}
		if err := b.ReplayFrom(ctx, events.DomainJobs, subjects, after, func(bus.Record) error { read++; return nil }); err != nil {
			t.Fatal(err)
		}
		if want := map[bool]int{true: 0, false: 2}[after > 0]; read != want {
			t.Fatalf("replay %d after %d read %d, want %d", i, after, read, want)
		}
	}
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	s, err := js.Stream(ctx, b.StreamName(events.DomainJobs))
	if err != nil {
		t.Fatal(err)
	}
	if n := s.CachedInfo().State.Consumers; n != 0 {
		t.Fatalf("%d consumers left on the stream after 20 replays, want 0", n)
	}
}
