// Package gpuallocator is NVIDIA go-gpuallocator's best-effort policy
// (gpuallocator/besteffort_policy.go), the one the NVIDIA device plugin
// for Kubernetes uses to choose a pod's GPUs inside a node, re-implemented
// on toposched's topology: a peer to compare topology-aware placement with.
//
// Its pair score: 100 per NVLink between the two GPUs, plus their PCIe
// level: 50 on one PCIe switch (nvidia-smi PIX), 40 across switches
// (PXB), 30 through the host bridge (PHB), 20 on one CPU (NODE), 10 across
// CPUs (SYS). A set's score is the sum over its pairs. For a request of k
// GPUs it does not take the best-scoring set greedily: it partitions all
// the node's free GPUs into sets of k (padding the last), takes the
// partition of highest total score (the first one found on ties), and
// returns that partition's best set.
//
// The node is the Kubernetes scheduler's, not the allocator's: nodes are
// taken in enumeration order (first fit), the allocator only chooses
// inside each.
//
// Deviations, both where toposched's input says less than NVML: a pair
// nvidia-smi shows as NV# has only its NVLink count (the matrix prints
// NV# in place of the PCIe level), so it scores 100 per link and nothing
// for PCIe; NVB (NVLink through another GPU) scores 0. A set holding
// padding is never returned (upstream could, when every score is 0).
package gpuallocator

import (
	"slices"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/internal/placer/engine"
	"github.com/toposched/toposched/internal/placer/fill"
	"github.com/toposched/toposched/internal/placer/outcome"
	"github.com/toposched/toposched/internal/store"
	"github.com/toposched/toposched/internal/topology"
)

// Name is the strategy's name, as recorded in PlacementDecided.Strategy.
const Name = "gpuallocator"

// PairScore is the best-effort policy's score of one pair's link.
func PairScore(l topology.Link) int {
	switch l.Class {
	case topology.NV:
		return 100 * l.NVLinks
	case topology.PIX:
		return 50
	case topology.PXB:
		return 40
	case topology.PHB:
		return 30
	case topology.NODE:
		return 20
	case topology.SYS:
		return 10
	}
	return 0
}

// Allocate returns the best-effort choice of size of the available GPUs
// (ids in the caller's order), sorted, with score(a, b) the pair score;
// nil when fewer than size are available.
func Allocate(available []int, size int, score func(a, b int) int) []int {
	if size <= 0 || len(available) < size {
		return nil
	}
	if size == 1 {
		// Every set of one scores 0: the first partition found wins.
		return []int{available[0]}
	}
	const pad = -1
	devices := slices.Clone(available)
	for len(devices)%size != 0 {
		devices = append(devices, pad)
	}
	padding := len(devices) - len(available)
	setScore := func(set []int) int {
		s := 0
		for i, a := range set {
			for _, b := range set[i+1:] {
				if a != pad && b != pad {
					s += score(a, b)
				}
			}
		}
		return s
	}
	var best [][]int
	bestScore := 0
	var partition [][]int
	// partitions enumerates the partitions of rest into sets of size,
	// each set led by the first device left (so no partition is seen
	// twice), keeping only sets with no padding or all of it.
	var partitions func(rest []int, total int)
	partitions = func(rest []int, total int) {
		if len(rest) == size {
			partition = append(partition, rest)
			if t := total + setScore(rest); best == nil || t > bestScore {
				best, bestScore = cloneSets(partition), t
			}
			partition = partition[:len(partition)-1]
			return
		}
		head, tail := rest[0], rest[1:]
		eachSubset(tail, size-1, func(sub []int) {
			set := append([]int{head}, sub...)
			if p := countPad(set); p != 0 && p != padding {
				return
			}
			remaining := make([]int, 0, len(rest)-size)
			for _, d := range tail {
				if !slices.Contains(sub, d) {
					remaining = append(remaining, d)
				}
			}
			partition = append(partition, set)
			partitions(remaining, total+setScore(set))
			partition = partition[:len(partition)-1]
		})
	}
	partitions(devices, 0)
	var out []int
	outScore := 0
	for _, set := range best {
		if countPad(set) > 0 {
			continue
		}
		if s := setScore(set); out == nil || s > outScore {
			out, outScore = set, s
		}
	}
	out = slices.Clone(out)
	slices.Sort(out)
	return out
}

// eachSubset calls fn with every subset of k of from, in lexicographic
// order of positions. fn must not keep its argument.
func eachSubset(from []int, k int, fn func([]int)) {
	sub := make([]int, 0, k)
	var rec func(start int)
	rec = func(start int) {
		if len(sub) == k {
			fn(sub)
			return
		}
		for i := start; i <= len(from)-(k-len(sub)); i++ {
			sub = append(sub, from[i])
			rec(i + 1)
			sub = sub[:len(sub)-1]
		}
	}
	rec(0)
}

func countPad(set []int) int {
	n := 0
	for _, d := range set {
		if d < 0 {
			n++
		}
	}
	return n
}

func cloneSets(p [][]int) [][]int {
	out := make([][]int, len(p))
	for i, s := range p {
		out[i] = slices.Clone(s)
	}
	return out
}

// Place places job first fit over the nodes keep keeps (nil: every
// node), with the best-effort policy's choice of GPUs inside each, unit
// GPUs at a time on a node (fill.Place; 1: any number).
func Place(snap *store.Snapshot, job events.JobAnalyzed, keep engine.Keep, unit int) outcome.Result {
	return fill.Place(snap, job, snap.EachNodeFree(job.Job.GPUModel), pick, keep, unit)
}

func pick(node *store.Node, free []store.FreeGPU, k int) []store.FreeGPU {
	topo := node.Effective
	at := map[int]int{} // GPU index -> row of the path matrix
	if topo != nil {
		for i, g := range topo.GPUs {
			at[g.Index] = i
		}
	}
	score := func(a, b int) int {
		i, ok1 := at[a]
		j, ok2 := at[b]
		if !ok1 || !ok2 || i >= len(topo.GPUPaths) || j >= len(topo.GPUPaths[i]) {
			return 0
		}
		return PairScore(topo.GPUPaths[i][j])
	}
	ids := make([]int, len(free))
	byIndex := make(map[int]store.FreeGPU, len(free))
	for i, g := range free {
		ids[i] = g.Index
		byIndex[g.Index] = g
	}
	chosen := Allocate(ids, k, score)
	out := make([]store.FreeGPU, len(chosen))
	for i, id := range chosen {
		out[i] = byIndex[id]
	}
	return out
}
