package placer

import (
	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/internal/collective"
	"github.com/toposched/toposched/internal/placer/aware"
	"github.com/toposched/toposched/internal/store"
)

// ComputeByModel completes p, the prediction for gpus, where placement
// weighs compute by GPU model (ref, engine.Options.ComputeReference): the
// job's compute per step on the slowest GPU model of gpus, and the comm
// fraction and speed-up on it. Nothing changes where p is nil, ref is "",
// or the job's compute is not known.
func ComputeByModel(p *events.Prediction, snap *store.Snapshot, job events.JobAnalyzed, gpus []store.GPUKey, ref string) {
	if p == nil || ref == "" || len(gpus) == 0 {
		return
	}
	c, model, ok := aware.ComputeOn(snap, job, gpus, ref)
	if !ok {
		return
	}
	p.ComputeSecondsPerStep, p.GPUModel = c, model
	p.CommFraction = p.CommSecondsPerStep / (c + p.CommSecondsPerStep)
	p.SpeedUp = collective.SpeedUp(len(gpus), p.CommSecondsPerStep, c)
}
