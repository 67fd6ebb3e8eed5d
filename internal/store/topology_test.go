package store

import (
	"strings"
	"testing"

	"github.com/toposched/toposched/events"
)

func TestNodeKeepsItsTopology(t *testing.T) {
	t.Parallel()
	s, err := New()
	if err != nil {
		t.Fatal(err)
	}
	n := events.TopologyNode{
		Name: "n", GPUs: []events.GPU{{Index: 0}, {Index: 1}},
		GPUPaths: [][]string{{"X", "NV12"}, {"NV12", "X"}}, NVLinkGen: 3,
	}
	if err := s.UpsertNode(n); err != nil {
		t.Fatal(err)
	}
	got, _ := s.Snapshot().Node("n")
	if got.Topology == nil || got.Topology.GPUPaths[0][1].String() != "NV12" || got.Topology.NVLinkGen != 3 {
		t.Fatalf("topology %+v", got.Topology)
	}
	n.GPUPaths = [][]string{{"X", "NV12"}, {"PIX", "X"}}
	if err := s.UpsertNode(n); err == nil || !strings.Contains(err.Error(), "GPU0-GPU1") {
		t.Fatalf("asymmetric matrix accepted: %v", err)
	}
	if got, _ := s.Snapshot().Node("n"); got.Topology.GPUPaths[1][0].String() != "NV12" {
		t.Fatal("a refused report changed the stored topology")
	}
}
