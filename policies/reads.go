package policies

import (
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
	job, node map[string]bool
	allJob    bool
	allNode   bool
}

func (r inputReads) jobField(name string) bool  { return r.allJob || r.job[name] }
func (r inputReads) nodeField(name string) bool { return r.allNode || r.node[name] }

// readsOf walks the rules a node's verdict may depend on: every module but
// the placement document's, whose rules see another input (a candidate
// placement, the whole job), and those of its rules that a node rule
// depends on.
func readsOf(c *ast.Compiler) inputReads {
	r := inputReads{job: map[string]bool{}, node: map[string]bool{}}
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
	return r
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
				r.allJob, r.allNode = true, true // input used whole
			}
		}
		return false
	}).Walk(x)
}

// ref records one ref whose head is input.
func (r *inputReads) ref(ref ast.Ref) {
	if len(ref) < 2 {
		r.allJob, r.allNode = true, true
		return
	}
	part, ok := ref[1].Value.(ast.String)
	if !ok {
		r.allJob, r.allNode = true, true // input[x]
		return
	}
	var field string
	if len(ref) >= 3 {
		if s, ok := ref[2].Value.(ast.String); ok {
			field = string(s)
		}
	}
	switch part {
	case "job":
		if field == "" {
			r.allJob = true
		} else {
			r.job[field] = true
		}
	case "node":
		if field == "" {
			r.allNode = true
		} else {
			r.node[field] = true
		}
	}
	// Other parts (input.placement, input.cluster) are the placement
	// document's: undefined in a node's input.
}
