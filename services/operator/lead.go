package operator

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toposched/toposched/events/bus"
)

// Lead runs fn while this process holds key in the lease bucket, the one
// placement's replicas campaign in, and campaigns again whenever it does
// not, until ctx ends: the leader election of a service that must act
// alone (the Kubernetes service, which binds pods). fn gets a context
// that ends when the lease is lost; an error of fn ends the term (logged)
// and the campaign goes on. ttl must be placement's lease TTL: the bucket
// has one for all its keys.
func Lead(ctx context.Context, b *bus.Bus, key, holder string, ttl time.Duration, log *slog.Logger, fn func(ctx context.Context) error) error {
	if ttl == 0 {
		ttl = DefaultLeaseTTL
	}
	if key == LeaseKey {
		return fmt.Errorf("lease %q is placement's", key)
	}
	lb, err := b.Dial(ctx, "urn:toposched:lease:"+key)
	if err != nil {
		return fmt.Errorf("lease connection: %w", err)
	}
	defer func() { _ = lb.Close() }()
	kv, err := ensureLeaseKV(ctx, lb, ttl)
	if err != nil {
		return err
	}
	l := &lease{
		kv: kv, key: key, holder: holder, ttl: ttl, log: log.With("component", "lease"),
		start:  func(ctx context.Context, _ uint64) (term, error) { return startFuncTerm(ctx, fn, log), nil },
		alive:  func() bool { return b.Conn().IsConnected() },
		reopen: func(ctx context.Context) (jetstream.KeyValue, bool, error) { return reopenLeaseKV(ctx, lb, ttl) },
	}
	w := l.watch(ctx)
	rev, sent, t, termCancel, err := l.acquireOnce(ctx)
	if err != nil && ctx.Err() == nil {
		log.Warn("lease: first campaign failed; trying again", "key", key, "err", err)
	}
	if t == nil && ctx.Err() == nil {
		log.Info("standby: another replica leads", "key", key, "holder", l.Status().Holder)
	}
	l.run(ctx, w, rev, sent, t, termCancel)
	return nil
}

// funcTerm is a term that runs one function.
type funcTerm struct {
	cancel context.CancelFunc
	ended  chan struct{}
	err    error
}

func startFuncTerm(ctx context.Context, fn func(ctx context.Context) error, log *slog.Logger) *funcTerm {
	ctx, cancel := context.WithCancel(ctx)
	t := &funcTerm{cancel: cancel, ended: make(chan struct{})}
	go func() {
		defer close(t.ended)
		t.err = fn(ctx)
		if t.err != nil && ctx.Err() == nil {
			log.Error("term ended with an error", "err", t.err)
		}
	}()
	return t
}

func (t *funcTerm) done() <-chan struct{} { return t.ended }

func (t *funcTerm) stop() error {
	t.cancel()
	<-t.ended
	return nil
}
