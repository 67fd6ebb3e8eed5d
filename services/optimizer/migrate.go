package optimizer

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/events/bus"
	"github.com/toposched/toposched/internal/gpuspeed"
	"github.com/toposched/toposched/internal/placer"
	"github.com/toposched/toposched/internal/placer/aware"
	"github.com/toposched/toposched/internal/placer/engine"
	"github.com/toposched/toposched/internal/placer/launch"
	"github.com/toposched/toposched/internal/placer/outcome"
	"github.com/toposched/toposched/internal/store"
)

// MinMigrationGain is the least share of a step a move must save to be
// proposed: below it the prediction's error is as large as the gain.
const MinMigrationGain = 0.05

// Findings a move may fix, and the proposal reason for each.
var movable = map[string]string{
	events.FindingCongestion:   events.MigrationCongestion,
	events.FindingLinkDegraded: events.MigrationLinkDegraded,
}

// maxBetterPerEvent bounds how many jobs without a finding to fix are
// planned anew per event: planning every live job on every release would
// cost as much as placing them all again.
const maxBetterPerEvent = 4

// reconsider looks for better placements, called when GPUs are freed or a
// part recovers, which is when a better placement can appear: for every
// live job whose last finding a move may fix, and for the spread-out jobs
// with nothing wrong diagnosed (more nodes than their size needs), the
// maxBetterPerEvent of them predicted to communicate the most, proposed
// as better_placement; then the fit trades that did not pay
// (unpaidTrades).
func (s *Service) reconsider(ctx context.Context) error {
	var spread []*liveJob
	for _, id := range slices.Sorted(func(yield func(string) bool) {
		for id := range s.live {
			if !yield(id) {
				return
			}
		}
	}) {
		lj := s.live[id]
		if lj.spec == nil {
			continue
		}
		if reason, ok := movable[lj.finding]; ok {
			if err := s.propose(ctx, lj, reason); err != nil {
				return err
			}
			continue
		}
		if (lj.finding == "" || lj.finding == events.FindingAsPredicted) && lj.tuning != nil && s.spreadOut(lj) {
			spread = append(spread, lj)
		}
	}
	slices.SortStableFunc(spread, func(a, b *liveJob) int {
		return cmp.Compare(b.tuning.PredictedCommSecondsPerStep, a.tuning.PredictedCommSecondsPerStep)
	})
	for _, lj := range spread[:min(len(spread), maxBetterPerEvent)] {
		if err := s.propose(ctx, lj, events.MigrationBetterPlacement); err != nil {
			return err
		}
	}
	return s.unpaidTrades(ctx)
}

// spreadOut reports whether a job runs on more nodes than its size needs
// on nodes like its first, or under more than one leaf switch.
func (s *Service) spreadOut(lj *liveJob) bool {
	d := lj.decision
	if len(d.Nodes) < 2 {
		return false
	}
	snap := s.store.Snapshot()
	if n, ok := snap.Node(d.Nodes[0].Node); ok && n.GPUCount > 0 && len(d.Nodes) > (len(d.Ranks)+n.GPUCount-1)/n.GPUCount {
		return true
	}
	leaves := map[string]bool{}
	for _, np := range d.Nodes {
		for _, dom := range snap.FabricDomains(np.Node) {
			if store.DomainKind(dom) == store.DomainLeaf {
				leaves[dom] = true
			}
		}
	}
	return len(leaves) > 1
}

// propose plans the job anew on a fork of the store where its own GPUs
// are free, with placement's planner, and publishes placement.migration
// when the plan differs from where the job runs and saves at least
// MinMigrationGain of its step. A congested job is not moved onto another
// placement that shares a link with its neighbours, nor a degraded one
// onto unhealthy parts (the planner takes healthy GPUs only, and the
// fork's topology has the down links taken out).
func (s *Service) propose(ctx context.Context, lj *liveJob, reason string) error {
	return s.proposeMove(ctx, lj, reason, "", false)
}

// proposeMove is propose; why, when set, is the message's account of why
// the job should move, and fastest plans with the fastest one-node
// placement winning over a tighter fit (no fit tolerance).
func (s *Service) proposeMove(ctx context.Context, lj *liveJob, reason, why string, fastest bool) error {
	if s.noMigrations {
		return nil
	}
	d := lj.decision
	what := s.occupancy().Fork()
	if _, err := what.Release(d.JobID); err != nil {
		return fmt.Errorf("optimizer: what-if release of %s: %w", d.JobID, err)
	}
	snap := what.Snapshot()
	bw := s.bandwidths.Load()
	spec := s.ownCompute(snap, lj)
	planner := &placer.Planner{Strategy: placer.StrategyTopologyAware, Fabric: s.fabric, Bandwidths: bw, ComputeReference: s.computeRef, Log: s.log}
	if fastest {
		planner.FitTolerance = -1
	}
	plan, err := planner.Plan(ctx, snap, spec, placer.PlanOptions{})
	if err != nil || plan.Verdict != outcome.Placed {
		return nil // nowhere to go now
	}
	if slices.Equal(plan.GPUs, gpusOf(d)) {
		return nil
	}
	key := keyOf(plan.GPUs)
	if key == lj.proposed {
		return nil // proposed already
	}
	proposed, err := aware.PredictWith(snap, spec, plan.GPUs, engine.Options{Fabric: s.fabric, Bandwidths: bw})
	if err != nil {
		s.log.WarnContext(ctx, "migration: proposal not predicted", "job_id", d.JobID, "err", err)
		return nil
	}
	target := outcome.Decide(d.JobID, plan.GPUs, placer.StrategyTopologyAware)
	launch.Fill(&target, snap)
	if reason == events.MigrationCongestion && s.stillShared(lj, &target) {
		return nil
	}
	current := lj.tuning.PredictedCommSecondsPerStep
	m := &events.PlacementMigration{JobID: d.JobID, Reason: reason, CurrentNodes: d.Nodes, Ranks: target.Ranks, Nodes: target.Nodes,
		CurrentCommSecondsPerStep: current, ProposedCommSecondsPerStep: proposed.CommSeconds, ProposedAt: s.now().UTC()}
	base := current
	step := lj.spec.Job.StepComputeSeconds + current
	if t := lj.telemetry; t != nil {
		m.MeasuredCommSecondsPerStep = max(t.StepSeconds-t.ComputeSeconds, 0)
		base, step = m.MeasuredCommSecondsPerStep, t.StepSeconds
	}
	m.GainSecondsPerStep = base - m.ProposedCommSecondsPerStep
	compute := s.computeGain(snap, lj, spec, plan.GPUs, m)
	m.StepSeconds = step
	if m.GainSecondsPerStep <= 0 || step <= 0 || m.GainSecondsPerStep < MinMigrationGain*step {
		return nil
	}
	m.RestartCostSeconds, m.RestartCostSource = lj.spec.Job.RestartCostSeconds, events.RestartCostFromJob
	if m.RestartCostSeconds <= 0 {
		m.RestartCostSeconds, m.RestartCostSource = events.DefaultRestartCostSeconds, events.RestartCostFromDefault
	}
	m.BreakEvenSeconds = events.BreakEven(m.RestartCostSeconds, m.StepSeconds, m.GainSecondsPerStep)
	if lj.diagnosisID != "" {
		m.FindingID = lj.diagnosisID
	}
	// The proposal id is the event's own id, derived from the input being
	// handled, so that a redelivery proposes the same.
	cause := "optimizer"
	if env, ok := bus.CauseFrom(ctx); ok {
		cause = env.ID
	}
	m.ProposalID = events.DeriveID(cause, events.NamePlacementMigration, d.JobID)
	var nodes []string
	for _, np := range target.Nodes {
		nodes = append(nodes, np.Node)
	}
	if why == "" {
		why = lj.finding
		if why == "" || reason == events.MigrationBetterPlacement {
			why = "a better placement is free"
		}
	}
	m.Message = fmt.Sprintf("%s: move to %s; communication %.3g s per step there against %.3g s %s now%s, saving %.3g s of a %.3g s step; pays back a %.0f s restart after %.0f s",
		why, strings.Join(nodes, ", "), m.ProposedCommSecondsPerStep, base, map[bool]string{true: "measured", false: "predicted"}[lj.telemetry != nil],
		compute, m.GainSecondsPerStep, m.StepSeconds, m.RestartCostSeconds, m.BreakEvenSeconds)
	if _, err := s.pub.Publish(ctx, m); err != nil {
		return err
	}
	lj.proposed = key
	s.log.InfoContext(ctx, "migration proposed", "job_id", d.JobID, "proposal_id", m.ProposalID, "reason", reason,
		"gain_s_per_step", m.GainSecondsPerStep, "break_even_s", m.BreakEvenSeconds, "nodes", strings.Join(nodes, ","))
	return nil
}

// ownCompute is the job as a move plans it: where compute is weighed by
// GPU model and the job runs on GPUs of one model, with the compute time
// its latest telemetry measured there as its own time on that model
// (step_compute_seconds_by_model), so that its compute elsewhere is scaled
// from what it measured, under the compute corrections in force, not from
// what it was submitted with. snap holds the job's nodes.
func (s *Service) ownCompute(snap *store.Snapshot, lj *liveJob) events.JobAnalyzed {
	spec := *lj.spec
	t := lj.telemetry
	if s.computeRef == "" || t == nil || !(t.ComputeSeconds > 0) {
		return spec
	}
	model, ok := oneModel(snap, lj.decision)
	if !ok {
		return spec
	}
	by := make(map[string]float64, len(spec.Job.StepComputeSecondsByModel)+1)
	for k, v := range spec.Job.StepComputeSecondsByModel {
		if g, known := gpuspeed.Lookup(k); !known || g.Name != model {
			by[k] = v
		}
	}
	by[model] = t.ComputeSeconds
	spec.Job.StepComputeSecondsByModel = by
	return spec
}

// computeGain adds to m's gain what the move saves in compute, where
// compute is weighed by GPU model: the job's compute now (measured, else
// predicted) less its predicted compute on gpus, both by placement's
// compute term (aware.EstimateCompute) on spec (ownCompute). It returns
// the message's account of it ("" where compute is blind to the model or
// unknown).
func (s *Service) computeGain(snap *store.Snapshot, lj *liveJob, spec events.JobAnalyzed, gpus []store.GPUKey, m *events.PlacementMigration) string {
	if s.computeRef == "" {
		return ""
	}
	bw := s.bandwidths.Load()
	there, ok := aware.EstimateCompute(snap, spec, gpus, s.computeRef, bw)
	if !ok {
		return ""
	}
	now, ok := aware.EstimateCompute(snap, spec, gpusOf(lj.decision), s.computeRef, bw)
	if !ok {
		return ""
	}
	how := "predicted"
	if t := lj.telemetry; t != nil && t.ComputeSeconds > 0 {
		now.Seconds, how = t.ComputeSeconds, "measured"
	}
	m.GainSecondsPerStep += now.Seconds - there.Seconds
	return fmt.Sprintf("; compute %.3g s per step there (%s%s) against %.3g s %s now (%s)",
		there.Seconds, dashOr(there.Model), correctionNote(there), now.Seconds, how, dashOr(now.Model))
}

// correctionNote says, for an estimate, the compute correction in force
// on its model: ", x1.18 from 12 runs, online"; "" where none is.
func correctionNote(e aware.ComputeEstimate) string {
	c := e.Correction
	if !(c.Factor > 0) || e.Factor == 1 {
		return ""
	}
	return fmt.Sprintf(", x%.2f from %d runs, %s", c.Factor, c.Samples, c.Set)
}

func dashOr(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// stillShared reports whether a target placement would share a link with
// the neighbours the job's congestion finding named.
func (s *Service) stillShared(lj *liveJob, target *events.PlacementDecided) bool {
	if lj.diagnosis == nil {
		return false
	}
	moved := &liveJob{decision: target}
	for _, l := range s.sharedLinks(moved) {
		for _, j := range l.Jobs {
			if slices.Contains(lj.diagnosis.Evidence.NeighbourJobs, j) && j != lj.decision.JobID {
				return true
			}
		}
	}
	return false
}

func keyOf(gpus []store.GPUKey) string {
	var b strings.Builder
	for _, g := range gpus {
		b.WriteString(g.String())
		b.WriteByte(',')
	}
	return b.String()
}
