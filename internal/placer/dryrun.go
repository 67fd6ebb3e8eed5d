package placer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/internal/formats/clusterfile"
	"github.com/toposched/toposched/internal/pattern"
	"github.com/toposched/toposched/internal/placer/launch"
	"github.com/toposched/toposched/internal/placer/outcome"
	"github.com/toposched/toposched/internal/store"
	"github.com/toposched/toposched/internal/topology"
	"github.com/toposched/toposched/policies"
)

// Occupied lists GPUs already in use on a node, for a dry run.
type Occupied struct {
	Node string `json:"node" yaml:"node"`
	GPUs []int  `json:"gpus" yaml:"gpus"`
}

// DryRun decides offline, with no operator running: the cluster as a
// cluster file describes it, the occupied GPUs held, and one job. The
// outcome is exactly what placement would publish.
//
// set is the policy set in force (nil: none).
func DryRun(c clusterfile.Cluster, occupied []Occupied, job events.JobSubmitted, strategy string, set *policies.Set) (events.Name, any, error) {
	st, err := store.New()
	if err != nil {
		return "", nil, err
	}
	for _, n := range c.Nodes {
		if err := st.UpsertNode(n); err != nil {
			return "", nil, fmt.Errorf("dry run: %w", err)
		}
	}
	var fabric *topology.Fabric
	if len(c.Fabric.Switches) > 0 {
		if fabric, err = st.ApplyFabric(c.Fabric); err != nil {
			return "", nil, fmt.Errorf("dry run: %w", err)
		}
	}
	var held []store.GPUKey
	for _, o := range occupied {
		for _, g := range o.GPUs {
			held = append(held, store.GPUKey{Node: o.Node, Index: g})
		}
	}
	if len(held) > 0 {
		if err := st.Allocate("(occupied)", held); err != nil {
			return "", nil, fmt.Errorf("dry run: occupied GPUs: %w", err)
		}
	}
	analyzed, reasons := pattern.Analyze(job)
	if len(reasons) > 0 {
		return events.NamePlacementRejected, &events.PlacementRejected{JobID: job.JobID, Reasons: reasons}, nil
	}
	snap := st.Snapshot()
	if strategy == "" {
		strategy = StrategyTopologyAware
	}
	p := &Planner{Strategy: strategy, Fabric: fabric, Policies: set}
	if strategy == StrategyTopologyAware {
		// As placement runs by default: with the reservation, so with
		// the wait for a compact placement.
		p.Compact = &Compact{MaxStretch: DefaultMaxStretch, Ideal: (&Ideals{Store: st, Fabric: fabric}).Comm}
	}
	plan, err := p.Plan(context.Background(), snap, analyzed, PlanOptions{Counterfactuals: true})
	if err != nil {
		return "", nil, fmt.Errorf("dry run: %w", err)
	}
	res, base := outcome.Result{Verdict: plan.Verdict, GPUs: plan.GPUs}, plan.Baseline
	switch res.Verdict {
	case outcome.Never:
		return events.NamePlacementRejected, &events.PlacementRejected{JobID: job.JobID, Reasons: plan.Reasons,
			Counterfactuals: plan.Counterfactuals, Explanation: plan.Explanation}, nil
	case outcome.Wait:
		return events.NamePlacementPending, &events.PlacementPending{JobID: job.JobID, Reasons: plan.Reasons,
			Counterfactuals: plan.Counterfactuals, Explanation: plan.Explanation}, nil
	case outcome.Placed:
	default:
		return "", nil, errors.New("dry run: no verdict")
	}
	d := outcome.Decide(job.JobID, res.GPUs, strategy)
	d.DecidedAt = time.Now().UTC()
	launch.Fill(&d, snap)
	d.Warnings, d.Explanation = plan.Warnings, plan.Explanation
	if d.Prediction, d.Baseline, err = Predictions(snap, analyzed, res.GPUs, base, fabric, nil, strategy); err != nil {
		return "", nil, fmt.Errorf("dry run: %w", err)
	}
	return events.NamePlacementDecided, &d, nil
}
