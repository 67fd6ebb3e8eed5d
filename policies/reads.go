package policies

import (
	"maps"
	"slices"

	"github.com/open-policy-agent/opa/v1/ast"
)

// inputReads is what of the node document's input (NodeInput) a set's
// policies can read: the fields of input.job and input.node that some
// rule names. The node cache keys on those fields alone, so that a node
// result is shared by the jobs and node states the policies cannot tell
// apart: the shipped policies read the job's tenant, GPU model and labels
// and the node's name, labels and GPU model, never a free count, which
// changes with every decision and would otherwise make every burst a run
// of cache misses.
//
// It is read from the compiled rules (imports resolved to full refs) and
// errs towards reading more: input, input.job or input.node used whole, or
// indexed by anything but a constant string, reads every field of it.
type inputReads struct {
	job, node partReads
}

// partReads is what rules read of input.job or input.node.
type partReads struct {
	all    bool            // the part used whole
	fields map[string]bool // its fields named
	// labels are the keys of its labels read one by one (labels.tenant);
	// allLabels is set where labels is used whole or by a variable key.
	labels    map[string]bool
	allLabels bool
	labelKeys []string // labels' keys, sorted
}

func (p *partReads) field(name string) bool { return p.all || p.fields[name] }

func (p *partReads) anyLabel() bool { return p.all || p.allLabels }

func (r inputReads) jobField(name string) bool  { return r.job.field(name) }
func (r inputReads) nodeField(name string) bool { return r.node.field(name) }

// readsOf walks the rules a node's verdict may depend on: every module but
// the placement document's, whose rules see another input (a candidate
// placement, the whole job), and those of its rules that a node rule
// depends on.
func readsOf(c *ast.Compiler) inputReads {
	r := inputReads{
		job:  partReads{fields: map[string]bool{}, labels: map[string]bool{}},
		node: partReads{fields: map[string]bool{}, labels: map[string]bool{}},
	}
	placement := ast.MustParseRef("data." + PlacementDoc)
	var queue []*ast.Rule
	for _, m := range c.Modules {
		if !m.Package.Path.HasPrefix(placement) {
			queue = append(queue, m.Rules...)
		}
	}
	seen := map[*ast.Rule]bool{}
	for len(queue) > 0 {
		rule := queue[len(queue)-1]
		queue = queue[:len(queue)-1]
		if seen[rule] {
			continue
		}
		seen[rule] = true
		r.walk(rule)
		for d := range c.Graph.Dependencies(rule) {
			if dr, ok := d.(*ast.Rule); ok {
				queue = append(queue, dr)
			}
		}
	}
	r.job.labelKeys = slices.Sorted(maps.Keys(r.job.labels))
	r.node.labelKeys = slices.Sorted(maps.Keys(r.node.labels))
	return r
}

// readsJobID reports whether a rule of either document may read the
// job's id: input.job.id, or input.job or input used whole or by a
// variable key (the placement document's input.job has the id; the node
// document's has none, so its rules read no id whatever they name).
func readsJobID(c *ast.Compiler) bool {
	r := inputReads{
		job:  partReads{fields: map[string]bool{}, labels: map[string]bool{}},
		node: partReads{fields: map[string]bool{}, labels: map[string]bool{}},
	}
	for _, m := range c.Modules {
		for _, rule := range m.Rules {
			r.walk(rule)
		}
	}
	return r.job.field("id")
}

func (r *inputReads) walk(x any) {
	ast.NewGenericVisitor(func(x any) bool {
		switch t := x.(type) {
		case ast.Ref:
			if !t[0].Equal(ast.InputRootDocument) {
				return false
			}
			r.ref(t)
			// The head is input itself, not a bare use of it; the rest
			// of the ref may hold refs of its own (input.node[input.x]).
			for _, term := range t[1:] {
				r.walk(term)
			}
			return true
		case ast.Var:
			if t.Equal(ast.InputRootDocument.Value) {
				r.job.all, r.node.all = true, true // input used whole
			}
		}
		return false
	}).Walk(x)
}

// ref records one ref whose head is input.
func (r *inputReads) ref(ref ast.Ref) {
	if len(ref) < 2 {
		r.job.all, r.node.all = true, true
		return
	}
	part, ok := ref[1].Value.(ast.String)
	if !ok {
		r.job.all, r.node.all = true, true // input[x]
		return
	}
	var p *partReads
	switch part {
	case "job":
		p = &r.job
	case "node":
		p = &r.node
	default:
		// Other parts (input.placement, input.cluster) are the placement
		// document's: undefined in a node's input.
		return
	}
	field := constant(ref, 2)
	if field == "" {
		p.all = true
		return
	}
	p.fields[field] = true
	if field == "labels" {
		if key := constant(ref, 3); key != "" {
			p.labels[key] = true
		} else {
			p.allLabels = true
		}
	}
}

// constant is the ref's i-th term when it is a constant string, "" when
// it is not or the ref is shorter.
func constant(ref ast.Ref, i int) string {
	if len(ref) <= i {
		return ""
	}
	s, _ := ref[i].Value.(ast.String)
	return string(s)
}
