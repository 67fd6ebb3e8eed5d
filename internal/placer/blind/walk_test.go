package blind

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/internal/placer/outcome"
	"github.com/toposched/toposched/internal/store"
)

// placeWalk is Place as it was before the store kept node counts: one walk
// of every node and GPU. TestPlaceMatchesWalk holds Place to it.
func placeWalk(snap *store.Snapshot, job events.JobAnalyzed) outcome.Result {
	n, gpn, model := job.Job.GPUs, job.Job.GPUsPerNode, job.Job.GPUModel

	var invalid []events.Reason
	if n <= 0 {
		invalid = append(invalid, events.Reason{Code: outcome.CodeInvalidGPUs, Field: outcome.FieldGPUs,
			Message: fmt.Sprintf("job asks for %d GPUs; it needs at least 1", n)})
	}
	if gpn < 0 {
		invalid = append(invalid, events.Reason{Code: outcome.CodeInvalidGPUsPerNode, Field: outcome.FieldGPUsPerNode,
			Message: fmt.Sprintf("gpus_per_node is %d; it must be positive or left out", gpn)})
	}
	if len(invalid) > 0 {
		return outcome.Result{Verdict: outcome.Never, Reasons: invalid}
	}

	var (
		total, healthy int // GPUs of the model in the cluster
		free           int // free GPUs of the model in the cluster
		maxPerNode     int // most GPUs of the model on one node
		healthyNodes   int // nodes with >= gpn healthy GPUs of the model
		freeNodes      int // nodes with >= gpn free GPUs of the model
		taken          = make([]store.GPUKey, 0, min(n, 1024))
		nodeFree       []int // free GPU indices of the current node; reused
	)
	need := n
	if gpn > 0 {
		need = n / gpn * gpn // with a bad divisor nothing is placed anyway
	}
	for node, gpus := range snap.EachNodeWithGPUs() {
		nodeTotal, nodeHealthy := 0, 0
		nodeFree = nodeFree[:0]
		for _, g := range gpus {
			if model != "" {
				m := g.Model
				if m == "" {
					m = node.GPUModel
				}
				if m != model {
					continue
				}
			}
			nodeTotal++
			if !g.Healthy {
				continue
			}
			nodeHealthy++
			if g.JobID != "" {
				continue
			}
			free++
			if gpn == 0 {
				if len(taken) < need {
					taken = append(taken, store.GPUKey{Node: node.Name, Index: g.Index})
				}
			} else if len(nodeFree) < gpn {
				nodeFree = append(nodeFree, g.Index)
			}
		}
		total += nodeTotal
		healthy += nodeHealthy
		maxPerNode = max(maxPerNode, nodeTotal)
		if gpn > 0 {
			if nodeHealthy >= gpn {
				healthyNodes++
			}
			if len(nodeFree) == gpn {
				freeNodes++
				if len(taken) < need {
					for _, idx := range nodeFree {
						taken = append(taken, store.GPUKey{Node: node.Name, Index: idx})
					}
				}
			}
		}
	}

	// outcome.Never.
	var never []events.Reason
	of := ""
	if model != "" {
		of = " of model " + model
	}
	if model != "" && total == 0 {
		never = append(never, events.Reason{Code: outcome.CodeUnknownGPUModel, Field: outcome.FieldGPUModel,
			Message: fmt.Sprintf("the cluster has no GPU of model %s", model)})
	}
	if gpn > 0 && n%gpn != 0 {
		never = append(never, events.Reason{Code: outcome.CodeGPUsPerNodeNotDivisor, Field: outcome.FieldGPUsPerNode,
			Message: fmt.Sprintf("gpus_per_node %d does not divide gpus %d", gpn, n)})
	}
	if model == "" || total > 0 {
		if n > healthy {
			never = append(never, events.Reason{Code: outcome.CodeExceedsCluster, Field: outcome.FieldGPUs,
				Message: fmt.Sprintf("job asks for %d GPUs; the cluster has %d healthy GPUs%s", n, healthy, of)})
		}
		tooBig := gpn > maxPerNode
		if tooBig {
			never = append(never, events.Reason{Code: outcome.CodeExceedsNodeSize, Field: outcome.FieldGPUsPerNode,
				Message: fmt.Sprintf("job asks for %d GPUs per node; the largest node has %d GPUs%s", gpn, maxPerNode, of)})
		}
		if gpn > 0 && !tooBig && n%gpn == 0 && healthyNodes < n/gpn {
			never = append(never, events.Reason{Code: outcome.CodeNotEnoughNodes, Field: outcome.FieldGPUsPerNode,
				Message: fmt.Sprintf("job needs %s with %d healthy GPUs%s each; the cluster has %d",
					nodes(n/gpn), gpn, of, healthyNodes)})
		}
	}
	if len(never) > 0 {
		return outcome.Result{Verdict: outcome.Never, Reasons: never}
	}

	// outcome.Wait or outcome.Placed.
	if len(taken) < n {
		if gpn > 0 {
			return outcome.Result{Verdict: outcome.Wait, Reasons: []events.Reason{{Code: outcome.CodeInsufficientFreeNodes, Field: outcome.FieldGPUsPerNode,
				Message: fmt.Sprintf("needs %s with %d free GPUs%s each, %d such nodes now", nodes(n/gpn), gpn, of, freeNodes)}}}
		}
		return outcome.Result{Verdict: outcome.Wait, Reasons: []events.Reason{{Code: outcome.CodeInsufficientFreeGPUs, Field: outcome.FieldGPUs,
			Message: fmt.Sprintf("needs %d free GPUs%s, %d free now", n, of, free)}}}
	}
	return outcome.Result{Verdict: outcome.Placed, GPUs: taken}
}

// TestPlaceMatchesWalk runs random topology, health and allocation changes
// (nodes of one or two models, moved, removed while their GPUs are held,
// GPUs dropped from reports) and checks after each that Place decides
// exactly what a walk of the cluster decides, reasons and all, for a mix
// of jobs.
func TestPlaceMatchesWalk(t *testing.T) {
	t.Parallel()
	jobs := []events.JobAnalyzed{}
	for _, model := range []string{"", "A100", "H100", "L40S", "none"} {
		for _, n := range []int{-1, 1, 2, 3, 8, 9, 16, 40} {
			for _, gpn := range []int{-2, 0, 1, 3, 4, 8, 9} {
				jobs = append(jobs, job(n, gpn, model))
			}
		}
	}
	for seed := range uint64(4) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			t.Parallel()
			rng := rand.New(rand.NewPCG(seed, 7))
			s, err := store.New()
			if err != nil {
				t.Fatal(err)
			}
			names := []string{"a", "b", "c", "d", "e", "f", "g"}
			held := 0
			ops := []func() error{
				func() error { // a node reports
					i := rng.IntN(len(names))
					r := events.TopologyNode{Name: names[i], Position: i, GPUModel: []string{"A100", "H100", ""}[rng.IntN(3)]}
					if rng.IntN(5) == 0 {
						r.Position = rng.IntN(3)
					}
					for g := range rng.IntN(9) {
						if rng.IntN(6) == 0 {
							continue // a gap, or a GPU dropped from the report
						}
						gpu := events.GPU{Index: g}
						switch rng.IntN(8) {
						case 0:
							gpu.Model = "L40S"
						case 1:
							gpu.Health = events.HealthUnhealthy
						}
						r.GPUs = append(r.GPUs, gpu)
					}
					r.Removed = rng.IntN(10) == 0
					return s.UpsertNode(r)
				},
				func() error { // a job takes GPUs
					snap := s.Snapshot()
					var keys []store.GPUKey
					for n := range snap.EachNode() {
						for g := range snap.EachGPU(n.Name) {
							if g.Free() && rng.IntN(3) == 0 {
								keys = append(keys, g.Key())
							}
						}
					}
					if len(keys) == 0 {
						return nil
					}
					held++
					return s.Allocate(fmt.Sprintf("j%d", held), keys)
				},
				func() error { // a job ends
					if held == 0 {
						return nil
					}
					_, err := s.Release(fmt.Sprintf("j%d", 1+rng.IntN(held)))
					return err
				},
				func() error { // a GPU's health changes
					h := events.TopologyHealth{Node: names[rng.IntN(len(names))], Component: events.ComponentGPU,
						ID: fmt.Sprint(rng.IntN(8)), Health: []string{"healthy", "unhealthy"}[rng.IntN(2)]}
					if rng.IntN(4) == 0 {
						h.Component, h.ID = events.ComponentNode, ""
					}
					_ = s.SetHealth(h) // unknown nodes and GPUs are refused; fine
					return nil
				},
			}
			for step := range 150 {
				if err := ops[rng.IntN(len(ops))](); err != nil && !errors.Is(err, store.ErrConflict) {
					t.Fatalf("step %d: %v", step, err)
				}
				snap := s.Snapshot()
				for _, j := range jobs {
					got, want := Place(snap, j), placeWalk(snap, j)
					if !reflect.DeepEqual(got, want) {
						t.Fatalf("step %d, job %d GPUs, %d per node, model %q:\n got %+v\nwant %+v",
							step, j.Job.GPUs, j.Job.GPUsPerNode, j.Job.GPUModel, got, want)
					}
					// Kept by a filter that keeps all: the same GPUs.
					all := PlaceOn(snap, j, func(*store.Node, []store.FreeGPU) bool { return true })
					if all.Verdict != want.Verdict || !reflect.DeepEqual(all.GPUs, want.GPUs) {
						t.Fatalf("step %d, job %d GPUs, %d per node, model %q, all kept:\n got %+v\nwant %+v",
							step, j.Job.GPUs, j.Job.GPUsPerNode, j.Job.GPUModel, all, want)
					}
					checkKept(t, snap, j, want)
				}
			}
		})
	}
}

// checkKept holds PlaceOn with node b refused to Place: it takes nothing
// of b, is rejected exactly when Place is, and waits only when the other
// nodes lack room.
func checkKept(t *testing.T, snap *store.Snapshot, j events.JobAnalyzed, plain outcome.Result) {
	t.Helper()
	model, gpn := j.Job.GPUModel, j.Job.GPUsPerNode
	got := PlaceOn(snap, j, func(n *store.Node, _ []store.FreeGPU) bool { return n.Name != "b" })
	if (got.Verdict == outcome.Never) != (plain.Verdict == outcome.Never) {
		t.Fatalf("job %d GPUs, %d per node, model %q: %v with b refused, %v without", j.Job.GPUs, gpn, model, got.Verdict, plain.Verdict)
	}
	room := 0 // GPUs, or nodes with gpn free, off b
	for n, free := range snap.EachNodeFree(model) {
		switch {
		case n.Name == "b":
		case gpn == 0:
			room += len(free)
		case len(free) >= gpn:
			room++
		}
	}
	need := j.Job.GPUs
	if gpn > 0 {
		need = j.Job.GPUs / gpn
	}
	switch got.Verdict {
	case outcome.Placed:
		if len(got.GPUs) != j.Job.GPUs || slices.ContainsFunc(got.GPUs, func(k store.GPUKey) bool { return k.Node == "b" }) {
			t.Fatalf("job %d GPUs, %d per node, model %q: placed on %v with b refused", j.Job.GPUs, gpn, model, got.GPUs)
		}
	case outcome.Wait:
		if plain.Verdict == outcome.Placed && room >= need {
			t.Fatalf("job %d GPUs, %d per node, model %q: waits with room for %d off b (needs %d)", j.Job.GPUs, gpn, model, room, need)
		}
	}
}
