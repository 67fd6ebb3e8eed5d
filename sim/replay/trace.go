package replay

import (
	"cmp"
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"regexp"
	"slices"
	"strings"

	"github.com/toposched/toposched/events"
)

// Job is one job of a trace, before it is shaped into a submission.
type Job struct {
	ID string `json:"id"`
	// Arrival is the submission time in seconds from the trace's start.
	Arrival float64 `json:"arrival"`
	// Duration is how long the job runs once placed, in seconds; negative
	// when the trace gives no end (it runs until the replay ends).
	Duration float64 `json:"duration"`
	GPUs     int     `json:"gpus"`
	// GPUsPerNode is the GPUs wanted on each node; 0 lets placement choose.
	GPUsPerNode int `json:"gpus_per_node,omitempty"`
	// GPUModel constrains the GPU model; "" takes any.
	GPUModel string            `json:"gpu_model,omitempty"`
	Labels   map[string]string `json:"labels,omitempty"`
	// Line is the job's line in its file (0 for generated jobs).
	Line int `json:"line,omitempty"`
}

// Trace is a parsed or generated workload.
type Trace struct {
	// Kind is alibaba-openb, itp, philly, helios or synthetic.
	Kind string `json:"kind"`
	// Source is the file read (or the generator's settings).
	Source string `json:"source"`
	// Records counts the records read; each is a job or a skip.
	Records int   `json:"records"`
	Jobs    []Job `json:"jobs"`
	// Skipped counts records not replayed, by reason.
	Skipped map[string]int `json:"skipped,omitempty"`
	// Notes say how records were adapted (a fraction of a GPU taken as a
	// whole one), with counts.
	Notes []string `json:"notes,omitempty"`
}

func (t *Trace) skip(reason string) {
	if t.Skipped == nil {
		t.Skipped = map[string]int{}
	}
	t.Skipped[reason]++
}

// SkippedTotal counts every skipped record.
func (t *Trace) SkippedTotal() int {
	n := 0
	for _, v := range t.Skipped {
		n += v
	}
	return n
}

// sortByArrival orders jobs by arrival, then by file order (stable), and
// makes arrivals relative to the first.
func (t *Trace) sortByArrival() {
	slices.SortStableFunc(t.Jobs, func(a, b Job) int { return cmp.Compare(a.Arrival, b.Arrival) })
	if len(t.Jobs) == 0 {
		return
	}
	t0 := t.Jobs[0].Arrival
	for i := range t.Jobs {
		t.Jobs[i].Arrival -= t0
	}
}

// Limit keeps the first n jobs by arrival (n <= 0: all).
func (t *Trace) Limit(n int) {
	if n > 0 && n < len(t.Jobs) {
		t.Notes = append(t.Notes, fmt.Sprintf("--limit %d: the first %d of %d jobs by arrival are replayed", n, n, len(t.Jobs)))
		t.Jobs = t.Jobs[:n]
	}
}

// Span is the time from the first arrival to the last arrival or planned
// end, in seconds.
func (t *Trace) Span() float64 {
	s := 0.0
	for _, j := range t.Jobs {
		s = max(s, j.Arrival+max(j.Duration, 0))
	}
	return s
}

var jobIDPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$`)

// modelShape is a GPT-style model the shaping rule gives a job. Shapes
// follow GPT-3's table (Brown et al. 2020) and Llama 2 70B.
type modelShape struct {
	name                 string
	params               int64
	layers, hidden, head int
}

var (
	smallModels = []modelShape{
		{"gpt-350m", 350e6, 24, 1024, 16},
		{"gpt-1.3b", 1300e6, 24, 2048, 16},
		{"gpt-2.7b", 2700e6, 32, 2560, 32},
	}
	mediumModels = []modelShape{
		{"gpt-6.7b", 6700e6, 32, 4096, 32},
		{"gpt-13b", 13000e6, 40, 5120, 40},
	}
	largeModels = []modelShape{
		{"gpt-13b", 13000e6, 40, 5120, 40},
		{"llama-70b", 70000e6, 80, 8192, 64},
	}
)

// Shape turns a trace job into a submission. No public trace records a
// job's parallel degrees or model, so they are assigned by this rule,
// drawn from seed and the job's index (the same trace and seed give the
// same submissions):
//
//   - 1 GPU: DDP of gpt-350m; nothing to communicate.
//   - up to nodeGPUs GPUs (one node): DDP (dp = gpus) of a model drawn
//     from gpt-350m, gpt-1.3b and gpt-2.7b.
//   - more: Megatron with tp = the largest of 8, 4, 2, 1 that divides gpus
//     and nodeGPUs; pp = 4 from 256 GPUs, 2 from 64, else 1 (halved until
//     it divides gpus/tp); dp the rest. Up to 32 GPUs the model is drawn
//     from gpt-6.7b and gpt-13b, above from gpt-13b and llama-70b.
//
// Every model is bf16, sequence 2048, micro-batch 1 and 8 micro-batches
// per step (global batch 8·dp).
func Shape(j Job, index int, nodeGPUs int, seed uint64) events.JobSubmitted {
	rng := rand.New(rand.NewPCG(seed, uint64(index)))
	s := events.JobSubmitted{JobID: j.ID, GPUs: j.GPUs, GPUsPerNode: j.GPUsPerNode, GPUModel: j.GPUModel, Labels: j.Labels}
	tp, pp := 1, 1
	var m modelShape
	switch {
	case j.GPUs == 1:
		m = smallModels[0]
		s.Strategy = events.StrategyDDP
	case j.GPUs <= nodeGPUs:
		m = smallModels[rng.IntN(len(smallModels))]
		s.Strategy = events.StrategyDDP
	default:
		for _, t := range []int{8, 4, 2, 1} {
			if j.GPUs%t == 0 && nodeGPUs%t == 0 {
				tp = t
				break
			}
		}
		switch {
		case j.GPUs >= 256:
			pp = 4
		case j.GPUs >= 64:
			pp = 2
		}
		for pp > 1 && (j.GPUs/tp)%pp != 0 {
			pp /= 2
		}
		if j.GPUs <= 32 {
			m = mediumModels[rng.IntN(len(mediumModels))]
		} else {
			m = largeModels[rng.IntN(len(largeModels))]
		}
		s.Strategy = events.StrategyMegatron
	}
	dp := j.GPUs / (tp * pp)
	s.Parallelism = &events.Parallelism{TP: tp, PP: pp, DP: dp}
	s.Model = &events.Model{Parameters: m.params, Layers: m.layers, HiddenSize: m.hidden, Heads: m.head,
		SeqLen: 2048, MicroBatchSize: 1, GlobalBatchSize: 8 * dp, Dtype: events.DtypeBF16}
	if s.Labels == nil {
		s.Labels = map[string]string{}
	} else {
		s.Labels = maps.Clone(s.Labels)
	}
	s.Labels["replay.model"] = m.name
	return s
}

// singleNode sets a job of at most nodeGPUs GPUs to one node, as the job
// logs say (jobs over one node's GPUs span nodes).
func singleNode(j *Job, nodeGPUs int) {
	if j.GPUs <= nodeGPUs {
		j.GPUsPerNode = j.GPUs
	}
}

// cleanLabel keeps a label value within what the schema takes.
func cleanLabel(v string) string {
	v = strings.TrimSpace(v)
	if len(v) > 63 {
		v = v[:63]
	}
	return v
}

// finite reports whether f is a usable number.
func finite(f float64) bool { return !math.IsNaN(f) && !math.IsInf(f, 0) }

// SingleNode puts every job of a job log that fits one node of nodeGPUs
// on one node (gpus_per_node = gpus), as the logs describe them: only
// jobs larger than a node span nodes. Jobs that already say how many GPUs
// they want per node keep it.
func SingleNode(t *Trace, nodeGPUs int) {
	for i := range t.Jobs {
		if t.Jobs[i].GPUsPerNode == 0 {
			singleNode(&t.Jobs[i], nodeGPUs)
		}
	}
}

// Hold makes every job run until the replay ends: jobs arrive in trace
// order and the cluster fills, the method of the ATC'23 fragmentation
// study (which measures fragmentation against the workload arrived so
// far). The Alibaba openb pod lists need it: most pods live under an hour
// over a span of five months, so honouring their ends leaves the cluster
// nearly idle (offered load 0.27% of its GPUs on the default list).
func Hold(t *Trace) {
	for i := range t.Jobs {
		t.Jobs[i].Duration = -1
	}
	t.Notes = append(t.Notes, "--hold: jobs never finish; the cluster fills in arrival order")
}
