// Package demand holds what placement expects to be asked for next: the
// rate at which jobs of each size (and pinned GPU model) arrive, learned
// online from the submissions placement sees; the queue as it is; and the
// running jobs with their expected ends, from the run times learned from
// the jobs that finished (the job spec carries no duration). Topology-aware
// asks it, before it sends a small job to a slower box to keep a fast
// node whole, whether a job needing that node is likely to come before the
// small job ends (Forecast.Need); the optimizer asks it whether a node
// kept whole stayed unused past the horizon it was kept for.
//
// Rates decay exponentially: an arrival's weight halves every
// Config.HalfLife, so a rate follows a changing load within a few half
// lives and forgets a burst. With weights w summed over the arrivals of a
// key, the rate is sum(w) / (tau × (1 − e^(−age/tau))), tau = HalfLife /
// ln 2 and age the time since the first arrival seen: on a Poisson stream
// of rate λ the sum's mean is λ·tau·(1 − e^(−age/tau)), so the estimate is
// unbiased from the first arrivals on, not only after many half lives.
//
// Memory is bounded whatever the input: at most Config.MaxKeys rates (the
// key of least weight is dropped to make room) and Config.MaxJobs jobs
// tracked (a submission beyond that is counted in the rates, not queued).
// Everything is a function of the calls and the times they give, never of
// the wall clock or of map order, so a replay on a virtual clock gets the
// same answers every run.
package demand

import (
	"cmp"
	"math"
	"math/bits"
	"slices"
	"sync"
	"time"
)

// Defaults of Config.
const (
	DefaultHalfLife = time.Hour
	DefaultMaxKeys  = 256
	DefaultMaxJobs  = 1 << 16
	// maxGPUs clamps a job's size: larger sizes are one key.
	maxGPUs = 1 << 14
	// classes of run time: sizes 1, 2, 3-4, 5-8, ... by powers of two.
	classes = 16
	// learnWeight is the least weight a new run time gets in its class's
	// mean (1/n before the twentieth run): the mean follows a change of
	// workload within some tens of runs.
	learnWeight = 0.05
)

// Config tunes a Forecast; the zero value is the defaults.
type Config struct {
	// HalfLife of an arrival's weight in the rates (0: DefaultHalfLife).
	HalfLife time.Duration
	// MaxKeys bounds the (size, model) rates kept (0: DefaultMaxKeys).
	MaxKeys int
	// MaxJobs bounds the queued and running jobs tracked (0:
	// DefaultMaxJobs).
	MaxJobs int
}

// Forecast is the demand placement has seen. Its methods may be called
// from several goroutines.
type Forecast struct {
	mu      sync.Mutex
	tau     float64 // seconds: HalfLife / ln 2
	maxKeys int
	maxJobs int
	first   time.Time // the first arrival; zero before
	rates   []rate    // sorted by (gpus, model)
	jobs    map[string]job
	runs    [classes]mean
	all     mean
}

// rate is one key's decayed arrival weight at time at.
type rate struct {
	gpus   int
	model  string
	weight float64
	at     time.Time
}

type job struct {
	gpus  int
	model string // pinned while queued; the model placed on while running
	start time.Time
	// running: placed and not yet ended; else queued.
	running bool
}

type mean struct {
	n int
	v float64 // seconds
}

func (m *mean) add(x float64) {
	m.n++
	m.v += (x - m.v) * max(1/float64(m.n), learnWeight)
}

// New returns an empty Forecast.
func New(cfg Config) *Forecast {
	f := &Forecast{maxKeys: cmp.Or(cfg.MaxKeys, DefaultMaxKeys), maxJobs: cmp.Or(cfg.MaxJobs, DefaultMaxJobs), jobs: map[string]job{}}
	f.tau = cmp.Or(cfg.HalfLife, DefaultHalfLife).Seconds() / math.Ln2
	return f
}

func clamp(gpus int) int { return min(max(gpus, 1), maxGPUs) }

func class(gpus int) int { return min(bits.Len(uint(clamp(gpus)-1)), classes-1) }

// Submitted counts a job's arrival of gpus GPUs (model: the GPU model it
// pins, "" none) at t in the rates, and queues it. A job seen before
// (a redelivery) is not counted again.
func (f *Forecast) Submitted(id string, gpus int, model string, t time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, seen := f.jobs[id]; seen {
		return
	}
	f.arrive(clamp(gpus), model, t)
	if len(f.jobs) < f.maxJobs {
		f.jobs[id] = job{gpus: clamp(gpus), model: model, start: t}
	}
}

// Queued tracks a waiting job without counting an arrival: a service
// rebuilt from its streams learns its queue so.
func (f *Forecast) Queued(id string, gpus int, model string, t time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, seen := f.jobs[id]; !seen && len(f.jobs) < f.maxJobs {
		f.jobs[id] = job{gpus: clamp(gpus), model: model, start: t}
	}
}

// Started records a job placed at t on GPUs of model: it leaves the
// queue and runs until its expected end.
func (f *Forecast) Started(id string, gpus int, model string, t time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, seen := f.jobs[id]; !seen && len(f.jobs) >= f.maxJobs {
		return
	}
	f.jobs[id] = job{gpus: clamp(gpus), model: model, start: t, running: true}
}

// Ended records that a job left at t, finished, withdrawn or rejected:
// a running job's run time is learned.
func (f *Forecast) Ended(id string, t time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	j, ok := f.jobs[id]
	if !ok {
		return
	}
	delete(f.jobs, id)
	if !j.running {
		return
	}
	d := max(t.Sub(j.start).Seconds(), 0)
	f.runs[class(j.gpus)].add(d)
	f.all.add(d)
}

// arrive adds one arrival of the key at t, making room by dropping the
// key of least weight (ties: the smallest key) when the rates are full.
func (f *Forecast) arrive(gpus int, model string, t time.Time) {
	if f.first.IsZero() || t.Before(f.first) {
		f.first = t
	}
	i, found := slices.BinarySearchFunc(f.rates, rate{gpus: gpus, model: model}, cmpKey)
	if found {
		r := &f.rates[i]
		r.weight = f.decayed(*r, t) + 1
		r.at = later(r.at, t)
		return
	}
	if len(f.rates) >= f.maxKeys {
		least := 0
		for k := range f.rates {
			if f.decayed(f.rates[k], t) < f.decayed(f.rates[least], t) {
				least = k
			}
		}
		f.rates = slices.Delete(f.rates, least, least+1)
		i, _ = slices.BinarySearchFunc(f.rates, rate{gpus: gpus, model: model}, cmpKey)
	}
	f.rates = slices.Insert(f.rates, i, rate{gpus: gpus, model: model, weight: 1, at: t})
}

func cmpKey(a, b rate) int { return cmp.Or(cmp.Compare(a.gpus, b.gpus), cmp.Compare(a.model, b.model)) }

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// decayed is r's weight at t (never grown: an arrival dated after t
// keeps its weight).
func (f *Forecast) decayed(r rate, t time.Time) float64 {
	dt := t.Sub(r.at).Seconds()
	if dt <= 0 {
		return r.weight
	}
	return r.weight * math.Exp(-dt/f.tau)
}

// Rate is the arrivals per second expected at t of jobs of at least
// minGPUs GPUs that may run on model: those pinning it and those pinning
// none ("" counts every job).
func (f *Forecast) Rate(minGPUs int, model string, t time.Time) float64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.rate(minGPUs, model, t)
}

func (f *Forecast) rate(minGPUs int, model string, t time.Time) float64 {
	if f.first.IsZero() {
		return 0
	}
	age := t.Sub(f.first).Seconds()
	if age <= 0 {
		return 0
	}
	sum := 0.0
	for _, r := range f.rates {
		if r.gpus >= minGPUs && fits(r.model, model) {
			sum += f.decayed(r, t)
		}
	}
	return sum / (f.tau * -math.Expm1(-age/f.tau))
}

// fits says whether a job pinning pinned may run on GPUs of model.
func fits(pinned, model string) bool { return pinned == "" || model == "" || pinned == model }

// RunTime is the mean run time learned for jobs of gpus GPUs: their size
// class's (1, 2, 3-4, 5-8, ... GPUs), else every job's; false before any
// job has finished.
func (f *Forecast) RunTime(gpus int) (time.Duration, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.runTime(gpus)
}

func (f *Forecast) runTime(gpus int) (time.Duration, bool) {
	m := f.runs[class(gpus)]
	if m.n == 0 {
		m = f.all
	}
	if m.n == 0 {
		return 0, false
	}
	return time.Duration(m.v * float64(time.Second)), true
}

// Tracked counts the jobs tracked (queued and running) and the rates
// kept: what bounds the Forecast's memory.
func (f *Forecast) Tracked() (jobs, keys int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.jobs), len(f.rates)
}
