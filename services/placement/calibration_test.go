package placement_test

import (
	"math"
	"testing"
	"time"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/events/eventstest"
	"github.com/toposched/toposched/internal/fixtures"
	"github.com/toposched/toposched/internal/store"
	"github.com/toposched/toposched/internal/topology"
	"github.com/toposched/toposched/services/placement"
)

// A calibration's efficiencies are the ones placement predicts with: on
// a PCIe node whose links achieve half the documented share, the
// decision's predicted communication takes twice as long.
func TestPlacementPredictsWithCalibration(t *testing.T) {
	t.Parallel()
	predicted := func(bw *topology.Bandwidths) float64 {
		srv := eventstest.Server(t)
		b := eventstest.Bus(t, srv.ClientURL(), "test")
		ctx := eventstest.Context(t, 30*time.Second)
		node := fixtures.PathsNode("p", "L40S", 4, func(int, int) string { return "PHB" })
		if _, err := b.Publish(ctx, &node); err != nil {
			t.Fatal(err)
		}
		s := placement.NewOnBus(t, b, placement.Config{Bandwidths: bw})
		job := fixtures.SyntheticJob("j", 4, 1, 1)
		if err := s.OnAnalyzed(ctx, events.Envelope{ID: "e"}, &job); err != nil {
			t.Fatal(err)
		}
		j, _ := s.Store().Snapshot().Job("j")
		if j.State != store.JobPlaced || j.Decision.Prediction == nil {
			t.Fatalf("job %+v", j)
		}
		return j.Decision.Prediction.CommSecondsPerStep
	}
	def := predicted(nil)
	half := topology.DefaultBandwidths()
	half.Efficiency.PCIe = 0.4 // the documented share is 0.8
	cal := predicted(half)
	if r := cal / def; math.Abs(r-2) > 0.05 {
		t.Fatalf("predicted %.4f s calibrated, %.4f s by default: ratio %.3f, want 2", cal, def, r)
	}
}
