package policies

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/toposched/toposched/events"
)

// The inputs as OPA's AST, built from the Go values as json.Marshal and
// then ast.ValueFromReader would build them: the same fields in the same
// order, maps by sorted key, numbers spelled as encoding/json spells them
// (TestInputValueAsJSON). Marshalling every input and parsing it back was
// a third of a placement evaluation's time and a third of its garbage.

func (in PlacementInput) value() (ast.Value, error) {
	return placementValue(ast.NewTerm(in.Job.value()), in.Placement, ast.NewTerm(in.Cluster.value()))
}

// placementValue is a placement input of built job and cluster parts
// (PlacementJudge builds them once for all of a job's candidates).
func placementValue(job *ast.Term, c Candidate, cluster *ast.Term) (ast.Value, error) {
	// As json.Marshal refuses them, so that such a candidate fails closed.
	for _, f := range []float64{c.Prediction.CommSecondsPerStep, c.Prediction.CommFraction} {
		if math.IsNaN(f) || math.IsInf(f, 0) {
			return nil, fmt.Errorf("input.placement.prediction: unsupported value %v", f)
		}
	}
	return ast.NewObject(
		ast.Item(ast.InternedTerm("job"), job),
		item("placement", c.value()),
		ast.Item(ast.InternedTerm("cluster"), cluster),
	), nil
}

func (in NodeInput) value() ast.Value {
	return ast.NewObject(
		item("job", in.Job.value()),
		item("node", in.Node.value()),
	)
}

func (j Job) value() ast.Value {
	groups := make([]*ast.Term, len(j.Groups))
	for i, g := range j.Groups {
		groups[i] = ast.NewTerm(ast.NewObject(
			item("dimension", ast.String(g.Dimension)),
			item("name", ast.String(g.Name)),
			item("size", intValue(g.Size)),
			item("count", intValue(g.Count)),
		))
	}
	return ast.NewObject(
		item("id", ast.String(j.ID)),
		item("tenant", ast.String(j.Tenant)),
		item("priority", intValue(j.Priority)),
		item("gpus", intValue(j.GPUs)),
		item("gpus_per_node", intValue(j.GPUsPerNode)),
		item("gpu_model", ast.String(j.GPUModel)),
		item("parallelism", parallelismValue(j.Parallelism)),
		item("labels", stringsValue(j.Labels)),
		item("groups", ast.NewArray(groups...)),
	)
}

func (j JobClass) value() ast.Value {
	return ast.NewObject(
		item("tenant", ast.String(j.Tenant)),
		item("priority", intValue(j.Priority)),
		item("gpus", intValue(j.GPUs)),
		item("gpus_per_node", intValue(j.GPUsPerNode)),
		item("gpu_model", ast.String(j.GPUModel)),
		item("labels", stringsValue(j.Labels)),
	)
}

func (n Node) value() ast.Value {
	return ast.NewObject(
		item("name", ast.String(n.Name)),
		item("labels", stringsValue(n.Labels)),
		item("gpu_model", ast.String(n.GPUModel)),
		item("gpus", ast.NewObject(item("total", intValue(n.GPUs.Total)), item("free", intValue(n.GPUs.Free)))),
		item("domains", stringArray(n.Domains)),
	)
}

func (c Candidate) value() ast.Value {
	nodes := make([]*ast.Term, len(c.Nodes))
	for i, n := range c.Nodes {
		nodes[i] = ast.NewTerm(ast.NewObject(
			item("name", ast.String(n.Name)),
			item("gpu_model", ast.String(n.GPUModel)),
			item("gpus", intValue(n.GPUs)),
			item("gpus_total", intValue(n.GPUsTotal)),
			item("gpus_free", intValue(n.GPUsFree)),
		))
	}
	groups := make([]*ast.Term, len(c.TPGroups))
	for i, g := range c.TPGroups {
		ranks := make([]*ast.Term, len(g.Ranks))
		for k, r := range g.Ranks {
			ranks[k] = ast.IntNumberTerm(r)
		}
		groups[i] = ast.NewTerm(ast.NewObject(
			item("ranks", ast.NewArray(ranks...)),
			item("nvlink_domains", stringArray(g.NVLinkDomains)),
		))
	}
	return ast.NewObject(
		item("nodes", ast.NewArray(nodes...)),
		item("tp_groups", ast.NewArray(groups...)),
		item("leaves", stringArray(c.Leaves)),
		item("pods", stringArray(c.Pods)),
		item("prediction", ast.NewObject(
			item("comm_seconds_per_step", floatValue(c.Prediction.CommSecondsPerStep)),
			item("comm_fraction", floatValue(c.Prediction.CommFraction)),
		)),
	)
}

func (c Cluster) value() ast.Value {
	return ast.NewObject(
		item("free_gpus", intValue(c.FreeGPUs)),
		item("free_gpus_by_model", intsValue(c.FreeGPUsByModel)),
		item("whole_free_nodes", intValue(c.WholeFreeNodes)),
		item("whole_free_nodes_by_model", intsValue(c.WholeFreeNodesByModel)),
	)
}

// parallelismValue leaves out the zero fields, as their omitempty tags do.
func parallelismValue(p events.Parallelism) ast.Value {
	items := make([][2]*ast.Term, 0, 5)
	for _, f := range []struct {
		key string
		n   int
	}{{"tp", p.TP}, {"pp", p.PP}, {"dp", p.DP}, {"ep", p.EP}, {"cp", p.CP}} {
		if f.n != 0 {
			items = append(items, item(f.key, intValue(f.n)))
		}
	}
	return ast.NewObject(items...)
}

func item(key string, v ast.Value) [2]*ast.Term {
	return ast.Item(ast.InternedTerm(key), ast.NewTerm(v))
}

func intValue(n int) ast.Value { return ast.IntNumberTerm(n).Value }

// floatValue spells f, finite, as encoding/json does: the shortest 'f'
// form, or the 'e' form below 1e-6 and from 1e21, its exponent without a
// leading zero.
func floatValue(f float64) ast.Value {
	format := byte('f')
	if a := math.Abs(f); a != 0 && (a < 1e-6 || a >= 1e21) {
		format = 'e'
	}
	b := strconv.AppendFloat(make([]byte, 0, 24), f, format, -1, 64)
	if n := len(b); format == 'e' && n >= 4 && b[n-4] == 'e' && b[n-3] == '-' && b[n-2] == '0' {
		b[n-2] = b[n-1]
		b = b[:n-1]
	}
	return ast.Number(b)
}

func stringsValue(m map[string]string) ast.Value {
	items := make([][2]*ast.Term, 0, len(m))
	for _, k := range slices.Sorted(maps.Keys(m)) {
		items = append(items, item(k, ast.String(m[k])))
	}
	return ast.NewObject(items...)
}

func intsValue(m map[string]int) ast.Value {
	items := make([][2]*ast.Term, 0, len(m))
	for _, k := range slices.Sorted(maps.Keys(m)) {
		items = append(items, item(k, intValue(m[k])))
	}
	return ast.NewObject(items...)
}

func stringArray(ss []string) ast.Value {
	terms := make([]*ast.Term, len(ss))
	for i, s := range ss {
		terms[i] = ast.StringTerm(s)
	}
	return ast.NewArray(terms...)
}
