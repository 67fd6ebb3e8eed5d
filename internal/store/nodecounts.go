package store

import (
	"encoding/binary"
	"fmt"
	"iter"
	"maps"
	"slices"

	memdb "github.com/hashicorp/go-memdb"
)

// Node counts and the node-free index: what lets placement answer "how
// many nodes have k healthy (free) GPUs of model M", "the largest node of
// model M", "the kinds of wholly free node", "how far below its free GPUs
// a node's smallest hole can be" (MaxOutside), and "the nodes with at
// least k free GPUs of model M, fewest first (or in enumeration order)"
// without walking the cluster. Both are
// kept from the node domains' rows (a node domain holds exactly the GPUs of
// one live node) in the same write transaction as the GPU rows, so they
// agree with every other read of a snapshot.

// NodeCounts counts the nodes of the cluster by how many GPUs of one model
// they have. Total[c] is the number of nodes with exactly c GPUs of the
// model (healthy or not), Healthy[c] with exactly c healthy ones, Free[c]
// with exactly c free ones, for c ≥ 1: nodes with none are not counted, and
// index 0 stays 0. Each slice ends at its last non-zero entry, so
// len(Total)-1 is the most GPUs of the model on one node. A GPU without a
// model (on a node without one) counts under "" only. Shared: do not
// modify.
type NodeCounts struct {
	Model                string // "" counts GPUs of any model
	Total, Healthy, Free []int
	// WholeFree counts the nodes whose GPUs of the model are all free
	// (and that have some).
	WholeFree int
	// Whole sorts those nodes into kinds, in no particular order. Shared:
	// do not modify.
	Whole []WholeKind
	// Outside[x] counts the nodes with x GPUs outside the smallest
	// node-local domain (island, PCIe group, NUMA node) of one of their
	// GPUs, at most (MaxOutside).
	Outside []int
}

// MaxOutside is the most GPUs any node with GPUs of the model has outside
// the smallest node-local domain of one of its GPUs: on every such node,
// the free GPUs of the smallest domain of any free GPU are at least its
// free GPUs of the model less this (at least one). 0 on a cluster of
// NVSwitch nodes, where they are all its free GPUs.
func (c NodeCounts) MaxOutside() int { return max(len(c.Outside)-1, 0) }

// WholeKind is one kind of node among those whose GPUs of a model are all
// free: nodes alike (Alike) while wholly free, and how many there are. A
// walk of the nodes by fit that has seen enough nodes of every kind with
// its last free count knows that the rest of the walk brings nothing new
// (aware's one-node walk), without reading it.
type WholeKind struct {
	// Node and GPUs are the row and the GPUs of the model (all free, by
	// index) of one node of the kind. Shared: do not modify.
	Node  *Node
	GPUs  []FreeGPU
	Nodes int
}

// Alike reports whether two nodes, with these free GPUs of a model, are
// the same to a placement on one node: the same links (Node.Links), GPU
// model and count, and free GPUs by index and model. Which node, its
// labels and its fabric are not compared.
func Alike(a *Node, af []FreeGPU, b *Node, bf []FreeGPU) bool {
	// The free GPUs first: they tell most nodes apart, and cheaply; the
	// links last, a string of the whole matrix.
	return a.GPUCount == b.GPUCount && slices.EqualFunc(af, bf, func(x, y FreeGPU) bool { return x.Index == y.Index && x.Model == y.Model }) &&
		a.GPUModel == b.GPUModel && a.Links == b.Links
}

// MaxTotal returns the most GPUs of the model on one node, healthy or not.
func (c NodeCounts) MaxTotal() int { return max(len(c.Total)-1, 0) }

// MaxFree returns the most free GPUs of the model on one node.
func (c NodeCounts) MaxFree() int { return max(len(c.Free)-1, 0) }

// TotalAtLeast returns the number of nodes with at least k GPUs of the
// model; k below 1 counts as 1.
func (c NodeCounts) TotalAtLeast(k int) int { return atLeast(c.Total, k) }

// HealthyAtLeast returns the number of nodes with at least k healthy GPUs
// of the model; k below 1 counts as 1.
func (c NodeCounts) HealthyAtLeast(k int) int { return atLeast(c.Healthy, k) }

// FreeAtLeast returns the number of nodes with at least k free GPUs of the
// model; k below 1 counts as 1.
func (c NodeCounts) FreeAtLeast(k int) int { return atLeast(c.Free, k) }

func atLeast(hist []int, k int) int {
	n := 0
	for c := max(k, 1); c < len(hist); c++ {
		n += hist[c]
	}
	return n
}

// nodeCountsEdit is a writer's copy of one NodeCounts row.
type nodeCountsEdit struct {
	old *NodeCounts // as in the table; nil for a new row
	cur *NodeCounts
}

// countNode moves a node domain's counts from old to cur (either may be
// nil or empty) in the node counts of every model it has and of "".
func (w *writer) countNode(old, cur *Domain) error {
	if old != nil {
		if err := w.nodeCount(old, -1); err != nil {
			return err
		}
	}
	if cur != nil && cur.Total > 0 {
		return w.nodeCount(cur, +1)
	}
	return nil
}

func (w *writer) nodeCount(d *Domain, sign int) error {
	if err := w.addNodeCount("", d.Total, d.Healthy, d.Free, d.outside, sign); err != nil {
		return err
	}
	for _, m := range d.Models {
		if m.Model == "" {
			continue // GPUs without a model count under "" (any) only
		}
		if err := w.addNodeCount(m.Model, m.Total, m.Healthy, m.Free, d.outside, sign); err != nil {
			return err
		}
	}
	return nil
}

// countsEdit returns the writer's copy of the node counts of a model.
func (w *writer) countsEdit(model string) (*nodeCountsEdit, error) {
	if e, ok := w.nodeCounts[model]; ok {
		return e, nil
	}
	raw, err := w.txn.First(TableNodeCounts, IndexID, model)
	if err != nil {
		return nil, err
	}
	e := &nodeCountsEdit{}
	if raw != nil {
		e.old = raw.(*NodeCounts)
		e.cur = &NodeCounts{Model: model, Total: slices.Clone(e.old.Total),
			Healthy: slices.Clone(e.old.Healthy), Free: slices.Clone(e.old.Free), WholeFree: e.old.WholeFree,
			Whole: slices.Clone(e.old.Whole), Outside: slices.Clone(e.old.Outside)}
	} else {
		e.cur = &NodeCounts{Model: model}
	}
	if w.nodeCounts == nil {
		w.nodeCounts = map[string]*nodeCountsEdit{}
	}
	w.nodeCounts[model] = e
	return e, nil
}

func (w *writer) addNodeCount(model string, total, healthy, free, outside, sign int) error {
	e, err := w.countsEdit(model)
	if err != nil {
		return err
	}
	// add counts a node at c in hist; counts below least are not kept
	// (index 0 of Total, Healthy and Free stays 0; Outside counts 0).
	add := func(hist *[]int, c, least int) error {
		if c < least {
			return nil
		}
		if c >= len(*hist) {
			*hist = append(*hist, make([]int, c+1-len(*hist))...)
		}
		(*hist)[c] += sign
		if (*hist)[c] < 0 {
			return fmt.Errorf("store: node counts of model %q went negative at %d: a store bug", model, c)
		}
		return nil
	}
	if err := add(&e.cur.Total, total, 1); err != nil {
		return err
	}
	if err := add(&e.cur.Healthy, healthy, 1); err != nil {
		return err
	}
	if err := add(&e.cur.Outside, outside, 0); err != nil {
		return err
	}
	if total > 0 && free == total {
		if e.cur.WholeFree += sign; e.cur.WholeFree < 0 {
			return fmt.Errorf("store: whole free nodes of model %q went negative: a store bug", model)
		}
	}
	return add(&e.cur.Free, free, 1)
}

// kindNode moves a node domain between the kinds of wholly free nodes
// (NodeCounts.Whole) of "" and of each model it has, from old to cur
// (either may be nil). It runs after cur's node row is set.
func (w *writer) kindNode(old, cur *Domain) error {
	var err error
	// A node wholly free of a model before and after, alike, stays put.
	stays := func(other *Domain, model string, n *Node, free []FreeGPU) bool {
		return other != nil && wholeAlike(other, model, n, free)
	}
	eachWhole(old, func(model string, free []FreeGPU) {
		if err == nil && !stays(cur, model, old.node, free) {
			err = w.addKind(model, old.node, free, -1)
		}
	})
	eachWhole(cur, func(model string, free []FreeGPU) {
		if err == nil && !stays(old, model, cur.node, free) {
			err = w.addKind(model, cur.node, free, +1)
		}
	})
	return err
}

// eachWhole calls f with "" and each model of which a node domain's GPUs
// are all free, and those GPUs.
func eachWhole(d *Domain, f func(model string, free []FreeGPU)) {
	if d == nil || d.node == nil || d.Total == 0 {
		return
	}
	if d.Free == d.Total {
		f("", freeOf(d, ""))
	}
	for _, m := range d.Models {
		if m.Model != "" && m.Free == m.Total {
			f(m.Model, freeOf(d, m.Model))
		}
	}
}

// wholeAlike reports whether node domain d's GPUs of model are all free
// and d is alike a node n with those free GPUs.
func wholeAlike(d *Domain, model string, n *Node, free []FreeGPU) bool {
	c := d.Count(model)
	return d.node != nil && c.Total > 0 && c.Free == c.Total && Alike(d.node, freeOf(d, model), n, free)
}

// addKind adds sign nodes n, with free its GPUs of model, to their kind.
func (w *writer) addKind(model string, n *Node, free []FreeGPU, sign int) error {
	e, err := w.countsEdit(model)
	if err != nil {
		return err
	}
	whole := e.cur.Whole
	i := slices.IndexFunc(whole, func(k WholeKind) bool { return Alike(k.Node, k.GPUs, n, free) })
	switch {
	case i < 0 && sign < 0:
		return fmt.Errorf("store: node %s left a kind of whole free nodes of model %q it was not in: a store bug", n.Name, model)
	case i < 0:
		e.cur.Whole = append(whole, WholeKind{Node: n, GPUs: free, Nodes: 1})
	default:
		whole[i].Nodes += sign
		if whole[i].Nodes == 0 {
			e.cur.Whole = slices.Delete(whole, i, i+1)
		}
	}
	return nil
}

// trimCounts drops a histogram's trailing zeros (and returns nil for one
// that counts no node).
func trimCounts(h []int) []int {
	for len(h) > 0 && h[len(h)-1] == 0 {
		h = h[:len(h)-1]
	}
	if len(h) == 0 {
		return nil
	}
	return h
}

// flushNodeCounts writes the node counts that changed.
func (w *writer) flushNodeCounts() error {
	for _, model := range slices.Sorted(maps.Keys(w.nodeCounts)) {
		e := w.nodeCounts[model]
		c := e.cur
		c.Total, c.Healthy, c.Free, c.Outside = trimCounts(c.Total), trimCounts(c.Healthy), trimCounts(c.Free), trimCounts(c.Outside)
		switch {
		case c.Total == nil:
			if e.old != nil {
				if err := w.txn.Delete(TableNodeCounts, e.old); err != nil {
					return err
				}
			}
		case e.old == nil || !nodeCountsEqual(e.old, c):
			if err := w.txn.Insert(TableNodeCounts, c); err != nil {
				return err
			}
		}
	}
	w.nodeCounts = nil
	return nil
}

func nodeCountsEqual(a, b *NodeCounts) bool {
	return a.Model == b.Model && slices.Equal(a.Total, b.Total) && slices.Equal(a.Healthy, b.Healthy) &&
		slices.Equal(a.Free, b.Free) && slices.Equal(a.Outside, b.Outside) && a.WholeFree == b.WholeFree &&
		slices.EqualFunc(a.Whole, b.Whole, func(x, y WholeKind) bool {
			return x.Nodes == y.Nodes && Alike(x.Node, x.GPUs, y.Node, y.GPUs)
		})
}

// modelIndexer keys a NodeCounts row by its Model, "" included: model NUL.
type modelIndexer struct{}

func (modelIndexer) FromObject(obj any) (bool, []byte, error) {
	c, ok := obj.(*NodeCounts)
	if !ok {
		return false, nil, fmt.Errorf("store: node counts index: unexpected %T", obj)
	}
	return true, append([]byte(c.Model), 0), nil
}

func (modelIndexer) FromArgs(args ...any) ([]byte, error) {
	if len(args) != 1 {
		return nil, fmt.Errorf("store: node counts index: want a model, got %d arguments", len(args))
	}
	m, ok := args[0].(string)
	if !ok {
		return nil, fmt.Errorf("store: node counts index: model %#v is not a string", args[0])
	}
	return append([]byte(m), 0), nil
}

// nodeFreeIndexer is the indexer of IndexNodeFree on the domains table: for
// each node domain with free GPUs, one key for "" (any model) and one per
// model it has free GPUs of, reading
//
//	<model> NUL <free GPUs of the model, 4 bytes big-endian> <node position (appendPosition)>
//
// to which memdb appends the domain's ID ("node:<name>" NUL). The prefix
// "<model> NUL <k>" walks the nodes with exactly k free GPUs of the model in
// enumeration order; NodeCounts says which k have any. A full node has no
// key, so the index holds only the nodes a job could go to. Model names
// must not contain NUL.
type nodeFreeIndexer struct{}

func (nodeFreeIndexer) FromObject(obj any) (bool, [][]byte, error) {
	d, ok := obj.(*Domain)
	if !ok {
		return false, nil, fmt.Errorf("store: node-free index: unexpected %T", obj)
	}
	if d.Kind != DomainNode || d.Free == 0 {
		return false, nil, nil
	}
	key := func(model string, free int) []byte {
		// Room for what memdb appends (the ID and NUL), so its append
		// does not copy.
		b := make([]byte, 0, len(model)+1+4+positionKeyLen+len(d.ID)+1)
		b = append(append(b, model...), 0)
		b = binary.BigEndian.AppendUint32(b, uint32(free))
		return appendPosition(b, d.Position)
	}
	vals := make([][]byte, 0, 1+len(d.Models))
	vals = append(vals, key("", d.Free))
	for _, m := range d.Models {
		if m.Free > 0 && m.Model != "" { // "" is any model's key, above
			vals = append(vals, key(m.Model, m.Free))
		}
	}
	return true, vals, nil
}

// FromArgs takes a model and optionally a free count: the prefix to walk.
func (nodeFreeIndexer) FromArgs(args ...any) ([]byte, error) {
	if len(args) < 1 || len(args) > 2 {
		return nil, fmt.Errorf("store: node-free index: want a model and optionally a free count, got %d arguments", len(args))
	}
	model, ok := args[0].(string)
	if !ok {
		return nil, fmt.Errorf("store: node-free index: model %#v is not a string", args[0])
	}
	key := append([]byte(model), 0)
	if len(args) == 2 {
		free, ok := args[1].(int)
		if !ok || free < 0 {
			return nil, fmt.Errorf("store: node-free index: free count %#v is not a non-negative int", args[1])
		}
		key = binary.BigEndian.AppendUint32(key, uint32(free))
	}
	return key, nil
}

// NodeCounts returns the counts of nodes by their GPUs of a model ("" for
// any), in O(1).
func (s *Snapshot) NodeCounts(model string) NodeCounts {
	raw := s.first(TableNodeCounts, IndexID, model)
	if raw == nil {
		return NodeCounts{Model: model}
	}
	return *raw.(*NodeCounts)
}

// OneModelFree reports whether the nodes with at least min free GPUs are
// all of one GPU model, as far as the node counts can tell: exactly one
// model has such nodes, and as many as the counts of any model. A walk
// that orders candidates by their model's speed (aware's compute by
// model) has nothing to order then. O(models).
func (s *Snapshot) OneModelFree(min int) bool {
	anyModel := s.NodeCounts("").FreeAtLeast(min)
	models := 0
	it := s.get(TableNodeCounts, IndexID)
	for raw := it.Next(); raw != nil; raw = it.Next() {
		c := raw.(*NodeCounts)
		if c.Model == "" || c.FreeAtLeast(min) == 0 {
			continue
		}
		if models++; models > 1 || c.FreeAtLeast(min) != anyModel {
			return false
		}
	}
	return true
}

// NodesByFree yields the node domains (Domain.Node names the node) with at
// least min free GPUs of a model ("" for any), fewest free GPUs of the
// model first, then in enumeration order (position, name): best fit first.
// It walks only those nodes, one prefix of the node-free index per free
// count that any node has.
func (s *Snapshot) NodesByFree(model string, min int) iter.Seq[Domain] {
	return func(yield func(Domain) bool) {
		counts := s.NodeCounts(model)
		txn := s.txn
		for c := max(min, 1); c < len(counts.Free); c++ {
			if counts.Free[c] == 0 {
				continue
			}
			it, err := txn.Get(TableDomains, IndexNodeFree, model, c)
			must(err)
			for raw := it.Next(); raw != nil; raw = it.Next() {
				if !yield(raw.(*Domain).public()) {
					return
				}
			}
		}
	}
}

// NodesWithFree yields the node domains with at least min free GPUs of a
// model ("" for any) in enumeration order (position, name): first fit
// first. It merges one walk of the node-free index per free count that any
// node has, and stops when the caller does.
func (s *Snapshot) NodesWithFree(model string, min int) iter.Seq[Domain] {
	return func(yield func(Domain) bool) {
		s.eachNodeWithFree(model, min, func(d *Domain) bool { return yield(d.public()) })
	}
}

// eachNodeWithFree is NodesWithFree on the rows themselves.
func (s *Snapshot) eachNodeWithFree(model string, min int, yield func(*Domain) bool) {
	counts := s.NodeCounts(model)
	txn := s.txn
	type head struct {
		it  memdb.ResultIterator
		cur *Domain
	}
	var heads []head
	for c := max(min, 1); c < len(counts.Free); c++ {
		if counts.Free[c] == 0 {
			continue
		}
		it, err := txn.Get(TableDomains, IndexNodeFree, model, c)
		must(err)
		if raw := it.Next(); raw != nil {
			heads = append(heads, head{it: it, cur: raw.(*Domain)})
		}
	}
	for len(heads) > 0 {
		bi := 0
		for i := 1; i < len(heads); i++ {
			a, b := heads[i].cur, heads[bi].cur
			if a.Position < b.Position || (a.Position == b.Position && a.Node < b.Node) {
				bi = i
			}
		}
		if !yield(heads[bi].cur) {
			return
		}
		if raw := heads[bi].it.Next(); raw != nil {
			heads[bi].cur = raw.(*Domain)
		} else {
			heads = slices.Delete(heads, bi, bi+1)
		}
	}
}

// EachNodeFree yields, in enumeration order, the nodes with free GPUs of
// a model ("" for any), each with those GPUs sorted by Index: what
// EachNodeWithGPUs gives, less the held and unhealthy GPUs, the GPUs of
// other models and the nodes left with none, and only what placement reads
// of each GPU. It walks the node-free index (one entry per such node) and
// reads each node's row and free GPUs from its domain row, so it costs one
// index step per node with room, whatever the number of GPUs. The node is
// the store's row, and the slices are the store's too, or new when the
// node has GPUs of other models: keep them, but do not modify them.
func (s *Snapshot) EachNodeFree(model string) iter.Seq2[*Node, []FreeGPU] {
	return func(yield func(*Node, []FreeGPU) bool) {
		s.eachNodeWithFree(model, 1, func(d *Domain) bool {
			return yield(d.node, freeOf(d, model))
		})
	}
}

// NodeFree is one node as EachNodeFree gives it: its row and its free
// GPUs of a model ("" for any), by index, both the store's (do not modify);
// false for a node the store does not have or with no such GPU free. One
// index lookup.
func (s *Snapshot) NodeFree(name, model string) (*Node, []FreeGPU, bool) {
	raw := s.first(TableDomains, IndexID, DomainNode+":"+name)
	if raw == nil {
		return nil, nil, false
	}
	d := raw.(*Domain)
	free := freeOf(d, model)
	if d.node == nil || len(free) == 0 {
		return nil, nil, false
	}
	return d.node, free, true
}

// EachNodeFreeIn is EachNodeFree for the nodes of one domain (a leaf or a
// pod: see EachFreeGPUIn): it walks the domain's free GPUs, not the
// cluster's nodes, so a job spread inside one leaf reads that leaf's
// nodes only.
func (s *Snapshot) EachNodeFreeIn(domain, model string) iter.Seq2[*Node, []FreeGPU] {
	return func(yield func(*Node, []FreeGPU) bool) {
		last := ""
		for g := range s.EachFreeGPUIn(domain, model) {
			if g.Node == last {
				continue
			}
			last = g.Node
			raw := s.first(TableDomains, IndexID, DomainNode+":"+g.Node)
			if raw == nil {
				continue
			}
			d := raw.(*Domain)
			if !yield(d.node, freeOf(d, model)) {
				return
			}
		}
	}
}

// freeOf is a node domain's free GPUs of a model ("" for any): the
// store's own list when the node has that model only.
func freeOf(d *Domain, model string) []FreeGPU {
	free := d.free
	if model != "" && (len(d.Models) != 1 || d.Models[0].Model != model) {
		free = nil
		for _, g := range d.free {
			if g.Model == model {
				free = append(free, g)
			}
		}
	}
	return free[:len(free):len(free)]
}

// EachNodeFreeByFit is EachNodeFree in best-fit order: the nodes with at
// least min free GPUs of the model, fewest free first, then enumeration
// order (as NodesByFree). A caller that wants only the best-fitting few
// stops early and walks no more of the index.
func (s *Snapshot) EachNodeFreeByFit(model string, min int) iter.Seq2[*Node, []FreeGPU] {
	return func(yield func(*Node, []FreeGPU) bool) {
		counts := s.NodeCounts(model)
		for c := max(min, 1); c < len(counts.Free); c++ {
			if counts.Free[c] == 0 {
				continue
			}
			it, err := s.txn.Get(TableDomains, IndexNodeFree, model, c)
			must(err)
			for raw := it.Next(); raw != nil; raw = it.Next() {
				d := raw.(*Domain)
				if !yield(d.node, freeOf(d, model)) {
					return
				}
			}
		}
	}
}
