package operator

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/events/bus"
	"github.com/toposched/toposched/events/eventstest"
	"github.com/toposched/toposched/internal/client"
	"github.com/toposched/toposched/internal/topology"
	"github.com/toposched/toposched/services/discovery"
	"github.com/toposched/toposched/services/optimizer"
	"github.com/toposched/toposched/services/placement"
)

const leaseCluster = `name: lease
nodes:
  - {name: n, count: 2, gpus: 8, gpu_model: A100}
`

// outcomes follows the placement stream from its start.
type outcomes struct {
	mu      sync.Mutex
	byJob   map[string][]client.Outcome
	changed chan struct{}
}

func watchOutcomes(t *testing.T, b *bus.Bus) *outcomes {
	t.Helper()
	o := &outcomes{byJob: map[string][]client.Outcome{}, changed: make(chan struct{}, 1)}
	ctx, cancel := context.WithCancel(context.Background())
	ready, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		_ = client.Watch(ctx, b, client.FromStart, ready, func(oc client.Outcome) error {
			o.mu.Lock()
			o.byJob[oc.JobID()] = append(o.byJob[oc.JobID()], oc)
			o.mu.Unlock()
			select {
			case o.changed <- struct{}{}:
			default:
			}
			return nil
		})
	}()
	<-ready
	t.Cleanup(func() { cancel(); <-done })
	return o
}

// until waits for cond, checked on every outcome and every 50 ms (for
// conditions on a replica's lease).
func (o *outcomes) until(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.After(30 * time.Second)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-o.changed:
		case <-tick.C:
		case <-deadline:
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// counts is how many jobs of ids have each kind of outcome.
func (o *outcomes) counts(ids []string) (decided, pending int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, id := range ids {
		for _, oc := range o.byJob[id] {
			switch {
			case oc.Decided != nil:
				decided++
			case oc.Pending != nil:
				pending++
			}
		}
	}
	return decided, pending
}

func submitJobs(t *testing.T, b *bus.Bus, prefix string, n, gpus int) []string {
	t.Helper()
	var ids []string
	for i := range n {
		id := fmt.Sprintf("%s-%d", prefix, i)
		if _, err := client.Submit(eventstest.Context(t, 10*time.Second), b, &events.JobSubmitted{JobID: id, GPUs: gpus}); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	return ids
}

// auditLog replays the placement stream: no job decided twice, no GPU in
// two live decisions.
func auditLog(t *testing.T, b *bus.Bus) (decided int) {
	t.Helper()
	holder := map[string]string{}
	seen := map[string]bool{}
	err := b.Replay(eventstest.Context(t, 10*time.Second), "placement", []string{b.Subjects.Domain(events.DomainPlacement)}, func(r bus.Record) error {
		switch r.Name {
		case events.NamePlacementDecided:
			var d events.PlacementDecided
			if err := bus.Decode(r.Name, r.Body, &d); err != nil {
				return err
			}
			if seen[d.JobID] {
				t.Errorf("job %s decided twice (#%d)", d.JobID, r.Seq)
			}
			seen[d.JobID] = true
			decided++
			for _, rk := range d.Ranks {
				g := fmt.Sprintf("%s/%d", rk.Node, rk.GPU)
				if other, ok := holder[g]; ok {
					t.Errorf("GPU %s given to %s (#%d) while %s holds it", g, d.JobID, r.Seq, other)
				}
				holder[g] = d.JobID
			}
		case events.NamePlacementReleased:
			var rel events.PlacementReleased
			if err := bus.Decode(r.Name, r.Body, &rel); err != nil {
				return err
			}
			for g, j := range holder {
				if j == rel.JobID {
					delete(holder, g)
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return decided
}

func role(o *Operator) Role {
	st, _ := o.LeaderStatus()
	return st.Role
}

// TestPlacementLeaseFailover runs two placement replicas: one leads, the
// other stands by. The leader loses NATS as a crashed process would (its
// connection closes, nothing is released); the standby takes the lease
// once it lapses, rebuilds from the streams and carries on, and no GPU is
// given twice.
func TestPlacementLeaseFailover(t *testing.T) {
	srv := eventstest.Server(t)
	url := srv.ClientURL()
	dir := t.TempDir()
	file := filepath.Join(dir, "cluster.yaml")
	if err := os.WriteFile(file, []byte(leaseCluster), 0o600); err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.DiscardHandler)
	ctx := eventstest.Context(t, 60*time.Second)

	front := eventstest.Bus(t, url, "front")
	if _, _, err := StartOn(t, ctx, front, Config{Services: []string{Discovery, Analysis}, Discovery: discovery.Config{ClusterFile: file}}, log); err != nil {
		t.Fatal(err)
	}

	replica := func(name string) (*Operator, *bus.Bus) {
		b := eventstest.Bus(t, url, name)
		op, _, err := StartOn(t, ctx, b, Config{Services: []string{Placement}, Replica: name, Policies: PoliciesNone, LeaseTTL: time.Second}, log)
		if err != nil {
			t.Fatal(err)
		}
		return op, b
	}
	r1, b1 := replica("r1")
	r2, _ := replica("r2")
	if role(r1) != RoleLeader || r1.PlacementService() == nil {
		t.Fatalf("r1: %+v, want leader with a service", r1.lease.Load().Status())
	}
	if st, _ := r2.LeaderStatus(); st.Role != RoleStandby || st.Holder != "r1" || r2.PlacementService() != nil {
		t.Fatalf("r2: %+v, want standby behind r1 with no service", st)
	}

	o := watchOutcomes(t, front)
	first := submitJobs(t, front, "before", 4, 2)
	o.until(t, "4 decisions from r1", func() bool { d, _ := o.counts(first); return d == 4 })

	// r1 crashes: its connection goes, its lease stays until it lapses.
	b1.Conn().Close()
	o.until(t, "r2 to lead", func() bool { return role(r2) == RoleLeader && r2.PlacementService() != nil })
	o.until(t, "r1 to step down", func() bool { return role(r1) != RoleLeader })

	// r2 rebuilt r1's allocations: 8 GPUs are left, so four more jobs of
	// two fit and a fifth waits.
	second := submitJobs(t, front, "after", 5, 2)
	o.until(t, "4 more decisions and 1 wait from r2", func() bool {
		d, p := o.counts(second)
		return d == 4 && p == 1
	})
	if free := r2.PlacementService().Store().Snapshot().FreeCount(); free != 0 {
		t.Errorf("r2 sees %d GPUs free, want 0", free)
	}
	if n := auditLog(t, front); n != 8 {
		t.Errorf("%d decisions in the log, want 8", n)
	}
}

// TestPlacementLeaseHandover stops the leader gracefully: it releases the
// lease, so the standby leads long before the (one minute) TTL.
func TestPlacementLeaseHandover(t *testing.T) {
	srv := eventstest.Server(t)
	log := slog.New(slog.DiscardHandler)
	ctx := eventstest.Context(t, 30*time.Second)
	start := func(name string) (*Operator, func() error) {
		op, stop, err := StartOn(t, ctx, eventstest.Bus(t, srv.ClientURL(), name),
			Config{Services: []string{Placement}, Replica: name, Policies: PoliciesNone, LeaseTTL: time.Minute}, log)
		if err != nil {
			t.Fatal(err)
		}
		return op, stop
	}
	r1, stop1 := start("r1")
	r2, stop2 := start("r2")
	if role(r1) != RoleLeader || role(r2) != RoleStandby {
		t.Fatalf("roles %q and %q, want leader and standby", role(r1), role(r2))
	}
	began := time.Now()
	if err := stop1(); err != nil {
		t.Fatal(err)
	}
	deadline := time.After(20 * time.Second)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for role(r2) != RoleLeader {
		select {
		case <-tick.C:
		case <-deadline:
			t.Fatalf("r2 still %q 20s after r1 stopped", role(r2))
		}
	}
	if d := time.Since(began); d > 10*time.Second {
		t.Errorf("handover took %s", d)
	}
	// A lease left by a process that died under the name "ghost": a
	// replica restarted under that name takes it back at once.
	if err := stop2(); err != nil {
		t.Fatal(err)
	}
	b := eventstest.Bus(t, srv.ClientURL(), "ghost-writer")
	kv, err := ensureLeaseKV(ctx, b, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Create(ctx, LeaseKey, []byte(`{"holder":"ghost"}`)); err != nil {
		t.Fatal(err)
	}
	if r, _ := start("other"); role(r) != RoleStandby {
		t.Fatalf("another name with the ghost's lease: %q, want standby", role(r))
	}
	if r, _ := start("ghost"); role(r) != RoleLeader {
		t.Fatalf("the ghost restarted: %q, want leader", role(r))
	}
}

func TestLeaseConfig(t *testing.T) {
	for _, tc := range []struct {
		ttl time.Duration
		ok  bool
	}{{0, true}, {time.Second, true}, {100 * time.Millisecond, false}, {-time.Second, false}} {
		err := Config{Services: []string{Placement}, LeaseTTL: tc.ttl}.Validate()
		if (err == nil) != tc.ok {
			t.Errorf("ttl %s: err %v, want ok=%v", tc.ttl, err, tc.ok)
		}
	}
}

// TestConfigValidate: a configuration is refused before anything starts,
// the nested services' fields included (a bad stretch bound on a replica
// with a lease used to fail only its terms' starts, and the replica
// campaigned on with warnings), and so are the fields the operator sets
// itself, which it would otherwise silently replace.
func TestConfigValidate(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		cfg  Config
		want string // "" when valid
	}{
		{"placement alone", Config{Services: []string{Placement}}, ""},
		{"every service", Config{Services: All, Discovery: discovery.Config{ClusterFile: "c.yaml"}}, ""},
		{"unknown strategy", Config{Services: []string{Placement}, Placement: placement.Config{Strategy: "nope"}}, "nope"},
		{"stretch below 1", Config{Services: []string{Placement}, Placement: placement.Config{MaxStretch: 0.5}}, "max stretch 0.5"},
		{"no cluster file", Config{Services: []string{Discovery}}, "cluster file: required by discovery"},
		{"placement's policies", Config{Services: []string{Placement}, Placement: placement.Config{Holder: "x"}}, "are the operator's"},
		{"optimizer's bandwidths", Config{Services: []string{Optimizer}, Optimizer: optimizer.Config{Bandwidths: &topology.Bandwidths{}}}, "are the operator's"},
	} {
		err := tc.cfg.Validate()
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: err %v, want one naming %q", tc.name, err, tc.want)
		}
	}
}

// fakeTerm is a term that runs until stopped.
type fakeTerm struct{ ended chan struct{} }

func (f fakeTerm) done() <-chan struct{} { return f.ended }
func (f fakeTerm) stop() error           { return nil }

// A term whose start outlasts the lease (a rebuild of big streams on a
// busy machine, or one slowed by a node's death) keeps the lease: it is
// renewed while the start runs. Before, nothing renewed it until the start
// returned, so it lapsed under a slow start, and a start that hung left it
// lapsed with the replica blocked (the cluster e2e saw no holder for a minute).
func TestLeaseRenewedWhileTermStarts(t *testing.T) {
	t.Parallel()
	srv := eventstest.Server(t)
	b := eventstest.Bus(t, srv.ClientURL(), "test")
	ctx := eventstest.Context(t, 60*time.Second)
	// Not MinLeaseTTL: its renewals, every 100 ms, are lost after 250 ms
	// without one, which a busy two-core machine outlasts; the lease is
	// then lost, as it should be, and the start told so (its context
	// ends), not what this test is about.
	ttl := 4 * time.Second
	kv, err := ensureLeaseKV(ctx, b, ttl)
	if err != nil {
		t.Fatal(err)
	}
	l := &lease{kv: kv, key: LeaseKey, holder: "slow", ttl: ttl, log: slog.New(slog.DiscardHandler)}
	var first uint64
	l.start = func(ctx context.Context, rev uint64) (term, error) {
		first = rev
		// Wait, as a slow rebuild would, for four renewals: four TTLs'
		// worth of renewal intervals.
		w, err := kv.Watch(ctx, LeaseKey, jetstream.UpdatesOnly())
		if err != nil {
			return nil, err
		}
		defer func() { _ = w.Stop() }()
		for seen := 0; seen < 4; {
			select {
			case e, ok := <-w.Updates():
				if !ok {
					// The watch ends with ctx: the lease was lost.
					return nil, fmt.Errorf("the watch ended after %d renewals: %w", seen, context.Cause(ctx))
				}
				if e != nil && e.Operation() == jetstream.KeyValuePut && e.Revision() > rev {
					seen++
				}
			case <-ctx.Done():
				return nil, fmt.Errorf("the start was ended after %d renewals: %w", seen, context.Cause(ctx))
			case <-time.After(4 * ttl):
				return nil, fmt.Errorf("no renewal within %s while starting (%d seen)", 4*ttl, seen)
			}
		}
		return fakeTerm{make(chan struct{})}, nil
	}
	rev, _, tm, cancel, err := l.acquireOnce(ctx)
	if err != nil {
		t.Fatalf("acquire: %v", err)
	}
	defer cancel()
	if tm == nil || rev <= first {
		t.Fatalf("term %v, revision %d after a start at revision %d", tm, rev, first)
	}
	e, err := kv.Get(ctx, LeaseKey)
	if err != nil || e.Revision() != rev {
		t.Fatalf("lease entry %v (%v), want revision %d", e, err, rev)
	}
}

// A lease bucket deleted under a running leader (an administrator's
// cleanup, a stream purge) is made again: the leader loses its renewals,
// steps down, and the next campaign recreates the bucket and leads again.
// Before, every campaign after the deletion failed and placement had no
// applier until a restart.
func TestLeaseBucketDeletedIsMadeAgain(t *testing.T) {
	t.Parallel()
	srv := eventstest.Server(t)
	b := eventstest.Bus(t, srv.ClientURL(), "test")
	ctx := eventstest.Context(t, 60*time.Second)
	ttl := 2 * time.Second
	kv, err := ensureLeaseKV(ctx, b, ttl)
	if err != nil {
		t.Fatal(err)
	}
	changes := make(chan LeaderStatus, 64)
	l := &lease{kv: kv, key: LeaseKey, holder: "only", ttl: ttl, log: slog.New(slog.DiscardHandler),
		start:    func(context.Context, uint64) (term, error) { return fakeTerm{make(chan struct{})}, nil },
		onChange: func(s LeaderStatus) { changes <- s },
		reopen:   func(ctx context.Context) (jetstream.KeyValue, bool, error) { return reopenLeaseKV(ctx, b, ttl) },
	}
	rev, sent, tm, cancel, err := l.acquireOnce(ctx)
	if err != nil || tm == nil {
		t.Fatalf("first campaign: term %v, %v", tm, err)
	}
	if s := <-changes; s.Role != RoleLeader || s.Terms != 1 {
		t.Fatalf("first status %+v", s)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); l.run(runCtx, nil, rev, sent, tm, cancel) }()
	defer func() { stop(); <-done }()
	if err := b.JetStream().DeleteKeyValue(ctx, LeaseBucket(b.Subjects.Prefix)); err != nil {
		t.Fatal(err)
	}
	for {
		select {
		case s := <-changes:
			if s.Role != RoleLeader {
				continue
			}
			if s.Terms != 2 {
				t.Fatalf("status %+v, want a second term", s)
			}
			kv, err := b.JetStream().KeyValue(ctx, LeaseBucket(b.Subjects.Prefix))
			if err != nil {
				t.Fatalf("the bucket was not made again: %v", err)
			}
			if e, err := kv.Get(ctx, LeaseKey); err != nil || !strings.Contains(string(e.Value()), `"only"`) {
				t.Fatalf("lease %v (%v), want held by this replica", e, err)
			}
			return
		case <-ctx.Done():
			t.Fatal("no second term after the bucket was deleted")
		}
	}
}
