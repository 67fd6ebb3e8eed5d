package collective

import (
	"math"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"

	"github.com/toposched/toposched/internal/topology"
)

// The online calibration reaches a machine's true efficiencies (40% to
// 100% of line rate, the defaults 61% to 96%) from noisy telemetry in
// which a fifth of the measurements are slowed by other jobs and a tenth
// are wild, never moving a kind by more than MaxStep at once.
func TestOnlineConverges(t *testing.T) {
	t.Parallel()
	for seed := range uint64(200) {
		rng := rand.New(rand.NewPCG(seed, 7))
		truth := map[string]float64{}
		for _, k := range LinkKinds {
			truth[k] = 0.4 + 0.6*rng.Float64()
		}
		o := NewOnline()
		var c *Calibration
		for range 4500 {
			k := LinkKinds[rng.IntN(len(LinkKinds))]
			eff := c.Resolved()
			cur := *shares(&eff)[slices.Index(LinkKinds, k)]
			ratio := truth[k] / cur * (1 + 0.03*(2*rng.Float64()-1))
			switch rng.IntN(10) {
			case 0, 1:
				ratio *= 0.7 // another job on the link the diagnosis missed
			case 2:
				ratio *= 0.2 + 4*rng.Float64() // misreported
			}
			o.Observe(Observation{Kind: k, Ratio: ratio, Source: "job"})
			next := o.Step(c, "online")
			if next == nil {
				continue
			}
			if err := next.Validate(); err != nil {
				t.Fatalf("seed %d: %v", seed, err)
			}
			ne := next.Resolved()
			for i, p := range shares(&ne) {
				v, old := *p, *shares(&eff)[i]
				if math.Abs(v/old-1) > o.MaxStep+1e-9 {
					t.Fatalf("seed %d: %s moved %.4f -> %.4f in one step", seed, LinkKinds[i], old, v)
				}
			}
			c = next
		}
		eff := c.Resolved()
		for i, p := range shares(&eff) {
			v, k := *p, LinkKinds[i]
			// Slowed measurements are a fifth: the median of the mix sits
			// a little below the truth, within a few percent.
			if math.Abs(v/truth[k]-1) > 0.06 {
				t.Errorf("seed %d: %s at %.3f, truth %.3f", seed, k, v, truth[k])
			}
		}
	}
}

func TestOnlineRefuses(t *testing.T) {
	t.Parallel()
	o := NewOnline()
	for _, ob := range []Observation{
		{Kind: "nvlink", Ratio: 30}, {Kind: "nvlink", Ratio: 0.02}, {Kind: "nvlink", Ratio: math.NaN()},
		{Kind: "nvlink", Ratio: math.Inf(1)}, {Kind: "nvlink", Ratio: -1}, {Kind: "ib", Ratio: 1},
	} {
		if o.Observe(ob) {
			t.Errorf("%+v taken", ob)
		}
	}
	for range OnlineMinSamples - 1 {
		o.Observe(Observation{Kind: "pcie", Ratio: 1.3})
	}
	if c := o.Step(nil, "x"); c != nil {
		t.Fatalf("moved on %d samples: %+v", OnlineMinSamples-1, c)
	}
	o.Observe(Observation{Kind: "pcie", Ratio: 1.3})
	c := o.Step(nil, "x")
	if c == nil || math.Abs(c.Efficiency.PCIe-EffPCIe*(1+OnlineMaxStep)) > 1e-9 || c.Efficiency.NVLink != 0 || c.Resolved().NVLink != EffNVLink {
		t.Fatalf("step %+v", c)
	}
	if len(c.Fits) != 1 || c.Fits[0].Kind != "pcie" || c.Fits[0].Samples != OnlineMinSamples {
		t.Fatalf("fits %+v", c.Fits)
	}
	if n := o.Pending()["pcie"]; n != 0 {
		t.Fatalf("%d observations kept after the step", n)
	}
	// Within MinMove: no new version.
	for range OnlineMinSamples {
		o.Observe(Observation{Kind: "pcie", Ratio: 1.005})
	}
	if next := o.Step(c, "x"); next != nil {
		t.Fatalf("moved by less than MinMove: %+v", next.Efficiency)
	}
}

// A step moves links and keeps everything else of the set in force as it
// was: per-model efficiencies, the latency fits (the cluster's and each
// model's) and the compute factors, evidence included. Before, each GPU
// model's latency evidence (model_latency) was dropped at the first move,
// leaving its per-model overhead in force without what it came from.
func TestOnlineStepKeepsTheRest(t *testing.T) {
	t.Parallel()
	in := &Calibration{Version: CalibrationVersion, Name: "site", Efficiency: topology.Efficiency{StepOverheadUS: 3},
		Models:       map[string]topology.Efficiency{"H100": {StepOverheadUS: 4}},
		Latency:      &LatencyFit{StepOverheadUS: 3, Samples: 2, Sources: []string{"a.txt:3"}},
		ModelLatency: []LatencyFit{{Model: "H100", StepOverheadUS: 4, Samples: 2, Sources: []string{"b.txt:9"}}},
		Compute:      []ComputeFit{{Model: "T4", Factor: 1.2, Samples: 8, Ratio: 1.2, Sources: []string{"telemetry:j@1"}}},
	}
	if err := in.Validate(); err != nil {
		t.Fatal(err)
	}
	o := NewOnline()
	var out *Calibration
	for i := 0; out == nil && i < 1000; i++ {
		o.Observe(Observation{Kind: "net", Ratio: 0.8, Source: "job"})
		out = o.Step(in, "online")
	}
	if out == nil {
		t.Fatal("no step")
	}
	if err := out.Validate(); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(out.Models, in.Models) || !reflect.DeepEqual(out.Latency, in.Latency) ||
		!reflect.DeepEqual(out.ModelLatency, in.ModelLatency) || !reflect.DeepEqual(out.Compute, in.Compute) {
		t.Errorf("step changed what it does not move:\n got %+v %+v %+v %+v\nwant %+v %+v %+v %+v",
			out.Models, out.Latency, out.ModelLatency, out.Compute, in.Models, in.Latency, in.ModelLatency, in.Compute)
	}
}
