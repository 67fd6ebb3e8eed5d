package pattern

import (
	"fmt"
	"maps"
	"math"
	"regexp"
	"slices"
	"strconv"
	"unicode/utf8"

	"github.com/toposched/toposched/events"
)

// dtypeBytes is the size of one element of each dtype.
var dtypeBytes = map[string]int64{
	events.DtypeFP32: 4,
	events.DtypeBF16: 2,
	events.DtypeFP16: 2,
	events.DtypeFP8:  1,
}

var strategies = map[string]bool{
	"":                      true,
	events.StrategyDDP:      true,
	events.StrategyFSDP:     true,
	events.StrategyZeRO1:    true,
	events.StrategyZeRO2:    true,
	events.StrategyZeRO3:    true,
	events.StrategyMegatron: true,
	events.StrategyPS:       true,
}

var collectives = map[string]bool{
	events.CollectiveAllReduce:     true,
	events.CollectiveAllGather:     true,
	events.CollectiveReduceScatter: true,
	events.CollectiveAllToAll:      true,
	events.CollectiveSendRecv:      true,
	events.CollectiveBroadcast:     true,
}

// checkJob checks what Resolve does not: the strategy, the model's shape
// against the degrees p, and the explicit groups. It reports every problem.
func checkJob(job events.JobSubmitted, p events.Parallelism) []events.Reason {
	var reasons []events.Reason
	add := func(code, field, format string, args ...any) {
		reasons = append(reasons, events.Reason{Code: code, Field: field, Message: fmt.Sprintf(format, args...)})
	}
	if !strategies[job.Strategy] {
		add("invalid_strategy", "strategy", "strategy = %q is not one of ddp, fsdp, zero1, zero2, zero3, megatron, ps", job.Strategy)
	}
	if job.Strategy == events.StrategyPS && p.TP*p.PP*p.CP*p.EP != 1 {
		add("inconsistent_strategy", "strategy",
			"strategy ps models data parallelism only, but tp·pp·cp·ep = %d·%d·%d·%d = %d", p.TP, p.PP, p.CP, p.EP, p.TP*p.PP*p.CP*p.EP)
	}
	if s := job.StepComputeSeconds; s < 0 || math.IsNaN(s) || math.IsInf(s, 0) {
		add("invalid_step_compute_seconds", "step_compute_seconds", "step_compute_seconds = %v must be a positive number", s)
	}
	if len(job.StepComputeSecondsByModel) > MaxComputeModels {
		add("invalid_step_compute_seconds", "step_compute_seconds_by_model", "step_compute_seconds_by_model lists %d models, more than %d",
			len(job.StepComputeSecondsByModel), MaxComputeModels)
	}
	for _, model := range slices.Sorted(maps.Keys(job.StepComputeSecondsByModel)) {
		s := job.StepComputeSecondsByModel[model]
		if model == "" {
			add("invalid_step_compute_seconds", "step_compute_seconds_by_model", "step_compute_seconds_by_model has an empty model name")
		}
		if !(s > 0) || math.IsInf(s, 0) {
			add("invalid_step_compute_seconds", "step_compute_seconds_by_model", "step_compute_seconds_by_model[%q] = %v must be a positive number", model, s)
		}
	}
	if m := job.Model; m != nil {
		reasons = append(reasons, checkModel(*m, p)...)
	}
	reasons = append(reasons, checkLabels(job.Labels)...)
	reasons = append(reasons, checkGroups(job.Groups, job.GPUs)...)
	return reasons
}

// MaxComputeModels is the most GPU models a job's
// step_compute_seconds_by_model may list, as the schema states it.
const MaxComputeModels = 64

// Bounds of a job's labels, as the schema's labels definition states them
// (a test holds the two together). A job's labels travel in every event
// about it; the bounds keep them to a few hundred KB at most.
const (
	// MaxLabels is the most labels a job (or node) may carry.
	MaxLabels = 64
	// MaxLabelKeyLength is the longest key, in characters: a Kubernetes
	// label key's longest (a 253-character prefix, '/', a 63-character
	// name).
	MaxLabelKeyLength = 317
	// MaxLabelValueLength is the longest value, in characters.
	MaxLabelValueLength = 1024
)

// checkLabels bounds the labels' count and the length of each key and
// value. Lengths are counted in characters, as the schema's maxLength is.
func checkLabels(labels map[string]string) []events.Reason {
	if len(labels) > MaxLabels {
		// Refused before any per-label work.
		return []events.Reason{{Code: "too_many_labels", Field: "labels", Message: fmt.Sprintf(
			"labels holds %d labels; the limit is %d per job", len(labels), MaxLabels)}}
	}
	var reasons []events.Reason
	for _, k := range slices.Sorted(maps.Keys(labels)) {
		if n := utf8.RuneCountInString(k); n > MaxLabelKeyLength {
			reasons = append(reasons, events.Reason{Code: "label_too_long", Field: "labels", Message: fmt.Sprintf(
				"labels has a key of %d characters (%.40q…); the limit is %d", n, k, MaxLabelKeyLength)})
			continue
		}
		if n := utf8.RuneCountInString(labels[k]); n > MaxLabelValueLength {
			f := labelField(k)
			reasons = append(reasons, events.Reason{Code: "label_too_long", Field: f, Message: fmt.Sprintf(
				"%s is %d characters long; the limit is %d", f, n, MaxLabelValueLength)})
		}
	}
	return reasons
}

// simpleKey is a label key that reads unambiguously after a dot.
var simpleKey = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_-]*$`)

// labelField is the field of one label as the schemas name it:
// labels.team, or labels["app.kubernetes.io/name"].
func labelField(key string) string {
	if simpleKey.MatchString(key) {
		return "labels." + key
	}
	return "labels[" + strconv.Quote(key) + "]"
}

func checkModel(m events.Model, p events.Parallelism) []events.Reason {
	var reasons []events.Reason
	add := func(code, field, format string, args ...any) {
		reasons = append(reasons, events.Reason{Code: code, Field: field, Message: fmt.Sprintf(format, args...)})
	}
	negative := []struct {
		field string
		v     int64
	}{
		{"model.parameters", m.Parameters}, {"model.layers", int64(m.Layers)}, {"model.hidden_size", int64(m.HiddenSize)},
		{"model.heads", int64(m.Heads)}, {"model.seq_len", int64(m.SeqLen)}, {"model.micro_batch_size", int64(m.MicroBatchSize)},
		{"model.global_batch_size", int64(m.GlobalBatchSize)}, {"model.experts", int64(m.Experts)}, {"model.top_k", int64(m.TopK)},
	}
	for _, n := range negative {
		if n.v < 0 {
			add("invalid_model", n.field, "%s = %d must be positive", n.field, n.v)
		}
	}
	if len(reasons) > 0 {
		return reasons
	}
	if _, ok := dtypeBytes[m.Dtype]; !ok && m.Dtype != "" {
		add("invalid_dtype", "model.dtype", "dtype = %q is not one of fp32, bf16, fp16, fp8", m.Dtype)
	}
	if m.Heads > 0 && m.Heads%p.TP != 0 {
		add("tp_not_divisor", "model.heads", "tp = %d must divide heads = %d (heads mod tp = %d): tensor parallelism splits attention heads",
			p.TP, m.Heads, m.Heads%p.TP)
	}
	if m.Heads > 0 && m.HiddenSize > 0 && m.HiddenSize%m.Heads != 0 {
		add("heads_not_divisor", "model.hidden_size", "heads = %d must divide hidden_size = %d (hidden_size mod heads = %d)",
			m.Heads, m.HiddenSize, m.HiddenSize%m.Heads)
	}
	if m.HiddenSize > 0 && m.HiddenSize%p.TP != 0 {
		add("tp_not_divisor", "model.hidden_size", "tp = %d must divide hidden_size = %d (hidden_size mod tp = %d)",
			p.TP, m.HiddenSize, m.HiddenSize%p.TP)
	}
	if m.Layers > 0 && m.Layers%p.PP != 0 {
		add("pp_not_divisor", "model.layers", "pp = %d must divide layers = %d (layers mod pp = %d): each stage holds layers/pp layers",
			p.PP, m.Layers, m.Layers%p.PP)
	}
	if m.SeqLen > 0 && m.SeqLen%p.CP != 0 {
		add("cp_not_divisor", "model.seq_len", "cp = %d must divide seq_len = %d (seq_len mod cp = %d): each rank holds seq_len/cp tokens",
			p.CP, m.SeqLen, m.SeqLen%p.CP)
	}
	if m.Experts > 0 && m.Experts%p.EP != 0 {
		add("ep_not_divisor", "model.experts", "ep = %d must divide experts = %d (experts mod ep = %d)", p.EP, m.Experts, m.Experts%p.EP)
	}
	if m.Experts == 0 && p.EP > 1 && (m.Layers > 0 || m.HiddenSize > 0) {
		add("ep_without_experts", "model.experts", "ep = %d but the model has no experts: expert parallelism needs an MoE model", p.EP)
	}
	if m.TopK > 0 && m.Experts > 0 && m.TopK > m.Experts {
		add("invalid_top_k", "model.top_k", "top_k = %d exceeds experts = %d", m.TopK, m.Experts)
	}
	if m.TopK > 0 && m.Experts == 0 {
		add("invalid_top_k", "model.top_k", "top_k = %d but the model has no experts", m.TopK)
	}
	if m.GlobalBatchSize > 0 && p.DP > 0 {
		mb := max(m.MicroBatchSize, 1)
		if m.GlobalBatchSize%(mb*p.DP) != 0 {
			add("batch_not_divisible", "model.global_batch_size",
				"global_batch_size = %d is not a multiple of micro_batch_size·dp = %d·%d = %d (remainder %d)",
				m.GlobalBatchSize, mb, p.DP, mb*p.DP, m.GlobalBatchSize%(mb*p.DP))
		}
	}
	return reasons
}

// MaxGroups bounds a job's explicit communication groups. A derived
// layout has at most gpus groups per dimension; explicit ones past this are
// a mistake or an attack, and every group costs the cost model a pass.
const MaxGroups = 4096

// MaxGroupRanks bounds the ranks of all a job's explicit groups together:
// four custom dimensions over the largest job. Each rank costs the cost
// model work and travels once in jobs.analyzed (in the job; its custom
// dimension leaves it out); AnalyzedSize bounds the bytes.
const MaxGroupRanks = 4 * MaxGPUs

// maxRankReasons bounds the reasons given for single ranks (out of range,
// repeated): past it they are counted, not listed.
const maxRankReasons = 16

func checkGroups(groups []events.CommGroup, gpus int) []events.Reason {
	var reasons []events.Reason
	add := func(code, field, format string, args ...any) {
		reasons = append(reasons, events.Reason{Code: code, Field: field, Message: fmt.Sprintf(format, args...)})
	}
	if len(groups) > MaxGroups {
		// Refused before any per-group work: a job's size, not its
		// contents, is what is wrong.
		add("too_many_groups", "groups", "groups lists %d groups; the limit is %d per job", len(groups), MaxGroups)
		return reasons
	}
	total := 0
	for _, g := range groups {
		total += len(g.Ranks)
	}
	if total > MaxGroupRanks {
		add("too_many_group_ranks", "groups", "groups list %d ranks in all; the limit is %d per job", total, MaxGroupRanks)
		return reasons
	}
	rankReasons, moreRanks := 0, 0
	first := map[string]int{}
	for i, g := range groups {
		f := fmt.Sprintf("groups[%d]", i)
		if g.Name == "" {
			add("invalid_group", f+".name", "%s.name is empty", f)
		}
		if !collectives[g.Collective] {
			add("invalid_group", f+".collective", "%s.collective = %q is not a known collective", f, g.Collective)
		}
		if g.Bytes < 0 || g.Bytes > maxBytes {
			add("invalid_group", f+".bytes", "%s.bytes = %d must be between 0 and %d", f, g.Bytes, int64(maxBytes))
		}
		if g.CallsPerStep < 0 || g.CallsPerStep > maxCalls {
			add("invalid_group", f+".calls_per_step", "%s.calls_per_step = %d must be between 1 and %d", f, g.CallsPerStep, maxCalls)
		}
		switch {
		case len(g.Ranks) == 0:
			add("invalid_group", f+".ranks", "%s.ranks is empty", f)
		case len(g.Ranks) > gpus:
			// Some rank is out of range or repeated; say so once.
			add("too_many_ranks", f+".ranks", "%s.ranks lists %d ranks, more than the job's gpus = %d", f, len(g.Ranks), gpus)
		default:
			seen := make(map[int]int, len(g.Ranks))
			for j, r := range g.Ranks {
				k, dup := seen[r]
				bad := r < 0 || r >= gpus || dup
				if bad && rankReasons == maxRankReasons {
					moreRanks++
					continue
				}
				rf := fmt.Sprintf("%s.ranks[%d]", f, j)
				switch {
				case r < 0 || r >= gpus:
					add("rank_out_of_range", rf, "%s = %d is outside the job's ranks 0..%d (gpus = %d)", rf, r, gpus-1, gpus)
				case dup:
					add("duplicate_rank", rf, "%s = %d repeats %s.ranks[%d]", rf, r, f, k)
				default:
					seen[r] = j
					continue
				}
				rankReasons++
			}
		}
		k, ok := first[g.Name]
		if !ok {
			first[g.Name] = i
			continue
		}
		h := groups[k]
		if h.Collective != g.Collective || h.Bytes != g.Bytes || max(h.CallsPerStep, 1) != max(g.CallsPerStep, 1) || len(h.Ranks) != len(g.Ranks) {
			add("inconsistent_group", f+".name",
				"%s shares the name %q with groups[%d] but differs in collective, bytes, calls_per_step or number of ranks (%d against %d): groups of one name are the members of one dimension",
				f, g.Name, k, len(g.Ranks), len(h.Ranks))
		}
	}
	if moreRanks > 0 {
		add("more_rank_problems", "groups", "and %d more ranks out of range or repeated (only the first %d are listed)", moreRanks, maxRankReasons)
	}
	return reasons
}
