package placer

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/internal/fixtures"
	"github.com/toposched/toposched/internal/pattern"
	"github.com/toposched/toposched/internal/placer/outcome"
)

// compactJob is a 16-GPU Megatron job, TP 8: on two whole DGX nodes its
// TP groups stay on NVSwitch; on the leftovers of four nodes they cross
// the network.
func compactJob(model bool) events.JobSubmitted {
	j := events.JobSubmitted{JobID: "big", GPUs: 16, Strategy: events.StrategyMegatron,
		Parallelism: &events.Parallelism{TP: 8, PP: 1, DP: 2}}
	if model {
		j.Model = &events.Model{Parameters: 7_000_000_000, Layers: 32, HiddenSize: 4096, Heads: 32,
			SeqLen: 2048, MicroBatchSize: 1, GlobalBatchSize: 16, Dtype: events.DtypeBF16}
	}
	return j
}

func TestCompactWaitsForACompactPlacement(t *testing.T) {
	t.Parallel()
	held := func(r *rig) {
		for i := range 8 { // 16 free GPUs, 2 a node
			r.hold(fmt.Sprintf("j%d", i), fmt.Sprintf("n%d", i), 0, 1, 2, 3, 4, 5)
		}
	}
	for _, tc := range []struct {
		name    string
		setup   func(r *rig)
		compact bool
		model   bool
		res     *Reservation
		want    outcome.Verdict
	}{
		{name: "off: placed on the leftovers", setup: held, model: true, want: outcome.Placed},
		{name: "on: waits for a compact placement", setup: held, compact: true, model: true, want: outcome.Wait},
		{name: "on, two whole nodes free", setup: func(r *rig) {
			for i := 2; i < 8; i++ {
				r.hold(fmt.Sprintf("j%d", i), fmt.Sprintf("n%d", i), 0, 1, 2, 3, 4, 5)
			}
		}, compact: true, model: true, want: outcome.Placed},
		{name: "on, compute unknown: placed as before", setup: held, compact: true, want: outcome.Placed},
		{name: "on, the reserved head whose nodes hold it now", setup: held, compact: true, model: true,
			res:  &Reservation{JobID: "big", Since: time.Unix(0, 0), Nodes: map[string]bool{"n0": true, "n1": true, "n2": true, "n3": true, "n4": true, "n5": true, "n6": true, "n7": true}},
			want: outcome.Placed},
		{name: "on, the reserved head whose nodes are still busy", setup: held, compact: true, model: true,
			res:  &Reservation{JobID: "big", Since: time.Unix(0, 0), Nodes: map[string]bool{"n0": true, "n1": true}},
			want: outcome.Wait},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := newRig(t, 8, nil)
			tc.setup(r)
			p := &Planner{Reservation: tc.res}
			if tc.compact {
				p.Compact = &Compact{MaxStretch: DefaultMaxStretch, Ideal: (&Ideals{Store: r.st, Fabric: r.fabric}).Comm}
			}
			got := r.plan(p, compactJob(tc.model))
			if got.Verdict != tc.want {
				t.Fatalf("%v on %v (%v), want %v", got.Verdict, nodesOf(got.GPUs), got.Reasons, tc.want)
			}
			if got.Verdict == outcome.Wait {
				if codes(got.Reasons) != CodeCompactAwaited || got.Reasons[0].Field != "gpus" || !strings.Contains(got.Reasons[0].Message, "spans 8 nodes") {
					t.Errorf("reasons %+v, want one %s naming the 8 nodes", got.Reasons, CodeCompactAwaited)
				}
				if len(got.Counterfactuals) != 0 {
					t.Errorf("counterfactuals %+v: the job fits now, no job's end is awaited", got.Counterfactuals)
				}
			}
		})
	}
}

// The ideal is worked out on the cluster as though nothing ran, and again
// when the topology changes.
func TestIdeals(t *testing.T) {
	t.Parallel()
	r := newRig(t, 2, nil)
	r.hold("a", "n0", 0, 1, 2)
	r.hold("b", "n1", 7)
	empty, err := r.st.Emptied()
	if err != nil {
		t.Fatal(err)
	}
	if got := empty.Snapshot().FreeCount(); got != 16 {
		t.Errorf("emptied fork: %d free, want 16", got)
	}
	if got := r.st.Snapshot().FreeCount(); got != 12 {
		t.Errorf("store after the fork: %d free, want 12 (unchanged)", got)
	}
	if v := empty.Snapshot().TopologyVersion(); v != r.st.Snapshot().TopologyVersion() || v == 0 {
		t.Errorf("topology version %d, store's %d: want the same, not 0", v, r.st.Snapshot().TopologyVersion())
	}

	a := mustAnalyze(t, compactJob(true))
	ideals := &Ideals{Store: r.st, Fabric: r.fabric}
	whole := ideals.Comm(a) // two whole nodes, though n0 and n1 are busy
	if math.IsNaN(whole) || whole <= 0 {
		t.Fatalf("ideal comm %v, want a time", whole)
	}
	both := map[string]bool{"n0": true, "n1": true}
	if on := ideals.CommOn(a, both); on != whole {
		t.Errorf("comm on n0 and n1 emptied: %v, want the ideal's %v", on, whole)
	}
	if on := ideals.CommOn(a, map[string]bool{"n0": true}); !math.IsNaN(on) {
		t.Errorf("comm on n0 alone: %v, want NaN (8 GPUs cannot hold 16)", on)
	}
	c := &Compact{MaxStretch: DefaultMaxStretch, Ideal: ideals.Comm, IdealOn: ideals.CommOn}
	if !c.Applies(a) || (&Compact{MaxStretch: DefaultMaxStretch, Ideal: ideals.Comm}).Applies(mustAnalyze(t, compactJob(false))) {
		t.Error("Applies: want true for a job with a model size, false without one")
	}
	if st := c.StretchOn(a, both); st != 1 {
		t.Errorf("stretch on the ideal's nodes: %v, want 1", st)
	}
	if st := c.StretchOn(a, map[string]bool{"n0": true}); !math.IsInf(st, 1) {
		t.Errorf("stretch on nodes that cannot hold the job: %v, want +Inf", st)
	}
	// A GPU of n1 fails: 15 healthy GPUs cannot hold the job even empty.
	if err := r.st.SetHealth(events.TopologyHealth{Node: "n1", Component: events.ComponentGPU, ID: "0", Health: "failed"}); err != nil {
		t.Fatal(err)
	}
	if got := ideals.Comm(a); !math.IsNaN(got) {
		t.Errorf("ideal after a GPU failed: %v, want NaN (recomputed on the new topology)", got)
	}
}

func mustAnalyze(t *testing.T, sub events.JobSubmitted) events.JobAnalyzed {
	t.Helper()
	a, reasons := pattern.Analyze(sub)
	if len(reasons) > 0 {
		t.Fatal(reasons)
	}
	return a
}

// A job Compact would keep waiting on the tightest fabric domain starts
// in another that holds it within the bound: on a mixed cluster the
// tightest leaf may be one of slow nodes while a leaf of fast ones is free
// (ITP cluster01 on hetero-512). A job that starts anyway is placed as
// before, and one no domain holds within the bound still waits.
func TestCompactLooksInOtherDomains(t *testing.T) {
	t.Parallel()
	// l0: two DGX A100 (the ideal: the tightest leaf of the empty
	// cluster); l1: three PCIe servers without NVLink or NICs; l2: four
	// DGX A100.
	var ns []fixtures.Node
	fab := events.TopologyFabric{Cluster: "c"}
	var leaves []string
	for l, spec := range []struct {
		dgx   bool
		nodes int
	}{{true, 2}, {false, 3}, {true, 4}} {
		leaf := fmt.Sprintf("l%d", l)
		sw := events.Switch{Name: leaf, Tier: "leaf"}
		for range spec.nodes {
			name := fmt.Sprintf("n%d", len(ns))
			ev := fixtures.PlainNode(name, "A10", 8)
			if spec.dgx {
				ev = fixtures.MustModelNode(t, "dgx-a100", name)
			}
			ns = append(ns, fixtures.Node{Event: ev})
			sw.Nodes = append(sw.Nodes, name)
		}
		fab.Switches = append(fab.Switches, sw)
		leaves = append(leaves, leaf)
	}
	fab.Switches = append(fab.Switches, events.Switch{Name: "spine", Tier: "spine", Switches: leaves})

	for _, tc := range []struct {
		name    string
		busy    []string // nodes with one GPU busy
		compact bool
		want    outcome.Verdict
		leaf    int // the leaf placed on, two whole nodes of it
	}{
		{name: "off: the tightest leaf, slow", busy: []string{"n0"}, want: outcome.Placed, leaf: 1},
		{name: "on: another leaf within the bound", busy: []string{"n0"}, compact: true, want: outcome.Placed, leaf: 2},
		{name: "on: no other leaf holds it", busy: []string{"n0", "n5", "n6", "n7"}, compact: true, want: outcome.Wait},
		{name: "on: the tightest leaf is the ideal", compact: true, want: outcome.Placed, leaf: 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := fixtures.MustFabric(t, fab)
			st := fixtures.MustStore(t, ns, f)
			r := &rig{t: t, st: st, fabric: f}
			for i, n := range tc.busy {
				r.hold(fmt.Sprintf("j%d", i), n, 0)
			}
			p := &Planner{}
			if tc.compact {
				p.Compact = &Compact{MaxStretch: DefaultMaxStretch, Ideal: (&Ideals{Store: st, Fabric: f}).Comm}
			}
			got := r.plan(p, compactJob(true))
			if got.Verdict != tc.want {
				t.Fatalf("%v on %v (%v), want %v", got.Verdict, nodesOf(got.GPUs), got.Reasons, tc.want)
			}
			if tc.want == outcome.Wait {
				if codes(got.Reasons) != CodeCompactAwaited {
					t.Errorf("reasons %+v, want %s", got.Reasons, CodeCompactAwaited)
				}
				return
			}
			on := nodesOf(got.GPUs)
			if len(on) != 2 || slices.ContainsFunc(on, func(n string) bool { return !slices.Contains(fab.Switches[tc.leaf].Nodes, n) }) {
				t.Errorf("placed on %v, want two nodes of %v", on, fab.Switches[tc.leaf].Nodes)
			}
		})
	}
}
