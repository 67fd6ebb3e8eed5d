package placer

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/internal/demand"
	"github.com/toposched/toposched/internal/placer/engine"
	"github.com/toposched/toposched/internal/placer/outcome"
	"github.com/toposched/toposched/internal/store"
	"github.com/toposched/toposched/internal/topology"
	"github.com/toposched/toposched/policies"
)

// Planner decides where one job goes on a snapshot of the store, changing
// nothing: the strategy, the policies in force and the reservation held
// for a starving job. The service commits what it plans; dry runs and the
// load command call it directly, so all three decide alike.
type Planner struct {
	// Strategy names one of Names(false); "" is topology-aware.
	Strategy string
	Fabric   *topology.Fabric
	// Bandwidths of the cost model (nil: the defaults; a calibration's).
	Bandwidths *topology.Bandwidths
	// Policies in force; nil means none.
	Policies *policies.Set
	// Reservation, when set, keeps its nodes from jobs that do not come
	// before the job it is held for; with Backfill, not from one expected
	// to end before the jobs on them (see Reservation).
	Reservation *Reservation
	Backfill    bool
	// Log receives policy evaluation errors (nil: slog.Default).
	Log *slog.Logger
	// SearchBudget is topology-aware's local-search budget on the wall
	// clock (engine.Options.Budget: 0 the default, negative none).
	SearchBudget time.Duration
	// Compact, when set, keeps a topology-aware job off a spread over
	// nodes much slower than its ideal placement (see Compact).
	Compact *Compact
	// ComputeReference weighs compute by GPU model
	// (engine.Options.ComputeReference; "": blind to the model).
	ComputeReference string
	// Demand, when set, is what placement expects next, and Now the
	// decision's time (engine.Options.Demand).
	Demand *demand.Forecast
	Now    time.Time
	// FitTolerance is engine.Options.FitTolerance (0: the default;
	// negative: the fastest one-node placement wins).
	FitTolerance float64
}

// Plan is what a Planner decided for one job.
type Plan struct {
	Verdict outcome.Verdict
	// GPUs in rank order, when placed.
	GPUs []store.GPUKey
	// Reasons of a wait or a rejection.
	Reasons []events.Reason
	// Baseline is what blind first fit does on the same snapshot.
	Baseline outcome.Result
	// Warnings are the policies' warnings on the chosen placement.
	Warnings []events.Reason
	// Explanation says what was looked at and why this came out.
	Explanation *events.Explanation
	// Counterfactuals say what would let a waiting or rejected job fit
	// (computed only with PlanOptions.Counterfactuals).
	Counterfactuals []events.Counterfactual
}

// PlanOptions tune one Plan call.
type PlanOptions struct {
	// Counterfactuals asks for what-ifs on a wait or a rejection. They
	// cost a walk over the running jobs, so a retry from the queue, which
	// publishes nothing while the job still waits, leaves them out.
	Counterfactuals bool
	// Running, when set, keeps the running jobs the counterfactuals weigh
	// from one Plan to the next while no placed job changes (a burst's
	// waiting jobs are decided on one set of running jobs): the list is a
	// walk over every running job. Nil lists them for each Plan.
	Running *Running
}

// Reason codes of the planner.
const (
	CodePolicyDenied = "policy_denied"
	CodeReserved     = "reserved_for_older_job"
)

// Plan decides for job on snap.
func (p *Planner) Plan(ctx context.Context, snap *store.Snapshot, job events.JobAnalyzed, o PlanOptions) (Plan, error) {
	log := p.Log
	if log == nil {
		log = slog.Default()
	}
	pv := newPolicyView(ctx, snap, p.Policies, job, log)
	x := &engine.Explain{}
	opts := engine.Options{Fabric: p.Fabric, Bandwidths: p.Bandwidths, Budget: p.SearchBudget, Explain: x, ComputeReference: p.ComputeReference,
		Demand: p.Demand, Now: p.Now, FitTolerance: p.FitTolerance}
	reserved := 0
	res := p.Reservation.Holds(job)
	var backfill *events.Backfill
	if res != nil {
		if backfill = p.backfill(snap, job, res); backfill != nil {
			res = nil
		}
	}
	if res != nil || pv.filters() {
		// Without either, no node is refused: the strategies walk no
		// filter (and blind and the peers take their plain first walks).
		opts.Filter = func(n engine.NodeView) bool {
			if res != nil && res.Nodes[n.Node.Name] {
				reserved++
				return false
			}
			return pv.allowNode(n)
		}
	}
	if pv.judges() {
		opts.Judge = pv.judge
	}
	strat, err := Lookup(p.Strategy, false)
	if err != nil {
		return Plan{}, err
	}
	if strat.Name() == StrategyTopologyAware {
		opts.Compact = p.Compact.check(snap, job, p.Reservation)
	}
	r, base, err := strat.Place(engine.Request{Snap: snap, Job: job, Options: opts})
	if err != nil {
		return Plan{}, err
	}
	compact := r.Verdict == outcome.Wait && x.CompactAwaited
	out := Plan{Verdict: r.Verdict, GPUs: r.GPUs, Reasons: r.Reasons, Baseline: base}
	ex := x.Explanation
	if p.Policies != nil {
		ex.PolicyRevision = p.Policies.Revision
	}
	ex.NodesDenied = pv.denials()
	ex.NodesReserved = reserved
	if backfill != nil && r.Verdict == outcome.Placed && slices.ContainsFunc(r.GPUs, func(g store.GPUKey) bool { return p.Reservation.Nodes[g.Node] }) {
		ex.Backfill = backfill
	}
	// Blind's verdict on capacity comes before any candidate is looked
	// at; an explanation says something only once placement got further.
	if ex.NodesConsidered > 0 || len(ex.Candidates) > 0 || len(ex.NodesDenied) > 0 || reserved > 0 || ex.Backfill != nil {
		out.Explanation = &ex
	}
	switch {
	case compact:
		// It fits now: no job's end is what it waits for.
	case r.Verdict == outcome.Placed:
		out.Warnings = pv.warnings(x.Judgement, r.GPUs)
	case r.Verdict == outcome.Wait && x.PolicyDenied:
		out.Reasons = r.Reasons
		if o.Counterfactuals || !hasRunning(snap) {
			out.Counterfactuals = policyCounterfactuals(r.Reasons)
		}
		if !hasRunning(snap) {
			// Nothing runs: no job's end can change what the policies
			// see, so the denial is final on this cluster.
			out.Verdict = outcome.Never
		}
	case r.Verdict == outcome.Wait:
		if never, reasons := pv.nodesForbid(job); never {
			// The nodes the node policies allow could not hold the job
			// even empty.
			out.Verdict, out.Reasons = outcome.Never, reasons
			out.Counterfactuals = policyCounterfactuals(reasons)
			break
		}
		if reserved > 0 {
			out.Reasons = append(out.Reasons, events.Reason{Code: CodeReserved, Field: "priority",
				Message: fmt.Sprintf("%d nodes are held for job %s (priority %d, waiting since %s) so that it does not starve",
					reserved, res.JobID, res.Priority, res.Since.UTC().Format(time.RFC3339))})
		}
		if o.Counterfactuals {
			out.Counterfactuals = jobsCounterfactual(snap, job, o.Running, func(n store.Node) bool { return opts.Filter == nil || opts.Filter(pv.viewOf(n)) })
		}
	case r.Verdict == outcome.Never:
		out.Counterfactuals = capacityCounterfactual(snap, job)
	}
	return out, nil
}

func hasRunning(snap *store.Snapshot) bool { return snap.AnyJobInState(store.JobPlaced) }

// policyCounterfactuals names, per denying policy, what it would have to
// allow.
func policyCounterfactuals(reasons []events.Reason) []events.Counterfactual {
	var out []events.Counterfactual
	for _, r := range reasons {
		pol := r.Policy
		if pol == "" {
			pol = "the placement policy"
		}
		out = append(out, events.Counterfactual{Kind: events.CounterfactualPolicy, Policy: r.Policy,
			Message: fmt.Sprintf("fits if %s allowed it: %s", pol, r.Message)})
	}
	return out
}

// capacityCounterfactual says how far a never-fitting job is from the
// cluster's capacity.
func capacityCounterfactual(snap *store.Snapshot, job events.JobAnalyzed) []events.Counterfactual {
	model := job.Job.GPUModel
	total, healthy := snap.Capacity(model)
	of := ""
	if model != "" {
		of = " of model " + model
	}
	n := job.Job.GPUs
	switch {
	case total >= n && healthy < n:
		return []events.Counterfactual{{Kind: events.CounterfactualCapacity,
			Message: fmt.Sprintf("fits when %d unhealthy GPUs%s recover (%d of %d healthy, %d needed)", n-healthy, of, healthy, total, n)}}
	case total < n && total > 0:
		return []events.Counterfactual{{Kind: events.CounterfactualCapacity,
			Message: fmt.Sprintf("fits on a cluster with %d more GPUs%s (%d here, %d needed)", n-total, of, total, n)}}
	}
	return nil
}

// maxJobsNamed bounds the jobs a jobs_finish counterfactual lists.
const maxJobsNamed = 8

// jobsCounterfactual finds running jobs whose end would leave room for a
// waiting job: the smallest single job (by the GPUs it holds) that does,
// else the fewest of the largest. Room is counted in free GPUs of the
// job's model on nodes the filter allows (whole gpus_per_node blocks where
// the job asks for them); policies that judge the whole placement may
// still refuse what fits.
//
// Every waiting job's first decision asks it, of a cluster whose nodes
// all run jobs, so it asks the filter only of the nodes of the jobs it
// weighs: jobs are ordered by the GPUs they hold wherever they are, and a
// job too small to leave room even were all of its GPUs allowed is passed
// over unasked.
func jobsCounterfactual(snap *store.Snapshot, job events.JobAnalyzed, cache *Running, filter func(store.Node) bool) []events.Counterfactual {
	model, n, gpn := job.Job.GPUModel, job.Job.GPUs, job.Job.GPUsPerNode
	allowed := map[string]bool{}
	ok := func(node string) bool {
		a, seen := allowed[node]
		if !seen {
			nd, found := snap.Node(node)
			a = found && filter(nd)
			allowed[node] = a
		}
		return a
	}
	free := map[string]int{}
	freeSum, wholeFree := 0, 0 // free GPUs; nodes with gpn free
	for d := range snap.NodesWithFree(model, 1) {
		if f := d.FreeOf(model); ok(d.Node) {
			free[d.Node] = f
			freeSum += f
			if gpn > 0 && f >= gpn {
				wholeFree++
			}
		}
	}
	// fits reports whether the free GPUs and extra (allowed node → GPUs
	// freed) hold the job.
	fits := func(extra map[string]int) bool {
		if gpn > 0 {
			nodes := wholeFree
			for node, e := range extra {
				if f := free[node]; f < gpn && f+e >= gpn {
					nodes++
				}
			}
			return nodes >= n/gpn
		}
		sum := freeSum
		for _, e := range extra {
			sum += e
		}
		return sum >= n
	}
	// mayFit is fits' bound for a job of held GPUs on nodes nodes, all
	// allowed.
	mayFit := func(held, nodes int) bool {
		if gpn > 0 {
			return wholeFree+nodes >= n/gpn
		}
		return freeSum+held >= n
	}
	if cache == nil {
		cache = &Running{}
	}
	jobs := cache.of(snap, model)
	// add puts the GPUs r frees on allowed nodes into extra.
	add := func(extra map[string]int, r running) (freed int) {
		for _, np := range r.nodes {
			if ok(np.Node) {
				extra[np.Node] += len(np.GPUs)
				freed += len(np.GPUs)
			}
		}
		return freed
	}
	extra := map[string]int{}
	for _, r := range jobs {
		if !mayFit(r.held, r.spans) {
			continue
		}
		clear(extra)
		if freed := add(extra, r); freed > 0 && fits(extra) {
			return []events.Counterfactual{{Kind: events.CounterfactualJobsFinish, Jobs: []string{r.id},
				Message: fmt.Sprintf("room for it when job %s finishes (frees %d GPUs it could use)", r.id, freed)}}
		}
	}
	clear(extra)
	var ids []string
	freed := 0
	for i := len(jobs) - 1; i >= 0 && len(ids) < maxJobsNamed; i-- {
		f := add(extra, jobs[i])
		if f == 0 {
			continue
		}
		ids = append(ids, jobs[i].id)
		freed += f
		if fits(extra) {
			return []events.Counterfactual{{Kind: events.CounterfactualJobsFinish, Jobs: ids,
				Message: fmt.Sprintf("room for it when jobs %s finish (free %d GPUs it could use)", strings.Join(ids, ", "), freed)}}
		}
	}
	return nil
}

// Running is the running jobs of a store's snapshots, by the waiting
// job's GPU model, as jobsCounterfactual weighs them (PlanOptions.Running):
// kept while the snapshots' PlacedVersion stays the same. Use one per
// store; not safe for concurrent use.
type Running struct {
	listed  bool
	version uint64
	byModel map[string][]running
}

// running is one running job: its nodes and the GPUs it holds there.
type running struct {
	id          string
	nodes       []events.NodePlacement
	held, spans int // GPUs held, nodes
}

// of lists the running jobs a job of model weighs (those of another model
// never free its GPUs), by GPUs held, then id.
func (c *Running) of(snap *store.Snapshot, model string) []running {
	if v := snap.PlacedVersion(); !c.listed || c.version != v {
		c.listed, c.version, c.byModel = true, v, map[string][]running{}
	}
	if jobs, ok := c.byModel[model]; ok {
		return jobs
	}
	var jobs []running
	for j := range snap.EachJobInState(store.JobPlaced) {
		if j.Decision == nil || (model != "" && j.Spec.Job.GPUModel != "" && j.Spec.Job.GPUModel != model) {
			continue
		}
		r := running{id: j.ID, nodes: j.Decision.Nodes, spans: len(j.Decision.Nodes)}
		for _, np := range j.Decision.Nodes {
			r.held += len(np.GPUs)
		}
		if r.held > 0 {
			jobs = append(jobs, r)
		}
	}
	slices.SortFunc(jobs, func(a, b running) int { return cmp.Or(cmp.Compare(a.held, b.held), strings.Compare(a.id, b.id)) })
	c.byModel[model] = jobs
	return jobs
}
