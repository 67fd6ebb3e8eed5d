package load

import (
	"context"
	"fmt"
	"log/slog"
	"regexp"
	"strings"
	"testing"

	"github.com/toposched/toposched/internal/fixtures"
	"github.com/toposched/toposched/internal/placer"
	"github.com/toposched/toposched/policies"
)

// The fill holds what it was asked to, in whole jobs, and the fabric holds
// together (NewFabric accepted it; every node has a leaf).
func TestBuildCluster(t *testing.T) {
	t.Parallel()
	c, err := BuildCluster(1024, "dgx-h100", 0.5, 1)
	if err != nil {
		t.Fatal(err)
	}
	snap := c.Store.Snapshot()
	if total, _ := snap.Capacity(""); total != 1024 {
		t.Errorf("capacity %d, want 1024", total)
	}
	if free := snap.FreeCount(); free != 1024-c.Held || c.Held != 512 {
		t.Errorf("held %d, free %d; want 512 held", c.Held, free)
	}
	for _, n := range c.Nodes {
		if len(snap.FabricDomains(n)) == 0 {
			t.Fatalf("node %s has no fabric domains", n)
		}
	}
	again, err := BuildCluster(1024, "dgx-h100", 0.5, 1)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range c.Nodes {
		a, b := snap.FreeGPUs(n), again.Store.Snapshot().FreeGPUs(n)
		if fmt.Sprint(a) != fmt.Sprint(b) {
			t.Fatalf("node %s: fill is not seeded: %v then %v", n, a, b)
		}
	}
}

// The cluster file the e2e mode writes parses to the same fabric.
func TestClusterYAML(t *testing.T) {
	t.Parallel()
	y := ClusterYAML(NodeNames(40), "dgx-h100")
	for _, want := range []string{"{name: node-00039, model: dgx-h100}", "rail: 7", "tier: core"} {
		if !strings.Contains(y, want) {
			t.Errorf("cluster file lacks %q", want)
		}
	}
}

// BenchmarkPlan is one planner decision on a half-full 10k-GPU cluster
// with the shipped policies, as toposched load times it.
func BenchmarkPlan(b *testing.B) {
	c, err := BuildCluster(10000, "dgx-h100", 0.5, 1)
	if err != nil {
		b.Fatal(err)
	}
	set, err := policies.Compile(policies.Default, "default")
	if err != nil {
		b.Fatal(err)
	}
	snap := c.Store.Snapshot()
	for _, n := range []int{1, 8, 64} {
		for _, pol := range []bool{false, true} {
			b.Run(fmt.Sprintf("job=%d/policies=%v", n, pol), func(b *testing.B) {
				p := &placer.Planner{Fabric: c.Fabric, Log: slog.New(slog.DiscardHandler)}
				if pol {
					p.Policies = set
				}
				job := fixtures.SyntheticJob("j", n, min(n, 8), 1)
				b.ReportAllocs()
				for b.Loop() {
					if _, err := p.Plan(context.Background(), snap, job, placer.PlanOptions{}); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// The end-to-end run prints its decision rate beside the raw JetStream
// publish rate of the same server, and as a share of it; every job is
// decided whatever the submission window (one at a time, fewer than the
// jobs, more than the jobs).
func TestE2EPrintsRawRate(t *testing.T) {
	t.Parallel()
	for _, window := range []int{1, 4, 0} {
		t.Run(fmt.Sprintf("window=%d", window), func(t *testing.T) {
			t.Parallel()
			var out strings.Builder
			err := Run(context.Background(), &out, Config{E2E: 20, E2EGPUs: 256, E2EOnly: true, E2EWindow: window, Log: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatal(err)
			}
			shown := window
			if shown == 0 {
				shown = AsyncWindow
			}
			for _, want := range []string{"of raw async publish", "alloc/decision", "cpu/decision", "raw JetStream publish on the same server", "/s async", "/s sync",
				fmt.Sprintf("awaiting acknowledgement at once: %d\n", shown)} {
				if !strings.Contains(out.String(), want) {
					t.Errorf("output lacks %q:\n%s", want, out.String())
				}
			}
			// The table's first cell: every job decided, none other.
			if !regexp.MustCompile(`(?m)^20 +0 `).MatchString(out.String()) {
				t.Errorf("not every job decided:\n%s", out.String())
			}
			// The optimizer tunes every decision (one GPU: an empty
			// tuning), after the window if need be, and the run waits
			// for it.
			if !regexp.MustCompile(`tuning \(the optimizer, off the decision path\): [0-9]+ of 20 decisions tuned when the last was decided, all [0-9.]+ s later; cpu/decision with every decision tuned: `).MatchString(out.String()) {
				t.Errorf("no tuning line, or not every decision tuned:\n%s", out.String())
			}
			// CPU per decision and the collector's share of it, where the
			// system tells the process's CPU time.
			if _, ok := processCPU(); ok && !regexp.MustCompile(`(?m)^20 .* KB +[0-9.]+ ms +[0-9]+% +[0-9.]+%$`).MatchString(out.String()) {
				t.Errorf("no CPU per decision and collector's share:\n%s", out.String())
			}
		})
	}
}
