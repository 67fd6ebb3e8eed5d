package optimizer

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/events/bus"
)

// HandlerTelemetry is the durable consumer of runtime.telemetry.
const HandlerTelemetry = "optimizer-runtime-telemetry"

// ErrTelemetry is wrapped by the errors of telemetry that passes its schema
// but cannot be true. Such a message goes to the dead letters with the
// reason, as a malformed one does.
var ErrTelemetry = errors.New("telemetry refused")

// ParseTelemetry reads a runtime.telemetry body: its schema (which bounds
// the groups at events.MaxTelemetryGroups and the ranks at
// events.MaxTelemetryRanks, and every figure's range), then what a schema
// cannot say: compute no longer than the step, no group twice, no group
// longer than the step, no rank twice.
func ParseTelemetry(body []byte) (*events.RuntimeTelemetry, error) {
	var t events.RuntimeTelemetry
	if err := bus.Decode(events.NameRuntimeTelemetry, body, &t); err != nil {
		return nil, err
	}
	if err := CheckTelemetry(&t); err != nil {
		return nil, err
	}
	return &t, nil
}

// CheckTelemetry is ParseTelemetry's checks beyond the schema.
func CheckTelemetry(t *events.RuntimeTelemetry) error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: job %s step %d: %s", ErrTelemetry, t.JobID, t.Step, fmt.Sprintf(format, args...)))
	}
	finite := func(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }
	if !finite(t.StepSeconds) || !finite(t.ComputeSeconds) || t.StepSeconds <= 0 || t.ComputeSeconds < 0 {
		bad("step_seconds %v and compute_seconds %v: expected a positive step and a compute time of at least 0", t.StepSeconds, t.ComputeSeconds)
	} else if t.ComputeSeconds > t.StepSeconds*1.001 {
		bad("compute_seconds %.6g is longer than step_seconds %.6g", t.ComputeSeconds, t.StepSeconds)
	}
	if len(t.Groups) > events.MaxTelemetryGroups {
		bad("%d groups: at most %d", len(t.Groups), events.MaxTelemetryGroups)
	}
	if len(t.Ranks) > events.MaxTelemetryRanks {
		bad("%d ranks: at most %d", len(t.Ranks), events.MaxTelemetryRanks)
	}
	seen := map[string]bool{}
	for i, g := range t.Groups {
		key := g.Group + "/" + g.Collective
		if seen[key] {
			bad("groups[%d]: group %s %s given twice", i, g.Group, g.Collective)
		}
		seen[key] = true
		if g.Seconds <= 0 && g.BusBWGBps <= 0 {
			bad("groups[%d]: group %s gives neither seconds nor busbw_gbps", i, g.Group)
		}
		if g.Seconds > t.StepSeconds*1.001 {
			bad("groups[%d]: group %s takes %.6g s, longer than the step's %.6g s", i, g.Group, g.Seconds, t.StepSeconds)
		}
	}
	ranks := map[int]bool{}
	for i, r := range t.Ranks {
		if ranks[r.Rank] {
			bad("ranks[%d]: rank %d given twice", i, r.Rank)
		}
		ranks[r.Rank] = true
	}
	return errors.Join(errs...)
}

// OnTelemetry compares a running job's telemetry with its prediction and
// publishes a runtime.diagnosis when the finding changes.
func (s *Service) OnTelemetry(ctx context.Context, env events.Envelope, t *events.RuntimeTelemetry) error {
	if err := CheckTelemetry(t); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if time.Since(s.placementSynced) > placementFresh {
		// Decisions and releases may have gone to another replica.
		if err := s.catchUpPlacement(ctx); err != nil {
			return err
		}
	}
	lj := s.live[t.JobID]
	if lj == nil {
		// Telemetry may come before the optimizer has read the decision
		// of its job: catch up with the placement stream first.
		if err := s.catchUpPlacement(ctx); err != nil {
			return err
		}
		if lj = s.live[t.JobID]; lj == nil {
			s.log.WarnContext(ctx, "telemetry for a job that does not run ignored", "job_id", t.JobID, "step", t.Step)
			return nil
		}
	}
	if env.Scope.Kind == events.ScopeTenant && lj.spec == nil {
		if err := s.ready(ctx, lj); err != nil {
			return err
		}
	}
	if why := telemetryRefused(env.Scope, lj); why != "" {
		// Another tenant's, or another node's, word on a job: it would
		// bend the job's diagnosis and migration proposals.
		s.log.WarnContext(ctx, "telemetry ignored: not the sender's job", "job_id", t.JobID, "scope", env.Scope.String(), "reason", why)
		return nil
	}
	for _, r := range t.Ranks {
		if r.Rank >= len(lj.decision.Ranks) {
			return fmt.Errorf("%w: job %s step %d: rank %d: the job has %d ranks", ErrTelemetry, t.JobID, t.Step, r.Rank, len(lj.decision.Ranks))
		}
	}
	if lj.tuning == nil || lj.tunedWith != s.bandwidths.Load() {
		// Not tuned yet by this replica, or tuned before the calibration
		// in force: compare with what the model predicts now.
		if err := s.ready(ctx, lj); errors.Is(err, ErrUnknownJob) {
			// Said once, on the decision; its telemetry is not diagnosed.
			s.log.DebugContext(ctx, "telemetry of a decision the streams cannot back ignored", "job_id", t.JobID)
			return nil
		} else if err != nil {
			return err
		}
		if _, err := s.retune(lj); err != nil {
			s.log.WarnContext(ctx, "telemetry not diagnosed: no prediction", "job_id", t.JobID, "err", err)
			return nil
		}
	}
	lj.telemetry = t
	dg := s.diagnose(lj, t)
	dg.DiagnosedAt = s.now().UTC()
	s.calibrate(ctx, lj, t, dg)
	if dg.Finding == lj.finding {
		return nil // published on change only
	}
	dg.Previous = lj.finding
	env, err := s.pub.Publish(ctx, dg)
	if err != nil {
		return err
	}
	lj.diagnosisID = env.ID
	lj.finding, lj.diagnosis, lj.proposed = dg.Finding, dg, ""
	s.log.InfoContext(ctx, "job diagnosed", "job_id", t.JobID, "finding", dg.Finding, "previous", dg.Previous, "step", t.Step,
		"ratio", dg.Evidence.Ratio, "message", dg.Message)
	if reason, ok := movable[lj.finding]; ok {
		return s.propose(ctx, lj, reason)
	}
	return nil
}

// rebuildRuntime restores the last finding published per live job, so a
// restart does not repeat it.
func (s *Service) rebuildRuntime(ctx context.Context) error {
	err := s.read.Replay(ctx, events.DomainRuntime, []string{s.subjects.Of(events.NameRuntimeDiagnosis)}, func(r bus.Record) error {
		var dg events.RuntimeDiagnosis
		if err := s.read.Decode(r.Name, r.Body, &dg); err != nil {
			s.log.Warn("rebuild: diagnosis skipped", "seq", r.Seq, "err", err)
			return nil
		}
		// A finding made before the job's current decision (it migrated
		// since) is not the current one's.
		if lj := s.live[dg.JobID]; lj != nil && !dg.DiagnosedAt.Before(lj.decision.DecidedAt) {
			lj.finding, lj.diagnosis = dg.Finding, &dg
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("optimizer: rebuild findings: %w", err)
	}
	return nil
}

// telemetryRefused says why the identity of scope may not report on lj's
// job, "" when it may: a tenant reports on its own jobs, a node's agent on
// the jobs with ranks on its node, the services on any.
func telemetryRefused(scope events.Scope, lj *liveJob) string {
	switch scope.Kind {
	case events.ScopeTenant:
		if lj.spec == nil || lj.spec.Job.Tenant != scope.Name {
			return fmt.Sprintf("tenant %s reports on its own jobs only", scope.Name)
		}
	case events.ScopeNode:
		if !slices.ContainsFunc(lj.decision.Ranks, func(r events.RankPlacement) bool { return r.Node == scope.Name }) {
			return fmt.Sprintf("node %s runs no rank of the job", scope.Name)
		}
	}
	return ""
}
