package policies

import (
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toposched/toposched/events/eventstest"
)

func TestBucketName(t *testing.T) {
	for _, tc := range []struct{ prefix, want string }{
		{"", "toposched-policies"},
		{"toposched", "toposched-policies"},
		{"acme-prod", "acme-prod-policies"},
		{"a$b", "a_b-policies"},
	} {
		if got := BucketName(tc.prefix); got != tc.want {
			t.Errorf("BucketName(%q) = %q, want %q", tc.prefix, got, tc.want)
		}
	}
}

func TestBundleRoundTrip(t *testing.T) {
	want, err := Compile(Default, "default")
	if err != nil {
		t.Fatal(err)
	}
	data, rev, err := EncodeBundle("default", Default)
	if err != nil {
		t.Fatal(err)
	}
	if rev != want.Revision {
		t.Errorf("bundle revision %s, directory revision %s", rev, want.Revision)
	}
	s, name, rev2, err := compileValue(t.Context(), data)
	if err != nil {
		t.Fatal(err)
	}
	if name != "default" || rev2 != want.Revision || s.Revision != want.Revision || len(s.Files) != len(want.Files) {
		t.Errorf("decoded %s %s %v, want default %s %v", name, s.Revision, s.Files, want.Revision, want.Files)
	}
}

func TestEncodeBundleRefuses(t *testing.T) {
	for _, tc := range []struct {
		name string
		fsys fs.FS
		want string
	}{
		{"too big", fstest.MapFS{"big.rego": {Data: []byte("package x\n# " + strings.Repeat("x", MaxBundleSize))}},
			"bytes, more than the 1048576 bytes a pushed set may hold"},
		{"not utf-8", fstest.MapFS{"bin.rego": {Data: []byte{0xff, 0xfe}}}, "bin.rego: bundle_error: not UTF-8 text"},
		{"empty", fstest.MapFS{"README.md": {Data: []byte("hi")}}, "no .rego files"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := EncodeBundle("s", tc.fsys)
			var errs Errors
			if !errors.As(err, &errs) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want Errors containing %q", err, tc.want)
			}
		})
	}
}

func TestDecodeBundleRefuses(t *testing.T) {
	good := `package toposched.nodes.x\n`
	for _, tc := range []struct {
		name, value, want string
	}{
		{"not json", `package x`, "not a policy bundle"},
		{"unknown field", `{"name":"a","files":{"a.rego":"` + good + `"},"extra":1}`, "unknown field"},
		{"trailing data", `{"name":"a","files":{"a.rego":"` + good + `"}} {}`, "data after the JSON object"},
		{"no name", `{"files":{"a.rego":"` + good + `"}}`, "no name"},
		{"no files", `{"name":"a","files":{}}`, "has no files"},
		{"parent path", `{"name":"a","files":{"../a.rego":"` + good + `"}}`, "not a clean relative path"},
		{"absolute path", `{"name":"a","files":{"/a.rego":"` + good + `"}}`, "not a clean relative path"},
		{"backslash", `{"name":"a","files":{"a\\b.rego":"` + good + `"}}`, "not a clean relative path"},
		{"not rego", `{"name":"a","files":{"a.sh":"rm -rf /"}}`, "neither a .rego file nor data.json"},
		{"revision mismatch", `{"name":"a","revision":"00","files":{"a.rego":"` + good + `"}}`, "does not match its files"},
		{"too big", `{"name":"a","files":{"a.rego":"` + strings.Repeat("#", MaxBundleSize) + `"}}`, "more than the 1048576 bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := DecodeBundle([]byte(tc.value))
			var errs Errors
			if !errors.As(err, &errs) || errs[0].Code != CodeBundleError || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want a bundle_error containing %q", err, tc.want)
			}
		})
	}
}

// FuzzBundle checks that DecodeBundle never panics, and that what it
// accepts is a set of clean paths whose revision survives a round trip.
func FuzzBundle(f *testing.F) {
	data, _, err := EncodeBundle("default", Default)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(data)
	for _, s := range []string{
		``, `null`, `[]`, `{}`, `{"name":"a"}`,
		`{"name":"a","files":{"a.rego":"package x"}}`,
		`{"name":"a","files":{"data.json":"{}","p/q.rego":"package x"}}`,
		`{"name":"a","files":{"../a.rego":""}}`,
		`{"name":"a","files":{"a.rego":"x","a.rego":"y"}}`,
		`{"name":"a","revision":"zz","files":{"a.rego":""}}`,
		`{"name":"\u0000","files":{"\u00ff.rego":"\ud800"}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, value []byte) {
		b, err := DecodeBundle(value)
		if err != nil {
			var errs Errors
			if !errors.As(err, &errs) || len(errs) == 0 || errs[0].Code != CodeBundleError {
				t.Fatalf("DecodeBundle error %T %v, want a bundle_error", err, err)
			}
			if ValueRevision(value) == "" {
				t.Fatal("no revision for a refused value")
			}
			return
		}
		if b.Name == "" || len(b.Files) == 0 {
			t.Fatalf("accepted %+v", b)
		}
		for p := range b.Files {
			if !fs.ValidPath(p) || (!strings.HasSuffix(p, ".rego") && p != DataFile) {
				t.Fatalf("accepted path %q", p)
			}
		}
		rev := ValueRevision(value)
		again, err := json.Marshal(Bundle{Name: b.Name, Revision: rev, Files: b.Files})
		if err != nil {
			t.Fatal(err)
		}
		b2, err := DecodeBundle(again)
		if err != nil && len(again) <= MaxBundleSize {
			t.Fatalf("re-encoded bundle refused: %v", err)
		}
		if err == nil && revisionOf(b2.files()) != rev {
			t.Fatalf("revision changed over a round trip")
		}
	})
}

// kvFixture is a policy bucket on an embedded NATS server.
func kvFixture(t *testing.T) jetstream.KeyValue {
	t.Helper()
	srv := eventstest.Server(t)
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := eventstest.Context(t, 30*time.Second)
	kv, err := EnsureKV(ctx, js, "", 1)
	if err != nil {
		t.Fatal(err)
	}
	// Idempotent: every replica runs it at start-up, topoctl opens it.
	if _, err := EnsureKV(ctx, js, "", 1); err != nil {
		t.Fatalf("second EnsureKV: %v", err)
	}
	if _, err := OpenKV(ctx, js, ""); err != nil {
		t.Fatalf("OpenKV: %v", err)
	}
	return kv
}

// bundleOf encodes a testdata set without compiling it, as someone
// bypassing Push (the nats CLI) would put it.
func bundleOf(t *testing.T, dir string) []byte {
	t.Helper()
	data, _, err := EncodeBundle(dir, os.DirFS(filepath.Join("testdata", dir)))
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func TestPushRefusesBrokenSetLocally(t *testing.T) {
	kv := kvFixture(t)
	ctx := eventstest.Context(t, 30*time.Second)
	for _, dir := range []string{"syntax", "failing", "forbidden"} {
		_, _, err := Push(ctx, kv, dir, os.DirFS(filepath.Join("testdata", dir)))
		var errs Errors
		if !errors.As(err, &errs) {
			t.Errorf("%s: Push = %v, want Errors", dir, err)
		}
	}
	if _, err := kv.Get(ctx, KVKey); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("a refused set reached the bucket: %v", err)
	}
}

func TestWatchKV(t *testing.T) {
	kv := kvFixture(t)
	ctx := eventstest.Context(t, 60*time.Second)
	def, err := Compile(Default, "default")
	if err != nil {
		t.Fatal(err)
	}
	// A set in the bucket before the watcher starts is its first update.
	rev, kvRev, err := Push(ctx, kv, "default", Default)
	if err != nil {
		t.Fatal(err)
	}
	if rev != def.Revision || kvRev == 0 {
		t.Fatalf("Push = %s %d, want %s", rev, kvRev, def.Revision)
	}
	updates := make(chan KVUpdate, 16)
	ready := make(chan struct{})
	go func() {
		if err := WatchKVUpdates(ctx, kv, func() { close(ready) }, func(u KVUpdate) { updates <- u }); err != nil {
			t.Error(err)
		}
	}()
	next := func() KVUpdate {
		t.Helper()
		select {
		case u := <-updates:
			return u
		case <-ctx.Done():
			t.Fatal("no update")
		}
		return KVUpdate{}
	}
	if u := next(); u.Set == nil || u.Set.Revision != def.Revision || u.KVRevision != kvRev || u.Name != "default" {
		t.Fatalf("first update %+v", u)
	}
	select {
	case <-ready:
	case <-ctx.Done():
		t.Fatal("not ready after the initial value")
	}

	for _, tc := range []struct {
		name  string
		value []byte
		want  []string // in the error: file:line and why
	}{
		{"syntax error", bundleOf(t, "syntax"), []string{"broken.rego:", "rego_parse_error"}},
		{"failing test", bundleOf(t, "failing"), []string{"always_test.rego:9:", "test_failed"}},
		{"forbidden built-in", bundleOf(t, "forbidden"), []string{"http.rego:4:", "undefined function http.send"}},
		{"not a bundle", []byte("package x"), []string{"bundle_error", "not a policy bundle"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			kvRev, err := PushBundle(ctx, kv, tc.value)
			if err != nil {
				t.Fatal(err)
			}
			u := next()
			if u.Set != nil || u.Err == nil || u.KVRevision != kvRev || len(u.Revision) != 64 {
				t.Fatalf("update %+v, want a refusal of revision %d", u, kvRev)
			}
			var errs Errors
			if !errors.As(u.Err, &errs) {
				t.Fatalf("error %T, want Errors", u.Err)
			}
			for _, w := range tc.want {
				if !strings.Contains(u.Err.Error(), w) {
					t.Errorf("error %v lacks %q", u.Err, w)
				}
			}
		})
	}

	if err := kv.Delete(ctx, KVKey); err != nil {
		t.Fatal(err)
	}
	if u := next(); !u.Deleted || u.Set != nil || u.Err != nil {
		t.Fatalf("delete seen as %+v", u)
	}
}
