package operator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/events/bus"
	"github.com/toposched/toposched/events/kvwatch"
	"github.com/toposched/toposched/policies"
)

// Values of Config.Policies besides a directory.
const (
	// PoliciesDefault runs the shipped set, policies.Default.
	PoliciesDefault = ""
	// PoliciesNone turns policies off in this replica: no directory, no
	// shipped set, and pushed sets are not followed.
	PoliciesNone = "none"
)

// Where placement's policy set comes from, and which one wins.
//
// Two sources feed a replica: its base set (the --policies directory,
// polled and reloaded when its files change, or the shipped set) and the
// set pushed to the policy KV bucket (topoctl policy push). The newest
// valid set of the two is in force: a directory set is as new as the latest
// modification time of its files and their directories (newestFile), the
// shipped set older than anything, and a pushed set as new as its KV entry
// (the server's clock). Both sources are an operator's deliberate act, so
// the latest act is what they mean; and because both times are properties
// of the sources, not of when a replica happened to read them, every
// replica, one restarted later included, chooses the same set. Withdrawing
// the push (deleting the key) falls back to the base set.
//
// Each set is compiled and its Rego tests run before it is taken. A set put
// in force is announced with policy.applied (one per replica); a refused
// one with policy.rejected naming file and line, and the set in force stays.
// Replicas refusing the same contents publish the same event id (derived
// from the revision and, for a push, the KV entry), so JetStream keeps one.
type policyLoop struct {
	b       *bus.Bus
	place   policyTarget
	log     *slog.Logger
	replica string
	// boot names this start of the replica in the ids of what it applies
	// at start-up: a restart announces its set again.
	boot string

	mu      sync.Mutex
	started bool       // the initial sets of both sources are in
	base    *candidate // the directory's or the shipped set
	pushed  *candidate // the bucket's; nil when none or withdrawn
	inForce *candidate
	lastIO  string // last directory read error logged
}

// candidate is a valid set offered by a source.
type candidate struct {
	set    *policies.Set
	source string    // events.PolicySource*
	at     time.Time // how new it is
	kvRev  uint64
}

// startPolicies loads the initial sets, puts the winner in force and
// leaves the sources watched until runCtx ends. It returns an error, after
// publishing policy.rejected, when the base set is refused at start-up:
// there is no old set to keep.
func startPolicies(ctx, runCtx context.Context, b *bus.Bus, place policyTarget, cfg Config, log *slog.Logger, wg *sync.WaitGroup) error {
	log = log.With("component", "policies")
	if cfg.Policies == PoliciesNone {
		log.Info("policies off (--policies none); pushed sets are not followed")
		return nil
	}
	replica := cfg.Replica
	if replica == "" {
		host, _ := os.Hostname()
		replica = host + "/" + strconv.Itoa(os.Getpid())
	}
	pl := &policyLoop{b: b, place: place, log: log, replica: replica, boot: bus.NewID()}

	// The base set.
	if cfg.Policies == PoliciesDefault {
		set, err := policies.Compile(policies.Default, "default")
		if err != nil {
			return fmt.Errorf("shipped policy set: %w", err)
		}
		pl.base = &candidate{set: set, source: events.PolicySourceDefault}
	} else {
		dir := cfg.Policies
		poll := cfg.PolicyPoll
		if poll <= 0 {
			poll = policies.DefaultWatchInterval
		}
		first := make(chan error, 1)
		var once sync.Once
		wg.Add(1)
		go func() {
			defer wg.Done()
			policies.WatchEvery(runCtx, dir, poll,
				func(s *policies.Set) {
					pl.offerBase(runCtx, s, dir)
					once.Do(func() { first <- nil })
				},
				func(err error) {
					pl.refusedBase(runCtx, dir, err)
					once.Do(func() { first <- err })
				})
		}()
		select {
		case err := <-first:
			if err != nil {
				return fmt.Errorf("policy directory %s: %w", dir, err)
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}

	// The pushed set.
	var kv jetstream.KeyValue
	err := bus.RetryJetStream(ctx, func(ctx context.Context) error {
		var err error
		kv, err = policies.EnsureKV(ctx, b.JetStream(), b.Subjects.Prefix, b.Replicas())
		return err
	})
	if err != nil {
		return err
	}
	follow := &kvwatch.Follower[policies.Set]{KV: kv, Key: policies.KVKey, Decode: policies.DecodeValue,
		Lock: &pl.mu, Handler: pl, Log: log}
	if err := follow.Start(ctx, runCtx, wg); err != nil {
		return err
	}

	pl.mu.Lock()
	defer pl.mu.Unlock()
	pl.started = true
	pl.settle(runCtx, "start:"+pl.boot)
	return nil
}

// offerBase takes a valid directory set.
func (pl *policyLoop) offerBase(ctx context.Context, s *policies.Set, dir string) {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	pl.lastIO = ""
	c := &candidate{set: s, source: events.PolicySourceDirectory, at: newestFile(dir, s.Files)}
	pl.base = c
	if !pl.started {
		return
	}
	if pl.winner() != c {
		pl.log.Info("directory policy set is older than the pushed set in force; the pushed set stays",
			"set", s.String(), "in_force", pl.inForce.set.String())
		return
	}
	pl.settle(ctx, fmt.Sprintf("dir:%s@%d", s.Revision, c.at.UnixNano()))
}

// refusedBase reports a directory set that was refused, or a directory
// that could not be read.
func (pl *policyLoop) refusedBase(ctx context.Context, dir string, err error) {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	var ref *policies.RefusedError
	if !errors.As(err, &ref) {
		// Unreadable (removed, permissions): nothing to name a revision
		// by. Log it once per distinct error, not on every poll.
		if err.Error() != pl.lastIO {
			pl.lastIO = err.Error()
			pl.log.Error("policy directory unreadable; the set in force stays", "dir", dir, "err", err)
		}
		return
	}
	pl.reject(ctx, "dir:"+ref.Revision, &events.PolicyRejected{
		Revision: ref.Revision, Name: dir, Source: events.PolicySourceDirectory, Errors: eventErrors(ref.Errs),
	})
}

// Offer takes a valid pushed set. pl.mu is held (kvwatch.Follower).
func (pl *policyLoop) Offer(ctx context.Context, trigger string, u policies.KVUpdate) {
	pl.pushed = &candidate{set: u.Set, source: events.PolicySourceKV, at: u.Created, kvRev: u.KVRevision}
	pl.pushedChanged(ctx, trigger)
}

// Withdraw takes the withdrawal of the pushed set. pl.mu is held.
func (pl *policyLoop) Withdraw(ctx context.Context, trigger string, u policies.KVUpdate) {
	pl.log.Info("pushed policy set withdrawn", "kv_revision", u.KVRevision)
	pl.pushed = nil
	pl.pushedChanged(ctx, trigger)
}

// Refuse announces a pushed value that is not a valid set. pl.mu is held.
func (pl *policyLoop) Refuse(ctx context.Context, trigger string, u policies.KVUpdate) {
	pl.reject(ctx, trigger, &events.PolicyRejected{
		Revision: u.Revision, Name: u.Name, Source: events.PolicySourceKV, KVRevision: u.KVRevision,
		Errors: eventErrors(u.Err),
	})
}

// pushedChanged puts the winner in force after the pushed set changed,
// once start-up has both sources in. pl.mu is held.
func (pl *policyLoop) pushedChanged(ctx context.Context, trigger string) {
	if !pl.started {
		return
	}
	if pl.pushed != nil && pl.winner() != pl.pushed {
		pl.log.Warn("pushed policy set is older than the directory's; the directory's stays (clock skew?)",
			"set", pl.pushed.set.String(), "in_force", pl.inForce.set.String())
		return
	}
	pl.settle(ctx, trigger)
}

// winner is the newest valid set; a push wins a tie.
func (pl *policyLoop) winner() *candidate {
	switch {
	case pl.pushed == nil:
		return pl.base
	case pl.base == nil || !pl.base.at.After(pl.pushed.at):
		return pl.pushed
	}
	return pl.base
}

// settle puts the winner in force if it is not already, and announces it.
// trigger names what caused the change, for the event id. pl.mu is held.
func (pl *policyLoop) settle(ctx context.Context, trigger string) {
	c := pl.winner()
	if c == nil || c == pl.inForce {
		return
	}
	prev := pl.inForce
	pl.inForce = c
	var previous string
	if prev != nil {
		previous = prev.set.Revision
	}
	// The same revision from another source changes nothing in the
	// decisions: keep the set (and its node cache), but still announce
	// it, since whoever pushed it waits for the answer.
	if previous != c.set.Revision {
		if err := pl.place.SetPolicies(ctx, c.set); err != nil {
			// The set is in force; only the retry of the queue failed,
			// and the next freed GPU or topology change retries it.
			pl.log.Warn("policy set in force; retrying pending jobs failed", "set", c.set.String(), "err", err)
		}
	}
	passed := 0
	for _, t := range c.set.Tests {
		if t.Pass {
			passed++
		}
	}
	ev := &events.PolicyApplied{
		Revision: c.set.Revision, Name: c.set.Name, Source: c.source, KVRevision: c.kvRev,
		Files: c.set.Files, TestsPassed: passed, Previous: previous, Replica: pl.replica,
		AppliedAt: time.Now().UTC(),
	}
	if ev.Files == nil {
		ev.Files = []string{}
	}
	pl.log.Info("policy set applied", "set", c.set.String(), "source", c.source, "kv_revision", c.kvRev, "previous", previous)
	// One announcement per replica and cause: the replica is in the id.
	pl.publish(ctx, trigger+"/"+pl.replica, c.set.Revision, ev)
}

// reject announces a refused set; the one in force stays. cause is the same
// on every replica that sees the same contents, so their copies are one
// event. pl.mu is held.
func (pl *policyLoop) reject(ctx context.Context, cause string, ev *events.PolicyRejected) {
	ev.Replica = pl.replica
	ev.RejectedAt = time.Now().UTC()
	if pl.inForce != nil {
		ev.InForce = pl.inForce.set.Revision
	}
	if ev.Name == "" {
		ev.Name = "unknown"
	}
	args := []any{"name", ev.Name, "source", ev.Source, "revision", ev.Revision, "in_force", ev.InForce}
	if ev.KVRevision != 0 {
		args = append(args, "kv_revision", ev.KVRevision)
	}
	for _, e := range ev.Errors {
		pl.log.Warn("policy set refused; the set in force stays",
			append(args, "file", e.File, "line", e.Line, "code", e.Code, "msg", e.Message)...)
	}
	pl.publish(ctx, cause, ev.Revision, ev)
}

// publish sends a policy event whose id derives from cause (events.DeriveID
// through bus.WithCause), so JetStream drops a copy with the same cause. The
// cause is a change of a source, not an event: "policy:kv@<entry>" or
// "policy:dir:<revision>", with the replica appended for policy.applied.
func (pl *policyLoop) publish(ctx context.Context, cause, revision string, ev any) {
	ctx = bus.WithCause(ctx, events.Envelope{ID: "policy:" + cause, CorrelationID: revision})
	if _, err := pl.b.Publish(ctx, ev); err != nil && ctx.Err() == nil {
		pl.log.Error("publish policy event", "revision", revision, "err", err)
	}
}

// eventErrors turns a refusal into the event's errors: never empty, every
// message and code set, as the schema asks.
func eventErrors(err error) []events.PolicyError {
	var errs policies.Errors
	if !errors.As(err, &errs) || len(errs) == 0 {
		return []events.PolicyError{{Message: err.Error(), Code: "rego_error"}}
	}
	out := make([]events.PolicyError, 0, len(errs))
	for _, e := range errs {
		pe := events.PolicyError{File: e.File, Line: max(e.Line, 0), Message: e.Msg, Code: e.Code}
		if pe.Message == "" {
			pe.Message = "refused"
		}
		if pe.Code == "" {
			pe.Code = "rego_error"
		}
		out = append(out, pe)
	}
	return out
}

// newestFile is the latest modification time of a set's files and of the
// directories holding them (a removed or renamed file changes only its
// directory's), the time a directory set counts as made; now when none can
// be read.
func newestFile(dir string, files []string) time.Time {
	var t time.Time
	seen := map[string]bool{}
	for _, f := range files {
		for p := filepath.Join(dir, filepath.FromSlash(f)); !seen[p]; p = filepath.Dir(p) {
			seen[p] = true
			if st, err := os.Stat(p); err == nil && st.ModTime().After(t) {
				t = st.ModTime()
			}
			if p == filepath.Clean(dir) || p == filepath.Dir(p) {
				break
			}
		}
	}
	if t.IsZero() {
		return time.Now()
	}
	return t
}
