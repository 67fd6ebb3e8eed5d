package replay

import (
	"cmp"
	"slices"
)

// jobClass is a kind of request for fragmentation: how many GPUs, how
// many on each node (0: any split), and which model ("" any).
type jobClass struct {
	gpus, perNode int
	model         string
	weight        float64
}

func classOf(j Job) jobClass {
	return jobClass{gpus: j.GPUs, perNode: j.GPUsPerNode, model: j.GPUModel}
}

// workloadClasses is the trace's mix of requests, each weighted by its
// share of the jobs: the "target workload" of the fragmentation measure.
func workloadClasses(jobs []Job) []jobClass {
	count := map[jobClass]int{}
	for _, j := range jobs {
		count[classOf(j)]++
	}
	out := make([]jobClass, 0, len(count))
	for c, n := range count {
		c.weight = float64(n) / float64(len(jobs))
		out = append(out, c)
	}
	slices.SortFunc(out, func(a, b jobClass) int {
		return cmp.Or(cmp.Compare(a.gpus, b.gpus), cmp.Compare(a.perNode, b.perNode), cmp.Compare(a.model, b.model))
	})
	return out
}

// occupancy follows the free GPUs of every node, and keeps, per GPU model,
// how many nodes have f free GPUs, so that fragmentation costs
// O(classes × models × GPUs per node) whatever the cluster's size.
type occupancy struct {
	inv   *Inventory
	used  []int
	alloc int
	// hist[model][f] counts the nodes of the model with f free GPUs.
	hist   []([]int)
	models []string
	model  []int // node -> model index
}

func newOccupancy(inv *Inventory) *occupancy {
	o := &occupancy{inv: inv, used: make([]int, len(inv.Nodes)), model: make([]int, len(inv.Nodes))}
	at := map[string]int{}
	for i, n := range inv.Nodes {
		m, ok := at[n.Model]
		if !ok {
			m = len(o.models)
			at[n.Model] = m
			o.models = append(o.models, n.Model)
			o.hist = append(o.hist, make([]int, inv.MaxNodeGPUs+1))
		}
		o.model[i] = m
		o.hist[m][n.GPUs]++
	}
	return o
}

// add changes node i's used GPUs by d (negative frees).
func (o *occupancy) add(i, d int) {
	n := o.inv.Nodes[i]
	h := o.hist[o.model[i]]
	h[n.GPUs-o.used[i]]--
	o.used[i] = min(max(o.used[i]+d, 0), n.GPUs)
	h[n.GPUs-o.used[i]]++
	o.alloc += d
}

func (o *occupancy) free() int { return o.inv.GPUs - o.alloc }

// usable reports, per model and free count, whether a job of class c
// could use a node's free GPUs now.
func (o *occupancy) usable(c jobClass, out [][]bool) {
	for m := range out {
		clear(out[m])
	}
	match := func(m int) bool { return c.model == "" || c.model == o.models[m] }
	need := max(c.perNode, 1)
	// Multi-node requests need enough room over the whole cluster.
	if c.perNode < c.gpus {
		room := 0
		for m := range o.models {
			if !match(m) {
				continue
			}
			for f := need; f < len(o.hist[m]); f++ {
				room += o.hist[m][f] * (f / need) * need
			}
		}
		if room < c.gpus {
			return
		}
	}
	for m := range out {
		if !match(m) {
			continue
		}
		for f := need; f < len(out[m]); f++ {
			out[m][f] = true
		}
	}
}

// fragmentation returns the expected free GPUs a job drawn from classes
// cannot use: FGD's Σ_c p_c·F(c), with whole GPUs.
func (o *occupancy) fragmentation(classes []jobClass) float64 {
	ok := make([][]bool, len(o.models))
	for m := range ok {
		ok[m] = make([]bool, len(o.hist[m]))
	}
	expected := 0.0
	for _, c := range classes {
		o.usable(c, ok)
		n := 0
		for m := range ok {
			for f := 1; f < len(ok[m]); f++ {
				if !ok[m][f] {
					n += f * o.hist[m][f]
				}
			}
		}
		expected += c.weight * float64(n)
	}
	return expected
}

// mayFit reports whether a job of gpus GPUs, perNode on each node (0: any
// split), could be placed now by counts alone, blind to GPU models and
// health: it errs towards yes, so a no is certain.
func (o *occupancy) mayFit(gpus, perNode int) bool {
	if perNode <= 0 {
		return o.free() >= gpus
	}
	nodes := 0
	for _, h := range o.hist {
		for f := perNode; f < len(h); f++ {
			nodes += h[f]
		}
	}
	return nodes >= gpus/perNode
}
