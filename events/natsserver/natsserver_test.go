package natsserver

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

func start(t *testing.T, cfg Config) *Server {
	t.Helper()
	srv, err := Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	return srv
}

// The default listens on loopback only, and so does a Config that names no
// host.
func TestStartListensOnLoopbackByDefault(t *testing.T) {
	for name, cfg := range map[string]Config{
		"DefaultConfig": func() Config { c := DefaultConfig(); c.Port = -1; return c }(),
		"no host":       {Port: -1},
	} {
		t.Run(name, func(t *testing.T) {
			cfg.StoreDir = t.TempDir()
			srv := start(t, cfg)
			if a := srv.Addr(); a == nil || !a.IP.IsLoopback() {
				t.Fatalf("listens on %v, want a loopback address", a)
			}
			if u := srv.ClientURL(); !strings.HasPrefix(u, "nats://127.0.0.1:") {
				t.Errorf("ClientURL %s, want nats://127.0.0.1:PORT", u)
			}
			if srv.RequiresAuth() {
				t.Errorf("loopback without credentials requires auth")
			}
		})
	}
}

func TestIsLoopback(t *testing.T) {
	for host, want := range map[string]bool{
		"127.0.0.1": true, "127.1.2.3": true, "::1": true, "[::1]": true, "localhost": true, "LOCALHOST": true,
		"": false, "0.0.0.0": false, "::": false, "10.0.0.5": false, "nats.example.com": false,
	} {
		if got := IsLoopback(host); got != want {
			t.Errorf("IsLoopback(%q) = %v, want %v", host, got, want)
		}
	}
}

// A host beyond loopback with no way to authenticate is refused before
// anything listens, with what to do.
func TestStartRefusesOpenListenWithoutAuth(t *testing.T) {
	conf := filepath.Join(t.TempDir(), "open.conf")
	if err := os.WriteFile(conf, []byte("max_payload: 1MB\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	noAuthUser := filepath.Join(t.TempDir(), "noauth.conf")
	if err := os.WriteFile(noAuthUser, []byte("authorization { users: [{user: a, password: b}] }\nno_auth_user: a\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for name, cfg := range map[string]Config{
		"bare":                {Host: "0.0.0.0", Port: -1},
		"config without auth": {Host: "0.0.0.0", Port: -1, ConfigFile: conf},
		"no_auth_user":        {Host: "0.0.0.0", Port: -1, ConfigFile: noAuthUser},
	} {
		t.Run(name, func(t *testing.T) {
			cfg.StoreDir = t.TempDir()
			srv, err := Start(cfg)
			if err == nil {
				srv.Shutdown()
				t.Fatal("started on 0.0.0.0 without authentication")
			}
			for _, want := range []string{"0.0.0.0", "127.0.0.1"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not mention %s", err, want)
				}
			}
		})
	}
}

// Generated credentials: private files, read back unchanged on the next
// start, the only way in, and each role with its own permissions.
func TestGeneratedCredentials(t *testing.T) {
	data := t.TempDir()
	dir := filepath.Join(data, "credentials")
	roles := []Role{
		{Name: "operator"},
		{Name: "launcher", Permissions: &server.Permissions{
			Publish:   &server.SubjectPermission{Allow: []string{"allowed.>"}},
			Subscribe: &server.SubjectPermission{Allow: []string{"_INBOX.>"}},
		}},
	}
	creds, err := EnsureCredentials(dir, roles)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(creds.Created(), ","); got != "operator,launcher" {
		t.Errorf("created %q, want operator,launcher", got)
	}
	wantMode(t, dir, 0o700)
	for _, r := range roles {
		wantMode(t, creds.File(r.Name), 0o600)
	}
	pub := creds.users[1].pub

	// A file others can read is made private again; the key is kept.
	if err := os.Chmod(creds.File("launcher"), 0o644); err != nil {
		t.Fatal(err)
	}
	creds, err = EnsureCredentials(dir, roles)
	if err != nil {
		t.Fatal(err)
	}
	if len(creds.Created()) != 0 || creds.users[1].pub != pub {
		t.Errorf("second EnsureCredentials: created %v, launcher key changed %v", creds.Created(), creds.users[1].pub != pub)
	}
	wantMode(t, creds.File("launcher"), 0o600)

	srv := start(t, Config{Host: "127.0.0.1", Port: -1, StoreDir: data, Credentials: creds})
	if !srv.RequiresAuth() {
		t.Fatal("a server with generated credentials does not require auth")
	}
	if nc, err := nats.Connect(srv.ClientURL(), nats.Timeout(5*time.Second)); err == nil {
		nc.Close()
		t.Fatal("an anonymous client connected")
	} else if !errors.Is(err, nats.ErrAuthorization) {
		t.Errorf("anonymous client: %v, want an authorization violation", err)
	}
	connect := func(role string) (*nats.Conn, chan error) {
		opt, err := creds.Option(role)
		if err != nil {
			t.Fatal(err)
		}
		errs := make(chan error, 8)
		nc, err := nats.Connect(srv.ClientURL(), opt, nats.Timeout(5*time.Second),
			nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { errs <- err }))
		if err != nil {
			t.Fatalf("connect as %s: %v", role, err)
		}
		t.Cleanup(nc.Close)
		return nc, errs
	}
	op, _ := connect("operator")
	js, err := jetstream.New(op)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"allowed.>", "denied.>"}}); err != nil {
		t.Fatalf("operator creates a stream: %v", err)
	}
	launcher, errs := connect("launcher")
	ljs, err := jetstream.New(launcher)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ljs.Publish(ctx, "allowed.x", []byte("1")); err != nil {
		t.Errorf("launcher publishes allowed.x: %v", err)
	}
	if err := launcher.Publish("denied.x", []byte("1")); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-errs:
		if !errors.Is(err, nats.ErrPermissionViolation) || !strings.Contains(err.Error(), "denied.x") {
			t.Errorf("launcher publishing denied.x: %v, want a permissions violation", err)
		}
	case <-ctx.Done():
		t.Error("launcher publishing denied.x: no permissions violation")
	}
}

func wantMode(t *testing.T, path string, want os.FileMode) {
	t.Helper()
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != want {
		t.Errorf("%s: mode %v, want %v", path, st.Mode().Perm(), want)
	}
}

// A store that cannot be created fails at once, naming the path; so does a
// store the server itself cannot start JetStream on, with the server's
// own words.
func TestStartFailsFastOnABadStoreDir(t *testing.T) {
	file := filepath.Join(t.TempDir(), "a-file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	blocked := t.TempDir()
	// JetStream keeps its streams in <store>/jetstream: make that a file.
	if err := os.WriteFile(filepath.Join(blocked, server.JetStreamStoreDir), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, dir string
		want      []string
	}{
		{"uncreatable", filepath.Join(file, "data"), []string{filepath.Join(file, "data"), "cannot create"}},
		{"a file", file, []string{file, "not a directory"}},
		{"jetstream refuses it", blocked, []string{blocked, "JetStream"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			began := time.Now()
			srv, err := Start(Config{Port: -1, StoreDir: c.dir})
			if err == nil {
				srv.Shutdown()
				t.Fatalf("started on store %s", c.dir)
			}
			if took := time.Since(began); took > 5*time.Second {
				t.Errorf("took %s to fail, want at once", took)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
}

// A read-only store fails at once, naming the path (skipped as root, who
// may write anyway; e2e/disk_test.go mounts a read-only filesystem there).
func TestStartFailsFastOnAReadOnlyStoreDir(t *testing.T) {
	if os.Geteuid() == 0 {
		t.Skip("root writes to a mode 0500 directory")
	}
	dir := filepath.Join(t.TempDir(), "ro")
	if err := os.Mkdir(dir, 0o500); err != nil {
		t.Fatal(err)
	}
	srv, err := Start(Config{Port: -1, StoreDir: dir})
	if err == nil {
		srv.Shutdown()
		t.Fatal("started on a read-only store")
	}
	if !strings.Contains(err.Error(), dir) || !strings.Contains(err.Error(), "not writable") {
		t.Errorf("error %q: want the path and 'not writable'", err)
	}
}

func TestSizeStore(t *testing.T) {
	const gb = 1 << 30
	for _, c := range []struct {
		name             string
		configured       int64
		used, free, want uint64
	}{
		{"roomy disk keeps the configured limit", 8 * gb, 0, 100 * gb, 8 * gb},
		{"3 MB disk", 8 * gb, 0, 3 << 20, 3 << 20 / 10 * 9},
		{"what is stored counts as room", 8 * gb, 5 * gb, 2 * gb, 5*gb + 2*gb/10*9},
		{"full disk keeps the floor", 8 * gb, 0, 0, MinMaxStore},
	} {
		if got := SizeStore(c.configured, c.used, c.free); uint64(got) != c.want {
			t.Errorf("%s: SizeStore(%d, %d, %d) = %d, want %d", c.name, c.configured, c.used, c.free, got, c.want)
		}
	}
}

// The server never claims more file storage than the data dir's
// filesystem has free.
func TestStartSizesStoreFromTheDisk(t *testing.T) {
	dir := t.TempDir()
	free, err := freeBytes(dir)
	if errors.Is(err, errors.ErrUnsupported) {
		t.Skip("free space unknown on this system")
	}
	if err != nil {
		t.Fatal(err)
	}
	srv := start(t, Config{Port: -1, StoreDir: dir, MaxStore: 1 << 60})
	if got := uint64(srv.MaxStore()); got > free || got < MinMaxStore {
		t.Errorf("MaxStore %d with %d bytes free, want at most the free space", got, free)
	}
	st, err := srv.Storage()
	if err != nil {
		t.Fatal(err)
	}
	if st.Disabled || st.Max != uint64(srv.MaxStore()) || !st.DiskKnown || st.DiskFree == 0 {
		t.Errorf("Storage %+v, want JetStream on with max %d and the disk's free space", st, srv.MaxStore())
	}
}

// A config file's users guard a listen beyond loopback; its store limits
// are used, capped by the disk.
func TestStartWithConfigFile(t *testing.T) {
	conf := filepath.Join(t.TempDir(), "auth.conf")
	body := "authorization { users: [{user: svc, password: s3cret}] }\njetstream { max_file_store: 2MB }\n"
	if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	srv := start(t, Config{Port: -1, StoreDir: t.TempDir(), ConfigFile: conf})
	if !srv.RequiresAuth() || srv.MaxStore() > 2<<20 {
		t.Errorf("RequiresAuth %v, MaxStore %d; want true and at most 2MB", srv.RequiresAuth(), srv.MaxStore())
	}
	if nc, err := nats.Connect(srv.ClientURL(), nats.Timeout(5*time.Second)); err == nil {
		nc.Close()
		t.Error("an anonymous client connected")
	}
	nc, err := nats.Connect(srv.ClientURL(), nats.UserInfo("svc", "s3cret"), nats.Timeout(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	nc.Close()
}

// ReadCredentials takes every seed file of a known role, leaves out (and
// names) the others, makes a loosened file private again, and a file that
// is no seed is an error naming it; SetCredentials then lets in exactly
// those users.
func TestReadCredentials(t *testing.T) {
	dir := t.TempDir()
	known := func(role string) (*server.Permissions, bool) {
		return nil, role == "operator" || role == "agent-n1"
	}
	if _, err := EnsureCredentials(dir, []Role{{Name: "operator"}, {Name: "agent-n1"}, {Name: "stranger"}}); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(dir, "agent-n1.nk"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "junk.nk"), []byte("not a seed"), 0o600); err != nil {
		t.Fatal(err)
	}
	creds, errs := ReadCredentials(dir, func(role string) (*server.Permissions, bool) {
		_, ok := known(role)
		return nil, ok || role == "junk"
	})
	if creds == nil || !slices.Equal(creds.Roles(), []string{"agent-n1", "operator"}) {
		t.Fatalf("roles %v, want agent-n1 and operator", creds.Roles())
	}
	if len(errs) != 2 || !strings.Contains(errors.Join(errs...).Error(), "stranger") || !strings.Contains(errors.Join(errs...).Error(), "junk.nk") {
		t.Fatalf("errors %v, want stranger left out and junk.nk unreadable", errs)
	}
	if st, err := os.Stat(filepath.Join(dir, "agent-n1.nk")); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("agent-n1.nk: %v %v, want 0600", st.Mode(), err)
	}
	if _, errs := ReadCredentials(t.TempDir(), known); len(errs) == 0 {
		t.Fatal("an empty directory read as credentials")
	}
}

// The credentials and the storage limit are both changed by reloads of the
// running server's options: neither undoes the other (a user added, then
// the limit raised, still signs in; the limit raised, then a user added,
// keeps its raise).
func TestReloadsKeepEachOther(t *testing.T) {
	data := t.TempDir()
	dir := filepath.Join(data, "credentials")
	creds, err := EnsureCredentials(dir, []Role{{Name: "operator"}})
	if err != nil {
		t.Fatal(err)
	}
	srv := start(t, Config{Host: "127.0.0.1", Port: -1, StoreDir: data, Credentials: creds, MaxStore: 64 << 20})
	more, err := EnsureCredentials(dir, []Role{{Name: "operator"}, {Name: "agent-n1"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.SetCredentials(more); err != nil {
		t.Fatal(err)
	}
	limit := srv.maxStore.Load() + 32<<20
	if err := srv.raiseMaxStore(limit); err != nil {
		t.Fatal(err)
	}
	opt, err := more.Option("agent-n1")
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(srv.ClientURL(), opt)
	if err != nil {
		t.Fatalf("a user added before the limit was raised: %v", err)
	}
	nc.Close()
	if err := srv.SetCredentials(creds); err != nil {
		t.Fatal(err)
	}
	if got := srv.ns.JetStreamConfig().MaxStore; got != limit {
		t.Fatalf("max_file_store %d after a credentials reload, want the raised %d", got, limit)
	}
}
