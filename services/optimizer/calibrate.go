package optimizer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/internal/calibration"
	"github.com/toposched/toposched/internal/collective"
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

// CalibrateOnline turns online calibration on, moving c's set. Call it
// before Run.
func (s *Service) CalibrateOnline(c Calibrator) {
	s.calibrator = c
	s.online = collective.NewOnline()
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
	if len(obs) == 0 {
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
	if n == 0 {
		return
	}
	cur, rev := s.calibrator.InForce()
	next := s.online.Step(cur, OnlineName)
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
		s.log.InfoContext(ctx, "online calibration step pushed", "kv_revision", kvRev, "efficiency", next.Efficiency, "fits", len(next.Fits))
	}
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
