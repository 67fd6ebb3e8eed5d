package replay

import (
	"context"
	"math"
	"path/filepath"
	"testing"
	"time"

	"github.com/toposched/toposched/internal/gpuspeed"
)

// TestComputePerModel replays jobs pinned to a T4, an H100 and an A100 on
// the shipped heterogeneous cluster, one at a time so none waits. With
// compute blind, a one-GPU job keeps its trace duration wherever it runs;
// charged per model with the A100 as the reference, the T4's runs longer
// than the H100's by the table's ratio of their speeds, and the A100's,
// on the reference model, keeps its duration. A 4-GPU job on T4s runs
// longer than when compute is blind, by more than its communication.
func TestComputePerModel(t *testing.T) {
	clusterFile := filepath.Join("..", "..", "deploy", "examples", "replay", "hetero-512.yaml")
	inv, err := LoadInventory(clusterFile)
	if err != nil {
		t.Fatal(err)
	}
	const dur = 1000.0
	tr := &Trace{Source: "test", Jobs: []Job{
		{ID: "t4", Arrival: 0, Duration: dur, GPUs: 1, GPUModel: "T4"},
		{ID: "h100", Arrival: 2000, Duration: dur, GPUs: 1, GPUModel: "H100-SXM5-80GB"},
		{ID: "a100", Arrival: 4000, Duration: dur, GPUs: 1, GPUModel: "A100-SXM4-80GB"},
		{ID: "t4x4", Arrival: 6000, Duration: dur, GPUs: 4, GPUsPerNode: 4, GPUModel: "T4"},
	}}
	tr.Records = len(tr.Jobs)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	runs := map[string]map[string]JobResult{}
	for _, ref := range []string{"", "a100"} {
		r, err := Run(ctx, Config{ClusterFile: clusterFile, Inventory: inv, Trace: tr, Strategy: "topology-aware", Seed: 1,
			ReserveAfter: -1, DataDir: filepath.Join(t.TempDir(), "data"), Stall: time.Minute, Samples: 10, ComputeReference: ref})
		if err != nil {
			t.Fatal(err)
		}
		runs[ref] = map[string]JobResult{}
		for _, j := range r.Jobs {
			if j.Outcome != "placed" || j.Run < 0 {
				t.Fatalf("compute reference %q: %s %s, run %v", ref, j.ID, j.Outcome, j.Run)
			}
			runs[ref][j.ID] = j
		}
	}
	for _, id := range []string{"t4", "h100", "a100"} {
		if got := runs[""][id].Run; got != dur {
			t.Errorf("compute blind: %s runs %v s, want its trace duration %v", id, got, dur)
		}
	}
	pm := runs["a100"]
	if got := pm["a100"].Run; math.Abs(got-dur) > 1e-9 {
		t.Errorf("per model: the A100 job runs %v s, want its duration on the reference model, %v", got, dur)
	}
	t4, _ := gpuspeed.Factor("T4", "a100")
	h100, _ := gpuspeed.Factor("H100", "a100")
	if got, want := pm["t4"].Run/pm["h100"].Run, t4/h100; math.Abs(got-want) > 1e-9*want {
		t.Errorf("per model: T4 run / H100 run = %v, want the table's %v", got, want)
	}
	if got, want := pm["t4"].Run, dur*t4; math.Abs(got-want) > 1e-9*want {
		t.Errorf("per model: the T4 job runs %v s, want %v", got, want)
	}
	blind, per := runs[""]["t4x4"].Run, pm["t4x4"].Run
	if !(per > blind*1.5) {
		t.Errorf("4 T4s: %v s charged per model, %v s compute-blind; want the T4s' slower compute to show", per, blind)
	}
}

// TestChargeOnly: an unpinned one-GPU job on the empty heterogeneous
// cluster. Weighed by placement (per model), it takes the fastest model,
// an H100, and runs the table's share of its duration; charged only,
// placement chooses as it does blind to compute (the best fit, not the
// fastest model) and the job runs longer.
func TestChargeOnly(t *testing.T) {
	clusterFile := filepath.Join("..", "..", "deploy", "examples", "replay", "hetero-512.yaml")
	inv, err := LoadInventory(clusterFile)
	if err != nil {
		t.Fatal(err)
	}
	tr := &Trace{Source: "test", Records: 1, Jobs: []Job{{ID: "one", Arrival: 0, Duration: 1000, GPUs: 1}}}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	run := map[bool]float64{}
	for _, only := range []bool{false, true} {
		r, err := Run(ctx, Config{ClusterFile: clusterFile, Inventory: inv, Trace: tr, Strategy: "topology-aware", Seed: 1,
			ReserveAfter: -1, DataDir: filepath.Join(t.TempDir(), "data"), Stall: time.Minute, Samples: 10, ComputeReference: "a100", ChargeOnly: only})
		if err != nil {
			t.Fatal(err)
		}
		run[only] = r.Jobs[0].Run
	}
	h100, _ := gpuspeed.Factor("H100", "a100")
	if math.Abs(run[false]-1000*h100) > 1e-9 {
		t.Errorf("weighed: runs %v s, want the H100's %v", run[false], 1000*h100)
	}
	if !(run[true] > run[false]) {
		t.Errorf("charged only: runs %v s, weighed %v s; want placement blind to compute to choose a slower model", run[true], run[false])
	}
}
