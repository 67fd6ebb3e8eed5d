package launcher

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/events/bus"
)

func record(t *testing.T, v any, at time.Time) bus.Record {
	t.Helper()
	name, err := events.NameOf(v)
	if err != nil {
		t.Fatal(err)
	}
	body, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	// As the watchdog reads it: an event its schema refuses is ignored.
	if err := bus.Decode(name, body, name.New()); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return bus.Record{Name: name, Body: body, Env: events.Envelope{Subject: events.KeyOf(v), Time: at}}
}

func heartbeat(node string, jobs ...string) *events.AgentHeartbeat {
	hb := &events.AgentHeartbeat{Node: node, Agent: node + "-1", StartedAt: time.Unix(0, 0).UTC(), SentAt: time.Unix(1, 0).UTC(),
		IntervalSeconds: 1, Address: node}
	for _, j := range jobs {
		hb.Jobs = append(hb.Jobs, events.AgentJob{JobID: j, Ranks: []int{0}})
	}
	return hb
}

func TestWatchdog(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	const ttl = 10 * time.Second
	decided := &events.PlacementDecided{JobID: "j", Strategy: "topology-aware", DecidedAt: t0,
		Ranks: []events.RankPlacement{{Rank: 0, Node: "a"}, {Rank: 1, Node: "b"}},
		Nodes: []events.NodePlacement{{Node: "a", GPUs: []int{0}, CUDAVisibleDevices: "0"}, {Node: "b", GPUs: []int{0}, CUDAVisibleDevices: "0"}}}
	type step struct {
		at    time.Duration // after t0
		event any           // applied at that time, or nil: check
		want  string        // for a check: the reason of the finish, "" none
	}
	for _, tc := range []struct {
		name    string
		command string
		steps   []step
	}{
		{name: "both agents answer: nothing lost", command: "train", steps: []step{
			{0, decided, ""}, {1 * time.Second, heartbeat("a", "j"), ""}, {2 * time.Second, heartbeat("b", "j"), ""},
			{9 * time.Second, heartbeat("a", "j"), ""}, {9 * time.Second, heartbeat("b", "j"), ""},
			{15 * time.Second, nil, ""},
		}},
		{name: "an agent falls silent", command: "train", steps: []step{
			{0, decided, ""}, {1 * time.Second, heartbeat("a", "j"), ""}, {1 * time.Second, heartbeat("b", "j"), ""},
			{8 * time.Second, heartbeat("a", "j"), ""},
			{11 * time.Second, nil, ""}, // b silent for exactly 10 s: not yet
			{11*time.Second + time.Millisecond, nil, events.ReasonAgentLost},
		}},
		{name: "no agent takes the job", command: "train", steps: []step{
			{0, decided, ""}, {1 * time.Second, heartbeat("a", "j"), ""}, {5 * time.Second, heartbeat("b"), ""},
			{10 * time.Second, nil, ""},
			{10*time.Second + time.Millisecond, nil, events.ReasonNoAgent},
		}},
		{name: "a job without a command is not watched", steps: []step{
			{0, decided, ""}, {time.Hour, nil, ""},
		}},
		{name: "a released job is not watched", command: "train", steps: []step{
			{0, decided, ""}, {1 * time.Second, &events.PlacementReleased{JobID: "j", Status: events.StatusSucceeded}, ""},
			{time.Hour, nil, ""},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			w, err := NewWatchdog(WatchdogConfig{AgentTTL: ttl}, Deps{Log: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatal(err)
			}
			var now time.Time
			w.now = func() time.Time { return now }
			w.started = t0
			now = t0
			w.apply(record(t, &events.JobSubmitted{JobID: "j", GPUs: 2, Command: tc.command}, t0))
			for _, s := range tc.steps {
				now = t0.Add(s.at)
				if s.event != nil {
					w.apply(record(t, s.event, now))
					continue
				}
				fins := w.check()
				var got string
				if len(fins) > 0 {
					got = fins[0].Reason
					if fins[0].Status != events.StatusLost || fins[0].JobID != "j" {
						t.Errorf("finish %+v", fins[0])
					}
				}
				if got != s.want {
					t.Fatalf("at %s: finish reason %q, want %q (%+v)", s.at, got, s.want, fins)
				}
				if len(fins) > 0 && len(w.check()) != 0 {
					t.Errorf("the job was finished twice")
				}
			}
		})
	}
}

// TestWatchdogWarnsOfRanksOutlivingTTL: an agent whose ranks would outlive
// the watchdog's TTL (or run on without it) is warned of once per run.
func TestWatchdogWarnsOfRanksOutlivingTTL(t *testing.T) {
	t.Parallel()
	const ttl = 10 * time.Second
	for _, tc := range []struct {
		name  string
		beats []*events.AgentHeartbeat
		want  int // warnings
	}{
		{"stops within the TTL", []*events.AgentHeartbeat{stopsAfter(heartbeat("a"), 8)}, 0},
		{"stops at the TTL", []*events.AgentHeartbeat{stopsAfter(heartbeat("a"), 10)}, 1},
		{"runs on without its agent", []*events.AgentHeartbeat{heartbeat("a")}, 1},
		{"once per run of the agent", []*events.AgentHeartbeat{stopsAfter(heartbeat("a"), 12), stopsAfter(heartbeat("a"), 12)}, 1},
		{"a restarted agent again", []*events.AgentHeartbeat{stopsAfter(heartbeat("a"), 12), restarted(stopsAfter(heartbeat("a"), 12))}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var buf bytes.Buffer
			w, err := NewWatchdog(WatchdogConfig{AgentTTL: ttl}, Deps{Log: slog.New(slog.NewTextHandler(&buf, nil))})
			if err != nil {
				t.Fatal(err)
			}
			for _, hb := range tc.beats {
				w.apply(record(t, hb, time.Now()))
			}
			if got := strings.Count(buf.String(), "agent outlives the TTL"); got != tc.want {
				t.Errorf("%d warnings, want %d:\n%s", got, tc.want, buf.String())
			}
		})
	}
}

func stopsAfter(hb *events.AgentHeartbeat, seconds float64) *events.AgentHeartbeat {
	hb.RanksStopAfterSeconds = seconds
	return hb
}

func restarted(hb *events.AgentHeartbeat) *events.AgentHeartbeat {
	hb.Agent += "-restarted"
	return hb
}

// TestWatchdogRun: Ready comes once the stored jobs are read, and a job
// decided before the watchdog started, which no agent takes, is finished
// as lost once the TTL has passed since the start.
func TestWatchdogRun(t *testing.T) {
	t.Parallel()
	e := newAgentEnv(t)
	e.submit(t, &events.JobSubmitted{JobID: "orphan", Command: "train"}, 0)
	const ttl = 200 * time.Millisecond
	w, err := NewWatchdog(WatchdogConfig{AgentTTL: ttl}, Deps{Bus: e.b, Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(e.ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("watchdog: %v", err)
		}
	})
	select {
	case <-w.Ready():
	case err := <-done:
		done <- err // for the cleanup
		t.Fatalf("watchdog ended before it was ready: %v", err)
	case <-e.ctx.Done():
		t.Fatal("the watchdog is not ready")
	}
	w.mu.Lock()
	watched := len(w.jobs)
	w.mu.Unlock()
	if watched != 1 {
		t.Fatalf("ready with %d watched jobs, want the stored one", watched)
	}
	waitUntil(t, 30*time.Second, func() (bool, string) {
		f := e.finished(t)["orphan"]
		return f != nil && f.Status == events.StatusLost && f.Reason == events.ReasonNoAgent, "the orphan is not finished as lost for want of an agent"
	})
}

// TestWatchdogRunNeedsBus: a watchdog built without a bus (as the unit
// tests above build theirs) refuses to run, naming what it lacks.
func TestWatchdogRunNeedsBus(t *testing.T) {
	t.Parallel()
	w, err := NewWatchdog(WatchdogConfig{AgentTTL: time.Second}, Deps{})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Run(context.Background()); err == nil || !strings.Contains(err.Error(), "Bus is required") {
		t.Fatalf("Run without a bus: %v", err)
	}
	if _, err := NewWatchdog(WatchdogConfig{}, Deps{}); err == nil {
		t.Fatal("a watchdog with no TTL was made")
	}
}
