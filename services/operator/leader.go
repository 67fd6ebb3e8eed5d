package operator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toposched/toposched/events/bus"
	"github.com/toposched/toposched/services/placement"
)

// Placement replicas and the single applier.
//
// Placement decides on its own in-memory store, one job at a time, and its
// stream is the log of what it allocated. Two replicas sharing the durable
// consumers would each take half the jobs and allocate from stores that do
// not see each other's decisions: they would give one GPU to two jobs. So
// only one replica applies decisions at a time: the holder of a lease in the
// NATS KV bucket <prefix>-leases, key "placement". The others are standbys:
// they keep their connection, their policy loop and their readiness, and
// try to take the lease every renewal interval. A replica that takes it
// builds a fresh placement service, rebuilds it from the streams (which hold
// every decision its predecessor published) and only then starts the
// handlers; one that loses it closes its handlers (in-flight ones finish,
// untaken messages stay in the streams) and goes back to standby.
//
// Why a single applier rather than partitioned ownership of topology
// domains: a job may span any domain (a gang over leaves and pods), the
// policies and the reservation for the head of the queue look at the whole
// cluster, and the pending queue is global; partitions would need a
// cross-partition protocol for exactly the jobs that matter most. One
// applier keeps placement's decision code unchanged, and measured decisions
// take milliseconds, so one replica is not the bottleneck of a cluster's
// job rate. Standbys bound failover time, not throughput.
//
// The lease is a KV entry whose bucket expires entries after TTL (the
// bucket's MaxAge). The leader renews it every TTL/5 with a compare-and-set
// on the revision it last wrote, so a renewal never overwrites another
// holder. It steps down when a renewal is refused, or when none has
// succeeded for TTL/2 (measured from before the request was sent, so the
// server-side expiry cannot come first); the entry cannot expire, and no
// standby can take it, before TTL after that request. The remaining half of
// the TTL is the margin for the handler in flight to finish. A handler
// blocked longer than that (a publish stalled through a broker outage) is
// not fenced: see docs/operations.md, "Placement replicas".
//
// A replica restarted under the same name (--replica, such as a pod name)
// takes its own lease back at once instead of waiting for it to lapse: a
// name is held by one live process at a time.

// LeaseKey is the lease of placement's single applier.
const LeaseKey = "placement"

// DefaultLeaseTTL is how long a lease outlives its holder's last renewal.
const DefaultLeaseTTL = 10 * time.Second

// MinLeaseTTL is the shortest TTL a lease may have: renewals every TTL/5
// must fit a round trip to a loaded server.
const MinLeaseTTL = 500 * time.Millisecond

// leaseReleaseTimeout bounds the delete that hands a lease back on the way
// out; when it runs out, the lease lapses after its TTL instead.
const leaseReleaseTimeout = 2 * time.Second

// LeaseBucket is the KV bucket of the leases under a subject prefix.
func LeaseBucket(prefix string) string {
	clean := strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' {
			return r
		}
		return '_'
	}, prefix)
	return clean + "-leases"
}

// Role is what a placement replica is now.
type Role string

// Roles.
const (
	RoleUnknown Role = ""        // not yet known whether anyone leads
	RoleLeader  Role = "leader"  // this replica applies decisions
	RoleStandby Role = "standby" // another replica, named in LeaderStatus, does
)

// LeaderStatus is a replica's view of the lease.
type LeaderStatus struct {
	Role Role
	// Holder is the replica holding the lease, when known.
	Holder string
	// Since is when this replica took its role.
	Since time.Time
	// Terms counts the terms this replica has led.
	Terms int
}

// leaseValue is what the KV entry holds.
type leaseValue struct {
	Holder   string    `json:"holder"`
	Acquired time.Time `json:"acquired"`
}

// term is what a replica runs while it holds the lease: done is closed if
// it ends on its own (its handlers failed), stop ends it.
type term interface {
	done() <-chan struct{}
	stop() error
}

// lease campaigns for one key and runs a term while it holds it.
type lease struct {
	kv     jetstream.KeyValue
	key    string
	holder string
	ttl    time.Duration
	log    *slog.Logger
	// start begins a term; ctx ends with the term.
	start func(ctx context.Context, rev uint64) (term, error)
	// onChange, if set, is told every change of status.
	onChange func(LeaderStatus)
	// alive reports whether the connection the term works over is up: the
	// lease renews over a connection of its own, and must lapse when the
	// work cannot go on (nil: always up).
	alive func() bool
	// reopen makes the lease bucket again where it is gone (reopenLeaseKV)
	// and says whether it was; a failed campaign calls it (nil: never).
	reopen func(ctx context.Context) (kv jetstream.KeyValue, made bool, err error)

	mu     sync.Mutex
	status LeaderStatus
}

// ensureLeaseKV creates or updates the lease bucket: one value per key,
// expired ttl after its last write.
func ensureLeaseKV(ctx context.Context, b *bus.Bus, ttl time.Duration) (jetstream.KeyValue, error) {
	cfg := jetstream.KeyValueConfig{
		Bucket:      LeaseBucket(b.Subjects.Prefix),
		Description: "toposched leases: the replica holding key " + LeaseKey + " is placement's single applier",
		History:     1,
		TTL:         ttl,
		Storage:     jetstream.FileStorage,
		Replicas:    max(b.Replicas(), 1),
	}
	var kv jetstream.KeyValue
	err := bus.RetryJetStream(ctx, func(ctx context.Context) error {
		var err error
		kv, err = b.JetStream().CreateOrUpdateKeyValue(ctx, cfg)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("lease bucket %s: %w", cfg.Bucket, err)
	}
	return kv, nil
}

// reopenLeaseKV makes the lease bucket of b again if it is gone, and says
// whether it was.
func reopenLeaseKV(ctx context.Context, b *bus.Bus, ttl time.Duration) (jetstream.KeyValue, bool, error) {
	kv, err := b.JetStream().KeyValue(ctx, LeaseBucket(b.Subjects.Prefix))
	if !errors.Is(err, jetstream.ErrBucketNotFound) {
		return kv, false, err
	}
	kv, err = ensureLeaseKV(ctx, b, ttl)
	return kv, err == nil, err
}

func (l *lease) renewEvery() time.Duration { return l.ttl / 5 }

// Status is the replica's current view.
func (l *lease) Status() LeaderStatus {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.status
}

func (l *lease) set(role Role, holder string) {
	l.mu.Lock()
	changed := l.status.Role != role || l.status.Holder != holder
	if l.status.Role != role {
		l.status.Since = time.Now()
	}
	l.status.Role, l.status.Holder = role, holder
	if role == RoleLeader && changed {
		l.status.Terms++
	}
	st := l.status
	l.mu.Unlock()
	if changed && l.onChange != nil {
		l.onChange(st)
	}
}

// tryAcquire takes the lease if it is free (or ours from a previous life)
// and returns its revision; 0 when another replica holds it.
func (l *lease) tryAcquire(ctx context.Context) (uint64, error) {
	if l.alive != nil && !l.alive() {
		return 0, fmt.Errorf("take lease %s: the services' connection is down", l.key)
	}
	val, err := json.Marshal(leaseValue{Holder: l.holder, Acquired: time.Now().UTC()})
	if err != nil {
		return 0, err
	}
	rev, err := l.kv.Create(ctx, l.key, val)
	if err == nil {
		return rev, nil
	}
	if !errors.Is(err, jetstream.ErrKeyExists) {
		return 0, fmt.Errorf("take lease %s: %w", l.key, err)
	}
	e, err := l.kv.Get(ctx, l.key)
	if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
		return 0, nil // lapsed meanwhile: the next try takes it
	}
	if err != nil {
		return 0, fmt.Errorf("read lease %s: %w", l.key, err)
	}
	var cur leaseValue
	_ = json.Unmarshal(e.Value(), &cur)
	if cur.Holder == l.holder {
		// Our own name: the process that held it is gone.
		rev, err := l.kv.Update(ctx, l.key, val, e.Revision())
		if err != nil {
			return 0, nil // changed meanwhile: someone else has it
		}
		l.log.Info("lease held under this replica's name by a previous process; taken back", "key", l.key)
		return rev, nil
	}
	l.set(RoleStandby, cur.Holder)
	return 0, nil
}

// acquireOnce tries once; when it gets the lease it starts a term.
func (l *lease) acquireOnce(ctx context.Context) (rev uint64, sent time.Time, t term, termCancel context.CancelFunc, err error) {
	sent = time.Now()
	actx, cancel := context.WithTimeout(ctx, l.renewEvery())
	rev, err = l.tryAcquire(actx)
	cancel()
	if err != nil && l.reopen != nil && ctx.Err() == nil && (l.alive == nil || l.alive()) {
		// A bucket deleted under the replicas (an administrator's
		// cleanup) fails every campaign, and placement would have no
		// applier until a restart. A write to it does not fail fast (no
		// stream answers, and the client retries until the deadline), so
		// the bucket is looked up after any failed campaign. Placement's
		// writes are fenced on its stream, not by the lease's revision,
		// so a bucket made again starts no second writer. Not while the
		// connection is down (nothing would answer), and bounded as the
		// campaign is, so the next tick comes on time.
		rctx, cancel := context.WithTimeout(ctx, l.renewEvery())
		kv, made, rerr := l.reopen(rctx)
		cancel()
		switch {
		case rerr != nil:
			err = errors.Join(err, fmt.Errorf("look up the lease bucket: %w", rerr))
		default:
			// The handle looked up, also where an earlier try made the
			// bucket and timed out before it could say so.
			l.kv = kv
			if made {
				l.log.Warn("lease bucket was gone; made again", "key", l.key)
			}
		}
	}
	if err != nil || rev == 0 {
		return 0, sent, nil, nil, err
	}
	l.set(RoleLeader, l.holder)
	l.log.Info("lease taken: this replica leads", "key", l.key, "holder", l.holder, "revision", rev)
	termCtx, termCancel := context.WithCancel(ctx)
	// The start rebuilds from the streams, which on a busy machine or
	// after a node's death can take longer than the lease lives: it is
	// renewed meanwhile (before, it lapsed under a start that took long,
	// and a start that hung left the lease lapsed and the replica blocked).
	stopRenewing := l.renewDuring(termCtx, rev, sent, termCancel)
	t, err = l.start(termCtx, rev)
	rev0 := rev
	rev, sent, lost := stopRenewing()
	if err == nil && lost != "" {
		err = errors.New("lease lost while starting: " + lost)
		termCancel()
		if serr := t.stop(); serr != nil && !errors.Is(serr, bus.ErrFenced) {
			err = errors.Join(err, serr)
		}
	}
	if err != nil {
		termCancel()
		if lost == "" {
			l.release(context.WithoutCancel(ctx), rev)
		}
		l.set(RoleUnknown, "")
		return 0, sent, nil, nil, fmt.Errorf("start placement after taking the lease (revision %d): %w", rev0, err)
	}
	return rev, sent, t, termCancel, nil
}

// renewDuring renews the lease (revision rev, last written at sent) every
// renewal interval until the returned stop is called, which gives back the
// revision and time of the last renewal, and why the lease was lost ("" if
// it was not). On a loss it calls lost, the term's cancel, so that a start
// still running gives up.
func (l *lease) renewDuring(ctx context.Context, rev uint64, sent time.Time, lost context.CancelFunc) (stop func() (uint64, time.Time, string)) {
	done := make(chan struct{})
	var (
		mu  sync.Mutex
		why string
	)
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		tick := time.NewTicker(l.renewEvery())
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			nrev, nsent, w := l.renew(ctx, rev, sent)
			mu.Lock()
			rev, sent, why = nrev, nsent, w
			mu.Unlock()
			if w != "" {
				lost()
				return
			}
		}
	}()
	return func() (uint64, time.Time, string) {
		close(done)
		<-finished
		mu.Lock()
		defer mu.Unlock()
		return rev, sent, why
	}
}

// renew renews the lease held at revision rev, last written at sent, with
// a compare-and-set. It returns the new revision and time, or the old ones
// and why the lease is lost: the renewal was refused, or none has
// succeeded for half the TTL. A failure before that is logged and leaves
// the next tick to try again.
func (l *lease) renew(ctx context.Context, rev uint64, sent time.Time) (uint64, time.Time, string) {
	now := time.Now()
	deadline := sent.Add(l.ttl / 2)
	callDeadline := now.Add(l.renewEvery())
	if deadline.Before(callDeadline) {
		callDeadline = deadline
	}
	var nrev uint64
	var err error
	if l.alive != nil && !l.alive() {
		err = errors.New("the services' connection is down")
	} else {
		rctx, cancel := context.WithDeadline(ctx, callDeadline)
		val, _ := json.Marshal(leaseValue{Holder: l.holder, Acquired: now.UTC()})
		nrev, err = l.kv.Update(rctx, l.key, val, rev)
		cancel()
	}
	var apiErr *jetstream.APIError
	switch {
	case err == nil:
		return nrev, now, ""
	case ctx.Err() != nil:
		return rev, sent, ""
	case errors.Is(err, jetstream.ErrKeyRevisionMismatch) || errors.Is(err, jetstream.ErrKeyExists) || errors.As(err, &apiErr):
		return rev, sent, "renewal refused (the lease lapsed or another replica holds it): " + err.Error()
	case !time.Now().Before(deadline):
		return rev, sent, fmt.Sprintf("no renewal for %s (half the lease TTL): %v", time.Since(sent).Round(time.Millisecond), err)
	default:
		l.log.Warn("lease renewal failed; retrying", "key", l.key, "err", err)
		return rev, sent, ""
	}
}

// watch follows the lease's changes, so that a released lease is taken at
// once: the watch reports its deletion. One that lapses (its holder died)
// leaves no marker, so run's tick tries too. The caller starts it before
// its first campaign: a release that comes between that campaign and run
// would otherwise be seen only a tick later. A nil watcher means none.
func (l *lease) watch(ctx context.Context) jetstream.KeyWatcher {
	w, err := l.kv.Watch(ctx, l.key, jetstream.UpdatesOnly())
	if err != nil {
		l.log.Warn("lease: no watch; a released lease is noticed on the next tick", "err", err)
		return nil
	}
	return w
}

// run campaigns until ctx ends, leading whenever it holds the lease. first
// is the result of a first acquireOnce made by the caller (rev 0: none);
// w is the watch the caller started before it (nil: none).
func (l *lease) run(ctx context.Context, w jetstream.KeyWatcher, rev uint64, sent time.Time, t term, termCancel context.CancelFunc) {
	tick := time.NewTicker(l.renewEvery())
	defer tick.Stop()
	var released <-chan jetstream.KeyValueEntry
	if w != nil {
		defer func() { _ = w.Stop() }()
		released = w.Updates()
	}
	for {
		if t == nil {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			case e, ok := <-released:
				if !ok {
					released = nil
					continue
				}
				if e == nil || e.Operation() == jetstream.KeyValuePut {
					continue
				}
			}
			var err error
			rev, sent, t, termCancel, err = l.acquireOnce(ctx)
			if err != nil && ctx.Err() == nil {
				l.log.Warn("lease: campaign failed; trying again", "key", l.key, "err", err)
			}
			continue
		}
		// Leading: renew until the lease is lost or ctx ends.
		lost := ""
		select {
		case <-ctx.Done():
		case <-t.done():
			lost = "its term ended (placement: its handlers stopped)"
		case _, ok := <-released:
			// Our own renewals: nothing to do, but keep the watch drained.
			if !ok {
				released = nil
			}
			continue
		case <-tick.C:
			rev, sent, lost = l.renew(ctx, rev, sent)
			if lost == "" && ctx.Err() == nil {
				continue
			}
		}
		if lost != "" {
			l.log.Warn("lease lost: stepping down", "key", l.key, "why", lost)
		}
		termCancel()
		switch err := t.stop(); {
		case errors.Is(err, bus.ErrFenced):
			// Another replica opened a newer term: what this one held
			// is that one's now. Expected after a lapse, not a fault.
			l.log.Warn("placement term fenced by a newer one", "err", err)
		case err != nil:
			l.log.Error("placement term ended with an error", "err", err)
		}
		t = nil
		if ctx.Err() != nil {
			// A graceful stop hands the lease over at once.
			l.release(context.WithoutCancel(ctx), rev)
			l.set(RoleUnknown, "")
			return
		}
		l.set(RoleUnknown, "")
	}
}

// release deletes the lease if this replica still holds revision rev.
func (l *lease) release(ctx context.Context, rev uint64) {
	ctx, cancel := context.WithTimeout(ctx, leaseReleaseTimeout)
	defer cancel()
	if err := l.kv.Delete(ctx, l.key, jetstream.LastRevision(rev)); err != nil {
		l.log.Warn("lease not released; it lapses on its own", "key", l.key, "err", err)
		return
	}
	l.log.Info("lease released", "key", l.key)
}

// startLease opens the lease bucket, makes a first campaign (so that a
// replica alone, or the first one, leads when the operator is ready) and
// leaves the campaign running until ctx ends.
func (o *Operator) startLease(ctx context.Context) error {
	b, log := o.b, o.log
	ttl := o.cfg.LeaseTTL
	if ttl == 0 {
		ttl = DefaultLeaseTTL
	}
	// The lease speaks over a connection of its own: on the shared one its
	// renewals queue behind every event the services publish, and a burst
	// makes them miss their deadline and the leader step down for nothing.
	lb, err := b.Dial(ctx, "urn:toposched:lease")
	if err != nil {
		return fmt.Errorf("lease connection: %w", err)
	}
	kv, err := ensureLeaseKV(ctx, lb, ttl)
	if err != nil {
		_ = lb.Close()
		return err
	}
	l := &lease{
		kv: kv, key: LeaseKey, holder: o.terms.holder, ttl: ttl, log: log.With("component", "lease"),
		start:  o.terms.start,
		alive:  func() bool { return b.Conn().IsConnected() },
		reopen: func(ctx context.Context) (jetstream.KeyValue, bool, error) { return reopenLeaseKV(ctx, lb, ttl) },
	}
	o.lease.Store(l)
	w := l.watch(ctx)
	rev, sent, t, termCancel, err := l.acquireOnce(ctx)
	if err != nil {
		if ctx.Err() != nil {
			if w != nil {
				_ = w.Stop()
			}
			_ = lb.Close()
			return err
		}
		// The configuration was checked before (Config.Validate), so what
		// failed is the term's start on a cluster not ready yet (a stream
		// without a leader): stay a standby and campaign again, as a
		// later failed term does, rather than exit.
		log.Warn("lease: first campaign failed; trying again", "key", l.key, "err", err)
	}
	if t == nil {
		st := l.Status()
		log.Info("placement standby: another replica applies decisions", "holder", st.Holder)
	}
	o.wg.Add(1)
	go func() {
		defer o.wg.Done()
		l.run(ctx, w, rev, sent, t, termCancel)
		_ = lb.Close() // run has released the lease on its way out
	}()
	return nil
}

// PlacementService is the placement service of the term this replica
// leads now; nil on a standby or when placement does not run here.
func (o *Operator) PlacementService() *placement.Service {
	if o.terms == nil {
		return nil
	}
	return o.terms.current()
}

// LeaderStatus is placement's lease as this replica sees it; ok is false
// when placement does not run here.
func (o *Operator) LeaderStatus() (st LeaderStatus, ok bool) {
	l := o.lease.Load()
	if l == nil {
		return LeaderStatus{}, false
	}
	return l.Status(), true
}

// replicaName is the configured replica name, or host name/pid and a
// random suffix: without a configured name no two operators, even in one
// process, may mistake each other's lease for their own.
func replicaName(cfg Config) string {
	if cfg.Replica != "" {
		return cfg.Replica
	}
	host, _ := os.Hostname()
	return host + "/" + strconv.Itoa(os.Getpid()) + "/" + bus.NewID()[:8]
}

// startSole runs placement's one term for the life of the operator, with
// no lease (Config.Sole).
func (o *Operator) startSole(ctx context.Context) error {
	t, err := o.terms.start(ctx, 0)
	if err != nil {
		return err
	}
	o.log.Info("placement runs as the only replica (no lease)")
	o.wg.Add(1)
	go func() {
		defer o.wg.Done()
		select {
		case <-ctx.Done():
		case <-t.done():
		}
		if err := t.stop(); err != nil {
			o.fail(fmt.Errorf("placement: %w", err))
		}
	}()
	return nil
}
