package store

import (
	"testing"

	"github.com/toposched/toposched/events"
)

func TestForkIsIndependent(t *testing.T) {
	t.Parallel()
	s, err := New()
	if err != nil {
		t.Fatal(err)
	}
	node := events.TopologyNode{Name: "n", GPUs: []events.GPU{{Index: 0}, {Index: 1}}}
	if err := s.UpsertNode(node); err != nil {
		t.Fatal(err)
	}
	if err := s.Allocate("j", []GPUKey{{"n", 0}, {"n", 1}}); err != nil {
		t.Fatal(err)
	}
	f := s.Fork()
	if _, err := f.Release("j"); err != nil {
		t.Fatal(err)
	}
	if got := f.Snapshot().FreeCount(); got != 2 {
		t.Errorf("fork: %d free, want 2", got)
	}
	if got := s.Snapshot().FreeCount(); got != 0 {
		t.Errorf("store after the fork's release: %d free, want 0", got)
	}
	if err := s.Allocate("k", []GPUKey{{"n", 0}}); err == nil {
		t.Error("the store let k take j's GPU")
	}
}
