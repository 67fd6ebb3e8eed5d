package pattern

import (
	"fmt"
	"strings"

	"github.com/toposched/toposched/events"
)

// DefaultOrder is the rank layout, fastest-varying dimension first.
var DefaultOrder = []string{"tp", "cp", "ep", "dp", "pp"}

// MaxGPUs bounds one job; bigger requests are refused before any work.
const MaxGPUs = 1 << 17

// Analyze resolves a job's degrees, rank groups and communication volumes.
// The job must already be schema-valid; Analyze checks the arithmetic and
// reports every violation.
func Analyze(job events.JobSubmitted) (events.JobAnalyzed, []events.Reason) {
	p, reasons := Resolve(job)
	if job.GPUs > MaxGPUs {
		return events.JobAnalyzed{}, reasons
	}
	order, r := ParseLayout(job.Layout)
	reasons = append(reasons, r...)
	reasons = append(reasons, checkJob(job, p)...)
	if len(reasons) > 0 {
		return events.JobAnalyzed{}, CapReasons(reasons)
	}
	// Bounded before the work: a job whose analysed form NATS would not
	// carry is refused before its groups are built.
	if size, derived, explicit := AnalyzedSize(job, p); size > MaxAnalyzedBytes {
		field := "gpus"
		if explicit > derived {
			field = "groups"
		}
		return events.JobAnalyzed{}, []events.Reason{{Code: CodeAnalysedTooLarge, Field: field, Message: fmt.Sprintf(
			"the analysed job would be %s (the rank lists of %d GPUs in %d parallel dimensions: %s; its explicit groups, listed in the job and as groups: %s), over the limit of %s for one message: use fewer GPUs, fewer parallel dimensions or fewer explicit groups",
			mib(size), job.GPUs, dimensionsOver1(p), mib(derived), mib(explicit), mib(MaxAnalyzedBytes))}}
	}
	out := events.JobAnalyzed{
		Job:         job,
		Parallelism: p,
		Order:       order,
		Groups:      GroupsInOrder(p, order),
	}
	if r := annotate(&out); len(r) > 0 {
		return events.JobAnalyzed{}, r
	}
	return out, nil
}

// MaxReasons bounds the reasons of one rejection: past it, the rest are
// counted in a last reason, so that a job with a problem in each of
// thousands of groups gets a rejection of a few KB, not megabytes.
const MaxReasons = 100

// CapReasons keeps the first MaxReasons-1 reasons and counts the rest in a
// last one (code more_problems).
func CapReasons(reasons []events.Reason) []events.Reason {
	if len(reasons) <= MaxReasons {
		return reasons
	}
	more := len(reasons) - (MaxReasons - 1)
	return append(reasons[:MaxReasons-1:MaxReasons-1], events.Reason{Code: "more_problems", Message: fmt.Sprintf(
		"and %d more problems (only the first %d are listed): fix these and submit again", more, MaxReasons-1)})
}

// dimensionsOver1 counts the parallel dimensions that have groups.
func dimensionsOver1(p events.Parallelism) int {
	n := 0
	for _, d := range []int{p.TP, p.CP, p.EP, p.DP, p.PP} {
		if d > 1 {
			n++
		}
	}
	return n
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

// ParseLayout reads a job's layout ("tp-cp-ep-dp-pp"): a permutation of
// the five dimensions, fastest-varying first. "" is DefaultOrder.
func ParseLayout(layout string) ([]string, []events.Reason) {
	if layout == "" {
		return append([]string(nil), DefaultOrder...), nil
	}
	order := strings.Split(layout, "-")
	seen := map[string]bool{}
	ok := len(order) == len(DefaultOrder)
	for _, d := range order {
		if seen[d] || !isDimension(d) {
			ok = false
		}
		seen[d] = true
	}
	if !ok {
		return nil, []events.Reason{{Code: "invalid_layout", Field: "layout", Message: fmt.Sprintf(
			"layout = %q must list each of %s exactly once, separated by '-'", layout, strings.Join(DefaultOrder, ", "))}}
	}
	return order, nil
}

func isDimension(d string) bool {
	for _, x := range DefaultOrder {
		if d == x {
			return true
		}
	}
	return false
}

// Groups lists, for every dimension of degree above 1, its rank groups in
// the default layout.
func Groups(p events.Parallelism) []events.RankGroups {
	return GroupsInOrder(p, DefaultOrder)
}

// GroupsInOrder lists, for every dimension of degree above 1, its rank
// groups in the layout order (a permutation of DefaultOrder, fastest-varying
// first). Expert parallelism is carved out of data parallelism: the layout's
// "ep" coordinate indexes experts, its "dp" coordinate the dp/ep replicas of
// each expert shard, and a dp group spans both. Groups are listed in
// DefaultOrder whatever the layout.
func GroupsInOrder(p events.Parallelism, order []string) []events.RankGroups {
	degree := map[string]int{"tp": p.TP, "cp": p.CP, "ep": p.EP, "dp": p.DP / p.EP, "pp": p.PP}
	pos := map[string]int{}
	sizes := make([]int, len(order))
	for i, d := range order {
		pos[d] = i
		sizes[i] = degree[d]
	}
	dims := []struct {
		name string
		vary []int
	}{
		{"tp", []int{pos["tp"]}},
		{"cp", []int{pos["cp"]}},
		{"ep", []int{pos["ep"]}},
		{"dp", []int{pos["ep"], pos["dp"]}},
		{"pp", []int{pos["pp"]}},
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
// by their smallest rank. A group's index is its fixed coordinates read as a
// mixed-radix number (fastest first), and a rank's place in its group its
// varying coordinates read the same way: both orders agree with the ranks',
// so every rank is written straight to its place, in one backing array.
func groupsOf(sizes []int, vary []int) [][]int {
	n := 1
	for _, s := range sizes {
		n *= s
	}
	varies := make([]bool, len(sizes))
	for _, v := range vary {
		varies[v] = true
	}
	// Weights of each coordinate in the group index and in the place.
	gw := make([]int, len(sizes))
	pw := make([]int, len(sizes))
	gsize, size := 1, 1
	for i, s := range sizes {
		if varies[i] {
			pw[i] = size
			size *= s
		} else {
			gw[i] = gsize
			gsize *= s
		}
	}
	all := make([]int, n)
	groups := make([][]int, gsize)
	for g := range groups {
		groups[g] = all[g*size : (g+1)*size : (g+1)*size]
	}
	coord := make([]int, len(sizes))
	for r := range n {
		g, at := 0, 0
		for i, c := range coord {
			g += c * gw[i]
			at += c * pw[i]
		}
		groups[g][at] = r
		// Next rank: increment the mixed-radix coordinates.
		for i := range coord {
			coord[i]++
			if coord[i] < sizes[i] {
				break
			}
			coord[i] = 0
		}
	}
	return groups
}
