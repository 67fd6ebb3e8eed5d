package blind

import (
	"fmt"
	"reflect"
	"slices"
	"testing"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/internal/fixtures"
	"github.com/toposched/toposched/internal/placer/outcome"
	"github.com/toposched/toposched/internal/store"
)

// nodeSpec describes one node of a test cluster.
type nodeSpec struct {
	name      string
	model     string
	gpus      int
	models    map[int]string // per-GPU model overrides
	unhealthy []int
	held      []int // allocated to job "other-<node>"
}

// cluster builds a store with the nodes in enumeration order.
func cluster(t testing.TB, nodes ...nodeSpec) *store.Store {
	t.Helper()
	fx := make([]fixtures.Node, len(nodes))
	for i, ns := range nodes {
		ev := fixtures.PlainNode(ns.name, ns.model, ns.gpus)
		for g := range ev.GPUs {
			ev.GPUs[g].Model = ns.models[g]
		}
		fx[i] = fixtures.Node{Event: ev, Held: ns.held, Unhealthy: ns.unhealthy}
	}
	return fixtures.MustStore(t, fx, nil)
}

func job(gpus, perNode int, model string) events.JobAnalyzed {
	return events.JobAnalyzed{Job: events.JobSubmitted{JobID: "j", GPUs: gpus, GPUsPerNode: perNode, GPUModel: model}}
}

// on lists GPU keys of one node.
func on(node string, idx ...int) []store.GPUKey {
	out := make([]store.GPUKey, len(idx))
	for i, x := range idx {
		out[i] = store.GPUKey{Node: node, Index: x}
	}
	return out
}

func cat(parts ...[]store.GPUKey) []store.GPUKey { return slices.Concat(parts...) }

func codes(rs []events.Reason) []string {
	out := make([]string, len(rs))
	for i, r := range rs {
		out[i] = r.Code
	}
	return out
}

// four8 is four nodes of 8 A100 each.
func four8(mod func(i int, ns *nodeSpec)) []nodeSpec {
	out := make([]nodeSpec, 4)
	for i := range out {
		out[i] = nodeSpec{name: fmt.Sprintf("n%d", i), model: "A100", gpus: 8}
		if mod != nil {
			mod(i, &out[i])
		}
	}
	return out
}

func TestPlace(t *testing.T) {
	t.Parallel()
	hetero := []nodeSpec{
		{name: "h0", model: "H100", gpus: 8},
		{name: "a0", model: "A100", gpus: 4},
		{name: "mix", model: "A100", gpus: 4, models: map[int]string{0: "H100", 1: "H100"}},
		{name: "a1", model: "A100", gpus: 4},
	}
	tests := []struct {
		name    string
		nodes   []nodeSpec
		job     events.JobAnalyzed
		verdict outcome.Verdict
		gpus    []store.GPUKey
		codes   []string
		fields  []string
		message string // of the first reason, when given
	}{
		// outcome.Never.
		{
			name: "exceeds cluster capacity", nodes: four8(nil), job: job(64, 0, "A100"),
			verdict: outcome.Never, codes: []string{outcome.CodeExceedsCluster}, fields: []string{outcome.FieldGPUs},
			message: "job asks for 64 GPUs; the cluster has 32 healthy GPUs of model A100",
		},
		{
			name: "exceeds cluster capacity counting healthy only", nodes: four8(func(i int, ns *nodeSpec) { ns.unhealthy = []int{0} }),
			job: job(30, 0, ""), verdict: outcome.Never, codes: []string{outcome.CodeExceedsCluster},
			message: "job asks for 30 GPUs; the cluster has 28 healthy GPUs",
		},
		{
			name: "unknown model", nodes: four8(nil), job: job(8, 0, "V100"),
			verdict: outcome.Never, codes: []string{outcome.CodeUnknownGPUModel}, fields: []string{outcome.FieldGPUModel},
		},
		{
			name: "unknown model and bad divisor", nodes: four8(nil), job: job(12, 8, "V100"),
			verdict: outcome.Never, codes: []string{outcome.CodeUnknownGPUModel, outcome.CodeGPUsPerNodeNotDivisor},
			fields: []string{outcome.FieldGPUModel, outcome.FieldGPUsPerNode},
		},
		{
			name: "not a divisor", nodes: four8(nil), job: job(12, 8, ""),
			verdict: outcome.Never, codes: []string{outcome.CodeGPUsPerNodeNotDivisor}, fields: []string{outcome.FieldGPUsPerNode},
		},
		{
			name: "exceeds node size", nodes: four8(nil), job: job(32, 16, "A100"),
			verdict: outcome.Never, codes: []string{outcome.CodeExceedsNodeSize}, fields: []string{outcome.FieldGPUsPerNode},
			message: "job asks for 16 GPUs per node; the largest node has 8 GPUs of model A100",
		},
		{
			name: "several at once", nodes: four8(nil), job: job(72, 16, "A100"),
			verdict: outcome.Never, codes: []string{outcome.CodeGPUsPerNodeNotDivisor, outcome.CodeExceedsCluster, outcome.CodeExceedsNodeSize},
			fields: []string{outcome.FieldGPUsPerNode, outcome.FieldGPUs, outcome.FieldGPUsPerNode},
		},
		{
			name: "not enough nodes", nodes: four8(func(i int, ns *nodeSpec) {
				if i < 2 {
					ns.unhealthy = []int{7}
				}
			}),
			job: job(24, 8, "A100"), verdict: outcome.Never, codes: []string{outcome.CodeNotEnoughNodes}, fields: []string{outcome.FieldGPUsPerNode},
			message: "job needs 3 nodes with 8 healthy GPUs of model A100 each; the cluster has 2",
		},
		{
			name: "not enough nodes and capacity", nodes: four8(func(i int, ns *nodeSpec) { ns.unhealthy = []int{7} }),
			job: job(32, 8, ""), verdict: outcome.Never, codes: []string{outcome.CodeExceedsCluster, outcome.CodeNotEnoughNodes},
		},
		{
			name: "model exists only on too small nodes", nodes: hetero, job: job(4, 4, "H100"),
			verdict: outcome.Placed, gpus: on("h0", 0, 1, 2, 3),
		},
		{
			name: "heterogeneous node size per model", nodes: hetero, job: job(8, 8, "A100"),
			verdict: outcome.Never, codes: []string{outcome.CodeExceedsNodeSize},
			message: "job asks for 8 GPUs per node; the largest node has 4 GPUs of model A100",
		},
		{
			name: "empty cluster", job: job(1, 0, ""),
			verdict: outcome.Never, codes: []string{outcome.CodeExceedsCluster},
			message: "job asks for 1 GPUs; the cluster has 0 healthy GPUs",
		},
		{
			name: "invalid request", nodes: four8(nil), job: job(0, -1, ""),
			verdict: outcome.Never, codes: []string{outcome.CodeInvalidGPUs, outcome.CodeInvalidGPUsPerNode},
		},

		// outcome.Wait.
		{
			name: "wait for free GPUs", nodes: four8(func(i int, ns *nodeSpec) {
				switch i {
				case 0, 1:
					ns.held = []int{0, 1, 2, 3, 4, 5, 6, 7}
				case 2:
					ns.held = []int{0, 1, 2, 3}
				}
			}),
			job: job(16, 0, "A100"), verdict: outcome.Wait, codes: []string{outcome.CodeInsufficientFreeGPUs}, fields: []string{outcome.FieldGPUs},
			message: "needs 16 free GPUs of model A100, 12 free now",
		},
		{
			name: "wait while a GPU is unhealthy", nodes: four8(func(i int, ns *nodeSpec) {
				if i > 0 {
					ns.held = []int{0, 1, 2, 3, 4, 5, 6, 7}
				}
				ns.unhealthy = []int{7}
			}),
			job: job(8, 0, ""), verdict: outcome.Wait, codes: []string{outcome.CodeInsufficientFreeGPUs},
			message: "needs 8 free GPUs, 7 free now",
		},
		{
			name: "wait for free nodes", nodes: four8(func(i int, ns *nodeSpec) {
				if i < 3 {
					ns.held = []int{i}
				}
			}),
			job: job(16, 8, ""), verdict: outcome.Wait, codes: []string{outcome.CodeInsufficientFreeNodes}, fields: []string{outcome.FieldGPUsPerNode},
			message: "needs 2 nodes with 8 free GPUs each, 1 such nodes now",
		},

		// outcome.Placed.
		{name: "first fit", nodes: four8(nil), job: job(4, 0, "A100"), verdict: outcome.Placed, gpus: on("n0", 0, 1, 2, 3)},
		{name: "whole cluster", nodes: four8(nil), job: job(32, 0, ""), verdict: outcome.Placed,
			gpus: cat(on("n0", 0, 1, 2, 3, 4, 5, 6, 7), on("n1", 0, 1, 2, 3, 4, 5, 6, 7), on("n2", 0, 1, 2, 3, 4, 5, 6, 7), on("n3", 0, 1, 2, 3, 4, 5, 6, 7))},
		{name: "spans nodes", nodes: four8(nil), job: job(10, 0, ""), verdict: outcome.Placed,
			gpus: cat(on("n0", 0, 1, 2, 3, 4, 5, 6, 7), on("n1", 0, 1))},
		{
			name: "skips unhealthy and allocated", nodes: four8(func(i int, ns *nodeSpec) {
				if i == 0 {
					ns.unhealthy = []int{1, 6}
					ns.held = []int{2, 3}
				}
			}),
			job: job(6, 0, ""), verdict: outcome.Placed, gpus: cat(on("n0", 0, 4, 5, 7), on("n1", 0, 1)),
		},
		{
			name: "per node skips nodes short of room", nodes: four8(func(i int, ns *nodeSpec) {
				switch i {
				case 0:
					ns.held = []int{0, 2, 4, 6, 7} // 3 free
				case 1:
					ns.held = []int{1, 3} // 6 free: 0 2 4 5 6 7
				case 2:
					ns.unhealthy = []int{0, 1, 2, 3, 4} // 3 healthy
				}
			}),
			job: job(8, 4, "A100"), verdict: outcome.Placed, gpus: cat(on("n1", 0, 2, 4, 5), on("n3", 0, 1, 2, 3)),
		},
		{name: "per node whole nodes", nodes: four8(nil), job: job(16, 8, ""), verdict: outcome.Placed,
			gpus: cat(on("n0", 0, 1, 2, 3, 4, 5, 6, 7), on("n1", 0, 1, 2, 3, 4, 5, 6, 7))},
		{name: "per node one each", nodes: four8(nil), job: job(3, 1, ""), verdict: outcome.Placed,
			gpus: cat(on("n0", 0), on("n1", 0), on("n2", 0))},
		{
			name: "enumeration order, not names", nodes: []nodeSpec{
				{name: "zeta", model: "A100", gpus: 2}, {name: "alpha", model: "A100", gpus: 2},
			},
			job: job(3, 0, ""), verdict: outcome.Placed, gpus: cat(on("zeta", 0, 1), on("alpha", 0)),
		},
		{name: "model H100", nodes: hetero, job: job(10, 0, "H100"), verdict: outcome.Placed,
			gpus: cat(on("h0", 0, 1, 2, 3, 4, 5, 6, 7), on("mix", 0, 1))},
		{name: "model A100", nodes: hetero, job: job(6, 0, "A100"), verdict: outcome.Placed,
			gpus: cat(on("a0", 0, 1, 2, 3), on("mix", 2, 3))},
		{name: "model A100 per node", nodes: hetero, job: job(4, 2, "A100"), verdict: outcome.Placed,
			gpus: cat(on("a0", 0, 1), on("mix", 2, 3))},
		{name: "any model", nodes: hetero, job: job(14, 0, ""), verdict: outcome.Placed,
			gpus: cat(on("h0", 0, 1, 2, 3, 4, 5, 6, 7), on("a0", 0, 1, 2, 3), on("mix", 0, 1))},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s := cluster(t, tt.nodes...)
			got := Place(s.Snapshot(), tt.job)
			if got.Verdict != tt.verdict {
				t.Fatalf("verdict %v, want %v (reasons %+v)", got.Verdict, tt.verdict, got.Reasons)
			}
			if !slices.Equal(got.GPUs, tt.gpus) {
				t.Errorf("GPUs = %v\nwant %v", got.GPUs, tt.gpus)
			}
			if c := codes(got.Reasons); !slices.Equal(c, tt.codes) && (len(c) > 0 || len(tt.codes) > 0) {
				t.Errorf("codes = %v, want %v", c, tt.codes)
			}
			for i, f := range tt.fields {
				if i < len(got.Reasons) && got.Reasons[i].Field != f {
					t.Errorf("reason %d field %q, want %q", i, got.Reasons[i].Field, f)
				}
			}
			for _, r := range got.Reasons {
				if r.Field == "" || r.Message == "" {
					t.Errorf("reason %+v lacks a field or message", r)
				}
			}
			if tt.message != "" && (len(got.Reasons) == 0 || got.Reasons[0].Message != tt.message) {
				t.Errorf("message = %+v, want %q", got.Reasons, tt.message)
			}
			if got.Verdict == outcome.Placed {
				// The choice commits.
				if err := s.Allocate("j", got.GPUs); err != nil {
					t.Errorf("Allocate(placed GPUs): %v", err)
				}
			}
		})
	}
}

func TestPlaceDeterministic(t *testing.T) {
	t.Parallel()
	nodes := four8(func(i int, ns *nodeSpec) {
		ns.held = []int{i, 7 - i}
		ns.unhealthy = []int{(i + 3) % 8}
	})
	jobs := []events.JobAnalyzed{job(13, 0, ""), job(8, 4, "A100"), job(30, 0, ""), job(12, 5, "H100")}
	s1, s2 := cluster(t, nodes...), cluster(t, nodes...)
	snap := s1.Snapshot()
	for _, j := range jobs {
		first := Place(snap, j)
		for range 5 {
			if again := Place(snap, j); !reflect.DeepEqual(first, again) {
				t.Errorf("job %+v: %+v then %+v", j.Job, first, again)
			}
		}
		if other := Place(s2.Snapshot(), j); !reflect.DeepEqual(first, other) {
			t.Errorf("job %+v: replica gives %+v, want %+v", j.Job, other, first)
		}
	}
}

func BenchmarkPlace(b *testing.B) {
	for _, nodes := range []int{1_000, 10_000} {
		specs := make([]nodeSpec, nodes)
		for i := range specs {
			specs[i] = nodeSpec{name: fmt.Sprintf("node-%05d", i), model: "H100", gpus: 8}
			if i < nodes*3/4 {
				specs[i].held = []int{0} // the first fit is far down the list
			}
		}
		snap := cluster(b, specs...).Snapshot()
		j := job(64, 8, "H100")
		b.Run(fmt.Sprintf("%dk", nodes/1000), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if r := Place(snap, j); r.Verdict != outcome.Placed {
					b.Fatal(r)
				}
			}
		})
	}
}
