package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/events/bus"
	"github.com/toposched/toposched/internal/textout"
	"github.com/toposched/toposched/policies"
)

func newPolicyPush(g *globals) *cobra.Command {
	var wait bool
	var timeout time.Duration
	var name string
	cmd := &cobra.Command{
		Use:   "push DIR",
		Short: "Test a policy set locally, push it to the operator's KV bucket and wait for a replica to apply it",
		Long: `push compiles every .rego file of DIR and runs its Rego tests as the operator
does; a broken set is refused with file and line before NATS is touched. A set
that passes is put, as one value holding every file, under the key "set" of the
bucket <prefix>-policies, so every placement replica sees the whole new set or
the old one, never a mix.

Each replica compiles and tests it again and answers with policy.applied, or
policy.rejected naming file and line (its old set then stays). With --wait (the
default) push prints the first answer for this push and exits non-zero on a
rejection.

A pushed set overrides a replica's --policies directory or the shipped set while
it is the newest of them: a later edit of the directory wins over it. Withdraw
it with 'nats kv del <prefix>-policies set' to fall back to the directory.`,
		Example: "  topoctl policy push policies/default\n  topoctl policy push ./lab-policies --name lab --timeout 2m",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			dir := args[0]
			if name == "" {
				abs, err := filepath.Abs(dir)
				if err != nil {
					return err
				}
				name = filepath.Base(abs)
			}
			return policyPush(cmd.Context(), g, cmd.OutOrStdout(), dir, name, wait, timeout)
		},
	}
	cmd.Flags().BoolVar(&wait, "wait", true, "wait for a replica to apply or reject the set, and print its answer")
	cmd.Flags().DurationVar(&timeout, "timeout", time.Minute, "with --wait, give up after this long")
	cmd.Flags().StringVar(&name, "name", "", "name of the set in events and logs (default: the directory's name)")
	return cmd
}

func policyPush(ctx context.Context, g *globals, out io.Writer, dir, name string, wait bool, timeout time.Duration) error {
	st, err := os.Stat(dir)
	if err != nil {
		return err
	}
	if !st.IsDir() {
		return fmt.Errorf("%s: not a directory", dir)
	}
	// Everything that can be checked here is, before NATS: the operator
	// would refuse the same set, after a round trip.
	fsys := os.DirFS(dir)
	set, _, err := policies.Check(ctx, fsys, name)
	if err != nil {
		w := textout.New(out)
		var errs policies.Errors
		if errors.As(err, &errs) {
			for _, e := range errs {
				if e.File != "" {
					e.File = filepath.Join(dir, e.File)
				}
				w.Println(e.Error())
			}
		}
		refused := fmt.Errorf("policy set %s refused; nothing pushed: %w", dir, err)
		if werr := w.Err(); werr != nil {
			return errors.Join(refused, werr)
		}
		return refused
	}
	data, rev, err := policies.EncodeBundle(name, fsys)
	if err != nil {
		return fmt.Errorf("push policy set %s: %w", dir, err)
	}

	b, err := g.connectPolicyAdmin(ctx)
	if err != nil {
		return err
	}
	defer closeBus(b)
	kv, err := policies.OpenKV(ctx, b.JetStream(), g.prefix)
	if err != nil {
		return err
	}

	var answers <-chan any
	var errc <-chan error
	waitCtx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if wait {
		if answers, errc, err = followPolicyDomain(waitCtx, b); err != nil {
			return err
		}
	}
	kvRev, err := policies.PushBundle(ctx, kv, data)
	if err != nil {
		return err
	}
	passed := 0
	for _, t := range set.Tests {
		if t.Pass {
			passed++
		}
	}
	if g.format != "json" {
		if _, err := fmt.Fprintf(out, "pushed %s@%s to %s (kv revision %d): %d files, %d tests passed locally\n",
			name, shortRev(rev), kv.Bucket(), kvRev, len(set.Files), passed); err != nil {
			return err
		}
	}
	if !wait {
		if g.format == "json" {
			return json.NewEncoder(out).Encode(map[string]any{"revision": rev, "kv_revision": kvRev})
		}
		return nil
	}
	for {
		select {
		case v := <-answers:
			switch e := v.(type) {
			case *events.PolicyApplied:
				if e.Revision != rev || e.KVRevision != kvRev {
					continue
				}
				if g.format == "json" {
					return printPolicyEvent(out, events.NamePolicyApplied, e)
				}
				return writeApplied(out, e)
			case *events.PolicyRejected:
				if e.Revision != rev || e.KVRevision != kvRev {
					continue
				}
				if g.format == "json" {
					if err := printPolicyEvent(out, events.NamePolicyRejected, e); err != nil {
						return err
					}
				} else if err := writeRejected(out, e); err != nil {
					return err
				}
				return fmt.Errorf("policy set %s@%s rejected by the operator", name, shortRev(rev))
			}
		case err := <-errc:
			if err == nil {
				err = waitCtx.Err()
			}
			if errors.Is(err, context.DeadlineExceeded) {
				return fmt.Errorf("pushed %s@%s, but no placement replica answered within %s: is one running, "+
					"and not with --policies none? (topoctl policy show tells what is in force)", name, shortRev(rev), timeout)
			}
			return err
		}
	}
}

func printPolicyEvent(out io.Writer, name events.Name, v any) error {
	return json.NewEncoder(out).Encode(struct {
		Event string `json:"event"`
		Data  any    `json:"data"`
	}{string(name), v})
}

func writeApplied(out io.Writer, e *events.PolicyApplied) error {
	w := textout.New(out)
	w.Printf("applied by %s: %s@%s from %s, %d files, %d tests passed", e.Replica, e.Name, shortRev(e.Revision),
		e.Source, len(e.Files), e.TestsPassed)
	if e.Previous != "" {
		w.Printf(" (replaced %s)", shortRev(e.Previous))
	}
	w.Println()
	return w.Err()
}

func writeRejected(out io.Writer, e *events.PolicyRejected) error {
	w := textout.New(out)
	w.Printf("rejected by %s: %s@%s from %s\n", e.Replica, e.Name, shortRev(e.Revision), e.Source)
	for _, pe := range e.Errors {
		w.Printf("  %s\n", (&policies.Error{File: pe.File, Line: pe.Line, Msg: pe.Message, Code: pe.Code}).Error())
	}
	if e.InForce != "" {
		w.Printf("the set in force stays: %s\n", shortRev(e.InForce))
	} else {
		w.Println("no set is in force")
	}
	return w.Err()
}

func shortRev(rev string) string {
	if len(rev) > 12 {
		return rev[:12]
	}
	return rev
}

func newPolicyShow(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "show",
		Short: "Show the pushed policy set and the set each placement replica last applied",
		Long: `show prints the set in the operator's policy KV bucket, if one was pushed, and
from the policy stream the last policy.applied of every replica that ever
announced one (replicas since stopped included), newest first.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return policyShow(cmd.Context(), g, cmd.OutOrStdout())
		},
	}
}

// pushedSet is the value of the policy bucket, as show prints it.
type pushedSet struct {
	Name       string    `json:"name"`
	Revision   string    `json:"revision"`
	KVRevision uint64    `json:"kv_revision"`
	Created    time.Time `json:"created"`
	Files      int       `json:"files"`
	Error      string    `json:"error,omitempty"`
}

func policyShow(ctx context.Context, g *globals, out io.Writer) error {
	b, err := g.connect(ctx)
	if err != nil {
		return err
	}
	defer closeBus(b)
	var pushed *pushedSet
	kv, err := b.JetStream().KeyValue(ctx, policies.BucketName(g.prefix))
	switch {
	case errors.Is(err, jetstream.ErrBucketNotFound):
	case err != nil:
		return fmt.Errorf("policy bucket: %w", err)
	default:
		e, err := kv.Get(ctx, policies.KVKey)
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound):
		case err != nil:
			return fmt.Errorf("policy bucket %s: %w", kv.Bucket(), err)
		default:
			pushed = &pushedSet{Revision: policies.ValueRevision(e.Value()), KVRevision: e.Revision(), Created: e.Created()}
			if bd, err := policies.DecodeBundle(e.Value()); err != nil {
				pushed.Name, pushed.Error = "unknown", err.Error()
			} else {
				pushed.Name, pushed.Files = bd.Name, len(bd.Files)
			}
		}
	}
	replicas, err := lastApplied(ctx, b, events.NamePolicyApplied, func(e *events.PolicyApplied) (string, time.Time) { return e.Replica, e.AppliedAt })
	if err != nil {
		return err
	}
	if g.format == "json" {
		return json.NewEncoder(out).Encode(struct {
			Pushed   *pushedSet              `json:"pushed"`
			Replicas []*events.PolicyApplied `json:"replicas"`
		}{pushed, replicas})
	}
	w := textout.New(out)
	switch {
	case pushed == nil:
		w.Println("pushed: none (replicas use their --policies directory or the shipped set)")
	case pushed.Error != "":
		w.Printf("pushed: unreadable value, kv revision %d at %s: %s\n", pushed.KVRevision,
			pushed.Created.UTC().Format(time.RFC3339), pushed.Error)
	default:
		w.Printf("pushed: %s@%s, %d files, kv revision %d at %s\n", pushed.Name, shortRev(pushed.Revision),
			pushed.Files, pushed.KVRevision, pushed.Created.UTC().Format(time.RFC3339))
	}
	if len(replicas) == 0 {
		w.Println("no replica has announced a policy set")
		return w.Err()
	}
	w.Println()
	if err := w.Err(); err != nil {
		return err
	}
	tw := textout.Table(out, 0, 0, 2, ' ', 0)
	tw.Println("REPLICA\tREVISION\tSOURCE\tNAME\tTESTS\tAPPLIED")
	for _, e := range replicas {
		tw.Printf("%s\t%s\t%s\t%s\t%d\t%s\n", e.Replica, shortRev(e.Revision), e.Source, e.Name, e.TestsPassed,
			e.AppliedAt.UTC().Format(time.RFC3339))
	}
	return tw.Flush()
}

// followPolicyDomain follows the policy stream from now on; a push calls
// it first, so that the answer cannot come before.
func followPolicyDomain(ctx context.Context, b *bus.Bus) (<-chan any, <-chan error, error) {
	answers, errc := make(chan any, 16), make(chan error, 1)
	ready := make(chan struct{})
	go func() {
		errc <- b.Follow(ctx, events.DomainPolicy, []string{b.Subjects.Domain(events.DomainPolicy)}, ready, func(r bus.Record) error {
			v := r.Name.New()
			if v != nil && events.DecodeJSON(r.Body, v) == nil {
				select {
				case answers <- v:
				case <-ctx.Done():
				}
			}
			return nil
		})
	}()
	select {
	case <-ready:
		return answers, errc, nil
	case err := <-errc:
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			return nil, nil, fmt.Errorf("no policy stream %s: is toposched running (it creates the stream at start-up)?", b.StreamName(events.DomainPolicy))
		}
		return nil, nil, err
	}
}

// lastApplied replays the policy stream's events of one name and keeps
// each replica's last, newest first (replica names break ties).
func lastApplied[T any](ctx context.Context, b *bus.Bus, name events.Name, key func(*T) (string, time.Time)) ([]*T, error) {
	last := map[string]*T{}
	err := b.Replay(ctx, events.DomainPolicy, []string{b.Subjects.Of(name)}, func(r bus.Record) error {
		e := new(T)
		if events.DecodeJSON(r.Body, e) == nil {
			replica, _ := key(e)
			last[replica] = e
		}
		return nil
	})
	if err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, err
	}
	out := make([]*T, 0, len(last))
	for _, e := range last {
		out = append(out, e)
	}
	slices.SortFunc(out, func(a, b *T) int {
		ra, ta := key(a)
		rb, tb := key(b)
		if c := tb.Compare(ta); c != 0 {
			return c
		}
		return strings.Compare(ra, rb)
	})
	return out, nil
}
