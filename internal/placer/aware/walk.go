package aware

// Stage 1, the walk (walkStage): the nodes with free GPUs of the job's
// model that the Filter accepts, read as little as the choice allows: a
// job one node can hold walks the best-fitting nodes only (walkFit,
// bestFitSingle); a job no node holds, a few leaves' or pods' nodes on a
// large cluster (scoped), else every node (candidates). In: the request;
// out: walked, or the Wait a Filter that leaves too few earns.
//
// Flow (place.go): walk → single-node exact choice → multi-node →
// judge → local search; see internal/placer/README.md.

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/internal/placer/engine"
	"github.com/toposched/toposched/internal/placer/outcome"
	"github.com/toposched/toposched/internal/store"
)

// walked is the candidate walk's answer: the nodes the later stages read,
// and the cluster walk they may still ask for (full).
type walked struct {
	snap  *store.Snapshot
	model string
	x     *engine.Explain
	// filter is Options.Filter as the walks after the first ask it: of
	// no node twice (the filter counts the nodes it denies).
	filter func(engine.NodeView) bool
	// fit holds the nodes that hold a job one node can hold, best fit
	// first (bestFitSingle); nil when no node holds it.
	fit []*candNode
	// longer walks the nodes again to maxJudged, for a one-GPU job whose
	// first walk kept only the favourite's few; nil otherwise.
	longer func() []*candNode
	// sets are the few leaves' or pods' nodes a job no node holds reads
	// on a large cluster (scoped); nil: the cluster's.
	sets []scopeSet
	// cands are the nodes read for a job no node holds (the sets', or
	// the cluster walk's once full ran), total their free GPUs.
	cands    []*candNode
	total    int
	fullDone bool
}

// walkStage is the candidate walk: for a job one node can hold, the
// best-fitting nodes only (walkFit); for a job no node holds, the nodes
// of a few fabric domains on a large cluster (scoped), else every node.
// It answers a Wait instead when the Filter leaves too few GPUs.
func walkStage(snap *store.Snapshot, job events.JobAnalyzed, opts engine.Options, k knobs) (*walked, *outcome.Result) {
	n, gpn, model := job.Job.GPUs, job.Job.GPUsPerNode, job.Job.GPUModel
	w := &walked{snap: snap, model: model, x: opts.Explain, filter: opts.Filter}
	if (gpn == 0 || gpn == n) && snap.NodeCounts(model).FreeAtLeast(n) > 0 {
		w.walkFit(n, opts, k, modelWalk(snap, job, opts, k))
	}
	if len(w.fit) > 0 {
		return w, nil
	}
	// On a large cluster, a job no node holds reads the nodes of a few
	// leaves or pods that hold it (scoped), the cluster's only when none
	// does.
	if sn := scopeNodes(opts); sn >= 0 && snap.NodeCounts(model).FreeAtLeast(1) > sn {
		w.sets = scoped(snap, job, model, w.filter, n, gpn)
	}
	if w.sets != nil {
		for _, set := range w.sets {
			w.cands = append(w.cands, set.cands...)
			for _, c := range set.cands {
				w.total += len(c.free)
			}
		}
		if w.x != nil {
			w.x.Explanation.NodesConsidered = len(w.cands)
		}
		return w, nil
	}
	w.full()
	if wait, ok := filterWait(w.cands, w.total, n, gpn, model); ok {
		return nil, &wait
	}
	return w, nil
}

// modelWalk reports whether a one-GPU job's walk goes on to oneGPULimit
// nodes: where compute is weighed by model the best fits may all be of
// slow models, and fastEnoughFirst needs the fast ones among its picks.
// Where the free GPUs are all of one model (or the job pins one), or the
// job's compute is not known, fastEnoughFirst leaves the picks in their
// order, so the walk is the compute-blind one: half a millisecond less
// on a 10k-GPU cluster of one model (BENCHMARKS.md).
func modelWalk(snap *store.Snapshot, job events.JobAnalyzed, opts engine.Options, k knobs) bool {
	if opts.ComputeReference == "" {
		return false
	}
	if k.everyModelWalk {
		return true
	}
	known := StepCompute(job.Job) > 0 || len(job.Job.StepComputeSecondsByModel) > 0
	return known && job.Job.GPUModel == "" && !snap.OneModelFree(1)
}

// walkFit walks the best-fitting nodes of a job one node can hold (see
// bestFitSingle): they are walked and filtered first, and the whole
// cluster only when no node holds the job, or a Judge asks for more.
func (w *walked) walkFit(n int, opts engine.Options, k knobs, everyModel bool) {
	var seen map[string]bool
	var holesOf func(*candNode) int
	walker := &placer{opts: opts, knobs: k} // pick's scratch, and limit
	enough := max(walker.limit(), maxJudged)
	if n == 1 && !k.eagerOneGPU {
		// The judge reads one candidate when the favourite passes, as it
		// mostly does, and up to maxJudged when it does not: the walk
		// keeps the first limit() nodes, which it finds exactly as the
		// longer walk does (bestFitSingle), and is walked again to
		// maxJudged only for a favourite the judge does not pass
		// (singleStage). A tenth of a one-GPU decision's CPU was the
		// longer walk's (BENCHMARKS.md).
		enough = walker.limit()
	}
	if n == 1 {
		holesOf = walker.holesOne
		if everyModel {
			enough = oneGPULimit
		}
	}
	w.fit, seen = bestFitSingle(w.snap, w.model, opts.Filter, n, enough, holesOf)
	if w.x != nil {
		w.x.Explanation.NodesConsidered = w.snap.NodeCounts(w.model).FreeAtLeast(1)
	}
	if f := opts.Filter; f != nil {
		// The cluster walk, and the longer walk, if they come, ask no
		// node twice.
		w.filter = func(v engine.NodeView) bool {
			if ok, asked := seen[v.Node.Name]; asked {
				return ok
			}
			return f(v)
		}
	}
	if enough < maxJudged {
		w.longer = func() []*candNode {
			longer, asked := bestFitSingle(w.snap, w.model, w.filter, n, max(walker.limit(), maxJudged), holesOf)
			for name, ok := range asked {
				if seen == nil {
					seen = map[string]bool{}
				}
				seen[name] = ok
			}
			return longer
		}
	}
}

// full is every node the Filter allows, walked once, at the first ask.
func (w *walked) full() []*candNode {
	if !w.fullDone {
		var considered int
		w.cands, w.total, considered = candidates(w.snap, w.model, w.filter)
		w.fullDone = true
		if w.x != nil {
			w.x.Explanation.NodesConsidered = considered
		}
	}
	return w.cands
}

// candNode is a node with free GPUs the job may use.
type candNode struct {
	node   *store.Node     // the store's row: do not modify
	free   []store.FreeGPU // free GPUs of the model, by index; the store's: do not modify
	fabric []string        // fabric domains, smallest first
	offer  int             // GPUs it offers a multi-node placement
	// one is the one-GPU pick of the node, where the walk worked it out
	// (bestFitSingle's holesOf), for singleNode not to do it twice.
	one *inNode
	// twin is the first node the walk kept of this one's twin class, the
	// node itself for that first one, nil where the walk did not tell
	// twins apart: pick works a subset out once per class. picked is a
	// first node's last pick of more than one GPU (one's is one).
	twin   *candNode
	picked *twinPick
}

// twinPick is a pick kept for the twins of the node it was made on.
type twinPick struct {
	k  int
	in inNode
}

// bestFitSingle walks the nodes with at least k free GPUs of the model in
// best-fit order (fewest free first, then enumeration order) and returns
// those the filter accepts, up to where the walk can stop without changing
// singleNode's choice: singleNode ranks nodes by level (the smallest
// node-local domain with k free GPUs: island, PCIe group, NUMA node, node)
// then fit, and keeps the first singleLimit (oneGPULimit for one GPU, where
// every node is of level 0). Once that many accepted nodes of level 0 are
// seen, no node further on (same or worse fit, later on ties) can rank
// among them. A one-GPU job stops sooner: singleNode ranks its nodes by
// holes (holesOf: the free GPUs of the picked GPU's smallest node-local
// domain), then fit. A node with f free GPUs of the model takes at least
// f - store.NodeCounts.MaxOutside() holes, and at least one, and the nodes
// further on have as many free GPUs or more; so once enough kept nodes
// (as many as the judge ever reads) take no more holes than that floor,
// no node further on can rank among them. On a cluster of NVSwitch nodes
// the floor is f itself: the walk stops after enough nodes of the fewest
// free GPUs. seen records the filter's answer per node walked.
//
// The walk also stops once all it has left are twins it would pass over:
// in the last free count of the model, when no node has more GPUs of it
// (so every node left has all of them free), and enough nodes of every
// kind of such node (store.NodeCounts.Whole) are kept. On a cluster of few
// node kinds, mostly empty, that is most of the walk.
func bestFitSingle(snap *store.Snapshot, model string, filter func(engine.NodeView) bool, k int, enough int, holesOf func(*candNode) int) (out []*candNode, seen map[string]bool) {
	out, seen, _ = bestFitWalk(snap, model, filter, k, enough, holesOf, true)
	return out, seen
}

// bestFitWalk is bestFitSingle, and how many nodes it read; stopWhole
// false walks the twins left to the end, as the tests' reference.
func bestFitWalk(snap *store.Snapshot, model string, filter func(engine.NodeView) bool, k int, enough int, holesOf func(*candNode) int, stopWhole bool) (out []*candNode, seen map[string]bool, read int) {
	w := &fitWalk{filter: filter, k: k, enough: enough, holesOf: holesOf, limit: singleLimit}
	if k == 1 {
		w.limit = oneGPULimit
	}
	slabSize := w.limit
	if k == 1 && holesOf != nil {
		slabSize = min(w.limit, 2*enough) // most walks stop by then
	}
	w.slabSize = slabSize
	w.slab = make([]candNode, 0, slabSize)
	// Candidates rank by what their links and free GPUs make of them
	// (for one GPU holes, then fit; for more, level, bandwidth, holes,
	// fit), then order: a node that placement cannot tell from enough
	// earlier ones (its twins: the same links and free GPUs) ranks after
	// them all, where nothing reads it, so it is counted (as its class's
	// level) and not kept. On a cluster of identical nodes the walk keeps
	// enough nodes, not oneGPULimit or singleLimit, and a walk past nodes
	// of no level-0 domain (a PCIe server, for a job no PCIe switch
	// holds) does no more than compare each with the kept ones.
	//
	// A twin is passed over before the filter is asked of it: were it
	// allowed, it would rank after its kept twins all the same. The
	// filter's own count of denied nodes then leaves it out, as it leaves
	// out the nodes after the walk's end.
	nc := snap.NodeCounts(model)
	// last is the walk's last free count when every node there has all
	// its GPUs of the model free, 0 otherwise.
	last := 0
	if stopWhole && len(nc.Free) > 1 && len(nc.Free) == len(nc.Total) {
		last = len(nc.Free) - 1
	}
	w.maxOut = nc.MaxOutside()
	lastF := 0
	for node, free := range snap.EachNodeFreeByFit(model, k) {
		if len(free) > lastF && w.byHoles != nil && w.settled(len(free)) {
			break
		}
		lastF = len(free)
		read++
		twin := -1
		if enough > 0 {
			twin = slices.IndexFunc(w.classes, func(tc twinClass) bool { return tc.of(node, free) })
			if twin >= 0 && w.classes[twin].n >= enough {
				if len(free) == last && wholeKindsKept(w.classes, nc.Whole, last, enough) {
					break // every node left is a twin passed over
				}
				// Counted, and passed over before its fabric is listed.
				if w.classes[twin].level == 0 {
					if w.level0++; w.level0 >= w.limit {
						break
					}
				}
				continue
			}
		}
		if w.keep(node, free, twin) {
			break
		}
	}
	return w.out, w.seen, read
}

// fitWalk is one bestFitWalk's state.
type fitWalk struct {
	filter   func(engine.NodeView) bool
	k        int
	enough   int
	holesOf  func(*candNode) int
	limit    int // singleLimit, or oneGPULimit for one GPU
	counts   []domainCount
	slab     []candNode
	slabSize int
	// level0 counts the nodes seen (kept, or passed over as twins) that
	// a node-local domain of level 0 holds the job on.
	level0  int
	classes []twinClass
	// byHoles counts the kept nodes of a one-GPU job by the holes their
	// pick takes; settled says whether enough of them take no more than
	// any node with f free GPUs or more can.
	byHoles []int
	maxOut  int
	out     []*candNode
	seen    map[string]bool
}

func (w *fitWalk) settled(f int) bool {
	n := 0
	for h := 1; h < len(w.byHoles) && h <= max(1, f-w.maxOut); h++ {
		n += w.byHoles[h]
	}
	return n >= w.enough
}

// keep asks the filter of a node that is not a twin passed over (twin:
// its class among w.classes, -1 for none), keeps it, and reports whether
// the walk ends there.
func (w *fitWalk) keep(node *store.Node, free []store.FreeGPU, twin int) bool {
	fabric := engine.FabricDomains(free[0].Domains)
	if w.filter != nil {
		ok := w.filter(engine.NodeView{Node: *node, Free: len(free), Fabric: fabric})
		if w.seen == nil {
			w.seen = map[string]bool{}
		}
		w.seen[node.Name] = ok
		if !ok {
			return false
		}
	}
	if len(w.slab) == cap(w.slab) {
		w.slab = make([]candNode, 0, w.slabSize) // never cut pointers into slab
	}
	w.slab = append(w.slab, candNode{node: node, free: free, fabric: fabric})
	c := &w.slab[len(w.slab)-1]
	w.out = append(w.out, c)
	switch {
	case w.enough == 0:
	case twin < 0:
		c.twin = c
	case hasPaths(node):
		// (Without paths, pick reads a topology of the GPU rows,
		// which Node.Links does not digest.)
		c.twin = w.classes[twin].head
	}
	level := 0 // one GPU fits the smallest domain
	if w.k == 1 {
		if w.holesOf != nil {
			if h := w.holesOf(c); h > 0 {
				for len(w.byHoles) <= h {
					w.byHoles = append(w.byHoles, 0)
				}
				if w.byHoles[h]++; w.settled(len(free)) {
					return true
				}
			}
		}
	} else {
		level = 1
		w.counts = countLocal(w.counts, free)
		for _, dc := range w.counts {
			if dc.free >= w.k && store.LocalLevel(dc.id) == 0 {
				level = 0
				break
			}
		}
	}
	if w.enough > 0 {
		if twin < 0 {
			w.classes = append(w.classes, twinClass{head: c, level: level})
			twin = len(w.classes) - 1
		}
		w.classes[twin].n++
	}
	if level == 0 {
		w.level0++
	}
	return w.level0 >= w.limit
}

// twinClass is the nodes a walk cannot tell apart, by its first member
// (head, the first kept): the same model, links and free GPUs. n counts
// those kept; level is 0 when a node-local domain of level 0 holds the
// job, 1 otherwise (how the walk counts towards its end).
type twinClass struct {
	head  *candNode
	n     int
	level int
}

func (tc *twinClass) of(node *store.Node, free []store.FreeGPU) bool {
	return store.Alike(tc.head.node, tc.head.free, node, free)
}

// wholeKindsKept reports whether classes keep enough nodes of every kind
// of wholly free node with c free GPUs.
func wholeKindsKept(classes []twinClass, kinds []store.WholeKind, c, enough int) bool {
	for _, k := range kinds {
		if len(k.GPUs) != c {
			continue
		}
		if !slices.ContainsFunc(classes, func(tc twinClass) bool { return tc.n >= enough && tc.of(k.Node, k.GPUs) }) {
			return false
		}
	}
	return true
}

// candidates collects the nodes with free GPUs of the job's model that the
// filter accepts. considered counts the nodes with such GPUs before the
// filter.
//
// It reads the store's nodes with free GPUs of the model
// (EachNodeFree): one index step per node with room and no GPU rows; the
// free lists are the store's own, and the candNodes come from one slab
// sized from the store's counts, so a decision allocates a handful of
// objects, not a few per node.
func candidates(snap *store.Snapshot, model string, filter func(engine.NodeView) bool) (out []*candNode, total, considered int) {
	nodes := snap.NodeCounts(model).FreeAtLeast(1)
	if nodes == 0 {
		return nil, 0, 0
	}
	slab := make([]candNode, 0, nodes)
	out = make([]*candNode, 0, nodes)
	for node, free := range snap.EachNodeFree(model) {
		considered++
		fabric := engine.FabricDomains(free[0].Domains)
		if filter != nil && !filter(engine.NodeView{Node: *node, Free: len(free), Fabric: fabric}) {
			continue
		}
		if len(slab) == cap(slab) {
			slab = make([]candNode, 0, 16) // counts and walk disagree: never cut pointers into slab
		}
		slab = append(slab, candNode{node: node, free: free, fabric: fabric})
		total += len(free)
		out = append(out, &slab[len(slab)-1])
	}
	return out, total, considered
}

// scopeSet is one domain's candidates for a job no node holds.
type scopeSet struct {
	dom   string
	cands []*candNode
}

// scoped collects the candidates of a job no node holds from the nodes of
// a few fabric domains instead of the whole cluster. multiNode spreads
// such a job over the smallest level (leaf, pod, cluster) with a domain
// whose nodes offer it in whole groups of its unit (TP, keeping each
// group on one node), else in single GPUs; scoped finds that level's
// domains from the store's free counts per leaf and pod: those holding n
// free GPUs of the model, fewest free first, then by name, are walked,
// and those whose nodes (the filter's) offer the job as multiNode will
// spread it are kept, up to scopeDomains of them and at most two whose
// free GPUs are mostly of one model, so that a cluster of several kinds
// of node offers each kind. The caller spreads the job in each and keeps
// the fastest by the cost model. A 64-GPU job on 100k GPUs reads a few
// pods' nodes, not 12,500.
//
// Nil when the job needs the cluster level (no leaf or pod holds it as
// it will be spread) or scopeWalk nodes were read without finding a
// domain: the caller walks the whole cluster.
func scoped(snap *store.Snapshot, job events.JobAnalyzed, model string, filter func(engine.NodeView) bool, n, gpn int) []scopeSet {
	unit := 1
	if gpn == 0 {
		unit = engine.Unit(job, n)
	}
	// Whole groups are spread if any domain, the cluster included, offers
	// them; the cluster's offer (before the filter) comes from the store's
	// count of nodes by free GPUs.
	if unit > 1 {
		counts, whole := snap.NodeCounts(model), 0
		for c, nodes := range counts.Free {
			whole += nodes * (c / unit * unit)
		}
		if whole < n {
			unit = 1
		}
	}
	offers := func(cands []*candNode) int {
		sum := 0
		for _, c := range cands {
			switch {
			case gpn > 0 && len(c.free) >= gpn:
				sum += gpn
			case gpn == 0:
				sum += len(c.free) / unit * unit
			}
		}
		return sum
	}
	walked := 0
	for _, kind := range []string{store.DomainLeaf, store.DomainPod} {
		// A leaf or pod that holds the job, as little as is read of it:
		// every one of 3,125 leaves at 100k GPUs may.
		type fitting struct {
			id     string
			models []store.ModelCount // the store's
			free   int
		}
		var doms []fitting
		for d := range snap.EachDomainOfKind(kind) {
			if f := d.FreeOf(model); f >= n {
				doms = append(doms, fitting{d.ID, d.Models, f})
			}
		}
		slices.SortFunc(doms, func(a, b fitting) int {
			return cmp.Or(cmp.Compare(a.free, b.free), strings.Compare(a.id, b.id))
		})
		var sets []scopeSet
		perModel := map[string]int{}
		for _, d := range doms {
			if len(sets) == scopeDomains || walked >= scopeWalk {
				break
			}
			major := mostFree(d.models)
			if perModel[major] == 4 {
				continue
			}
			cands, _, considered := candidatesIn(snap, d.id, model, filter)
			walked += considered
			if offers(cands) >= n {
				perModel[major]++
				sets = append(sets, scopeSet{dom: d.id, cands: cands})
			}
		}
		if len(sets) > 0 {
			return sets
		}
		if walked >= scopeWalk {
			return nil
		}
	}
	return nil
}

// mostFree is the model of most of a domain's free GPUs, by its counts.
func mostFree(models []store.ModelCount) string {
	best := store.ModelCount{}
	for _, m := range models {
		if m.Free > best.Free {
			best = m
		}
	}
	return best.Model
}

// scopeDomains bounds the domains scoped keeps: each costs a spread and
// a cost-model evaluation.
const scopeDomains = 16

// scopeWalk bounds the nodes scoped reads before it leaves the choice to
// the whole cluster's walk: fragmented leaves and pods, each holding
// enough free GPUs but not in whole groups, would otherwise be read one
// after another.
const scopeWalk = 1024

// candidatesIn is candidates for the nodes of one leaf or pod.
func candidatesIn(snap *store.Snapshot, dom, model string, filter func(engine.NodeView) bool) (out []*candNode, total, considered int) {
	for node, free := range snap.EachNodeFreeIn(dom, model) {
		considered++
		fabric := engine.FabricDomains(free[0].Domains)
		if filter != nil && !filter(engine.NodeView{Node: *node, Free: len(free), Fabric: fabric}) {
			continue
		}
		out = append(out, &candNode{node: node, free: free, fabric: fabric})
		total += len(free)
	}
	return out, total, considered
}

func filterWait(cands []*candNode, total, n, gpn int, model string) (outcome.Result, bool) {
	if gpn > 0 {
		nodes := 0
		for _, c := range cands {
			if len(c.free) >= gpn {
				nodes++
			}
		}
		if nodes < n/gpn {
			return waitReason(n, gpn, model, total, nodes), true
		}
		return outcome.Result{}, false
	}
	if total < n {
		return waitReason(n, gpn, model, total, 0), true
	}
	return outcome.Result{}, false
}

func waitReason(n, gpn int, model string, free, freeNodes int) outcome.Result {
	of := ""
	if model != "" {
		of = " of model " + model
	}
	if gpn > 0 {
		nodes := fmt.Sprintf("%d nodes", n/gpn)
		if n/gpn == 1 {
			nodes = "1 node"
		}
		return outcome.Result{Verdict: outcome.Wait, Reasons: []events.Reason{{Code: outcome.CodeInsufficientFreeNodes, Field: outcome.FieldGPUsPerNode,
			Message: fmt.Sprintf("needs %s with %d free GPUs%s each, %d such nodes now (on nodes the placement policy allows)", nodes, gpn, of, freeNodes)}}}
	}
	return outcome.Result{Verdict: outcome.Wait, Reasons: []events.Reason{{Code: outcome.CodeInsufficientFreeGPUs, Field: outcome.FieldGPUs,
		Message: fmt.Sprintf("needs %d free GPUs%s, %d free now (on nodes the placement policy allows)", n, of, free)}}}
}
