package policies

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/metrics"
	"github.com/open-policy-agent/opa/v1/rego"
	"github.com/open-policy-agent/opa/v1/topdown"
)

// noMetrics is handed to every evaluation: OPA keeps nothing in it.
var noMetrics = metrics.NoOp()

// CodePolicyError is the code of the denial an evaluation error becomes.
const CodePolicyError = "policy_error"

// NodeResult is the verdict of toposched.nodes on one node. Its slices may
// be shared with the cache: do not modify them.
type NodeResult struct {
	Deny []Violation `json:"deny,omitempty"`
	Warn []Violation `json:"warn,omitempty"`
}

// PlacementResult is the verdict of toposched.placement on one candidate.
type PlacementResult struct {
	Deny []Violation `json:"deny,omitempty"`
	Warn []Violation `json:"warn,omitempty"`
	// Score is the sum of the policies' score rules: a penalty added to
	// the candidate's cost (negative prefers it).
	Score float64 `json:"score"`
}

// EvalNode evaluates toposched.nodes for a job class on a node.
//
// Results are cached in the Set (so per revision) under (node name, node
// version, job class): Node.Version when given, else a hash of the node's
// fields, and a hash of every JobClass field. The node document sees only
// the JobClass, never the job's id or layout, so two jobs of one class get
// the same verdict on the same node state and the cache is exact.
//
// It fails closed: an evaluation error returns a result denying the node
// with code policy_error, together with the error. Error results are not
// cached.
func (s *Set) EvalNode(ctx context.Context, job JobClass, node Node) (NodeResult, error) {
	return s.ForClass(job).EvalNode(ctx, node)
}

// ClassEvaluator evaluates toposched.nodes for one job class: the class's
// share of the cache key is hashed once, not once per node.
type ClassEvaluator struct {
	set   *Set
	job   JobClass
	class uint64
}

// ForClass returns the node evaluator of a job class.
func (s *Set) ForClass(job JobClass) ClassEvaluator {
	return ClassEvaluator{set: s, job: job, class: s.reads.classHash(job)}
}

// EvalNode is Set.EvalNode for the evaluator's class.
func (c ClassEvaluator) EvalNode(ctx context.Context, node Node) (NodeResult, error) {
	s, job := c.set, c.job
	key := s.reads.nodeKey(c.class, node)
	if r, ok := s.cache.get(key); ok {
		return r, nil
	}
	r, err := s.evalNode(ctx, job, node)
	if err != nil {
		return r, err
	}
	s.cache.put(key, r)
	return r, nil
}

// evalNode is EvalNode without the cache.
func (s *Set) evalNode(ctx context.Context, job JobClass, node Node) (NodeResult, error) {
	doc, err := s.eval(ctx, s.nodes, NodeInput{Job: job, Node: node}.normal().value())
	if err != nil {
		err = fmt.Errorf("policy %s: node %s: %w", short(s.Revision), node.Name, err)
		return NodeResult{Deny: []Violation{failClosed(err)}}, err
	}
	var r NodeResult
	for _, p := range s.nodePkgs {
		pd := p.document(doc)
		r.Deny = append(r.Deny, violations(pd, "deny", p.name)...)
		r.Warn = append(r.Warn, violations(pd, "warn", p.name)...)
	}
	return r, nil
}

// EvalPlacement evaluates toposched.placement on a candidate. It fails
// closed: an evaluation error returns a result denying the candidate with
// code policy_error and the error's message, together with the error.
func (s *Set) EvalPlacement(ctx context.Context, in PlacementInput) (PlacementResult, error) {
	return s.PlacementJudge(in.Job, in.Cluster).Eval(ctx, in.Placement)
}

// PlacementJudge evaluates the placement policies on the candidates of
// one job against one summary of the cluster, as EvalPlacement does.
// Candidates differ in their placement alone, so the input's job and
// cluster parts are built once rather than for each candidate, where
// they were as much work as the rest of a one-GPU candidate's input.
type PlacementJudge struct {
	s            *Set
	jobID        string
	job, cluster *ast.Term
}

// PlacementJudge returns the judge of job's candidates on cluster.
func (s *Set) PlacementJudge(job Job, cluster Cluster) *PlacementJudge {
	in := PlacementInput{Job: job, Cluster: cluster}.normal()
	return &PlacementJudge{s: s, jobID: job.ID, job: ast.NewTerm(in.Job.value()), cluster: ast.NewTerm(in.Cluster.value())}
}

// Eval runs the placement policies on one candidate. A policy that fails
// denies it (fail closed) and the error is returned as well.
func (j *PlacementJudge) Eval(ctx context.Context, c Candidate) (PlacementResult, error) {
	s := j.s
	v, err := placementValue(j.job, PlacementInput{Placement: c}.normal().Placement, j.cluster)
	var doc rego.Vars
	if err == nil {
		doc, err = s.eval(ctx, s.placement, v)
	}
	if err != nil {
		err = fmt.Errorf("policy %s: job %s: %w", short(s.Revision), j.jobID, err)
		return PlacementResult{Deny: []Violation{failClosed(err)}}, err
	}
	var r PlacementResult
	for _, p := range s.placementPkgs {
		pd := p.document(doc)
		r.Deny = append(r.Deny, violations(pd, "deny", p.name)...)
		r.Warn = append(r.Warn, violations(pd, "warn", p.name)...)
		r.Score += number(pd["score"])
	}
	return r, nil
}

func failClosed(err error) Violation {
	return Violation{Code: CodePolicyError, Msg: err.Error(), Policy: "toposched"}
}

// eval runs a prepared verdict query (verdictQuery) on an input,
// returning its bindings.
//
// Left to itself, OPA starts a goroutine for each evaluation to watch ctx
// and builds a set of metrics no one reads. Here ctx's end cancels the
// evaluation through context.AfterFunc, which waits on nothing, and the
// metrics are OPA's no-op ones: a fifth of a one-GPU candidate's judgement.
func (s *Set) eval(ctx context.Context, pq rego.PreparedEvalQuery, input ast.Value) (rego.Vars, error) {
	defer observeEval(ctx, time.Now())
	cancel := topdown.NewCancel()
	defer context.AfterFunc(ctx, cancel.Cancel)()
	rs, err := pq.Eval(ctx, rego.EvalParsedInput(input), rego.EvalExternalCancel(cancel), rego.EvalMetrics(noMetrics))
	if err != nil {
		return nil, err
	}
	if len(rs) == 0 {
		return nil, nil
	}
	return rs[0].Bindings, nil
}

// document is the package's verdicts in the bindings of its document's
// query, by rule name; an undefined rule is absent.
func (p policyPkg) document(vars rego.Vars) map[string]any {
	pd := make(map[string]any, len(p.verdicts))
	for _, v := range p.verdicts {
		if vals, _ := vars[v.bound].([]any); len(vals) == 1 {
			pd[v.rule] = vals[0]
		}
	}
	return pd
}

// violations reads a deny or warn set: objects {msg, code}; a bare string
// is taken as the message with code "policy".
func violations(doc map[string]any, rule, policy string) []Violation {
	items, _ := doc[rule].([]any)
	out := make([]Violation, 0, len(items))
	for _, it := range items {
		v := Violation{Policy: policy, Code: "policy"}
		switch x := it.(type) {
		case string:
			v.Msg = x
		case map[string]any:
			if m, ok := x["msg"].(string); ok {
				v.Msg = m
			} else {
				v.Msg = fmt.Sprint(x)
			}
			if c, ok := x["code"].(string); ok && c != "" {
				v.Code = c
			}
		default:
			v.Msg = fmt.Sprint(x)
		}
		out = append(out, v)
	}
	slices.SortFunc(out, func(a, b Violation) int {
		if a.Code != b.Code {
			if a.Code < b.Code {
				return -1
			}
			return 1
		}
		if a.Msg < b.Msg {
			return -1
		} else if a.Msg > b.Msg {
			return 1
		}
		return 0
	})
	if len(out) == 0 {
		return nil
	}
	return out
}

// number reads a score: a number, or a set or list of numbers summed.
func number(x any) float64 {
	switch v := x.(type) {
	case json.Number:
		f, _ := v.Float64()
		return f
	case float64:
		return v
	case int:
		return float64(v)
	case int64:
		return float64(v)
	case []any:
		var sum float64
		for _, e := range v {
			sum += number(e)
		}
		return sum
	}
	return 0
}

// maxCacheEntries bounds the node cache; when full it is emptied.
const maxCacheEntries = 1 << 16

type cacheKey struct {
	node  string
	state uint64 // node version or node hash
	class uint64
}

type nodeCache struct {
	mu sync.RWMutex
	m  map[cacheKey]NodeResult
}

func (c *nodeCache) init() { c.m = make(map[cacheKey]NodeResult) }

func (c *nodeCache) get(k cacheKey) (NodeResult, bool) {
	c.mu.RLock()
	r, ok := c.m[k]
	c.mu.RUnlock()
	return r, ok
}

func (c *nodeCache) put(k cacheKey, r NodeResult) {
	c.mu.Lock()
	if len(c.m) >= maxCacheEntries {
		clear(c.m)
	}
	c.m[k] = r
	c.mu.Unlock()
}

// CacheLen returns the number of cached node results.
func (s *Set) CacheLen() int {
	s.cache.mu.RLock()
	defer s.cache.mu.RUnlock()
	return len(s.cache.m)
}

// hasher is a cache key's FNV-1a (64-bit) hash, as hash/fnv computes it,
// kept in a value: hash/fnv's is reached through hash.Hash, so it and
// every string written to it were allocated on each node a walk asks.
type hasher struct{ sum uint64 }

const (
	fnvOffset64 = 14695981039346656037
	fnvPrime64  = 1099511628211
)

func newHasher() hasher { return hasher{sum: fnvOffset64} }

func (h *hasher) str(s string) {
	h.int(len(s))
	for i := 0; i < len(s); i++ {
		h.sum ^= uint64(s[i])
		h.sum *= fnvPrime64
	}
}

// int hashes i's eight bytes, little end first, as hash/fnv hashes them
// written to it.
func (h *hasher) int(i int) {
	u := uint64(i)
	for range 8 {
		h.sum ^= u & 0xff
		h.sum *= fnvPrime64
		u >>= 8
	}
}

// labelsRead hashes the labels p's rules read: every label, or the keys
// read one by one, each present or not.
func (h *hasher) labelsRead(p *partReads, m map[string]string) {
	if p.anyLabel() {
		h.labels(m)
		return
	}
	for _, k := range p.labelKeys {
		v, ok := m[k]
		h.str(k)
		if ok {
			h.int(1)
			h.str(v)
		} else {
			h.int(0)
		}
	}
}

func (h *hasher) labels(m map[string]string) {
	h.int(len(m))
	if len(m) == 1 {
		for k, v := range m {
			h.str(k)
			h.str(v)
		}
		return
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		h.str(k)
		h.str(m[k])
	}
}

// classHash hashes the fields of the job class the policies read.
func (r inputReads) classHash(job JobClass) uint64 {
	h := newHasher()
	for _, x := range []struct {
		field string
		hash  func()
	}{
		{"tenant", func() { h.str(job.Tenant) }},
		{"priority", func() { h.int(job.Priority) }},
		{"gpus", func() { h.int(job.GPUs) }},
		{"gpus_per_node", func() { h.int(job.GPUsPerNode) }},
		{"gpu_model", func() { h.str(job.GPUModel) }},
		{"labels", func() { h.labelsRead(&r.job, job.Labels) }},
	} {
		if r.jobField(x.field) {
			h.int(1)
			x.hash()
		} else {
			h.int(0)
		}
	}
	return h.sum
}

// nodeKey is a node's cache key: its name and a hash of its fields, of
// those the policies read. A node's Version stands for all of its fields.
func (r inputReads) nodeKey(class uint64, node Node) cacheKey {
	h := newHasher()
	name := node.Name
	if node.Version != "" {
		h.int(1)
		h.str(node.Version)
	} else {
		h.int(0)
		if !r.nodeField("name") {
			name = ""
		}
		if r.nodeField("labels") {
			h.labelsRead(&r.node, node.Labels)
		}
		if r.nodeField("gpu_model") {
			h.str(node.GPUModel)
		}
		if r.nodeField("gpus") {
			h.int(node.GPUs.Total)
			h.int(node.GPUs.Free)
		}
		if r.nodeField("domains") {
			h.int(len(node.Domains))
			for _, d := range node.Domains {
				h.str(d)
			}
		}
	}
	return cacheKey{node: name, state: h.sum, class: class}
}

// ReadsNode reports whether some node rule may read the named field of
// input.node ("name", "labels", "gpu_model", "gpus", "domains"): a field
// no rule reads need not be filled in, nor looked up.
func (s *Set) ReadsNode(field string) bool { return s.reads.nodeField(field) }

// ReadsJobID reports whether some rule of the set may read a job's id.
// Where none does, two jobs that differ in their ids alone get the same
// verdicts on the same state, so a decision for one holds for the other
// (services/placement's retry of the queue relies on it). False for a
// nil set.
func (s *Set) ReadsJobID() bool { return s != nil && s.readsJobID }

// HasNodePolicies reports whether the set has rules under toposched.nodes:
// without any, nodes need not be evaluated.
func (s *Set) HasNodePolicies() bool { return len(s.nodePkgs) > 0 }

// HasPlacementPolicies reports whether the set has rules under
// toposched.placement: without any, candidates need not be evaluated.
func (s *Set) HasPlacementPolicies() bool { return len(s.placementPkgs) > 0 }
