package optimizer

import (
	"context"
	"math"
	"strconv"
	"testing"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/internal/collective"
)

// fakeCalibrator is the calibration bucket and the replicas' watch in one:
// a push is in force at once.
type fakeCalibrator struct {
	o      *Service
	cur    *collective.Calibration
	rev    int
	pushes []*collective.Calibration
}

func (f *fakeCalibrator) InForce() (*collective.Calibration, string) {
	return f.cur, strconv.Itoa(f.rev)
}

func (f *fakeCalibrator) Push(_ context.Context, c *collective.Calibration, basedOn string) (uint64, error) {
	if _, rev := f.InForce(); rev != basedOn {
		return 0, nil
	}
	f.cur, f.rev = c, f.rev+1
	f.pushes = append(f.pushes, c)
	f.o.SetBandwidths(c.Bandwidths(nil))
	return uint64(f.rev), nil
}

// A job alone on its links that measures 80% of the predicted bus
// bandwidth step after step moves the kind of link bounding it, at most 5%
// a step, until the prediction meets the measurement; the same telemetry
// of a job that shares its uplinks with another moves nothing.
func TestOnlineCalibration(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		flood     bool
		wantMoves bool
	}{
		{"alone", false, true},
		{"sharing uplinks", true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := victimAndFlood(t, tc.flood)
			o := c.optimizer(nil)
			if err := o.Rebuild(c.ctx); err != nil {
				t.Fatal(err)
			}
			fake := &fakeCalibrator{o: o}
			o.CalibrateOnline(fake)
			o.mu.Lock()
			lj := o.live["victim"]
			if _, err := o.retune(lj); err != nil {
				t.Fatal(err)
			}
			var dp events.TunedGroup
			for _, g := range lj.tuning.Groups {
				if g.Name == "dp" {
					dp = g
				}
			}
			o.mu.Unlock()
			kind := ""
			for _, r := range lj.plan.Phases {
				if r.Phase.Name == "dp" {
					kind = r.BottleneckKind
				}
			}
			measured := 0.8 * dp.BusBWGBps
			for step := range int64(400) {
				tel := &events.RuntimeTelemetry{JobID: "victim", Step: step, StepSeconds: 1, ComputeSeconds: 0.5,
					Groups: []events.GroupTelemetry{{Group: "dp", Collective: "all_reduce", BusBWGBps: measured, Bytes: dp.Bytes}}}
				if err := o.OnTelemetry(c.ctx, events.Envelope{}, tel); err != nil {
					t.Fatal(err)
				}
			}
			if !tc.wantMoves {
				if len(fake.pushes) > 0 {
					t.Fatalf("%d moves from a job sharing its links: %+v", len(fake.pushes), fake.pushes[0].Efficiency)
				}
				return
			}
			if len(fake.pushes) == 0 {
				t.Fatalf("no move (dp bound by %s, pending %v)", kind, o.online.Pending())
			}
			prev := (*collective.Calibration)(nil).Resolved()
			for i, p := range fake.pushes {
				e := p.Resolved()
				for j, v := range []float64{e.NVLink, e.NVLS, e.PCIe, e.Net, e.EFA, e.TCP} {
					old := []float64{prev.NVLink, prev.NVLS, prev.PCIe, prev.Net, prev.EFA, prev.TCP}[j]
					if math.Abs(v/old-1) > collective.OnlineMaxStep+1e-9 {
						t.Fatalf("move %d: %s %.4f -> %.4f", i, collective.LinkKinds[j], old, v)
					}
				}
				prev = e
			}
			o.mu.Lock()
			defer o.mu.Unlock()
			if _, err := o.retune(lj); err != nil {
				t.Fatal(err)
			}
			for _, g := range lj.tuning.Groups {
				if g.Name == "dp" && math.Abs(g.BusBWGBps/measured-1) > 0.03 {
					t.Errorf("after %d moves dp is predicted at %.1f GB/s, measured %.1f (bound by %s)", len(fake.pushes), g.BusBWGBps, measured, kind)
				}
			}
			if lj.finding != events.FindingAsPredicted {
				t.Errorf("finding %s", lj.finding)
			}
			t.Logf("dp bound by %s: %d moves, last %+v", kind, len(fake.pushes), fake.pushes[len(fake.pushes)-1].Efficiency)
		})
	}
}
