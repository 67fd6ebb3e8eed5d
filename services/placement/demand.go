package placement

import (
	"github.com/toposched/toposched/internal/demand"
	"github.com/toposched/toposched/internal/placer"
	"github.com/toposched/toposched/internal/placer/outcome"
	"github.com/toposched/toposched/internal/store"
)

// noteDecision tells the forecast of demand (internal/demand) what a
// decision did, on the service's clock (the replay's virtual one in a
// replay, so a replay teaches it as a cluster would): every job decided
// for the first time arrives; a placed job starts, on the GPU model of
// its first GPU; a rejected one leaves. It is told after the decision,
// so that a job is never counted among the demand its own placement
// weighs. A job placed from the queue was counted when it first came.
func (s *Service) noteDecision(before *store.Snapshot, job store.Job, plan placer.Plan, fresh bool) {
	spec := job.Spec.Job
	now := s.now()
	if fresh {
		s.demand.Submitted(job.ID, spec.GPUs, spec.GPUModel, now)
	}
	switch plan.Verdict {
	case outcome.Placed:
		model := spec.GPUModel
		if n, ok := before.Node(plan.GPUs[0].Node); ok && model == "" {
			model = n.GPUModel
		}
		s.demand.Started(job.ID, len(plan.GPUs), model, now)
	case outcome.Never:
		s.demand.Ended(job.ID, now)
	}
}

// seedDemand gives a rebuilt service's forecast the queue and the running
// jobs the store holds (each running since its decision); the rates start
// again from the next submission, the run times from the next release.
func (s *Service) seedDemand(snap *store.Snapshot) {
	for _, j := range snap.JobsInState(store.JobPending) {
		s.demand.Queued(j.ID, j.Spec.Job.GPUs, j.Spec.Job.GPUModel, s.now())
	}
	for _, j := range snap.JobsInState(store.JobPlaced) {
		if d := j.Decision; d != nil && len(d.Ranks) > 0 {
			model := j.Spec.Job.GPUModel
			if n, ok := snap.Node(d.Ranks[0].Node); ok && model == "" {
				model = n.GPUModel
			}
			s.demand.Started(j.ID, len(d.Ranks), model, d.DecidedAt)
		}
	}
}

// newDemand is the service's forecast of demand: the defaults, a half
// life of an hour.
func newDemand() *demand.Forecast { return demand.New(demand.Config{}) }
