package store

// The writer: one write transaction's bookkeeping of domain rows. Every
// GPU row goes through putGPU, which adjusts the counts and free lists of
// the domains the GPU leaves and joins; flush writes them before the
// commit, and redomain recomputes a node's GPUs' domains.

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	memdb "github.com/hashicorp/go-memdb"
)

// writer is one write transaction. It keeps the domain rows in step with
// the GPU rows: every GPU row goes through putGPU, which adjusts the counts
// of the domains it leaves and joins on copies held until flush, so a
// domain is written once per transaction however many of its GPUs change.
type writer struct {
	txn        *memdb.Txn
	domains    map[string]*domainEdit
	nodeCounts map[string]*nodeCountsEdit // by model, "" for any
	// flushing is flushDomains' list of the rows it writes, kept for the
	// next: a cycle flushes once a decision.
	flushing []string
}

type domainEdit struct {
	old *Domain // as in the table; nil for a new domain
	cur *Domain // the writer's copy
	// dirty: a GPU row of the node domain changed, or the node's row.
	dirty bool
}

// share is what one GPU row adds to the counts of each of its domains.
type share struct {
	model         string
	healthy, free bool
	pos           int // the GPU's NodePosition, which node-local domains copy
}

func shareOf(g *GPU) share {
	return share{model: g.Model, healthy: g.Healthy, free: g.Free(), pos: g.NodePosition}
}

// putGPU replaces old with upd (either may be nil: an insert, a delete)
// and adjusts the domain counts. An upd equal to old writes nothing: a
// report that changed nothing copies no tree path.
func (w *writer) putGPU(old, upd *GPU) error {
	switch {
	case upd == nil && old == nil:
		return nil
	case upd == nil:
		if err := w.txn.Delete(TableGPUs, old); err != nil {
			return err
		}
	case old != nil && gpuEqual(old, upd):
		return nil
	default:
		if err := w.txn.Insert(TableGPUs, upd); err != nil {
			return err
		}
	}
	if err := w.trackGPU(old, upd); err != nil {
		return err
	}
	var before, after []string
	var sb, sa share
	if old != nil {
		before, sb = old.Domains, shareOf(old)
	}
	if upd != nil {
		after, sa = upd.Domains, shareOf(upd)
	}
	for _, d := range before {
		if sb == sa && slices.Contains(after, d) {
			continue // counted the same before and after
		}
		if err := w.count(d, sb, -1); err != nil {
			return err
		}
	}
	for _, d := range after {
		if sb == sa && slices.Contains(before, d) {
			continue
		}
		if err := w.count(d, sa, +1); err != nil {
			return err
		}
	}
	return nil
}

// edit returns the writer's copy of domain id, a new row when the table
// has none.
func (w *writer) edit(id string) (*domainEdit, error) {
	e, ok := w.domains[id]
	if ok {
		return e, nil
	}
	raw, err := w.txn.First(TableDomains, IndexID, id)
	if err != nil {
		return nil, err
	}
	e = &domainEdit{}
	if raw != nil {
		e.old = raw.(*Domain)
		c := *e.old
		c.Models = slices.Clone(c.Models)
		c.free = slices.Clone(c.free)
		e.cur = &c
	} else {
		e.cur = &Domain{ID: id, Kind: DomainKind(id), Node: domainNode(id)}
	}
	if w.domains == nil {
		w.domains = map[string]*domainEdit{}
	}
	w.domains[id] = e
	return e, nil
}

// trackGPU keeps the free lists of the node domains old leaves and upd
// joins (either may be nil) after a GPU row changed.
func (w *writer) trackGPU(old, upd *GPU) error {
	if old != nil {
		if id := nodeDomainOf(old); id != "" {
			e, err := w.edit(id)
			if err != nil {
				return err
			}
			e.dirty = true
			e.cur.free = slices.DeleteFunc(e.cur.free, func(g FreeGPU) bool { return g.Index == old.Index })
		}
	}
	if upd != nil {
		if id := nodeDomainOf(upd); id != "" {
			e, err := w.edit(id)
			if err != nil {
				return err
			}
			e.dirty = true
			if upd.Free() {
				i, _ := slices.BinarySearchFunc(e.cur.free, upd.Index, func(g FreeGPU, idx int) int { return cmp.Compare(g.Index, idx) })
				e.cur.free = slices.Insert(e.cur.free, i, FreeGPU{Node: upd.Node, Index: upd.Index, Model: upd.Model, Domains: upd.Domains})
			}
		}
	}
	return nil
}

// nodeDomainOf returns the ID of the node domain a GPU row is in ("" when
// none): the one of its own node.
func nodeDomainOf(g *GPU) string {
	for _, d := range g.Domains {
		if strings.HasPrefix(d, DomainNode+":") && d[len(DomainNode)+1:] == g.Node {
			return d
		}
	}
	return ""
}

// touchNode makes the writer rewrite a node's domain row (when it has one)
// after the node's row changed, so that it points at the new row.
func (w *writer) touchNode(name string) error {
	e, err := w.edit(DomainNode + ":" + name)
	if err == nil {
		e.dirty = true
	}
	return err
}

// count adds sign times s to domain id.
func (w *writer) count(id string, s share, sign int) error {
	e, err := w.edit(id)
	if err != nil {
		return err
	}
	d := e.cur
	if sign > 0 && d.Node != "" {
		d.Position = s.pos
	}
	add := func(c *int, yes bool) {
		if yes {
			*c += sign
		}
	}
	add(&d.Total, true)
	add(&d.Healthy, s.healthy)
	add(&d.Free, s.free)
	i, found := slices.BinarySearchFunc(d.Models, s.model, compareModel)
	if !found {
		d.Models = slices.Insert(d.Models, i, ModelCount{Model: s.model})
	}
	m := &d.Models[i]
	add(&m.Total, true)
	add(&m.Healthy, s.healthy)
	add(&m.Free, s.free)
	if m.Total < 0 || m.Healthy < 0 || m.Free < 0 || d.Total < 0 || d.Healthy < 0 || d.Free < 0 {
		return fmt.Errorf("store: domain %s: counts went negative (%+v): a store bug", id, *d)
	}
	if m.Total == 0 {
		d.Models = slices.Delete(d.Models, i, i+1)
	}
	return nil
}

// flush writes the domains whose counts changed, and deletes those left
// without GPUs; the node counts (nodecounts.go) follow the node domains.
func (w *writer) flush() error { return w.flushDomains(true) }

// flushLocal is flush for the node domains, which the node-free index
// and the node counts follow. The others (a node's islands, PCIe groups
// and NUMA nodes, which no index lists; a leaf, pod, core, the cluster:
// one row shared by many nodes) stay with the writer: a transaction's
// Snapshot reads them from there (pendingDomain), so a cycle of decisions
// writes each of them into its tree once, at commit, instead of once per
// decision: some ten rows per GPU on a rail-optimized fabric, and, as
// one-GPU jobs are packed onto the fullest node, its islands' rows again
// and again.
func (w *writer) flushLocal() error { return w.flushDomains(false) }

func (w *writer) flushDomains(all bool) error {
	ids := w.flushing[:0]
	for id, e := range w.domains {
		if all || e.cur.Kind == DomainNode {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	w.flushing = ids
	for _, id := range ids {
		e := w.domains[id]
		delete(w.domains, id)
		if e.cur.Kind == DomainNode && (e.old == nil || !domainEqual(e.old, e.cur)) {
			if err := w.countNode(e.old, e.cur); err != nil {
				return err
			}
		}
		if e.cur.Kind == DomainNode && e.cur.Total > 0 {
			raw, err := w.txn.First(TableNodes, IndexID, e.cur.Node)
			if err != nil {
				return err
			}
			if raw == nil {
				return fmt.Errorf("store: domain %s has GPUs but its node has no row: a store bug", id)
			}
			e.cur.node = raw.(*Node)
		}
		if e.cur.Kind == DomainNode {
			if err := w.kindNode(e.old, e.cur); err != nil {
				return err
			}
		}
		switch {
		case e.cur.Total == 0:
			if e.old != nil {
				if err := w.txn.Delete(TableDomains, e.old); err != nil {
					return err
				}
			}
		case e.old == nil || !domainEqual(e.old, e.cur) || e.dirty:
			e.cur.trim()
			if err := w.txn.Insert(TableDomains, e.cur); err != nil {
				return err
			}
		}
	}
	return w.flushNodeCounts()
}

// trim empties a row's empty slices, as the table keeps them.
func (d *Domain) trim() {
	if len(d.free) == 0 {
		d.free = nil
	}
	if len(d.Models) == 0 {
		d.Models = nil
	}
}

// pendingDomain is a domain edited but not yet written, as the table will
// hold it: ok says whether the writer has one, row whether it has GPUs
// (else it has none, and the table will have no row).
func (w *writer) pendingDomain(id string) (d *Domain, row, ok bool) {
	e, ok := w.domains[id]
	if !ok {
		return nil, false, false
	}
	if e.cur.Total == 0 {
		return nil, false, true
	}
	e.cur.trim()
	return e.cur, true, true
}

func domainEqual(a, b *Domain) bool {
	return a.ID == b.ID && a.Kind == b.Kind && a.Node == b.Node && a.Position == b.Position && a.Total == b.Total &&
		a.Healthy == b.Healthy && a.Free == b.Free && slices.Equal(a.Models, b.Models) && a.outside == b.outside
}

func gpuEqual(a, b *GPU) bool {
	return a.Node == b.Node && a.Index == b.Index && a.UUID == b.UUID && a.Model == b.Model &&
		a.MemoryMiB == b.MemoryMiB && a.Healthy == b.Healthy && a.HealthReason == b.HealthReason &&
		a.JobID == b.JobID && a.HeldBy == b.HeldBy && a.NodePosition == b.NodePosition && a.NUMA == b.NUMA &&
		slices.Equal(a.Domains, b.Domains)
}

// redomain recomputes the Domains of a node's GPUs (after its effective
// topology or its fabric domains changed) and writes those that changed.
// n is the node's row as it is to be, nil for a node the store does not
// have (then nothing is done: its GPUs, if any, are orphans).
func (w *writer) redomain(n *Node) error {
	if n == nil {
		return nil
	}
	gpus, err := gpusOfNode(w.txn, n.Name)
	if err != nil {
		return err
	}
	fabric, err := fabricOf(w.txn, n.Name)
	if err != nil {
		return err
	}
	doms := nodeDomains(n, gpus, fabric)
	for i, g := range gpus {
		if slices.Equal(g.Domains, doms[i]) {
			continue
		}
		upd := *g
		upd.Domains = doms[i]
		if err := w.putGPU(g, &upd); err != nil {
			return err
		}
	}
	return w.setOutside(n.Name, outsideOf(gpus, doms))
}

// setOutside keeps a node's outsideOf on its node domain's row.
func (w *writer) setOutside(node string, out int) error {
	e, err := w.edit(DomainNode + ":" + node)
	if err != nil {
		return err
	}
	e.cur.outside = out
	return nil
}
