package collective

// A root model's memory kept from one job evaluation to the next. A
// placement decision evaluates tens of candidate placements, and each
// would otherwise allocate its node descriptions, group sub-models, views
// and rank lists anew: at 100k GPUs that was half of what a 64-GPU
// decision allocated, and the garbage collector's assists it caused were
// the decision's tail latency.

import (
	"sync"

	"github.com/toposched/toposched/internal/topology"
)

// scratch is what a root model hands out to its node descriptions and
// sub-models, by bump allocation (take), and takes back whole on recycle.
type scratch struct {
	infos  []nodeInfo
	views  []nodeView
	ptrs   []*nodeView
	subs   []model
	refs   []rankRef
	ints   []int
	floats []float64
	strs   []string
	order  []int32 // sub's nodes in order of first rank
}

// reset gives back everything taken; what pointed into it must be dead.
func (sc *scratch) reset() {
	sc.infos, sc.views, sc.ptrs, sc.subs = sc.infos[:0], sc.views[:0], sc.ptrs[:0], sc.subs[:0]
	sc.refs, sc.ints, sc.floats, sc.strs = sc.refs[:0], sc.ints[:0], sc.floats[:0], sc.strs[:0]
}

// take returns n zeroed elements from the end of *slab. When the slab has
// no room it starts a larger one: what was taken before stays where it
// is (so pointers into it stay valid), and the next evaluation reuses the
// larger slab alone.
func take[T any](slab *[]T, n int) []T {
	s := *slab
	if cap(s)-len(s) < n {
		s = make([]T, 0, max(2*cap(s), n, 16))
	}
	out := s[len(s) : len(s)+n : len(s)+n]
	clear(out)
	*slab = s[:len(s)+n]
	return out
}

// rootPool keeps recycled root models with their scratch, maps and link
// capacities (see recycle).
var rootPool sync.Pool

// newRoot returns an empty root model, a recycled one where the pool has
// one.
func newRoot(f *topology.Fabric, bw *topology.Bandwidths, cont Contention, hint int) *model {
	m, _ := rootPool.Get().(*model)
	if m == nil {
		m = &model{netLat: map[[2]int32]float64{}, index: map[*topology.Node]int32{}, sc: &scratch{}}
	}
	m.bw, m.fabric, m.contByNm, m.tuning = bw, f, cont, DefaultTuning
	if m.bw == nil {
		m.bw = defaultBandwidths
	}
	if cap(m.ranks) < hint {
		m.ranks = make([]rankRef, 0, hint)
	}
	return m
}

// defaultBandwidths is the models' bandwidths where a caller gives none;
// models only read it.
var defaultBandwidths = topology.DefaultBandwidths()

// recycle hands a root model, and the phases it released, back for the
// next evaluation: nothing may read the model, its sub-models or its
// phases after.
func (m *model) recycle() {
	for i, ph := range m.free {
		phasePool.Put(ph)
		m.free[i] = nil
	}
	clear(m.nodes)
	clear(m.index)
	clear(m.netLat)
	clear(m.leafNames)
	sc, ranks, nodes, names, up := m.sc, m.ranks[:0], m.nodes[:0], m.leafNames[:0], m.upGBps[:0]
	capv, known, local, free := m.capv[:0], m.capKnown[:0], m.localIdx[:0], m.free[:0]
	index, netLat := m.index, m.netLat
	sc.reset()
	*m = model{ranks: ranks, nodes: nodes, leafNames: names, upGBps: up, netLat: netLat, index: index,
		capv: capv, capKnown: known, localIdx: local, free: free, sc: sc}
	rootPool.Put(m)
}

// grown is s at length n, zeroed, reusing its array where it has room.
func grown[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	s = s[:n]
	clear(s)
	return s
}
