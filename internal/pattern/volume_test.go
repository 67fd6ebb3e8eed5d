package pattern

import (
	"math"
	"reflect"
	"strings"
	"testing"

	"github.com/toposched/toposched/events"
)

// gpt3 is GPT-3 175B as trained in Narayanan et al., "Efficient Large-Scale
// Language Model Training on GPU Clusters Using Megatron-LM", SC'21, Table 1
// (175.0B parameters, 96 layers, hidden size 12288, 96 heads, tp 8, pp 16,
// 1536 GPUs, batch size 1536) with sequence length 2048 (§5.1) and
// micro-batch size 1, in fp16.
func gpt3(pp int) events.JobSubmitted {
	return events.JobSubmitted{
		JobID: "gpt3", GPUs: 1536, Strategy: events.StrategyMegatron,
		Parallelism: &events.Parallelism{TP: 8, PP: pp},
		Model: &events.Model{Parameters: 175_000_000_000, Layers: 96, HiddenSize: 12288, Heads: 96, SeqLen: 2048,
			MicroBatchSize: 1, GlobalBatchSize: 1536, Dtype: events.DtypeFP16},
	}
}

func collectivesByDim(a events.JobAnalyzed) map[string][]events.Collective {
	out := map[string][]events.Collective{}
	for _, g := range a.Groups {
		key := g.Dimension
		if g.Name != "" {
			key += ":" + g.Name
		}
		out[key] = g.Collectives
	}
	return out
}

func TestVolumes(t *testing.T) {
	t.Parallel()
	const (
		ar, ag, rs, a2a, p2p = events.CollectiveAllReduce, events.CollectiveAllGather, events.CollectiveReduceScatter,
			events.CollectiveAllToAll, events.CollectiveSendRecv
		lat, bw = events.BoundLatency, events.BoundBandwidth
	)
	// GPT-3 activations per micro-batch: b·s·h·bytes = 1·2048·12288·2.
	const act = 50_331_648
	tests := []struct {
		name      string
		job       events.JobSubmitted
		want      map[string][]events.Collective // bytes, calls and collective; purpose ignored
		perRank   int64
		total     int64
		micro     int
		wantWarns []string
	}{
		{
			// BERT-Large (Devlin et al. 2019): 340M parameters; fp32 DDP
			// all-reduces 340M × 4 B = 1.36 GB (≈1.27 GiB) of gradients per
			// step. A ring all-reduce sends 2(n-1)/n of that from each rank.
			name: "bert-large ddp fp32",
			job: events.JobSubmitted{JobID: "bert", GPUs: 8, Strategy: events.StrategyDDP,
				Model: &events.Model{Parameters: 340_000_000, Dtype: events.DtypeFP32}},
			want:    map[string][]events.Collective{"dp": {{Collective: ar, Bytes: 1_360_000_000, CallsPerStep: 1, Bound: bw}}},
			perRank: 1_360_000_000 * 2 * 7 / 8, // 2_380_000_000
			total:   8 * 2_380_000_000,
		},
		{
			// GPT-3 175B, tp 8 pp 16 dp 12 (Narayanan et al. SC'21 Table 1):
			// each rank holds 175e9/(8·16) parameters, so its DP gradient
			// all-reduce is 175e9·2/128 = 2.734 GB per step. m = 1536/12 =
			// 128 micro-batches; each stage holds 96/16 = 6 layers, so TP
			// all-reduces 4·6·128 = 3072 activations of bsh·2 = 48 MiB (§3.3:
			// "tensors of total size bsh need to be all-reduced among t model
			// replicas twice each in the forward and backward pass for each
			// layer"); PP sends bsh per micro-batch each way (§3.3).
			name: "gpt-3 175B tp 8 pp 16",
			job:  gpt3(16),
			want: map[string][]events.Collective{
				"tp": {{Collective: ar, Bytes: act, CallsPerStep: 3072, Bound: bw}},
				"dp": {{Collective: ar, Bytes: 2_734_375_000, CallsPerStep: 1, Bound: bw}},
				"pp": {{Collective: p2p, Bytes: act, CallsPerStep: 128, Bound: bw}, {Collective: p2p, Bytes: act, CallsPerStep: 128, Bound: bw}},
			},
			micro: 128,
			// Middle stage: dp 2·11/12·2_734_375_000 (floor) + tp
			// 2·7/8·3072·act + pp 2·128·act.
			perRank: 5_013_020_833 + 270_582_939_648 + 12_884_901_888,
			// 1536 ranks' dp and tp; 96 pipelines of 15 boundaries, 2·128
			// messages each.
			total: 1536*5_013_020_833 + 1536*270_582_939_648 + 96*15*256*act,
		},
		{
			// The same at pp 8: dp 24, 64 micro-batches, 12 layers a stage,
			// DP gradient 175e9·2/64 = 5.47 GB.
			name: "gpt-3 175B tp 8 pp 8",
			job:  gpt3(8),
			want: map[string][]events.Collective{
				"tp": {{Collective: ar, Bytes: act, CallsPerStep: 4 * 12 * 64, Bound: bw}},
				"dp": {{Collective: ar, Bytes: 5_468_750_000, CallsPerStep: 1, Bound: bw}},
				"pp": {{Collective: p2p, Bytes: act, CallsPerStep: 64, Bound: bw}, {Collective: p2p, Bytes: act, CallsPerStep: 64, Bound: bw}},
			},
			micro:   64,
			perRank: 5_468_750_000*2*23/24 + act*3072*2*7/8 + 2*64*act,
			total:   1536*(5_468_750_000*2*23/24) + 1536*(act*3072*2*7/8) + 192*7*128*act,
		},
		{
			// ZeRO-3 (Rajbhandari et al. SC'20 §7.2.2): parameters
			// all-gathered in forward and backward, gradients
			// reduce-scattered: 3Ψ against DDP's 2Ψ. 7B bf16 → Ψ = 14 GB.
			name: "zero3 7B bf16",
			job: events.JobSubmitted{JobID: "z3", GPUs: 16, Strategy: events.StrategyZeRO3,
				Model: &events.Model{Parameters: 7_000_000_000, Dtype: events.DtypeBF16}},
			want: map[string][]events.Collective{"dp": {
				{Collective: ag, Bytes: 14_000_000_000, CallsPerStep: 2, Bound: bw},
				{Collective: rs, Bytes: 14_000_000_000, CallsPerStep: 1, Bound: bw}}},
			perRank: 3 * 14_000_000_000 * 15 / 16,
			total:   16 * (3 * 14_000_000_000 * 15 / 16),
		},
		{
			// ZeRO-1/2 move what DDP moves (ZeRO §7.2.1): 2Ψ(n-1)/n.
			name: "zero1 7B bf16",
			job: events.JobSubmitted{JobID: "z1", GPUs: 16, Strategy: events.StrategyZeRO1,
				Model: &events.Model{Parameters: 7_000_000_000, Dtype: events.DtypeBF16}},
			want: map[string][]events.Collective{"dp": {
				{Collective: rs, Bytes: 14_000_000_000, CallsPerStep: 1, Bound: bw},
				{Collective: ag, Bytes: 14_000_000_000, CallsPerStep: 1, Bound: bw}}},
			perRank: 2 * 14_000_000_000 * 15 / 16,
			total:   16 * (2 * 14_000_000_000 * 15 / 16),
		},
		{
			name: "parameter server",
			job: events.JobSubmitted{JobID: "ps", GPUs: 4, Strategy: events.StrategyPS,
				Model: &events.Model{Parameters: 1000, Dtype: events.DtypeFP32}},
			want: map[string][]events.Collective{"dp": {
				{Collective: a2a, Bytes: 4000, CallsPerStep: 1, Bound: lat},
				{Collective: a2a, Bytes: 4000, CallsPerStep: 1, Bound: lat}}},
			perRank: 2 * 4000 * 3 / 4,
			total:   4 * 6000,
		},
		{
			// cp 2, tp 2, 4 layers, pp 1, b 2, s 1024, h 256, bf16, global
			// 4 on dp 2 → m = 1. act = 2·512·256·2 = 524288; kv =
			// 2·2·1024·128·2 = 1048576; tp calls 4·4·1; cp calls 4·1.
			name: "context parallel",
			job: events.JobSubmitted{JobID: "cp", GPUs: 8, Parallelism: &events.Parallelism{TP: 2, CP: 2},
				Model: &events.Model{Parameters: 1_000_000, Layers: 4, HiddenSize: 256, Heads: 8, SeqLen: 1024,
					MicroBatchSize: 2, GlobalBatchSize: 4, Dtype: events.DtypeBF16}},
			want: map[string][]events.Collective{
				"tp": {{Collective: ar, Bytes: 524288, CallsPerStep: 16, Bound: bw}},
				"cp": {{Collective: ag, Bytes: 1048576, CallsPerStep: 4, Bound: bw}, {Collective: ag, Bytes: 1048576, CallsPerStep: 4, Bound: bw},
					{Collective: rs, Bytes: 1048576, CallsPerStep: 4, Bound: bw}},
				"dp": {{Collective: ar, Bytes: 1_000_000, CallsPerStep: 1, Bound: bw}},
			},
			micro:   1,
			perRank: 524288*16*2*1/2 + 3*1048576*4*1/2 + 1_000_000*2*1/2,
			total:   8 * (524288*16 + 3*1048576*4/2 + 1_000_000),
		},
		{
			// MoE: 8 experts, top 2, ep 4 inside dp 4, 2 layers, b 1, s 128,
			// h 64, fp8, global 8 → m 2. Tokens: 1·128·64·2·1 = 16384, 4·2·2
			// = 16 calls, latency-bound.
			name: "experts",
			job: events.JobSubmitted{JobID: "moe", GPUs: 4, Parallelism: &events.Parallelism{EP: 4},
				Model: &events.Model{Parameters: 1_000_000, Layers: 2, HiddenSize: 64, Heads: 4, SeqLen: 128,
					GlobalBatchSize: 8, Dtype: events.DtypeFP8, Experts: 8, TopK: 2}},
			want: map[string][]events.Collective{
				"ep": {{Collective: a2a, Bytes: 16384, CallsPerStep: 16, Bound: lat}},
				"dp": {{Collective: ar, Bytes: 1_000_000, CallsPerStep: 1, Bound: bw}},
			},
			micro:   2,
			perRank: 16384*16*3/4 + 1_000_000*2*3/4,
			total:   4 * (16384*16*3/4 + 1_000_000*2*3/4),
		},
		{
			// pp 2: stage 0 sends m activations, stage 1 m gradients.
			name: "two stages",
			job: events.JobSubmitted{JobID: "pp", GPUs: 2, Parallelism: &events.Parallelism{PP: 2},
				Model: &events.Model{HiddenSize: 16, SeqLen: 8, GlobalBatchSize: 3, Dtype: events.DtypeFP32}},
			want: map[string][]events.Collective{
				"pp": {{Collective: p2p, Bytes: 512, CallsPerStep: 3, Bound: lat}, {Collective: p2p, Bytes: 512, CallsPerStep: 3, Bound: lat}},
			},
			micro:   3,
			perRank: 3 * 512,
			total:   2 * 3 * 512,
		},
		{
			name: "explicit groups of one name are one dimension",
			job: events.JobSubmitted{JobID: "x", GPUs: 4, Groups: []events.CommGroup{
				{Name: "halo", Collective: p2p, Ranks: []int{0, 1}, Bytes: 1 << 20, CallsPerStep: 10},
				{Name: "halo", Collective: p2p, Ranks: []int{2, 3}, Bytes: 1 << 20, CallsPerStep: 10},
				{Name: "sync", Collective: events.CollectiveBroadcast, Ranks: []int{0, 3}, Bytes: 100},
			}},
			want: map[string][]events.Collective{
				"dp":          nil,
				"custom:halo": {{Collective: p2p, Bytes: 1 << 20, CallsPerStep: 10, Bound: bw}},
				"custom:sync": {{Collective: events.CollectiveBroadcast, Bytes: 100, CallsPerStep: 1, Bound: lat}},
			},
			perRank: 10<<20 + 100,
			total:   4*(10<<20) + 200,
		},
		{
			name: "model without the batch: per-micro-batch volumes not sized",
			job: events.JobSubmitted{JobID: "w", GPUs: 4, Parallelism: &events.Parallelism{TP: 2},
				Model: &events.Model{Parameters: 100, HiddenSize: 8, Dtype: events.DtypeFP32}},
			want:      map[string][]events.Collective{"tp": nil, "dp": {{Collective: ar, Bytes: 200, CallsPerStep: 1, Bound: lat}}},
			perRank:   200,
			total:     4 * 200,
			wantWarns: []string{"tp groups not sized: model.seq_len, model.layers, model.global_batch_size not given"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			a, reasons := Analyze(tc.job)
			if len(reasons) > 0 {
				t.Fatalf("Analyze: %v", reasons)
			}
			got := collectivesByDim(a)
			for _, cs := range got {
				for i := range cs {
					if cs[i].Purpose == "" {
						t.Errorf("%+v: no purpose", cs[i])
					}
					cs[i].Purpose = ""
				}
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("collectives =\n%+v\nwant\n%+v", got, tc.want)
			}
			if a.BytesPerStepPerRank != tc.perRank {
				t.Errorf("bytes_per_step_per_rank = %d, want %d", a.BytesPerStepPerRank, tc.perRank)
			}
			if a.TotalBytesPerStep != tc.total {
				t.Errorf("total_bytes_per_step = %d, want %d", a.TotalBytesPerStep, tc.total)
			}
			if a.MicroBatchesPerStep != tc.micro {
				t.Errorf("micro_batches_per_step = %d, want %d", a.MicroBatchesPerStep, tc.micro)
			}
			if !reflect.DeepEqual(a.Warnings, tc.wantWarns) {
				t.Errorf("warnings = %q, want %q", a.Warnings, tc.wantWarns)
			}
		})
	}
}

func TestAnalyzeRejects(t *testing.T) {
	t.Parallel()
	gpt := gpt3(16)
	with := func(f func(j *events.JobSubmitted)) events.JobSubmitted {
		j := gpt
		m := *gpt.Model
		j.Model = &m
		p := *gpt.Parallelism
		j.Parallelism = &p
		f(&j)
		return j
	}
	tests := []struct {
		name       string
		job        events.JobSubmitted
		wantFields []string
		wantText   string
	}{
		{"tp must divide heads", with(func(j *events.JobSubmitted) { j.Model.Heads, j.Model.HiddenSize = 100, 12800 }),
			[]string{"model.heads"}, "tp = 8 must divide heads = 100 (heads mod tp = 4)"},
		{"pp must divide layers", with(func(j *events.JobSubmitted) { j.Model.Layers = 90 }),
			[]string{"model.layers"}, "pp = 16 must divide layers = 90 (layers mod pp = 10)"},
		{"global batch", with(func(j *events.JobSubmitted) { j.Model.GlobalBatchSize = 1000 }),
			[]string{"model.global_batch_size"}, "global_batch_size = 1000 is not a multiple of micro_batch_size·dp = 1·12 = 12 (remainder 4)"},
		{"cp must divide seq_len", with(func(j *events.JobSubmitted) {
			j.Parallelism = &events.Parallelism{TP: 8, PP: 16, CP: 3}
			j.GPUs = 8 * 16 * 3 * 4
			j.Model.GlobalBatchSize = 4
			j.Model.SeqLen = 2048
		}), []string{"model.seq_len"}, "cp = 3 must divide seq_len = 2048 (seq_len mod cp = 2)"},
		{"ep must divide experts", with(func(j *events.JobSubmitted) {
			j.Parallelism.EP = 4
			j.Model.Experts = 6
			j.Model.TopK = 2
		}), []string{"model.experts"}, "ep = 4 must divide experts = 6 (experts mod ep = 2)"},
		{"ep without experts", with(func(j *events.JobSubmitted) { j.Parallelism.EP = 4 }),
			[]string{"model.experts"}, "ep = 4 but the model has no experts"},
		{"top_k beyond experts", with(func(j *events.JobSubmitted) { j.Model.Experts = 4; j.Model.TopK = 5 }),
			[]string{"model.top_k"}, "top_k = 5 exceeds experts = 4"},
		{"bad dtype", with(func(j *events.JobSubmitted) { j.Model.Dtype = "int4" }), []string{"model.dtype"}, `dtype = "int4"`},
		{"bad strategy", with(func(j *events.JobSubmitted) { j.Strategy = "zero4" }), []string{"strategy"}, `strategy = "zero4"`},
		{"ps with model parallelism", with(func(j *events.JobSubmitted) { j.Strategy = events.StrategyPS }),
			[]string{"strategy"}, "tp·pp·cp·ep = 8·16·1·1 = 128"},
		{"product and heads at once", with(func(j *events.JobSubmitted) { j.GPUs = 1000; j.Model.Heads, j.Model.HiddenSize = 100, 12800 }),
			[]string{"gpus", "model.heads"}, "not a multiple of tp·pp·cp"},
		{"layout not a permutation", with(func(j *events.JobSubmitted) { j.Layout = "tp-tp-ep-dp-pp" }),
			[]string{"layout"}, "exactly once"},
		{"layout missing one", with(func(j *events.JobSubmitted) { j.Layout = "tp-cp-ep-dp" }), []string{"layout"}, ""},
		{"group ranks", events.JobSubmitted{JobID: "g", GPUs: 4, Groups: []events.CommGroup{
			{Name: "a", Collective: events.CollectiveAllReduce, Ranks: []int{0, 4, 1, 0}, Bytes: 8},
		}}, []string{"groups[0].ranks[1]", "groups[0].ranks[3]"}, "groups[0].ranks[1] = 4 is outside the job's ranks 0..3 (gpus = 4)"},
		{"groups of one name disagree", events.JobSubmitted{JobID: "g", GPUs: 4, Groups: []events.CommGroup{
			{Name: "a", Collective: events.CollectiveAllReduce, Ranks: []int{0, 1}, Bytes: 8},
			{Name: "a", Collective: events.CollectiveAllReduce, Ranks: []int{2, 3}, Bytes: 16},
		}}, []string{"groups[1].name"}, `shares the name "a" with groups[0]`},
		{"unknown collective", events.JobSubmitted{JobID: "g", GPUs: 4, Groups: []events.CommGroup{
			{Name: "a", Collective: "gossip", Ranks: []int{0}, Bytes: 8},
		}}, []string{"groups[0].collective"}, ""},
		{"compute per model not positive", events.JobSubmitted{JobID: "c", GPUs: 2,
			StepComputeSecondsByModel: map[string]float64{"T4": 3, "H100": 0, "A100": math.NaN()}},
			[]string{"step_compute_seconds_by_model", "step_compute_seconds_by_model"}, `step_compute_seconds_by_model["A100"] = NaN must be a positive number`},
		{"compute per model, empty name", events.JobSubmitted{JobID: "c", GPUs: 2,
			StepComputeSecondsByModel: map[string]float64{"": 3}},
			[]string{"step_compute_seconds_by_model"}, "empty model name"},
		{"volume too large", events.JobSubmitted{JobID: "v", GPUs: 2, Model: &events.Model{Parameters: 1 << 62, Dtype: events.DtypeFP32}},
			[]string{"model"}, "exceed the limits"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, reasons := Analyze(tc.job)
			var fields []string
			var text strings.Builder
			for _, r := range reasons {
				fields = append(fields, r.Field)
				text.WriteString(r.Message + "\n")
				if r.Code == "" {
					t.Errorf("reason without a code: %+v", r)
				}
			}
			if !reflect.DeepEqual(fields, tc.wantFields) {
				t.Fatalf("fields %v, want %v (%s)", fields, tc.wantFields, text.String())
			}
			if !strings.Contains(text.String(), tc.wantText) {
				t.Errorf("messages %q do not say %q", text.String(), tc.wantText)
			}
		})
	}
}

// zero3 with tp > 1 is accepted: Megatron-DeepSpeed and FSDP with tensor
// parallelism both run it.
func TestZeRO3WithTP(t *testing.T) {
	t.Parallel()
	job := events.JobSubmitted{JobID: "z", GPUs: 16, Strategy: events.StrategyZeRO3, Parallelism: &events.Parallelism{TP: 4},
		Model: &events.Model{Parameters: 8_000_000, Dtype: events.DtypeBF16}}
	a, reasons := Analyze(job)
	if len(reasons) > 0 {
		t.Fatalf("Analyze: %v", reasons)
	}
	// Each rank all-gathers its tp shard: 8e6·2/4.
	if c := collectivesByDim(a)["dp"]; len(c) != 2 || c[0].Bytes != 4_000_000 {
		t.Errorf("dp collectives %+v, want all-gathers of 4000000 bytes", c)
	}
}

func TestLayout(t *testing.T) {
	t.Parallel()
	// dp fastest, then tp: tp 2 dp 2 puts dp groups on consecutive ranks.
	job := events.JobSubmitted{JobID: "l", GPUs: 4, Parallelism: &events.Parallelism{TP: 2}, Layout: "dp-tp-cp-ep-pp"}
	a, reasons := Analyze(job)
	if len(reasons) > 0 {
		t.Fatalf("Analyze: %v", reasons)
	}
	if want := []string{"dp", "tp", "cp", "ep", "pp"}; !reflect.DeepEqual(a.Order, want) {
		t.Errorf("order %v, want %v", a.Order, want)
	}
	got := map[string][][]int{}
	for _, g := range a.Groups {
		got[g.Dimension] = g.Members
	}
	want := map[string][][]int{"tp": {{0, 2}, {1, 3}}, "dp": {{0, 1}, {2, 3}}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("groups %v, want %v", got, want)
	}
	// The default layout is Megatron's.
	a, _ = Analyze(events.JobSubmitted{JobID: "d", GPUs: 4})
	if !reflect.DeepEqual(a.Order, DefaultOrder) {
		t.Errorf("default order %v", a.Order)
	}
}

func TestBound(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		bytes int64
		want  string
	}{{0, events.BoundLatency}, {256<<10 - 1, events.BoundLatency}, {256 << 10, events.BoundBandwidth}, {1 << 30, events.BoundBandwidth}} {
		if got := Bound(tc.bytes); got != tc.want {
			t.Errorf("Bound(%d) = %s, want %s", tc.bytes, got, tc.want)
		}
	}
}

func benchmarkAnalyze(b *testing.B, job events.JobSubmitted) {
	b.ReportAllocs()
	for b.Loop() {
		if _, reasons := Analyze(job); len(reasons) > 0 {
			b.Fatal(reasons)
		}
	}
}

// BenchmarkAnalyze lays out GPT-3 175B on 1024 ranks (tp 8, pp 16, dp 8)
// and on 16384 ranks (tp 8, pp 16, dp 128).
func BenchmarkAnalyze(b *testing.B) {
	for _, gpus := range []int{1024, 16384} {
		job := gpt3(16)
		job.GPUs = gpus
		m := *job.Model
		m.GlobalBatchSize = gpus / 128 * 16
		job.Model = &m
		b.Run(map[int]string{1024: "1k", 16384: "16k"}[gpus], func(b *testing.B) { benchmarkAnalyze(b, job) })
	}
}
