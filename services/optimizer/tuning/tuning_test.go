package tuning

import (
	"fmt"
	"testing"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/internal/collective"
	"github.com/toposched/toposched/internal/topology"
)

func a100(name string, nics int, gbps float64) *topology.Node {
	n := collective.BuildNode(collective.NodeSpec{Name: name, GPUs: 8, Model: "A100-SXM4", NVLinks: 12, NVLinkGen: 3, PCIeGen: 4, NICs: nics, NICGbps: gbps})
	return n
}

// fourNodes is issue 4's case: four 8x A100 nodes with 4x 100 Gb/s NICs,
// two under each of two leaves whose uplinks (600 Gb/s, 4:3
// oversubscribed) the rings share.
func fourNodes(t testing.TB) ([]*topology.Node, *topology.Fabric) {
	t.Helper()
	var ns []*topology.Node
	for i := range 4 {
		ns = append(ns, a100(fmt.Sprintf("n%d", i), 4, 100))
	}
	fab, err := topology.NewFabric(events.TopologyFabric{Cluster: "c", Switches: []events.Switch{
		{Name: "spine", Tier: "spine", Switches: []string{"leafA", "leafB"}},
		{Name: "leafA", Tier: "leaf", Nodes: []string{"n0", "n1"}, LinkGbps: 100, Uplinks: 6, UplinkGbps: 100, Oversubscription: 4.0 / 3},
		{Name: "leafB", Tier: "leaf", Nodes: []string{"n2", "n3"}, LinkGbps: 100, Uplinks: 6, UplinkGbps: 100, Oversubscription: 4.0 / 3},
	}})
	if err != nil {
		t.Fatal(err)
	}
	return ns, fab
}

// The ring→tree case of issue 4: a topology-blind rank order alternates
// leaves, so NCCL's fabric-blind tuner runs ring, whose every edge crosses
// the oversubscribed uplinks; the tuner sets tree for all_reduce.
func TestRingToTree(t *testing.T) {
	t.Parallel()
	ns, fab := fourNodes(t)
	blindOrder := collective.NodesRanks([]*topology.Node{ns[0], ns[2], ns[1], ns[3]}, 8)
	awareOrder := collective.NodesRanks(ns, 8)
	tests := []struct {
		name      string
		ranks     []collective.Rank
		bytes     float64
		wantAlgo  collective.Algorithm
		wantTuned bool
	}{
		{"blind order, GPT-2 1.5B fp16 gradients", blindOrder, 3e9, collective.Tree, true},
		{"blind order, 256 MiB buckets", blindOrder, 256 << 20, collective.Tree, true},
		{"node order: ring no longer crosses uplinks twice", awareOrder, 3e9, collective.Ring, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			plan, err := Tune(Input{Fabric: fab, Phases: []Phase{{Name: "dp", Collective: collective.AllReduce,
				Members: [][]collective.Rank{tt.ranks}, Bytes: tt.bytes, Calls: 1}}})
			if err != nil {
				t.Fatal(err)
			}
			r := plan.Phases[0]
			t.Logf("chosen %s %.3f s (%s), default %s %.3f s (%s), range %.0f..%.0f, settings %+v", r.Chosen, r.ChosenSeconds, r.Bottleneck,
				r.Default, r.DefaultSeconds, r.DefaultBottleneck, r.MinBytes, r.MaxBytes, plan.Settings)
			if r.Chosen.Algorithm != tt.wantAlgo {
				t.Errorf("chosen %s, want %s", r.Chosen, tt.wantAlgo)
			}
			if tuned := len(plan.Settings) > 0; tuned != tt.wantTuned {
				t.Fatalf("tuned %v, want %v", tuned, tt.wantTuned)
			}
			if !tt.wantTuned {
				return
			}
			if r.Default.Algorithm != collective.Ring {
				t.Errorf("NCCL's default %s, want ring", r.Default)
			}
			if algo, _ := plan.Env(); algo != "allreduce:tree" {
				t.Errorf("NCCL_ALGO %q, want allreduce:tree", algo)
			}
			if r.ChosenSeconds >= r.DefaultSeconds*(1-MinGainFraction) {
				t.Errorf("gain %.4f s of %.4f", r.DefaultSeconds-r.ChosenSeconds, r.DefaultSeconds)
			}
			if r.MinBytes > tt.bytes || r.MaxBytes < tt.bytes {
				t.Errorf("range %.0f..%.0f misses %.0f", r.MinBytes, r.MaxBytes, tt.bytes)
			}
		})
	}
}

// Forcing tree for the data-parallel all-reduce must not force it on a
// tensor-parallel all-reduce inside a node, where ring is better: the
// search weighs both phases, and here still sets tree, since the DP phase
// gains more than TP loses, or leaves ring where TP would lose more.
func TestSharedSettingWeighsPhases(t *testing.T) {
	t.Parallel()
	ns, fab := fourNodes(t)
	blindOrder := collective.NodesRanks([]*topology.Node{ns[0], ns[2], ns[1], ns[3]}, 8)
	tp := Phase{Name: "tp", Collective: collective.AllReduce, Bytes: 64 << 20}
	for _, n := range ns {
		tp.Members = append(tp.Members, collective.NodeRanks(n))
	}
	dp := Phase{Name: "dp", Collective: collective.AllReduce, Members: [][]collective.Rank{blindOrder}, Bytes: 3e9, Calls: 1}
	for _, tc := range []struct {
		tpCalls  int
		wantAlgo string
	}{{1, "allreduce:tree"}, {1000, ""}} {
		tpCalls := tc.tpCalls
		tp.Calls = tpCalls
		plan, err := Tune(Input{Fabric: fab, Phases: []Phase{dp, tp}})
		if err != nil {
			t.Fatal(err)
		}
		if plan.PredictedSeconds > plan.DefaultSeconds*(1+1e-9) {
			t.Errorf("tp calls %d: tuned %.4f s slower than default %.4f s", tpCalls, plan.PredictedSeconds, plan.DefaultSeconds)
		}
		algo, proto := plan.Env()
		if algo != tc.wantAlgo {
			t.Errorf("tp calls %d: NCCL_ALGO %q, want %q", tpCalls, algo, tc.wantAlgo)
		}
		t.Logf("tp calls %d: NCCL_ALGO=%q NCCL_PROTO=%q: %.4f s vs %.4f s; dp %s, tp %s", tpCalls, algo, proto,
			plan.PredictedSeconds, plan.DefaultSeconds, plan.Phases[0].Chosen, plan.Phases[1].Chosen)
	}
}

func TestSmallMessagesPreferLowLatency(t *testing.T) {
	t.Parallel()
	n := a100("n", 0, 0)
	plan, err := Tune(Input{Phases: []Phase{{Name: "tp", Collective: collective.AllReduce, Members: [][]collective.Rank{collective.NodeRanks(n)}, Bytes: 4096, Calls: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	r := plan.Phases[0]
	if r.Default.Protocol == Simple {
		t.Errorf("4 KiB on NVLink: NCCL's model picks %s, want a low-latency protocol", r.Default)
	}
	if len(plan.Settings) != 0 {
		t.Errorf("one node, no fabric: nothing for the tuner to add, got %+v", plan.Settings)
	}
}

func TestChoose(t *testing.T) {
	t.Parallel()
	ns, fab := fourNodes(t)
	ch, def, ct, dt, tuned, err := Choose(collective.Placement{Ranks: collective.NodesRanks([]*topology.Node{ns[0], ns[2], ns[1], ns[3]}, 8), Fabric: fab},
		collective.AllReduce, 3e9, nil)
	if err != nil || !tuned || ch.Algorithm != collective.Tree || def.Algorithm != collective.Ring || ct >= dt {
		t.Fatalf("Choose: %s %.3f, default %s %.3f, tuned %v, %v", ch, ct, def, dt, tuned, err)
	}
}
