package store

// Domains: their kinds, the Domain rows and their counts, the domains a
// node's GPUs are in (nodeDomains), and the free-domain index over them.
// The writer (writer.go) keeps the rows in step with the GPU rows; the
// fabric domains come from fabric.go.

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"

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
	// outside is, on a node domain's row, the most GPUs of the node
	// outside one GPU's smallest node-local domain (outsideOf).
	outside int
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
// GPUs are found by a walk of the GPU table's primary key by node, so the
// free-domain index leaves them out.
func nodeLocalKind(kind string) bool {
	switch kind {
	case DomainIsland, DomainPCIe, DomainNUMA, DomainNode:
		return true
	}
	return false
}

// indexedKind reports whether the free-domain index lists domains of kind:
// leaves, pods, any other fabric kind, and the cluster. Node-local domains
// are reached by node (the primary key's walk); core domains usually hold (nearly)
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

// outsideOf is, over a node's GPUs and their Domains (as nodeDomains
// gives them), the most GPUs of the node outside one GPU's smallest
// node-local domain: its island, else its PCIe group, else its NUMA node;
// a GPU in none of them has none outside. GPUs its report no longer lists
// (ReasonMissing) are left out: they are never free again. On such a node,
// the free GPUs of the smallest domain of any free GPU (what a one-GPU
// placement leaves as a hole there) are at least the node's free GPUs less
// this: 0 on an NVSwitch node, whose one island holds every GPU.
func outsideOf(gpus []*GPU, doms [][]string) int {
	size, n := map[string]int{}, 0
	for i, ds := range doms {
		if gpus[i].HealthReason == ReasonMissing {
			continue
		}
		n++
		for _, d := range ds {
			if LocalLevel(d) < 3 {
				size[d]++
			}
		}
	}
	out := 0
	for i, ds := range doms {
		if gpus[i].HealthReason == ReasonMissing {
			continue
		}
		best, level := "", 3
		for _, d := range ds {
			if l := LocalLevel(d); l < level {
				best, level = d, l
			}
		}
		if best != "" {
			out = max(out, n-size[best])
		}
	}
	return out
}

// LocalLevel orders domain IDs by the node-local domain they name,
// smallest first: island 0, PCIe group 1, NUMA node 2, anything else
// (the node, a fabric domain, the cluster) 3. Placement ranks a GPU's
// domains by it, and the store's MaxOutside is counted by it.
func LocalLevel(id string) int {
	switch {
	case strings.HasPrefix(id, DomainIsland+":"):
		return 0
	case strings.HasPrefix(id, DomainPCIe+":"):
		return 1
	case strings.HasPrefix(id, DomainNUMA+":"):
		return 2
	}
	return 3
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

// freeDomainIndexer is the indexer of IndexDomain: for each free GPU, one
// key per indexed domain it belongs to (indexedKind: leaves, pods, the
// cluster), reading
//
//	<domain> NUL <model> NUL <node position (appendPosition)>
//
// to which memdb appends the primary key (node name, NUL, index). A walk of
// the prefix "<domain> NUL" yields the domain's free GPUs by model, then
// node position, node name and index; of "<domain> NUL <model> NUL", those
// of one model in that order. Held and unhealthy GPUs have no key, so the
// index shrinks as the cluster fills. Node-local and core domains are left
// out (see indexedKind): each would cost another ~450 B per free GPU.
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
		key := make([]byte, 0, len(d)+len(g.Model)+2+positionKeyLen+len(g.Node)+1+8)
		key = append(key, d...)
		key = append(key, 0)
		key = append(key, g.Model...)
		key = append(key, 0)
		key = appendPosition(key, g.NodePosition)
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
