package optimizer

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/internal/calibration"
	"github.com/toposched/toposched/internal/collective"
	"github.com/toposched/toposched/internal/gpuspeed"
	"github.com/toposched/toposched/internal/placer/aware"
	"github.com/toposched/toposched/internal/store"
	"github.com/toposched/toposched/services/optimizer/tuning"
)

// Online calibration: what running jobs measure moves the cost model.
//
// Each telemetry group reported with its bus bandwidth (or its time) and
// a message big enough for the bandwidth term to decide its prediction is
// one observation of the kind of link that bounds it (collective.Online):
// measured over predicted bandwidth, the predicted latency taken off the
// measured time. A job whose slowness a diagnosis explains (a degraded
// part, ranks on the wrong NIC, a neighbour on its links) is left out: its
// numbers say nothing about the machine's rate. When a kind has enough
// observations, its move is put in the calibration bucket as a new version
// named "online" over the set in force, and every replica, placement's
// included, takes it from there (policy.calibration_applied).
//
// Where compute is weighed by GPU model (Config.ComputeReference), the
// same telemetry's compute time is also one observation of its GPU
// model's speed against the speed table (collective.OnlineCompute): the
// measured compute over what placement's compute term predicts for the
// job there (aware.EstimateCompute, the correction in force included),
// times that correction. Left out besides what a diagnosis explains:
//
//   - a job whose compute time placement only estimated from its model's
//     size: the estimate's error is its guess of the model's FLOPs
//     utilisation, which differs from one network to another, not the
//     GPU's speed, and would be learnt as the model's;
//   - a job that gave its own compute time for the model it runs on:
//     nothing was scaled, so it says nothing of the table (and its own
//     measurements stay what placement charges it);
//   - a job over GPUs of several models: one compute time is reported
//     for the job, and which rank's it is cannot be known (a fast rank
//     waits for the slow one in the collective, which its compute time
//     does not show), so it cannot be put on one model.
//
// Link and compute moves due on the same telemetry go out as one set.

// Calibrator is the calibration in force and where moves go; the
// operator's calibration loop is one, and tests give their own.
type Calibrator interface {
	// InForce is the set in force (nil: the documented efficiencies) and
	// its revision.
	InForce() (*collective.Calibration, string)
	// Push puts a move computed from the set of revision basedOn in
	// force; calibration.ErrMoved when another set came first.
	Push(ctx context.Context, c *collective.Calibration, basedOn string) (uint64, error)
}

// OnlineName is the name of the sets the online calibration writes.
const OnlineName = "online"

// bandwidthBound is the least share of a call's predicted time that the
// bandwidth term must have for the call to calibrate a bandwidth.
const bandwidthBound = 0.8

// CalibrateOnline turns online calibration on, moving c's set: the links'
// efficiencies, and the GPU models' compute factors where compute is
// weighed by model (Config.ComputeReference). Call it before Run.
func (s *Service) CalibrateOnline(c Calibrator) {
	s.calibrator = c
	s.online = collective.NewOnline()
	if s.computeRef != "" {
		s.onlineCompute = collective.NewOnlineCompute()
	}
}

// calibrate files the telemetry's observations and pushes a move when one
// is due. s.mu is held.
func (s *Service) calibrate(ctx context.Context, lj *liveJob, t *events.RuntimeTelemetry, dg *events.RuntimeDiagnosis) {
	if s.online == nil {
		return
	}
	switch dg.Finding {
	case events.FindingLinkDegraded, events.FindingNICAffinity, events.FindingCongestion:
		return
	}
	obs := observations(lj.plan, t)
	cob, computed := s.computeObservation(lj, t)
	if len(obs) == 0 && !computed {
		return
	}
	// The checks a slow diagnosis runs, run here for any: a neighbour
	// slows a job without making it slow enough to be named.
	if len(s.sharedLinks(lj)) > 0 || len(s.degraded(lj)) > 0 {
		return
	}
	source := fmt.Sprintf("telemetry:%s@%d", t.JobID, t.Step)
	n := 0
	for _, ob := range obs {
		ob.Source = source
		if s.online.Observe(ob) {
			n++
		}
	}
	if computed {
		cob.Source = source
		if s.onlineCompute.Observe(cob) {
			n++
		}
	}
	if n == 0 {
		return
	}
	cur, rev := s.calibrator.InForce()
	next := s.online.Step(cur, OnlineName)
	if s.onlineCompute != nil {
		base := cur
		if next != nil {
			base = next
		}
		if moved := s.onlineCompute.Step(base, OnlineName, s.now()); moved != nil {
			next = moved
		}
	}
	if next == nil {
		return
	}
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	kvRev, err := s.calibrator.Push(pctx, next, rev)
	switch {
	case errors.Is(err, calibration.ErrMoved):
		s.log.InfoContext(ctx, "online calibration step dropped: the calibration in force changed meanwhile", "based_on", rev)
	case err != nil:
		s.log.WarnContext(ctx, "online calibration step not pushed", "err", err)
	default:
		s.log.InfoContext(ctx, "online calibration step pushed", "kv_revision", kvRev, "efficiency", next.Efficiency, "fits", len(next.Fits),
			"compute", computeFactors(next))
	}
}

// computeFactors is a set's compute factors for the log: "T4 x1.18".
func computeFactors(c *collective.Calibration) string {
	parts := make([]string, len(c.Compute))
	for i, f := range c.Compute {
		parts[i] = fmt.Sprintf("%s x%.3g", f.Model, f.Factor)
	}
	return strings.Join(parts, ", ")
}

// computeObservation is a telemetry's observation of its GPU model's
// compute speed, where it is one (see the comment at the top). s.mu is
// held.
func (s *Service) computeObservation(lj *liveJob, t *events.RuntimeTelemetry) (collective.ComputeObservation, bool) {
	if s.onlineCompute == nil || lj.spec == nil || !(t.ComputeSeconds > 0) ||
		(!(lj.spec.Job.StepComputeSeconds > 0) && len(lj.spec.Job.StepComputeSecondsByModel) == 0) {
		// The last: only an estimate from the model's size (checked
		// again on the estimate; this spares working it out).
		return collective.ComputeObservation{}, false
	}
	bw := s.bandwidths.Load()
	p := lj.compute
	if p == nil || p.with != bw || p.topoSeq != s.topoSeq {
		p = &computePrediction{with: bw, topoSeq: s.topoSeq}
		snap := s.store.Snapshot()
		if p.model, p.ok = oneModel(snap, lj.decision); p.ok {
			p.est, p.ok = aware.EstimateCompute(snap, *lj.spec, gpusOf(lj.decision), s.computeRef, bw)
		}
		lj.compute = p
	}
	est, model := p.est, p.model
	if !p.ok || est.Estimated || est.From == "" || est.From == model {
		return collective.ComputeObservation{}, false
	}
	factor := t.ComputeSeconds / est.Seconds
	if est.Correction.Factor > 0 {
		factor *= est.Correction.Factor
	}
	return collective.ComputeObservation{Model: model, Job: t.JobID, Factor: factor, At: s.now()}, true
}

// oneModel is the speed table's name of the GPU model of every node of a
// decision; ok is false where they are of several, or of one the table
// does not know.
func oneModel(snap *store.Snapshot, d *events.PlacementDecided) (string, bool) {
	model := ""
	for _, np := range d.Nodes {
		n, ok := snap.Node(np.Node)
		if !ok {
			return "", false
		}
		spec, ok := gpuspeed.Lookup(n.GPUModel)
		if !ok || (model != "" && spec.Name != model) {
			return "", false
		}
		model = spec.Name
	}
	return model, model != ""
}

// observations pairs a telemetry's groups with the plan's phases: measured
// over predicted bandwidth of each bandwidth-bound call.
func observations(plan tuning.Plan, t *events.RuntimeTelemetry) []collective.Observation {
	var out []collective.Observation
	for _, g := range t.Groups {
		for _, r := range plan.Phases {
			if r.Phase.Name == g.Group && eventCollective(r.Phase.Collective) == g.Collective {
				if ob, ok := observe(r, g); ok {
					out = append(out, ob)
				}
				break
			}
		}
	}
	return out
}

// observe is one group's observation, when its prediction is bandwidth
// bound: the predicted bandwidth term over the measured time of a call
// less the predicted latency.
func observe(r tuning.PhaseResult, g events.GroupTelemetry) (collective.Observation, bool) {
	ph := r.Phase
	if r.BottleneckKind == "" || r.Beta <= 0 {
		return collective.Observation{}, false
	}
	bytes := ph.Bytes
	if g.Bytes > 0 {
		bytes = float64(g.Bytes)
	}
	var measured float64 // one call, seconds
	switch {
	case g.BusBWGBps > 0:
		measured = bytes * collective.BusFactor(ph.Collective, len(ph.Members[0])) / (g.BusBWGBps * 1e9)
	case g.Seconds > 0:
		calls := max(ph.Calls, 1)
		if g.Calls > 0 {
			calls = g.Calls
		}
		measured = g.Seconds / float64(calls)
	}
	bwTerm := r.Beta * bytes
	if measured <= r.Alpha || bwTerm < bandwidthBound*(r.Alpha+bwTerm) {
		return collective.Observation{}, false
	}
	return collective.Observation{Kind: r.BottleneckKind, Ratio: bwTerm / (measured - r.Alpha)}, true
}
