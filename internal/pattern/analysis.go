package pattern

import (
	"fmt"
	"strings"

	"github.com/toposched/toposched/events"
)

// DefaultOrder is the rank layout, fastest-varying dimension first.
var DefaultOrder = events.Dimensions

// MaxGPUs bounds one job; bigger requests are refused before any work.
const MaxGPUs = events.MaxJobGPUs

// Analyze resolves a job's degrees, rank groups and communication volumes.
// The job must already be schema-valid; Analyze checks the arithmetic and
// reports every violation.
func Analyze(job events.JobSubmitted) (events.JobAnalyzed, []events.Reason) {
	return analyze(job, MaxAnalyzedBytes)
}

// analyze is Analyze with the bound on the analysed event's size as a
// parameter, so that tests reach the refusal without building 8 MB jobs.
func analyze(job events.JobSubmitted, limit int) (events.JobAnalyzed, []events.Reason) {
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
	if size, _, explicit := AnalyzedSize(job, p); size > limit {
		field := "labels"
		if explicit > size/2 {
			field = "groups"
		}
		return events.JobAnalyzed{}, []events.Reason{{Code: CodeAnalysedTooLarge, Field: field, Message: fmt.Sprintf(
			"the analysed job would be %s (its explicit groups and their dimensions: %s), over the limit of %s for one message: use fewer or smaller explicit groups, or shorter labels",
			mib(size), mib(explicit), mib(limit))}}
	}
	out := events.JobAnalyzed{
		Job:         job,
		Parallelism: p,
		Order:       order,
		Groups:      events.LayoutGroups(p, order),
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
	return events.LayoutGroups(p, DefaultOrder)
}
