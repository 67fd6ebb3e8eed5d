package topology

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/toposched/toposched/events"
)

// Shape of the benchmark fabric: rail-optimized, as a DGX SuperPOD is
// built (32 nodes per scalable unit, 8 rails), pods grouped 16 under a
// core switch, the cores under one top core.
const (
	benchPerPod      = 32
	benchRails       = 8
	benchPodsPerCore = 16
)

// benchFabric describes a rail-optimized fabric of n nodes (named
// node-00000, ...): every pod has one leaf per rail holding all the pod's
// nodes (NIC k of each node on the leaf of rail k) on 200 Gb/s links, with
// 16 uplinks for its 32 nodes: 2:1 oversubscribed.
func benchFabric(n int) (events.TopologyFabric, []string) {
	ev := events.TopologyFabric{Cluster: "bench"}
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("node-%05d", i)
	}
	pods := (n + benchPerPod - 1) / benchPerPod
	var cores []string
	for c := 0; c*benchPodsPerCore < pods; c++ {
		core := fmt.Sprintf("core-%d", c)
		cores = append(cores, core)
		var podNames []string
		for p := c * benchPodsPerCore; p < min(pods, (c+1)*benchPodsPerCore); p++ {
			pod := fmt.Sprintf("pod-%d", p)
			podNames = append(podNames, pod)
			var leaves []string
			nodes := names[p*benchPerPod : min(n, (p+1)*benchPerPod)]
			for k := range benchRails {
				leaf := fmt.Sprintf("pod-%d-rail-%d", p, k)
				leaves = append(leaves, leaf)
				ev.Switches = append(ev.Switches, events.Switch{Name: leaf, Tier: "leaf", Nodes: nodes,
					LinkGbps: 200, Oversubscription: 2, Uplinks: 16, UplinkGbps: 200, Rail: railPtr(k)})
			}
			ev.Switches = append(ev.Switches, events.Switch{Name: pod, Tier: "spine", Switches: leaves, LinkGbps: 400})
		}
		ev.Switches = append(ev.Switches, events.Switch{Name: core, Tier: "core", Switches: podNames, LinkGbps: 400})
	}
	if len(cores) > 1 {
		ev.Switches = append(ev.Switches, events.Switch{Name: "top", Tier: "core", Switches: cores, LinkGbps: 400})
	}
	return ev, names
}

func BenchmarkNewFabric(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		ev, _ := benchFabric(n)
		b.Run(fmt.Sprintf("nodes=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := NewFabric(ev); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkGPUPathInNode is the path between two GPUs of one node of the
// 10,000-node fabric: the node's own matrix.
func BenchmarkGPUPathInNode(b *testing.B) {
	ev, names := benchFabric(10000)
	f := mustFabric(b, ev)
	n := dgxA100(names[4321])
	bw := DefaultBandwidths()
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if p := GPUPath(f, n, i&7, n, (i+3)&7, bw); p.Class != NV {
			b.Fatalf("path %+v", p)
		}
	}
}

// BenchmarkGPUPathAcrossFabric is the path between GPUs of two nodes of a
// 10,000-node (80,000 GPU) rail-optimized fabric, for pairs drawn at
// random from the whole cluster, from one pod, and from one pod on one
// rail.
func BenchmarkGPUPathAcrossFabric(b *testing.B) {
	ev, names := benchFabric(10000)
	f := mustFabric(b, ev)
	base := dgxA100("")
	nodes := make([]*Node, len(names))
	for i, name := range names {
		n := *base
		n.Name = name
		nodes[i] = &n
	}
	bw := DefaultBandwidths()
	type pair struct {
		a, b   *Node
		ga, gb int
	}
	r := rand.New(rand.NewPCG(1, 2))
	draw := func(samePod, sameRail bool) []pair {
		out := make([]pair, 4096)
		for i := range out {
			a := r.IntN(len(nodes))
			b := r.IntN(len(nodes))
			if samePod {
				b = a/benchPerPod*benchPerPod + r.IntN(benchPerPod)
			}
			for b == a || b >= len(nodes) {
				b = (b + 1) % len(nodes)
			}
			ga, gb := r.IntN(8), r.IntN(8)
			if sameRail {
				gb = ga
			}
			out[i] = pair{nodes[a], nodes[b], ga, gb}
		}
		return out
	}
	for _, tc := range []struct {
		name  string
		pairs []pair
		tier  string // of every pair, "" when mixed
	}{
		{"random", draw(false, false), ""},
		{"same-pod", draw(true, false), ""},
		{"same-pod-same-rail", draw(true, true), TierLeaf},
	} {
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				p := tc.pairs[i&4095]
				if got := GPUPath(f, p.a, p.ga, p.b, p.gb, bw); got.Class != NET || got.BandwidthGBps <= 0 {
					b.Fatalf("path %+v", got)
				}
			}
		})
	}
	// Check the shape once: same pod and rail is one leaf hop at the
	// NIC's 200 Gb/s; another rail crosses the leaf's 2:1 uplinks.
	for _, tc := range []struct {
		gb   int
		gbps float64
	}{{3, 25}, {4, 12.5}} {
		if p := GPUPath(f, nodes[0], 3, nodes[1], tc.gb, bw); p.BandwidthGBps != tc.gbps {
			b.Fatalf("GPU3 to GPU%d of the next node: %v GB/s, want %v", tc.gb, p.BandwidthGBps, tc.gbps)
		}
	}
}
