package main

import (
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/events/bus"
	"github.com/toposched/toposched/events/eventstest"
	"github.com/toposched/toposched/services/operator"
)

// shippedUsers parses deploy/nats/standalone.conf (and the auth.conf it
// includes) as nats-server does.
func shippedUsers(t *testing.T) map[string]*server.User {
	t.Helper()
	for _, k := range []string{"TOPOSCHED_OPERATOR_PASSWORD", "TOPOSCHED_LAUNCHER_PASSWORD", "TOPOSCHED_POLICY_PASSWORD",
		"TOPOSCHED_AGENT_PASSWORD", "NATS_SYS_PASSWORD"} {
		t.Setenv(k, "pw")
	}
	t.Setenv("NATS_STORE_DIR", t.TempDir())
	opts, err := server.ProcessConfigFile(filepath.Join("..", "..", "deploy", "nats", "standalone.conf"))
	if err != nil {
		t.Fatal(err)
	}
	users := map[string]*server.User{}
	for _, u := range opts.Users {
		users[u.Username] = u
	}
	return users
}

func sorted(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return slices.Compact(s)
}

// diff lists what only want and only got hold.
func diff(t *testing.T, what string, want, got []string) {
	t.Helper()
	want, got = sorted(want), sorted(got)
	for _, w := range want {
		if !slices.Contains(got, w) {
			t.Errorf("%s: deploy/nats/auth.conf lacks %q", what, w)
		}
	}
	for _, g := range got {
		if !slices.Contains(want, g) {
			t.Errorf("%s: deploy/nats/auth.conf has %q, which the generated role has not", what, g)
		}
	}
}

// The shipped launcher role is the one serve generates: one definition of
// what a launcher may do, with every service durable denied by its name.
func TestShippedLauncherRoleIsGenerated(t *testing.T) {
	u := shippedUsers(t)["launcher"]
	if u == nil || u.Permissions == nil || u.Permissions.Publish == nil || u.Permissions.Subscribe == nil {
		t.Fatalf("auth.conf: no launcher with publish and subscribe permissions: %+v", u)
	}
	want := launcherPermissions(events.DefaultPrefix)
	diff(t, "launcher publish allow", want.Publish.Allow, u.Permissions.Publish.Allow)
	diff(t, "launcher publish deny", want.Publish.Deny, u.Permissions.Publish.Deny)
	diff(t, "launcher subscribe allow", want.Subscribe.Allow, u.Permissions.Subscribe.Allow)
	diff(t, "launcher subscribe deny", want.Subscribe.Deny, u.Permissions.Subscribe.Deny)
	for _, name := range durableNames() {
		for _, subj := range []string{
			"$JS.API.CONSUMER.CREATE.TOPOSCHED_JOBS." + name,
			"$JS.API.CONSUMER.CREATE.TOPOSCHED_JOBS." + name + ".toposched.jobs.submitted",
			"$JS.API.CONSUMER.DELETE.TOPOSCHED_JOBS." + name,
			"$JS.API.CONSUMER.MSG.NEXT.TOPOSCHED_JOBS." + name,
		} {
			if !denied(want, subj) {
				t.Errorf("the launcher role does not deny %s", subj)
			}
		}
	}
}

// denied reports whether a subject matches one of the role's publish
// denies (NATS token wildcards).
func denied(p *server.Permissions, subject string) bool {
	for _, d := range p.Publish.Deny {
		if server.SubjectMatchesFilter(subject, d) {
			return true
		}
	}
	return false
}

// streamName gives the bus's stream names, whatever the prefix.
func TestStreamNameIsTheBus(t *testing.T) {
	srv := eventstest.Server(t)
	for _, prefix := range []string{events.DefaultPrefix, "lab-2"} {
		ctx := eventstest.Context(t, 10*time.Second)
		b, err := bus.Connect(ctx, bus.Config{URL: srv.ClientURL(), Prefix: prefix, SkipStreams: true})
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range events.Domains {
			if got, want := streamName(prefix, d), b.StreamName(d); got != want {
				t.Errorf("streamName(%q, %s) = %s, bus says %s", prefix, d, got, want)
			}
		}
		_ = b.Close()
	}
}

// serviceDurables names every durable consumer the services create, on its
// stream, and nothing else: readiness and the launcher role rely on it.
func TestServiceDurablesAreTheConsumers(t *testing.T) {
	srv := eventstest.Server(t)
	ctx := eventstest.Context(t, 30*time.Second)
	b := eventstest.Bus(t, srv.ClientURL(), "test")
	file := filepath.Join(t.TempDir(), "cluster.yaml")
	if err := os.WriteFile(file, []byte("name: m\nnodes:\n  - {name: n, count: 1, gpus: 8, gpu_model: A100}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	op, err := operator.Start(ctx, b, operator.Config{Services: operator.All, ClusterFile: file, Sole: true}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = op.Stop() })
	var want, got []string
	for _, svc := range operator.All {
		for _, d := range serviceDurables[svc] {
			want = append(want, b.StreamName(d.domain)+"/"+d.name)
		}
	}
	for _, d := range events.Domains {
		s, err := b.JetStream().Stream(ctx, b.StreamName(d))
		if err != nil {
			t.Fatal(err)
		}
		infos := s.ListConsumers(ctx)
		for ci := range infos.Info() {
			if ci.Config.Durable != "" {
				got = append(got, b.StreamName(d)+"/"+ci.Name)
			}
		}
		if err := infos.Err(); err != nil {
			t.Fatal(err)
		}
	}
	if !slices.Equal(sorted(want), sorted(got)) {
		t.Errorf("serviceDurables: %v\nthe services' durable consumers: %v", sorted(want), sorted(got))
	}
}
