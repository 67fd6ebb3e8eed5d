package placer

import (
	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/internal/placer/aware"
	"github.com/toposched/toposched/internal/store"
	"github.com/toposched/toposched/internal/topology"
)

// Prediction is the cost model's prediction for a job on the given GPUs,
// per kind of group the slowest group (they run side by side).
func Prediction(snap *store.Snapshot, job events.JobAnalyzed, gpus []store.GPUKey, fabric *topology.Fabric, strategy string) (*events.Prediction, error) {
	r, err := aware.Predict(snap, job, gpus, fabric)
	if err != nil {
		return nil, err
	}
	p := &events.Prediction{Strategy: strategy, CommSecondsPerStep: r.CommSeconds}
	if job.Job.StepComputeSeconds > 0 {
		// Without a compute time the model can say nothing of the share
		// of the step spent communicating.
		p.CommFraction, p.SpeedUp = r.CommFraction, r.SpeedUp
	}
	at := map[string]int{}
	for _, g := range r.Groups {
		i, ok := at[g.Name]
		if !ok {
			i = len(p.Groups)
			at[g.Name] = i
			p.Groups = append(p.Groups, events.GroupPrediction{Name: g.Name, Algorithm: string(g.Result.Algorithm)})
		}
		if g.StepSeconds > p.Groups[i].SecondsPerStep {
			p.Groups[i].SecondsPerStep, p.Groups[i].Algorithm = g.StepSeconds, string(g.Result.Algorithm)
		}
	}
	return p, nil
}
