package optimizer

import "github.com/toposched/toposched/internal/store"

// The store's occupancy is written back in batches. The optimizer applies
// every decision and release to its working set (live, holder) at once,
// but the store's GPU and job rows it keeps beside the topology are read
// only by the migration search (propose, on a fork) and by tests: tuning
// and diagnosis read node rows alone. Written one transaction per event,
// they were some 18 of the 213 KB an all-in-one operator allocated per
// one-GPU decision, and two thirds of the optimizer's CPU in a replay
// (BENCHMARKS.md); they now wait in unwritten, in order, and go into one
// transaction when the search reads the store, before a topology change
// (which must come after them, as in the stream), or once unwrittenMax
// have piled up.

// unwrittenMax bounds the placement changes held back from the store.
const unwrittenMax = 512

// storeChange is one placement change the store has yet to be told.
type storeChange struct {
	kind changeKind
	job  string
	// gpus is a placed job's GPUs; lj its working-set entry, whose row
	// is written as it is at write-back (its newest state).
	gpus []store.GPUKey
	lj   *liveJob
}

type changeKind int

const (
	changePlaced   changeKind = iota // Restore the job's GPUs, record its row
	changeRecorded                   // record the job's row (its analysis came late)
	changeReleased                   // free the job's GPUs, delete its row
)

// later queues a change for the next write-back.
func (s *Service) later(c storeChange) {
	s.unwritten = append(s.unwritten, c)
	if len(s.unwritten) >= unwrittenMax {
		s.writeBack()
	}
}

// writeBack writes the queued changes in one transaction. Should that
// fail (a store bug spoils a transaction), each is written in its own,
// so that one bad change costs only itself, as before the batching.
func (s *Service) writeBack() {
	if len(s.unwritten) == 0 {
		return
	}
	t := s.store.Begin()
	for _, c := range s.unwritten {
		s.write(t, c)
	}
	if err := t.Commit(); err != nil {
		s.log.Warn("store: batch of placement changes not recorded; writing them one at a time", "changes", len(s.unwritten), "err", err)
		for _, c := range s.unwritten {
			t := s.store.Begin()
			s.write(t, c)
			if err := t.Commit(); err != nil {
				s.log.Warn("store: placement change not recorded", "job_id", c.job, "err", err)
			}
		}
	}
	clear(s.unwritten)
	s.unwritten = s.unwritten[:0]
}

// write applies one change in t.
func (s *Service) write(t *store.Txn, c storeChange) {
	switch c.kind {
	case changePlaced:
		// Restore, not Allocate: the store holds what was decided even
		// where a GPU failed since; a conflict is the double booking
		// logged when the decision was applied, and leaves the job's
		// row to be written.
		if err := t.Restore(c.job, c.gpus); err != nil {
			s.log.Warn("store: allocation not restored", "job_id", c.job, "err", err)
		}
		s.recordJob(t, c.lj)
	case changeRecorded:
		s.recordJob(t, c.lj)
	case changeReleased:
		if _, err := t.Release(c.job); err != nil {
			s.log.Warn("store: release failed", "job_id", c.job, "err", err)
		}
		if err := t.DeleteJob(c.job); err != nil {
			s.log.Warn("store: job not deleted", "job_id", c.job, "err", err)
		}
	}
}

// occupancy is the store with every placement change applied, for what
// reads its GPU and job rows.
func (s *Service) occupancy() *store.Store {
	s.writeBack()
	return s.store
}
