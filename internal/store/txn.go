package store

import (
	"errors"
	"fmt"
)

// Txn is one write transaction that several changes share: placement's
// decision cycle allocates, records and releases for a batch of jobs in
// one. Its Snapshot sees its changes at once; the store's other readers
// see them at Commit, all together. While a Txn is open every other write
// to the store waits (memdb has one writer at a time), so it is kept no
// longer than the cycle's decisions take and never across a publish's wait.
//
// An allocation refused for a GPU at fault (ErrConflict) writes nothing
// and the Txn goes on; any other failure is a bug of the store or its
// caller and spoils the Txn: later calls and Commit return that error and
// nothing of it is committed.
type Txn struct {
	w   *writer
	err error
	// view is the last Snapshot, nil once a change has been made since.
	view *Snapshot
	done bool
}

// Begin opens a Txn. Commit or Abort it.
func (s *Store) Begin() *Txn {
	return &Txn{w: s.writer()}
}

// do runs one change; see Txn for which failures spoil it.
func (t *Txn) do(fn func(w *writer) error) error {
	if t.done {
		return errors.New("store: transaction already ended")
	}
	if t.err != nil {
		return t.err
	}
	t.view = nil
	err := fn(t.w)
	if err != nil && !errors.Is(err, ErrConflict) {
		t.err = fmt.Errorf("store: transaction spoiled: %w", err)
	}
	return err
}

// Allocate is Store.Allocate inside t.
func (t *Txn) Allocate(jobID string, gpus []GPUKey) error {
	return t.do(func(w *writer) error { return w.allocate(jobID, gpus, false) })
}

// Restore is Store.Restore inside t.
func (t *Txn) Restore(jobID string, gpus []GPUKey) error {
	return t.do(func(w *writer) error { return w.allocate(jobID, gpus, true) })
}

// Release is Store.Release inside t.
func (t *Txn) Release(jobID string) ([]GPUKey, error) { return release(t.do, jobID) }

// DeleteJob is Store.DeleteJob inside t.
func (t *Txn) DeleteJob(id string) error {
	return t.do(func(w *writer) error { return w.deleteJob(id) })
}

// UpsertJob is Store.UpsertJob inside t.
func (t *Txn) UpsertJob(j Job) error {
	return t.do(func(w *writer) error { return w.upsertJob(j) })
}

// Snapshot is a view of the store with t's changes so far. It reads t
// itself, not a copy: it is valid until t's next change, and is read from
// one goroutine at a time. (A copy, memdb's Txn.Snapshot, makes the
// transaction copy again every tree path the next change writes: some
// 100 KB per one-GPU decision of a cycle.)
func (t *Txn) Snapshot() *Snapshot {
	if t.view != nil {
		return t.view
	}
	// The domain rows are written at flush; a view without it would count
	// GPUs the transaction has already allocated as free. Only the node
	// domains' rows are written now (writer.flushLocal): the view reads
	// the others from the writer, and writes them before a walk of the
	// table.
	t.flushed(t.w.flushLocal())
	t.view = &Snapshot{txn: t.w.txn, pending: t}
	return t.view
}

// flushed spoils t with a flush's error.
func (t *Txn) flushed(err error) {
	if err != nil && t.err == nil {
		t.err = fmt.Errorf("store: transaction spoiled: %w", err)
	}
}

// Commit makes t's changes visible to the store's readers, or, when t was
// spoiled, discards them and returns why.
func (t *Txn) Commit() error {
	if t.done {
		return errors.New("store: transaction already ended")
	}
	t.done = true
	if t.err == nil {
		if err := t.w.flush(); err != nil {
			t.err = fmt.Errorf("store: transaction spoiled: %w", err)
		}
	}
	if t.err != nil {
		t.w.txn.Abort()
		return t.err
	}
	t.w.txn.Commit()
	return nil
}

// Abort discards t's changes; after Commit it does nothing.
func (t *Txn) Abort() {
	if !t.done {
		t.done = true
		t.w.txn.Abort()
	}
}
