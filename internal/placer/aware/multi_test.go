package aware

import (
	"slices"
	"testing"

	"github.com/toposched/toposched/internal/fixtures"
	"github.com/toposched/toposched/internal/placer/engine"
)

// bridgedPairs is a node of g GPUs in NVLink-bridged pairs (nv) on sockets
// sockets, PHB inside a socket and SYS across, as fixtures.Families draws
// them, with only the GPUs of free free.
func bridgedPairs(name, nv string, sockets, g int, free ...int) spec {
	return withFree(spec{name: name, ev: fixtures.PathsNode(name, "G", g, func(i, j int) string {
		switch {
		case i/2 == j/2:
			return nv
		case i*sockets/g == j*sockets/g:
			return "PHB"
		}
		return "SYS"
	})}, free)
}

// nvswitchNode is an 8-GPU NVSwitch node (nv) with only free free.
func nvswitchNode(name, nv string, free ...int) spec {
	return withFree(spec{name: name, ev: fixtures.PathsNode(name, "G", 8, func(int, int) string { return nv })}, free)
}

// pcieTree is an 8-GPU PCIe switch tree (PIX pairs under PXB quads,
// across the quads across) with only free free.
func pcieTree(name, across string, free ...int) spec {
	return withFree(spec{name: name, ev: fixtures.PathsNode(name, "G", 8, func(i, j int) string {
		switch {
		case i/2 == j/2:
			return "PIX"
		case i/4 == j/4:
			return "PXB"
		}
		return across
	})}, free)
}

func withFree(sp spec, free []int) spec {
	for i := range sp.ev.GPUs {
		if !slices.Contains(free, i) {
			sp.held = append(sp.held, i)
		}
	}
	return sp
}

// Small clusters of table (d) of toposched quality where topology-aware
// was 1.13 to 1.72 times the optimum before it scored spreads over nodes
// for a job one node holds across its inter-socket link, groupings that
// keep the heavier DP groups on nodes, and trades of GPUs across nodes in
// the local search: each is now within 2% of the exhaustive optimum.
// Two more of table (d)'s TP jobs are not here: the optimum breaks TP
// groups that topology-aware keeps whole (TP first, see alternatives), at
// 1.07 and 1.29 times its predicted time.
func TestSpreadsAgainstOptimum(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		nodes []spec
		n, tp int
	}{
		{"dp3 off a node whose free GPUs are on three sockets", []spec{
			bridgedPairs("n0", "NV1", 3, 6, 0, 3, 5), bridgedPairs("n1", "NV12", 2, 4, 2), bridgedPairs("n2", "NV5", 4, 8, 3, 4, 6)}, 3, 1},
		{"dp5 leaves a lone socket's GPU for another node", []spec{
			bridgedPairs("n0", "NV1", 4, 8, 0), bridgedPairs("n1", "NV10", 4, 8, 3), bridgedPairs("n2", "NV7", 4, 16, 5, 7, 8, 13, 15)}, 5, 1},
		{"tp2xdp3 on NVSwitch nodes", []spec{
			nvswitchNode("n0", "NV18", 1, 2, 4, 5), nvswitchNode("n1", "NV12", 1, 2, 7)}, 6, 2},
		{"tp2xdp2 on PCIe trees: nodes whose pairs keep off SYS", []spec{
			pcieTree("n0", "SYS", 1, 7), pcieTree("n1", "SYS", 0, 5, 7), pcieTree("n2", "PHB", 1, 3, 7)}, 4, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			snap := build(t, tc.nodes...).Snapshot()
			job := fixtures.SyntheticJob("j", tc.n, tc.tp, 1)
			opt, err := Exhaustive(engine.Request{Snap: snap, Job: job, Options: engine.Options{}})
			if err != nil {
				t.Fatal(err)
			}
			// No time budget: the local search's default 2 ms would make
			// the result depend on the machine's load.
			r := Place(engine.Request{Snap: snap, Job: job, Options: engine.Options{Budget: -1}})
			checkFree(t, snap, r, tc.n)
			ours, _ := Predict(snap, job, r.GPUs, nil)
			best, _ := Predict(snap, job, opt.GPUs, nil)
			if ours.CommSeconds > best.CommSeconds*1.02 {
				t.Errorf("ours %v: %.3f× the optimum %v", r.GPUs, ours.CommSeconds/best.CommSeconds, opt.GPUs)
			}
		})
	}
}

// gpus_per_node holds where the local search may trade GPUs across nodes
// and the alternatives spread a job differently: each node used holds
// exactly that many.
func TestSpreadsKeepGPUsPerNode(t *testing.T) {
	t.Parallel()
	snap := build(t, bridgedPairs("n0", "NV1", 3, 6, 0, 3, 5), bridgedPairs("n1", "NV12", 2, 4, 2, 3),
		bridgedPairs("n2", "NV5", 4, 8, 3, 4, 6)).Snapshot()
	for _, tc := range []struct{ n, tp, gpn int }{{3, 1, 1}, {4, 2, 2}, {6, 2, 2}, {2, 1, 1}} {
		job := fixtures.SyntheticJob("j", tc.n, tc.tp, 1)
		job.Job.GPUsPerNode = tc.gpn
		r := Place(engine.Request{Snap: snap, Job: job, Options: engine.Options{}})
		checkFree(t, snap, r, tc.n)
		per := map[string]int{}
		for _, g := range r.GPUs {
			per[g.Node]++
		}
		for node, k := range per {
			if k != tc.gpn {
				t.Errorf("%d GPUs, %d per node: %d on %s (%v)", tc.n, tc.gpn, k, node, r.GPUs)
			}
		}
	}
}
