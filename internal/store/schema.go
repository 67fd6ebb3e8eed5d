package store

import (
	"fmt"
	"math"

	memdb "github.com/hashicorp/go-memdb"
)

// Table names.
const (
	TableNodes = "nodes"
	TableGPUs  = "gpus"
	TableJobs  = "jobs"
	// TableIndex holds the store's counters (today only the job sequence
	// that orders pending jobs by age). Keeping them in memdb makes them
	// part of every snapshot and rolls them back with an aborted write.
	TableIndex = "index"
	// TableDomains holds one *Domain per domain that has GPUs: its counts,
	// kept in step with TableGPUs by every write.
	TableDomains = "domains"
	// TableFabric holds one *fabricEntry per node the fabric names: the
	// node's fabric domains, re-applied to its GPUs whenever it reports.
	TableFabric = "fabric"
	// TableNodeCounts holds one *NodeCounts per GPU model and one for
	// any model (""): how many nodes have how many GPUs of it, kept in
	// step with the node domains by every write (nodecounts.go).
	TableNodeCounts = "nodecounts"
)

// Index names. Every table has the primary index IndexID. Each index entry
// costs roughly 450 B (an iradix leaf and node, each with its watch
// channel), so there are only as many as the reads need; see TestSchema for
// the budget.
const (
	IndexID       = "id"
	IndexPosition = "position" // nodes: enumeration order
	IndexJob      = "job"      // gpus: the GPUs held by one job
	// IndexDomain lists the free GPUs of each leaf, pod and of the cluster
	// by model, then enumeration order (freeDomainIndexer, indexedKind).
	// It replaced the former "free" index: the cluster's entries are that
	// index, so only the leaf and pod entries cost extra.
	IndexDomain = "domain"
	IndexState  = "state" // jobs: the jobs in one state
	// IndexQueue lists the pending jobs in the order they are tried:
	// highest priority, then earliest Turn, then lowest Seq
	// (queueIndexer). The head of the queue is its first entry, and the
	// queue a walk of it, with no sort of every pending job each time.
	IndexQueue = "queue"
	// IndexNodeFree lists the node domains with free GPUs by model, then
	// free count, then enumeration order (nodeFreeIndexer): best fit and
	// first fit without walking the full nodes.
	IndexNodeFree = "nodefree"
)

// schemaFactory returns the schema of one table.
type schemaFactory func() *memdb.TableSchema

// schemaFactories lists one factory per table.
var schemaFactories = []schemaFactory{
	nodesTableSchema,
	gpusTableSchema,
	jobsTableSchema,
	indexTableSchema,
	domainsTableSchema,
	fabricTableSchema,
	nodeCountsTableSchema,
}

// schema returns the database schema of the store.
func schema() *memdb.DBSchema {
	db := &memdb.DBSchema{Tables: make(map[string]*memdb.TableSchema, len(schemaFactories))}
	for _, f := range schemaFactories {
		t := f()
		if _, dup := db.Tables[t.Name]; dup {
			panic(fmt.Sprintf("store: table %q defined twice", t.Name))
		}
		db.Tables[t.Name] = t
	}
	return db
}

// nodesTableSchema holds *Node, keyed by name.
func nodesTableSchema() *memdb.TableSchema {
	return &memdb.TableSchema{
		Name: TableNodes,
		Indexes: map[string]*memdb.IndexSchema{
			IndexID: {
				Name:    IndexID,
				Unique:  true,
				Indexer: &memdb.StringFieldIndex{Field: "Name"},
			},
			// Non-unique, so memdb appends the name: iterating it yields
			// nodes by Position, then Name.
			IndexPosition: {
				Name:    IndexPosition,
				Indexer: positionIndexer{},
			},
		},
	}
}

// gpusTableSchema holds *GPU, keyed by (Node, Index).
func gpusTableSchema() *memdb.TableSchema {
	return &memdb.TableSchema{
		Name: TableGPUs,
		Indexes: map[string]*memdb.IndexSchema{
			// A prefix walk of it by a node's name yields that node's
			// GPUs in Index order (gpuKeyIndexer).
			IndexID: {
				Name:   IndexID,
				Unique: true,
				Indexer: gpuKeyIndexer{&memdb.CompoundIndex{
					Indexes: []memdb.Indexer{
						&memdb.StringFieldIndex{Field: "Node"},
						&memdb.IntFieldIndex{Field: "Index"},
					},
				}},
			},
			// Held and unhealthy GPUs, and those in no domain, are left
			// out of this index.
			IndexDomain: {
				Name:         IndexDomain,
				AllowMissing: true,
				Indexer:      freeDomainIndexer{},
			},
			// Free GPUs have no JobID and are left out of this index.
			IndexJob: {
				Name:         IndexJob,
				AllowMissing: true,
				Indexer:      &memdb.StringFieldIndex{Field: "JobID"},
			},
		},
	}
}

// gpuKeyIndexer is the GPU table's primary key, a CompoundIndex of (Node,
// Index), whose prefix by a node's name alone is that name whole (the
// CompoundIndex's own would be any name beginning with it: node n1's
// lookup would yield n10's GPUs too). So a node's GPUs are a prefix walk
// of the primary key, in Index order, and the table keeps no index of its
// own for them: one fewer entry on every GPU row, ~380 B per GPU, and one
// fewer tree to copy on every GPU write.
type gpuKeyIndexer struct{ *memdb.CompoundIndex }

// nodeGPUs is the name of the primary key's prefix lookup, by node name.
const nodeGPUs = IndexID + "_prefix"

func (x gpuKeyIndexer) PrefixFromArgs(args ...any) ([]byte, error) {
	if len(args) == 1 {
		return x.Indexes[0].FromArgs(args[0])
	}
	return x.CompoundIndex.PrefixFromArgs(args...)
}

// jobsTableSchema holds *Job, keyed by ID.
func jobsTableSchema() *memdb.TableSchema {
	return &memdb.TableSchema{
		Name: TableJobs,
		Indexes: map[string]*memdb.IndexSchema{
			IndexID: {
				Name:    IndexID,
				Unique:  true,
				Indexer: &memdb.StringFieldIndex{Field: "ID"},
			},
			IndexState: {
				Name:    IndexState,
				Indexer: &memdb.StringFieldIndex{Field: "State"},
			},
			// Only pending jobs have keys.
			IndexQueue: {
				Name:         IndexQueue,
				AllowMissing: true,
				Indexer:      queueIndexer{},
			},
		},
	}
}

// queueIndexer keys a pending job by priority, highest first, then Turn,
// earliest first, then Seq, lowest first, each four bits a byte
// (appendPosition); other jobs have no
// key. A walk with no argument yields the queue in order; memdb appends
// the ID, which keeps jobs of one Seq (none: the store gives each its own)
// apart.
type queueIndexer struct{}

func (queueIndexer) FromObject(obj any) (bool, []byte, error) {
	j, ok := obj.(*Job)
	if !ok {
		return false, nil, fmt.Errorf("store: queue index: unexpected %T", obj)
	}
	if j.State != JobPending {
		return false, nil, nil
	}
	turn := int64(math.MinInt64) // the zero Turn, whose UnixNano is undefined
	if !j.Turn.IsZero() {
		turn = j.Turn.UnixNano()
	}
	b := make([]byte, 0, 3*positionKeyLen+len(j.ID)+1)
	b = appendPosition(b, -j.Priority)
	b = appendPosition(b, int(turn))
	b = appendPosition(b, int(j.Seq))
	return true, b, nil
}

// FromArgs takes nothing: the index is only walked whole.
func (queueIndexer) FromArgs(args ...any) ([]byte, error) {
	return nil, fmt.Errorf("store: queue index: walked whole, got %d arguments", len(args))
}

// indexTableSchema holds *indexEntry, keyed by Key.
func indexTableSchema() *memdb.TableSchema {
	return &memdb.TableSchema{
		Name: TableIndex,
		Indexes: map[string]*memdb.IndexSchema{
			IndexID: {
				Name:    IndexID,
				Unique:  true,
				Indexer: &memdb.StringFieldIndex{Field: "Key"},
			},
		},
	}
}

// domainsTableSchema holds *Domain, keyed by ID. Domains of one kind are a
// prefix walk of the primary index ("<kind>:"), so no kind index is kept.
func domainsTableSchema() *memdb.TableSchema {
	return &memdb.TableSchema{
		Name: TableDomains,
		Indexes: map[string]*memdb.IndexSchema{
			IndexID: {
				Name:    IndexID,
				Unique:  true,
				Indexer: &memdb.StringFieldIndex{Field: "ID"},
			},
			// Only node domains with free GPUs have keys; non-unique, so
			// memdb appends the ID: nodes of one free count come out in
			// enumeration order.
			IndexNodeFree: {
				Name:         IndexNodeFree,
				AllowMissing: true,
				Indexer:      nodeFreeIndexer{},
			},
		},
	}
}

// nodeCountsTableSchema holds *NodeCounts, keyed by Model.
func nodeCountsTableSchema() *memdb.TableSchema {
	return &memdb.TableSchema{
		Name: TableNodeCounts,
		Indexes: map[string]*memdb.IndexSchema{
			// Not a StringFieldIndex: that has no key for "" (any model).
			IndexID: {
				Name:    IndexID,
				Unique:  true,
				Indexer: modelIndexer{},
			},
		},
	}
}

// fabricTableSchema holds *fabricEntry, keyed by node name.
func fabricTableSchema() *memdb.TableSchema {
	return &memdb.TableSchema{
		Name: TableFabric,
		Indexes: map[string]*memdb.IndexSchema{
			IndexID: {
				Name:    IndexID,
				Unique:  true,
				Indexer: &memdb.StringFieldIndex{Field: "Node"},
			},
		},
	}
}
