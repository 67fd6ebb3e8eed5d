package replay

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
)

// SynthConfig says what Generate draws.
type SynthConfig struct {
	Jobs int
	Seed uint64
	// Sizes is the job-size mix: GPUs and weight.
	Sizes []SizeWeight
	// WholeNodes is the share of jobs larger than a node that ask for
	// whole nodes (gpus_per_node = node size); the rest let placement
	// split them.
	WholeNodes float64
	// DurationMedian and DurationSigma give the log-normal run time, in
	// seconds (sigma of the underlying normal).
	DurationMedian, DurationSigma float64
	// RatePerHour is the Poisson arrival rate; 0 derives it from Load.
	RatePerHour float64
	// Load is the offered load (GPU-seconds asked per GPU-second of
	// the cluster) that sets the rate when RatePerHour is 0.
	Load float64
}

// SizeWeight is one entry of a job-size mix.
type SizeWeight struct {
	GPUs   int
	Weight float64
}

// DefaultSizes is the synthetic job-size mix: most jobs small, a tail of
// multi-node ones, roughly the shape of the ITP and Helios logs.
var DefaultSizes = []SizeWeight{{1, 40}, {2, 10}, {4, 10}, {8, 20}, {16, 8}, {32, 6}, {64, 4}, {128, 2}}

// ParseSizes reads a size mix such as "1:40,8:20,64:5".
func ParseSizes(s string) ([]SizeWeight, error) {
	var out []SizeWeight
	for item := range strings.SplitSeq(s, ",") {
		g, w, ok := strings.Cut(strings.TrimSpace(item), ":")
		gpus, err1 := strconv.Atoi(g)
		weight, err2 := strconv.ParseFloat(w, 64)
		if !ok || err1 != nil || err2 != nil || gpus < 1 || !(weight > 0) || !finite(weight) {
			return nil, fmt.Errorf("size mix %q: expected GPUS:WEIGHT items, such as 1:40,8:20, got %q", s, item)
		}
		out = append(out, SizeWeight{gpus, weight})
	}
	return out, nil
}

// Generate draws a synthetic trace for a cluster of clusterGPUs GPUs
// with nodes of nodeGPUs: Poisson arrivals (exponential gaps), sizes from
// the mix, log-normal durations. The same config gives the same trace.
func Generate(cfg SynthConfig, clusterGPUs, nodeGPUs int) (*Trace, error) {
	if cfg.Jobs < 1 {
		return nil, errors.New("synthetic: at least one job (--count)")
	}
	if len(cfg.Sizes) == 0 {
		cfg.Sizes = DefaultSizes
	}
	if cfg.DurationMedian <= 0 {
		cfg.DurationMedian = 3600
	}
	if cfg.DurationSigma < 0 || !finite(cfg.DurationSigma) {
		return nil, fmt.Errorf("synthetic: duration sigma %v: expected at least 0", cfg.DurationSigma)
	}
	total, meanGPUs := 0.0, 0.0
	for _, s := range cfg.Sizes {
		total += s.Weight
		meanGPUs += float64(s.GPUs) * s.Weight
	}
	meanGPUs /= total
	rate := cfg.RatePerHour / 3600
	if rate <= 0 {
		load := cfg.Load
		if load <= 0 {
			load = 0.9
		}
		meanDur := cfg.DurationMedian * math.Exp(cfg.DurationSigma*cfg.DurationSigma/2)
		rate = load * float64(clusterGPUs) / (meanGPUs * meanDur)
	}
	rng := rand.New(rand.NewPCG(cfg.Seed, 0x5eed))
	tr := &Trace{Kind: KindSynthetic, Source: fmt.Sprintf("synthetic seed %d, %d jobs, %.4g jobs/hour, duration median %gs sigma %g",
		cfg.Seed, cfg.Jobs, rate*3600, cfg.DurationMedian, cfg.DurationSigma)}
	at := 0.0
	for i := range cfg.Jobs {
		at += rng.ExpFloat64() / rate
		w := rng.Float64() * total
		gpus := cfg.Sizes[len(cfg.Sizes)-1].GPUs
		for _, s := range cfg.Sizes {
			if w < s.Weight {
				gpus = s.GPUs
				break
			}
			w -= s.Weight
		}
		dur := math.Round(cfg.DurationMedian * math.Exp(cfg.DurationSigma*rng.NormFloat64()))
		j := Job{ID: fmt.Sprintf("syn-%06d", i), Arrival: math.Round(at*1000) / 1000, Duration: dur, GPUs: gpus}
		switch {
		case gpus <= nodeGPUs:
			j.GPUsPerNode = gpus
		case gpus%nodeGPUs == 0 && rng.Float64() < cfg.WholeNodes:
			j.GPUsPerNode = nodeGPUs
		}
		tr.Jobs = append(tr.Jobs, j)
	}
	tr.Records = len(tr.Jobs)
	return tr, nil
}
