package replay

import (
	"math"
	"testing"

	"github.com/toposched/toposched/events"
)

func TestStretch(t *testing.T) {
	nan := math.NaN()
	for _, tc := range []struct {
		name                 string
		compute, comm, ideal float64
		want                 float64
		ok                   bool
	}{
		{"as ideal", 1, 0.25, 0.25, 1, true},
		{"twice the ideal communication", 1, 0.5, 0.25, 1.5 / 1.25, true},
		{"one GPU: nothing to communicate", 1, 0, 0, 1, true},
		{"better than the ideal found", 1, 0.2, 0.25, 1.2 / 1.25, true},
		{"no prediction", 1, nan, 0.25, 1, false},
		{"no ideal placement", 1, 0.5, nan, 1, false},
		{"no compute time", nan, 0.5, 0.25, 1, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := Stretch(tc.compute, tc.comm, tc.ideal)
			if math.Abs(got-tc.want) > 1e-12 || ok != tc.ok {
				t.Errorf("Stretch(%v, %v, %v) = %v, %v; want %v, %v", tc.compute, tc.comm, tc.ideal, got, ok, tc.want, tc.ok)
			}
		})
	}
}

func TestComputeSeconds(t *testing.T) {
	// gpt-1.3b, global batch 8 × dp 4, sequence 2048, on 4 GPUs:
	// 6 · 1.3e9 · 32 · 2048 / (4 · 125e12) = 1.022 s.
	sub := events.JobSubmitted{GPUs: 4, Model: &events.Model{Parameters: 1300e6, GlobalBatchSize: 32, SeqLen: 2048}}
	if got, want := ComputeSeconds(sub, 0.1), 6*1300e6*32*2048/(4*ReferenceFLOPS); math.Abs(got-want) > 1e-12 {
		t.Errorf("from the model: %v, want %v", got, want)
	}
	sub.StepComputeSeconds = 0.7
	if got := ComputeSeconds(sub, 0.1); got != 0.7 {
		t.Errorf("the job's own step_compute_seconds: %v, want 0.7", got)
	}
	// No model size: the ideal step is ComputeShare(4) = 80% compute.
	noModel := events.JobSubmitted{GPUs: 4}
	if got := ComputeSeconds(noModel, 0.1); math.Abs(got-0.4) > 1e-12 {
		t.Errorf("from the compute share: %v, want 0.4", got)
	}
	if got := ComputeSeconds(events.JobSubmitted{GPUs: 1}, 0); !math.IsNaN(got) {
		t.Errorf("nothing to go by: %v, want NaN", got)
	}
}

func TestMayFit(t *testing.T) {
	inv := &Inventory{Nodes: []InvNode{{Name: "a", GPUs: 8}, {Name: "b", GPUs: 8}, {Name: "c", GPUs: 4}}, GPUs: 20, MaxNodeGPUs: 8}
	o := newOccupancy(inv)
	o.add(0, 6) // a: 2 free
	o.add(1, 1) // b: 7 free
	for _, tc := range []struct {
		gpus, perNode int
		want          bool
	}{
		{13, 0, true}, {14, 0, false}, {7, 7, true}, {8, 8, false}, {8, 4, true}, {12, 4, false}, {4, 2, true},
	} {
		if got := o.mayFit(tc.gpus, tc.perNode); got != tc.want {
			t.Errorf("mayFit(%d, %d) = %v, want %v", tc.gpus, tc.perNode, got, tc.want)
		}
	}
}

func TestStretchOn(t *testing.T) {
	nan := math.NaN()
	for _, tc := range []struct {
		name                            string
		compute, computeOn, comm, ideal float64
		gpus                            int
		want                            float64
		ok                              bool
	}{
		{"on the reference, ideal", 1, 1, 0.25, 0.25, 2, 1, true},
		{"three times slower compute", 1, 3, 0.25, 0.25, 2, 3.25 / 1.25, true},
		{"faster compute, worse communication", 1, 0.5, 0.5, 0.25, 2, 1 / 1.25, true},
		{"one GPU without a prediction", 2, 6, nan, nan, 1, 3, true},
		{"model unknown: Stretch", 1, nan, 0.5, 0.25, 2, 1.5 / 1.25, true},
		{"no prediction", 1, 3, nan, 0.25, 2, 1, false},
		{"no compute time", nan, nan, 0.5, 0.25, 2, 1, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := StretchOn(tc.compute, tc.computeOn, tc.comm, tc.ideal, tc.gpus)
			if math.Abs(got-tc.want) > 1e-12 || ok != tc.ok {
				t.Errorf("StretchOn(%v, %v, %v, %v, %d) = %v, %v; want %v, %v", tc.compute, tc.computeOn, tc.comm, tc.ideal, tc.gpus, got, ok, tc.want, tc.ok)
			}
		})
	}
}
