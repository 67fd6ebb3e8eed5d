package operator

import (
	"context"
	"encoding/json"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/events/bus"
	"github.com/toposched/toposched/events/eventstest"
	"github.com/toposched/toposched/policies"
)

const testdata = "../../policies/testdata"

// policyLog follows the policy stream of a bus.
type policyLog struct {
	t  *testing.T
	ch chan any // *events.PolicyApplied or *events.PolicyRejected
}

func followPolicies(t *testing.T, b *bus.Bus) *policyLog {
	t.Helper()
	l := &policyLog{t: t, ch: make(chan any, 64)}
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		err := b.Follow(ctx, events.DomainPolicy, []string{b.Subjects.Domain(events.DomainPolicy)}, ready, func(r bus.Record) error {
			v := r.Name.New()
			if err := json.Unmarshal(r.Body, v); err != nil {
				t.Errorf("policy event %s: %v", r.Name, err)
				return nil
			}
			l.ch <- v
			return nil
		})
		if err != nil {
			t.Errorf("follow: %v", err)
		}
	}()
	<-ready
	t.Cleanup(func() { cancel(); <-done })
	return l
}

// applied waits for the next policy.applied of replica; a rejection fails
// the test.
func (l *policyLog) applied(replica string) *events.PolicyApplied {
	l.t.Helper()
	for {
		select {
		case v := <-l.ch:
			switch e := v.(type) {
			case *events.PolicyApplied:
				if e.Replica == replica {
					return e
				}
			case *events.PolicyRejected:
				l.t.Fatalf("rejected, want applied: %+v", e)
			}
		case <-time.After(30 * time.Second):
			l.t.Fatal("no policy.applied")
		}
	}
}

// rejected waits for the next policy.rejected; an applied set fails the
// test.
func (l *policyLog) rejected() *events.PolicyRejected {
	l.t.Helper()
	for {
		select {
		case v := <-l.ch:
			switch e := v.(type) {
			case *events.PolicyRejected:
				return e
			case *events.PolicyApplied:
				l.t.Fatalf("applied, want rejected: %+v", e)
			}
		case <-time.After(30 * time.Second):
			l.t.Fatal("no policy.rejected")
		}
	}
}

// startPlacement runs a placement replica with the given policy config.
func startPlacement(t *testing.T, b *bus.Bus, cfg Config) *Operator {
	t.Helper()
	cfg.Services = []string{Placement}
	op, _, err := StartOn(t, eventstest.Context(t, 30*time.Second), b, cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	return op
}

func policyKV(t *testing.T, b *bus.Bus) jetstream.KeyValue {
	t.Helper()
	kv, err := policies.OpenKV(eventstest.Context(t, 10*time.Second), b.JetStream(), b.Subjects.Prefix)
	if err != nil {
		t.Fatal(err)
	}
	return kv
}

// copySet writes the files of fsys into dir.
func copySet(t *testing.T, fsys fs.FS, dir string) {
	t.Helper()
	err := fs.WalkDir(fsys, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := fs.ReadFile(fsys, p)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dir, p), b, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
}

func compileDir(t *testing.T, dir string) *policies.Set {
	t.Helper()
	s, err := policies.CompileDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// extraPolicy is a valid policy with a test, to make a set that differs
// from the shipped one.
const extraPolicy = `package toposched.nodes.no_drained

deny contains v if {
	input.node.labels.drained == "true"
	v := {"code": "drained", "msg": "node is drained"}
}

test_drained_denied if {
	count(deny) == 1 with input as {"node": {"labels": {"drained": "true"}}}
}
`

func TestPushedSets(t *testing.T) {
	srv := eventstest.Server(t)
	b := eventstest.Bus(t, srv.ClientURL(), "test")
	log := followPolicies(t, b)
	op := startPlacement(t, b, Config{Replica: "r1"})
	ctx := eventstest.Context(t, 60*time.Second)

	def := log.applied("r1")
	if def.Source != events.PolicySourceDefault || def.Name != "default" || def.TestsPassed == 0 || def.Previous != "" {
		t.Fatalf("start-up applied %+v", def)
	}
	if got := op.PlacementService().Policies(); got == nil || got.Revision != def.Revision {
		t.Fatalf("in force %v, announced %s", got, def.Revision)
	}

	kv := policyKV(t, b)
	dir := t.TempDir()
	copySet(t, policies.Default, dir)
	if err := os.WriteFile(filepath.Join(dir, "no_drained.rego"), []byte(extraPolicy), 0o644); err != nil {
		t.Fatal(err)
	}
	rev, kvRev, err := policies.Push(ctx, kv, "lab", os.DirFS(dir))
	if err != nil {
		t.Fatal(err)
	}
	a := log.applied("r1")
	if a.Revision != rev || a.Source != events.PolicySourceKV || a.KVRevision != kvRev || a.Name != "lab" ||
		a.Previous != def.Revision || a.TestsPassed != def.TestsPassed+1 {
		t.Fatalf("applied %+v, want revision %s kv %d after %s", a, rev, kvRev, def.Revision)
	}
	if got := op.PlacementService().Policies().Revision; got != rev {
		t.Fatalf("in force %s, want the pushed %s", got, rev)
	}

	for _, tc := range []struct {
		dir, file, code string
		line            int
		msg             string
	}{
		{"syntax", "broken.rego", "rego_parse_error", 0, ""},
		{"failing", "always_test.rego", "test_failed", 9, "test_fails failed"},
		{"forbidden", "http.rego", "rego_type_error", 4, "undefined function http.send"},
	} {
		t.Run(tc.dir, func(t *testing.T) {
			// Bypass Push, which refuses these before NATS: someone with
			// the nats CLI, or a topoctl whose OPA differs.
			data, badRev, err := policies.EncodeBundle(tc.dir, os.DirFS(filepath.Join(testdata, tc.dir)))
			if err != nil {
				t.Fatal(err)
			}
			kvRev, err := policies.PushBundle(ctx, kv, data)
			if err != nil {
				t.Fatal(err)
			}
			r := log.rejected()
			if r.Revision != badRev || r.KVRevision != kvRev || r.Source != events.PolicySourceKV || r.Name != tc.dir ||
				r.InForce != rev || r.Replica != "r1" {
				t.Errorf("rejected %+v, want %s at kv %d with %s in force", r, badRev, kvRev, rev)
			}
			found := false
			for _, e := range r.Errors {
				if e.File == tc.file && e.Code == tc.code && (tc.line == 0 && e.Line > 0 || e.Line == tc.line) &&
					strings.Contains(e.Message, tc.msg) {
					found = true
				}
			}
			if !found {
				t.Errorf("errors %+v do not name %s:%d %s", r.Errors, tc.file, tc.line, tc.code)
			}
			if got := op.PlacementService().Policies().Revision; got != rev {
				t.Errorf("in force %s after a refused push, want %s", got, rev)
			}
		})
	}

	// Withdrawing the push falls back to the shipped set.
	if err := kv.Delete(ctx, policies.KVKey); err != nil {
		t.Fatal(err)
	}
	back := log.applied("r1")
	if back.Revision != def.Revision || back.Source != events.PolicySourceDefault || back.Previous != rev {
		t.Fatalf("after withdrawal %+v", back)
	}
	if got := op.PlacementService().Policies().Revision; got != def.Revision {
		t.Fatalf("in force %s after withdrawal, want %s", got, def.Revision)
	}
}

func TestDirectoryReload(t *testing.T) {
	srv := eventstest.Server(t)
	b := eventstest.Bus(t, srv.ClientURL(), "test")
	log := followPolicies(t, b)
	dir := t.TempDir()
	copySet(t, policies.Default, dir)
	first := compileDir(t, dir)
	op := startPlacement(t, b, Config{Replica: "r1", Policies: dir, PolicyPoll: 20 * time.Millisecond})
	if a := log.applied("r1"); a.Revision != first.Revision || a.Source != events.PolicySourceDirectory || a.Name != dir {
		t.Fatalf("start-up applied %+v, want %s from %s", a, first.Revision, dir)
	}

	file := filepath.Join(dir, "tenant_isolation.rego")
	good, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		name    string
		content string
		refused string // file:line expected, or "" when the edit is taken
	}{
		{"edit", string(good) + "\n# an edit\n", ""},
		{"forbidden built-in", "package toposched.nodes.tenant_isolation\n\ndeny contains v if {\n\tv := http.send({})\n}\n", "tenant_isolation.rego:4"},
		{"syntax error", "package toposched.nodes.tenant_isolation\n\ndeny contains v if {\n", "tenant_isolation.rego:"},
		{"fixed", string(good), ""},
	}
	inForce := first.Revision
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			writeFile(t, file, st.content)
			if st.refused == "" {
				a := log.applied("r1")
				if a.Revision == inForce || a.Previous != inForce {
					t.Fatalf("applied %+v after %s", a, inForce)
				}
				inForce = a.Revision
			} else {
				r := log.rejected()
				if r.Source != events.PolicySourceDirectory || r.InForce != inForce || len(r.Errors) == 0 {
					t.Fatalf("rejected %+v", r)
				}
				e := r.Errors[0]
				if loc := e.File + ":" + strconv.Itoa(e.Line); !strings.HasPrefix(loc, st.refused) || e.Line == 0 {
					t.Errorf("refused at %s (%s), want %s", loc, e.Message, st.refused)
				}
			}
			if got := op.PlacementService().Policies().Revision; got != inForce {
				t.Errorf("in force %s, want %s", got, inForce)
			}
		})
	}
}

// TestPrecedence: the newest valid set of the directory and the bucket is
// in force, whichever arrived last at the replica.
func TestPrecedence(t *testing.T) {
	srv := eventstest.Server(t)
	b := eventstest.Bus(t, srv.ClientURL(), "test")
	ctx := eventstest.Context(t, 60*time.Second)
	kv := policyKV(t, b)

	// A set pushed before the replica starts is newer than a directory
	// whose files are older: it wins at start-up.
	pushDir := t.TempDir()
	copySet(t, policies.Default, pushDir)
	if err := os.WriteFile(filepath.Join(pushDir, "no_drained.rego"), []byte(extraPolicy), 0o644); err != nil {
		t.Fatal(err)
	}
	pushed, _, err := policies.Push(ctx, kv, "pushed", os.DirFS(pushDir))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	copySet(t, policies.Default, dir)
	old := time.Now().Add(-time.Hour)
	touchAll(t, dir, old)

	log := followPolicies(t, b)
	op := startPlacement(t, b, Config{Replica: "r1", Policies: dir, PolicyPoll: 20 * time.Millisecond})
	if a := log.applied("r1"); a.Revision != pushed || a.Source != events.PolicySourceKV {
		t.Fatalf("start-up applied %+v, want the pushed %s", a, pushed)
	}

	// An edit of the directory after the push wins.
	file := filepath.Join(dir, "leaf_span.rego")
	src, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, file, string(src)+"\n# newer\n")
	a := log.applied("r1")
	if a.Source != events.PolicySourceDirectory || a.Previous != pushed {
		t.Fatalf("after a directory edit %+v", a)
	}
	edited := a.Revision

	// A push after that wins again, even of the same set as before.
	again, _, err := policies.Push(ctx, kv, "pushed", os.DirFS(pushDir))
	if err != nil {
		t.Fatal(err)
	}
	if a := log.applied("r1"); a.Revision != again || a.Source != events.PolicySourceKV || a.Previous != edited {
		t.Fatalf("after a second push %+v", a)
	}
	if got := op.PlacementService().Policies().Revision; got != pushed {
		t.Fatalf("in force %s, want %s", got, pushed)
	}
}

// writeFile replaces a file at once, as editors and ConfigMap updates do.
func writeFile(t *testing.T, file, content string) {
	t.Helper()
	tmp := file + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, file); err != nil {
		t.Fatal(err)
	}
}

func touchAll(t *testing.T, dir string, at time.Time) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if err := os.Chtimes(filepath.Join(dir, e.Name()), at, at); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chtimes(dir, at, at); err != nil {
		t.Fatal(err)
	}
}

func TestNewestFile(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"a.rego", "b.rego", "sub/c.rego"} {
		if err := os.WriteFile(filepath.Join(dir, f), []byte("package x\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	old := time.Now().Add(-time.Hour).Truncate(time.Second)
	for _, p := range []string{"a.rego", "b.rego", "sub/c.rego", "sub", "."} {
		if err := os.Chtimes(filepath.Join(dir, p), old, old); err != nil {
			t.Fatal(err)
		}
	}
	if got := newestFile(dir, []string{"a.rego", "b.rego", "sub/c.rego"}); !got.Equal(old) {
		t.Fatalf("newest %v, want %v", got, old)
	}
	// Removing a file is an edit too: only the directory records it.
	if err := os.Remove(filepath.Join(dir, "b.rego")); err != nil {
		t.Fatal(err)
	}
	if got := newestFile(dir, []string{"a.rego", "sub/c.rego"}); !got.After(old) {
		t.Fatalf("newest %v after removing a file, want later than %v", got, old)
	}
}

func TestWinner(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	base := &candidate{source: events.PolicySourceDirectory, at: t0}
	def := &candidate{source: events.PolicySourceDefault}
	for _, tc := range []struct {
		name         string
		base, pushed *candidate
		want         *candidate
	}{
		{"only base", base, nil, base},
		{"only pushed", nil, &candidate{at: t0}, nil}, // want set below
		{"push newer", base, &candidate{at: t0.Add(time.Second)}, nil},
		{"push same time wins", base, &candidate{at: t0}, nil},
		{"directory newer", base, &candidate{at: t0.Add(-time.Second)}, base},
		{"shipped set always older", def, &candidate{at: t0.Add(-time.Hour)}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := tc.want
			if want == nil {
				want = tc.pushed
			}
			pl := &policyLoop{base: tc.base, pushed: tc.pushed}
			if got := pl.winner(); got != want {
				t.Errorf("winner %+v, want %+v", got, want)
			}
		})
	}
}

func TestReplicasRejectOnce(t *testing.T) {
	srv := eventstest.Server(t)
	b := eventstest.Bus(t, srv.ClientURL(), "test")
	log := followPolicies(t, b)
	ctx := eventstest.Context(t, 60*time.Second)
	startPlacement(t, b, Config{Replica: "r1"})
	log.applied("r1")
	startPlacement(t, b, Config{Replica: "r2"})
	log.applied("r2")

	kv := policyKV(t, b)
	data, badRev, err := policies.EncodeBundle("syntax", os.DirFS(filepath.Join(testdata, "syntax")))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := policies.PushBundle(ctx, kv, data); err != nil {
		t.Fatal(err)
	}
	if r := log.rejected(); r.Revision != badRev {
		t.Fatalf("rejected %+v", r)
	}
	// A good push after it: once both replicas applied it, both have
	// handled the broken one, and the stream holds one rejection.
	dir := t.TempDir()
	copySet(t, policies.Default, dir)
	if err := os.WriteFile(filepath.Join(dir, "no_drained.rego"), []byte(extraPolicy), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := policies.Push(ctx, kv, "good", os.DirFS(dir)); err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for len(seen) < 2 {
		select {
		case v := <-log.ch:
			switch e := v.(type) {
			case *events.PolicyApplied:
				seen[e.Replica] = true
			case *events.PolicyRejected:
				t.Fatalf("a second rejection reached the stream: %+v", e)
			}
		case <-ctx.Done():
			t.Fatalf("applied by %v only", seen)
		}
	}
	n := 0
	err = b.Replay(ctx, events.DomainPolicy, []string{b.Subjects.Of(events.NamePolicyRejected)}, func(bus.Record) error { n++; return nil })
	if err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Fatalf("stream holds %d rejections, want 1", n)
	}
}

func TestStartPolicyConfig(t *testing.T) {
	srv := eventstest.Server(t)
	b := eventstest.Bus(t, srv.ClientURL(), "test")
	for _, tc := range []struct {
		name     string
		policies string
		wantErr  string // "" when it starts
	}{
		{"none", PoliciesNone, ""},
		{"missing directory", filepath.Join(t.TempDir(), "nope"), "no such file"},
		{"broken directory", filepath.Join(testdata, "syntax"), "broken.rego:"},
		{"failing test", filepath.Join(testdata, "failing"), "always_test.rego:9"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := Config{Services: []string{Placement}, Policies: tc.policies, Replica: tc.name}
			op, stop, err := StartOn(t, eventstest.Context(t, 30*time.Second), b, cfg, slog.New(slog.DiscardHandler))
			if tc.wantErr != "" {
				if err == nil {
					t.Fatal("started")
				}
				if !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer func() {
				if err := stop(); err != nil {
					t.Error(err)
				}
			}()
			if s := op.PlacementService().Policies(); s != nil {
				t.Fatalf("policies off, yet %v in force", s)
			}
		})
	}
}
