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
// one prefix walk of one index, whose watch channels wake a waiter when
// that domain's free set changes.
package store

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strconv"
	"strings"

	memdb "github.com/hashicorp/go-memdb"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/internal/topology"
)

// ErrConflict is wrapped by Allocate's errors when a GPU it was asked for is
// missing, unhealthy or held by another job.
var ErrConflict = errors.New("allocation conflict")

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
	return &Store{db: db}, nil
}

// Snapshot returns a point-in-time view of the store in O(1).
func (s *Store) Snapshot() *Snapshot {
	db := s.db.Snapshot()
	return &Snapshot{db: db, txn: db.Txn(false)}
}

// WatchFree returns a channel that is closed on the next change to the set
// of free GPUs (a GPU allocated, released, turning healthy or unhealthy,
// added or removed). It may also close on a change that leaves the set as it
// was (a free GPU's details rewritten, or any GPU change while no GPU is
// free), so a waiter re-checks what it waits for. Take the channel before
// reading the snapshot that found no room, or a change in between is missed;
// Snapshot.WatchFreeIn has no such gap, and narrows the wait to one domain.
func (s *Store) WatchFree() <-chan struct{} {
	return s.Snapshot().WatchFreeIn(ClusterDomain, "")
}

// write runs fn in one write transaction, committing if it returns nil.
// The domain counts fn's GPU changes made are written before the commit.
func (s *Store) write(fn func(w *writer) error) error {
	txn := s.db.Txn(true)
	defer txn.Abort() // no-op after Commit
	w := &writer{txn: txn}
	if err := fn(w); err != nil {
		return err
	}
	if err := w.flush(); err != nil {
		return err
	}
	txn.Commit()
	return nil
}

// reportedHealthy maps a reported health value to healthy or not: "" and
// "healthy" are healthy, anything else is not.
func reportedHealthy(h string) bool {
	return h == "" || h == events.HealthHealthy
}

// UpsertNode applies a node's report: the node and its GPUs are inserted or
// updated. GPUs keep the job holding them. A GPU missing from the report is
// deleted if free; if a job holds it, it is kept but marked unhealthy
// (ReasonMissing) so nothing new lands on it, and deleted when released. A
// GPU without a model takes the node's. If the report has Removed set, the
// node and its free GPUs are removed; allocated GPUs stay, unhealthy
// (ReasonNodeRemoved), until released.
//
// A report is the node's whole current description, and its parts' health
// follows it as its GPUs' does: a NIC the report marks healthy or
// unhealthy is so, one it says nothing of (Health "") keeps what health
// reports said, and one it no longer lists is forgotten. Down NVLinks are
// kept while the report's topology is the one they were reported against,
// and forgotten when it changes: a source that looks again (NVML counts the
// links that are up) reports the degraded matrix itself, and subtracting
// the down links from it again would count them twice. The GPUs' domains
// are computed from the result in the same transaction.
func (s *Store) UpsertNode(n events.TopologyNode) error {
	if n.Name == "" {
		return errors.New("store: node report without a name")
	}
	reported := make(map[int]int, len(n.GPUs)) // GPU index -> position in n.GPUs
	if !n.Removed {
		for i, g := range n.GPUs {
			if _, dup := reported[g.Index]; dup {
				return fmt.Errorf("store: node %q reports GPU %d twice", n.Name, g.Index)
			}
			reported[g.Index] = i
		}
	}
	var topo *topology.Node
	if !n.Removed && n.GPUPaths != nil {
		t, err := topology.FromEvent(n)
		if err != nil {
			return fmt.Errorf("store: %w", err)
		}
		topo = t
	}
	return s.write(func(w *writer) error {
		txn := w.txn
		existing, err := gpusOfNode(txn, n.Name)
		if err != nil {
			return err
		}
		if n.Removed {
			return removeNode(w, n.Name, existing)
		}

		var oldNode *Node
		if raw, err := txn.First(TableNodes, IndexID, n.Name); err != nil {
			return err
		} else if raw != nil {
			oldNode = raw.(*Node)
		}
		node := &Node{
			Name:     n.Name,
			Position: n.Position,
			GPUModel: n.GPUModel,
			Labels:   maps.Clone(n.Labels),
			GPUCount: len(n.GPUs),
			Topology: topo,
		}
		node.DownNVLinks, node.DownNICs = carryHealth(oldNode, n, reported, topo)
		node.Effective = effective(node)
		if oldNode != nil && nodeEqual(oldNode, node) {
			node = oldNode // keep the stored row, and its Effective
		} else if err := txn.Insert(TableNodes, node); err != nil {
			return err
		} else if err := w.touchNode(node.Name); err != nil {
			return err
		}

		// The node's GPU rows as they are to be (olds[i] -> rows[i]): first
		// those that disappeared from the report, then the reported ones.
		var olds, rows []*GPU
		for _, g := range existing {
			if _, ok := reported[g.Index]; ok {
				continue
			}
			if g.JobID == "" {
				if err := w.putGPU(g, nil); err != nil {
					return err
				}
				continue
			}
			upd := *g
			upd.Healthy, upd.HealthReason, upd.NodePosition = false, ReasonMissing, n.Position
			upd.Model = cmp.Or(upd.Model, n.GPUModel) // as for a reported GPU
			olds, rows = append(olds, g), append(rows, &upd)
		}
		// existing is sorted by index; look old ones up by binary search
		// rather than building a second map.
		for _, rg := range n.GPUs {
			var old *GPU
			if i, ok := slices.BinarySearchFunc(existing, rg.Index, func(g *GPU, idx int) int {
				return cmp.Compare(g.Index, idx)
			}); ok {
				old = existing[i]
			}
			upd := &GPU{
				Node:         n.Name,
				Index:        rg.Index,
				UUID:         rg.UUID,
				Model:        cmp.Or(rg.Model, n.GPUModel),
				MemoryMiB:    rg.MemoryMiB,
				Healthy:      reportedHealthy(rg.Health),
				NodePosition: n.Position,
				NUMA:         -1,
			}
			if rg.NUMA != nil && *rg.NUMA >= 0 {
				upd.NUMA = *rg.NUMA
			}
			if !upd.Healthy {
				upd.HealthReason = "node report: " + rg.Health
			}
			if old != nil {
				upd.JobID = old.JobID
			}
			olds, rows = append(olds, old), append(rows, upd)
		}
		fabric, err := fabricOf(txn, n.Name)
		if err != nil {
			return err
		}
		for i, ds := range nodeDomains(node, rows, fabric) {
			rows[i].Domains = ds
			if err := w.putGPU(olds[i], rows[i]); err != nil {
				return err
			}
		}
		return nil
	})
}

// carryHealth returns the down NVLinks and NICs of a node's new row: see
// UpsertNode.
func carryHealth(old *Node, n events.TopologyNode, reported map[int]int, topo *topology.Node) ([]NVLinkID, []string) {
	hasNIC := func(name string) bool {
		return topo != nil && slices.ContainsFunc(topo.NICs, func(c topology.NIC) bool { return c.Name == name })
	}
	var links []NVLinkID
	var nics []string
	if old != nil {
		if len(old.DownNVLinks) > 0 && reflect.DeepEqual(old.Topology, topo) {
			for _, l := range old.DownNVLinks {
				if _, ok := reported[l.GPU]; ok {
					links = append(links, l)
				}
			}
		}
		for _, name := range old.DownNICs {
			if hasNIC(name) {
				nics = append(nics, name)
			}
		}
	}
	if topo != nil {
		for _, c := range n.NICs {
			switch {
			case c.Health == "":
			case reportedHealthy(c.Health):
				nics = slices.DeleteFunc(nics, func(name string) bool { return name == c.Name })
			case !slices.Contains(nics, c.Name):
				nics = append(nics, c.Name)
			}
		}
	}
	slices.Sort(nics)
	if len(nics) == 0 {
		nics = nil
	}
	return links, nics
}

// effective returns the node's topology with its down parts taken out.
func effective(n *Node) *topology.Node {
	t := n.Topology
	if t == nil || (len(n.DownNVLinks) == 0 && len(n.DownNICs) == 0) {
		return t
	}
	var links map[int]int
	for p, g := range t.GPUs {
		for _, l := range n.DownNVLinks {
			if l.GPU == g.Index {
				if links == nil {
					links = map[int]int{}
				}
				links[p]++ // DownNVLinks has no duplicates
			}
		}
	}
	var nics map[int]bool
	for k, c := range t.NICs {
		if _, ok := slices.BinarySearch(n.DownNICs, c.Name); ok {
			if nics == nil {
				nics = map[int]bool{}
			}
			nics[k] = true
		}
	}
	if links == nil && nics == nil {
		return t
	}
	return t.WithHealth(links, nics)
}

// putNode writes a node row whose topology or part health changed, with
// its effective topology, and recomputes its GPUs' domains.
func (w *writer) putNode(n *Node) error {
	n.Effective = effective(n)
	if err := w.txn.Insert(TableNodes, n); err != nil {
		return err
	}
	if err := w.touchNode(n.Name); err != nil {
		return err
	}
	return w.redomain(n)
}

// removeNode deletes a node and its free GPUs, and marks its allocated GPUs
// unhealthy, in no domain.
func removeNode(w *writer, name string, gpus []*GPU) error {
	if _, err := w.txn.DeleteAll(TableNodes, IndexID, name); err != nil {
		return err
	}
	for _, g := range gpus {
		if g.JobID == "" {
			if err := w.putGPU(g, nil); err != nil {
				return err
			}
			continue
		}
		upd := *g
		upd.Healthy, upd.HealthReason, upd.Domains = false, ReasonNodeRemoved, nil
		if err := w.putGPU(g, &upd); err != nil {
			return err
		}
	}
	return nil
}

func nodeEqual(a, b *Node) bool {
	return a.Name == b.Name && a.Position == b.Position && a.GPUModel == b.GPUModel &&
		a.GPUCount == b.GPUCount && maps.Equal(a.Labels, b.Labels) &&
		slices.Equal(a.DownNVLinks, b.DownNVLinks) && slices.Equal(a.DownNICs, b.DownNICs) &&
		reflect.DeepEqual(a.Topology, b.Topology)
}

// SetHealth applies a health change. Component "gpu" with ID the GPU's index
// (decimal) sets that GPU's health; component "node" sets the health of all
// the node's GPUs. Component "nvlink" with ID "<gpu index>/<link>" marks one
// NVLink of a GPU down or up again, "nic" with ID the NIC's name one NIC:
// the node's effective topology (Node.Effective) and its GPUs' islands and
// PCIe groups are recomputed in the same transaction (see
// topology.Node.WithHealth for what a down link does to a path); the GPUs
// stay free. Any other component is an error, as is an unknown node, GPU or
// NIC, or a malformed NVLink ID. A GPU kept only because a job holds it
// (ReasonMissing, ReasonNodeRemoved) stays unhealthy whatever the report
// says.
func (s *Store) SetHealth(h events.TopologyHealth) error {
	healthy := reportedHealthy(h.Health)
	reason := ""
	if !healthy {
		reason = cmp.Or(h.Reason, h.Health)
	}
	return s.write(func(w *writer) error {
		txn := w.txn
		raw, err := txn.First(TableNodes, IndexID, h.Node)
		if err != nil {
			return err
		}
		if raw == nil {
			return fmt.Errorf("store: health for unknown node %q", h.Node)
		}
		node := raw.(*Node)
		var targets []*GPU
		switch h.Component {
		case events.ComponentGPU:
			idx, err := strconv.Atoi(h.ID)
			if err != nil {
				return fmt.Errorf("store: health for GPU %q of node %q: GPU id is not an index", h.ID, h.Node)
			}
			g, err := txn.First(TableGPUs, IndexID, h.Node, idx)
			if err != nil {
				return err
			}
			if g == nil {
				return fmt.Errorf("store: health for unknown GPU %s", GPUKey{h.Node, idx})
			}
			targets = []*GPU{g.(*GPU)}
		case events.ComponentNode:
			if targets, err = gpusOfNode(txn, h.Node); err != nil {
				return err
			}
		case events.ComponentNVLink:
			return setNVLinkHealth(w, node, h.ID, healthy)
		case events.ComponentNIC:
			return setNICHealth(w, node, h.ID, healthy)
		default:
			return fmt.Errorf("store: health for unknown component %q of node %q", h.Component, h.Node)
		}
		for _, g := range targets {
			if g.HealthReason == ReasonMissing || g.HealthReason == ReasonNodeRemoved {
				continue
			}
			upd := *g
			upd.Healthy, upd.HealthReason = healthy, reason
			if err := w.putGPU(g, &upd); err != nil {
				return err
			}
		}
		return nil
	})
}

// setNVLinkHealth records one NVLink of a node down or up.
func setNVLinkHealth(w *writer, node *Node, id string, healthy bool) error {
	gpu, link, ok := strings.Cut(id, "/")
	idx, gerr := strconv.Atoi(gpu)
	num, lerr := strconv.Atoi(link)
	if !ok || gerr != nil || lerr != nil || idx < 0 || num < 0 {
		return fmt.Errorf("store: health for NVLink %q of node %q: id is not <gpu index>/<link>", id, node.Name)
	}
	g, err := w.txn.First(TableGPUs, IndexID, node.Name, idx)
	if err != nil {
		return err
	}
	if g == nil {
		return fmt.Errorf("store: health for NVLink %s of unknown GPU %s", id, GPUKey{node.Name, idx})
	}
	l := NVLinkID{GPU: idx, Link: num}
	i, down := slices.BinarySearchFunc(node.DownNVLinks, l, func(a, b NVLinkID) int {
		return cmp.Or(cmp.Compare(a.GPU, b.GPU), cmp.Compare(a.Link, b.Link))
	})
	if down != healthy {
		return nil // as recorded already
	}
	upd := *node
	if healthy {
		upd.DownNVLinks = slices.Delete(slices.Clone(node.DownNVLinks), i, i+1)
	} else {
		upd.DownNVLinks = slices.Insert(slices.Clone(node.DownNVLinks), i, l)
	}
	if len(upd.DownNVLinks) == 0 {
		upd.DownNVLinks = nil
	}
	return w.putNode(&upd)
}

// setNICHealth records one NIC of a node down or up.
func setNICHealth(w *writer, node *Node, name string, healthy bool) error {
	if node.Topology == nil || !slices.ContainsFunc(node.Topology.NICs, func(c topology.NIC) bool { return c.Name == name }) {
		return fmt.Errorf("store: health for unknown NIC %q of node %q", name, node.Name)
	}
	i, down := slices.BinarySearch(node.DownNICs, name)
	if down != healthy {
		return nil
	}
	upd := *node
	if healthy {
		upd.DownNICs = slices.Delete(slices.Clone(node.DownNICs), i, i+1)
	} else {
		upd.DownNICs = slices.Insert(slices.Clone(node.DownNICs), i, name)
	}
	if len(upd.DownNICs) == 0 {
		upd.DownNICs = nil
	}
	return w.putNode(&upd)
}

// Allocate gives gpus to jobID in one transaction. It re-checks that every
// GPU exists, is healthy and is free; if any is not, nothing is allocated and
// the error wraps ErrConflict and names each GPU at fault and why. Allocating
// the set the job already holds again is a no-op success (so replays are
// harmless); allocating a different set to a job that holds GPUs is a
// conflict: release first.
func (s *Store) Allocate(jobID string, gpus []GPUKey) error {
	return s.allocate(jobID, gpus, false)
}

// Restore re-applies an allocation that was already committed, as when a
// replica rebuilds from the streams. A rebuild replays the topology streams
// to their end before the allocation log, so a GPU may by then be unhealthy,
// missing from its node's report or on a removed node, where at the time of
// the allocation it was not. Restore still gives it to the job, so that the
// rebuilt store equals the live one: an unhealthy GPU is held as it is, and a
// GPU that no longer exists is recreated, unhealthy (ReasonMissing, or
// ReasonNodeRemoved when its node is gone), until the job releases it.
// A GPU held by another job is still a conflict (ErrConflict), and nothing
// is restored then; a job that holds the same set already is a no-op.
func (s *Store) Restore(jobID string, gpus []GPUKey) error {
	return s.allocate(jobID, gpus, true)
}

func (s *Store) allocate(jobID string, gpus []GPUKey, restore bool) error {
	if jobID == "" {
		return errors.New("store: allocate: empty job id")
	}
	if len(gpus) == 0 {
		return fmt.Errorf("store: allocate %q: no GPUs given", jobID)
	}
	want := slices.Clone(gpus)
	slices.SortFunc(want, compareKeys)
	for i := 1; i < len(want); i++ {
		if want[i] == want[i-1] {
			return fmt.Errorf("store: allocate %q: GPU %s given twice", jobID, want[i])
		}
	}
	return s.write(func(w *writer) error {
		txn := w.txn
		held, err := gpusOfJob(txn, jobID)
		if err != nil {
			return err
		}
		if len(held) > 0 {
			if sameKeys(held, want) {
				return nil
			}
			return fmt.Errorf("%w: job %q already holds %d other GPUs; release them first", ErrConflict, jobID, len(held))
		}

		olds, upds, problems, err := claim(txn, jobID, want, restore, nil)
		if err != nil {
			return err
		}
		if len(problems) > 0 {
			return fmt.Errorf("%w: job %q: %s", ErrConflict, jobID, strings.Join(problems, "; "))
		}
		for i, g := range upds {
			if err := w.putGPU(olds[i], g); err != nil {
				return err
			}
		}
		return nil
	})
}

// placeholderGPU returns the unhealthy row Restore creates for a GPU the
// topology no longer has. On a live node it is in the node's node-wide
// domains, as a GPU its report dropped is.
func placeholderGPU(txn *memdb.Txn, k GPUKey) (*GPU, error) {
	g := &GPU{Node: k.Node, Index: k.Index, HealthReason: ReasonNodeRemoved, NUMA: -1}
	raw, err := txn.First(TableNodes, IndexID, k.Node)
	if err != nil {
		return nil, err
	}
	if raw != nil {
		n := raw.(*Node)
		g.Model, g.NodePosition, g.HealthReason = n.GPUModel, n.Position, ReasonMissing
		fabric, err := fabricOf(txn, k.Node)
		if err != nil {
			return nil, err
		}
		g.Domains = nodeDomains(n, []*GPU{g}, fabric)[0]
	}
	return g, nil
}

// Release frees every GPU held by jobID and returns them sorted by node name
// and index. A GPU kept only because the job held it (ReasonMissing,
// ReasonNodeRemoved) is deleted instead of freed. Releasing a job that holds
// nothing returns nil, nil.
func (s *Store) Release(jobID string) ([]GPUKey, error) {
	if jobID == "" {
		return nil, nil
	}
	var keys []GPUKey
	err := s.write(func(w *writer) error {
		held, err := gpusOfJob(w.txn, jobID)
		if err != nil {
			return err
		}
		for _, g := range held {
			keys = append(keys, g.Key())
			if err := w.freeGPU(g); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	slices.SortFunc(keys, compareKeys)
	return keys, nil
}

// UpsertJob inserts or updates a job. On first insert the store assigns Seq
// from its own counter; afterwards the job keeps that Seq, whatever j.Seq
// says.
func (s *Store) UpsertJob(j Job) error {
	if j.ID == "" {
		return errors.New("store: job without an id")
	}
	switch j.State {
	case JobPending, JobPlaced, JobRejected, JobFinished:
	default:
		return fmt.Errorf("store: job %q: unknown state %q", j.ID, j.State)
	}
	return s.write(func(w *writer) error {
		txn := w.txn
		old, err := txn.First(TableJobs, IndexID, j.ID)
		if err != nil {
			return err
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
	})
}

// DeleteJob removes a job. Deleting an unknown job is a no-op. A job that
// still holds GPUs is not deleted: release them first.
func (s *Store) DeleteJob(id string) error {
	return s.write(func(w *writer) error {
		txn := w.txn
		held, err := gpusOfJob(txn, id)
		if err != nil {
			return err
		}
		if len(held) > 0 {
			return fmt.Errorf("store: job %q still holds %d GPUs; release them first", id, len(held))
		}
		_, err = txn.DeleteAll(TableJobs, IndexID, id)
		return err
	})
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

// gpusOfNode returns the rows of a node's GPUs, by index. The rows belong to
// memdb: read, never modify.
func gpusOfNode(txn *memdb.Txn, node string) ([]*GPU, error) {
	it, err := txn.Get(TableGPUs, IndexNode, node)
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

// sameKeys reports whether held (sorted by node, index, as the job index
// yields them) names exactly want (sorted).
func sameKeys(held []*GPU, want []GPUKey) bool {
	if len(held) != len(want) {
		return false
	}
	for i, g := range held {
		if g.Key() != want[i] {
			return false
		}
	}
	return true
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

// claim reads the GPUs a job is to take, skipping those skip names (ones
// it holds already), and returns their rows before and after (olds[i] nil
// for a placeholder of a GPU no report lists, made only when restore) and
// every reason they cannot be taken: held by a job, unhealthy (allowed when
// restore, which replays what was decided before), missing.
func claim(txn *memdb.Txn, jobID string, want []GPUKey, restore bool, skip func(GPUKey) bool) (olds, upds []*GPU, problems []string, err error) {
	olds = make([]*GPU, 0, len(want))
	upds = make([]*GPU, 0, len(want))
	for _, k := range want {
		if skip != nil && skip(k) {
			continue
		}
		raw, err := txn.First(TableGPUs, IndexID, k.Node, k.Index)
		if err != nil {
			return nil, nil, nil, err
		}
		if raw == nil {
			if !restore {
				problems = append(problems, fmt.Sprintf("GPU %s does not exist", k))
				continue
			}
			g, err := placeholderGPU(txn, k)
			if err != nil {
				return nil, nil, nil, err
			}
			g.JobID = jobID
			olds, upds = append(olds, nil), append(upds, g)
			continue
		}
		g := raw.(*GPU)
		switch {
		case g.JobID != "":
			problems = append(problems, fmt.Sprintf("GPU %s is held by job %q", k, g.JobID))
		case !g.Healthy && !restore:
			problems = append(problems, fmt.Sprintf("GPU %s is unhealthy (%s)", k, g.HealthReason))
		default:
			upd := *g
			upd.JobID = jobID
			olds, upds = append(olds, g), append(upds, &upd)
		}
	}
	return olds, upds, problems, nil
}

// freeGPU gives a held GPU back: free again, or gone when it was kept only
// because its job held it (missing from its node's report, or of a removed
// node).
func (w *writer) freeGPU(g *GPU) error {
	if g.HealthReason == ReasonMissing || g.HealthReason == ReasonNodeRemoved {
		return w.putGPU(g, nil)
	}
	upd := *g
	upd.JobID = ""
	return w.putGPU(g, &upd)
}
