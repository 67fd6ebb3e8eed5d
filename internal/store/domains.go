package store

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	memdb "github.com/hashicorp/go-memdb"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/internal/topology"
)

// Domain kinds. A domain's ID is "<kind>:<name>".
//
// The first four are inside one node and computed by the store from the
// node's report and the health of its parts:
//
//	island:<node>/<k>  an NVLink island: a connected component of two or
//	                   more GPUs linked NV# or NVB in the node's effective
//	                   topology (every GPU of an NVSwitch node); k is the
//	                   index of its lowest GPU. A node without a GPU matrix,
//	                   or without NVLink, has none.
//	pcie:<node>/<k>    a PCIe switch group: a connected component of two or
//	                   more GPUs whose path is PIX or PXB; k as for islands.
//	                   The matrix gives the best path of a pair only, so
//	                   GPUs linked by NVLink show no PCIe group.
//	numa:<node>/<n>    the GPUs of NUMA node n, where the report says.
//	node:<node>        the node's GPUs.
//
// The fabric kinds (leaf, pod, core) come from UpsertFabric, as the
// topology.Fabric computes them; any other kind it gives is kept as given.
// DomainCluster, ID "cluster:", holds every GPU of every node.
const (
	DomainIsland  = "island"
	DomainPCIe    = "pcie"
	DomainNUMA    = "numa"
	DomainNode    = "node"
	DomainLeaf    = "leaf"
	DomainPod     = "pod"
	DomainCore    = "core"
	DomainCluster = "cluster"
)

// ClusterDomain is the ID of the domain that holds every GPU.
const ClusterDomain = DomainCluster + ":"

// Domain is a set of GPUs placement packs jobs into, with counts kept in
// the same write transaction as every change to its GPUs, so they always
// agree with the GPU rows of the same snapshot. A domain has a row while it
// has GPUs (Total > 0).
//
// Counted are the GPUs whose Domains name it: healthy or not, free or held,
// but not those of a removed node that a job still holds.
type Domain struct {
	ID   string
	Kind string
	// Node is the node of a domain inside one node (island, pcie, numa,
	// node), "" for the others.
	Node string
	// Position is that node's Position (enumeration order), 0 for the
	// domains that are not inside one node.
	Position int
	// Total counts the domain's GPUs, Healthy the healthy ones among them,
	// Free the healthy ones held by no job.
	Total, Healthy, Free int
	// Models splits the counts by GPU model, sorted by model. Shared: do
	// not modify.
	Models []ModelCount

	// A node domain's row also points at its node's row and lists the
	// node's free GPUs (of those whose Domains name it: every GPU of the
	// live node), by index, as of the same transaction: EachNodeFree reads
	// them instead of walking the GPUs. The writer keeps them; the copies
	// Snapshot hands out leave them out (public).
	node *Node
	free []FreeGPU
}

// FreeGPU is what placement reads of a free GPU, kept in its node's domain
// row: its key, model and domains. Domains is the GPU row's, shared.
type FreeGPU struct {
	Node    string
	Index   int
	Model   string
	Domains []string
}

// Key returns the GPU's key.
func (g FreeGPU) Key() GPUKey { return GPUKey{Node: g.Node, Index: g.Index} }

// public returns a copy of a domain row without the writer's additions.
func (d *Domain) public() Domain {
	c := *d
	c.node, c.free = nil, nil
	return c
}

// ModelCount is a domain's count of one GPU model.
type ModelCount struct {
	Model                string
	Total, Healthy, Free int
}

// Count returns the domain's counts for one model; "" is any model.
func (d Domain) Count(model string) ModelCount {
	if model == "" {
		return ModelCount{Total: d.Total, Healthy: d.Healthy, Free: d.Free}
	}
	if i, ok := slices.BinarySearchFunc(d.Models, model, compareModel); ok {
		return d.Models[i]
	}
	return ModelCount{Model: model}
}

// FreeOf returns the number of free GPUs of a model ("" for any) in the
// domain.
func (d Domain) FreeOf(model string) int { return d.Count(model).Free }

// FreeByModel returns the free GPUs of the domain by model, models with
// none left out. It builds the map: prefer FreeOf in a loop.
func (d Domain) FreeByModel() map[string]int {
	out := make(map[string]int, len(d.Models))
	for _, m := range d.Models {
		if m.Free > 0 {
			out[m.Model] = m.Free
		}
	}
	return out
}

func compareModel(m ModelCount, model string) int { return strings.Compare(m.Model, model) }

// DomainKind returns the kind of a domain ID, the text before its colon.
func DomainKind(id string) string {
	k, _, _ := strings.Cut(id, ":")
	return k
}

// nodeLocalKind reports whether domains of kind lie inside one node. Their
// GPUs are found through the node index, so the free-domain index leaves
// them out.
func nodeLocalKind(kind string) bool {
	switch kind {
	case DomainIsland, DomainPCIe, DomainNUMA, DomainNode:
		return true
	}
	return false
}

// indexedKind reports whether the free-domain index lists domains of kind:
// leaves, pods, any other fabric kind, and the cluster. Node-local domains
// are reached through the node index; core domains usually hold (nearly)
// the whole cluster, and a node under several cores would pay an entry per
// core, so they are a filtered walk of the cluster's entries instead.
func indexedKind(kind string) bool { return !nodeLocalKind(kind) && kind != DomainCore }

// reservedKind reports whether the store computes domains of kind itself,
// so UpsertFabric may not give them.
func reservedKind(kind string) bool { return nodeLocalKind(kind) || kind == DomainCluster }

// domainNode returns the node of a node-local domain ID ("" otherwise):
// "node:<node>", or "<kind>:<node>/<k>" where k has no slash.
func domainNode(id string) string {
	kind, rest, _ := strings.Cut(id, ":")
	switch {
	case kind == DomainNode:
		return rest
	case nodeLocalKind(kind):
		if i := strings.LastIndexByte(rest, '/'); i >= 0 {
			return rest[:i]
		}
	}
	return ""
}

// nodeDomains computes the Domains of a node's GPU rows, aligned with gpus.
// n.Effective is the topology the islands and PCIe groups come from;
// fabric lists the node's fabric domains. GPUs with the same domains share
// one slice.
func nodeDomains(n *Node, gpus []*GPU, fabric []string) [][]string {
	wide := make([]string, 0, len(fabric)+2)
	wide = append(wide, DomainNode+":"+n.Name)
	wide = append(wide, fabric...)
	wide = append(wide, ClusterDomain)

	// GPU index -> island and PCIe group.
	local := map[int][]string{}
	if t := n.Effective; t != nil && t.GPUPaths != nil {
		groups := func(kind string, linked func(topology.Link) bool) {
			for _, comp := range components(t, linked) {
				low := t.GPUs[comp[0]].Index
				for _, p := range comp {
					low = min(low, t.GPUs[p].Index)
				}
				id := kind + ":" + n.Name + "/" + strconv.Itoa(low)
				for _, p := range comp {
					idx := t.GPUs[p].Index
					local[idx] = append(local[idx], id)
				}
			}
		}
		groups(DomainIsland, func(l topology.Link) bool { return l.Class.NVLink() })
		groups(DomainPCIe, func(l topology.Link) bool { return l.Class == topology.PIX || l.Class == topology.PXB })
	}

	numaIDs := map[int]string{}
	shared := map[string][]string{}
	out := make([][]string, len(gpus))
	for i, g := range gpus {
		if g.HealthReason == ReasonMissing {
			out[i] = wide
			continue
		}
		var own []string
		own = append(own, local[g.Index]...)
		if g.NUMA >= 0 {
			id, ok := numaIDs[g.NUMA]
			if !ok {
				id = DomainNUMA + ":" + n.Name + "/" + strconv.Itoa(g.NUMA)
				numaIDs[g.NUMA] = id
			}
			own = append(own, id)
		}
		key := strings.Join(own, "\x00")
		ds, ok := shared[key]
		if !ok {
			ds = make([]string, 0, len(own)+len(wide))
			ds = append(append(ds, own...), wide...)
			shared[key] = ds
		}
		out[i] = ds
	}
	return out
}

// components returns the connected components of two or more GPUs (by
// position) of t under linked, each sorted, in order of their first GPU.
func components(t *topology.Node, linked func(topology.Link) bool) [][]int {
	n := len(t.GPUPaths)
	parent := make([]int, n)
	for i := range parent {
		parent[i] = i
	}
	find := func(i int) int {
		for parent[i] != i {
			parent[i] = parent[parent[i]]
			i = parent[i]
		}
		return i
	}
	for i, row := range t.GPUPaths {
		for j := i + 1; j < len(row) && j < n; j++ {
			if linked(row[j]) {
				if a, b := find(i), find(j); a != b {
					parent[max(a, b)] = min(a, b)
				}
			}
		}
	}
	byRoot := map[int][]int{}
	var roots []int
	for i := range n {
		r := find(i)
		if _, ok := byRoot[r]; !ok {
			roots = append(roots, r)
		}
		byRoot[r] = append(byRoot[r], i)
	}
	var out [][]int
	for _, r := range roots {
		if len(byRoot[r]) >= 2 {
			out = append(out, byRoot[r])
		}
	}
	return out
}

// writer is one write transaction. It keeps the domain rows in step with
// the GPU rows: every GPU row goes through putGPU, which adjusts the counts
// of the domains it leaves and joins on copies held until flush, so a
// domain is written once per transaction however many of its GPUs change.
type writer struct {
	txn        *memdb.Txn
	domains    map[string]*domainEdit
	nodeCounts map[string]*nodeCountsEdit // by model, "" for any
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
// and adjusts the domain counts. An upd equal to old writes nothing, which
// keeps the watch channels quiet on a report that changed nothing.
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
func (w *writer) flush() error {
	for _, id := range slices.Sorted(maps.Keys(w.domains)) {
		e := w.domains[id]
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
		switch {
		case e.cur.Total == 0:
			if e.old != nil {
				if err := w.txn.Delete(TableDomains, e.old); err != nil {
					return err
				}
			}
		case e.old == nil || !domainEqual(e.old, e.cur) || e.dirty:
			if len(e.cur.free) == 0 {
				e.cur.free = nil
			}
			if len(e.cur.Models) == 0 {
				e.cur.Models = nil
			}
			if err := w.txn.Insert(TableDomains, e.cur); err != nil {
				return err
			}
		}
	}
	w.domains = nil
	return w.flushNodeCounts()
}

func domainEqual(a, b *Domain) bool {
	return a.ID == b.ID && a.Kind == b.Kind && a.Node == b.Node && a.Position == b.Position && a.Total == b.Total &&
		a.Healthy == b.Healthy && a.Free == b.Free && slices.Equal(a.Models, b.Models)
}

func gpuEqual(a, b *GPU) bool {
	return a.Node == b.Node && a.Index == b.Index && a.UUID == b.UUID && a.Model == b.Model &&
		a.MemoryMiB == b.MemoryMiB && a.Healthy == b.Healthy && a.HealthReason == b.HealthReason &&
		a.JobID == b.JobID && a.NodePosition == b.NodePosition && a.NUMA == b.NUMA &&
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
	return nil
}

// fabricOf returns the fabric domains of a node, nil when it has none.
func fabricOf(txn *memdb.Txn, node string) ([]string, error) {
	raw, err := txn.First(TableFabric, IndexID, node)
	if err != nil || raw == nil {
		return nil, err
	}
	return raw.(*fabricEntry).Domains, nil
}

// fabricEntry is a row of TableFabric: the fabric domains of one node,
// kept whether the node is known yet or not, so that a node reported after
// the fabric gets them.
type fabricEntry struct {
	Node    string
	Domains []string
}

// UpsertFabric sets the fabric domains of every node in one transaction:
// domainsByNode maps a node's name to its domains, as topology.Fabric's
// Domains computes them ("leaf:<name>", "pod:<name>", "core:<name>"). The
// map is the whole fabric: a node it does not list has no fabric domains
// afterwards. Nodes not reported yet keep theirs until they are. A domain
// must read "<kind>:<name>" with a kind the store does not compute itself
// (not island, pcie, numa, node or cluster); duplicates are dropped, the
// order is kept (it is the order of GPU.Domains).
func (s *Store) UpsertFabric(domainsByNode map[string][]string) error {
	intern := map[string]string{}
	want := make(map[string][]string, len(domainsByNode))
	var errs []error
	for _, node := range slices.Sorted(maps.Keys(domainsByNode)) {
		if node == "" {
			errs = append(errs, errors.New("a node without a name"))
			continue
		}
		var ds []string
		for _, d := range domainsByNode[node] {
			kind, name, ok := strings.Cut(d, ":")
			switch {
			case !ok || kind == "" || name == "":
				errs = append(errs, fmt.Errorf("node %q: domain %q: want <kind>:<name>", node, d))
				continue
			case reservedKind(kind):
				errs = append(errs, fmt.Errorf("node %q: domain %q: kind %s is the store's own", node, d, kind))
				continue
			case strings.ContainsRune(d, 0):
				errs = append(errs, fmt.Errorf("node %q: domain %q contains NUL", node, d))
				continue
			}
			if v, ok := intern[d]; ok {
				d = v
			} else {
				intern[d] = d
			}
			if !slices.Contains(ds, d) {
				ds = append(ds, d)
			}
		}
		if len(ds) > 0 {
			want[node] = ds
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("store: fabric: %w", err)
	}
	return s.write(func(w *writer) error {
		var nodes []string
		have := map[string][]string{}
		it, err := w.txn.Get(TableFabric, IndexID)
		if err != nil {
			return err
		}
		for raw := it.Next(); raw != nil; raw = it.Next() {
			f := raw.(*fabricEntry)
			have[f.Node] = f.Domains
			if _, ok := want[f.Node]; !ok {
				nodes = append(nodes, f.Node)
			}
		}
		nodes = append(nodes, slices.Collect(maps.Keys(want))...)
		slices.Sort(nodes)
		for _, node := range nodes {
			ds := want[node]
			if slices.Equal(have[node], ds) {
				continue
			}
			if ds == nil {
				if _, err := w.txn.DeleteAll(TableFabric, IndexID, node); err != nil {
					return err
				}
			} else if err := w.txn.Insert(TableFabric, &fabricEntry{Node: node, Domains: ds}); err != nil {
				return err
			}
			raw, err := w.txn.First(TableNodes, IndexID, node)
			if err != nil {
				return err
			}
			if raw != nil {
				if err := w.redomain(raw.(*Node)); err != nil {
					return err
				}
			}
		}
		return nil
	})
}

// freeDomainIndexer is the indexer of IndexDomain: for each free GPU, one
// key per indexed domain it belongs to (indexedKind: leaves, pods, the
// cluster), reading
//
//	<domain> NUL <model> NUL <node position, 8 bytes big-endian, sign flipped>
//
// to which memdb appends the primary key (node name, NUL, index). A walk of
// the prefix "<domain> NUL" yields the domain's free GPUs by model, then
// node position, node name and index; of "<domain> NUL <model> NUL", those
// of one model in that order. Held and unhealthy GPUs have no key, so the
// index shrinks as the cluster fills and its watch channels fire only on
// changes to the free set. Node-local and core domains are left out (see
// indexedKind): each would cost another ~450 B per free GPU.
type freeDomainIndexer struct{}

func (freeDomainIndexer) FromObject(obj any) (bool, [][]byte, error) {
	g, ok := obj.(*GPU)
	if !ok {
		return false, nil, fmt.Errorf("store: domain index: unexpected %T", obj)
	}
	if !g.Free() {
		return false, nil, nil
	}
	var vals [][]byte
	for _, d := range g.Domains {
		if !indexedKind(DomainKind(d)) {
			continue
		}
		// Room for what memdb appends (node, NUL, 8-byte index), so its
		// append does not copy.
		key := make([]byte, 0, len(d)+len(g.Model)+2+8+len(g.Node)+1+8)
		key = append(key, d...)
		key = append(key, 0)
		key = append(key, g.Model...)
		key = append(key, 0)
		key = binary.BigEndian.AppendUint64(key, uint64(int64(g.NodePosition))^(1<<63))
		vals = append(vals, key)
	}
	if vals == nil {
		return false, nil, nil
	}
	return true, vals, nil
}

// FromArgs takes a domain ID and optionally a model: the prefix to walk.
func (freeDomainIndexer) FromArgs(args ...any) ([]byte, error) {
	if len(args) < 1 || len(args) > 2 {
		return nil, fmt.Errorf("store: domain index: want a domain and optionally a model, got %d arguments", len(args))
	}
	var key []byte
	for _, a := range args {
		s, ok := a.(string)
		if !ok {
			return nil, fmt.Errorf("store: domain index: argument %#v is not a string", a)
		}
		key = append(append(key, s...), 0)
	}
	return key, nil
}

// compareGPUs orders GPUs by node position, node name, then index: the
// enumeration order.
func compareGPUs(a, b GPU) int {
	return cmp.Or(cmp.Compare(a.NodePosition, b.NodePosition), strings.Compare(a.Node, b.Node), cmp.Compare(a.Index, b.Index))
}

// ApplyFabric builds the switch tree of a topology.fabric report and
// records every listed node's leaf, pod and core as domains of its GPUs,
// returning the tree. A tree that does not hold together changes nothing.
func (s *Store) ApplyFabric(ev events.TopologyFabric) (*topology.Fabric, error) {
	f, err := topology.NewFabric(ev)
	if err != nil {
		return nil, fmt.Errorf("fabric %s: %w", ev.Cluster, err)
	}
	domains := map[string][]string{}
	for _, sw := range ev.Switches {
		for _, n := range sw.Nodes {
			domains[n] = f.Domains(n)
		}
	}
	if err := s.UpsertFabric(domains); err != nil {
		return nil, fmt.Errorf("fabric %s: %w", ev.Cluster, err)
	}
	return f, nil
}
