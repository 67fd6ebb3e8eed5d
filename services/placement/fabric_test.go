package placement_test

import (
	"context"
	"testing"
	"time"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/events/eventstest"
	"github.com/toposched/toposched/services/placement"
)

// A fabric makes the nodes' leaf and pod domains of their GPUs, whether it
// arrives before or after the nodes, and survives a rebuild; a broken one
// is refused and the previous one stays.
func TestFabricDomains(t *testing.T) {
	t.Parallel()
	srv := eventstest.Server(t)
	b := eventstest.Bus(t, srv.ClientURL(), "test")
	ctx := eventstest.Context(t, 30*time.Second)
	s := placement.NewOnBus(t, b, placement.Config{})
	fabric := &events.TopologyFabric{Cluster: "c", Switches: []events.Switch{
		{Name: "l1", Tier: "leaf", Nodes: []string{"a"}},
		{Name: "l2", Tier: "leaf", Nodes: []string{"b"}},
		{Name: "s", Tier: "spine", Switches: []string{"l1", "l2"}},
	}}
	if err := s.OnFabric(ctx, events.Envelope{}, fabric); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"a", "b"} {
		n := &events.TopologyNode{Name: name, GPUs: []events.GPU{{Index: 0}, {Index: 1}}}
		if err := s.OnNode(ctx, events.Envelope{}, n); err != nil {
			t.Fatal(err)
		}
	}
	check := func(s *placement.Service, when string) {
		t.Helper()
		snap := s.Store().Snapshot()
		if d, ok := snap.Domain("leaf:l1"); !ok || d.Total != 2 || d.Free != 2 {
			t.Errorf("%s: leaf:l1 = %+v, %v", when, d, ok)
		}
		if d, ok := snap.Domain("pod:s"); !ok || d.Total != 4 {
			t.Errorf("%s: pod:s = %+v, %v", when, d, ok)
		}
	}
	check(s, "live")
	broken := &events.TopologyFabric{Cluster: "c", Switches: []events.Switch{{Name: "l1", Tier: "leaf", Switches: []string{"nope"}}}}
	if err := s.OnFabric(ctx, events.Envelope{}, broken); err == nil {
		t.Fatal("a broken fabric was accepted")
	}
	check(s, "after a broken fabric")

	// The same, rebuilt from the stream by a fresh replica.
	for _, v := range []any{fabric, &events.TopologyNode{Name: "a", GPUs: []events.GPU{{Index: 0}, {Index: 1}}},
		&events.TopologyNode{Name: "b", GPUs: []events.GPU{{Index: 0}, {Index: 1}}}} {
		if _, err := b.Publish(context.Background(), v); err != nil {
			t.Fatal(err)
		}
	}
	fresh := placement.NewOnBus(t, b, placement.Config{})
	if err := fresh.Rebuild(ctx); err != nil {
		t.Fatal(err)
	}
	check(fresh, "rebuilt")
}
