package store

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

// A Txn's changes are in its own view at once, in the store's at Commit,
// with the domain counts in step; a conflict leaves it usable, Abort
// leaves the store as it was, and a failure of another kind spoils it.
func TestTxn(t *testing.T) {
	t.Parallel()
	setup := func(t *testing.T) *Store {
		s := newStore(t)
		mustUpsert(t, s, report("n1", 0, "A100", 4), report("n2", 1, "A100", 4))
		return s
	}

	t.Run("commit", func(t *testing.T) {
		t.Parallel()
		s := watchedStore(t)
		mustUpsert(t, s, report("n1", 0, "A100", 4), report("n2", 1, "A100", 4))
		watch := s.watchFree()
		tx := s.Begin()
		if err := tx.Allocate("a", keys("n1", 0, 1)); err != nil {
			t.Fatal(err)
		}
		if err := tx.UpsertJob(Job{ID: "a", State: JobPlaced}); err != nil {
			t.Fatal(err)
		}
		if got := tx.Snapshot().FreeCount(); got != 6 {
			t.Fatalf("the transaction's view: %d free, want 6", got)
		}
		// The next decision of the cycle sees a's GPUs taken, in the
		// domain counts the placers read as well as in the GPU rows.
		if got := tx.Snapshot().NodeCounts("A100").FreeAtLeast(4); got != 1 {
			t.Fatalf("the transaction's view: %d nodes with 4 free, want 1", got)
		}
		if err := tx.Allocate("b", keys("n1", 1, 2)); !errors.Is(err, ErrConflict) {
			t.Fatalf("a GPU the transaction gave a: %v, want a conflict", err)
		}
		if err := tx.Allocate("b", keys("n2", 0, 1, 2, 3)); err != nil {
			t.Fatalf("after a conflict the transaction goes on: %v", err)
		}
		if got := s.Snapshot().FreeCount(); got != 8 {
			t.Fatalf("the store before Commit: %d free, want 8", got)
		}
		select {
		case <-watch:
			t.Fatal("watchFree fired before Commit")
		default:
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		<-watch
		snap := s.Snapshot()
		if got := snap.FreeCount(); got != 2 {
			t.Fatalf("the store after Commit: %d free, want 2", got)
		}
		if j, ok := snap.Job("a"); !ok || j.State != JobPlaced {
			t.Fatalf("job a after Commit: %+v", j)
		}
		if got := gpuKeys(snap.GPUsOfJob("b")); len(got) != 4 {
			t.Fatalf("b holds %v", got)
		}
		if err := tx.Commit(); err == nil {
			t.Fatal("a second Commit succeeded")
		}
	})

	t.Run("abort", func(t *testing.T) {
		t.Parallel()
		s := setup(t)
		tx := s.Begin()
		if err := tx.Allocate("a", keys("n1", 0)); err != nil {
			t.Fatal(err)
		}
		tx.Abort()
		if got := s.Snapshot().FreeCount(); got != 8 {
			t.Fatalf("after Abort: %d free, want 8", got)
		}
		if err := s.Allocate("c", keys("n1", 0)); err != nil {
			t.Fatalf("the store's writer after Abort: %v", err)
		}
	})

	t.Run("spoiled", func(t *testing.T) {
		t.Parallel()
		s := setup(t)
		tx := s.Begin()
		if err := tx.Allocate("a", keys("n1", 0)); err != nil {
			t.Fatal(err)
		}
		if err := tx.UpsertJob(Job{ID: "a", State: "limbo"}); err == nil {
			t.Fatal("a job in an unknown state was recorded")
		}
		if err := tx.Allocate("b", keys("n2", 0)); err == nil {
			t.Fatal("a spoiled transaction took another change")
		}
		if err := tx.Commit(); err == nil {
			t.Fatal("a spoiled transaction committed")
		}
		if got := s.Snapshot().FreeCount(); got != 8 {
			t.Fatalf("after a spoiled transaction: %d free, want 8", got)
		}
	})
}

// Restore, Release and DeleteJob inside a Txn leave the store as the
// Store's own methods, one transaction each, do: the GPU rows, the domain
// counts and the placed-job counter.
func TestTxnRestoreReleaseDelete(t *testing.T) {
	t.Parallel()
	setup := func(t *testing.T) *Store {
		s := newStore(t)
		mustUpsert(t, s, report("n1", 0, "A100", 4), report("n2", 1, "A100", 4))
		if err := s.Allocate("old", keys("n2", 0, 1)); err != nil {
			t.Fatal(err)
		}
		if err := s.UpsertJob(Job{ID: "old", State: JobPlaced}); err != nil {
			t.Fatal(err)
		}
		return s
	}
	// n1 GPU 7 is not in n1's report: Restore recreates it, unhealthy.
	restored := append(keys("n1", 0), GPUKey{Node: "n1", Index: 7})

	// What a release and the next placement write, through a Txn or
	// through the Store.
	type writes interface {
		Restore(string, []GPUKey) error
		UpsertJob(Job) error
		Release(string) ([]GPUKey, error)
		DeleteJob(string) error
	}
	apply := func(w writes) []GPUKey {
		if err := w.Restore("new", restored); err != nil {
			t.Fatal(err)
		}
		if err := w.UpsertJob(Job{ID: "new", State: JobPlaced}); err != nil {
			t.Fatal(err)
		}
		freed, err := w.Release("old")
		if err != nil {
			t.Fatal(err)
		}
		if err := w.DeleteJob("old"); err != nil {
			t.Fatal(err)
		}
		return freed
	}

	one, each := setup(t), setup(t)
	tx := one.Begin()
	apply(tx)
	if err := tx.DeleteJob("new"); err == nil {
		t.Fatal("DeleteJob of a job holding GPUs succeeded")
	}
	if err := tx.Commit(); err == nil {
		t.Fatal("Commit after a refused DeleteJob succeeded: the transaction should be spoiled")
	}

	// Again without the refused delete, against the Store's methods.
	tx = one.Begin()
	freed := apply(tx)
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	want := apply(each)
	if !slices.Equal(freed, want) {
		t.Errorf("Txn.Release freed %v, Store.Release %v", freed, want)
	}
	a, b := one.Snapshot(), each.Snapshot()
	if got, want := gpuKeys(a.GPUsOfJob("new")), gpuKeys(b.GPUsOfJob("new")); !slices.Equal(got, want) || len(got) != 2 {
		t.Errorf("new holds %v in one transaction, %v in several", got, want)
	}
	if _, ok := a.Job("old"); ok {
		t.Error("old still recorded")
	}
	if a.FreeCount() != b.FreeCount() || a.PlacedVersion() != b.PlacedVersion() {
		t.Errorf("free %d, placed version %d in one transaction; %d, %d in several",
			a.FreeCount(), a.PlacedVersion(), b.FreeCount(), b.PlacedVersion())
	}
	for _, m := range []string{"", "A100"} {
		for k := 1; k <= 4; k++ {
			if x, y := a.NodeCounts(m).FreeAtLeast(k), b.NodeCounts(m).FreeAtLeast(k); x != y {
				t.Errorf("nodes of %q with %d free: %d in one transaction, %d in several", m, k, x, y)
			}
		}
	}
}

// A Txn's view reads the domain rows its writer still holds (a leaf's,
// a pod's, the cluster's: writer.flushLocal) as the table will hold them:
// seeded allocations, restores and releases in one transaction, on nodes
// under a fabric, each followed by point reads of every domain against a
// recount from the view's GPU rows, then, now and then, by a walk of the
// table (which writes the rows first) and the store's full checks; at
// Commit, the store's.
func TestTxnPendingDomains(t *testing.T) {
	t.Parallel()
	for seed := range uint64(12) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			t.Parallel()
			rng := rand.New(rand.NewPCG(seed, 7))
			s := newStore(t)
			names := []string{"n0", "n1", "n2", "n3", "n4", "n5"}
			fabric := map[string][]string{}
			for i, n := range names {
				mustUpsert(t, s, topoReport(n, i, []string{"A100", "H100"}[i%2], nvswitch(4, 12), []int{0, 0, 1, 1}, dgxNICs(4)))
				fabric[n] = []string{fmt.Sprintf("leaf:l%d", i/2), fmt.Sprintf("pod:p%d", i/4), "core:c0"}
			}
			if err := s.UpsertFabric(fabric); err != nil {
				t.Fatal(err)
			}
			seen := map[string]bool{}
			for _, d := range allDomains(s.Snapshot()) {
				seen[d.ID] = true
			}
			for round := range 3 {
				tx := s.Begin()
				jobs := 0
				for step := range 40 {
					switch op := rng.IntN(4); {
					case op == 3 && jobs > 0:
						if _, err := tx.Release(fmt.Sprintf("r%d-j%d", round, 1+rng.IntN(jobs))); err != nil {
							t.Fatal(err)
						}
					default:
						jobs++
						var ks []GPUKey
						for range 1 + rng.IntN(3) {
							k := GPUKey{names[rng.IntN(len(names))], rng.IntN(4)}
							if !slices.Contains(ks, k) {
								ks = append(ks, k)
							}
						}
						id := fmt.Sprintf("r%d-j%d", round, jobs)
						var err error
						if op == 2 {
							err = tx.Restore(id, ks)
						} else {
							err = tx.Allocate(id, ks)
						}
						if err != nil && !errors.Is(err, ErrConflict) {
							t.Fatal(err)
						}
					}
					snap := tx.Snapshot()
					want := map[string]*Domain{}
					for _, g := range allGPUs(snap) {
						for _, id := range g.Domains {
							seen[id] = true
							d := want[id]
							if d == nil {
								d = &Domain{}
								want[id] = d
							}
							d.Total++
							if g.Free() {
								d.Free++
							}
						}
					}
					for id := range seen {
						got, ok := snap.Domain(id)
						w := want[id]
						switch {
						case ok != (w != nil):
							t.Fatalf("round %d step %d: Domain(%s) found %v, recount has it %v", round, step, id, ok, w != nil)
						case ok && (got.Total != w.Total || got.Free != w.Free):
							t.Fatalf("round %d step %d: Domain(%s) = %d total %d free, recount %d, %d", round, step, id, got.Total, got.Free, w.Total, w.Free)
						}
					}
					if rng.IntN(4) == 0 {
						if leaves := snap.DomainsOfKind(DomainLeaf); len(leaves) == 0 {
							t.Fatal("no leaves")
						}
						checkDomains(t, snap)
						checkNodeCounts(t, snap)
					}
				}
				if err := tx.Commit(); err != nil {
					t.Fatal(err)
				}
				checkDomains(t, s.Snapshot())
				checkNodeCounts(t, s.Snapshot())
			}
		})
	}
}
