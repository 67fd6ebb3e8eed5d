package gpuspeed

import (
	"math"
	"slices"
)

func sqrt(x float64) float64 { return math.Sqrt(x) }

// Factor is what a step's compute time measured on ref is multiplied by on
// model on: Speed(ref) / Speed(on). ok is false, and the factor 1, when
// the table knows either model not.
func Factor(on, ref string) (float64, bool) {
	a, ok1 := Lookup(on)
	b, ok2 := Lookup(ref)
	if !ok1 || !ok2 {
		return 1, false
	}
	return b.Speed() / a.Speed(), true
}

// SlowestFactor is Factor for a job over GPUs of the models given: the
// slowest sets the pace of a synchronous step. ok is false, and the factor
// 1, when a model is unknown (its pace is).
func SlowestFactor(models []string, ref string) (float64, bool) {
	f, seen := 0.0, false
	for _, m := range models {
		g, ok := Factor(m, ref)
		if !ok {
			return 1, false
		}
		f, seen = max(f, g), true
	}
	if !seen {
		return 1, false
	}
	return f, true
}

// JobCompute is a job's step compute time on model on: byModel[on] when
// the job measured it there (by the table's entry, so "H100-SXM5-80GB"
// answers for "NVIDIA H100 80GB HBM3"); else its time on the measured
// model of the speed closest to on's, scaled by Factor; else base (its
// step_compute_seconds, or an estimate) taken as measured on ref, scaled.
// ok is false, with base (or a measured time, if on is the model measured)
// unscaled, when the table knows on not.
func JobCompute(byModel map[string]float64, base float64, on, ref string) (float64, bool) {
	t, _, ok := JobComputeFrom(byModel, base, on, ref)
	return t, ok
}

// JobComputeFrom is JobCompute and the table's name of the model the time
// was measured on (or, for base, taken as measured on): the model whose
// speed the rule scaled from. from is on's own name where the job measured
// it there, and "" where nothing was scaled (ok false). An online
// correction of the table (a model measured slower than its figures say)
// divides out the from model's and multiplies in on's.
func JobComputeFrom(byModel map[string]float64, base float64, on, ref string) (t float64, from string, ok bool) {
	if t, ok := byModel[on]; ok {
		s, _ := Lookup(on)
		return t, s.Name, true
	}
	target, known := Lookup(on)
	if !known {
		return base, "", false
	}
	keys := make([]string, 0, len(byModel))
	for k := range byModel {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	best, bestD, bestF, bestFrom := -1.0, math.Inf(1), 1.0, ""
	for _, k := range keys {
		s, ok := Lookup(k)
		if !ok || !(byModel[k] > 0) {
			continue
		}
		if s.Name == target.Name {
			return byModel[k], s.Name, true
		}
		if d := math.Abs(math.Log(s.Speed() / target.Speed())); d < bestD {
			best, bestD, bestF, bestFrom = byModel[k], d, s.Speed()/target.Speed(), s.Name
		}
	}
	if best > 0 {
		return best * bestF, bestFrom, true
	}
	f, ok := Factor(on, ref)
	if !ok {
		return base, "", false
	}
	r, _ := Lookup(ref)
	return base * f, r.Name, true
}
