package aware

import (
	"math"
	"slices"
	"testing"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/internal/fixtures"
	"github.com/toposched/toposched/internal/pattern"
	"github.com/toposched/toposched/internal/placer/engine"
	"github.com/toposched/toposched/internal/placer/outcome"
	"github.com/toposched/toposched/internal/store"
	"github.com/toposched/toposched/internal/topology"
)

// TestComputeByModel is TestBestFitWithin's busy state with compute
// weighed by GPU model (the A100 the reference): the tighter fits the rule
// chose there (an RTX 4090 pair, an empty T4, the A100's last GPU) compute
// 2.3 to 12 times slower than the free H100, far outside the tolerance,
// so the H100 wins. A job whose own measurements say the RTX 4090 computes
// its step as fast as the H100 gets the tighter fit again, and blind
// compute (no reference) keeps today's choices.
func TestComputeByModel(t *testing.T) {
	t.Parallel()
	snap := fitState(t, true)
	gpt13 := func(gpus, tp int) events.JobAnalyzed { return shapedJob(t, gpus, tp, 1300e6, 24, 2048, true) }
	measured := func() events.JobAnalyzed {
		j := gpt13(2, 1).Job
		j.StepComputeSecondsByModel = map[string]float64{"RTX-4090": 1, "H100-SXM5-80GB": 1, "A100-SXM4-80GB": 1.5}
		job, reasons := pattern.Analyze(j)
		if len(reasons) > 0 {
			t.Fatal(reasons)
		}
		return job
	}()
	for _, tc := range []struct {
		name string
		job  events.JobAnalyzed
		ref  string
		tol  float64
		want string
	}{
		{"1 GPU: the H100, not the A100's last GPU", gpt13(1, 1), "a100", 0, "h100-001"},
		{"1 GPU, compute blind: the A100's last GPU", gpt13(1, 1), "", 0, "a100-001"},
		{"2-GPU DDP: the H100, not the RTX 4090 pair", gpt13(2, 1), "a100", 0, "h100-001"},
		{"2-GPU DDP, compute blind: the RTX 4090 pair", gpt13(2, 1), "", 0, "rtx4090-sw-001"},
		{"4-GPU DDP with a 20% tolerance: the H100, not the empty T4", gpt13(4, 1), "a100", 0.20, "h100-001"},
		{"2-GPU DDP measured as fast on an RTX 4090: the pair", measured, "a100", 0, "rtx4090-sw-001"},
		{"2-GPU DDP without a model: no compute time, the fastest", shapedJob(t, 2, 1, 0, 0, 0, false), "a100", 0, "h100-001"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opts := engine.Options{FitTolerance: tc.tol, ComputeReference: tc.ref}
			r := Place(engine.Request{Snap: snap, Job: tc.job, Options: opts})
			if r.Verdict != outcome.Placed {
				t.Fatalf("verdict %v: %v", r.Verdict, r.Reasons)
			}
			if got := r.GPUs[0].Node; got != tc.want || slices.ContainsFunc(r.GPUs, func(g store.GPUKey) bool { return g.Node != got }) {
				t.Errorf("placed on %v, want node %s", r.GPUs, tc.want)
			}
		})
	}
}

// TestComputeByModelJudged: a policy's score is weighed against relative
// step time, compute included. A one-GPU job whose fastest choice, the
// H100, breaks a whole node (scored like keep_whole_nodes) still takes it
// when the score is less than what the next fastest model (the A100's
// last GPU, 2.3 times slower) costs its step, and takes the A100 when
// the score is more; with compute blind every one-GPU step costs the
// same and the unscored best fit wins.
func TestComputeByModelJudged(t *testing.T) {
	t.Parallel()
	kinds := fitNodes(t)
	snap := fixtures.MustStore(t, []fixtures.Node{
		{Event: kinds["a100-001"], Held: []int{0, 1, 2, 3, 4, 5, 6}},
		{Event: kinds["h100-001"]},
		{Event: kinds["t4-001"], Held: []int{1, 2, 3}},
	}, nil).Snapshot()
	job := shapedJob(t, 1, 1, 1300e6, 24, 2048, true)
	for _, tc := range []struct {
		name  string
		ref   string
		score float64
		want  string
	}{
		{"score 0.5: the H100", "a100", 0.5, "h100-001"},
		{"score 2: the A100's last GPU", "a100", 2, "a100-001"},
		{"compute blind, score 0.5: the A100's last GPU", "", 0.5, "a100-001"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			judge := func(c engine.Candidate) engine.Judgement {
				if c.GPUs[0].Node == "h100-001" {
					return engine.Judgement{Score: tc.score}
				}
				return engine.Judgement{}
			}
			r := Place(engine.Request{Snap: snap, Job: job, Options: engine.Options{ComputeReference: tc.ref, Judge: judge}})
			if r.Verdict != outcome.Placed || r.GPUs[0].Node != tc.want {
				t.Errorf("%v on %v, want node %s", r.Verdict, r.GPUs, tc.want)
			}
		})
	}
}

// TestCompOn: the slowest model among a candidate's nodes sets its
// compute; a node of a model the table does not know is priced at the
// reference's pace; without a reference compute is the job's own.
func TestCompOn(t *testing.T) {
	t.Parallel()
	kinds := fitNodes(t)
	odd := kinds["a100-002"]
	odd.GPUModel = "MI300X"
	for i := range odd.GPUs {
		odd.GPUs[i].Model = "MI300X"
	}
	snap := fixtures.MustStore(t, []fixtures.Node{{Event: kinds["h100-001"]}, {Event: kinds["t4-001"]}, {Event: odd, Name: "odd"}}, nil).Snapshot()
	job := events.JobAnalyzed{Job: events.JobSubmitted{JobID: "j", GPUs: 2, StepComputeSeconds: 2}}
	e := newEvaluator(snap, job, 2, engine.Options{ComputeReference: "a100"})
	h, tt, o := []store.GPUKey{{Node: "h100-001", Index: 0}}, []store.GPUKey{{Node: "t4-001", Index: 0}}, []store.GPUKey{{Node: "odd", Index: 0}}
	fh, ft := 0.0, 0.0
	for _, c := range []struct {
		on   string
		into *float64
	}{{"H100", &fh}, {"T4", &ft}} {
		f := e.byModel.onModel(c.on)
		*c.into = f
	}
	for _, c := range []struct {
		name string
		gpus []store.GPUKey
		want float64
	}{
		{"H100", h, fh},
		{"T4", tt, ft},
		{"H100 and T4: the T4's", append(slices.Clone(h), tt...), ft},
		{"unknown model: the reference's", o, 2},
		{"H100 and unknown: the reference's, slower", append(slices.Clone(h), o...), 2},
	} {
		if got := e.compOn(c.gpus); math.Abs(got-c.want) > 1e-12 {
			t.Errorf("%s: compOn = %v, want %v", c.name, got, c.want)
		}
	}
	if ft <= 2 || fh >= 2 {
		t.Errorf("T4 %v s, H100 %v s: want slower and faster than the A100's 2 s", ft, fh)
	}
	if est, ok := EstimateCompute(snap, job, append(slices.Clone(h), tt...), "a100", nil); !ok || est.Seconds != ft || est.Model != "T4" {
		t.Errorf("EstimateCompute(H100 and T4) = %v, %q, %v; want %v, T4", est.Seconds, est.Model, ok, ft)
	}
	if _, ok := EstimateCompute(snap, events.JobAnalyzed{Job: events.JobSubmitted{JobID: "k", GPUs: 1}}, h, "a100", nil); ok {
		t.Error("EstimateCompute of a job without compute: ok")
	}
	if got := newEvaluator(snap, job, 2, engine.Options{}).compOn(tt); got != 2 {
		t.Errorf("compute blind: %v, want the job's 2 s", got)
	}
}

// TestComputeCorrection: a compute correction in force (the online
// compute calibration's) multiplies the table's time on its model. The
// one-GPU job the H100 won in TestComputeByModel goes to the A100's last
// GPU once the H100 is measured three times slower than its figures (0.44
// of the A100's step becomes 1.32 of it), and the 2-GPU job to an A100
// pair once it is measured five times slower; a correction of the
// reference model the time was taken on divides out, and a job's own time
// on a model is not corrected.
func TestComputeCorrection(t *testing.T) {
	t.Parallel()
	snap := fitState(t, true)
	gpt13 := func(gpus int) events.JobAnalyzed { return shapedJob(t, gpus, 1, 1300e6, 24, 2048, true) }
	corr := func(m map[string]float64) *topology.Bandwidths {
		bw := topology.DefaultBandwidths()
		bw.Compute = map[string]topology.ComputeCorrection{}
		for k, f := range m {
			bw.Compute[k] = topology.ComputeCorrection{Factor: f, Samples: 12, Set: "online"}
		}
		return bw
	}
	for _, tc := range []struct {
		name string
		job  events.JobAnalyzed
		bw   *topology.Bandwidths
		want string
	}{
		{"1 GPU, no correction: the H100", gpt13(1), nil, "h100-001"},
		{"1 GPU, the H100 measured 3x slower: the A100's last GPU", gpt13(1), corr(map[string]float64{"H100 SXM": 3}), "a100-001"},
		{"1 GPU, H100 and the A100 reference both 3x: the H100 again", gpt13(1), corr(map[string]float64{"H100 SXM": 3, "A100 SXM 80GB": 3}), "h100-001"},
		{"2 GPUs, the H100 measured 5x slower: an A100 pair", gpt13(2), corr(map[string]float64{"H100 SXM": 5}), "a100-002"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := Place(engine.Request{Snap: snap, Job: tc.job, Options: engine.Options{ComputeReference: "a100", Bandwidths: tc.bw}})
			if r.Verdict != outcome.Placed {
				t.Fatalf("verdict %v: %v", r.Verdict, r.Reasons)
			}
			if got := r.GPUs[0].Node; got != tc.want {
				t.Errorf("placed on %v, want node %s", r.GPUs, tc.want)
			}
		})
	}
	h := []store.GPUKey{{Node: "h100-001", Index: 0}}
	plain, ok := EstimateCompute(snap, gpt13(1), h, "a100", nil)
	if !ok || plain.Factor != 1 || plain.Correction.Factor != 0 || plain.From != "A100 SXM 80GB" || !plain.Estimated {
		t.Fatalf("EstimateCompute, no correction = %+v, %v", plain, ok)
	}
	got, _ := EstimateCompute(snap, gpt13(1), h, "a100", corr(map[string]float64{"H100 SXM": 1.18}))
	if math.Abs(got.Seconds-1.18*plain.Seconds) > 1e-12 || got.Factor != 1.18 || got.Correction.Samples != 12 || got.Correction.Set != "online" {
		t.Errorf("EstimateCompute, H100 x1.18 = %+v; want %v s, factor 1.18 from 12 runs, online", got, 1.18*plain.Seconds)
	}
	own := gpt13(1)
	own.Job.StepComputeSecondsByModel = map[string]float64{"H100-SXM5-80GB": 0.7}
	if got, _ := EstimateCompute(snap, own, h, "a100", corr(map[string]float64{"H100 SXM": 3})); got.Seconds != 0.7 || got.Factor != 1 || got.Estimated {
		t.Errorf("EstimateCompute, the job's own H100 time = %+v; want 0.7 s uncorrected", got)
	}
}
