package placer

import (
	"math"
	"testing"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/internal/collective"
	"github.com/toposched/toposched/internal/fixtures"
	"github.com/toposched/toposched/internal/gpuspeed"
	"github.com/toposched/toposched/internal/store"
	"github.com/toposched/toposched/internal/topology"
)

// The prediction placement publishes carries the compute correction in
// force: the T4's own factor where it has one; the A100 reference's
// divided out where only the reference is corrected; none where neither
// is, or the job gave its own T4 time.
func TestComputeByModelCorrection(t *testing.T) {
	t.Parallel()
	n := collective.BuildNode(collective.NodeSpec{Name: "t4", GPUs: 4, Model: "Tesla T4", PCIeGen: 3}).Event()
	n.GPUModel = "Tesla T4"
	snap := fixtures.MustStore(t, []fixtures.Node{{Event: n}}, nil).Snapshot()
	gpus := []store.GPUKey{{Node: "t4", Index: 0}}
	table, _ := gpuspeed.Factor("T4", "a100")
	set := func(fits ...collective.ComputeFit) *topology.Bandwidths {
		return (&collective.Calibration{Version: collective.CalibrationVersion, Name: "online", Compute: fits}).Bandwidths(nil)
	}
	job := events.JobAnalyzed{Job: events.JobSubmitted{JobID: "j", GPUs: 1, StepComputeSeconds: 1}}
	own := events.JobAnalyzed{Job: events.JobSubmitted{JobID: "k", GPUs: 1, StepComputeSeconds: 1, StepComputeSecondsByModel: map[string]float64{"T4": 4}}}
	for _, tc := range []struct {
		name    string
		job     events.JobAnalyzed
		bw      *topology.Bandwidths
		compute float64
		want    *events.ComputeCorrection
	}{
		{"no set", job, nil, table, nil},
		{"the T4 measured slower", job, set(collective.ComputeFit{Model: "T4", Factor: 1.18, Samples: 12}), 1.18 * table,
			&events.ComputeCorrection{Factor: 1.18, Samples: 12, Set: "online"}},
		{"the reference measured slower", job, set(collective.ComputeFit{Model: "A100", Factor: 1.25, Samples: 9}), table / 1.25,
			&events.ComputeCorrection{Factor: 0.8, Samples: 9, Set: "online"}},
		{"the job's own T4 time", own, set(collective.ComputeFit{Model: "T4", Factor: 1.18, Samples: 12}), 4, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &events.Prediction{Strategy: "topology-aware"}
			ComputeByModel(p, snap, tc.job, gpus, "a100", tc.bw)
			if math.Abs(p.ComputeSecondsPerStep/tc.compute-1) > 1e-9 || p.GPUModel != "Tesla T4" {
				t.Errorf("compute %v on %q, want %v on Tesla T4", p.ComputeSecondsPerStep, p.GPUModel, tc.compute)
			}
			got := p.ComputeCorrection
			switch {
			case (got == nil) != (tc.want == nil):
				t.Errorf("correction %+v, want %+v", got, tc.want)
			case got != nil && (math.Abs(got.Factor-tc.want.Factor) > 1e-12 || got.Samples != tc.want.Samples || got.Set != tc.want.Set):
				t.Errorf("correction %+v, want %+v", *got, *tc.want)
			}
		})
	}
}
