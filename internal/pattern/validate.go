package pattern

import (
	"fmt"
	"math"

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
	if m := job.Model; m != nil {
		reasons = append(reasons, checkModel(*m, p)...)
	}
	reasons = append(reasons, checkGroups(job.Groups, job.GPUs)...)
	return reasons
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
		if len(g.Ranks) == 0 {
			add("invalid_group", f+".ranks", "%s.ranks is empty", f)
		}
		seen := make(map[int]int, len(g.Ranks))
		for j, r := range g.Ranks {
			rf := fmt.Sprintf("%s.ranks[%d]", f, j)
			if r < 0 || r >= gpus {
				add("rank_out_of_range", rf, "%s = %d is outside the job's ranks 0..%d (gpus = %d)", rf, r, gpus-1, gpus)
				continue
			}
			if k, dup := seen[r]; dup {
				add("duplicate_rank", rf, "%s = %d repeats %s.ranks[%d]", rf, r, f, k)
				continue
			}
			seen[r] = j
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
	return reasons
}
