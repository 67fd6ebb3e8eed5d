package placement_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/events/eventstest"
	"github.com/toposched/toposched/services/placement"
)

// The rebuild's log counts the cluster's nodes, not the node events the
// topology stream keeps: discovery publishes every node again each time it
// starts, and a 6-node cluster was logged as 12 nodes after one restart.
func TestRebuildLogCountsNodesOnce(t *testing.T) {
	t.Parallel()
	srv := eventstest.Server(t)
	b := eventstest.Bus(t, srv.ClientURL(), "test")
	ctx := eventstest.Context(t, 30*time.Second)
	const starts = 3
	names := []string{"a", "b"}
	for range starts {
		for _, name := range names {
			if _, err := b.Publish(context.Background(), &events.TopologyNode{Name: name, GPUs: []events.GPU{{Index: 0}}}); err != nil {
				t.Fatal(err)
			}
		}
	}
	var logged bytes.Buffer
	s, err := placement.New(placement.Config{}, placement.Deps{Publish: b, Read: b, Consume: b, Subjects: b.Subjects,
		Log: slog.New(slog.NewJSONHandler(&logged, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Rebuild(ctx); err != nil {
		t.Fatal(err)
	}
	var line struct {
		Nodes      *int `json:"nodes"`
		NodeEvents *int `json:"node_events"`
	}
	found := false
	sc := bufio.NewScanner(&logged)
	for sc.Scan() {
		var rec struct {
			Msg string `json:"msg"`
		}
		if json.Unmarshal(sc.Bytes(), &rec) == nil && rec.Msg == "state rebuilt from streams" {
			if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
				t.Fatal(err)
			}
			found = true
		}
	}
	if !found {
		t.Fatalf("no 'state rebuilt from streams' line in:\n%s", logged.String())
	}
	if line.Nodes == nil || *line.Nodes != len(names) {
		t.Errorf("rebuild logged nodes=%v for a %d-node cluster published %d times:\n%s", deref(line.Nodes), len(names), starts, logged.String())
	}
	if line.NodeEvents == nil || *line.NodeEvents != starts*len(names) {
		t.Errorf("rebuild logged node_events=%v, want %d", deref(line.NodeEvents), starts*len(names))
	}
}

func deref(p *int) any {
	if p == nil {
		return "(absent)"
	}
	return *p
}

// GPUs held outside toposched (topology.held) are not free after a
// rebuild, and a report that gives them back frees them.
func TestHeldGPUsRebuilt(t *testing.T) {
	t.Parallel()
	srv := eventstest.Server(t)
	b := eventstest.Bus(t, srv.ClientURL(), "test")
	ctx := eventstest.Context(t, 30*time.Second)
	for _, v := range []any{
		&events.TopologyNode{Name: "a", GPUs: []events.GPU{{Index: 0}, {Index: 1}}},
		&events.TopologyHeld{Node: "a", GPUs: []events.HeldGPU{{Index: 0, By: "claim ns/other"}}, ObservedAt: time.Now().UTC()},
	} {
		if _, err := b.Publish(ctx, v); err != nil {
			t.Fatal(err)
		}
	}
	s, err := placement.New(placement.Config{}, placement.Deps{Publish: b, Read: b, Consume: b, Subjects: b.Subjects})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Rebuild(ctx); err != nil {
		t.Fatal(err)
	}
	free := func() []int {
		var out []int
		for _, g := range s.Store().Snapshot().FreeGPUs("a") {
			out = append(out, g.Index)
		}
		return out
	}
	if got := free(); len(got) != 1 || got[0] != 1 {
		t.Fatalf("free GPUs after the rebuild %v, want [1]", got)
	}
	if err := s.OnHeld(ctx, events.Envelope{}, &events.TopologyHeld{Node: "a", ObservedAt: time.Now().UTC()}); err != nil {
		t.Fatal(err)
	}
	if got := free(); len(got) != 2 {
		t.Fatalf("free GPUs after the holds were given back %v, want [0 1]", got)
	}
}

// A rebuilt queue is in the order it had: the turns the waits were given
// come back from the placement log, not from run times learned anew
// (which a new replica does not have yet). In arrival order the turns
// are not read.
func TestRebuildKeepsQueueTurns(t *testing.T) {
	t.Parallel()
	w := newMigWorld(t)
	at := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	wait := []events.Reason{{Code: "insufficient_free_gpus", Message: "needs 16 free GPUs"}}
	for _, p := range []struct {
		id   string
		turn time.Time
	}{{"first-long", at.Add(10 * time.Hour)}, {"then-short", at.Add(time.Hour)}} {
		w.publish(analyzed(t, events.JobSubmitted{JobID: p.id, GPUs: 16}))
		w.publish(&events.PlacementPending{JobID: p.id, Reasons: wait, Turn: &events.QueueTurn{At: p.turn, ExpectedRunSeconds: 3600}})
	}
	for _, tt := range []struct {
		order string
		want  []string
	}{
		{placement.QueueByEnd, []string{"then-short", "first-long"}},
		{placement.QueueByArrival, []string{"first-long", "then-short"}},
	} {
		s := placement.NewStandby(t, w.b, placement.Config{QueueOrder: tt.order})
		if err := s.Rebuild(w.ctx); err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, j := range s.Store().Snapshot().PendingQueue() {
			got = append(got, j.ID)
		}
		if !slices.Equal(got, tt.want) {
			t.Errorf("%s: rebuilt queue %v, want %v", tt.order, got, tt.want)
		}
	}
}
