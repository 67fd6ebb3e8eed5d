// Copyright (c) HashiCorp, Inc.
// SPDX-License-Identifier: MPL-2.0

package memdb

// Live reads: a patch of toposched's copy (see PATCHES.md).
//
// A read of an index that a write transaction has modified reads a clone of
// the index's radix transaction, and taking the clone empties the
// transaction's cache of the nodes it has already copied (iradix's
// Txn.Clone). The next write to that index copies every node on its path
// again, with a new mutation channel and cache entry each, even when the
// path is the one the previous write copied. A transaction that reads
// between its writes, as a scheduler does that decides each job of a batch
// on a view holding the batch's earlier decisions, pays that on every
// write.

// LiveReads makes txn, a write transaction, read the indexes it has
// modified in place, without a clone, so that its writes keep reusing the
// nodes they have copied. In return the caller must not use an iterator
// that txn returned (Get, GetReverse, LowerBound, ReverseLowerBound) after
// a later write through txn: the write may change, in place, the nodes the
// iterator walks. Such a use panics rather than yield a wrong row. Single
// lookups (First, Last, FirstWatch, LastWatch, LongestPrefix) return before
// any later write and are unaffected; so are DeleteAll, which reads every
// row before it deletes, DeletePrefix, which walks a clone as before, and
// Snapshot, which clones.
//
// It is a no-op on a read transaction.
func (txn *Txn) LiveReads() {
	if txn.write {
		txn.live = true
	}
}

// liveGuard is what an iterator of a transaction with live reads checks on
// each step: the transaction and its count of writes when the iterator was
// made. The zero value checks nothing.
type liveGuard struct {
	txn    *Txn
	writes uint64
}

// guard returns the guard of an iterator txn makes now.
func (txn *Txn) guard() liveGuard {
	if !txn.live {
		return liveGuard{}
	}
	return liveGuard{txn: txn, writes: txn.writes}
}

func (g liveGuard) check() {
	if g.txn != nil && g.txn.writes != g.writes {
		panic("memdb: an iterator of a transaction with live reads was used after a write through that transaction")
	}
}
