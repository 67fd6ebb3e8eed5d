package replay

import (
	"bytes"
	"math"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestGenerateDeterministic(t *testing.T) {
	cfg := SynthConfig{Jobs: 300, Seed: 7, WholeNodes: 0.5, DurationMedian: 600, DurationSigma: 1}
	a, err := Generate(cfg, 1024, 8)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := Generate(cfg, 1024, 8)
	if !reflect.DeepEqual(a, b) {
		t.Fatal("the same seed gave two traces")
	}
	cfg.Seed = 8
	c, _ := Generate(cfg, 1024, 8)
	if reflect.DeepEqual(a.Jobs, c.Jobs) {
		t.Fatal("two seeds gave the same trace")
	}
	sizes := map[int]bool{}
	for i, j := range a.Jobs {
		sizes[j.GPUs] = true
		if i > 0 && j.Arrival < a.Jobs[i-1].Arrival {
			t.Fatalf("job %d arrives before job %d", i, i-1)
		}
		if j.GPUs <= 8 && j.GPUsPerNode != j.GPUs {
			t.Errorf("%s: %d GPUs not on one node", j.ID, j.GPUs)
		}
		if s := Shape(j, i, 8, 7); !reflect.DeepEqual(s, Shape(j, i, 8, 7)) {
			t.Fatalf("Shape of %s is not deterministic", j.ID)
		}
	}
	for _, s := range DefaultSizes {
		if !sizes[s.GPUs] {
			t.Errorf("no job of %d GPUs in 300", s.GPUs)
		}
	}
}

func TestShape(t *testing.T) {
	for _, tc := range []struct {
		gpus, tp, pp, dp int
		strategy         string
	}{
		{1, 1, 1, 1, "ddp"}, {8, 1, 1, 8, "ddp"}, {12, 4, 1, 3, "megatron"}, {16, 8, 1, 2, "megatron"},
		{64, 8, 2, 4, "megatron"}, {256, 8, 4, 8, "megatron"}, {72, 8, 1, 9, "megatron"}, {9, 1, 1, 9, "megatron"},
	} {
		s := Shape(Job{ID: "j", GPUs: tc.gpus}, 0, 8, 1)
		p := s.Parallelism
		if p.TP != tc.tp || p.PP != tc.pp || p.DP != tc.dp || s.Strategy != tc.strategy {
			t.Errorf("%d GPUs: %s tp %d pp %d dp %d, want %s %d %d %d", tc.gpus, s.Strategy, p.TP, p.PP, p.DP, tc.strategy, tc.tp, tc.pp, tc.dp)
		}
		if m := s.Model; m.Heads%p.TP != 0 || m.Layers%p.PP != 0 || m.GlobalBatchSize%(m.MicroBatchSize*p.DP) != 0 {
			t.Errorf("%d GPUs: model %+v does not divide by tp %d pp %d dp %d", tc.gpus, m, p.TP, p.PP, p.DP)
		}
	}
}

func TestParseSizes(t *testing.T) {
	got, err := ParseSizes("1:40, 8:2.5")
	if err != nil || !reflect.DeepEqual(got, []SizeWeight{{1, 40}, {8, 2.5}}) {
		t.Errorf("got %v, %v", got, err)
	}
	for _, bad := range []string{"", "1", "0:1", "2:-1", "x:1", "2:NaN"} {
		if _, err := ParseSizes(bad); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

func TestSyntheticCluster(t *testing.T) {
	c := SyntheticCluster(2048) // 8 pods, the last one PCIe
	path := filepath.Join(t.TempDir(), "cluster.yaml")
	if err := c.WriteFile(path); err != nil {
		t.Fatal(err)
	}
	inv, err := LoadInventory(path)
	if err != nil {
		t.Fatal(err)
	}
	models := map[string]int{}
	for _, n := range inv.Nodes {
		models[n.Model] += n.GPUs
	}
	if inv.GPUs != 2048 || models["L40S"] != 256 || models["H100-SXM5-80GB"] != 1792 {
		t.Errorf("%d GPUs by model %v; want 2048: 1792 H100, 256 L40S", inv.GPUs, models)
	}
	rails := 0
	for _, s := range c.Switches {
		if s.Rail != nil {
			rails++
		}
	}
	if rails != 7*SynthRails {
		t.Errorf("%d rail leaves, want %d", rails, 7*SynthRails)
	}
}

// TestFragmentation: two T4 nodes (2 GPUs each) and two 8-GPU G2 nodes.
func TestFragmentation(t *testing.T) {
	inv := &Inventory{Nodes: []InvNode{{"a", 2, "T4"}, {"b", 2, "T4"}, {"c", 8, "G2"}, {"d", 8, "G2"}}, GPUs: 20, MaxNodeGPUs: 8}
	o := newOccupancy(inv)
	o.add(0, 1) // a: 1 free
	o.add(2, 5) // c: 3 free
	// free: a 1, b 2, c 3, d 8 = 14
	for _, tc := range []struct {
		name    string
		classes []jobClass
		want    float64
	}{
		{"1 GPU anywhere", []jobClass{{gpus: 1, perNode: 1, weight: 1}}, 0},
		{"2 GPUs on a node", []jobClass{{gpus: 2, perNode: 2, weight: 1}}, 1}, // a's one GPU
		{"4 on a node", []jobClass{{gpus: 4, perNode: 4, weight: 1}}, 6},      // a, b, c
		{"4 on a T4 node", []jobClass{{gpus: 4, perNode: 4, model: "T4", weight: 1}}, 14},
		{"12 any split", []jobClass{{gpus: 12, weight: 1}}, 0},                                // 14 free
		{"16 any split", []jobClass{{gpus: 16, weight: 1}}, 14},                               // too few
		{"16 as 8 per node", []jobClass{{gpus: 16, perNode: 8, weight: 1}}, 14},               // one whole node
		{"8 as 4 per node, G2", []jobClass{{gpus: 8, perNode: 4, model: "G2", weight: 1}}, 6}, // d holds two
		{"mix", []jobClass{{gpus: 1, perNode: 1, weight: 0.5}, {gpus: 4, perNode: 4, weight: 0.5}}, 3},
	} {
		if got := o.fragmentation(tc.classes); math.Abs(got-tc.want) > 1e-9 {
			t.Errorf("%s: %v fragmented GPUs, want %v", tc.name, got, tc.want)
		}
	}
	if o.free() != 14 {
		t.Errorf("free %d, want 14", o.free())
	}
}

func TestPercentile(t *testing.T) {
	v := []float64{5, 1, 4, 2, 3}
	for _, tc := range []struct{ p, want float64 }{{50, 3}, {99, 5}, {0, 1}, {20, 1}, {21, 2}} {
		if got := Percentile(v, tc.p); got != tc.want {
			t.Errorf("p%v = %v, want %v", tc.p, got, tc.want)
		}
	}
	if Percentile(nil, 50) != 0 {
		t.Error("empty")
	}
}

func TestPlotGolden(t *testing.T) {
	ours := []Point{{T: 0, Allocated: 0}, {T: 3600, Allocated: 0.5, Fragmentation: 0.1}, {T: 7200, Allocated: 0.75, Fragmentation: 0.2}, {T: 10800, Allocated: 0.25}}
	blind := []Point{{T: 0}, {T: 3600, Allocated: 0.5, Fragmentation: 0.3}, {T: 7200, Allocated: 0.6, Fragmentation: 0.4}, {T: 10800, Allocated: 0.2, Fragmentation: 0.1}}
	var buf bytes.Buffer
	if err := Plot(&buf, "tiny <trace> & cluster", []Series{{"topology-aware", ours}, {"blind", blind}}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(buf.String(), "tiny &lt;trace&gt; &amp; cluster") {
		t.Error("title not escaped")
	}
	golden(t, "plot.svg", buf.Bytes())
}
