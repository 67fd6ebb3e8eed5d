package demand

import (
	"math"
	"time"
)

// Shape asks after one fast shape a placement would break: a node of
// Model whose free GPUs hold a job of MinGPUs or more now and would not
// once broken.
type Shape struct {
	Model   string
	MinGPUs int
	// Spare counts the other free shapes like it: nodes of Model with as
	// many free GPUs.
	Spare int
	// Within is how long it would stay broken: the small job's expected
	// run (RunTime).
	Within time.Duration
	// Now is the decision's time, on placement's clock.
	Now time.Time
}

// Need is what the forecast says of a Shape.
type Need struct {
	// Queued counts the jobs waiting now that the shape would hold.
	Queued int
	// Rate is their arrivals per second expected (Rate).
	Rate float64
	// Ending counts the running jobs of MinGPUs or more on Model expected
	// to end within the horizon: each frees a shape as large.
	Ending int
	// Probability that more jobs needing the shape wait or arrive within
	// the horizon than there are shapes for them (Spare + Ending):
	// P(Queued + N > Spare + Ending), N Poisson of mean Rate × Within.
	Probability float64
	// Shortfall is the expected number of them that find none:
	// E[max(0, Queued + N − Spare − Ending)].
	Shortfall float64
}

// Likely is the Probability above which a shape is needed.
const Likely = 0.5

// Need answers for s.
func (f *Forecast) Need(s Shape) Need {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := Need{Rate: f.rate(s.MinGPUs, s.Model, s.Now)}
	until := s.Now.Add(s.Within)
	for _, j := range f.jobs {
		switch {
		case j.gpus < s.MinGPUs:
		case !j.running:
			if fits(j.model, s.Model) {
				n.Queued++
			}
		case j.model == s.Model && f.endsBy(j, s.Now, until):
			n.Ending++
		}
	}
	// The jobs beyond the queue a shortfall needs: k arrivals or more.
	k := s.Spare + n.Ending + 1 - n.Queued
	mu := n.Rate * s.Within.Seconds()
	n.Probability = poissonAtLeast(k, mu)
	n.Shortfall = shortfall(k, mu)
	return n
}

// endsBy says whether a running job is expected to end by until.
func (f *Forecast) endsBy(j job, now, until time.Time) bool {
	end, ok := f.end(j, now)
	return ok && !end.After(until)
}

// ExpectedEnd is when the running job id is expected to end, seen at now:
// its start plus its class's run time, or, once it has run longer than
// that, now plus as long again (a job past the mean runs on). False when
// the job is not tracked as running or no run time is known yet.
func (f *Forecast) ExpectedEnd(id string, now time.Time) (time.Time, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	j, ok := f.jobs[id]
	if !ok || !j.running {
		return time.Time{}, false
	}
	return f.end(j, now)
}

func (f *Forecast) end(j job, now time.Time) (time.Time, bool) {
	d, ok := f.runTime(j.gpus)
	if !ok {
		return time.Time{}, false
	}
	end := j.start.Add(d)
	if end.Before(now) {
		end = now.Add(d)
	}
	return end, true
}

// poissonAtLeast is P(N ≥ k) for N Poisson of mean mu.
func poissonAtLeast(k int, mu float64) float64 {
	if k <= 0 {
		return 1
	}
	if mu <= 0 {
		return 0
	}
	if mu > 500 {
		// e^-mu underflows: the normal approximation, continuity-corrected.
		return 0.5 * math.Erfc((float64(k)-0.5-mu)/math.Sqrt(2*mu))
	}
	term, below := math.Exp(-mu), 0.0
	for i := range k {
		below += term
		term *= mu / float64(i+1)
	}
	return min(max(1-below, 0), 1)
}

// shortfall is E[max(0, N − (k−1))] for N Poisson of mean mu: the jobs
// beyond the k−1 that still find a shape.
func shortfall(k int, mu float64) float64 {
	c := k - 1 // shapes left for arrivals (negative: the queue alone overflows)
	if c < 0 {
		return float64(-c) + max(mu, 0)
	}
	if mu <= 0 {
		return 0
	}
	if mu > 500 {
		return max(mu-float64(c), 0) // e^-mu underflows; the tail's share is negligible next to mu
	}
	// E[max(0, N−c)] = mu − c + Σ_{i<c} (c−i)·P(N=i)
	term, sum := math.Exp(-mu), 0.0
	for i := range c {
		sum += float64(c-i) * term
		term *= mu / float64(i+1)
	}
	return max(mu-float64(c)+sum, 0)
}
