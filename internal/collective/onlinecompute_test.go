package collective

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/toposched/toposched/internal/topology"
)

var computeModels = []string{"T4", "A100 SXM 80GB", "H100 SXM", "RTX 4090"}

// factorOf is the factor a set holds for a model (1: none).
func factorOf(c *Calibration, model string) float64 {
	if c != nil {
		for _, f := range c.Compute {
			if f.Model == model {
				return f.Factor
			}
		}
	}
	return 1
}

// observeAll runs the loop the optimizer runs: every observation is
// measured against the factor in force, and each move is put in force.
// ratio gives an observation's measured over true compute.
func observeAll(t *testing.T, rng *rand.Rand, o *OnlineCompute, c *Calibration, truth map[string]float64, n int, at time.Time, ratio func() float64) *Calibration {
	t.Helper()
	for i := range n {
		model := computeModels[rng.IntN(len(computeModels))]
		job := fmt.Sprintf("job-%d", rng.IntN(60))
		o.Observe(ComputeObservation{Model: model, Job: job, Factor: truth[model] * ratio(), At: at.Add(time.Duration(i) * time.Second), Source: job})
		next := o.Step(c, "online", at.Add(time.Duration(i)*time.Second))
		if next == nil {
			continue
		}
		if err := next.Validate(); err != nil {
			t.Fatalf("a move the replicas would refuse: %v", err)
		}
		for _, m := range computeModels {
			if old, v := factorOf(c, m), factorOf(next, m); math.Abs(v/old-1) > o.MaxStep+1e-9 {
				t.Fatalf("%s moved %.4f -> %.4f in one step", m, old, v)
			}
		}
		c = next
	}
	return c
}

// The online compute calibration reaches each model's true factor (0.4 to
// 2.5 times the table's time) from noisy telemetry in which a fifth of
// the jobs run slowed (a throttled box, a data loader the diagnosis
// missed) and a tenth misreport wildly, never moving a model by more than
// MaxStep at once, every move a set the replicas take.
func TestOnlineComputeConverges(t *testing.T) {
	t.Parallel()
	for seed := range uint64(50) {
		rng := rand.New(rand.NewPCG(seed, 11))
		truth := map[string]float64{}
		for _, m := range computeModels {
			truth[m] = math.Exp(math.Log(0.4) + (math.Log(2.5)-math.Log(0.4))*rng.Float64())
		}
		noisy := func() float64 {
			r := 1 + 0.05*(2*rng.Float64()-1)
			switch rng.IntN(10) {
			case 0, 1:
				r *= 1.3
			case 2:
				r *= 0.25 + 3.75*rng.Float64()
			}
			return r
		}
		c := observeAll(t, rng, NewOnlineCompute(), nil, truth, 2000, time.Unix(0, 0), noisy)
		for _, m := range computeModels {
			// Slowed jobs are a fifth: the median of the jobs kept sits
			// a little above the truth.
			if v := factorOf(c, m); math.Abs(v/truth[m]-1) > 0.06 {
				t.Errorf("seed %d: %s at %.3f, truth %.3f", seed, m, v, truth[m])
			}
		}
	}
}

// One job counts once however often it reports, a ratio beyond the
// outlier bounds is refused, and a minority of jobs, however wrong, does
// not move a model.
func TestOnlineComputeOutliers(t *testing.T) {
	t.Parallel()
	at := time.Unix(0, 0)
	o := NewOnlineCompute()
	for _, ob := range []ComputeObservation{
		{Model: "T4", Job: "j", Factor: 5.5}, {Model: "T4", Job: "j", Factor: 0.15}, {Model: "T4", Job: "j", Factor: math.NaN()},
		{Model: "T4", Job: "j", Factor: math.Inf(1)}, {Model: "T4", Job: "j", Factor: -1}, {Model: "MI300X", Job: "j", Factor: 1},
		{Model: "T4", Factor: 1},
	} {
		if o.Observe(ob) {
			t.Errorf("%+v taken", ob)
		}
	}
	for i := range 100 {
		o.Observe(ComputeObservation{Model: "Tesla T4", Job: "bad", Factor: 4.9, At: at})
		if c := o.Step(nil, "online", at); c != nil {
			t.Fatalf("one job's %d reports moved T4: %+v", i+1, c.Compute)
		}
	}
	for i := range OnlineComputeMinJobs - 1 {
		if p := o.Pending()["T4"]; p != i+1 {
			t.Fatalf("pending %d, want %d: one job counts once", p, i+1)
		}
		o.Observe(ComputeObservation{Model: "T4", Job: fmt.Sprintf("good-%d", i), Factor: 1.0, At: at})
	}
	// Eight jobs: seven at the table's time, one misreporting.
	if c := o.Step(nil, "online", at); c != nil {
		t.Fatalf("a minority moved T4: %+v", c.Compute)
	}
	o.Observe(ComputeObservation{Model: "T4", Job: "bad-2", Factor: 4.9, At: at})
	// A consistent batch (with bad-2, eight jobs since the last step)
	// moves it, by at most MaxStep, to the median of the sixteen jobs
	// kept.
	for i := range OnlineComputeMinJobs - 1 {
		if c := o.Step(nil, "online", at); c != nil {
			t.Fatalf("moved on %d jobs since the last step: %+v", i+1, c.Compute)
		}
		o.Observe(ComputeObservation{Model: "T4", Job: fmt.Sprintf("slow-%d", i), Factor: 3, At: at, Source: fmt.Sprintf("telemetry:slow-%d@9", i)})
	}
	c := o.Step(nil, "online", at)
	if c == nil || len(c.Compute) != 1 {
		t.Fatalf("a consistent batch did not move T4: %+v", c)
	}
	if f := c.Compute[0]; f.Model != "T4" || f.Factor != 1+OnlineComputeMaxStep || f.Samples != 16 || f.Ratio != 3 || len(f.Sources) != 5 {
		t.Errorf("fit %+v, want T4 at %v from 16 jobs, median 3, 4 sources and a count", f, 1+OnlineComputeMaxStep)
	}
}

// Observations older than MaxAge are forgotten, and a model whose speed
// changes (a fault mended) is followed back.
func TestOnlineComputeDecays(t *testing.T) {
	t.Parallel()
	at := time.Unix(0, 0)
	o := NewOnlineCompute()
	for i := range OnlineComputeMinJobs - 1 {
		o.Observe(ComputeObservation{Model: "T4", Job: fmt.Sprintf("old-%d", i), Factor: 2, At: at})
	}
	later := at.Add(OnlineComputeMaxAge + time.Minute)
	o.Observe(ComputeObservation{Model: "T4", Job: "new", Factor: 2, At: later})
	if c := o.Step(nil, "online", later); c != nil {
		t.Fatalf("moved on observations a day old: %+v", c.Compute)
	}
	if p := o.Pending()["T4"]; p != 1 {
		t.Errorf("pending %d, want the one fresh observation", p)
	}

	rng := rand.New(rand.NewPCG(3, 5))
	exact := func() float64 { return 1 + 0.02*(2*rng.Float64()-1) }
	truth := map[string]float64{"T4": 2.2, "A100 SXM 80GB": 1, "H100 SXM": 1, "RTX 4090": 1}
	c := observeAll(t, rng, NewOnlineCompute(), nil, truth, 4000, at, exact)
	if v := factorOf(c, "T4"); math.Abs(v/2.2-1) > 0.03 {
		t.Fatalf("T4 at %.3f, truth 2.2", v)
	}
	truth["T4"] = 1
	c = observeAll(t, rng, NewOnlineCompute(), c, truth, 4000, at.Add(time.Hour), exact)
	if v := factorOf(c, "T4"); math.Abs(v-1) > 0.03 {
		t.Errorf("T4 at %.3f after the fault was mended, truth 1", v)
	}
}

// A compute move keeps what the set held besides (the links' efficiencies
// and their fits), and a link move keeps the compute factors; the set's
// compute factors reach the bandwidths placement predicts with, by the
// speed table's name.
func TestOnlineComputeKeepsTheSet(t *testing.T) {
	t.Parallel()
	at := time.Unix(0, 0)
	base := &Calibration{Version: CalibrationVersion, Name: "site", Efficiency: topology.Efficiency{Net: 0.9},
		Fits: []Fit{{Kind: "net", Efficiency: 0.9, Samples: 3, Ratio: 0.95, Sources: []string{"a:1"}}}}
	o := NewOnlineCompute()
	for i := range OnlineComputeMinJobs {
		o.Observe(ComputeObservation{Model: "Tesla T4", Job: fmt.Sprintf("j%d", i), Factor: 1.3, At: at})
	}
	c := o.Step(base, "online", at)
	if c == nil || c.Name != "online" || c.Efficiency.Net != 0.9 || len(c.Fits) != 1 || len(c.Compute) != 1 || base.Compute != nil {
		t.Fatalf("compute step = %+v", c)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	bw := c.Bandwidths(nil)
	if got, ok := bw.ComputeOf("T4"); !ok || got.Factor != c.Compute[0].Factor || got.Samples != OnlineComputeMinJobs || got.Set != "online" {
		t.Errorf("bandwidths' T4 correction %+v, %v; want the set's %+v", got, ok, c.Compute[0])
	}
	l := NewOnline()
	for range OnlineMinSamples {
		l.Observe(Observation{Kind: "net", Ratio: 0.8})
	}
	next := l.Step(c, "online")
	if next == nil || len(next.Compute) != 1 || next.Compute[0].Factor != c.Compute[0].Factor {
		t.Fatalf("link step dropped the compute factors: %+v", next)
	}
}
