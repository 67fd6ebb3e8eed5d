package store

import (
	"errors"
	"strings"
	"testing"

	"github.com/toposched/toposched/events"
)

// TestSetHeld: a held GPU is not free and cannot be allocated; each report
// replaces the node's last; a node re-report keeps the holds; an unknown
// GPU is refused with nothing applied.
func TestSetHeld(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	mustUpsert(t, s, report("n1", 0, "A100", 4))
	held := func(idx ...int) events.TopologyHeld {
		h := events.TopologyHeld{Node: "n1"}
		for _, i := range idx {
			h.GPUs = append(h.GPUs, events.HeldGPU{Index: i, By: "claim ns/c"})
		}
		return h
	}
	free := func() []int {
		var out []int
		for _, g := range s.Snapshot().GPUs("n1") {
			if g.Free() {
				out = append(out, g.Index)
			}
		}
		return out
	}
	if err := s.SetHeld(held(1, 2)); err != nil {
		t.Fatal(err)
	}
	if got := free(); len(got) != 2 || got[0] != 0 || got[1] != 3 {
		t.Fatalf("free GPUs %v, want [0 3]", got)
	}
	if c := s.Snapshot().NodeCounts(""); c.MaxFree() != 2 {
		t.Errorf("node counts: most free on a node %d, want 2", c.MaxFree())
	}
	err := s.Allocate("j", keys("n1", 2))
	if !errors.Is(err, ErrConflict) || !strings.Contains(err.Error(), "held outside toposched (claim ns/c)") {
		t.Fatalf("Allocate of a held GPU: %v", err)
	}
	// A re-report of the node keeps the holds.
	mustUpsert(t, s, report("n1", 0, "A100", 4))
	if got := free(); len(got) != 2 {
		t.Fatalf("after a re-report: free %v, want [0 3]", got)
	}
	// The next report replaces this one.
	if err := s.SetHeld(held(3)); err != nil {
		t.Fatal(err)
	}
	if got := free(); len(got) != 3 || got[2] != 2 {
		t.Fatalf("after the second report: free %v, want [0 1 2]", got)
	}
	// An unknown GPU: refused, nothing applied.
	if err := s.SetHeld(held(0, 9)); err == nil || !strings.Contains(err.Error(), "n1/9") {
		t.Fatalf("held unknown GPU: %v", err)
	}
	if got := free(); len(got) != 3 {
		t.Fatalf("a refused report changed the store: free %v", got)
	}
	if err := s.SetHeld(events.TopologyHeld{Node: "n9"}); err == nil {
		t.Fatal("held GPUs of an unknown node were accepted")
	}
	if err := s.SetHeld(held()); err != nil {
		t.Fatal(err)
	}
	if got := free(); len(got) != 4 {
		t.Fatalf("an empty report left holds: free %v", got)
	}
}
