package pattern

import (
	"fmt"
	"math"
	"math/bits"
	"strings"

	"github.com/toposched/toposched/events"
)

// LatencyBoundBytes is the message size below which a call is reported as
// latency-bound: under it, the per-call cost (launch, the α term of the
// cost model, NCCL's LL protocol range) dominates the bytes; at or above
// it, bandwidth does.
const LatencyBoundBytes = 256 << 10

// Bounds on the sizes analysis reports: a message or volume past 2^53 bytes
// would lose precision in JSON readers that use doubles, and no real job
// comes near it.
const (
	maxBytes = 1 << 53
	maxCalls = 1 << 40
)

// call is a Collective with, for a pipeline's send/recv, which end stage
// sends nothing: the last stage sends no activations forward, the first no
// gradients backward.
type call struct {
	events.Collective
	skipFirst, skipLast bool
}

// Bound classifies a call of the given message size.
func Bound(bytes int64) string {
	if bytes < LatencyBoundBytes {
		return events.BoundLatency
	}
	return events.BoundBandwidth
}

// busBytes is what each of n ranks sends for calls of v bytes in all, with
// a bandwidth-optimal algorithm: v times nccl-tests' bus-bandwidth factor,
// 2(n-1)/n for all-reduce, (n-1)/n for all-gather, reduce-scatter and
// all-to-all, 1 for broadcast and send/recv (rounded down, saturating).
func busBytes(collective string, v int64, n int) int64 {
	var num, den uint64
	switch collective {
	case events.CollectiveAllReduce:
		num, den = 2*uint64(n-1), uint64(n)
	case events.CollectiveAllGather, events.CollectiveReduceScatter, events.CollectiveAllToAll:
		num, den = uint64(n-1), uint64(n)
	default:
		return v
	}
	hi, lo := bits.Mul64(uint64(v), num)
	if hi >= den {
		return math.MaxInt64
	}
	q, _ := bits.Div64(hi, lo, den)
	if q > math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(q)
}

// mul multiplies non-negative factors, saturating at math.MaxInt64.
func mul(xs ...int64) int64 {
	r := int64(1)
	for _, x := range xs {
		if x == 0 {
			return 0
		}
		if r > math.MaxInt64/x {
			r = math.MaxInt64
			continue
		}
		r *= x
	}
	return r
}

// add adds non-negative terms, saturating at math.MaxInt64.
func add(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// shape is what the formulas read of a job, with defaults applied; a zero
// value is unknown.
type shape struct {
	params, layers, hidden, seq, micro, e, topK int64
	// perStage is layers/pp, the layers on one pipeline stage.
	perStage int64
	// m is the micro-batches of a step per pipeline: global/(micro·dp).
	m int64
}

func shapeOf(job events.JobSubmitted, p events.Parallelism) shape {
	var m events.Model
	if job.Model != nil {
		m = *job.Model
	}
	s := shape{
		params: m.Parameters, layers: int64(m.Layers), hidden: int64(m.HiddenSize), seq: int64(m.SeqLen),
		micro: int64(max(m.MicroBatchSize, 1)), e: dtypeBytes[m.Dtype], topK: int64(max(m.TopK, 1)),
	}
	s.perStage = s.layers / int64(p.PP)
	if m.GlobalBatchSize > 0 {
		s.m = int64(m.GlobalBatchSize) / (s.micro * int64(p.DP))
	}
	return s
}

// needs returns the model fields among named that are unknown.
func needs(fields map[string]int64, names ...string) []string {
	var miss []string
	for _, n := range names {
		if fields[n] == 0 {
			miss = append(miss, "model."+n)
		}
	}
	return miss
}

// collectivesOf returns the calls of one dimension's groups, or the model
// fields that are missing to size them.
func collectivesOf(dim, strategy string, s shape, p events.Parallelism) ([]call, []string) {
	known := map[string]int64{
		"parameters": s.params, "layers": s.layers, "hidden_size": s.hidden, "seq_len": s.seq,
		"dtype": s.e, "global_batch_size": s.m,
	}
	tp, pp, cp := int64(p.TP), int64(p.PP), int64(p.CP)
	mk := func(coll string, bytes, calls int64, purpose string) call {
		return call{Collective: events.Collective{Collective: coll, Bytes: bytes, CallsPerStep: int(min(calls, maxCalls+1)), Bound: Bound(bytes), Purpose: purpose}}
	}
	// act is one micro-batch's activations on a rank: b·(s/cp)·h·bytes.
	act := mul(s.micro, s.seq/cp, s.hidden, s.e)
	switch dim {
	case "dp":
		if miss := needs(known, "parameters", "dtype"); miss != nil {
			return nil, miss
		}
		// grad is this rank's share of the gradients (and of the
		// parameters): parameters·bytes/(tp·pp).
		grad := mul(s.params, s.e) / (tp * pp)
		switch strategy {
		case events.StrategyZeRO1, events.StrategyZeRO2:
			return []call{
				mk(events.CollectiveReduceScatter, grad, 1, "gradient reduce-scatter to optimizer-state shards"),
				mk(events.CollectiveAllGather, grad, 1, "updated parameter all-gather"),
			}, nil
		case events.StrategyZeRO3, events.StrategyFSDP:
			return []call{
				mk(events.CollectiveAllGather, grad, 2, "parameter all-gather, once in forward and once in backward"),
				mk(events.CollectiveReduceScatter, grad, 1, "gradient reduce-scatter"),
			}, nil
		case events.StrategyPS:
			return []call{
				mk(events.CollectiveAllToAll, grad, 1, "gradient push to the parameter-server shards"),
				mk(events.CollectiveAllToAll, grad, 1, "parameter pull from the parameter-server shards"),
			}, nil
		default: // ddp, megatron, unset
			return []call{mk(events.CollectiveAllReduce, grad, 1, "gradient all-reduce")}, nil
		}
	case "tp":
		if miss := needs(known, "hidden_size", "seq_len", "dtype", "layers", "global_batch_size"); miss != nil {
			return nil, miss
		}
		return []call{mk(events.CollectiveAllReduce, act, mul(4, s.perStage, s.m),
			"activation all-reduce: 2 forward and 2 backward per layer per micro-batch")}, nil
	case "pp":
		if miss := needs(known, "hidden_size", "seq_len", "dtype", "global_batch_size"); miss != nil {
			return nil, miss
		}
		fwd := mk(events.CollectiveSendRecv, act, s.m, "activations to the next stage, one per micro-batch")
		fwd.skipLast = true
		bwd := mk(events.CollectiveSendRecv, act, s.m, "activation gradients to the previous stage, one per micro-batch")
		bwd.skipFirst = true
		return []call{fwd, bwd}, nil
	case "cp":
		if miss := needs(known, "hidden_size", "seq_len", "dtype", "layers", "global_batch_size"); miss != nil {
			return nil, miss
		}
		// kv is the K and V of the whole sequence for this rank's heads:
		// 2·b·s·(h/tp)·bytes, of which each rank holds 1/cp.
		kv := mul(2, s.micro, s.seq, s.hidden/tp, s.e)
		calls := mul(s.perStage, s.m)
		return []call{
			mk(events.CollectiveAllGather, kv, calls, "K,V all-gather in forward, per layer per micro-batch"),
			mk(events.CollectiveAllGather, kv, calls, "K,V all-gather in backward, per layer per micro-batch"),
			mk(events.CollectiveReduceScatter, kv, calls, "dK,dV reduce-scatter in backward, per layer per micro-batch"),
		}, nil
	case "ep":
		if miss := needs(known, "hidden_size", "seq_len", "dtype", "layers", "global_batch_size"); miss != nil {
			return nil, miss
		}
		tokens := mul(s.micro, s.seq/cp, s.hidden, s.topK, s.e)
		return []call{mk(events.CollectiveAllToAll, tokens, mul(4, s.perStage, s.m),
			"token all-to-all: dispatch and combine, forward and backward, per MoE layer per micro-batch")}, nil
	}
	return nil, nil
}

// annotate adds collectives to a's groups, appends the job's explicit
// groups, and sums the volumes. It refuses sizes past maxBytes.
func annotate(a *events.JobAnalyzed) []events.Reason {
	job, p := a.Job, a.Parallelism
	s := shapeOf(job, p)
	if s.m > 0 {
		a.MicroBatchesPerStep = int(s.m)
	}
	calls := make([][]call, len(a.Groups))
	if job.Model != nil {
		for i := range a.Groups {
			g := &a.Groups[i]
			c, miss := collectivesOf(g.Dimension, job.Strategy, s, p)
			if miss != nil {
				a.Warnings = append(a.Warnings, fmt.Sprintf("%s groups not sized: %s not given", g.Dimension, strings.Join(miss, ", ")))
				continue
			}
			calls[i] = c
			for _, x := range c {
				g.Collectives = append(g.Collectives, x.Collective)
			}
		}
	}
	// Explicit groups: those of one name are the members of one dimension.
	byName := map[string]int{}
	for _, cg := range job.Groups {
		i, ok := byName[cg.Name]
		if !ok {
			i = len(a.Groups)
			byName[cg.Name] = i
			c := events.Collective{Collective: cg.Collective, Bytes: cg.Bytes, CallsPerStep: max(cg.CallsPerStep, 1),
				Bound: Bound(cg.Bytes), Purpose: "explicit group " + cg.Name}
			a.Groups = append(a.Groups, events.RankGroups{Dimension: events.DimensionCustom, Name: cg.Name, Size: len(cg.Ranks),
				Members: [][]int{}, Collectives: []events.Collective{c}})
			calls = append(calls, []call{{Collective: c}})
		}
		a.Groups[i].Members = append(a.Groups[i].Members, append([]int(nil), cg.Ranks...))
	}
	// Per-rank volume: the bytes a rank sends, over every call of every
	// group it is in (bus bytes; only the sending end of a pipeline's
	// send/recv).
	vol := make([]int64, job.GPUs)
	for i, g := range a.Groups {
		for _, c := range calls[i] {
			if c.CallsPerStep > maxCalls || c.Bytes > maxBytes {
				return []events.Reason{{Code: "volume_too_large", Field: "model", Message: fmt.Sprintf(
					"%s %s: %d calls of %d bytes per step exceed the limits of %d calls and %d bytes", g.Dimension, c.Collective.Collective, c.CallsPerStep, c.Bytes, int64(maxCalls), int64(maxBytes))}}
			}
			v := mul(c.Bytes, int64(c.CallsPerStep))
			for _, m := range g.Members {
				sent := busBytes(c.Collective.Collective, v, len(m))
				for at, r := range m {
					if (c.skipFirst && at == 0) || (c.skipLast && at == len(m)-1) {
						continue
					}
					vol[r] = add(vol[r], sent)
				}
			}
		}
	}
	for _, v := range vol {
		a.BytesPerStepPerRank = max(a.BytesPerStepPerRank, v)
		a.TotalBytesPerStep = add(a.TotalBytesPerStep, v)
	}
	if a.TotalBytesPerStep > maxBytes {
		return []events.Reason{{Code: "volume_too_large", Field: "model", Message: fmt.Sprintf(
			"the job moves %d bytes per step in all, past the limit of %d", a.TotalBytesPerStep, int64(maxBytes))}}
	}
	return nil
}
