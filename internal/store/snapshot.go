package store

import (
	"iter"
	"slices"

	memdb "github.com/hashicorp/go-memdb"
)

// Snapshot is a point-in-time, read-only view of the store. Later writes do
// not change it. Its methods return copies of the rows; maps and slices
// inside them are shared and must not be modified.
type Snapshot struct {
	db *memdb.MemDB
	// txn is the one read transaction every read of the snapshot goes
	// through: a read transaction only reads the immutable trees of its
	// root, so one serves any number of reads, concurrent ones included,
	// and a read no longer allocates its own.
	txn *memdb.Txn
	// pending is the transaction a Txn.Snapshot reads, whose writer may
	// still hold domain rows (writer.flushLocal); nil for a snapshot of
	// the store.
	pending *Txn
}

// flushDomains writes a transaction's pending domain rows before a walk
// of the domain table. It writes at the first walk after a change (the
// view is valid until the next), when the view's caller holds no
// iterator of that table yet: the rows pending are never node domains, so
// none of them has an entry in the node-free index it may be walking. A
// view kept past its transaction's end writes nothing.
func (s *Snapshot) flushDomains() {
	if t := s.pending; t != nil && !t.done && len(t.w.domains) > 0 {
		t.flushed(t.w.flush())
	}
}

// get opens a read transaction and iterates table by index.
func (s *Snapshot) get(table, index string, args ...any) memdb.ResultIterator {
	it, err := s.txn.Get(table, index, args...)
	must(err)
	return it
}

func (s *Snapshot) first(table, index string, args ...any) any {
	raw, err := s.txn.First(table, index, args...)
	must(err)
	return raw
}

// EachNodeWithGPUs yields the nodes in enumeration order, each with its
// GPUs sorted by Index (a prefix walk of the GPU table's primary key per
// node). The slice is reused between yields: copy what you keep. GPUs of
// removed nodes, still held by their jobs, are not yielded. Placement
// reads the node-free index instead (EachNodeFree); the GPU table keeps
// no index of its own in enumeration order, which would cost an entry per
// GPU and a tree path copied at every GPU write for no reader of the
// product.
func (s *Snapshot) EachNodeWithGPUs() iter.Seq2[Node, []GPU] {
	return func(yield func(Node, []GPU) bool) {
		nodes := s.get(TableNodes, IndexPosition)
		var buf []GPU
		for raw := nodes.Next(); raw != nil; raw = nodes.Next() {
			n := raw.(*Node)
			buf = buf[:0]
			it := s.get(TableGPUs, nodeGPUs, n.Name)
			for g := it.Next(); g != nil; g = it.Next() {
				buf = append(buf, *g.(*GPU))
			}
			if !yield(*n, buf) {
				return
			}
		}
	}
}

// Nodes returns the nodes sorted by Position, then Name.
func (s *Snapshot) Nodes() []Node {
	var out []Node
	for n := range s.EachNode() {
		out = append(out, n)
	}
	return out
}

// EachNode yields the nodes sorted by Position, then Name, without building
// a slice.
func (s *Snapshot) EachNode() iter.Seq[Node] {
	return func(yield func(Node) bool) {
		it := s.get(TableNodes, IndexPosition)
		for raw := it.Next(); raw != nil; raw = it.Next() {
			if !yield(*raw.(*Node)) {
				return
			}
		}
	}
}

// Node returns the named node.
func (s *Snapshot) Node(name string) (Node, bool) {
	raw := s.first(TableNodes, IndexID, name)
	if raw == nil {
		return Node{}, false
	}
	return *raw.(*Node), true
}

// GPUs returns a node's GPUs sorted by Index, whatever their state. After a
// node is removed, the GPUs its jobs still hold are listed under its name
// until released.
func (s *Snapshot) GPUs(node string) []GPU {
	var out []GPU
	// Sized by the node's report, which lists them all but those kept
	// for their jobs: an 8-GPU node's slice grown one GPU at a time is
	// made four times, 15 GPUs in all, and a decision lists a node three
	// times.
	if raw, ok := s.first(TableNodes, IndexID, node).(*Node); ok && raw.GPUCount > 0 {
		out = make([]GPU, 0, raw.GPUCount)
	}
	for g := range s.EachGPU(node) {
		out = append(out, g)
	}
	return out
}

// EachGPU yields a node's GPUs sorted by Index, without building a slice.
func (s *Snapshot) EachGPU(node string) iter.Seq[GPU] {
	return func(yield func(GPU) bool) {
		it := s.get(TableGPUs, nodeGPUs, node)
		for raw := it.Next(); raw != nil; raw = it.Next() {
			if !yield(*raw.(*GPU)) {
				return
			}
		}
	}
}

// FreeGPUs returns a node's free GPUs (healthy and held by no job) sorted by
// Index.
func (s *Snapshot) FreeGPUs(node string) []GPU {
	var out []GPU
	for g := range s.EachGPU(node) {
		if g.Free() {
			out = append(out, g)
		}
	}
	return out
}

// FreeCount returns the number of free GPUs in the cluster, in O(1).
func (s *Snapshot) FreeCount() int { return s.FreeByModel("") }

// FreeByModel returns the number of free GPUs of a model ("" for any) in
// the cluster, in O(1): it reads the cluster domain's counts.
func (s *Snapshot) FreeByModel(model string) int {
	d, _ := s.Domain(ClusterDomain)
	return d.FreeOf(model)
}

// FreeGPUsOfModel returns the free GPUs of a model ("" for any) in
// enumeration order (node position, node name, index): a walk of the
// cluster's entries in the domain index.
func (s *Snapshot) FreeGPUsOfModel(model string) []GPU {
	return s.FreeGPUsIn(ClusterDomain, model)
}

// Domain returns the domain with the given ID ("leaf:l1", "island:n1/0",
// ClusterDomain). A domain without GPUs has no row.
func (s *Snapshot) Domain(id string) (Domain, bool) {
	if t := s.pending; t != nil {
		if d, row, ok := t.w.pendingDomain(id); ok {
			if !row {
				return Domain{}, false
			}
			return d.public(), true
		}
	}
	raw := s.first(TableDomains, IndexID, id)
	if raw == nil {
		return Domain{}, false
	}
	return raw.(*Domain).public(), true
}

// DomainsOfKind returns the domains of a kind (DomainLeaf, ...) sorted by
// ID: a prefix walk of the domains' primary index.
func (s *Snapshot) DomainsOfKind(kind string) []Domain {
	return slices.Collect(s.EachDomainOfKind(kind))
}

// EachDomainOfKind yields the domains of a kind sorted by ID, as
// DomainsOfKind returns them, and stops when the caller does: a caller
// that keeps a few of 100k nodes' or thousands of leaves' rows copies
// those, not every row into a slice.
func (s *Snapshot) EachDomainOfKind(kind string) iter.Seq[Domain] {
	return func(yield func(Domain) bool) {
		s.flushDomains()
		it := s.get(TableDomains, IndexID+"_prefix", kind+":")
		for raw := it.Next(); raw != nil; raw = it.Next() {
			if !yield(raw.(*Domain).public()) {
				return
			}
		}
	}
}

// FreeGPUsIn returns the free GPUs of a model ("" for any) in a domain,
// sorted by node position, node name, then index; nil for an unknown
// domain. See EachFreeGPUIn for how each kind of domain is walked.
func (s *Snapshot) FreeGPUsIn(domain, model string) []GPU {
	d, ok := s.Domain(domain)
	if !ok || d.FreeOf(model) == 0 {
		return nil
	}
	out := make([]GPU, 0, d.FreeOf(model))
	for g := range s.eachFreeGPUIn(d, model) {
		out = append(out, g)
	}
	return out
}

// EachFreeGPUIn yields the free GPUs of a model ("" for any) in a domain
// in enumeration order (node position, node name, index), and stops when
// the caller does: the first k free GPUs of the cluster cost k steps, not
// a walk of the cluster. A leaf, a pod or the cluster is a prefix walk of
// the domain index, which yields exactly its free GPUs of the model (for
// "" and a domain of several models, one walk per model, merged); a
// node-local domain (island, pcie, numa, node) is a walk of its node's
// GPUs, a core one a walk of the cluster's free GPUs of the model (see
// indexedKind). An unknown domain yields nothing.
func (s *Snapshot) EachFreeGPUIn(domain, model string) iter.Seq[GPU] {
	return func(yield func(GPU) bool) {
		d, ok := s.Domain(domain)
		if !ok || d.FreeOf(model) == 0 {
			return
		}
		for g := range s.eachFreeGPUIn(d, model) {
			if !yield(g) {
				return
			}
		}
	}
}

func (s *Snapshot) eachFreeGPUIn(d Domain, model string) iter.Seq[GPU] {
	return func(yield func(GPU) bool) {
		if d.Node != "" {
			for g := range s.EachGPU(d.Node) {
				if g.Free() && (model == "" || g.Model == model) && slices.Contains(g.Domains, d.ID) {
					if !yield(g) {
						return
					}
				}
			}
			return
		}
		walk, filter := d.ID, false
		if !indexedKind(d.Kind) {
			walk = ClusterDomain
			filter = walk != d.ID
		}
		// The index groups a domain's GPUs by model first: one walk per
		// model with free GPUs, merged, when any model will do.
		var models []string
		if model != "" {
			models = []string{model}
		} else {
			for _, m := range d.Models {
				if m.Free > 0 {
					models = append(models, m.Model)
				}
			}
		}
		txn := s.txn
		type head struct {
			it  memdb.ResultIterator
			cur *GPU
		}
		heads := make([]head, 0, len(models))
		next := func(it memdb.ResultIterator) *GPU {
			for raw := it.Next(); raw != nil; raw = it.Next() {
				g := raw.(*GPU)
				if !filter || slices.Contains(g.Domains, d.ID) {
					return g
				}
			}
			return nil
		}
		for _, m := range models {
			it, err := txn.Get(TableGPUs, IndexDomain, walk, m)
			must(err)
			if g := next(it); g != nil {
				heads = append(heads, head{it, g})
			}
		}
		for len(heads) > 0 {
			bi := 0
			for i := 1; i < len(heads); i++ {
				if compareGPUs(*heads[i].cur, *heads[bi].cur) < 0 {
					bi = i
				}
			}
			if !yield(*heads[bi].cur) {
				return
			}
			if g := next(heads[bi].it); g != nil {
				heads[bi].cur = g
			} else {
				heads = slices.Delete(heads, bi, bi+1)
			}
		}
	}
}

// FabricDomains returns the fabric domains UpsertFabric gave a node, known
// or not yet; nil when it gave none. Shared: do not modify.
func (s *Snapshot) FabricDomains(node string) []string {
	raw := s.first(TableFabric, IndexID, node)
	if raw == nil {
		return nil
	}
	return raw.(*fabricEntry).Domains
}

// GPUsOfJob returns the GPUs a job holds, sorted by node name, then index.
func (s *Snapshot) GPUsOfJob(jobID string) []GPU {
	if jobID == "" {
		return nil
	}
	var out []GPU
	it := s.get(TableGPUs, IndexJob, jobID)
	for raw := it.Next(); raw != nil; raw = it.Next() {
		out = append(out, *raw.(*GPU))
	}
	return out
}

// Job returns the job with the given id.
func (s *Snapshot) Job(id string) (Job, bool) {
	raw := s.first(TableJobs, IndexID, id)
	if raw == nil {
		return Job{}, false
	}
	return *raw.(*Job), true
}

// JobsInState returns the jobs in a state, sorted by id.
func (s *Snapshot) JobsInState(state JobState) []Job {
	return slices.Collect(s.EachJobInState(state))
}

// EachJobInState yields the jobs in a state, as JobsInState lists them,
// without a slice of them all.
func (s *Snapshot) EachJobInState(state JobState) iter.Seq[Job] {
	return func(yield func(Job) bool) {
		it := s.get(TableJobs, IndexState, string(state)) // memdb wants a plain string
		for raw := it.Next(); raw != nil; raw = it.Next() {
			if !yield(*raw.(*Job)) {
				return
			}
		}
	}
}

// PlacedVersion counts the writes of placed jobs (a job placed, changed
// while placed, or leaving that state): two snapshots of one store with
// the same version hold the same placed jobs, so what is worked out from
// them alone can be kept from one to the other.
func (s *Snapshot) PlacedVersion() uint64 {
	if raw := s.first(TableIndex, IndexID, placedSeqKey); raw != nil {
		return raw.(*indexEntry).Value
	}
	return 0
}

// TopologyVersion counts the writes of the topology (node reports, health
// changes, the fabric): two snapshots of one store with the same version
// have the same nodes, GPUs, health and domains, whatever jobs hold.
func (s *Snapshot) TopologyVersion() uint64 {
	if raw := s.first(TableIndex, IndexID, topologySeqKey); raw != nil {
		return raw.(*indexEntry).Value
	}
	return 0
}

// HasFabric reports whether the store holds any node's fabric domains
// (UpsertFabric). Discovery publishes a cluster's fabric after its nodes,
// so a reader that must not start before the fabric is in (a benchmark's
// timed window, a replay's first job) waits for it after the nodes.
func (s *Snapshot) HasFabric() bool { return s.first(TableFabric, IndexID+"_prefix", "") != nil }

// AnyJobInState reports whether some job is in the state, without
// copying the jobs out.
func (s *Snapshot) AnyJobInState(state JobState) bool {
	return s.first(TableJobs, IndexState, string(state)) != nil
}

// PendingQueue returns the pending jobs in the order they are to be tried:
// highest Priority first, then earliest Turn, then oldest (lowest Seq)
// first. It walks the
// queue index: with thousands waiting, copying and sorting them at every
// retry and submission was most of a saturated replay's CPU. The jobs are
// the store's rows: shared, do not modify.
func (s *Snapshot) PendingQueue() []*Job {
	var q []*Job
	it := s.get(TableJobs, IndexQueue)
	for raw := it.Next(); raw != nil; raw = it.Next() {
		q = append(q, raw.(*Job))
	}
	return q
}

// PendingHead returns the first job of PendingQueue, false when none is
// pending, without a walk of the queue.
func (s *Snapshot) PendingHead() (Job, bool) {
	raw := s.first(TableJobs, IndexQueue)
	if raw == nil {
		return Job{}, false
	}
	return *raw.(*Job), true
}

// Capacity counts the GPUs of a model ("" for any model) on the nodes of the
// cluster: all of them, and the healthy ones. GPUs kept only because a job
// holds them after their node was removed are not counted. O(1): it reads
// the cluster domain's counts.
func (s *Snapshot) Capacity(model string) (total, healthyTotal int) {
	d, _ := s.Domain(ClusterDomain)
	c := d.Count(model)
	return c.Total, c.Healthy
}

// MaxGPUsPerNode returns the largest number of GPUs of a model ("" for any
// model) on one node, healthy or not, in O(1): it reads the node counts.
func (s *Snapshot) MaxGPUsPerNode(model string) int {
	return s.NodeCounts(model).MaxTotal()
}
