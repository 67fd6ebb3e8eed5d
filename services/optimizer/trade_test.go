package optimizer

import (
	"strings"
	"testing"
	"time"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/events/bus"
	"github.com/toposched/toposched/internal/collective"
	"github.com/toposched/toposched/internal/placer"
	"github.com/toposched/toposched/internal/topology"
)

// pcieBox is an 8-GPU A100 PCIe server whose GPU pairs cross the
// inter-socket link (SYS): a slow box next to a100x4's NVSwitch.
func pcieBox(name string, position int) events.TopologyNode {
	n := collective.BuildNode(collective.NodeSpec{Name: name, GPUs: 8, Model: "A100-SXM4-80GB", PCIeGen: 3, NICs: 1, NICGbps: 100,
		PCIePath: func(a, b int) topology.Class { return topology.SYS }})
	ev := n.Event()
	ev.Position = position
	ev.GPUModel = "A100-SXM4-80GB"
	return ev
}

// A job a fit trade sent to a slow box, keeping an NVSwitch node whole,
// gets the move back proposed once the forecast's horizon has passed with
// the node still unused; not before, and not once the node is taken.
// The handlers are driven by hand, on a clock the test sets.
func TestUnpaidTradeProposed(t *testing.T) {
	t.Parallel()
	decided := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name  string
		after time.Duration // since the decision, when GPUs are freed
		taken bool          // a job takes the kept node meanwhile
		want  bool
	}{
		{"horizon passed, node unused", 2 * time.Hour, false, true},
		{"within the horizon", 30 * time.Minute, false, false},
		{"horizon passed, node taken", 2 * time.Hour, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := newCluster(t, placer.StrategyBlind, []events.TopologyNode{pcieBox("p1", 0), a100x4("n1", 1)}, nil)
			// Communication-bound, so the move saves more than 5% of a step.
			small := gpt2("small", 2)
			small.StepComputeSeconds = 0.01
			_, ds := c.submit(small) // blind: the slow box's first pair
			if ds.Ranks[0].Node != "p1" {
				t.Fatalf("small placed on %s, want p1", ds.Ranks[0].Node)
			}
			// As topology-aware's trade would have explained it.
			ds.DecidedAt = decided
			ds.Explanation = &events.Explanation{FitTrade: &events.FitTrade{Made: true, Node: "node:n1", Tighter: "node:p1", NodeFree: 8, MinGPUs: 7,
				StepSeconds: 0.05, TighterStepSeconds: 0.06, HorizonSeconds: 3600, Probability: 0.6}}
			decisions := []*events.PlacementDecided{ds}
			_, dt := c.submit(events.JobSubmitted{JobID: "short", GPUs: 1})
			decisions = append(decisions, dt)
			if tc.taken {
				_, db := c.submit(events.JobSubmitted{JobID: "big", GPUs: 8, GPUsPerNode: 8}) // only n1 has 8 free
				if db.Ranks[0].Node != "n1" {
					t.Fatalf("big placed on %s, want n1", db.Ranks[0].Node)
				}
				decisions = append(decisions, db)
			}
			now := decided.Add(tc.after)
			o, err := New(Config{}, Deps{Publish: c.b, Read: c.b, Consume: c.b, Subjects: c.b.Subjects, Now: func() time.Time { return now }})
			if err != nil {
				t.Fatal(err)
			}
			for _, d := range decisions {
				if err := o.OnDecided(c.ctx, events.Envelope{ID: "d-" + d.JobID}, d); err != nil {
					t.Fatal(err)
				}
			}
			c.finish("short")
			if err := o.OnReleased(c.ctx, events.Envelope{ID: "r-short"}, &events.PlacementReleased{JobID: "short", Status: events.StatusSucceeded}); err != nil {
				t.Fatal(err)
			}
			var props []*events.PlacementMigration
			if err := c.b.Replay(c.ctx, events.DomainPlacement, []string{c.b.Subjects.Of(events.NamePlacementMigration)}, func(r bus.Record) error {
				m := new(events.PlacementMigration)
				if err := bus.Decode(r.Name, r.Body, m); err != nil {
					return err
				}
				props = append(props, m)
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			if !tc.want {
				if len(props) != 0 {
					t.Fatalf("proposals %+v, want none", props)
				}
				return
			}
			if len(props) != 1 {
				t.Fatalf("%d proposals, want 1", len(props))
			}
			p := props[0]
			if p.JobID != "small" || p.Reason != events.MigrationBetterPlacement || len(p.Nodes) != 1 || p.Nodes[0].Node != "n1" ||
				p.GainSecondsPerStep <= 0 || !strings.Contains(p.Message, "n1 was kept whole") {
				t.Fatalf("proposal %+v", p)
			}
			t.Logf("proposal: %s", p.Message)
		})
	}
}
