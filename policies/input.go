package policies

import (
	"github.com/toposched/toposched/events"
)

// The input contract. Policies read exactly these JSON fields; maps and
// lists are never null (an absent one is {} or []) and strings are "" when
// not set, so a policy may compare them without guarding.

// Job is the analyzed job as policies see it (input.job of the placement
// document).
type Job struct {
	ID          string             `json:"id"`
	Tenant      string             `json:"tenant"`
	Priority    int                `json:"priority"`
	GPUs        int                `json:"gpus"`
	GPUsPerNode int                `json:"gpus_per_node"`
	GPUModel    string             `json:"gpu_model"`
	Parallelism events.Parallelism `json:"parallelism"`
	Labels      map[string]string  `json:"labels"`
	// Groups are the job's communication groups, one entry per dimension.
	Groups []Group `json:"groups"`
}

// Group is one parallel dimension of a job: its groups have Size ranks each
// and there are Count of them.
type Group struct {
	Dimension string `json:"dimension"`
	Name      string `json:"name"`
	Size      int    `json:"size"`
	Count     int    `json:"count"`
}

// JobFromAnalyzed builds the policy view of an analyzed job.
func JobFromAnalyzed(a *events.JobAnalyzed) Job {
	j := Job{
		ID:          a.Job.JobID,
		Tenant:      a.Job.Tenant,
		Priority:    a.Job.Priority,
		GPUs:        a.Job.GPUs,
		GPUsPerNode: a.Job.GPUsPerNode,
		GPUModel:    a.Job.GPUModel,
		Parallelism: a.Parallelism,
		Labels:      a.Job.Labels,
	}
	for _, g := range a.Groups {
		j.Groups = append(j.Groups, Group{Dimension: g.Dimension, Name: g.Name, Size: g.Size, Count: len(g.Members)})
	}
	return j.normal()
}

func (j Job) normal() Job {
	if j.Labels == nil {
		j.Labels = map[string]string{}
	}
	if j.Groups == nil {
		j.Groups = []Group{}
	}
	return j
}

// JobClass is the part of a job the node document sees (input.job of
// toposched.nodes). It holds no job id and no rank layout, so that node
// results are shared by every job of the same class: this is what makes
// them cacheable per node (see Set.EvalNode).
type JobClass struct {
	Tenant      string            `json:"tenant"`
	Priority    int               `json:"priority"`
	GPUs        int               `json:"gpus"`
	GPUsPerNode int               `json:"gpus_per_node"`
	GPUModel    string            `json:"gpu_model"`
	Labels      map[string]string `json:"labels"`
}

// Class returns the job's class.
func (j Job) Class() JobClass {
	return JobClass{Tenant: j.Tenant, Priority: j.Priority, GPUs: j.GPUs, GPUsPerNode: j.GPUsPerNode, GPUModel: j.GPUModel, Labels: j.Labels}
}

// Node is one node as the node document sees it (input.node).
type Node struct {
	Name     string            `json:"name"`
	Labels   map[string]string `json:"labels"`
	GPUModel string            `json:"gpu_model"`
	GPUs     NodeGPUs          `json:"gpus"`
	// Domains are the node's fabric domains, narrowest first (leaf, pod,
	// core), as the store names them.
	Domains []string `json:"domains"`
	// Version identifies this state of the node (a store revision): node
	// results are cached under (Name, Version). Empty means the cache keys
	// on a hash of the fields above instead. Not seen by policies.
	Version string `json:"-"`
}

// NodeGPUs counts a node's GPUs: Free are healthy and held by no job (of
// the job's GPU model, when the job names one).
type NodeGPUs struct {
	Total int `json:"total"`
	Free  int `json:"free"`
}

// NodeInput is the input of toposched.nodes.
type NodeInput struct {
	Job  JobClass `json:"job"`
	Node Node     `json:"node"`
}

// Candidate is a candidate placement (input.placement).
type Candidate struct {
	Nodes []PlacedNode `json:"nodes"`
	// TPGroups lists, per tensor-parallel group, the NVLink islands its
	// ranks sit in.
	TPGroups []GroupSpan `json:"tp_groups"`
	// Leaves and Pods are the distinct leaf switches and pods the candidate
	// spans, sorted.
	Leaves     []string   `json:"leaves"`
	Pods       []string   `json:"pods"`
	Prediction Prediction `json:"prediction"`
}

// PlacedNode is one node a candidate uses: GPUs taken on it, and its GPU
// counts before the placement.
type PlacedNode struct {
	Name      string `json:"name"`
	GPUModel  string `json:"gpu_model"`
	GPUs      int    `json:"gpus"`
	GPUsTotal int    `json:"gpus_total"`
	GPUsFree  int    `json:"gpus_free"`
}

// GroupSpan is where one communication group sits.
type GroupSpan struct {
	Ranks []int `json:"ranks"`
	// NVLinkDomains are the distinct NVLink islands of its ranks, sorted.
	NVLinkDomains []string `json:"nvlink_domains"`
}

// Prediction is the communication model's prediction for a candidate.
type Prediction struct {
	CommSecondsPerStep float64 `json:"comm_seconds_per_step"`
	// CommFraction is comm / (comm + compute) of a step, 0 when compute is
	// unknown.
	CommFraction float64 `json:"comm_fraction"`
}

// Cluster summarises free capacity (input.cluster).
type Cluster struct {
	FreeGPUs              int            `json:"free_gpus"`
	FreeGPUsByModel       map[string]int `json:"free_gpus_by_model"`
	WholeFreeNodes        int            `json:"whole_free_nodes"`
	WholeFreeNodesByModel map[string]int `json:"whole_free_nodes_by_model"`
}

// PlacementInput is the input of toposched.placement.
type PlacementInput struct {
	Job       Job       `json:"job"`
	Placement Candidate `json:"placement"`
	Cluster   Cluster   `json:"cluster"`
}

func (in PlacementInput) normal() PlacementInput {
	in.Job = in.Job.normal()
	p := &in.Placement
	if p.Nodes == nil {
		p.Nodes = []PlacedNode{}
	}
	if p.TPGroups == nil {
		p.TPGroups = []GroupSpan{}
	}
	for i := range p.TPGroups {
		if p.TPGroups[i].Ranks == nil || p.TPGroups[i].NVLinkDomains == nil {
			g := p.TPGroups[i]
			if g.Ranks == nil {
				g.Ranks = []int{}
			}
			if g.NVLinkDomains == nil {
				g.NVLinkDomains = []string{}
			}
			p.TPGroups = append([]GroupSpan(nil), p.TPGroups...)
			p.TPGroups[i] = g
		}
	}
	if p.Leaves == nil {
		p.Leaves = []string{}
	}
	if p.Pods == nil {
		p.Pods = []string{}
	}
	if in.Cluster.FreeGPUsByModel == nil {
		in.Cluster.FreeGPUsByModel = map[string]int{}
	}
	if in.Cluster.WholeFreeNodesByModel == nil {
		in.Cluster.WholeFreeNodesByModel = map[string]int{}
	}
	return in
}

func (in NodeInput) normal() NodeInput {
	if in.Job.Labels == nil {
		in.Job.Labels = map[string]string{}
	}
	if in.Node.Labels == nil {
		in.Node.Labels = map[string]string{}
	}
	if in.Node.Domains == nil {
		in.Node.Domains = []string{}
	}
	return in
}

// Violation is one deny or warn of a policy.
type Violation struct {
	Msg  string `json:"msg"`
	Code string `json:"code"`
	// Policy is the package of the rule, such as
	// toposched.placement.tp_nvlink.
	Policy string `json:"policy"`
}

// Reason returns the violation as an event reason.
func (v Violation) Reason() events.Reason {
	return events.Reason{Code: v.Code, Message: v.Msg}
}

// Reasons converts violations to event reasons.
func Reasons(vs []Violation) []events.Reason {
	out := make([]events.Reason, len(vs))
	for i, v := range vs {
		out[i] = v.Reason()
	}
	return out
}
