package replay

import (
	"bytes"
	"math"
	"strconv"
	"strings"
	"testing"
)

// The figures of a few finished jobs, worked by hand.
func TestFiguresOf(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		jobs []finished
		want JobFigures
	}{
		{name: "none", want: JobFigures{}},
		{
			// No wait: JCT is the run; the ideal runs are the durations.
			name: "no wait, stretched runs",
			jobs: []finished{
				{gpus: 8, arrival: 0, start: 0, run: 120, duration: 100},
				{gpus: 2, arrival: 10, start: 10, run: 300, duration: 300},
			},
			want: JobFigures{Jobs: 2, JCTMeanSeconds: 210, JCTIdealRunMeanSeconds: 200, StretchMean: 1.1,
				SlowdownMean: 1.1, GPUHours: (8*120 + 2*300) / 3600.0},
		},
		{
			// A wait counts in both: only the run is made ideal.
			name: "a wait",
			jobs: []finished{{gpus: 4, arrival: 100, start: 160, run: 200, duration: 100}},
			want: JobFigures{Jobs: 1, JCTMeanSeconds: 260, JCTIdealRunMeanSeconds: 160, QueueDelayMeanSeconds: 60,
				StretchMean: 2, SlowdownMean: 2.6, GPUHours: 4 * 200 / 3600.0},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := figuresOf(tc.jobs)
			for _, f := range []struct {
				name      string
				got, want float64
			}{
				{"jobs", float64(got.Jobs), float64(tc.want.Jobs)},
				{"JCT mean", got.JCTMeanSeconds, tc.want.JCTMeanSeconds},
				{"JCT mean, runs ideal", got.JCTIdealRunMeanSeconds, tc.want.JCTIdealRunMeanSeconds},
				{"queueing delay mean", got.QueueDelayMeanSeconds, tc.want.QueueDelayMeanSeconds},
				{"stretch mean", got.StretchMean, tc.want.StretchMean},
				{"slowdown mean", got.SlowdownMean, tc.want.SlowdownMean},
				{"GPU-hours", got.GPUHours, tc.want.GPUHours},
			} {
				if math.Abs(f.got-f.want) > 1e-9 {
					t.Errorf("%s = %v, want %v", f.name, f.got, f.want)
				}
			}
		})
	}
}

// Mean JCT against blind's and the capture of blind's every-run-ideal gain,
// by job size, on hand-made finished jobs.
func TestCompareWithBlind(t *testing.T) {
	t.Parallel()
	// blind: an 8-GPU job stretched 120/100, a 2-GPU job 300/200 after a
	// 50 s wait, a one-GPU job run as long as its trace says (its JCT and
	// its ideal differ by a rounding error: 0.7+0.3−0.1 against
	// 0.7−0.1+0.3) and a 64-GPU job that only blind finished.
	blindJobs := []finished{
		{gpus: 8, arrival: 0, start: 0, run: 120, duration: 100},
		{gpus: 2, arrival: 0, start: 50, run: 300, duration: 200},
		{gpus: 1, arrival: 0.1, start: 0.7, run: 0.3, duration: 0.3},
		{gpus: 64, arrival: 0, start: 0, run: 1000, duration: 1000},
	}
	// aware: the 8-GPU job ideal, the 2-GPU job 10 s sooner than blind's,
	// the one-GPU job as blind's.
	awareJobs := []finished{
		{gpus: 8, arrival: 0, start: 0, run: 100, duration: 100},
		{gpus: 2, arrival: 0, start: 50, run: 290, duration: 200},
		{gpus: 1, arrival: 0.1, start: 0.7, run: 0.3, duration: 0.3},
	}
	// binpack: the 8-GPU job waits 60 s more than under blind.
	binpackJobs := []finished{
		{gpus: 8, arrival: 0, start: 60, run: 120, duration: 100},
		{gpus: 2, arrival: 0, start: 50, run: 300, duration: 200},
		{gpus: 1, arrival: 0.1, start: 0.7, run: 0.3, duration: 0.3},
	}
	summary := func(strategy string, jobs []finished) *Summary {
		s := &Summary{Strategy: strategy}
		userFigures(s, jobs)
		return s
	}
	ptr := func(v float64) *float64 { return &v }
	type want struct {
		jobs            int
		ratio, capture  *float64
		gain            *float64
		blindJCT, ideal float64
	}
	tests := []struct {
		name     string
		strategy string
		jobs     []finished
		bucket   func(v *VsBlind) BucketVsBlind
		want     want
	}{
		{name: "aware, multi-GPU", strategy: "topology-aware", jobs: awareJobs,
			bucket: func(v *VsBlind) BucketVsBlind { return v.MultiGPU },
			// blind (120+350+1000)/3 = 490, its ideal (100+250+1000)/3 =
			// 450, aware (100+340)/2 = 220: over different sets of jobs
			// (only blind finished the 64-GPU one) the means say little,
			// which is why the counts stand beside them.
			want: want{jobs: 2, ratio: ptr(220.0 / 490), gain: ptr(40.0 / 490), capture: ptr(270.0 / 40), blindJCT: 490, ideal: 450}},
		{name: "aware, 5-8 GPUs: the whole gain", strategy: "topology-aware", jobs: awareJobs,
			bucket: func(v *VsBlind) BucketVsBlind { return v.BySize[2] },
			want:   want{jobs: 1, ratio: ptr(100.0 / 120), gain: ptr(20.0 / 120), capture: ptr(1), blindJCT: 120, ideal: 100}},
		{name: "aware, 2-4 GPUs: a tenth of it", strategy: "topology-aware", jobs: awareJobs,
			bucket: func(v *VsBlind) BucketVsBlind { return v.BySize[1] },
			want:   want{jobs: 1, ratio: ptr(340.0 / 350), gain: ptr(100.0 / 350), capture: ptr(0.1), blindJCT: 350, ideal: 250}},
		{name: "aware, 1 GPU: blind is ideal, no capture", strategy: "topology-aware", jobs: awareJobs,
			bucket: func(v *VsBlind) BucketVsBlind { return v.BySize[0] },
			want:   want{jobs: 1, ratio: ptr(1), blindJCT: 0.7 + 0.3 - 0.1, ideal: 0.7 - 0.1 + 0.3}},
		{name: "aware, 9-32 GPUs: empty on both sides", strategy: "topology-aware", jobs: awareJobs,
			bucket: func(v *VsBlind) BucketVsBlind { return v.BySize[3] },
			want:   want{}},
		{name: "aware, 33+ GPUs: only blind finished one", strategy: "topology-aware", jobs: awareJobs,
			bucket: func(v *VsBlind) BucketVsBlind { return v.BySize[4] },
			want:   want{blindJCT: 1000, ideal: 1000}},
		{name: "binpack, 5-8 GPUs: slower than blind", strategy: "binpack", jobs: binpackJobs,
			bucket: func(v *VsBlind) BucketVsBlind { return v.BySize[2] },
			want:   want{jobs: 1, ratio: ptr(180.0 / 120), gain: ptr(20.0 / 120), capture: ptr(-3), blindJCT: 120, ideal: 100}},
		{name: "blind against itself", strategy: "blind", jobs: blindJobs,
			bucket: func(v *VsBlind) BucketVsBlind { return v.BySize[1] },
			want:   want{jobs: 1, ratio: ptr(1), gain: ptr(100.0 / 350), capture: ptr(0), blindJCT: 350, ideal: 250}},
	}
	same := func(got, want *float64) bool {
		if got == nil || want == nil {
			return got == want
		}
		return math.Abs(*got-*want) < 1e-9
	}
	show := func(v *float64) string {
		if v == nil {
			return "none"
		}
		return strconv.FormatFloat(*v, 'g', -1, 64)
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			blind := summary("blind", blindJobs)
			s := blind
			if tc.strategy != "blind" {
				s = summary(tc.strategy, tc.jobs)
			}
			CompareWithBlind(s, blind)
			if s.VsBlind == nil {
				t.Fatal("no comparison with blind")
			}
			if len(s.VsBlind.BySize) != len(sizeBuckets) {
				t.Fatalf("%d size buckets, want every one of %d", len(s.VsBlind.BySize), len(sizeBuckets))
			}
			got := tc.bucket(s.VsBlind)
			if got.Jobs != tc.want.jobs {
				t.Errorf("jobs = %d, want %d", got.Jobs, tc.want.jobs)
			}
			if math.Abs(got.BlindJCTMeanSeconds-tc.want.blindJCT) > 1e-9 || math.Abs(got.BlindIdealRunJCTMeanSeconds-tc.want.ideal) > 1e-9 {
				t.Errorf("blind JCT, ideal = %v, %v; want %v, %v", got.BlindJCTMeanSeconds, got.BlindIdealRunJCTMeanSeconds, tc.want.blindJCT, tc.want.ideal)
			}
			for _, f := range []struct {
				name      string
				got, want *float64
			}{{"ratio", got.JCTRatio, tc.want.ratio}, {"ideal gain", got.IdealGain, tc.want.gain}, {"capture", got.Capture, tc.want.capture}} {
				if !same(f.got, f.want) {
					t.Errorf("%s = %s, want %s", f.name, show(f.got), show(f.want))
				}
			}
		})
	}
}

// Without a blind run there is nothing to compare with.
func TestCompareWithBlindNeedsBlind(t *testing.T) {
	t.Parallel()
	jobs := []finished{{gpus: 8, arrival: 0, start: 0, run: 120, duration: 100}}
	a, b := &Summary{Strategy: "topology-aware"}, &Summary{Strategy: "binpack"}
	userFigures(a, jobs)
	userFigures(b, jobs)
	CompareWithBlind(a, b)
	CompareWithBlind(a, &Summary{Strategy: "blind"}) // blind finished nothing
	if a.VsBlind != nil || b.VsBlind != nil {
		t.Errorf("compared without a blind run that finished jobs: %+v, %+v", a.VsBlind, b.VsBlind)
	}
}

// The table's rows against blind: ratio and capture, "-" where undefined
// (no gain to capture, an empty bucket, no run to compare).
func TestWriteTableVsBlind(t *testing.T) {
	t.Parallel()
	blind := &Summary{Strategy: "blind"}
	userFigures(blind, []finished{
		{gpus: 8, arrival: 0, start: 0, run: 120, duration: 100},
		{gpus: 2, arrival: 0, start: 50, run: 300, duration: 200},
		{gpus: 1, arrival: 0, start: 0, run: 30, duration: 30},
	})
	aware := &Summary{Strategy: "topology-aware"}
	userFigures(aware, []finished{
		{gpus: 8, arrival: 0, start: 0, run: 100, duration: 100},
		{gpus: 2, arrival: 0, start: 50, run: 290, duration: 200},
		{gpus: 1, arrival: 0, start: 0, run: 30, duration: 30},
	})
	CompareWithBlind(aware, blind)
	var buf bytes.Buffer
	if err := WriteTable(&buf, aware, blind); err != nil {
		t.Fatal(err)
	}
	var rows []string
	for _, l := range strings.Split(buf.String(), "\n") {
		if strings.Contains(l, "JCT / blind") {
			rows = append(rows, l)
		}
	}
	golden(t, "table_vs_blind.txt", []byte(strings.Join(rows, "\n")+"\n"))
}

// TestVsBlindNegligibleGain: where blind is within a thousandth of the
// every-run-ideal bound, the gain is given and the capture is not.
func TestVsBlindNegligibleGain(t *testing.T) {
	blind := JobFigures{Jobs: 17, JCTMeanSeconds: 51_501, JCTIdealRunMeanSeconds: 51_500.99}
	aware := JobFigures{Jobs: 17, JCTMeanSeconds: 50_090}
	got := vsBlind("9-32", aware, blind)
	if got.IdealGain == nil || got.Capture != nil || got.JCTRatio == nil {
		t.Fatalf("gain %v, capture %v, ratio %v: want a gain and a ratio, no capture", got.IdealGain, got.Capture, got.JCTRatio)
	}
	blind.JCTIdealRunMeanSeconds = 51_501 * (1 - 2*minCaptureGain)
	if got := vsBlind("9-32", aware, blind); got.Capture == nil {
		t.Fatal("a gain of two thousandths: no capture")
	}
}
