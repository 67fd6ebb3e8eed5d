package store

import (
	"testing"

	"github.com/toposched/toposched/events"
)

func TestEachNodeWithGPUsSkipsOrphans(t *testing.T) {
	t.Parallel()
	s, err := New()
	if err != nil {
		t.Fatal(err)
	}
	gpus := func(n int) []events.GPU {
		out := make([]events.GPU, n)
		for i := range out {
			out[i] = events.GPU{Index: i}
		}
		return out
	}
	for _, n := range []events.TopologyNode{
		{Name: "b", Position: 1, GPUs: gpus(2)},
		{Name: "a", Position: 0, GPUs: gpus(3)},
		{Name: "c", Position: 2, GPUs: gpus(1)},
	} {
		if err := s.UpsertNode(n); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Allocate("j", []GPUKey{{Node: "b", Index: 0}}); err != nil {
		t.Fatal(err)
	}
	// b leaves while j still holds one of its GPUs: that GPU is an orphan.
	if err := s.UpsertNode(events.TopologyNode{Name: "b", Position: 1, GPUs: []events.GPU{}, Removed: true}); err != nil {
		t.Fatal(err)
	}
	var got []string
	for n, gs := range s.Snapshot().EachNodeWithGPUs() {
		got = append(got, n.Name)
		for _, g := range gs {
			if g.Node != n.Name {
				t.Errorf("node %s yielded GPU of %s", n.Name, g.Node)
			}
		}
		if want := map[string]int{"a": 3, "c": 1}[n.Name]; len(gs) != want {
			t.Errorf("node %s: %d GPUs, want %d", n.Name, len(gs), want)
		}
	}
	if len(got) != 2 || got[0] != "a" || got[1] != "c" {
		t.Fatalf("nodes %v, want [a c]", got)
	}
}
