package collective

import (
	"fmt"
	"testing"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/internal/topology"
)

// benchJob is a ranks-GPU job on 8x H100 NVSwitch nodes (8x 400 Gb/s
// NICs) under a leaf/spine/core fabric (32 nodes per leaf, 8 leaves per
// spine, 2:1 oversubscribed leaves): tensor parallelism of 8 inside each
// node (all-reduce, 4 calls per step) and data parallelism across nodes
// (one ring all-reduce group per local GPU).
func benchJob(tb testing.TB, ranks int) Job {
	nn := ranks / 8
	spec := with(h100, func(s *NodeSpec) { s.NICs, s.NICGbps = 8, 400 })
	ns := make([]*topology.Node, nn)
	fe := events.TopologyFabric{Cluster: "bench"}
	var spines []string
	var leaves []string
	for i := range ns {
		s := spec
		s.Name = fmt.Sprintf("n%05d", i)
		ns[i] = BuildNode(s)
		if i%32 == 0 {
			leaves = append(leaves, fmt.Sprintf("leaf%03d", i/32))
			fe.Switches = append(fe.Switches, events.Switch{Name: leaves[len(leaves)-1], Tier: "leaf", LinkGbps: 400, UplinkGbps: 400, Oversubscription: 2})
		}
		l := &fe.Switches[len(fe.Switches)-1]
		l.Nodes = append(l.Nodes, s.Name)
	}
	for i := 0; i < len(leaves); i += 8 {
		name := fmt.Sprintf("spine%02d", i/8)
		spines = append(spines, name)
		fe.Switches = append(fe.Switches, events.Switch{Name: name, Tier: "spine", Switches: leaves[i:min(i+8, len(leaves))]})
	}
	fe.Switches = append(fe.Switches, events.Switch{Name: "core", Tier: "core", Switches: spines})
	fab, err := topology.NewFabric(fe)
	if err != nil {
		tb.Fatal(err)
	}
	var groups []Group
	for _, n := range ns {
		groups = append(groups, Group{Name: "tp", Collective: AllReduce, Ranks: NodeRanks(n), Bytes: 32 << 20, Calls: 4, Algorithm: Ring})
	}
	for g := range 8 {
		r := make([]Rank, nn)
		for i, n := range ns {
			r[i] = Rank{n, g}
		}
		groups = append(groups, Group{Name: "dp", Collective: AllReduce, Ranks: r, Bytes: 1 << 30, Algorithm: Ring, Phase: "dp"})
	}
	return Job{Groups: groups, ComputeSeconds: 1, Fabric: fab}
}

func BenchmarkEvaluate(b *testing.B) {
	for _, ranks := range []int{1024, 16384} {
		b.Run(fmt.Sprintf("ranks=%d", ranks), func(b *testing.B) {
			j := benchJob(b, ranks)
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				if _, err := EvaluateJob(j); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func TestBenchJob(t *testing.T) {
	t.Parallel()
	r, err := EvaluateJob(benchJob(t, 1024))
	if err != nil {
		t.Fatal(err)
	}
	if r.GPUs != 1024 || r.CommSeconds <= 0 || r.SpeedUp <= 0 {
		t.Errorf("%+v", r)
	}
	t.Logf("1k ranks: comm %.1f ms per step, speed-up %.0f", 1e3*r.CommSeconds, r.SpeedUp)
}
