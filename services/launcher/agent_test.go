package launcher

import (
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestConfigSilence(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name                  string
		ttl, grace, heartbeat time.Duration
		want                  time.Duration // Silence
		wantErr               string        // in Validate's error, "" none
	}{
		{name: "defaults", ttl: DefaultAgentTTL, grace: DefaultGrace, heartbeat: DefaultHeartbeat, want: 15 * time.Second},
		{name: "the e2e's", ttl: 6 * time.Second, grace: time.Second, heartbeat: 250 * time.Millisecond, want: 4750 * time.Millisecond},
		{name: "a fast heartbeat keeps the shim's margin", ttl: 2 * time.Second, grace: time.Second, heartbeat: 10 * time.Millisecond, want: 800 * time.Millisecond},
		{name: "off", ttl: 0, grace: DefaultGrace, heartbeat: DefaultHeartbeat, want: 0},
		{name: "the old default TTL with the default grace", ttl: 15 * time.Second, grace: DefaultGrace, heartbeat: DefaultHeartbeat,
			want: 0, wantErr: "agent ttl 15s: must be at least the grace (10s), two heartbeats (10s) and a margin of one more (5s)"},
		{name: "negative", ttl: -time.Second, grace: DefaultGrace, heartbeat: DefaultHeartbeat, want: 0, wantErr: "agent ttl -1s: must not be negative"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := Config{Node: "a", StateDir: "/tmp/x", AgentTTL: tc.ttl, Grace: tc.grace, Heartbeat: tc.heartbeat}
			c.setDefaults()
			if got := c.Silence(); got != tc.want && tc.wantErr == "" {
				t.Errorf("Silence() = %s, want %s", got, tc.want)
			}
			err := c.Validate()
			switch {
			case tc.wantErr == "" && err != nil:
				t.Errorf("Validate: %v", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Errorf("Validate: %v, want %q", err, tc.wantErr)
			}
		})
	}
}

// TestNewStateDirAbsolute: the shims, in the job's workdir, are given
// the state dir's files by absolute paths.
func TestNewStateDirAbsolute(t *testing.T) {
	t.Parallel()
	a, err := New(Config{Node: "a", StateDir: "relative/state", RunAsAllow: selfAllow(t)}, Deps{Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if !filepath.IsAbs(a.cfg.AliveFile()) || !strings.HasSuffix(a.cfg.StateDir, "relative/state") {
		t.Errorf("state dir %q, alive file %q: want absolute paths", a.cfg.StateDir, a.cfg.AliveFile())
	}
}

// TestMarkAlive: the alive file's mtime is the newest heartbeat's start,
// never moved back by one that finished later.
func TestMarkAlive(t *testing.T) {
	t.Parallel()
	a, err := New(Config{Node: "a", StateDir: t.TempDir(), RunAsAllow: selfAllow(t)}, Deps{Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	for _, step := range []struct {
		at, want time.Time
	}{
		{t0, t0}, // created
		{t0.Add(time.Second), t0.Add(time.Second)}, // moved on
		{t0.Add(time.Millisecond), t0.Add(time.Second)},
	} {
		a.markAlive(step.at)
		fi, err := os.Stat(a.cfg.AliveFile())
		if err != nil {
			t.Fatal(err)
		}
		if !fi.ModTime().Equal(step.want) {
			t.Errorf("after markAlive(%s): mtime %s, want %s", step.at, fi.ModTime().UTC(), step.want)
		}
	}
}
