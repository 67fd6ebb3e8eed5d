package store

import (
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/toposched/toposched/events"
)

// freeView is what placement reads of free capacity: the cluster's free
// count and each node domain's free GPUs.
func freeView(s *Store) map[string]int {
	snap := s.Snapshot()
	out := map[string]int{"cluster": snap.FreeCount()}
	for _, d := range snap.DomainsOfKind(DomainNode) {
		out[d.ID] = d.Free
	}
	return out
}

func TestMove(t *testing.T) {
	t.Parallel()
	// Two nodes of 4; job "j" holds n1/2, n1/3, n2/0, n2/1 (split across
	// nodes), "other" holds n2/2, and n1/1 is unhealthy.
	setup := func(t *testing.T) *Store {
		s := newStore(t)
		mustUpsert(t, s, report("n1", 0, "A100", 4), report("n2", 1, "A100", 4))
		if err := s.Allocate("j", []GPUKey{{"n1", 2}, {"n1", 3}, {"n2", 0}, {"n2", 1}}); err != nil {
			t.Fatal(err)
		}
		if err := s.Allocate("other", keys("n2", 2)); err != nil {
			t.Fatal(err)
		}
		if err := s.SetHealth(events.TopologyHealth{Node: "n1", Component: "gpu", ID: "1", Health: events.HealthUnhealthy, Reason: "XID 79"}); err != nil {
			t.Fatal(err)
		}
		return s
	}
	tests := []struct {
		name      string
		job       string
		to        []GPUKey
		restore   bool
		wantFreed []GPUKey
		wantErr   error  // errors.Is target; nil with errText "" means success
		errText   string // substring of the error
	}{
		{name: "onto one node, keeping two", job: "j", to: []GPUKey{{"n1", 0}, {"n1", 2}, {"n1", 3}, {"n2", 3}},
			wantFreed: keys("n2", 0, 1)},
		{name: "rank order is not set order", job: "j", to: []GPUKey{{"n2", 3}, {"n1", 3}, {"n1", 0}, {"n1", 2}},
			wantFreed: keys("n2", 0, 1)},
		{name: "to the set it holds", job: "j", to: []GPUKey{{"n2", 1}, {"n2", 0}, {"n1", 3}, {"n1", 2}}},
		{name: "entirely new GPUs", job: "other", to: keys("n1", 0), wantFreed: keys("n2", 2)},
		{name: "target held by another job", job: "j", to: []GPUKey{{"n1", 2}, {"n1", 3}, {"n2", 2}, {"n2", 3}},
			wantErr: ErrConflict, errText: `GPU n2/2 is held by job "other"`},
		{name: "target unhealthy", job: "j", to: []GPUKey{{"n1", 1}, {"n1", 2}, {"n1", 3}, {"n2", 3}},
			wantErr: ErrConflict, errText: "GPU n1/1 is unhealthy (XID 79)"},
		{name: "target missing", job: "j", to: []GPUKey{{"n1", 2}, {"n1", 3}, {"n2", 3}, {"n9", 0}},
			wantErr: ErrConflict, errText: "GPU n9/0 does not exist"},
		{name: "every problem named", job: "j", to: []GPUKey{{"n1", 1}, {"n2", 2}, {"n2", 3}, {"n9", 0}},
			wantErr: ErrConflict, errText: `GPU n1/1 is unhealthy (XID 79); GPU n2/2 is held by job "other"; GPU n9/0 does not exist`},
		{name: "job holding nothing", job: "idle", to: keys("n1", 0), errText: "holds no GPUs"},
		{name: "GPU given twice", job: "j", to: keys("n1", 0, 0), errText: "given twice"},
		{name: "no GPUs", job: "j", errText: "no GPUs given"},
		{name: "no job", to: keys("n1", 0), errText: "empty job id"},
		{name: "restore: unhealthy and missing targets", job: "j", restore: true, to: []GPUKey{{"n1", 1}, {"n1", 2}, {"n1", 3}, {"n9", 0}},
			wantFreed: keys("n2", 0, 1)},
		{name: "restore: job holding nothing", job: "idle", restore: true, to: keys("n1", 0)},
		{name: "restore: another job's GPU", job: "j", restore: true, to: keys("n2", 2),
			wantErr: ErrConflict, errText: `held by job "other"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s := setup(t)
			before := s.Snapshot()
			move := s.Move
			if tt.restore {
				move = s.RestoreMove
			}
			freed, err := move(tt.job, tt.to)
			if tt.errText != "" || tt.wantErr != nil {
				if err == nil {
					t.Fatalf("Move = %v, want an error", freed)
				}
				if tt.wantErr != nil && !errors.Is(err, tt.wantErr) {
					t.Errorf("error %v does not wrap %v", err, tt.wantErr)
				}
				if tt.wantErr == nil && errors.Is(err, ErrConflict) {
					t.Errorf("error %v wraps ErrConflict: a caller's mistake is not a conflict", err)
				}
				if !contains(err.Error(), tt.errText) {
					t.Errorf("error %q lacks %q", err, tt.errText)
				}
				// Nothing changed.
				after := s.Snapshot()
				for _, n := range []string{"n1", "n2"} {
					if !reflect.DeepEqual(before.GPUs(n), after.GPUs(n)) {
						t.Errorf("failed move changed %s:\n%+v\n%+v", n, before.GPUs(n), after.GPUs(n))
					}
				}
				return
			}
			if err != nil {
				t.Fatalf("Move: %v", err)
			}
			if !slices.Equal(freed, tt.wantFreed) {
				t.Errorf("freed %v, want %v", freed, tt.wantFreed)
			}
			want := slices.Clone(tt.to)
			slices.SortFunc(want, compareKeys)
			if got := gpuKeys(s.Snapshot().GPUsOfJob(tt.job)); !slices.Equal(got, want) {
				t.Errorf("job holds %v, want %v", got, want)
			}
			for _, k := range freed {
				g := gpuOf(s.Snapshot(), k)
				if g.JobID != "" {
					t.Errorf("freed %s still held by %q", k, g.JobID)
				}
			}
			// Counts agree with a store where the job was given its new
			// GPUs directly.
			if !tt.restore {
				fresh := setup(t)
				if _, err := fresh.Release(tt.job); err != nil {
					t.Fatal(err)
				}
				if err := fresh.Allocate(tt.job, tt.to); err != nil {
					t.Fatal(err)
				}
				if got, want := freeView(s), freeView(fresh); !maps.Equal(got, want) {
					t.Errorf("free counts after move %v, want %v", got, want)
				}
			}
			// Again: a no-op.
			if freed, err := move(tt.job, tt.to); err != nil || len(freed) != 0 {
				t.Errorf("second move = %v, %v; want nothing freed", freed, err)
			}
		})
	}
}

func TestMoveOffPlaceholder(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	mustUpsert(t, s, report("n1", 0, "A100", 4))
	if err := s.Allocate("j", keys("n1", 2, 3)); err != nil {
		t.Fatal(err)
	}
	mustUpsert(t, s, report("n1", 0, "A100", 3)) // n1/3 vanishes, held
	freed, err := s.Move("j", keys("n1", 0, 2))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(freed, keys("n1", 3)) {
		t.Errorf("freed %v, want n1/3", freed)
	}
	if got := len(s.Snapshot().GPUs("n1")); got != 3 {
		t.Errorf("n1 has %d GPU rows, want 3: the vanished GPU's row goes with its job", got)
	}
	if got := s.Snapshot().FreeCount(); got != 1 {
		t.Errorf("FreeCount = %d, want 1", got)
	}
}

// TestMoveRace moves a job onto GPUs that other jobs try to allocate at the
// same time: each GPU ends with one holder, and the mover either has all of
// its targets or none.
func TestMoveRace(t *testing.T) {
	t.Parallel()
	for round := range 50 {
		s := newStore(t)
		mustUpsert(t, s, report("n1", 0, "A100", 4), report("n2", 1, "A100", 4))
		if err := s.Allocate("j", keys("n2", 0, 1)); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		var moveErr error
		wg.Go(func() { _, moveErr = s.Move("j", keys("n1", 0, 1)) })
		allocErrs := make([]error, 2)
		for i := range 2 {
			wg.Go(func() { allocErrs[i] = s.Allocate(fmt.Sprintf("x%d", i), keys("n1", i, 2+i)) })
		}
		wg.Wait()
		held := gpuKeys(s.Snapshot().GPUsOfJob("j"))
		switch {
		case moveErr == nil:
			if !slices.Equal(held, keys("n1", 0, 1)) {
				t.Fatalf("round %d: move succeeded but j holds %v", round, held)
			}
			for i, err := range allocErrs {
				if !errors.Is(err, ErrConflict) {
					t.Fatalf("round %d: x%d allocated %v beside a successful move", round, i, err)
				}
			}
		case errors.Is(moveErr, ErrConflict):
			if !slices.Equal(held, keys("n2", 0, 1)) {
				t.Fatalf("round %d: move failed but j holds %v", round, held)
			}
		default:
			t.Fatalf("round %d: %v", round, moveErr)
		}
		if got, want := s.Snapshot().FreeCount(), 8-countHeld(s); got != want {
			t.Fatalf("round %d: FreeCount %d, want %d", round, got, want)
		}
	}
}

func countHeld(s *Store) int {
	n := 0
	for _, node := range []string{"n1", "n2"} {
		for _, g := range s.Snapshot().GPUs(node) {
			if g.JobID != "" {
				n++
			}
		}
	}
	return n
}

func gpuOf(snap *Snapshot, k GPUKey) GPU {
	for _, g := range snap.GPUs(k.Node) {
		if g.Index == k.Index {
			return g
		}
	}
	return GPU{}
}

func contains(s, sub string) bool { return strings.Contains(s, sub) }
