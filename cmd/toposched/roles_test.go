package main

import (
	"bytes"
	"flag"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/events/bus"
	"github.com/toposched/toposched/events/eventstest"
	"github.com/toposched/toposched/events/natsserver"
	"github.com/toposched/toposched/services/analysis"
	"github.com/toposched/toposched/services/discovery"
	"github.com/toposched/toposched/services/operator"
)

var update = flag.Bool("update", false, "rewrite deploy/nats/auth.conf")

// rolePasswords are the environment auth.conf reads its passwords from.
var rolePasswords = []string{"TOPOSCHED_OPERATOR_PASSWORD", "TOPOSCHED_LAUNCHER_PASSWORD", "TOPOSCHED_POLICY_PASSWORD", "NATS_SYS_PASSWORD"}

// conf runs toposched roles conf with args and returns what it prints.
func conf(t *testing.T, args ...string) string {
	t.Helper()
	g := &globals{prefix: events.DefaultPrefix}
	cmd := newRoles(g)
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(io.Discard)
	cmd.SetArgs(append([]string{"conf"}, args...))
	if err := cmd.Execute(); err != nil {
		t.Fatal(err)
	}
	return out.String()
}

// The shipped auth.conf is what toposched roles conf --passwords prints:
// one definition of what each role may do. Write it again with
// go test ./cmd/toposched -run TestShippedAuthConfIsGenerated -update.
func TestShippedAuthConfIsGenerated(t *testing.T) {
	file := filepath.Join("..", "..", "deploy", "nats", "auth.conf")
	got := conf(t, "--passwords")
	if *update {
		if err := os.WriteFile(file, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if got != string(want) {
		t.Fatalf("deploy/nats/auth.conf is not toposched roles conf --passwords: run this test with -update")
	}
	for _, k := range rolePasswords {
		t.Setenv(k, "pw")
	}
	t.Setenv("NATS_STORE_DIR", t.TempDir())
	opts, err := server.ProcessConfigFile(filepath.Join("..", "..", "deploy", "nats", "standalone.conf"))
	if err != nil {
		t.Fatal(err)
	}
	r := roles{events.DefaultPrefix}
	var names []string
	for _, u := range opts.Users {
		names = append(names, u.Username)
		if u.Username == "sys" {
			continue
		}
		want, ok := r.permissions(u.Username)
		if !ok || !samePermissions(want, u.Permissions) {
			t.Errorf("user %s: permissions %+v, want the role's %+v", u.Username, u.Permissions, want)
		}
	}
	if !slices.Equal(sorted(names), sorted([]string{roleOperator, roleLauncher, rolePolicyAdmin, "sys"})) {
		t.Errorf("auth.conf users %v", names)
	}
}

// roles conf --dir lets in exactly the users of the directory, each with
// its role's permissions, whatever its name (dots, spaces, wildcards).
func TestRolesConfNkeys(t *testing.T) {
	dir := t.TempDir()
	wanted, err := issuedRoles(events.DefaultPrefix, []string{"gpu-001", "rack1.gpu-002", "n*>"}, []string{"research", "ads team"})
	if err != nil {
		t.Fatal(err)
	}
	creds, err := natsserver.EnsureCredentials(dir, wanted)
	if err != nil {
		t.Fatal(err)
	}
	opts := serverOptionsOfConf(t, dir)
	r := roles{events.DefaultPrefix}
	if len(opts.Nkeys) != len(wanted) {
		t.Fatalf("%d nkey users, want %d", len(opts.Nkeys), len(wanted))
	}
	for _, role := range creds.Roles() {
		i := slices.IndexFunc(opts.Nkeys, func(u *server.NkeyUser) bool { return u.Nkey == creds.PublicKey(role) })
		if i < 0 {
			t.Fatalf("%s: no user", role)
		}
		want, _ := r.permissions(role)
		if !samePermissions(want, opts.Nkeys[i].Permissions) {
			t.Errorf("%s: permissions %+v, want %+v", role, opts.Nkeys[i].Permissions, want)
		}
	}
}

// roles issue --services writes a seed for each service run apart (the
// Helm chart's Deployments mount one each), and roles conf lets each in
// with its service's permissions: only placement's may write decisions.
func TestRolesIssueServices(t *testing.T) {
	dir := t.TempDir()
	cmd := newRoles(&globals{prefix: events.DefaultPrefix})
	cmd.SetOut(io.Discard)
	cmd.SetErr(io.Discard)
	cmd.SetArgs([]string{"issue", "--dir", dir, "--services", "--agent", "gpu-001"})
	if err := cmd.Execute(); err != nil {
		t.Fatal(err)
	}
	opts := serverOptionsOfConf(t, dir)
	creds, errs := natsserver.ReadCredentials(dir, roles{events.DefaultPrefix}.permissions)
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	want := append([]string{roleOperator, roleLauncher, rolePolicyAdmin, "agent-gpu-001"}, serviceNames...)
	if got := creds.Roles(); !slices.Equal(sorted(got), sorted(want)) {
		t.Fatalf("roles %v, want %v", got, want)
	}
	r := roles{events.DefaultPrefix}
	for _, svc := range serviceNames {
		i := slices.IndexFunc(opts.Nkeys, func(u *server.NkeyUser) bool { return u.Nkey == creds.PublicKey(svc) })
		if i < 0 {
			t.Fatalf("%s: no user in roles conf", svc)
		}
		p, _ := r.permissions(svc)
		if !samePermissions(p, opts.Nkeys[i].Permissions) {
			t.Errorf("%s: permissions %+v, want the service's %+v", svc, opts.Nkeys[i].Permissions, p)
		}
		decided := events.NewSubjects(events.DefaultPrefix).Of(events.NamePlacementDecided)
		if may(opts.Nkeys[i].Permissions, decided) != (svc == operator.Placement) {
			t.Errorf("%s may publish %s: %v", svc, decided, svc != operator.Placement)
		}
		// Only the Kubernetes service speaks for Kubernetes: its jobs,
		// under any tenant. It and the Slurm sync service publish the
		// GPUs held outside toposched.
		subj := events.NewSubjects(events.DefaultPrefix)
		submitted := subj.Scoped(events.NameJobSubmitted, events.TenantScope("team-a"))
		if may(opts.Nkeys[i].Permissions, submitted) != (svc == roleKube) {
			t.Errorf("%s may publish %s: %v", svc, submitted, svc != roleKube)
		}
		held := subj.ForNode(events.NameTopologyHeld, "gpu-001")
		if outside := svc == roleKube || svc == roleSlurm; may(opts.Nkeys[i].Permissions, held) != outside {
			t.Errorf("%s may publish %s: %v", svc, held, !outside)
		}
	}
}

// serverOptionsOfConf reads roles conf --dir's output for dir as
// nats-server reads its configuration.
func serverOptionsOfConf(t *testing.T, dir string) *server.Options {
	t.Helper()
	text := conf(t, "--dir", dir)
	file := filepath.Join(t.TempDir(), "roles.conf")
	if err := os.WriteFile(file, []byte("jetstream {store_dir: $NATS_STORE_DIR}\n"+text), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("NATS_SYS_PASSWORD", "pw")
	t.Setenv("NATS_STORE_DIR", t.TempDir())
	opts, err := server.ProcessConfigFile(file)
	if err != nil {
		t.Fatalf("%v\n%s", err, text)
	}
	return opts
}

// samePermissions compares two roles' permissions, lists as sets; nil
// (everything) is the operator's publish and subscribe ">".
func samePermissions(a, b *server.Permissions) bool {
	norm := func(p *server.Permissions) [4][]string {
		if p == nil {
			return [4][]string{{">"}, nil, {">"}, nil}
		}
		var out [4][]string
		if p.Publish != nil {
			out[0], out[1] = sorted(p.Publish.Allow), sorted(p.Publish.Deny)
		}
		if p.Subscribe != nil {
			out[2], out[3] = sorted(p.Subscribe.Allow), sorted(p.Subscribe.Deny)
		}
		return out
	}
	x, y := norm(a), norm(b)
	for i := range x {
		if !slices.Equal(x[i], y[i]) {
			return false
		}
	}
	return true
}

func sorted(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return slices.Compact(s)
}

// may reports whether p lets its user publish on subject (nil: all).
func may(p *server.Permissions, subject string) bool {
	if p == nil {
		return true
	}
	match := func(filters []string) bool {
		return slices.ContainsFunc(filters, func(f string) bool { return server.SubjectMatchesFilter(subject, f) })
	}
	return match(p.Publish.Allow) && !match(p.Publish.Deny)
}

// Each role may publish its own part and nothing else: the roles
// table of docs/security.md, subject by subject (e2e/security_test.go checks the
// same against a real server).
func TestRolesPublishOnlyTheirPart(t *testing.T) {
	r := roles{events.DefaultPrefix}
	s := events.NewSubjects("")
	scoped := func(n events.Name, scope events.Scope) string { return s.Scoped(n, scope) }
	gpu1, gpu2 := events.NodeScope("gpu-001"), events.NodeScope("gpu-002")
	research, ads := events.TenantScope("research"), events.TenantScope("ads")
	durable := "$JS.API.CONSUMER.CREATE.TOPOSCHED_JOBS." + analysis.HandlerSubmitted
	for _, tc := range []struct {
		role   string
		may    []string
		mayNot []string
	}{
		{roleLauncher,
			[]string{scoped(events.NameJobSubmitted, events.Scope{}), scoped(events.NameJobSubmitted, research), scoped(events.NameJobFinished, ads),
				scoped(events.NameJobMigrationAccepted, research), scoped(events.NameRuntimeTelemetry, events.Scope{})},
			[]string{scoped(events.NameAgentHeartbeat, gpu1), scoped(events.NameRanksExited, gpu1), scoped(events.NameJobFinished, gpu1),
				s.Of(events.NamePlacementDecided), s.Of(events.NamePlacementTerm), s.Of(events.NamePlacementReleased),
				scoped(events.NameTopologyNode, gpu1), "$KV.toposched-policies.x", durable, "$JS.API.STREAM.DELETE.TOPOSCHED_JOBS"}},
		{"tenant-research",
			[]string{scoped(events.NameJobSubmitted, research), scoped(events.NameJobFinished, research),
				scoped(events.NameJobMigrationAccepted, research), scoped(events.NameRuntimeTelemetry, research)},
			[]string{scoped(events.NameJobSubmitted, ads), scoped(events.NameJobSubmitted, events.Scope{}), scoped(events.NameJobFinished, ads),
				scoped(events.NameJobFinished, events.Scope{}), scoped(events.NameJobFinished, gpu1), scoped(events.NameAgentHeartbeat, gpu1),
				s.Of(events.NamePlacementDecided), durable}},
		{"agent-gpu-001",
			[]string{scoped(events.NameTopologyNode, gpu1), scoped(events.NameTopologyHealth, gpu1), scoped(events.NameAgentHeartbeat, gpu1),
				scoped(events.NameRanksExited, gpu1), scoped(events.NameRankLog, gpu1), scoped(events.NameJobFinished, gpu1),
				scoped(events.NameRuntimeTelemetry, gpu1)},
			[]string{scoped(events.NameAgentHeartbeat, gpu2), scoped(events.NameRanksExited, gpu2), scoped(events.NameTopologyNode, gpu2),
				scoped(events.NameJobFinished, gpu2), scoped(events.NameJobFinished, research), scoped(events.NameJobFinished, events.Scope{}),
				scoped(events.NameJobSubmitted, research), s.Of(events.NamePlacementDecided), s.Of(events.NameTopologyFabric), durable}},
		{operator.Placement,
			[]string{s.Of(events.NamePlacementDecided), s.Of(events.NamePlacementTerm), s.Of(events.NamePlacementReleased),
				s.Of(events.NameJobFinished), "$KV.toposched-leases.x"},
			[]string{s.Of(events.NameJobAnalyzed), s.Of(events.NameRuntimeTuning), scoped(events.NameTopologyNode, gpu1),
				scoped(events.NameJobSubmitted, research), scoped(events.NameAgentHeartbeat, gpu1), "$KV.toposched-policies.x"}},
		{operator.Analysis,
			[]string{s.Of(events.NameJobAnalyzed), s.Of(events.NamePlacementRejected)},
			[]string{s.Of(events.NamePlacementDecided), s.Of(events.NamePlacementTerm), s.Of(events.NamePlacementReleased),
				"$KV.toposched-leases.x"}},
		{operator.Optimizer,
			[]string{s.Of(events.NameRuntimeTuning), s.Of(events.NamePlacementMigration), "$KV.toposched-calibration.x"},
			[]string{s.Of(events.NamePlacementDecided), s.Of(events.NameJobFinished)}},
		{operator.Discovery,
			[]string{scoped(events.NameTopologyNode, gpu1), s.Of(events.NameTopologyFabric)},
			[]string{s.Of(events.NamePlacementDecided), scoped(events.NameJobFinished, gpu1)}},
		{rolePolicyAdmin,
			[]string{"$KV.toposched-policies.set", "$KV.toposched-calibration.set"},
			[]string{s.Of(events.NamePlacementDecided), scoped(events.NameJobSubmitted, research)}},
	} {
		p, ok := r.permissions(tc.role)
		if !ok {
			t.Fatalf("%s: no such role", tc.role)
		}
		for _, subj := range tc.may {
			if !may(p, subj) {
				t.Errorf("%s may not publish %s, and should", tc.role, subj)
			}
		}
		for _, subj := range tc.mayNot {
			if may(p, subj) {
				t.Errorf("%s may publish %s, and should not", tc.role, subj)
			}
		}
	}
}

// Every event is in publishedBy: a new event is given its owners, or none
// (the users' and agents'), on purpose.
func TestPublishedByCoversTheCatalogue(t *testing.T) {
	for _, n := range events.Catalogue {
		if _, ok := publishedBy[n]; !ok {
			t.Errorf("publishedBy has no entry for %s", n)
		}
	}
}

// A role's name is its seed file's and the other way round, one to one,
// whatever the node's or tenant's name.
func TestRoleNamesAreInjective(t *testing.T) {
	r := roles{events.DefaultPrefix}
	seen := map[string]events.Scope{}
	for _, name := range []string{"gpu-001", "gpu_001", "gpu.001", "gpu%2E001", "gpu 001", "a/b", "..", "é", "n*>", "-x"} {
		for _, scope := range []events.Scope{events.NodeScope(name), events.TenantScope(name)} {
			role, err := scope.Role()
			if err != nil {
				t.Fatal(err)
			}
			if prev, ok := seen[role]; ok {
				t.Fatalf("%v and %v share role %s", prev, scope, role)
			}
			seen[role] = scope
			if strings.ContainsAny(role, "/.") && role != "." {
				t.Errorf("role %s of %v is not a plain file name", role, scope)
			}
			if back, ok := events.ScopeOfRole(role); !ok || back != scope {
				t.Errorf("role %s reads back as %v, want %v", role, back, scope)
			}
			if _, ok := r.permissions(role); !ok {
				t.Errorf("role %s has no permissions", role)
			}
		}
	}
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
	backgroundOperator(t, ctx, operator.Config{Services: operator.All, Discovery: discovery.Config{ClusterFile: file}, Sole: true},
		operator.Deps{Bus: b, Log: slog.New(slog.DiscardHandler)})
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
