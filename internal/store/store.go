// Package store is the in-memory GPU inventory that every service replica
// keeps, built on go-memdb.
//
// The store is fed only by topology events (node reports, health changes)
// and allocation events (placements and releases), so any replica rebuilds
// it by replaying those streams from the start. It keeps no clock: the only
// derived value, Job.Seq, comes from a counter kept in the store itself, so
// a replay yields the same store.
//
// It follows Nomad's state-store style: the schema lives in schema.go, one
// factory per table; every write method is one write transaction that
// commits whole or not at all; objects read from memdb are never modified,
// they are copied, changed and inserted again. Reads go through a Snapshot,
// an O(1) point-in-time view that later writes do not change.
//
// Besides nodes, GPUs and jobs, the store keeps domains (domains.go): the
// NVLink islands, PCIe switch groups, NUMA nodes and nodes it computes from
// each node's report and the health of its links and NICs, the fabric
// domains (leaf, pod, core) UpsertFabric gives, and the cluster. Each has a
// row with its counts of GPUs, healthy and free, overall and by model,
// updated in the same transaction as the GPUs, so a snapshot's counts and
// rows always agree; and the free GPUs of every domain that spans nodes are
// one prefix walk of one index.
package store

// The Store, its write transaction (write) and the reads the writes share.
// The writes are in files by what they change: nodes.go (node reports),
// health.go (health changes), allocate.go and move.go (allocations),
// jobs.go (jobs), fabric.go (fabric domains); writer.go keeps the domain
// rows in step with every GPU row a write changes.

import (
	"cmp"
	"fmt"
	"strings"

	memdb "github.com/hashicorp/go-memdb"
)

// Store is the GPU inventory. It is safe for concurrent use: writes are
// serialized by memdb, reads see snapshots.
type Store struct {
	db *memdb.MemDB
}

// New returns an empty store.
func New() (*Store, error) {
	db, err := memdb.NewMemDB(schema())
	if err != nil {
		return nil, fmt.Errorf("store: %w", err)
	}
	// memdb's primary database closes, at every commit, the watch
	// channel of every tree node the commit copied, which it keeps in a
	// set meanwhile; nothing here waits on them, and the set cost some 6
	// of the 213 KB a one-GPU decision allocated end to end
	// (BENCHMARKS.md). A snapshot of the fresh database is the same
	// database, writable, without that tracking (memdb tracks for its
	// primary only, so that writes to a snapshot never wake its primary's
	// watchers).
	return &Store{db: db.Snapshot()}, nil
}

// Snapshot returns a point-in-time view of the store in O(1).
func (s *Store) Snapshot() *Snapshot {
	db := s.db.Snapshot()
	return &Snapshot{db: db, txn: db.Txn(false)}
}

// write runs fn in one write transaction, committing if it returns nil.
// The domain counts fn's GPU changes made are written before the commit.
func (s *Store) write(fn func(w *writer) error) error {
	w := s.writer()
	defer w.txn.Abort() // no-op after Commit
	if err := fn(w); err != nil {
		return err
	}
	if err := w.flush(); err != nil {
		return err
	}
	w.txn.Commit()
	return nil
}

// writer opens the store's write transaction. Its reads of what it has
// written read the transaction's trees in place (memdb's LiveReads, a patch
// of ours: third_party/go-memdb/PATCHES.md), so that a write after a read
// reuses the tree nodes the transaction has already copied: a decision
// cycle reads its view between every two decisions, and upstream memdb
// makes each read forget the copied nodes, so each write copied its whole
// path again (about 20 KB of a one-GPU decision's 145 KB, BENCHMARKS.md).
// The price is that no iterator of the transaction outlives the next write
// to it; memdb panics if one does, and the store reads every iterator to
// its end, or drops it, before it writes.
func (s *Store) writer() *writer {
	txn := s.db.Txn(true)
	txn.LiveReads()
	return &writer{txn: txn}
}

// writeTopology is write for a change of the topology (a node report, a
// health change, the fabric): it also moves Snapshot.TopologyVersion.
func (s *Store) writeTopology(fn func(w *writer) error) error {
	return s.write(func(w *writer) error {
		if err := fn(w); err != nil {
			return err
		}
		_, err := nextSeq(w.txn, topologySeqKey)
		return err
	})
}

// gpusOfNode returns the rows of a node's GPUs, by index. The rows belong to
// memdb: read, never modify.
func gpusOfNode(txn *memdb.Txn, node string) ([]*GPU, error) {
	it, err := txn.Get(TableGPUs, nodeGPUs, node)
	if err != nil {
		return nil, err
	}
	var out []*GPU
	for raw := it.Next(); raw != nil; raw = it.Next() {
		out = append(out, raw.(*GPU))
	}
	return out, nil
}

// gpusOfJob returns the rows of the GPUs a job holds, by node name and
// index. The rows belong to memdb: read, never modify.
func gpusOfJob(txn *memdb.Txn, jobID string) ([]*GPU, error) {
	if jobID == "" {
		return nil, nil
	}
	it, err := txn.Get(TableGPUs, IndexJob, jobID)
	if err != nil {
		return nil, err
	}
	var out []*GPU
	for raw := it.Next(); raw != nil; raw = it.Next() {
		out = append(out, raw.(*GPU))
	}
	return out, nil
}

func compareKeys(a, b GPUKey) int {
	return cmp.Or(strings.Compare(a.Node, b.Node), cmp.Compare(a.Index, b.Index))
}

// must panics on an error that only a schema mistake can cause (an unknown
// table or index name, a wrongly typed argument).
func must(err error) {
	if err != nil {
		panic("store: " + err.Error())
	}
}
