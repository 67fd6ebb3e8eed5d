package natsserver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// disk stands in for the store's filesystem: its free space is its
// capacity less what the store directory holds, so it fills as JetStream
// writes, and a test enlarges or shrinks it.
type disk struct {
	dir      string
	capacity atomic.Int64
}

func (d *disk) free(string) (uint64, error) {
	used, err := dirSize(d.dir)
	if err != nil {
		return 0, err
	}
	return uint64(max(d.capacity.Load()-int64(used), 0)), nil
}

// waitUntil polls cond until it holds, failing the test with cond's last
// word after d.
func waitUntil(t *testing.T, d time.Duration, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		ok, why := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %s: %s", d, why)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// fill publishes 32 KB bodies until JetStream refuses one, and returns
// the refusal's error code.
func fill(t *testing.T, js jetstream.JetStream, limit int64) jetstream.ErrorCode {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	body := make([]byte, 32<<10)
	for range 2 * int(limit) / len(body) {
		_, err := js.Publish(ctx, "fill.x", body)
		if err == nil {
			continue
		}
		var apiErr *jetstream.APIError
		if !errors.As(err, &apiErr) {
			t.Fatalf("filling the store: %v, want JetStream's refusal", err)
		}
		return apiErr.ErrorCode
	}
	t.Fatalf("published %d bytes under a limit of %d", 2*limit, limit)
	return 0
}

// The file storage limit follows the disk while the server runs: filled
// to "insufficient resources" on a small disk, the disk enlarged, and it
// takes messages again without a restart (it used to keep the limit it
// sized at start); the disk filled by something else, the services'
// account is limited below the server's limit, so that JetStream refuses
// messages instead of writing into a full disk and switching itself off;
// the disk freed, the account's limit is lifted. Where the configuration
// has accounts, theirs are left alone.
func TestStorageLimitFollowsTheDisk(t *testing.T) {
	for _, c := range []struct {
		name string
		conf string
		// user signs in where the configuration has users; creds, with
		// generated credentials.
		user  string
		creds bool
		// lowers: the account's limit can be lowered.
		lowers bool
	}{
		{"no config", "", "", false, true},
		{"config with users", "authorization { users: [{user: svc, password: pw}] }\n", "svc", false, true},
		{"generated credentials", "", "", true, true},
		{"config with accounts", "accounts { A: { jetstream: enabled, users: [{user: svc, password: pw}] } }\n", "svc", false, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			d := &disk{dir: dir}
			d.capacity.Store(3 << 20)
			var logged syncBuffer
			cfg := Config{Port: -1, StoreDir: dir, StorageCheck: 10 * time.Millisecond, freeSpace: d.free,
				Logger: slog.New(slog.NewTextHandler(&logged, nil))}
			if c.conf != "" {
				cfg.ConfigFile = filepath.Join(t.TempDir(), "nats.conf")
				if err := os.WriteFile(cfg.ConfigFile, []byte(c.conf), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			var opts []nats.Option
			if c.creds {
				creds, err := EnsureCredentials(filepath.Join(t.TempDir(), "credentials"), []Role{{Name: "operator"}})
				if err != nil {
					t.Fatal(err)
				}
				opt, err := creds.Option("operator")
				if err != nil {
					t.Fatal(err)
				}
				cfg.Credentials, opts = creds, append(opts, opt)
			}
			srv := start(t, cfg)
			if c.user != "" {
				opts = append(opts, nats.UserInfo(c.user, "pw"))
			}
			js := jetStreamOf(t, srv, opts...)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "FILL", Subjects: []string{"fill.>"}, Storage: jetstream.FileStorage}); err != nil {
				t.Fatal(err)
			}
			small := srv.MaxStore()
			if small > 3<<20 {
				t.Fatalf("MaxStore %d on a 3 MB disk", small)
			}
			if code := fill(t, js, small); code != 10023 {
				t.Errorf("a full store answered error code %d, want 10023 (insufficient resources)", code)
			}

			// Enlarged: the limit is raised and messages are taken again.
			d.capacity.Store(16 << 20)
			waitUntil(t, 20*time.Second, func() (bool, string) {
				return srv.MaxStore() > small+(4<<20), fmt.Sprintf("MaxStore %d after the disk grew from 3 to 16 MB", srv.MaxStore())
			})
			if _, err := js.Publish(ctx, "fill.x", make([]byte, 32<<10)); err != nil {
				t.Fatalf("publish after the disk grew: %v", err)
			}

			// Filled by something else: 256 KB left.
			used, err := dirSize(dir)
			if err != nil {
				t.Fatal(err)
			}
			d.capacity.Store(int64(used) + 256<<10)
			if !c.lowers {
				const warning = "the configuration's accounts keep their own limits"
				waitUntil(t, 20*time.Second, func() (bool, string) {
					return strings.Contains(logged.String(), warning), "no warning that " + warning
				})
				return
			}
			waitUntil(t, 20*time.Second, func() (bool, string) {
				ai, err := js.AccountInfo(ctx)
				if err != nil {
					return false, err.Error()
				}
				return ai.Limits.MaxStore > 0, fmt.Sprintf("account limit %d, want one below the server's %d", ai.Limits.MaxStore, srv.MaxStore())
			})
			if code := fill(t, js, 256<<10); code != 10002 {
				t.Errorf("a store full for its account answered error code %d, want 10002 (account limit)", code)
			}
			if st, err := srv.Storage(); err != nil || st.Disabled {
				t.Fatalf("Storage %+v, %v: JetStream switched off", st, err)
			}

			// Freed: the account's limit is lifted.
			d.capacity.Store(64 << 20)
			waitUntil(t, 20*time.Second, func() (bool, string) {
				ai, err := js.AccountInfo(ctx)
				if err != nil {
					return false, err.Error()
				}
				return ai.Limits.MaxStore < 0, fmt.Sprintf("account limit %d after the disk was freed", ai.Limits.MaxStore)
			})
			if _, err := js.Publish(ctx, "fill.x", make([]byte, 32<<10)); err != nil {
				t.Fatalf("publish after the disk was freed: %v", err)
			}
		})
	}
}

// syncBuffer is a log's text, written and read from several goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// A JetStream that switched itself off (as after a write error on a full
// disk) is started again once there is room, with its streams and
// consumers: it used to stay off until a restart.
func TestJetStreamStartsAgainAfterSwitchingOff(t *testing.T) {
	t.Parallel()
	srv := start(t, Config{Port: -1, StoreDir: t.TempDir(), StorageCheck: 10 * time.Millisecond})
	js := jetStreamOf(t, srv)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}, Storage: jetstream.FileStorage}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateConsumer(ctx, "S", jetstream.ConsumerConfig{Durable: "d", AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, "s.before", []byte("kept")); err != nil {
		t.Fatal(err)
	}
	if err := srv.ns.ShutdownJetStream(); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 20*time.Second, func() (bool, string) {
		st, err := srv.Storage()
		if err != nil {
			return false, err.Error()
		}
		return !st.Disabled, "JetStream still off"
	})
	if _, err := js.Publish(ctx, "s.after", []byte("taken")); err != nil {
		t.Fatalf("publish after JetStream started again: %v", err)
	}
	st, err := js.Stream(ctx, "S")
	if err != nil {
		t.Fatal(err)
	}
	if n := st.CachedInfo().State.Msgs; n != 2 {
		t.Errorf("the stream holds %d messages, want the one from before and the new one", n)
	}
	waitUntil(t, 20*time.Second, func() (bool, string) {
		_, err := js.Consumer(ctx, "S", "d")
		return err == nil, fmt.Sprintf("the durable consumer: %v", err)
	})
}

// jetStreamOf connects to srv with opts until the test ends.
func jetStreamOf(t *testing.T, srv *Server, opts ...nats.Option) jetstream.JetStream {
	t.Helper()
	nc, err := nats.Connect(srv.ClientURL(), opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}
