package replay

import (
	"math"
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
