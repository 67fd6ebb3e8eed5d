package operator

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/events/bus"
	"github.com/toposched/toposched/events/eventstest"
	"github.com/toposched/toposched/internal/calibration"
	"github.com/toposched/toposched/internal/collective"
	"github.com/toposched/toposched/internal/topology"
	"github.com/toposched/toposched/services/placement"
)

// The online calibration's moves go through the bucket: a move over the
// set in force is applied by every service; a move computed before an
// operator's push is refused (ErrMoved) and the push stays; a move over a
// refused value replaces it.
func TestOnlineMovesThroughTheBucket(t *testing.T) {
	srv := eventstest.Server(t)
	b := eventstest.Bus(t, srv.ClientURL(), "test")
	ctx := eventstest.Context(t, 60*time.Second)
	base := &collective.Calibration{Version: collective.CalibrationVersion, Name: "file"}
	base.Efficiency.PCIe = 0.6
	const baseRev = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	op, stop, err := StartOn(t, ctx, b, Config{Services: []string{Placement, Optimizer}, Replica: "r1", OnlineCalibration: true,
		Calibration: base, CalibrationRevision: baseRev}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := stop(); err != nil {
			t.Error(err)
		}
	}()
	answers := calibrationAnswers(ctx, b)
	waitFor := func(rev string) *events.CalibrationApplied {
		t.Helper()
		for {
			select {
			case v := <-answers:
				if e, ok := v.(*events.CalibrationApplied); ok && e.Revision == rev {
					return e
				}
			case <-ctx.Done():
				t.Fatalf("no policy.calibration_applied of %s", rev)
			}
		}
	}
	cl := op.calibration
	// The start-up announcement came before the follow began.
	var start *events.CalibrationApplied
	err = b.Replay(ctx, events.DomainPolicy, []string{b.Subjects.Of(events.NameCalibrationApplied)}, func(r bus.Record) error {
		start = new(events.CalibrationApplied)
		return events.DecodeJSON(r.Body, start)
	})
	if err != nil || start == nil || start.Revision != baseRev || start.Source != events.CalibrationSourceFile || start.Efficiency.PCIe != 0.6 {
		t.Fatalf("at start %+v %v", start, err)
	}

	move := &collective.Calibration{Version: collective.CalibrationVersion, Name: "online", Efficiency: base.Efficiency}
	move.Efficiency.PCIe = 0.63
	_, rev := cl.InForce()
	if _, err := cl.Push(ctx, move, rev); err != nil {
		t.Fatal(err)
	}
	data, _ := calibration.Encode(move)
	got := waitFor(calibration.Revision(data))
	if got.Source != events.CalibrationSourceKV || got.Previous != rev || len(got.Services) != 2 {
		t.Errorf("applied %+v", got)
	}
	if bw := op.PlacementService().Bandwidths(); bw == nil || bw.Efficiency.PCIe != 0.63 {
		t.Errorf("placement predicts with %+v", bw)
	}
	if bw := op.OptimizerService().Bandwidths(); bw == nil || bw.Efficiency.PCIe != 0.63 {
		t.Errorf("optimizer predicts with %+v", bw)
	}

	// An operator pushes while a move is being worked out from the set
	// before it.
	_, stale := cl.InForce()
	kv, err := calibration.OpenKV(ctx, b.JetStream(), b.Subjects.Prefix)
	if err != nil {
		t.Fatal(err)
	}
	pushed := []byte(`{"version": 1, "name": "lab", "efficiency": {"pcie": 0.5}, "models": {"A100-SXM4-80GB": {"nvlink": 0.6}}}`)
	if _, _, err := calibration.Push(ctx, kv, "lab.json", pushed); err != nil {
		t.Fatal(err)
	}
	if got := waitFor(calibration.Revision(pushed)); got.Models["A100-SXM4-80GB"].NVLink != 0.6 || got.Models["A100-SXM4-80GB"].PCIe != 0.5 ||
		got.Efficiency.NVLink != collective.EffNVLink {
		t.Errorf("applied %+v", got)
	}
	if _, err := cl.Push(ctx, move, stale); !errors.Is(err, calibration.ErrMoved) {
		t.Fatalf("a move over a set no longer in force: %v, want ErrMoved", err)
	}
	if bw := op.PlacementService().Bandwidths(); bw.Efficiency.PCIe != 0.5 {
		t.Errorf("the push did not stay: %+v", bw.Efficiency)
	}

	// A refused value in the bucket: the push stays in force, and the
	// next move replaces the refused value.
	badRev, err := kv.Put(ctx, calibration.KVKey, []byte("{\"version\": 1,"))
	if err != nil {
		t.Fatal(err)
	}
	for refused := false; !refused; {
		select {
		case v := <-answers:
			if e, ok := v.(*events.CalibrationRejected); ok && e.KVRevision == badRev {
				refused = true
				if e.InForce != calibration.Revision(pushed) || e.Errors[0].Line != 1 {
					t.Errorf("rejected %+v", e)
				}
			}
		case <-ctx.Done():
			t.Fatal("no policy.calibration_rejected")
		}
	}
	if _, rev = cl.InForce(); rev != calibration.Revision(pushed) {
		t.Fatalf("in force %s after a refused value", rev)
	}
	move.Efficiency.PCIe = 0.52
	kvRev, err := cl.Push(ctx, move, rev)
	if err != nil {
		t.Fatal(err)
	}
	data, _ = calibration.Encode(move)
	if got := waitFor(calibration.Revision(data)); got.KVRevision != kvRev {
		t.Errorf("applied %+v, want kv revision %d", got, kvRev)
	}
}

// A set's compute factors (the online compute calibration's) go through
// the bucket to every service's cost model, by the speed table's name of
// the model; a set with a factor outside its bounds is refused naming the
// field, and the set in force stays.
func TestComputeFactorsThroughTheBucket(t *testing.T) {
	srv := eventstest.Server(t)
	b := eventstest.Bus(t, srv.ClientURL(), "test")
	ctx := eventstest.Context(t, 60*time.Second)
	op, stop, err := StartOn(t, ctx, b, Config{Services: []string{Placement, Optimizer}, Replica: "r1", OnlineCalibration: true,
		Placement: placement.Config{ComputeReference: "a100"}}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := stop(); err != nil {
			t.Error(err)
		}
	}()
	answers := calibrationAnswers(ctx, b)
	cl := op.calibration
	move := &collective.Calibration{Version: collective.CalibrationVersion, Name: "online",
		Compute: []collective.ComputeFit{{Model: "T4", Factor: 1.18, Samples: 12, Ratio: 1.18}}}
	_, rev := cl.InForce()
	kvRev, err := cl.Push(ctx, move, rev)
	if err != nil {
		t.Fatal(err)
	}
	for applied := false; !applied; {
		select {
		case v := <-answers:
			e, ok := v.(*events.CalibrationApplied)
			applied = ok && e.KVRevision == kvRev
			if applied && (len(e.Compute) != 1 || e.Compute["T4"] != 1.18) {
				t.Errorf("policy.calibration_applied carries compute %v, want T4 1.18", e.Compute)
			}
		case <-ctx.Done():
			t.Fatal("no policy.calibration_applied of the move")
		}
	}
	for name, bw := range map[string]*topology.Bandwidths{"placement": op.PlacementService().Bandwidths(), "optimizer": op.OptimizerService().Bandwidths()} {
		if c, ok := bw.ComputeOf("T4"); !ok || c.Factor != 1.18 || c.Samples != 12 || c.Set != "online" {
			t.Errorf("%s's T4 correction %+v, %v", name, c, ok)
		}
	}

	kv, err := calibration.OpenKV(ctx, b.JetStream(), b.Subjects.Prefix)
	if err != nil {
		t.Fatal(err)
	}
	bad := []byte("{\"version\": 1, \"efficiency\": {},\n \"compute\": [\n  {\"model\": \"T4\", \"factor\": 9, \"samples\": 12, \"ratio\": 9}]}")
	badRev, err := kv.Put(ctx, calibration.KVKey, bad)
	if err != nil {
		t.Fatal(err)
	}
	for refused := false; !refused; {
		select {
		case v := <-answers:
			e, ok := v.(*events.CalibrationRejected)
			if !ok || e.KVRevision != badRev {
				continue
			}
			refused = true
			if len(e.Errors) != 1 || e.Errors[0].Field != "compute[0].factor" || e.Errors[0].Line != 3 {
				t.Errorf("rejected %+v", e.Errors)
			}
		case <-ctx.Done():
			t.Fatal("no policy.calibration_rejected")
		}
	}
	if c, ok := op.PlacementService().Bandwidths().ComputeOf("T4"); !ok || c.Factor != 1.18 {
		t.Errorf("after a refused set placement's T4 correction is %+v, %v; want the set in force's", c, ok)
	}
}

// calibrationAnswers follows the replicas' policy.calibration_applied and
// policy.calibration_rejected from now on, decoded.
func calibrationAnswers(ctx context.Context, b *bus.Bus) <-chan any {
	answers := make(chan any, 16)
	ready := make(chan struct{})
	go func() {
		_ = b.Follow(ctx, events.DomainPolicy, []string{b.Subjects.Of(events.NameCalibrationApplied), b.Subjects.Of(events.NameCalibrationRejected)},
			ready, func(r bus.Record) error {
				v := r.Name.New()
				if events.DecodeJSON(r.Body, v) == nil {
					answers <- v
				}
				return nil
			})
	}()
	<-ready
	return answers
}
