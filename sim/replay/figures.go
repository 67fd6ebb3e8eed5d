package replay

// What users feel: job completion time, queueing, slowdown, makespan and
// GPU-hours, over all finished jobs and by job size.

import (
	"fmt"
	"math"
	"slices"

	"github.com/toposched/toposched/internal/placer"
)

// JobFigures are the figures of a set of finished jobs (placed, and ended
// before the replay did). Times are virtual (trace) seconds.
type JobFigures struct {
	Jobs int `json:"jobs"`
	// JCT is completion time: from arrival to end (queueing + run time).
	JCTMeanSeconds float64 `json:"jct_mean_seconds"`
	JCTP50Seconds  float64 `json:"jct_p50_seconds"`
	JCTP90Seconds  float64 `json:"jct_p90_seconds"`
	JCTP99Seconds  float64 `json:"jct_p99_seconds"`
	// JCTIdealRunMeanSeconds is the mean JCT had every job run as long as
	// on an ideal placement (its trace duration), its wait as it was: the
	// part of JCTMeanSeconds above it is what placement stretched runs by.
	// Where no job waited, no strategy can finish the jobs sooner.
	JCTIdealRunMeanSeconds float64 `json:"jct_ideal_run_mean_seconds"`
	// Queueing delay, arrival to placement.
	QueueDelayMeanSeconds float64 `json:"queue_delay_mean_seconds"`
	QueueDelayP90Seconds  float64 `json:"queue_delay_p90_seconds"`
	// SlowdownMean is the mean bounded slowdown against ideal: JCT over
	// the trace duration (the job placed ideally the moment it arrived),
	// both at least SlowdownBound seconds.
	SlowdownMean float64 `json:"slowdown_mean"`
	// StretchMean is the mean run time over trace duration: what the
	// placement alone cost.
	StretchMean float64 `json:"stretch_mean"`
	// GPUHours held by the jobs while they ran; CommGPUHours the part of
	// them spent communicating (the cost model's share of each step).
	GPUHours     float64 `json:"gpu_hours"`
	CommGPUHours float64 `json:"comm_gpu_hours"`
}

// SizeFigures are the figures of the finished jobs of one size bucket.
type SizeFigures struct {
	// Bucket is the range of GPUs, "1", "2-4", "5-8", "9-32" or "33+".
	Bucket string `json:"bucket"`
	JobFigures
}

// SlowdownBound is the bounded slowdown's threshold (Feitelson): jobs
// shorter than it count as that long, so a 1-second job that waits a
// minute does not dominate the mean.
const SlowdownBound = 10.0

// sizeBuckets are the job-size buckets, by most GPUs.
var sizeBuckets = []struct {
	name string
	max  int
}{{"1", 1}, {"2-4", 4}, {"5-8", 8}, {"9-32", 32}, {"33+", math.MaxInt}}

func bucketOf(gpus int) int {
	for i, b := range sizeBuckets {
		if gpus <= b.max {
			return i
		}
	}
	return len(sizeBuckets) - 1
}

// finished is one finished job's times, for figures.
type finished struct {
	gpus                          int
	arrival, start, run, duration float64
	// commShare is the share of its steps spent communicating (0 when
	// unknown).
	commShare float64
}

func (f finished) jct() float64 { return f.start + f.run - f.arrival }

func figuresOf(jobs []finished) JobFigures {
	fg := JobFigures{Jobs: len(jobs)}
	if len(jobs) == 0 {
		return fg
	}
	var jct, ideal, delay, slow, stretch []float64
	for _, j := range jobs {
		jct = append(jct, j.jct())
		ideal = append(ideal, j.start-j.arrival+j.duration)
		delay = append(delay, j.start-j.arrival)
		slow = append(slow, max(j.jct(), SlowdownBound)/max(j.duration, SlowdownBound))
		if j.duration > 0 {
			stretch = append(stretch, j.run/j.duration)
		}
		fg.GPUHours += float64(j.gpus) * j.run / 3600
		fg.CommGPUHours += float64(j.gpus) * j.run * j.commShare / 3600
	}
	fg.JCTMeanSeconds, fg.JCTIdealRunMeanSeconds = mean(jct), mean(ideal)
	fg.JCTP50Seconds, fg.JCTP90Seconds, fg.JCTP99Seconds = Percentile(jct, 50), Percentile(jct, 90), Percentile(jct, 99)
	fg.QueueDelayMeanSeconds, fg.QueueDelayP90Seconds = mean(delay), Percentile(delay, 90)
	fg.SlowdownMean, fg.StretchMean = mean(slow), mean(stretch)
	return fg
}

// userFigures fills the summary's figures of finished jobs: all, multi-GPU
// and by size bucket (buckets with no job are left out).
func userFigures(s *Summary, jobs []finished) {
	var multi []finished
	byBucket := make([][]finished, len(sizeBuckets))
	for _, j := range jobs {
		if j.gpus > 1 {
			multi = append(multi, j)
		}
		b := bucketOf(j.gpus)
		byBucket[b] = append(byBucket[b], j)
		s.MakespanSeconds = max(s.MakespanSeconds, j.start+j.run)
	}
	s.Finished, s.MultiGPU = figuresOf(jobs), figuresOf(multi)
	for i, b := range byBucket {
		if len(b) > 0 {
			s.BySize = append(s.BySize, SizeFigures{Bucket: sizeBuckets[i].name, JobFigures: figuresOf(b)})
		}
	}
}

// commShareOf is the share of a step spent communicating, comm seconds
// of it besides compute (0 when either is unknown).
func commShareOf(compute, comm float64) float64 {
	if !(compute > 0) || !finite(comm) || comm <= 0 {
		return 0
	}
	return comm / (compute + comm)
}

// runTimeNote says how run times were set, for the summary's notes.
func runTimeNote(scaled, multi int) string {
	return fmt.Sprintf("run time = trace duration × step time on the placement / step time on an ideal placement of the same size "+
		"(compute 6·parameters·tokens at %.0f TFLOP/s per GPU + the cost model's communication; see sim/replay's package doc); "+
		"%d of %d finished multi-GPU jobs scaled, the rest (no prediction or no ideal placement) keep their trace duration",
		ReferenceFLOPS/1e12, scaled, multi)
}

// VsBlind is a run's completion times against blind first fit's on the
// same trace (the same --compare), by job size: what a user of each size
// gains or loses by the strategy, and how much of the gain an ideal
// placement of every run would give blind the strategy got.
type VsBlind struct {
	Finished BucketVsBlind   `json:"finished"`
	MultiGPU BucketVsBlind   `json:"multi_gpu"`
	BySize   []BucketVsBlind `json:"by_size"`
}

// BucketVsBlind compares one set of finished jobs (all, multi-GPU, or a
// size bucket) with blind's. The ratio and the shares are omitted where
// undefined: either side has no finished job or blind's mean JCT is 0,
// or (for the shares) blind loses nothing to its placements.
type BucketVsBlind struct {
	Bucket         string  `json:"bucket"`
	Jobs           int     `json:"jobs"`
	JCTMeanSeconds float64 `json:"jct_mean_seconds"`
	BlindJobs      int     `json:"blind_jobs"`
	// BlindJCTMeanSeconds is blind's mean JCT; BlindIdealRunJCTMeanSeconds
	// blind's had every run been as long as on an ideal placement of its
	// size, blind's waits kept (blind's JCTIdealRunMeanSeconds): the
	// every-run-ideal bound.
	BlindJCTMeanSeconds         float64 `json:"blind_jct_mean_seconds"`
	BlindIdealRunJCTMeanSeconds float64 `json:"blind_ideal_run_jct_mean_seconds"`
	// JCTRatio is JCTMeanSeconds over BlindJCTMeanSeconds.
	JCTRatio *float64 `json:"jct_ratio,omitempty"`
	// IdealGain is the bound's share of blind's mean JCT: (blind − ideal)
	// / blind, how much sooner blind's jobs would finish had every run
	// been ideal.
	IdealGain *float64 `json:"ideal_gain,omitempty"`
	// Capture is the share of that gain the strategy got: (blind −
	// strategy) / (blind − ideal). 1 is every run's ideal reached with
	// blind's waits; above 1, waits shorter than blind's too; below 0,
	// slower than blind.
	Capture *float64 `json:"capture,omitempty"`
}

// idealGapTolerance is the share of blind's mean JCT under which blind's
// gap to the every-run-ideal bound counts as none: a one-GPU job's JCT
// and its ideal are the same sum added in another order, so "no gap" can
// come out a rounding error above zero, and a capture of it is noise.
const idealGapTolerance = 1e-9

// minCaptureGain is the ideal gain (blind's gap to the bound over its
// mean JCT) under which no capture is given: below a thousandth there is
// nothing for placement to win, and the share of it a strategy got is a
// ratio of noise (the 9-32 GPU jobs of ITP cluster01 on hetero-512, a gain
// of a few millionths, gave 53,311,429%).
const minCaptureGain = 1e-3

// vsBlind compares one set of a strategy's finished jobs with the same
// set of blind's.
func vsBlind(bucket string, strategy, blind JobFigures) BucketVsBlind {
	b := BucketVsBlind{Bucket: bucket, Jobs: strategy.Jobs, JCTMeanSeconds: strategy.JCTMeanSeconds, BlindJobs: blind.Jobs,
		BlindJCTMeanSeconds: blind.JCTMeanSeconds, BlindIdealRunJCTMeanSeconds: blind.JCTIdealRunMeanSeconds}
	if strategy.Jobs == 0 || blind.Jobs == 0 || !(blind.JCTMeanSeconds > 0) {
		return b
	}
	ratio := strategy.JCTMeanSeconds / blind.JCTMeanSeconds
	b.JCTRatio = &ratio
	gap := blind.JCTMeanSeconds - blind.JCTIdealRunMeanSeconds
	if gap <= idealGapTolerance*blind.JCTMeanSeconds {
		return b
	}
	gain := gap / blind.JCTMeanSeconds
	b.IdealGain = &gain
	if gain < minCaptureGain {
		return b
	}
	capture := (blind.JCTMeanSeconds - strategy.JCTMeanSeconds) / gap
	b.Capture = &capture
	return b
}

// vsBlindOf compares a run's finished jobs with blind's, every size
// bucket listed (an empty one with no ratio or capture).
func vsBlindOf(s, blind *Summary) *VsBlind {
	v := &VsBlind{Finished: vsBlind("all", s.Finished, blind.Finished), MultiGPU: vsBlind("multi-GPU", s.MultiGPU, blind.MultiGPU)}
	for _, b := range sizeBuckets {
		v.BySize = append(v.BySize, vsBlind(b.name, bucketFigures(s, b.name), bucketFigures(blind, b.name)))
	}
	return v
}

// bucketFigures are s's figures of one size bucket (none when it has no
// finished job).
func bucketFigures(s *Summary, bucket string) JobFigures {
	for _, f := range s.BySize {
		if f.Bucket == bucket {
			return f.JobFigures
		}
	}
	return JobFigures{}
}

// CompareWithBlind sets each run's VsBlind against the blind run among
// them (the same trace under each strategy of --compare); without a blind
// run, or with no finished job in it, it sets none.
func CompareWithBlind(runs ...*Summary) {
	i := slices.IndexFunc(runs, func(s *Summary) bool { return s.Strategy == placer.StrategyBlind })
	if i < 0 || runs[i].Finished.Jobs == 0 {
		return
	}
	for _, s := range runs {
		s.VsBlind = vsBlindOf(s, runs[i])
	}
}
