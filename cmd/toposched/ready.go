package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/events/bus"
	"github.com/toposched/toposched/events/natsserver"
	"github.com/toposched/toposched/services/operator"
)

// Readiness timings and thresholds.
const (
	// readyCacheFor is how long an answer of /readyz is reused: a storm
	// of probes costs one round of JetStream requests a second.
	readyCacheFor = time.Second
	// readyTimeout bounds one round of JetStream requests.
	readyTimeout = 2 * time.Second
	// storageHeadroomMin is the least free JetStream storage that still
	// counts as room: below max(1% of the limit, this) a large decision
	// would be refused.
	storageHeadroomMin = 64 << 10
)

// readiness answers /readyz: ready while the connection is up and the
// services run (streams ensured, state rebuilt: Start returned), placement
// knows who applies decisions, every stream exists, each running service's
// durable consumers exist, and JetStream has storage left. Each answer is
// kept for readyCacheFor.
type readiness struct {
	b        *bus.Bus
	op       *operator.Operator
	services []string
	// embedded is the embedded NATS server whose storage and disk are
	// checked too; nil with --nats-url.
	embedded *natsserver.Server
	// extra are the checks of the services serve runs beside the
	// operator's (Kubernetes, Slurm): each nil when ready.
	extra    []func() error
	cacheFor time.Duration
	timeout  time.Duration
	now      func() time.Time

	mu      sync.Mutex
	checked bool
	at      time.Time
	err     error
}

func newReadiness(b *bus.Bus, op *operator.Operator, services []string, embedded *natsserver.Server) *readiness {
	return &readiness{b: b, op: op, services: services, embedded: embedded,
		cacheFor: readyCacheFor, timeout: readyTimeout, now: time.Now}
}

// check is nil when ready, else every reason why not. Concurrent callers
// wait for one probe and share its answer.
func (r *readiness) check() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.checked && r.now().Sub(r.at) < r.cacheFor {
		return r.err
	}
	ctx, cancel := context.WithTimeout(context.Background(), r.timeout)
	defer cancel()
	r.err = r.probe(ctx)
	r.at, r.checked = r.now(), true
	return r.err
}

func (r *readiness) probe(ctx context.Context) error {
	if nc := r.b.Conn(); !nc.IsConnected() {
		return fmt.Errorf("nats: %s", nc.Status())
	}
	var errs []error
	select {
	case <-r.op.Done():
		errs = append(errs, errors.New("services stopped"))
	default:
	}
	if st, ok := r.op.LeaderStatus(); ok && st.Role == operator.RoleUnknown {
		errs = append(errs, errors.New("placement: no leader known yet"))
	}
	for _, check := range r.extra {
		errs = append(errs, check())
	}
	errs = append(errs, r.streams(ctx)...)
	errs = append(errs, r.storage(ctx)...)
	return errors.Join(errs...)
}

// wanted are the durable consumers of the services running here, by
// domain. Placement's count only while this replica applies decisions: a
// standby runs no handlers.
func (r *readiness) wanted() map[events.Domain][]string {
	out := map[events.Domain][]string{}
	for _, svc := range r.services {
		if svc == operator.Placement && r.op.PlacementService() == nil {
			continue
		}
		for _, d := range serviceDurables[svc] {
			out[d.domain] = append(out[d.domain], d.name)
		}
	}
	return out
}

// streams checks that every stream exists and holds the durable
// consumers of the services running here.
func (r *readiness) streams(ctx context.Context) []error {
	js := r.b.JetStream()
	have := map[string]bool{}
	lister := js.StreamNames(ctx)
	for name := range lister.Name() {
		have[name] = true
	}
	if err := lister.Err(); err != nil {
		return []error{fmt.Errorf("jetstream: list streams: %w", err)}
	}
	wanted := r.wanted()
	var errs []error
	for _, d := range events.Domains {
		name := r.b.StreamName(d)
		if !have[name] {
			errs = append(errs, fmt.Errorf("stream %s: missing", name))
			continue
		}
		need := wanted[d]
		if len(need) == 0 {
			continue
		}
		s, err := js.Stream(ctx, name)
		if err != nil {
			errs = append(errs, fmt.Errorf("stream %s: %w", name, err))
			continue
		}
		got := map[string]bool{}
		cl := s.ConsumerNames(ctx)
		for c := range cl.Name() {
			got[c] = true
		}
		if err := cl.Err(); err != nil {
			errs = append(errs, fmt.Errorf("stream %s: list consumers: %w", name, err))
			continue
		}
		for _, c := range need {
			if !got[c] {
				errs = append(errs, fmt.Errorf("durable consumer %s on stream %s: missing", c, name))
			}
		}
	}
	return errs
}

// storage checks that JetStream can still store: the account's limits
// (any NATS deployment), and for the embedded server its own limit, that
// JetStream is still on, and the data dir's free disk space.
func (r *readiness) storage(ctx context.Context) []error {
	var errs []error
	ai, err := r.b.JetStream().AccountInfo(ctx)
	if err != nil {
		errs = append(errs, fmt.Errorf("jetstream account info: %w", err))
	} else {
		if lim := ai.Limits.MaxStore; lim > 0 && storageLow(ai.Store, uint64(lim)) {
			errs = append(errs, fmt.Errorf("JetStream storage full: the account stores %s of its %s", bytesText(ai.Store), bytesText(uint64(lim))))
		}
		tiers := make([]string, 0, len(ai.Tiers))
		for name := range ai.Tiers {
			tiers = append(tiers, name)
		}
		slices.Sort(tiers)
		for _, name := range tiers {
			t := ai.Tiers[name]
			if lim := t.Limits.MaxStore; lim > 0 && storageLow(t.Store, uint64(lim)) {
				errs = append(errs, fmt.Errorf("JetStream storage full: tier %s stores %s of its %s", name, bytesText(t.Store), bytesText(uint64(lim))))
			}
		}
	}
	if r.embedded == nil {
		return errs
	}
	dir := r.embedded.StoreDir()
	st, err := r.embedded.Storage()
	switch {
	case err != nil:
		errs = append(errs, fmt.Errorf("embedded nats: %w", err))
	case st.Disabled:
		errs = append(errs, fmt.Errorf("JetStream disabled on the embedded server (it stops after a write error: is the disk of data dir %s full?)", dir))
	case storageLow(st.Used, st.Max):
		errs = append(errs, fmt.Errorf("JetStream storage full: %s of %s used (data dir %s)", bytesText(st.Used), bytesText(st.Max), dir))
	case st.DiskKnown && st.DiskFree < storageHeadroom(st.Max):
		errs = append(errs, fmt.Errorf("data dir %s: only %s free on its filesystem", dir, bytesText(st.DiskFree)))
	}
	return errs
}

// storageHeadroom is the free storage below which JetStream counts as
// full.
func storageHeadroom(limit uint64) uint64 { return max(limit/100, storageHeadroomMin) }

func storageLow(used, limit uint64) bool {
	return used >= limit || limit-used < storageHeadroom(limit)
}

// bytesText writes n bytes for people: 512 B, 1.5 KiB, 2.7 MiB, 8.0 GiB.
func bytesText(n uint64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := uint64(unit), 0
	for m := n / unit; m >= unit && exp < 4; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTP"[exp])
}
