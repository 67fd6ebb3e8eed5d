package placer

import (
	"errors"
	"fmt"
	"slices"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/internal/placer/aware"
	"github.com/toposched/toposched/internal/placer/engine"
	"github.com/toposched/toposched/internal/placer/outcome"
	"github.com/toposched/toposched/internal/store"
	"github.com/toposched/toposched/internal/topology"
)

// Prediction is the cost model's prediction for a job on the given GPUs,
// per kind of group the slowest group (they run side by side), over
// fabric with the link bandwidths bw (nil: the defaults; a calibration's).
func Prediction(snap *store.Snapshot, job events.JobAnalyzed, gpus []store.GPUKey, fabric *topology.Fabric, bw *topology.Bandwidths, strategy string) (*events.Prediction, error) {
	r, err := aware.PredictWith(snap, job, gpus, engine.Options{Fabric: fabric, Bandwidths: bw})
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

// Predictions scores the chosen GPUs with strategy's name and, as the
// baseline, what blind first fit took on the same snapshot (base; no
// baseline when it did not place). The same GPUs in the same order share
// one prediction. A prediction that fails is nil and its error is
// returned (both joined when both fail): the decision stands without it.
func Predictions(snap *store.Snapshot, job events.JobAnalyzed, gpus []store.GPUKey, base outcome.Result, fabric *topology.Fabric, bw *topology.Bandwidths, strategy string) (ours, baseline *events.Prediction, err error) {
	ours, oerr := Prediction(snap, job, gpus, fabric, bw, strategy)
	if oerr != nil {
		oerr = fmt.Errorf("prediction (%s): %w", strategy, oerr)
	}
	var berr error
	switch {
	case base.Verdict != outcome.Placed:
	case slices.Equal(base.GPUs, gpus) && ours != nil:
		copied := *ours
		copied.Strategy = StrategyBlind
		baseline = &copied
	default:
		if baseline, berr = Prediction(snap, job, base.GPUs, fabric, bw, StrategyBlind); berr != nil {
			berr = fmt.Errorf("baseline prediction: %w", berr)
		}
	}
	return ours, baseline, errors.Join(oerr, berr)
}
