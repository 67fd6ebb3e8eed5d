package placement_test

import (
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/events/bus"
	"github.com/toposched/toposched/events/eventstest"
	"github.com/toposched/toposched/internal/fixtures"
	"github.com/toposched/toposched/internal/store"
	"github.com/toposched/toposched/services/placement"
)

// A finish or a migration acceptance that names a job but cannot be read
// is answered on the job's subject (placement.finish_refused,
// placement.migration_refused) with every field and rule that failed, and
// kept in the dead letters; the job keeps its GPUs. Before, both went to
// the dead letters alone, and the sender heard nothing.
func TestMalformedFinishAndAcceptAreAnswered(t *testing.T) {
	t.Parallel()
	srv := eventstest.Server(t)
	b := eventstest.Bus(t, srv.ClientURL(), "test")
	ctx := eventstest.Context(t, 60*time.Second)
	n := fixtures.PlainNode("n1", "A100", 8)
	if _, err := b.Publish(ctx, &n); err != nil {
		t.Fatal(err)
	}
	s := placement.NewOnBus(t, b, placement.Config{})
	rctx := run(t, ctx, s)

	var mu sync.Mutex
	answers := map[events.Name][]bus.Record{}
	got := make(chan struct{}, 16)
	ready := make(chan struct{})
	go func() {
		_ = b.Follow(rctx, events.DomainPlacement, []string{b.Subjects.Domain(events.DomainPlacement)}, ready, func(r bus.Record) error {
			mu.Lock()
			answers[r.Name] = append(answers[r.Name], r)
			mu.Unlock()
			got <- struct{}{}
			return nil
		})
	}()
	<-ready
	dead := make(chan struct{}, 16)
	deadReady := make(chan struct{})
	go func() {
		_ = b.Follow(rctx, events.DomainDLQ, []string{b.Subjects.DeadLetter()}, deadReady, func(bus.Record) error {
			dead <- struct{}{}
			return nil
		})
	}()
	<-deadReady
	await := func(name events.Name, count int) []bus.Record {
		t.Helper()
		for {
			mu.Lock()
			rs := answers[name]
			mu.Unlock()
			if len(rs) >= count {
				return rs
			}
			select {
			case <-got:
			case <-ctx.Done():
				t.Fatalf("no %s", name)
			}
		}
	}
	if _, err := b.Publish(ctx, analyzed(t, events.JobSubmitted{JobID: "j1", GPUs: 2})); err != nil {
		t.Fatal(err)
	}
	await(events.NamePlacementDecided, 1)

	raw := func(name events.Name, headers map[string]string, body string) {
		t.Helper()
		msg := nats.NewMsg(b.Subjects.Of(name))
		for k, v := range headers {
			msg.Header.Set(k, v)
		}
		msg.Data = []byte(body)
		if _, err := b.JetStream().PublishMsg(ctx, msg); err != nil {
			t.Fatal(err)
		}
	}
	for i, tc := range []struct {
		name    events.Name
		headers map[string]string
		body    string
		answer  events.Name
		code    string
		says    string
	}{
		{events.NameJobFinished, nil, `{"job_id":"j1","status":"done"}`, events.NamePlacementFinishRefused, "schema_enum", "status"},
		{events.NameJobFinished, map[string]string{"ce-type": events.NameJobSubmitted.CEType()}, `{"job_id":"j1","status":"succeeded"}`,
			events.NamePlacementFinishRefused, "wrong_event_type", "another event's type"},
		{events.NameJobMigrationAccepted, nil, `{"job_id":"j1","proposal_id":7}`, events.NamePlacementMigrationRefused, "schema_type", "proposal_id"},
	} {
		before := len(answers[tc.answer])
		raw(tc.name, tc.headers, tc.body)
		rs := await(tc.answer, before+1)
		r := rs[len(rs)-1]
		if r.Env.Subject != "j1" {
			t.Errorf("case %d: answer about %q, want j1", i, r.Env.Subject)
		}
		v := tc.answer.New()
		if err := b.Decode(tc.answer, r.Body, v); err != nil {
			t.Fatal(err)
		}
		var reasons []events.Reason
		switch a := v.(type) {
		case *events.PlacementFinishRefused:
			reasons = a.Reasons
		case *events.PlacementMigrationRefused:
			reasons = a.Reasons
		}
		if len(reasons) == 0 || reasons[0].Code != tc.code || !strings.Contains(reasons[0].Message, tc.says) {
			t.Errorf("case %d: reasons %+v, want %s saying %q", i, reasons, tc.code, tc.says)
		}
	}
	for range 3 {
		select {
		case <-dead:
		case <-ctx.Done():
			t.Fatal("the malformed messages are not all in the dead letters")
		}
	}
	if j, _ := s.Store().Snapshot().Job("j1"); j.State != store.JobPlaced {
		t.Fatalf("j1 is %s after malformed finishes, want still placed", j.State)
	}
	if len(answers[events.NamePlacementReleased]) != 0 {
		t.Fatal("a malformed finish released the job")
	}
}
