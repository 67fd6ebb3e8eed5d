package store

import (
	"testing"

	memdb "github.com/hashicorp/go-memdb"
)

// Watch channels, for the tests that see through them which rows a change
// rewrote (none, for a change that changes nothing) and which it left
// alone. New's store does not close them (nothing in the product waits on
// them: see New); watchedStore's does, as memdb's primary database.

// watchedStore is newStore with memdb's watch channels closed at commit.
func watchedStore(t testing.TB) *Store {
	t.Helper()
	db, err := memdb.NewMemDB(schema())
	if err != nil {
		t.Fatal(err)
	}
	return &Store{db: db}
}

// watchFree returns a channel that is closed on the next change to the set
// of free GPUs (a GPU allocated, released, turning healthy or unhealthy,
// added or removed). It may also close on a change that leaves the set as it
// was (a free GPU's details rewritten, or any GPU change while no GPU is
// free), so a waiter re-checks what it waits for. Take the channel before
// reading the snapshot that found no room, or a change in between is missed;
// Snapshot.watchFreeIn has no such gap, and narrows the wait to one domain.
func (s *Store) watchFree() <-chan struct{} {
	return s.Snapshot().watchFreeIn(ClusterDomain, "")
}

// watchFreeIn returns a channel that is closed on the first change, after
// this snapshot was taken, to the free GPUs of a model ("" for any) in a
// domain. Taken from the snapshot that found no room, it misses nothing.
// It may also close on a change that leaves that set as it was: for a
// node-local domain on any change to the node's GPUs, for a core domain on
// any change to the cluster's free GPUs of the model, for an unknown
// domain or one with no free GPU on a change to a wider part of the index.
// A waiter re-checks what it waits for.
func (s *Snapshot) watchFreeIn(domain, model string) <-chan struct{} {
	if node := domainNode(domain); node != "" {
		return s.get(TableGPUs, nodeGPUs, node).WatchCh()
	}
	if !indexedKind(DomainKind(domain)) {
		domain = ClusterDomain
	}
	args := []any{domain}
	if model != "" {
		args = append(args, model)
	}
	return s.get(TableGPUs, IndexDomain, args...).WatchCh()
}
