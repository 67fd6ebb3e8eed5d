package placement

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/events/bus"
	"github.com/toposched/toposched/internal/placer"
	"github.com/toposched/toposched/internal/placer/aware"
	"github.com/toposched/toposched/internal/placer/blind"
	"github.com/toposched/toposched/internal/placer/engine"
	"github.com/toposched/toposched/internal/placer/launch"
	"github.com/toposched/toposched/internal/placer/outcome"
	"github.com/toposched/toposched/internal/store"
)

// HandlerMigrate is the durable consumer of jobs.migration_accepted: part
// of the wire contract.
const HandlerMigrate = "placement-jobs-migration-accepted"

// CodeMigrationPolicyDenied refuses a migration onto a node the node
// policies deny the job.
const CodeMigrationPolicyDenied = placer.CodePolicyDenied

// migrations are the optimizer's proposals placement knows: the latest per
// running job. Proposals are advisory and live in the placement stream, so
// placement does not follow them on a consumer of its own; it reads what
// the stream holds beyond seq when a user accepts one, which also covers a
// proposal stored just before the accept that a consumer would not yet
// have delivered. The zero value is empty; guarded by Service.mu.
type migrations struct {
	// seq is the last placement stream sequence read for proposals.
	seq uint64
	// latest is the newest proposal per job; older holds the ids of the
	// ones it superseded, to tell superseded from unknown.
	latest map[string]*events.PlacementMigration
	older  map[string][]string
}

// record keeps p as its job's latest proposal.
func (m *migrations) record(p *events.PlacementMigration) {
	if m.latest == nil {
		m.latest, m.older = map[string]*events.PlacementMigration{}, map[string][]string{}
	}
	if prev := m.latest[p.JobID]; prev != nil && prev.ProposalID != p.ProposalID {
		m.older[p.JobID] = append(m.older[p.JobID], prev.ProposalID)
	}
	m.latest[p.JobID] = p
}

func (m *migrations) forget(jobID string) {
	delete(m.latest, jobID)
	delete(m.older, jobID)
}

// catchUpProposals reads the proposals stored since the last read, keeping
// those of running jobs, and forgets those of jobs no longer running.
func (s *Service) catchUpProposals(ctx context.Context) error {
	snap := s.store.Snapshot()
	running := func(id string) bool {
		j, ok := snap.Job(id)
		return ok && j.State == store.JobPlaced
	}
	err := s.read.ReplayFrom(ctx, events.DomainPlacement, []string{s.subjects.Of(events.NamePlacementMigration)}, s.mig.seq,
		func(r bus.Record) error {
			s.mig.seq = max(s.mig.seq, r.Seq)
			p, ok := decode[events.PlacementMigration](s, r)
			if ok && running(p.JobID) {
				s.mig.record(p)
			}
			return nil
		})
	if err != nil {
		return fmt.Errorf("read migration proposals: %w", err)
	}
	for id := range s.mig.latest {
		if !running(id) {
			s.mig.forget(id)
		}
	}
	return nil
}

// Proposal returns the latest migration proposal placement knows for a
// running job, reading the stream first; nil when there is none.
func (s *Service) Proposal(ctx context.Context, jobID string) (*events.PlacementMigration, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.catchUpProposals(ctx); err != nil {
		return nil, err
	}
	return s.mig.latest[jobID], nil
}

// OnMigrationAccepted applies a job's migration proposal, exactly as
// proposed, or refuses it. Nothing is re-planned: the proposal's GPUs are
// re-checked and taken in one store transaction (store.Move) that frees
// the GPUs the job leaves, and the new placement.decided, with its
// Migration set, replaces the job's decision. A refusal
// (placement.migration_refused) changes nothing.
//
// A redelivered request (a crash after the decision was published, before
// the request was acknowledged) finds the job already moved by this very
// request, as the rebuild replayed that decision, and does nothing.
func (s *Service) OnMigrationAccepted(ctx context.Context, env events.Envelope, req *events.JobMigrationAccepted) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	log := s.log.With("job_id", req.JobID, "request_id", env.ID, "correlation_id", env.CorrelationID)
	refuse := func(proposal, code, format string, args ...any) error {
		ev := &events.PlacementMigrationRefused{JobID: req.JobID, ProposalID: proposal, RequestID: env.ID,
			Reasons: []events.Reason{{Code: code, Message: fmt.Sprintf(format, args...)}}}
		if _, err := s.publish(ctx, ev); err != nil {
			return err
		}
		log.Info("migration refused", "proposal_id", proposal, "code", code, "reason", ev.Reasons[0].Message)
		return nil
	}

	j, ok := s.store.Snapshot().Job(req.JobID)
	if !ok || j.State != store.JobPlaced || j.Decision == nil {
		state := "unknown"
		if ok {
			state = string(j.State)
		}
		return refuse(req.ProposalID, events.RefusedJobNotRunning, "job %s is not running (%s): only a placed job can move", req.JobID, state)
	}
	if m := j.Decision.Migration; m != nil && m.RequestID == env.ID {
		log.Info("migration request already applied; redelivery ignored", "proposal_id", m.ProposalID)
		return nil
	}
	if env.Scope.Kind == events.ScopeTenant && j.Spec.Job.Tenant != env.Scope.Name {
		return refuse(req.ProposalID, events.CodeNotPermitted, "tenant %s moves its own jobs only, and %s is not one", env.Scope.Name, req.JobID)
	}
	if j.Spec.Job.Command != "" {
		// Its ranks would run on where the move frees their GPUs.
		return refuse(req.ProposalID, events.RefusedLaunched,
			"job %s runs under the node agents (it names a command), which do not move running ranks: cancel it and submit it again to move it", req.JobID)
	}
	if err := s.catchUpProposals(ctx); err != nil {
		return bus.Transient(err)
	}
	p := s.mig.latest[req.JobID]
	switch {
	case p == nil:
		return refuse(req.ProposalID, events.RefusedNoProposal, "no migration proposal for job %s", req.JobID)
	case req.ProposalID != "" && req.ProposalID != p.ProposalID && slices.Contains(s.mig.older[req.JobID], req.ProposalID):
		return refuse(req.ProposalID, events.RefusedSuperseded, "proposal %s was superseded by %s (%s)", req.ProposalID, p.ProposalID, p.Message)
	case req.ProposalID != "" && req.ProposalID != p.ProposalID:
		return refuse(req.ProposalID, events.RefusedNoProposal, "job %s has no proposal %s; its latest is %s", req.JobID, req.ProposalID, p.ProposalID)
	}
	if m := j.Decision.Migration; m != nil && m.ProposalID == p.ProposalID {
		return refuse(p.ProposalID, events.RefusedPlacementChanged, "proposal %s was applied already (request %s)", p.ProposalID, m.RequestID)
	}
	if !sameNodes(p.CurrentNodes, j.Decision.Nodes) {
		return refuse(p.ProposalID, events.RefusedPlacementChanged,
			"job %s has moved since proposal %s was made: it runs on %s, the proposal expected %s",
			req.JobID, p.ProposalID, nodesString(j.Decision.Nodes), nodesString(p.CurrentNodes))
	}
	gpus, err := proposalGPUs(p, len(j.Decision.Ranks))
	if err != nil {
		return refuse(p.ProposalID, events.RefusedInvalid, "proposal %s: %v", p.ProposalID, err)
	}
	before := s.store.Snapshot()
	if code, msg := s.migrationBlocked(ctx, before, j, gpus); code != "" {
		return refuse(p.ProposalID, code, "%s", msg)
	}

	prev := j.Decision
	freed, err := s.store.Move(j.ID, gpus)
	if errors.Is(err, store.ErrConflict) {
		return refuse(p.ProposalID, events.RefusedGPUsUnavailable, "%v", err)
	}
	if err != nil {
		return fmt.Errorf("move %s: %w", j.ID, err)
	}
	d := outcome.Decide(j.ID, gpus, s.strategy)
	d.DecidedAt = s.now().UTC()
	launch.Fill(&d, s.store.Snapshot())
	// The baseline is blind first fit for the job on the cluster as it
	// was, the job's own GPUs still held: what a resubmission would get.
	d.Prediction, d.Baseline = s.predict(ctx, before, j.Spec, gpus, blind.Place(before, j.Spec))
	d.Migration = &events.Migration{ProposalID: p.ProposalID, RequestID: env.ID, PreviousNodes: bareNodes(prev.Nodes), Reason: p.Reason}
	if _, err := s.publish(ctx, &d); err != nil {
		// Put the job back where it was: the GPUs it left are still free,
		// since every change to the store happens under s.mu.
		if _, rerr := s.store.RestoreMove(j.ID, gpusOf(prev)); rerr != nil {
			return errors.Join(err, fmt.Errorf("roll back migration of %s: %w", j.ID, rerr))
		}
		return err
	}
	j.Decision = &d
	if err := s.store.UpsertJob(j); err != nil {
		return fmt.Errorf("record job %s: %w", j.ID, err)
	}
	log.Info("job migrated", "proposal_id", p.ProposalID, "reason", p.Reason, "from", nodesString(prev.Nodes),
		"to", nodesString(d.Nodes), "gpus_freed", len(freed), "gain_seconds_per_step", p.GainSecondsPerStep)
	// The GPUs the job left may let waiting jobs in.
	return s.retryPending(ctx)
}

// migrationBlocked checks what placement enforces beyond free and healthy
// GPUs on the nodes a migration newly uses: the node policies, and the
// nodes held for an older waiting job. It returns a refusal code and
// message, or "".
func (s *Service) migrationBlocked(ctx context.Context, snap *store.Snapshot, j store.Job, gpus []store.GPUKey) (string, string) {
	current := map[string]bool{}
	for _, n := range j.Decision.Nodes {
		current[n.Node] = true
	}
	var added []string
	for _, g := range gpus {
		if !current[g.Node] && !slices.Contains(added, g.Node) {
			added = append(added, g.Node)
		}
	}
	if res := s.reservation.Holds(j.Spec); res != nil {
		for _, n := range added {
			if res.Nodes[n] {
				return events.RefusedReserved, fmt.Sprintf("node %s is held for job %s (priority %d), which has waited since %s",
					n, res.JobID, res.Priority, res.Since.UTC().Format("2006-01-02T15:04:05Z"))
			}
		}
	}
	pv := placer.NewPolicyCheck(ctx, snap, s.policies, j.Spec, s.log)
	for _, n := range added {
		node, ok := snap.Node(n)
		if !ok {
			continue // Move names a missing node's GPUs
		}
		if !pv.AllowsNode(node) {
			return CodeMigrationPolicyDenied, fmt.Sprintf("the node policies deny node %s to job %s", n, j.ID)
		}
	}
	if pv.Judges() {
		// The placement policies judge the proposed placement as they
		// would any candidate (the job's own GPUs count as held).
		c := engine.Candidate{Domain: store.ClusterDomain, GPUs: gpus}
		if r, err := aware.Predict(snap, j.Spec, gpus, s.fabric); err == nil {
			c.CommSeconds = r.CommSeconds
		}
		if jd := pv.Judge(c); jd.Deny {
			msgs := make([]string, len(jd.Reasons))
			for i, r := range jd.Reasons {
				msgs[i] = r.Policy + ": " + r.Message
			}
			return CodeMigrationPolicyDenied, fmt.Sprintf("the placement policies deny the proposed placement: %s", strings.Join(msgs, "; "))
		}
	}
	return "", ""
}

// proposalGPUs reads a proposal's GPUs in rank order, checking that it
// places ranks 0..n-1 once each, on distinct GPUs.
func proposalGPUs(p *events.PlacementMigration, n int) ([]store.GPUKey, error) {
	if len(p.Ranks) != n {
		return nil, fmt.Errorf("places %d ranks; the job has %d", len(p.Ranks), n)
	}
	out := make([]store.GPUKey, n)
	seen := make(map[store.GPUKey]int, n)
	for i, r := range p.Ranks {
		if r.Rank != i {
			return nil, fmt.Errorf("ranks[%d] is rank %d: ranks must be 0..%d in order", i, r.Rank, n-1)
		}
		k := store.GPUKey{Node: r.Node, Index: r.GPU}
		if other, dup := seen[k]; dup {
			return nil, fmt.Errorf("GPU %s is given to ranks %d and %d", k, other, i)
		}
		seen[k] = i
		out[i] = k
	}
	return out, nil
}

// sameNodes reports whether two placements use the same GPUs of the same
// nodes, whatever their order.
func sameNodes(a, b []events.NodePlacement) bool {
	set := func(ns []events.NodePlacement) map[store.GPUKey]bool {
		m := map[store.GPUKey]bool{}
		for _, n := range ns {
			for _, g := range n.GPUs {
				m[store.GPUKey{Node: n.Node, Index: g}] = true
			}
		}
		return m
	}
	sa, sb := set(a), set(b)
	if len(sa) != len(sb) {
		return false
	}
	for k := range sa {
		if !sb[k] {
			return false
		}
	}
	return true
}

// bareNodes keeps what says where a job was: node, GPUs and
// CUDA_VISIBLE_DEVICES, without the launch artefacts.
func bareNodes(ns []events.NodePlacement) []events.NodePlacement {
	out := make([]events.NodePlacement, len(ns))
	for i, n := range ns {
		out[i] = events.NodePlacement{Node: n.Node, GPUs: slices.Clone(n.GPUs), CUDAVisibleDevices: n.CUDAVisibleDevices}
	}
	return out
}

// nodesString renders a placement as "node:gpus node:gpus" for logs and
// messages.
func nodesString(ns []events.NodePlacement) string {
	parts := make([]string, len(ns))
	for i, n := range ns {
		parts[i] = n.Node + ":" + n.CUDAVisibleDevices
	}
	return strings.Join(parts, " ")
}
