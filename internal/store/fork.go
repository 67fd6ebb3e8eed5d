package store

import "fmt"

// Fork returns a copy of the store that later writes to either do not
// change the other, in O(1) (memdb's trees are immutable; a write copies
// the path it changes). It is for what-ifs: the optimizer releases a
// running job in a fork to plan where the job would go if it moved, and
// drops the fork, without touching the store it serves from.
func (s *Store) Fork() *Store {
	return &Store{db: s.db.Snapshot()}
}

// Emptied returns a fork of the store in which no GPU is held: every job's
// GPUs are freed (a GPU kept only for its job is gone), the jobs' rows
// unchanged. It is the cluster as an empty one, for what a job would get
// were nothing running (placer's ideal placement).
func (s *Store) Emptied() (*Store, error) {
	f := s.Fork()
	err := f.write(func(w *writer) error {
		it, err := w.txn.Get(TableGPUs, IndexID)
		if err != nil {
			return err
		}
		var held []*GPU
		for raw := it.Next(); raw != nil; raw = it.Next() {
			if g := raw.(*GPU); g.JobID != "" {
				held = append(held, g)
			}
		}
		for _, g := range held {
			if err := w.freeGPU(g); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("store: emptied fork: %w", err)
	}
	return f, nil
}
