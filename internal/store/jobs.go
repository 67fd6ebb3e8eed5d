package store

// The job table: UpsertJob, DeleteJob and the store's own sequence counter
// that numbers jobs.

import (
	"errors"
	"fmt"

	memdb "github.com/hashicorp/go-memdb"
)

// UpsertJob inserts or updates a job. On first insert the store assigns Seq
// from its own counter; afterwards the job keeps that Seq, whatever j.Seq
// says.
func (s *Store) UpsertJob(j Job) error {
	return s.write(func(w *writer) error { return w.upsertJob(j) })
}

// upsertJob is UpsertJob in w's transaction. It writes nothing when j is
// refused.
func (w *writer) upsertJob(j Job) error {
	if j.ID == "" {
		return errors.New("store: job without an id")
	}
	switch j.State {
	case JobPending, JobPlaced, JobRejected, JobFinished:
	default:
		return fmt.Errorf("store: job %q: unknown state %q", j.ID, j.State)
	}
	txn := w.txn
	old, err := txn.First(TableJobs, IndexID, j.ID)
	if err != nil {
		return err
	}
	if j.State == JobPlaced || (old != nil && old.(*Job).State == JobPlaced) {
		if _, err := nextSeq(txn, placedSeqKey); err != nil {
			return err
		}
	}
	if old != nil {
		j.Seq = old.(*Job).Seq
	} else {
		seq, err := nextSeq(txn, jobSeqKey)
		if err != nil {
			return err
		}
		j.Seq = seq
	}
	return txn.Insert(TableJobs, &j)
}

// DeleteJob removes a job. Deleting an unknown job is a no-op. A job that
// still holds GPUs is not deleted: release them first.
func (s *Store) DeleteJob(id string) error {
	return s.write(func(w *writer) error { return w.deleteJob(id) })
}

// deleteJob is DeleteJob in w's transaction.
func (w *writer) deleteJob(id string) error {
	txn := w.txn
	held, err := gpusOfJob(txn, id)
	if err != nil {
		return err
	}
	if len(held) > 0 {
		return fmt.Errorf("store: job %q still holds %d GPUs; release them first", id, len(held))
	}
	if raw, err := txn.First(TableJobs, IndexID, id); err != nil {
		return err
	} else if raw != nil && raw.(*Job).State == JobPlaced {
		if _, err := nextSeq(txn, placedSeqKey); err != nil {
			return err
		}
	}
	_, err = txn.DeleteAll(TableJobs, IndexID, id)
	return err
}

// nextSeq increments the named counter and returns its new value (the
// first is 1).
func nextSeq(txn *memdb.Txn, key string) (uint64, error) {
	raw, err := txn.First(TableIndex, IndexID, key)
	if err != nil {
		return 0, err
	}
	var v uint64
	if raw != nil {
		v = raw.(*indexEntry).Value
	}
	v++
	return v, txn.Insert(TableIndex, &indexEntry{Key: key, Value: v})
}
