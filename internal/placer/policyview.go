package placer

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/internal/placer/engine"
	"github.com/toposched/toposched/internal/store"
	"github.com/toposched/toposched/policies"
)

// policyView evaluates one job's policies during one decision: it turns
// store rows into the policies' input, counts what node policies denied,
// and keeps their warnings. Not safe for concurrent use.
type policyView struct {
	ctx   context.Context
	snap  *store.Snapshot
	set   *policies.Set
	spec  events.JobAnalyzed
	job   policies.Job
	class policies.JobClass
	log   *slog.Logger
	nodes policies.ClassEvaluator

	denied   map[[2]string]*events.NodeDenial // by (policy, code)
	nodeWarn map[string][]policies.Violation
	cluster  *policies.Cluster
	gpus     map[string][]store.GPU
	// judger evaluates the placement policies on the job's candidates,
	// made at the first.
	judger *policies.PlacementJudge
}

func newPolicyView(ctx context.Context, snap *store.Snapshot, set *policies.Set, job events.JobAnalyzed, log *slog.Logger) *policyView {
	pv := &policyView{ctx: ctx, snap: snap, set: set, spec: job, log: log}
	if set != nil {
		pv.job = policies.JobFromAnalyzed(&job)
		pv.class = pv.job.Class()
		pv.nodes = set.ForClass(pv.class)
	}
	return pv
}

func (pv *policyView) judges() bool { return pv.set != nil && pv.set.HasPlacementPolicies() }

// filters reports whether node policies may refuse a node.
func (pv *policyView) filters() bool { return pv.set != nil && pv.set.HasNodePolicies() }

// allowNode runs the node policies on a node, counting its denials.
func (pv *policyView) allowNode(v engine.NodeView) bool { return pv.evalNode(v, true) }

// viewOf is a node's view read from the snapshot, for the paths outside
// the candidate walk (which has it at hand). It looks up only what the
// node policies read: a pending job's counterfactual asks it of every
// node that runs a job.
func (pv *policyView) viewOf(n store.Node) engine.NodeView {
	v := engine.NodeView{Node: n}
	if pv.set == nil {
		return v
	}
	if pv.set.ReadsNode("domains") {
		v.Fabric = pv.snap.FabricDomains(n.Name)
	}
	if pv.set.ReadsNode("gpus") {
		if d, ok := pv.snap.Domain(store.DomainNode + ":" + n.Name); ok {
			v.Free = d.FreeOf(pv.spec.Job.GPUModel)
		}
	}
	return v
}

func (pv *policyView) evalNode(v engine.NodeView, count bool) bool {
	if !pv.filters() {
		return true
	}
	n := v.Node
	node := policies.Node{Name: n.Name, Labels: n.Labels, GPUModel: n.GPUModel, Domains: v.Fabric,
		GPUs: policies.NodeGPUs{Total: n.GPUCount, Free: v.Free}}
	r, err := pv.nodes.EvalNode(pv.ctx, node)
	if err != nil {
		pv.log.WarnContext(pv.ctx, "node policy failed; node denied", "job_id", pv.spec.Job.JobID, "node", n.Name, "err", err)
	}
	if len(r.Warn) > 0 {
		if pv.nodeWarn == nil {
			pv.nodeWarn = map[string][]policies.Violation{}
		}
		pv.nodeWarn[n.Name] = r.Warn
	}
	if len(r.Deny) == 0 {
		return true
	}
	if count {
		if pv.denied == nil {
			pv.denied = map[[2]string]*events.NodeDenial{}
		}
		seen := map[[2]string]bool{}
		for _, v := range r.Deny {
			k := [2]string{v.Policy, v.Code}
			if seen[k] {
				continue
			}
			seen[k] = true
			d := pv.denied[k]
			if d == nil {
				d = &events.NodeDenial{Policy: v.Policy, Code: v.Code, Example: v.Msg}
				pv.denied[k] = d
			}
			d.Nodes++
		}
	}
	return false
}

// denials lists the node denials, most nodes first.
func (pv *policyView) denials() []events.NodeDenial {
	out := make([]events.NodeDenial, 0, len(pv.denied))
	for _, d := range pv.denied {
		out = append(out, *d)
	}
	slices.SortFunc(out, func(a, b events.NodeDenial) int {
		return cmp.Or(cmp.Compare(b.Nodes, a.Nodes), strings.Compare(a.Policy, b.Policy), strings.Compare(a.Code, b.Code))
	})
	if len(out) == 0 {
		return nil
	}
	return out
}

// nodesForbid reports whether the nodes the node policies allow could not
// hold the job even with every job gone, with the denials as reasons.
func (pv *policyView) nodesForbid(job events.JobAnalyzed) (bool, []events.Reason) {
	if len(pv.denied) == 0 {
		return false, nil
	}
	model, n, gpn := job.Job.GPUModel, job.Job.GPUs, job.Job.GPUsPerNode
	room := 0
	for d := range pv.snap.EachDomainOfKind(store.DomainNode) {
		h := d.Count(model).Healthy
		if h == 0 || (gpn > 0 && h < gpn) {
			continue
		}
		nd, ok := pv.snap.Node(d.Node)
		if !ok || !pv.evalNode(pv.viewOf(nd), false) {
			continue
		}
		if gpn > 0 {
			room += h / gpn * gpn
		} else {
			room += h
		}
		if room >= n {
			return false, nil
		}
	}
	var reasons []events.Reason
	for _, d := range pv.denials() {
		reasons = append(reasons, events.Reason{Code: d.Code, Policy: d.Policy, Field: "gpus",
			Message: fmt.Sprintf("%d nodes denied, for instance: %s", d.Nodes, d.Example)})
	}
	reasons = append(reasons, events.Reason{Code: CodePolicyDenied, Field: "gpus",
		Message: fmt.Sprintf("the nodes the node policies allow hold %d healthy GPUs the job could use, it needs %d", room, n)})
	return true, reasons
}

// judge runs the placement policies on a candidate.
func (pv *policyView) judge(c engine.Candidate) engine.Judgement {
	if pv.judger == nil {
		pv.judger = pv.set.PlacementJudge(pv.job, pv.clusterSummary())
	}
	r, err := pv.judger.Eval(pv.ctx, pv.candidate(c))
	if err != nil {
		pv.log.WarnContext(pv.ctx, "placement policy failed; candidate denied", "job_id", pv.spec.Job.JobID, "domain", c.Domain, "err", err)
	}
	return engine.Judgement{Deny: len(r.Deny) > 0, Score: r.Score, Reasons: reasonsOf(r.Deny), Warnings: reasonsOf(r.Warn)}
}

func reasonsOf(vs []policies.Violation) []events.Reason {
	if len(vs) == 0 {
		return nil
	}
	out := make([]events.Reason, len(vs))
	for i, v := range vs {
		out[i] = events.Reason{Code: v.Code, Message: v.Msg, Policy: v.Policy}
	}
	return out
}

// warnings are the chosen placement's: the placement policies', then the
// node policies' on the nodes it uses.
func (pv *policyView) warnings(j engine.Judgement, gpus []store.GPUKey) []events.Reason {
	out := slices.Clone(j.Warnings)
	seen := map[string]bool{}
	for _, g := range gpus {
		if seen[g.Node] {
			continue
		}
		seen[g.Node] = true
		for _, v := range pv.nodeWarn[g.Node] {
			r := events.Reason{Code: v.Code, Message: g.Node + ": " + v.Msg, Policy: v.Policy}
			out = append(out, r)
		}
	}
	return out
}

func (pv *policyView) nodeGPU(k store.GPUKey) (store.GPU, bool) {
	if pv.gpus == nil {
		pv.gpus = map[string][]store.GPU{}
	}
	gs, ok := pv.gpus[k.Node]
	if !ok {
		gs = pv.snap.GPUs(k.Node)
		pv.gpus[k.Node] = gs
	}
	for _, g := range gs {
		if g.Index == k.Index {
			return g, true
		}
	}
	return store.GPU{}, false
}

// candidate is a candidate as placement policies see it.
func (pv *policyView) candidate(c engine.Candidate) policies.Candidate {
	out := policies.Candidate{Prediction: policies.Prediction{CommSecondsPerStep: c.CommSeconds}}
	if comp := pv.spec.Job.StepComputeSeconds; comp > 0 {
		out.Prediction.CommFraction = c.CommSeconds / (c.CommSeconds + comp)
	}
	at := map[string]int{}
	leaves, pods := map[string]bool{}, map[string]bool{}
	for _, g := range c.GPUs {
		i, ok := at[g.Node]
		if !ok {
			i = len(out.Nodes)
			at[g.Node] = i
			pn := policies.PlacedNode{Name: g.Node}
			if n, ok := pv.snap.Node(g.Node); ok {
				pn.GPUModel = n.GPUModel
			}
			if d, ok := pv.snap.Domain(store.DomainNode + ":" + g.Node); ok {
				pn.GPUsTotal, pn.GPUsFree = d.Total, d.Free
			}
			out.Nodes = append(out.Nodes, pn)
			for _, d := range pv.snap.FabricDomains(g.Node) {
				switch store.DomainKind(d) {
				case store.DomainLeaf:
					leaves[d] = true
				case store.DomainPod:
					pods[d] = true
				}
			}
		}
		out.Nodes[i].GPUs++
	}
	out.Leaves = slices.Sorted(mapKeys(leaves))
	out.Pods = slices.Sorted(mapKeys(pods))
	for _, rg := range pv.spec.Groups {
		if rg.Dimension != "tp" {
			continue
		}
		for _, m := range rg.Members {
			span := policies.GroupSpan{Ranks: m, NVLinkDomains: []string{}}
			islands := map[string]bool{}
			for _, r := range m {
				if r < 0 || r >= len(c.GPUs) {
					continue
				}
				// A GPU with no NVLink belongs to no island and adds
				// none: TP on PCIe-only nodes is not an NVLink matter.
				if g, ok := pv.nodeGPU(c.GPUs[r]); ok {
					for _, d := range g.Domains {
						if store.DomainKind(d) == store.DomainIsland {
							islands[d] = true
						}
					}
				}
			}
			span.NVLinkDomains = slices.Sorted(mapKeys(islands))
			out.TPGroups = append(out.TPGroups, span)
		}
	}
	return out
}

func mapKeys(m map[string]bool) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// clusterSummary is input.cluster, computed once per decision from the
// store's counters (no walk over the nodes).
func (pv *policyView) clusterSummary() policies.Cluster {
	if pv.cluster != nil {
		return *pv.cluster
	}
	c := policies.Cluster{FreeGPUs: pv.snap.FreeCount(), WholeFreeNodes: pv.snap.NodeCounts("").WholeFree,
		FreeGPUsByModel: map[string]int{}, WholeFreeNodesByModel: map[string]int{}}
	if d, ok := pv.snap.Domain(store.ClusterDomain); ok {
		for _, m := range d.Models {
			if m.Free > 0 {
				c.FreeGPUsByModel[m.Model] = m.Free
			}
			if w := pv.snap.NodeCounts(m.Model).WholeFree; w > 0 {
				c.WholeFreeNodesByModel[m.Model] = w
			}
		}
	}
	pv.cluster = &c
	return c
}

// PolicyCheck applies one job's policies on one snapshot outside a Plan:
// the placement service asks it which nodes a reservation may hold and
// whether a proposed migration is allowed, so those paths judge exactly as
// the Planner does.
type PolicyCheck struct{ pv *policyView }

// NewPolicyCheck is the policies of set (nil: none) for job on snap.
func NewPolicyCheck(ctx context.Context, snap *store.Snapshot, set *policies.Set, job events.JobAnalyzed, log *slog.Logger) PolicyCheck {
	if log == nil {
		log = slog.Default()
	}
	return PolicyCheck{pv: newPolicyView(ctx, snap, set, job, log)}
}

// AllowsNode says whether the node policies allow node to the job.
func (c PolicyCheck) AllowsNode(node store.Node) bool { return c.pv.evalNode(c.pv.viewOf(node), false) }

// Judges says whether any placement policy is in force.
func (c PolicyCheck) Judges() bool { return c.pv.judges() }

// Judge runs the placement policies on a candidate placement.
func (c PolicyCheck) Judge(cand engine.Candidate) engine.Judgement { return c.pv.judge(cand) }
