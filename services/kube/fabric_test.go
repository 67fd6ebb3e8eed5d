package kube

import (
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/internal/topology"
)

func labelledNode(name string, labels map[string]string) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
}

// TestLabelFabric: the nodes' zone, block and rack labels make a tree the
// fabric's own checks accept (leaves of nodes, spines and cores of
// switches), a node short of a level hangs under a leaf "-", cliques
// are NVLink domains, and nodes with no label are left out.
func TestLabelFabric(t *testing.T) {
	t.Parallel()
	zone, block, rack := DefaultFabricLabels[0], DefaultFabricLabels[1], DefaultFabricLabels[2]
	nodes := []*corev1.Node{
		labelledNode("n3", map[string]string{zone: "z1", block: "b2", rack: "r1"}),
		labelledNode("n1", map[string]string{zone: "z1", block: "b1", rack: "r1", LabelGPUClique: "c0.1"}),
		labelledNode("n2", map[string]string{zone: "z1", block: "b1", rack: "r1", LabelGPUClique: "c0.1"}),
		labelledNode("n4", map[string]string{zone: "z1", block: "b2"}),
		labelledNode("bare", nil),
	}
	f, ok := labelFabric(nodes, DefaultFabricLabels)
	if !ok {
		t.Fatal("no fabric from labelled nodes")
	}
	want := []events.Switch{
		{Name: "z1", Tier: "core", Switches: []string{"z1/b1", "z1/b2"}},
		{Name: "z1/b1", Tier: "spine", Switches: []string{"z1/b1/r1"}},
		{Name: "z1/b1/r1", Tier: "leaf", Nodes: []string{"n1", "n2"}},
		{Name: "clique:c0.1", Tier: "nvlink", Nodes: []string{"n1", "n2"}},
		{Name: "z1/b2", Tier: "spine", Switches: []string{"z1/b2/r1", "z1/b2/-"}},
		{Name: "z1/b2/r1", Tier: "leaf", Nodes: []string{"n3"}},
		{Name: "z1/b2/-", Tier: "leaf", Nodes: []string{"n4"}},
	}
	got := map[string]events.Switch{}
	for _, s := range f.Switches {
		got[s.Name] = s
	}
	for _, w := range want {
		if !reflect.DeepEqual(got[w.Name], w) {
			t.Errorf("switch %s: %+v, want %+v", w.Name, got[w.Name], w)
		}
	}
	if len(f.Switches) != len(want) {
		t.Errorf("%d switches, want %d: %+v", len(f.Switches), len(want), f.Switches)
	}
	if _, err := topology.NewFabric(f); err != nil {
		t.Errorf("the fabric's own checks refuse it: %v", err)
	}
	if _, ok := labelFabric([]*corev1.Node{labelledNode("bare", nil)}, DefaultFabricLabels); ok {
		t.Error("a fabric from nodes without labels")
	}
}
