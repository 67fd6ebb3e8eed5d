package bus_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/events/bus"
	"github.com/toposched/toposched/events/eventstest"
)

// TestMirror: what was stored before Rebuild is rebuilt, what was stored
// between Rebuild and Follow and after Follow is followed, each once, in
// each stream's order.
func TestMirror(t *testing.T) {
	t.Parallel()
	srv := eventstest.Server(t)
	b := eventstest.Bus(t, srv.ClientURL(), "test")
	ctx := eventstest.Context(t, 30*time.Second)
	finished := func(id string) *events.JobFinished {
		return &events.JobFinished{JobID: id, Status: events.StatusSucceeded, Reason: events.ReasonRanksExited}
	}
	publish := func(evs ...any) {
		t.Helper()
		for _, ev := range evs {
			if _, err := b.Publish(ctx, ev); err != nil {
				t.Fatal(err)
			}
		}
	}
	name := func(r bus.Record) string {
		if r.Name == events.NameJobFinished {
			return "job-" + r.Env.Subject
		}
		return "policy-" + r.Env.Subject[:1]
	}
	m := &bus.Mirror{Bus: b, Sources: []bus.Source{
		{Domain: events.DomainPolicy, Names: []events.Name{events.NamePolicyRejected}},
		{Domain: events.DomainJobs, Names: []events.Name{events.NameJobFinished}},
	}}
	if err := m.Follow(ctx, make(chan struct{}), func(bus.Record) {}); err == nil {
		t.Fatal("Follow before Rebuild: no error")
	}
	publish(rejected(rev('a')), finished("j1"))
	var rebuilt []string
	if err := m.Rebuild(ctx, func(r bus.Record) { rebuilt = append(rebuilt, name(r)) }); err != nil {
		t.Fatal(err)
	}
	if want := []string{"policy-a", "job-j1"}; !slices.Equal(rebuilt, want) {
		t.Fatalf("rebuilt %v, want %v", rebuilt, want)
	}
	publish(rejected(rev('b')), finished("j2"))

	var mu sync.Mutex
	var followed []string
	all := make(chan struct{})
	fctx, cancel := context.WithCancel(ctx)
	ready := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- m.Follow(fctx, ready, func(r bus.Record) {
			mu.Lock()
			defer mu.Unlock()
			followed = append(followed, name(r))
			if len(followed) == 4 {
				close(all)
			}
		})
	}()
	<-ready
	publish(rejected(rev('c')), finished("j3"))
	select {
	case <-all:
	case err := <-done:
		t.Fatalf("Follow ended: %v", err)
	case <-ctx.Done():
		t.Fatalf("followed only %v", followed)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Follow after its context ended: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	var policy, jobs []string
	for _, f := range followed {
		if f[:3] == "job" {
			jobs = append(jobs, f)
		} else {
			policy = append(policy, f)
		}
	}
	if !slices.Equal(policy, []string{"policy-b", "policy-c"}) || !slices.Equal(jobs, []string{"job-j2", "job-j3"}) {
		t.Fatalf("followed %v, want b then c and j2 then j3, each once", followed)
	}
}
