package placer

import (
	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/internal/collective"
	"github.com/toposched/toposched/internal/placer/aware"
	"github.com/toposched/toposched/internal/store"
	"github.com/toposched/toposched/internal/topology"
)

// ComputeByModel completes p, the prediction for gpus, where placement
// weighs compute by GPU model (ref, engine.Options.ComputeReference): the
// job's compute per step on the slowest GPU model of gpus under the
// compute corrections of bw (nil: none), the correction it includes, and
// the comm fraction and speed-up on it. Nothing changes where p is nil,
// ref is "", or the job's compute is not known.
func ComputeByModel(p *events.Prediction, snap *store.Snapshot, job events.JobAnalyzed, gpus []store.GPUKey, ref string, bw *topology.Bandwidths) {
	if p == nil || ref == "" || len(gpus) == 0 {
		return
	}
	est, ok := aware.EstimateCompute(snap, job, gpus, ref, bw)
	if !ok {
		return
	}
	c := est.Seconds
	p.ComputeSecondsPerStep, p.GPUModel = c, est.Model
	p.CommFraction = p.CommSecondsPerStep / (c + p.CommSecondsPerStep)
	p.SpeedUp = collective.SpeedUp(len(gpus), p.CommSecondsPerStep, c)
	if est.Factor != 1 {
		corr := est.Correction
		if !(corr.Factor > 0) {
			// Only the model the time was scaled from is corrected.
			corr, _ = bw.ComputeOf(est.From)
		}
		p.ComputeCorrection = &events.ComputeCorrection{Factor: est.Factor, Samples: corr.Samples, Set: corr.Set}
	}
}
