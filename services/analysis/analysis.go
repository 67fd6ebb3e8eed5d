package analysis

import (
	"fmt"

	"github.com/toposched/toposched/events"
)

// DefaultOrder is the rank layout, fastest-varying dimension first.
var DefaultOrder = []string{"tp", "cp", "ep", "dp", "pp"}

// MaxGPUs bounds one job; bigger requests are refused before any work.
const MaxGPUs = 1 << 17

// Analyze resolves a job's degrees and rank groups. The job must already be
// schema-valid; Analyze checks the arithmetic and reports every violation.
func Analyze(job events.JobSubmitted) (events.JobAnalyzed, []events.Reason) {
	p, reasons := Resolve(job)
	if len(reasons) > 0 {
		return events.JobAnalyzed{}, reasons
	}
	return events.JobAnalyzed{
		Job:         job,
		Parallelism: p,
		Order:       append([]string(nil), DefaultOrder...),
		Groups:      Groups(p),
	}, nil
}

// Resolve fills in default degrees (1, and dp = gpus / (tp·pp·cp)) and
// checks that they multiply out to the job's GPU count.
func Resolve(job events.JobSubmitted) (events.Parallelism, []events.Reason) {
	var given events.Parallelism
	if job.Parallelism != nil {
		given = *job.Parallelism
	}
	p := given
	for _, d := range []*int{&p.TP, &p.PP, &p.CP, &p.EP} {
		if *d == 0 {
			*d = 1
		}
	}
	var reasons []events.Reason
	add := func(code, field, format string, args ...any) {
		reasons = append(reasons, events.Reason{Code: code, Field: field, Message: fmt.Sprintf(format, args...)})
	}
	if job.GPUs > MaxGPUs {
		add("too_many_gpus", "gpus", "gpus = %d exceeds the limit of %d GPUs per job", job.GPUs, MaxGPUs)
		return p, reasons
	}
	model := p.TP * p.PP * p.CP
	switch {
	case p.DP == 0 && job.GPUs%model != 0:
		add("inconsistent_parallelism", "gpus",
			"gpus = %d is not a multiple of tp·pp·cp = %d·%d·%d = %d, so dp cannot be derived",
			job.GPUs, p.TP, p.PP, p.CP, model)
	case p.DP == 0:
		p.DP = job.GPUs / model
	case model*p.DP != job.GPUs:
		add("inconsistent_parallelism", "parallelism",
			"tp·pp·dp·cp = %d·%d·%d·%d = %d, but gpus = %d", p.TP, p.PP, p.DP, p.CP, model*p.DP, job.GPUs)
	}
	if p.DP > 0 && p.DP%p.EP != 0 {
		add("ep_not_divisor", "parallelism.ep",
			"ep = %d must divide dp = %d: experts shard across data-parallel ranks", p.EP, p.DP)
	}
	if job.GPUsPerNode > 0 && job.GPUs%job.GPUsPerNode != 0 {
		add("gpus_per_node_not_divisor", "gpus_per_node",
			"gpus = %d is not a multiple of gpus_per_node = %d", job.GPUs, job.GPUsPerNode)
	}
	return p, reasons
}

// Groups lists, for every dimension of degree above 1, its rank groups in
// the default layout.
func Groups(p events.Parallelism) []events.RankGroups {
	// Coordinates in layout order; dp is split into ep (inner) and the
	// remaining data-parallel replicas (outer).
	sizes := []int{p.TP, p.CP, p.EP, p.DP / p.EP, p.PP}
	const tp, cp, ep, dpo, pp = 0, 1, 2, 3, 4
	dims := []struct {
		name string
		vary []int
	}{
		{"tp", []int{tp}},
		{"cp", []int{cp}},
		{"ep", []int{ep}},
		{"dp", []int{ep, dpo}},
		{"pp", []int{pp}},
	}
	out := []events.RankGroups{}
	for _, d := range dims {
		size := 1
		for _, v := range d.vary {
			size *= sizes[v]
		}
		if size == 1 {
			continue
		}
		out = append(out, events.RankGroups{Dimension: d.name, Size: size, Members: groupsOf(sizes, d.vary)})
	}
	return out
}

// groupsOf partitions all ranks into groups that differ only in the
// coordinates vary. Ranks within a group are ascending; groups are ordered
// by their smallest rank.
func groupsOf(sizes []int, vary []int) [][]int {
	n := 1
	strides := make([]int, len(sizes))
	for i, s := range sizes {
		strides[i] = n
		n *= s
	}
	varies := make([]bool, len(sizes))
	for _, v := range vary {
		varies[v] = true
	}
	index := map[int]int{}
	var groups [][]int
	for r := range n {
		// The group key is the rank with its varying coordinates zeroed.
		key := r
		for i := range sizes {
			if varies[i] {
				key -= (r / strides[i] % sizes[i]) * strides[i]
			}
		}
		g, ok := index[key]
		if !ok {
			g = len(groups)
			index[key] = g
			groups = append(groups, nil)
		}
		groups[g] = append(groups[g], r)
	}
	return groups
}
