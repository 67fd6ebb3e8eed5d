package replay

import (
	"cmp"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/toposched/toposched/internal/textout"
)

// Summary is a run's figures: summary.json's contents.
type Summary struct {
	Trace       string   `json:"trace"`
	Source      string   `json:"source"`
	Cluster     string   `json:"cluster"`
	ClusterGPUs int      `json:"cluster_gpus"`
	Nodes       int      `json:"nodes"`
	Strategy    string   `json:"strategy"`
	Mode        string   `json:"mode"`
	Seed        uint64   `json:"seed"`
	Records     int      `json:"records"`
	Notes       []string `json:"notes,omitempty"`
	// SkippedRecords are trace records not replayed, by reason.
	SkippedRecords map[string]int `json:"skipped_records,omitempty"`

	// JobsTotal = Placed + Pending + Rejected: every submitted job ends in
	// exactly one of them.
	JobsTotal int `json:"jobs_total"`
	Placed    int `json:"placed"`
	Pending   int `json:"pending"`
	Rejected  int `json:"rejected"`
	// PlacedAfterWait counts placed jobs that waited first.
	PlacedAfterWait int            `json:"placed_after_wait"`
	RejectReasons   map[string]int `json:"reject_reasons,omitempty"`
	PendingReasons  map[string]int `json:"pending_reasons,omitempty"`

	// Queueing delay of placed jobs, in trace seconds.
	QueueDelayMeanSeconds float64 `json:"queue_delay_mean_seconds"`
	QueueDelayP50Seconds  float64 `json:"queue_delay_p50_seconds"`
	QueueDelayP99Seconds  float64 `json:"queue_delay_p99_seconds"`

	// Time-weighted over the timeline: share of GPUs allocated, and the
	// expected share of free GPUs the trace's job mix cannot use
	// (FGD-style; see the package doc).
	AllocationMean    float64 `json:"allocation_mean"`
	FragmentationMean float64 `json:"fragmentation_mean"`

	// Decisions are placement's outcomes for trace jobs (decided, pending,
	// rejected, including retries that placed a waiting job).
	Decisions          int     `json:"decisions"`
	DecisionsPerSecond float64 `json:"decisions_per_second"`
	// Latency from a job's submission to its first outcome, wall clock.
	DecisionLatencyP50Seconds float64 `json:"decision_latency_p50_seconds"`
	DecisionLatencyP99Seconds float64 `json:"decision_latency_p99_seconds"`
	Barriers                  int     `json:"barriers"`

	// Predicted communication per training step, mean over placed jobs
	// whose decision carries both a prediction and the blind baseline.
	CommJobs                    int     `json:"comm_jobs"`
	MeanCommSecondsPerStep      float64 `json:"mean_comm_seconds_per_step"`
	BlindMeanCommSecondsPerStep float64 `json:"blind_mean_comm_seconds_per_step"`
	// MultiGPU: the same over jobs of more than one GPU.
	MultiGPUCommJobs                    int     `json:"multi_gpu_comm_jobs"`
	MultiGPUMeanCommSecondsPerStep      float64 `json:"multi_gpu_mean_comm_seconds_per_step"`
	MultiGPUBlindMeanCommSecondsPerStep float64 `json:"multi_gpu_blind_mean_comm_seconds_per_step"`

	// What users feel: the finished jobs' completion time, queueing,
	// slowdown and GPU-hours (run times depend on placement: see the
	// package doc), all, multi-GPU and by size; the makespan is the last
	// end, from the first arrival.
	Finished        JobFigures    `json:"finished"`
	MultiGPU        JobFigures    `json:"multi_gpu"`
	BySize          []SizeFigures `json:"by_size,omitempty"`
	MakespanSeconds float64       `json:"makespan_seconds"`
	// VsBlind is the same against blind first fit's run of the trace, by
	// job size (CompareWithBlind; absent without one).
	VsBlind *VsBlind `json:"vs_blind,omitempty"`

	SetupSeconds  float64 `json:"setup_seconds"`
	WallSeconds   float64 `json:"wall_seconds"`
	PeakHeapBytes uint64  `json:"peak_heap_bytes"`
	PeakRSSBytes  uint64  `json:"peak_rss_bytes"`

	// Compared are the same trace under the other strategies of
	// --compare, in its order.
	Compared []Summary `json:"compared,omitempty"`
}

// Result is a run's summary, per-job outcomes and timeline.
type Result struct {
	Summary  Summary
	Jobs     []JobResult
	Timeline []Point
}

// JobResult is one job's outcome.
type JobResult struct {
	ID      string
	GPUs    int
	Arrival float64
	// Outcome is placed, pending or rejected; Reason the first reason's
	// code of the last wait or rejection.
	Outcome, Reason string
	// Start is the virtual placement time (-1 when never placed).
	Start, QueueDelay float64
	Nodes             int
	// Comm and BlindComm are the predicted seconds per step (NaN when the
	// decision carries none).
	Comm, BlindComm float64
	LatencySeconds  float64
	// Run is how long the job ran (virtual seconds; -1 when it did not
	// finish), Stretch its run time over its trace duration, End its end.
	Run, Stretch, End float64
}

func (r *runner) result(wall, setup time.Duration, heapPeak uint64) *Result {
	tr := r.cfg.Trace
	mode := "virtual clock (as fast as possible)"
	switch {
	case r.cfg.Burst:
		mode = "burst"
	case r.cfg.Speed > 0:
		mode = fmt.Sprintf("paced, speed %g", r.cfg.Speed)
	}
	s := Summary{Trace: tr.Kind, Source: tr.Source, Cluster: r.cfg.Inventory.Name, ClusterGPUs: r.cfg.Inventory.GPUs,
		Nodes: len(r.cfg.Inventory.Nodes), Strategy: r.cfg.Strategy, Mode: mode, Seed: r.cfg.Seed, Records: tr.Records,
		Notes: tr.Notes, SkippedRecords: tr.Skipped, JobsTotal: len(r.jobs), Decisions: r.decs, Barriers: r.probes,
		SetupSeconds: setup.Seconds(), WallSeconds: wall.Seconds(), PeakHeapBytes: heapPeak, PeakRSSBytes: peakRSS()}
	var delays, lats []float64
	var comm, base, mcomm, mbase float64
	var done []finished
	scaled, multi := 0, 0
	res := &Result{Timeline: r.timeline}
	for i := range r.jobs {
		j := &r.jobs[i]
		jr := JobResult{ID: j.job.ID, GPUs: j.job.GPUs, Arrival: j.job.Arrival, Start: -1, QueueDelay: -1,
			Reason: j.reason, Nodes: j.nodesSpanned, Comm: math.NaN(), BlindComm: math.NaN(), LatencySeconds: -1,
			Run: -1, Stretch: math.NaN(), End: -1}
		if !j.decided.IsZero() {
			jr.LatencySeconds = j.decided.Sub(j.submitted).Seconds()
			lats = append(lats, jr.LatencySeconds)
		}
		switch j.state {
		case stPlaced:
			s.Placed++
			jr.Outcome, jr.Start = "placed", j.start
			jr.QueueDelay = max(j.start-j.job.Arrival, 0)
			if r.cfg.Burst {
				jr.QueueDelay = 0
			}
			delays = append(delays, jr.QueueDelay)
			if j.waited {
				s.PlacedAfterWait++
			}
			if !r.cfg.Burst && j.job.Duration >= 0 {
				jr.Run, jr.Stretch, jr.End = j.runtime, j.stretch, j.start+j.runtime
				done = append(done, finished{gpus: j.job.GPUs, arrival: j.job.Arrival, start: j.start, run: j.runtime,
					duration: j.job.Duration, commShare: commShareOf(cmp.Or(nanZero(j.computeOn), j.compute), j.comm)})
				if j.job.GPUs > 1 {
					multi++
					if j.scaled {
						scaled++
					}
				}
			}
			if j.hasPred {
				jr.Comm, jr.BlindComm = j.pred, j.base
				s.CommJobs++
				comm += j.pred
				base += j.base
				if j.job.GPUs > 1 {
					s.MultiGPUCommJobs++
					mcomm += j.pred
					mbase += j.base
				}
			}
		case stPending:
			s.Pending++
			jr.Outcome = "pending"
			s.PendingReasons = inc(s.PendingReasons, j.reason)
		case stRejected:
			s.Rejected++
			jr.Outcome = "rejected"
			s.RejectReasons = inc(s.RejectReasons, j.reason)
		}
		res.Jobs = append(res.Jobs, jr)
	}
	s.QueueDelayMeanSeconds = mean(delays)
	s.QueueDelayP50Seconds, s.QueueDelayP99Seconds = Percentile(delays, 50), Percentile(delays, 99)
	s.DecisionLatencyP50Seconds, s.DecisionLatencyP99Seconds = Percentile(lats, 50), Percentile(lats, 99)
	if wall > 0 {
		s.DecisionsPerSecond = float64(s.Decisions) / wall.Seconds()
	}
	if s.CommJobs > 0 {
		s.MeanCommSecondsPerStep, s.BlindMeanCommSecondsPerStep = comm/float64(s.CommJobs), base/float64(s.CommJobs)
	}
	if s.MultiGPUCommJobs > 0 {
		n := float64(s.MultiGPUCommJobs)
		s.MultiGPUMeanCommSecondsPerStep, s.MultiGPUBlindMeanCommSecondsPerStep = mcomm/n, mbase/n
	}
	var alloc, frag []float64
	for _, p := range r.timeline {
		alloc = append(alloc, p.Allocated)
		frag = append(frag, p.Fragmentation)
	}
	s.AllocationMean, s.FragmentationMean = mean(alloc), mean(frag)
	if len(done) > 0 {
		userFigures(&s, done)
		s.Notes = append(slices.Clip(s.Notes), runTimeNote(scaled, multi))
		if ref := r.cfg.ComputeReference; ref != "" {
			s.Notes = append(s.Notes, computeNote(ref, r.jobs))
		}
	}
	res.Summary = s
	return res
}

func inc(m map[string]int, k string) map[string]int {
	if m == nil {
		m = map[string]int{}
	}
	m[cmp.Or(k, "unknown")]++
	return m
}

func mean(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := 0.0
	for _, x := range v {
		s += x
	}
	return s / float64(len(v))
}

// Percentile is the nearest-rank p-th percentile of v (0 when empty).
func Percentile(v []float64, p float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	k := int(math.Ceil(p/100*float64(len(s)))) - 1
	return s[min(max(k, 0), len(s)-1)]
}

// WriteReport writes summary.json, jobs.csv, timeline.csv and the plots
// (replay.svg: allocation and fragmentation over time; jct.svg: the
// distribution of completion times; slowdown.svg: slowdown by job size)
// into dir. runs are the same trace under one strategy each: the first
// one's summary is summary.json's, the others go under "compared".
func WriteReport(dir string, runs ...*Result) error {
	if len(runs) == 0 {
		return errors.New("report: no run")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("report: %w", err)
	}
	s := runs[0].Summary
	for _, r := range runs[1:] {
		s.Compared = append(s.Compared, r.Summary)
	}
	data, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return fmt.Errorf("report: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "summary.json"), append(data, '\n'), 0o644); err != nil {
		return fmt.Errorf("report: %w", err)
	}
	if err := writeFile(filepath.Join(dir, "jobs.csv"), func(w io.Writer) error { return writeJobs(w, runs) }); err != nil {
		return err
	}
	if err := writeFile(filepath.Join(dir, "timeline.csv"), func(w io.Writer) error { return writeTimeline(w, runs) }); err != nil {
		return err
	}
	var series []Series
	for _, r := range runs {
		series = append(series, Series{Name: r.Summary.Strategy, Points: r.Timeline})
	}
	title := fmt.Sprintf("%s on %s (%d GPUs)", filepath.Base(s.Source), s.Cluster, s.ClusterGPUs)
	if err := writeFile(filepath.Join(dir, "replay.svg"), func(w io.Writer) error { return Plot(w, title, series) }); err != nil {
		return err
	}
	if err := writeFile(filepath.Join(dir, "jct.svg"), func(w io.Writer) error { return PlotJCT(w, title, runs) }); err != nil {
		return err
	}
	return writeFile(filepath.Join(dir, "slowdown.svg"), func(w io.Writer) error { return PlotSlowdown(w, title, runs) })
}

func writeFile(path string, fn func(io.Writer) error) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("report: %w", err)
	}
	if err := fn(f); err != nil {
		_ = f.Close() // the write's error is the one to report
		return fmt.Errorf("report %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("report %s: %w", path, err)
	}
	return nil
}

func ff(v float64) string {
	if math.IsNaN(v) {
		return ""
	}
	return strconv.FormatFloat(v, 'g', 6, 64)
}

func writeJobs(w io.Writer, runs []*Result) error {
	cw := csv.NewWriter(w)
	_ = cw.Write([]string{"strategy", "job_id", "gpus", "arrival_s", "outcome", "reason", "start_s", "queue_delay_s",
		"nodes", "comm_s_per_step", "blind_comm_s_per_step", "decision_latency_s", "run_s", "stretch", "end_s", "jct_s"})
	for _, r := range runs {
		for _, j := range r.Jobs {
			start, delay, run, end, jct := "", "", "", "", ""
			if j.Start >= 0 {
				start, delay = ff(j.Start), ff(j.QueueDelay)
			}
			if j.Run >= 0 {
				run, end, jct = ff(j.Run), ff(j.End), ff(j.End-j.Arrival)
			}
			_ = cw.Write([]string{r.Summary.Strategy, j.ID, strconv.Itoa(j.GPUs), ff(j.Arrival), j.Outcome, j.Reason,
				start, delay, strconv.Itoa(j.Nodes), ff(j.Comm), ff(j.BlindComm), ff(j.LatencySeconds), run, ff(j.Stretch), end, jct})
		}
	}
	cw.Flush()
	return cw.Error()
}

func writeTimeline(w io.Writer, runs []*Result) error {
	cw := csv.NewWriter(w)
	_ = cw.Write([]string{"strategy", "t_s", "allocated", "fragmentation", "queue"})
	for _, r := range runs {
		for _, p := range r.Timeline {
			_ = cw.Write([]string{r.Summary.Strategy, ff(p.T), ff(p.Allocated), ff(p.Fragmentation), strconv.Itoa(p.Queue)})
		}
	}
	cw.Flush()
	return cw.Error()
}

// WriteTable prints the runs side by side.
func WriteTable(w io.Writer, runs ...*Summary) error {
	tw := textout.Table(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	row := func(name string, f func(s *Summary) string) {
		cells := []string{name}
		for _, s := range runs {
			cells = append(cells, f(s))
		}
		tw.Println(strings.Join(cells, "\t") + "\t")
	}
	row("", func(s *Summary) string { return s.Strategy })
	row("jobs (placed/pending/rejected)", func(s *Summary) string {
		return fmt.Sprintf("%d (%d/%d/%d)", s.JobsTotal, s.Placed, s.Pending, s.Rejected)
	})
	row("placed after waiting", func(s *Summary) string { return strconv.Itoa(s.PlacedAfterWait) })
	row("queueing delay p50 / p99", func(s *Summary) string {
		return fmt.Sprintf("%s / %s", dur(s.QueueDelayP50Seconds), dur(s.QueueDelayP99Seconds))
	})
	row("JCT mean / p50 / p90 / p99", func(s *Summary) string {
		f := s.Finished
		return fmt.Sprintf("%s / %s / %s / %s", dur(f.JCTMeanSeconds), dur(f.JCTP50Seconds), dur(f.JCTP90Seconds), dur(f.JCTP99Seconds))
	})
	row("multi-GPU JCT mean (jobs)", func(s *Summary) string {
		return fmt.Sprintf("%s (%d)", dur(s.MultiGPU.JCTMeanSeconds), s.MultiGPU.Jobs)
	})
	row("  the same, every run ideal", func(s *Summary) string { return dur(s.MultiGPU.JCTIdealRunMeanSeconds) })
	row("queueing delay mean / p90", func(s *Summary) string {
		return fmt.Sprintf("%s / %s", dur(s.Finished.QueueDelayMeanSeconds), dur(s.Finished.QueueDelayP90Seconds))
	})
	row("slowdown vs ideal, mean (run stretch)", func(s *Summary) string {
		return fmt.Sprintf("%.3f (%.3f)", s.Finished.SlowdownMean, s.Finished.StretchMean)
	})
	for _, b := range sizeBuckets {
		row("  "+b.name+" GPUs: JCT mean, slowdown", func(s *Summary) string {
			for _, f := range s.BySize {
				if f.Bucket == b.name {
					return fmt.Sprintf("%s, %.2f (%d)", dur(f.JCTMeanSeconds), f.SlowdownMean, f.Jobs)
				}
			}
			return "-"
		})
	}
	if i := slices.IndexFunc(runs, func(s *Summary) bool { return s.VsBlind != nil }); i >= 0 {
		vsBlindRows(row, runs[i].VsBlind)
	}
	row("makespan", func(s *Summary) string { return dur(s.MakespanSeconds) })
	row("GPU-hours (communicating)", func(s *Summary) string {
		return fmt.Sprintf("%.0f (%.0f, %s)", s.Finished.GPUHours, s.Finished.CommGPUHours, pct(s.Finished.CommGPUHours/max(s.Finished.GPUHours, 1e-12)))
	})
	row("GPUs allocated (mean)", func(s *Summary) string { return pct(s.AllocationMean) })
	row("fragmentation (mean, of free GPUs)", func(s *Summary) string { return pct(s.FragmentationMean) })
	row("comm per step, mean (jobs)", func(s *Summary) string {
		return fmt.Sprintf("%.4g s (%d)", s.MeanCommSecondsPerStep, s.CommJobs)
	})
	row("blind baseline, same decisions", func(s *Summary) string { return fmt.Sprintf("%.4g s", s.BlindMeanCommSecondsPerStep) })
	row("multi-GPU jobs: comm vs blind", func(s *Summary) string {
		return fmt.Sprintf("%.4g s vs %.4g s (%d)", s.MultiGPUMeanCommSecondsPerStep, s.MultiGPUBlindMeanCommSecondsPerStep, s.MultiGPUCommJobs)
	})
	row("decisions per second", func(s *Summary) string { return fmt.Sprintf("%.1f", s.DecisionsPerSecond) })
	row("decision latency p50 / p99", func(s *Summary) string {
		return fmt.Sprintf("%.1f / %.1f ms", s.DecisionLatencyP50Seconds*1000, s.DecisionLatencyP99Seconds*1000)
	})
	row("wall time (setup)", func(s *Summary) string {
		return fmt.Sprintf("%.1f s (%.1f s)", s.WallSeconds, s.SetupSeconds)
	})
	row("peak heap / process RSS", func(s *Summary) string {
		return fmt.Sprintf("%d / %d MiB", s.PeakHeapBytes>>20, s.PeakRSSBytes>>20)
	})
	return tw.Flush()
}

// vsBlindRows prints each run's mean JCT against blind's, all, multi-GPU
// and by size: the ratio, then the capture of the every-run-ideal gain,
// whose size (blind's, the same in every column: v's) is in the row's
// name; "-" where undefined.
func vsBlindRows(row func(string, func(*Summary) string), v *VsBlind) {
	line := func(name string, pick func(*VsBlind) BucketVsBlind) {
		gain := "-"
		if g := pick(v).IdealGain; g != nil {
			gain = pct(*g)
		}
		row(fmt.Sprintf("%s: JCT / blind, capture (ideal gain %s)", name, gain), func(s *Summary) string {
			if s.VsBlind == nil || pick(s.VsBlind).JCTRatio == nil {
				return "-"
			}
			b := pick(s.VsBlind)
			capture := "-"
			if b.Capture != nil {
				capture = pct(*b.Capture)
			}
			return fmt.Sprintf("%.3f, %s", *b.JCTRatio, capture)
		})
	}
	line("all jobs", func(v *VsBlind) BucketVsBlind { return v.Finished })
	line("multi-GPU", func(v *VsBlind) BucketVsBlind { return v.MultiGPU })
	for i, b := range sizeBuckets {
		line("  "+b.name+" GPUs", func(v *VsBlind) BucketVsBlind { return v.BySize[i] })
	}
}

func pct(v float64) string { return fmt.Sprintf("%.1f%%", 100*v) }

func dur(s float64) string {
	return time.Duration(s * float64(time.Second)).Round(time.Second).String()
}
