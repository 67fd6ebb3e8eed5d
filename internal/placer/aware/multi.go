package aware

// Stage 2b, the multi-node choice: for a job spread over nodes (or one
// whose one-node candidates are all denied), the fabric domains that hold
// it (leaf, pod, core, then the cluster) and one spread of GPUs per
// domain, each node's share chosen by pick (single.go). After the
// candidate walk (candidates.go); next, the judge (judge.go) and the local
// search (search.go).
//
// Flow (place.go): candidates → single node or multi-node → judge →
// local search → judge again.

import (
	"cmp"
	"math"
	"slices"
	"strings"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/internal/store"
)

// unitOf is the size of the job's innermost groups when they are blocks of
// consecutive ranks (TP in the default layout), else 1.
func unitOf(job events.JobAnalyzed, n int) int {
	if len(job.Order) == 0 {
		return 1
	}
	for _, rg := range job.Groups {
		if rg.Dimension != job.Order[0] || rg.Size < 2 || n%rg.Size != 0 {
			continue
		}
		for _, m := range rg.Members {
			if len(m) != rg.Size {
				return 1
			}
			for i := 1; i < len(m); i++ {
				if m[i] != m[0]+i || m[0]%rg.Size != 0 {
					return 1
				}
			}
		}
		return rg.Size
	}
	return 1
}

func keys(node string, idx []int) []store.GPUKey {
	out := make([]store.GPUKey, len(idx))
	for i, x := range idx {
		out[i] = store.GPUKey{Node: node, Index: x}
	}
	return out
}

func fabricLevel(d string) int {
	switch store.DomainKind(d) {
	case store.DomainLeaf:
		return 0
	case store.DomainCore:
		return 2
	}
	return 1
}

// multiNode spreads the job over nodes of the smallest fabric domain that
// holds it: up to limit candidates, one per domain, the favourite first
// (the smallest level, then the tightest fit). Nil when the nodes' offers
// do not add up.
func (p *placer) multiNode(cands []*candNode, job events.JobAnalyzed, gpn, limit int) []*cand {
	n := p.n
	units := []int{1}
	if gpn == 0 {
		if u := unitOf(job, n); u > 1 {
			units = []int{u, 1}
		}
	}
	explained := false
	for _, u := range units {
		for _, c := range cands {
			switch {
			case gpn > 0 && len(c.free) >= gpn:
				c.offer = gpn
			case gpn > 0:
				c.offer = 0
			default:
				c.offer = len(c.free) / u * u
			}
		}
		doms := p.fabricDomains(cands, n, !explained)
		explained = true
		var out []*cand
		for _, d := range doms {
			if len(out) == limit {
				break
			}
			if gpus := p.spread(cands, n, d); gpus != nil {
				name := d
				if name == "" {
					name = store.ClusterDomain
				}
				out = append(out, &cand{domain: name, gpus: gpus, comm: math.NaN()})
			}
		}
		if len(out) > 0 {
			return out
		}
	}
	return nil
}

// fabricDomains lists the fabric domains whose nodes offer at least n
// GPUs, by level (leaf, pod, core) then tightest fit then name, and last
// the whole cluster (""), when it offers n. With explain it records the
// levels in the explanation.
func (p *placer) fabricDomains(cands []*candNode, n int, explain bool) []string {
	sum := map[string]int{}
	clusterSum := 0
	for _, c := range cands {
		if c.offer == 0 {
			continue
		}
		clusterSum += c.offer
		for _, d := range c.fabric {
			sum[d] += c.offer
		}
	}
	type dom struct {
		name       string
		level, got int
	}
	var fit []dom
	var domains, fitting [3]int
	for d, got := range sum {
		l := fabricLevel(d)
		domains[l]++
		if got >= n {
			fitting[l]++
			fit = append(fit, dom{d, l, got})
		}
	}
	if x := p.opts.Explain; x != nil && explain && !x.hasLevel(store.DomainCluster) {
		for l, name := range [3]string{store.DomainLeaf, store.DomainPod, store.DomainCore} {
			if domains[l] > 0 {
				x.Explanation.Levels = append(x.Explanation.Levels, events.LevelCount{Level: name, Domains: domains[l], Fitting: fitting[l]})
			}
		}
		lc := events.LevelCount{Level: store.DomainCluster, Domains: 1}
		if clusterSum >= n {
			lc.Fitting = 1
		}
		x.Explanation.Levels = append(x.Explanation.Levels, lc)
	}
	if clusterSum < n {
		return nil
	}
	slices.SortFunc(fit, func(a, b dom) int {
		return cmp.Or(cmp.Compare(a.level, b.level), cmp.Compare(a.got, b.got), strings.Compare(a.name, b.name))
	})
	out := make([]string, 0, len(fit)+1)
	for _, d := range fit {
		out = append(out, d.name)
	}
	return append(out, "")
}

// spread takes n GPUs from the nodes of domain dom ("" for the whole
// cluster): leaf by leaf (fullest first), largest offers first, the rest
// from the node whose offer covers it most tightly.
func (p *placer) spread(cands []*candNode, n int, dom string) []store.GPUKey {
	// The domain's nodes, by leaf (fullest first), largest offers first.
	type leafGroup struct {
		name  string
		total int
		nodes []*candNode
	}
	byLeaf := map[string]*leafGroup{}
	var leaves []*leafGroup
	for _, c := range cands {
		if c.offer == 0 || (dom != "" && !slices.Contains(c.fabric, dom)) {
			continue
		}
		leaf := ""
		if len(c.fabric) > 0 {
			leaf = c.fabric[0]
		}
		g := byLeaf[leaf]
		if g == nil {
			g = &leafGroup{name: leaf}
			byLeaf[leaf] = g
			leaves = append(leaves, g)
		}
		g.total += c.offer
		g.nodes = append(g.nodes, c)
	}
	slices.SortStableFunc(leaves, func(a, b *leafGroup) int {
		return cmp.Or(cmp.Compare(b.total, a.total), strings.Compare(a.name, b.name))
	})
	var out []store.GPUKey
	rem := n
	for _, g := range leaves {
		slices.SortStableFunc(g.nodes, func(a, b *candNode) int {
			return cmp.Or(cmp.Compare(b.offer, a.offer), cmp.Compare(len(a.free), len(b.free)))
		})
		used := make([]bool, len(g.nodes))
		for i := 0; i < len(g.nodes) && rem > 0; i++ {
			if used[i] {
				continue
			}
			c := g.nodes[i]
			take := c.offer
			if take >= rem {
				// The tightest offer in this leaf that covers the rest.
				bi := i
				for j := i + 1; j < len(g.nodes); j++ {
					if !used[j] && g.nodes[j].offer >= rem && g.nodes[j].offer <= g.nodes[bi].offer {
						bi = j
					}
				}
				c, take = g.nodes[bi], rem
				used[bi] = true
			} else {
				used[i] = true
			}
			in, err := p.pick(c, take)
			if err != nil {
				return nil
			}
			out = append(out, keys(c.node.Name, in.gpus)...)
			rem -= take
		}
		if rem == 0 {
			break
		}
	}
	if rem != 0 {
		return nil
	}
	return out
}
