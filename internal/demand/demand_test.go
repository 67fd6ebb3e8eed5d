package demand

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func at(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }

// poisson submits a Poisson stream of rate per second for span seconds,
// sizes drawn from sizes, and returns the last arrival's time.
func poisson(f *Forecast, rng *rand.Rand, rate, span float64, sizes []int, model string, from float64) float64 {
	t := from
	for i := 0; ; i++ {
		t += rng.ExpFloat64() / rate
		if t > from+span {
			return from + span
		}
		f.Submitted(fmt.Sprintf("%s-%f-%d", model, from, i), sizes[rng.IntN(len(sizes))], model, at(t))
	}
}

func TestRateConvergesOnPoisson(t *testing.T) {
	for _, tc := range []struct {
		name     string
		halfLife time.Duration
		rate     float64 // per second
		span     float64 // seconds
	}{
		{"one half life", time.Hour, 0.05, 3600},
		{"many half lives", time.Hour, 0.05, 12 * 3600},
		{"short half life, busy", 10 * time.Minute, 1, 6 * 3600},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := New(Config{HalfLife: tc.halfLife})
			rng := rand.New(rand.NewPCG(1, 2))
			end := poisson(f, rng, tc.rate, tc.span, []int{1, 2, 8}, "", 0)
			got := f.Rate(1, "", at(end))
			// The estimate weighs about tau·λ arrivals: its relative
			// error is about 1/sqrt(that); allow four of them.
			tau := tc.halfLife.Seconds() / math.Ln2
			tol := 4 / math.Sqrt(tc.rate*tau*-math.Expm1(-tc.span/tau))
			if math.Abs(got/tc.rate-1) > tol {
				t.Errorf("rate %.4f/s, want %.4f/s within %.0f%%", got, tc.rate, 100*tol)
			}
			// The sizes share the stream about equally.
			if eight := f.Rate(8, "", at(end)); math.Abs(eight/(tc.rate/3)-1) > 2*tol {
				t.Errorf("rate of 8-GPU jobs %.4f/s, want %.4f/s", eight, tc.rate/3)
			}
		})
	}
}

func TestRateDecays(t *testing.T) {
	f := New(Config{HalfLife: time.Hour})
	rng := rand.New(rand.NewPCG(3, 4))
	end := poisson(f, rng, 0.1, 10*3600, []int{8}, "", 0)
	before := f.Rate(8, "", at(end))
	// No arrival for two half lives: a quarter of the rate is left.
	after := f.Rate(8, "", at(end+2*3600))
	if r := after / before; math.Abs(r-0.25) > 0.01 {
		t.Errorf("after two half lives the rate is %.3f of what it was, want 0.25", r)
	}
	// A new, slower stream takes over within a few half lives.
	end = poisson(f, rng, 0.01, 8*3600, []int{8}, "", end+2*3600)
	if got := f.Rate(8, "", at(end)); math.Abs(got/0.01-1) > 0.5 {
		t.Errorf("rate %.4f/s after the load fell, want about 0.01/s", got)
	}
}

func TestRateByModelAndSize(t *testing.T) {
	f := New(Config{})
	f.Submitted("a", 8, "H100", at(0))
	f.Submitted("b", 8, "", at(0))
	f.Submitted("c", 2, "T4", at(0))
	for _, tc := range []struct {
		min   int
		model string
		want  float64 // arrivals counted
	}{
		{8, "H100", 2}, // pinned to it, and unpinned
		{8, "T4", 1},   // the unpinned one
		{1, "T4", 2},
		{1, "", 3},
		{9, "", 0},
	} {
		got := f.Rate(tc.min, tc.model, at(1))
		want := f.Rate(1, "", at(1)) * tc.want / 3
		if math.Abs(got-want) > 1e-12 {
			t.Errorf("Rate(%d, %q) = %g, want %g", tc.min, tc.model, got, want)
		}
	}
	// A job queued by a rebuild is not an arrival.
	f.Queued("rebuilt", 8, "", at(0))
	if got := f.Rate(1, "", at(1)); math.Abs(got-f.Rate(8, "", at(1))*3/2) > 1e-12 {
		t.Errorf("a rebuilt queue changed the rates: %g", got)
	}
	// A redelivered submission is not counted twice.
	r := f.Rate(1, "", at(1))
	f.Submitted("a", 8, "H100", at(0))
	if got := f.Rate(1, "", at(1)); got != r {
		t.Errorf("redelivery changed the rate: %g, was %g", got, r)
	}
}

func TestBoundedUnderAnyInput(t *testing.T) {
	f := New(Config{MaxKeys: 8, MaxJobs: 100})
	rng := rand.New(rand.NewPCG(5, 6))
	for i := range 10_000 {
		id := fmt.Sprint(rng.IntN(5_000))
		gpus := rng.IntN(1<<20) - 10 // sizes out of range too
		model := fmt.Sprint("m", rng.IntN(50))
		when := at(rng.Float64() * 1e6) // times out of order
		switch i % 3 {
		case 0:
			f.Submitted(id, gpus, model, when)
		case 1:
			f.Started(id, gpus, model, when)
		default:
			f.Ended(id, when)
		}
		if jobs, keys := f.Tracked(); jobs > 100 || keys > 8 {
			t.Fatalf("after %d calls: %d jobs and %d rates tracked, want at most 100 and 8", i+1, jobs, keys)
		}
	}
	for _, v := range []float64{f.Rate(1, "", at(2e6)), f.Need(Shape{MinGPUs: 8, Within: time.Hour, Now: at(2e6)}).Probability} {
		if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
			t.Errorf("answer %g after odd input", v)
		}
	}
}

func TestRunTimeLearned(t *testing.T) {
	f := New(Config{})
	if _, ok := f.RunTime(2); ok {
		t.Fatal("a run time before any job ended")
	}
	for i := range 40 {
		id := fmt.Sprint(i)
		f.Submitted(id, 2, "", at(0))
		f.Started(id, 2, "T4", at(100))
		f.Ended(id, at(100+3600))
	}
	if d, ok := f.RunTime(2); !ok || d != time.Hour {
		t.Errorf("RunTime(2) = %v %v, want 1h", d, ok)
	}
	// A size without runs of its own gets every job's mean.
	if d, ok := f.RunTime(64); !ok || d != time.Hour {
		t.Errorf("RunTime(64) = %v %v, want every job's 1h", d, ok)
	}
	// A job that never ran teaches nothing.
	f.Submitted("q", 8, "", at(0))
	f.Ended("q", at(1e6))
	if d, _ := f.RunTime(8); d != time.Hour {
		t.Errorf("a withdrawn job changed the run time: %v", d)
	}
}

func TestExpectedEnd(t *testing.T) {
	f := New(Config{})
	f.Started("r", 4, "A100", at(1000))
	if _, ok := f.ExpectedEnd("r", at(1000)); ok {
		t.Fatal("an expected end before any run time is known")
	}
	f.Started("done", 4, "A100", at(0))
	f.Ended("done", at(3600))
	f.Submitted("q", 4, "", at(0))
	for _, c := range []struct {
		id   string
		now  float64
		want float64
		ok   bool
	}{
		{"r", 1000, 4600, true},  // its start plus its class's hour
		{"r", 4600, 4600, true},  // due now
		{"r", 5000, 8600, true},  // past the mean: now plus as long again
		{"q", 1000, 0, false},    // queued, not running
		{"gone", 1000, 0, false}, // not tracked
		{"done", 1000, 0, false}, // ended
	} {
		end, ok := f.ExpectedEnd(c.id, at(c.now))
		if ok != c.ok || (ok && !end.Equal(at(c.want))) {
			t.Errorf("ExpectedEnd(%s, %v) = %v %v, want %v %v", c.id, c.now, end, ok, at(c.want), c.ok)
		}
	}
}

// hourly is a Forecast that saw whole-node jobs arrive one an hour for
// 200 hours and 2-GPU jobs run an hour.
func hourly() *Forecast {
	f := New(Config{})
	for i := range 200 {
		f.Submitted(fmt.Sprint("w", i), 8, "", at(float64(i)*3600))
		f.Ended(fmt.Sprint("w", i), at(float64(i)*3600)) // withdrawn: no longer queued
	}
	for i := range 10 {
		id := fmt.Sprint("s", i)
		f.Started(id, 2, "H100", at(0))
		f.Ended(id, at(3600))
	}
	return f
}

func TestNeed(t *testing.T) {
	f := hourly()
	// Half an hour after the last arrival, the decayed weights of a
	// regular stream give its rate (2·ln2·2^-½ = 0.98 of it).
	now := at(199.5 * 3600)
	for _, tc := range []struct {
		name   string
		spare  int
		within time.Duration
		queue  int
		want   float64
	}{
		{"none spare, an hour", 0, time.Hour, 0, 1 - math.Exp(-1)},
		{"one spare, an hour", 1, time.Hour, 0, 1 - 2*math.Exp(-1)},
		{"none spare, a minute", 0, time.Minute, 0, 1 - math.Exp(-1.0/60)},
		{"one waiting, none spare", 0, time.Minute, 1, 1},
		{"one waiting, one spare", 1, time.Minute, 1, 1 - math.Exp(-1.0/60)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := hourly()
			for i := range tc.queue {
				g.jobs[fmt.Sprint("q", i)] = job{gpus: 8}
			}
			n := g.Need(Shape{Model: "H100", MinGPUs: 7, Spare: tc.spare, Within: tc.within, Now: now})
			if math.Abs(n.Probability-tc.want) > 0.01 {
				t.Errorf("P = %.3f, want %.3f (%+v)", n.Probability, tc.want, n)
			}
		})
	}
	// A running whole-node job due to end within the horizon frees a shape.
	f.Started("big", 8, "H100", now.Add(-30*time.Minute))
	with := f.Need(Shape{Model: "H100", MinGPUs: 7, Within: time.Hour, Now: now})
	if with.Ending != 1 || with.Probability > 1-2*math.Exp(-1)+0.02 {
		t.Errorf("with a shape freed within the hour: %+v", with)
	}
}

func TestPoissonTails(t *testing.T) {
	for _, tc := range []struct {
		k        int
		mu, want float64
	}{
		{0, 3, 1}, {1, 0, 0}, {1, 2, 1 - math.Exp(-2)}, {3, 2, 1 - 5*math.Exp(-2)},
		{1000, 1000, 0.5}, {900, 1000, 1}, {1100, 1000, 0},
	} {
		if got := poissonAtLeast(tc.k, tc.mu); math.Abs(got-tc.want) > 0.02 {
			t.Errorf("P(N ≥ %d | %g) = %g, want %g", tc.k, tc.mu, got, tc.want)
		}
	}
	// E[max(0, N − 0)] is the mean; with a queue of 2 and no shape, 2 more.
	if got := shortfall(1, 3); math.Abs(got-3) > 1e-9 {
		t.Errorf("shortfall(1, 3) = %g, want 3", got)
	}
	if got := shortfall(-1, 3); got != 5 {
		t.Errorf("shortfall(-1, 3) = %g, want 5", got)
	}
	if got := shortfall(2, 1); math.Abs(got-math.Exp(-1)) > 1e-9 {
		t.Errorf("shortfall(2, 1) = %g, want e^-1", got)
	}
}
