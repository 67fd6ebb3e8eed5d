package optimizer

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/events/bus"
	"github.com/toposched/toposched/internal/placer"
	"github.com/toposched/toposched/schemas"
)

// victimAndFlood places two 16-GPU jobs with blind first fit on the
// four-node cluster (n1, n3, n2, n4 in enumeration order): "victim" on n1
// and n3, "flood" on n2 and n4, both across leafA and leafB, so they share
// both leaves' uplinks.
func victimAndFlood(t *testing.T, withFlood bool) *cluster {
	c := fourNodeCluster(t, placer.StrategyBlind)
	c.submit(gpt2("victim", 16))
	if withFlood {
		c.submit(gpt2("flood", 16))
	}
	return c
}

// tuned returns the optimizer's live victim, tuned.
func tuned(t *testing.T, c *cluster) (*Service, *liveJob) {
	t.Helper()
	o := c.optimizer(nil)
	if err := o.Rebuild(c.ctx); err != nil {
		t.Fatal(err)
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	lj := o.live["victim"]
	if lj == nil {
		t.Fatal("victim not live")
	}
	ev, err := Tuning(o.store.Snapshot(), o.fabric, lj.decision, lj.spec)
	if err != nil {
		t.Fatal(err)
	}
	lj.tuning = ev
	return o, lj
}

func TestDiagnose(t *testing.T) {
	t.Parallel()
	shared := victimAndFlood(t, true)
	alone := victimAndFlood(t, false)
	shared.publish(&events.TopologyHealth{Node: "n2", Component: events.ComponentNIC, ID: "mlx5_0", Health: events.HealthUnhealthy,
		Reason: "flood's node, not victim's", ObservedAt: time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)})

	tests := []struct {
		name string
		c    *cluster
		// health is reported before the diagnosis.
		health *events.TopologyHealth
		// busbw is the dp group's measured bus bandwidth as a share of
		// the predicted; compute the compute share of a 1 s step.
		busbw, compute float64
		ranks          []events.RankTelemetry
		want           string
		wantJobs       []string
	}{
		{name: "as predicted", c: shared, busbw: 0.95, compute: 0.5, want: events.FindingAsPredicted},
		{name: "compute bound", c: shared, busbw: 0.4, compute: 0.95, want: events.FindingComputeBound},
		{name: "congestion: 40% of predicted bus bandwidth", c: shared, busbw: 0.4, compute: 0.5, want: events.FindingCongestion, wantJobs: []string{"flood"}},
		{name: "alone and slow: unexplained", c: alone, busbw: 0.4, compute: 0.5, want: events.FindingUnexplained},
		{name: "NIC affinity", c: alone, busbw: 0.4, compute: 0.5, ranks: []events.RankTelemetry{{Rank: 0, NIC: "mlx5_3"}, {Rank: 2, NIC: "mlx5_1"}},
			want: events.FindingNICAffinity},
		{name: "degraded NIC of victim's", c: alone, busbw: 0.4, compute: 0.5, want: events.FindingLinkDegraded,
			health: &events.TopologyHealth{Node: "n1", Component: events.ComponentNIC, ID: "mlx5_0", Health: events.HealthUnhealthy,
				Reason: "port down", ObservedAt: time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.health != nil {
				tt.c.publish(tt.health)
			}
			o, lj := tuned(t, tt.c)
			var dp events.TunedGroup
			for _, g := range lj.tuning.Groups {
				if g.Name == "dp" {
					dp = g
				}
			}
			tel := &events.RuntimeTelemetry{JobID: "victim", Step: 7, StepSeconds: 1, ComputeSeconds: tt.compute, Ranks: tt.ranks,
				Groups: []events.GroupTelemetry{{Group: "dp", Collective: "all_reduce", BusBWGBps: tt.busbw * dp.BusBWGBps}}}
			o.mu.Lock()
			dg := o.diagnose(lj, tel)
			o.mu.Unlock()
			t.Logf("%s: %s", dg.Finding, dg.Message)
			if dg.Finding != tt.want {
				t.Fatalf("finding %s, want %s: %+v", dg.Finding, tt.want, dg.Evidence)
			}
			if got := dg.Evidence.NeighbourJobs; strings.Join(got, ",") != strings.Join(tt.wantJobs, ",") {
				t.Errorf("neighbours %v, want %v", got, tt.wantJobs)
			}
			if err := schemas.Validate(string(events.NameRuntimeDiagnosis), mustJSON(t, withTime(dg))); err != nil {
				t.Errorf("diagnosis breaks its schema: %v", err)
			}
			switch tt.want {
			case events.FindingCongestion:
				if len(dg.Evidence.SharedLinks) != 2 || dg.Evidence.ExplainedSeconds <= dg.Evidence.PredictedCommSeconds {
					t.Errorf("evidence %+v", dg.Evidence)
				}
				if r := dg.Evidence.Groups[0].Ratio; r < 2.4 || r > 2.6 {
					t.Errorf("dp ratio %.2f, want 2.5", r)
				}
			case events.FindingLinkDegraded:
				if len(dg.Evidence.Health) != 1 || dg.Evidence.Health[0].Node != "n1" {
					t.Errorf("health evidence %+v", dg.Evidence.Health)
				}
			case events.FindingNICAffinity:
				if len(dg.Evidence.NICs) != 1 || dg.Evidence.NICs[0].Rank != 0 || dg.Evidence.NICs[0].Recommended != "mlx5_0" {
					t.Errorf("NIC evidence %+v", dg.Evidence.NICs)
				}
			}
		})
	}
}

func withTime(dg *events.RuntimeDiagnosis) *events.RuntimeDiagnosis {
	c := *dg
	c.DiagnosedAt = time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	return &c
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Through NATS: a job's telemetry is diagnosed, the same finding is not
// published twice, a change is; malformed telemetry goes to the dead
// letters with its reason.
func TestTelemetryThroughNATS(t *testing.T) {
	t.Parallel()
	c := victimAndFlood(t, true)
	c.running()
	diags := follow[events.RuntimeDiagnosis](c, events.NameRuntimeDiagnosis)
	o := c.optimizer(nil) // to read the prediction the running optimizer has
	if err := o.Rebuild(c.ctx); err != nil {
		t.Fatal(err)
	}
	ev, err := Tuning(o.store.Snapshot(), o.fabric, o.live["victim"].decision, o.live["victim"].spec)
	if err != nil {
		t.Fatal(err)
	}
	busbw := ev.Groups[0].BusBWGBps
	tel := func(step int64, share float64) {
		c.publish(&events.RuntimeTelemetry{JobID: "victim", Step: step, StepSeconds: 1, ComputeSeconds: 0.5,
			Groups: []events.GroupTelemetry{{Group: "dp", BusBWGBps: share * busbw}}})
	}
	tel(1, 0.4)
	tel(2, 0.41) // the same finding: nothing published
	tel(3, 1.0)
	first := next(c, diags, forJob[*events.RuntimeDiagnosis]("victim"))
	second := next(c, diags, forJob[*events.RuntimeDiagnosis]("victim"))
	if first.Finding != events.FindingCongestion || first.Step != 1 || first.Evidence.NeighbourJobs[0] != "flood" {
		t.Errorf("first %s at step %d: %+v", first.Finding, first.Step, first.Evidence)
	}
	if second.Finding != events.FindingAsPredicted || second.Step != 3 || second.Previous != events.FindingCongestion {
		t.Errorf("second %s at step %d (previous %s), want as_predicted at step 3", second.Finding, second.Step, second.Previous)
	}

	// Compute longer than the step: schema-valid, but refused.
	dead := make(chan bus.Record, 4)
	ready := make(chan struct{})
	go func() {
		_ = c.b.Follow(c.ctx, "dlq", []string{c.b.Subjects.DeadLetter()}, ready, func(r bus.Record) error {
			dead <- r
			return bus.ErrStop
		})
	}()
	<-ready
	bad := []byte(`{"job_id":"victim","step":4,"step_seconds":1,"compute_seconds":2}`)
	msg := nats.NewMsg(c.b.Subjects.Of(events.NameRuntimeTelemetry))
	msg.Data = bad
	if _, err := c.b.JetStream().PublishMsg(c.ctx, msg); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-dead:
		if string(r.Body) != string(bad) || r.Name != events.NameRuntimeTelemetry {
			t.Errorf("dead letter %s %q", r.Name, r.Body)
		}
	case <-c.ctx.Done():
		t.Fatal("no dead letter")
	}
}

// Telemetry that passes its schema but cannot be true is refused with
// every reason; so is one beyond the bounds.
func TestParseTelemetry(t *testing.T) {
	t.Parallel()
	many := `{"job_id":"j","step":1,"step_seconds":1,"compute_seconds":0.5,"groups":[` +
		strings.TrimSuffix(strings.Repeat(`{"group":"g","seconds":0.1},`, 65), ",") + `]}`
	tests := []struct {
		name, body string
		want       string // "" when accepted; else a fragment of the error
	}{
		{"minimal", `{"job_id":"j","step":1,"step_seconds":1,"compute_seconds":0.5}`, ""},
		{"busbw only", `{"job_id":"j","step":1,"step_seconds":1,"compute_seconds":0.5,"groups":[{"group":"dp","busbw_gbps":12}]}`, ""},
		{"compute longer than step", `{"job_id":"j","step":1,"step_seconds":1,"compute_seconds":2}`, "longer than step_seconds"},
		{"group twice", `{"job_id":"j","step":1,"step_seconds":1,"compute_seconds":0.5,"groups":[{"group":"dp","seconds":0.1},{"group":"dp","seconds":0.2}]}`, "given twice"},
		{"group longer than step", `{"job_id":"j","step":1,"step_seconds":1,"compute_seconds":0.5,"groups":[{"group":"dp","seconds":3}]}`, "longer than the step"},
		{"rank twice", `{"job_id":"j","step":1,"step_seconds":1,"compute_seconds":0.5,"ranks":[{"rank":1},{"rank":1}]}`, "rank 1 given twice"},
		{"65 groups", many, "maxItems"},
		{"no figures", `{"job_id":"j","step":1,"step_seconds":1,"compute_seconds":0.5,"groups":[{"group":"dp"}]}`, "missing property"},
		{"not json", `{"job_id":`, "json"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := ParseTelemetry([]byte(tt.body))
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Fatalf("error %v, want one saying %q", err, tt.want)
			}
		})
	}
}

func FuzzParseTelemetry(f *testing.F) {
	for _, s := range []string{
		`{"job_id":"j","step":1,"step_seconds":1,"compute_seconds":0.5}`,
		`{"job_id":"j","step":1,"step_seconds":1,"compute_seconds":0.5,"groups":[{"group":"dp","busbw_gbps":12,"seconds":0.2}],"ranks":[{"rank":0,"nic":"mlx5_0"}]}`,
		`{"job_id":"j","step":1,"step_seconds":1e-300,"compute_seconds":1e-300}`,
		`{"job_id":"j","step":1,"step_seconds":1,"compute_seconds":2}`,
		`{"job_id":"j","step":9223372036854775807,"step_seconds":86400,"compute_seconds":0}`,
		`null`, `[]`, `{}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		tel, err := ParseTelemetry(body)
		if err != nil {
			var ve *schemas.ValidationError
			if !errors.As(err, &ve) && !errors.Is(err, ErrTelemetry) && !errors.Is(err, bus.ErrDecode) {
				t.Fatalf("unexpected error type %T: %v", err, err)
			}
			return
		}
		if len(tel.Groups) > events.MaxTelemetryGroups || len(tel.Ranks) > events.MaxTelemetryRanks ||
			tel.ComputeSeconds > tel.StepSeconds*1.001 || tel.StepSeconds <= 0 {
			t.Fatalf("accepted %+v", tel)
		}
	})
}

// A job spread over two leaves with nothing diagnosed gets a
// better_placement proposal when GPUs under one leaf free up.
func TestBetterPlacementWhenGPUsFree(t *testing.T) {
	t.Parallel()
	c := fourNodeCluster(t, placer.StrategyBlind)
	// Communication-bound: the move saves more than 5% of a step.
	victim, flood := gpt2("victim", 16), gpt2("flood", 16)
	victim.StepComputeSeconds = 0.01
	c.submit(victim)
	c.submit(flood)
	o := c.running()
	props := follow[events.PlacementMigration](c, events.NamePlacementMigration)
	tunings := follow[events.RuntimeTuning](c, events.NameRuntimeTuning)
	o.mu.Lock()
	for o.live["victim"] == nil || o.live["victim"].tuning == nil || o.live["flood"] == nil || o.live["flood"].tuning == nil {
		o.mu.Unlock()
		next(c, tunings, func(*events.RuntimeTuning) bool { return true })
		o.mu.Lock()
	}
	o.mu.Unlock()
	c.finish("flood")
	var p *events.PlacementMigration
	select {
	case p = <-props:
	case <-c.ctx.Done():
		t.Fatal("no proposal")
	}
	leaves := map[string]bool{}
	for _, np := range p.Nodes {
		leaves[map[string]string{"n1": "leafA", "n2": "leafA", "n3": "leafB", "n4": "leafB"}[np.Node]] = true
	}
	if p.JobID != "victim" || p.Reason != events.MigrationBetterPlacement || len(leaves) != 1 || p.GainSecondsPerStep <= 0 || p.FindingID != "" {
		t.Fatalf("proposal %+v", p)
	}
	t.Logf("proposal: %s", p.Message)
}

// With NoMigrations (as in a replay) the same release proposes nothing;
// the handlers are driven by hand, so the stream is read after they have
// returned.
func TestNoMigrations(t *testing.T) {
	t.Parallel()
	for _, off := range []bool{false, true} {
		t.Run(fmt.Sprintf("NoMigrations=%v", off), func(t *testing.T) {
			t.Parallel()
			c := fourNodeCluster(t, placer.StrategyBlind)
			victim, flood := gpt2("victim", 16), gpt2("flood", 16)
			victim.StepComputeSeconds = 0.01
			_, dv := c.submit(victim)
			_, df := c.submit(flood)
			o, err := New(Config{NoMigrations: off}, Deps{Publish: c.b, Read: c.b, Consume: c.b, Subjects: c.b.Subjects})
			if err != nil {
				t.Fatal(err)
			}
			for _, d := range []*events.PlacementDecided{dv, df} {
				if err := o.OnDecided(c.ctx, events.Envelope{ID: "d-" + d.JobID}, d); err != nil {
					t.Fatal(err)
				}
			}
			c.finish("flood")
			if err := o.OnReleased(c.ctx, events.Envelope{}, &events.PlacementReleased{JobID: "flood", Status: events.StatusSucceeded}); err != nil {
				t.Fatal(err)
			}
			n := 0
			if err := c.b.Replay(c.ctx, events.DomainPlacement, []string{c.b.Subjects.Of(events.NamePlacementMigration)}, func(bus.Record) error {
				n++
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			if want := map[bool]int{false: 1, true: 0}[off]; n != want {
				t.Fatalf("%d proposals, want %d", n, want)
			}
		})
	}
}
