package replay

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/services/placement"
)

// TestReplayEndToEnd replays a small synthetic trace, contended enough
// that jobs wait, plus one job too large for the cluster, through an
// embedded NATS server and every service with the shipped policies, under
// topology-aware placement and its peers, and checks that every job is
// accounted for once, that run times follow placement, and that the report
// is written.
func TestReplayEndToEnd(t *testing.T) {
	dir := t.TempDir()
	// The shipped heterogeneous cluster (NVSwitch and PCIe nodes from real
	// topology files), where placement changes run times.
	clusterFile := filepath.Join("..", "..", "deploy", "examples", "replay", "hetero-512.yaml")
	inv, err := LoadInventory(clusterFile)
	if err != nil {
		t.Fatal(err)
	}
	tr, err := Generate(SynthConfig{Jobs: 40, Seed: 3, Load: 3, DurationMedian: 600, DurationSigma: 0.5,
		Sizes: []SizeWeight{{1, 4}, {8, 4}, {16, 2}, {64, 1}}}, inv.GPUs, inv.MaxNodeGPUs)
	if err != nil {
		t.Fatal(err)
	}
	tr.Jobs = append(tr.Jobs, Job{ID: "too-big", Arrival: tr.Jobs[len(tr.Jobs)-1].Arrival + 1, Duration: 10, GPUs: inv.GPUs + 1})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var results []*Result
	for _, strategy := range []string{"topology-aware", "blind", "binpack", "spread", "gpuallocator", "random"} {
		r, err := Run(ctx, Config{ClusterFile: clusterFile, Inventory: inv, Trace: tr, Strategy: strategy, Seed: 1,
			ReserveAfter: -1, DataDir: filepath.Join(dir, "data"), Stall: time.Minute, Samples: 50})
		if err != nil {
			t.Fatal(err)
		}
		s := r.Summary
		if s.JobsTotal != len(tr.Jobs) || s.Placed+s.Pending+s.Rejected != s.JobsTotal {
			t.Errorf("%s: %d jobs = %d placed + %d pending + %d rejected; trace has %d", strategy, s.JobsTotal, s.Placed, s.Pending, s.Rejected, len(tr.Jobs))
		}
		// Random spreads jobs over leaves the shipped leaf_span policy
		// forbids; with nothing running, such a job can never be placed.
		if s.RejectReasons["exceeds_cluster_capacity"] != 1 || (strategy != "random" && s.Rejected != 1) ||
			s.Rejected != s.RejectReasons["exceeds_cluster_capacity"]+s.RejectReasons["leaf_span"] {
			t.Errorf("%s: %d rejected (%v), want the one too big (and, for random, leaf_span)", strategy, s.Rejected, s.RejectReasons)
		}
		// Random aside: the leaf_span policy refuses its largest jobs, and
		// the rest find room at once.
		if strategy != "random" && (s.PlacedAfterWait == 0 || s.QueueDelayP99Seconds <= 0) {
			t.Errorf("%s: no job waited (p99 delay %v); the trace is meant to contend", strategy, s.QueueDelayP99Seconds)
		}
		if s.Pending != 0 {
			t.Errorf("%s: %d jobs still pending with the cluster drained", strategy, s.Pending)
		}
		for _, j := range r.Jobs {
			if j.Outcome == "placed" && (j.Start < j.Arrival || j.QueueDelay < 0) {
				t.Errorf("%s: %s placed at %v before its arrival %v", strategy, j.ID, j.Start, j.Arrival)
			}
		}
		for _, p := range r.Timeline {
			if p.Allocated < 0 || p.Allocated > 1 || p.Fragmentation < 0 || p.Fragmentation > 1 {
				t.Fatalf("%s: timeline point out of range: %+v", strategy, p)
			}
		}
		if s.Decisions < s.JobsTotal || s.DecisionsPerSecond <= 0 || s.DecisionLatencyP99Seconds <= 0 {
			t.Errorf("%s: decisions %d, %v/s, p99 %v", strategy, s.Decisions, s.DecisionsPerSecond, s.DecisionLatencyP99Seconds)
		}
		if s.CommJobs == 0 || s.MultiGPUCommJobs == 0 {
			t.Errorf("%s: no prediction carried by the decisions", strategy)
		}
		// Run times depend on placement: every placed job finished, no
		// sooner than its run, and multi-GPU jobs were scaled by the cost
		// model (one-GPU jobs keep their trace duration).
		if s.Finished.Jobs != s.Placed || s.MultiGPU.Jobs == 0 || s.Finished.GPUHours <= 0 || s.MakespanSeconds <= 0 {
			t.Errorf("%s: %d of %d placed jobs finished (%d multi-GPU), %v GPU-hours, makespan %v",
				strategy, s.Finished.Jobs, s.Placed, s.MultiGPU.Jobs, s.Finished.GPUHours, s.MakespanSeconds)
		}
		scaled := 0
		for _, j := range r.Jobs {
			if j.Run < 0 {
				continue
			}
			if j.End-j.Arrival < j.Run-1e-9 || (j.GPUs == 1 && j.Stretch != 1) {
				t.Errorf("%s: %s: JCT %v shorter than its run %v, or a one-GPU job stretched %v", strategy, j.ID, j.End-j.Arrival, j.Run, j.Stretch)
			}
			if j.GPUs > 1 && j.Stretch != 1 {
				scaled++
			}
		}
		if scaled == 0 {
			t.Errorf("%s: no multi-GPU job's run time depends on its placement", strategy)
		}
		results = append(results, r)
	}
	report := filepath.Join(dir, "report")
	if err := WriteReport(report, results...); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(report, "summary.json"))
	if err != nil {
		t.Fatal(err)
	}
	var sum map[string]any
	if err := json.Unmarshal(data, &sum); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"jobs_total", "placed", "pending", "rejected", "decisions_per_second", "decision_latency_p99_seconds",
		"mean_comm_seconds_per_step", "blind_mean_comm_seconds_per_step", "fragmentation_mean", "finished", "multi_gpu", "by_size",
		"makespan_seconds", "compared"} {
		if _, ok := sum[k]; !ok {
			t.Errorf("summary.json lacks %s", k)
		}
	}
	for _, f := range []string{"jobs.csv", "timeline.csv", "replay.svg", "jct.svg", "slowdown.svg"} {
		if st, err := os.Stat(filepath.Join(report, f)); err != nil || st.Size() == 0 {
			t.Errorf("%s: %v", f, err)
		}
	}
}

// TestReservationOnTheVirtualClock: on one 8-GPU node, a stream of
// overlapping one-GPU jobs never leaves the node empty, so an 8-GPU job
// waiting behind it starves until the stream ends (t = 600 s) unless
// placement holds the node for it. With --reserve-after 60s counted on the
// virtual clock, the first release after its wait passes 60 s (t = 100 s)
// holds the node; the stream's next job waits, and the 8-GPU job starts
// when the node drains (t = 150 s). Counted on the wall clock, as before,
// its wait was a few milliseconds and the reservation never came. Every
// strategy honours the reservation (placement's node filter), a peer's as
// topology-aware's.
func TestReservationOnTheVirtualClock(t *testing.T) {
	dir := t.TempDir()
	clusterFile := filepath.Join(dir, "cluster.yaml")
	if err := os.WriteFile(clusterFile, []byte("name: one\nnodes:\n  - {name: dgx, count: 1, model: dgx-a100}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	inv, err := LoadInventory(clusterFile)
	if err != nil {
		t.Fatal(err)
	}
	tr := &Trace{Kind: "test", Source: "TestReservationOnTheVirtualClock", Jobs: []Job{
		{ID: "small-0", Arrival: 0, Duration: 100, GPUs: 1, GPUsPerNode: 1},
		{ID: "big", Arrival: 1, Duration: 10, GPUs: 8, GPUsPerNode: 8},
	}}
	for k := 1; k <= 10; k++ {
		tr.Jobs = append(tr.Jobs, Job{ID: fmt.Sprintf("small-%d", k), Arrival: float64(50 * k), Duration: 100, GPUs: 1, GPUsPerNode: 1})
	}
	tr.Records = len(tr.Jobs)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, tc := range []struct {
		strategy     string
		reserveAfter time.Duration
		bigStart     float64
	}{
		{"topology-aware", -1, 600},
		{"topology-aware", time.Minute, 150},
		{"binpack", -1, 600},
		{"binpack", time.Minute, 150},
	} {
		r, err := Run(ctx, Config{ClusterFile: clusterFile, Inventory: inv, Trace: tr, Strategy: tc.strategy, Seed: 1, Policies: "none",
			ReserveAfter: tc.reserveAfter, DataDir: filepath.Join(dir, fmt.Sprint("data", tc.strategy, tc.reserveAfter)), Stall: time.Minute, Samples: 10})
		if err != nil {
			t.Fatal(err)
		}
		if r.Summary.Placed != len(tr.Jobs) {
			t.Errorf("%s, reserve after %v: %d of %d jobs placed", tc.strategy, tc.reserveAfter, r.Summary.Placed, len(tr.Jobs))
		}
		for _, j := range r.Jobs {
			if j.ID == "big" && j.Start != tc.bigStart {
				t.Errorf("%s, reserve after %v: the 8-GPU job started at %v s, want %v s", tc.strategy, tc.reserveAfter, j.Start, tc.bigStart)
			}
		}
	}
}

// TestReplayIsDeterministic: on the virtual clock a replay's decisions
// depend on the trace alone, not on how fast the machine is. The same
// contended trace, whose jobs of 4 to 16 GPUs give topology-aware's local
// search work across nodes, is replayed twice, the second time with every
// core kept busy; each job starts at the same time on as many nodes with
// the same predicted comm time. On the wall-clock budget of serve (2 ms)
// the loaded run's searches stop sooner and choose otherwise.
func TestReplayIsDeterministic(t *testing.T) {
	clusterFile := filepath.Join("..", "..", "deploy", "examples", "replay", "hetero-512.yaml")
	inv, err := LoadInventory(clusterFile)
	if err != nil {
		t.Fatal(err)
	}
	tr, err := Generate(SynthConfig{Jobs: 60, Seed: 5, Load: 2, DurationMedian: 600, DurationSigma: 0.5,
		Sizes: []SizeWeight{{1, 4}, {4, 2}, {8, 3}, {12, 2}, {16, 3}}}, inv.GPUs, inv.MaxNodeGPUs)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	replay := func() *Result {
		r, err := Run(ctx, Config{ClusterFile: clusterFile, Inventory: inv, Trace: tr, Strategy: "topology-aware", Seed: 1,
			ReserveAfter: -1, DataDir: t.TempDir(), Stall: time.Minute, Samples: 20})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	first := replay()
	var stop atomic.Bool
	var spin sync.WaitGroup
	for range runtime.NumCPU() {
		spin.Add(1)
		go func() { // keeps a core busy until the replay is done
			defer spin.Done()
			for !stop.Load() {
			}
		}()
	}
	second := replay()
	stop.Store(true)
	spin.Wait()
	if len(first.Jobs) != len(second.Jobs) {
		t.Fatalf("%d jobs, then %d", len(first.Jobs), len(second.Jobs))
	}
	for i, a := range first.Jobs {
		b := second.Jobs[i]
		same := func(x, y float64) bool { return x == y || (math.IsNaN(x) && math.IsNaN(y)) }
		if a.ID != b.ID || a.Start != b.Start || a.Nodes != b.Nodes || !same(a.Comm, b.Comm) {
			t.Errorf("job %s: start %v on %d nodes, comm %v; loaded: %s at %v on %d, comm %v",
				a.ID, a.Start, a.Nodes, a.Comm, b.ID, b.Start, b.Nodes, b.Comm)
		}
	}
}

// backfilled is a trace on which --backfill starts jobs on held nodes
// (TestPlacementOptionsReachIt): run times spread wide and 64-GPU heads.
var backfilled = SynthConfig{Jobs: 150, Seed: 5, Load: 2.5, DurationMedian: 3600, DurationSigma: 1.5,
	Sizes: []SizeWeight{{1, 6}, {2, 2}, {4, 2}, {8, 3}, {64, 1}}}

// TestPlacementOptionsReachIt: the replay hands placement's --backfill and
// --queue-order to it, and on a contended trace each starts some jobs at
// other times.
func TestPlacementOptionsReachIt(t *testing.T) {
	t.Parallel()
	clusterFile := filepath.Join("..", "..", "deploy", "examples", "replay", "hetero-512.yaml")
	inv, err := LoadInventory(clusterFile)
	if err != nil {
		t.Fatal(err)
	}
	tr, err := Generate(backfilled, inv.GPUs, inv.MaxNodeGPUs)
	if err != nil {
		t.Fatal(err)
	}
	replay := func(t *testing.T, option func(*Config)) *Result {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		cfg := Config{ClusterFile: clusterFile, Inventory: inv, Trace: tr, Strategy: "topology-aware", Seed: 1,
			ReserveAfter: 5 * time.Minute, MaxStretch: -1, DataDir: t.TempDir(), Stall: time.Minute, Samples: 50}
		option(&cfg)
		r, err := Run(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	base := replay(t, func(*Config) {})
	for _, tc := range []struct {
		name   string
		option func(*Config)
	}{
		{"backfill", func(c *Config) { c.Backfill = true }},
		{"ordered by expected work", func(c *Config) { c.QueueOrder = placement.QueueByWork }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := replay(t, tc.option)
			moved := 0
			for i, j := range base.Jobs {
				if j.Start != res.Jobs[i].Start {
					moved++
				}
			}
			if moved == 0 {
				t.Fatalf("every job started at the same time with %s and without", tc.name)
			}
			t.Logf("%d of %d jobs started at another time", moved, len(base.Jobs))
		})
	}
}

// TestShortcutsChangeNothing replays two traces with the virtual clock's
// shortcuts and again one event at a time (oneAtATime): a light one, in
// which many jobs end one after another with nobody waiting (finish
// runs), and a contended one under the reservation, in which jobs wait
// far longer than ReserveAfter (barriers left out once it is settled).
// Every job and every timeline point must come out the same.
func TestShortcutsChangeNothing(t *testing.T) {
	clusterFile := filepath.Join("..", "..", "deploy", "examples", "replay", "hetero-512.yaml")
	inv, err := LoadInventory(clusterFile)
	if err != nil {
		t.Fatal(err)
	}
	contended := SynthConfig{Jobs: 90, Seed: 5, Load: 2.5, DurationMedian: 3600, DurationSigma: 0.5,
		Sizes: []SizeWeight{{1, 4}, {4, 2}, {8, 3}, {16, 2}}}
	// fewerBarriers checks that the trace tests the settled reservation's
	// shortcut: it left barriers out.
	fewerBarriers := func(t *testing.T, runs, single *Result) {
		if runs.Summary.Barriers >= single.Summary.Barriers {
			t.Fatalf("%d barriers with the shortcut, %d without: the trace does not test it", runs.Summary.Barriers, single.Summary.Barriers)
		}
		t.Logf("barriers: %d, one at a time %d", runs.Summary.Barriers, single.Summary.Barriers)
	}
	for _, tc := range []struct {
		name  string
		synth SynthConfig
		check func(t *testing.T, runs, single *Result)
		// maxStretch is topology-aware's wait for a compact placement
		// (0: the default). A job it keeps waiting fits by counts, so it
		// calls for every barrier: the trace that tests the settled
		// reservation's shortcut tests it with the rule off.
		maxStretch float64
		// backfill is placement's --backfill: whether a job may run on
		// held nodes depends on the clock, so the shortcuts must not move
		// the time of any decision.
		backfill bool
		// order is placement's --queue-order ("": its default).
		order string
	}{
		{"finish runs", SynthConfig{Jobs: 80, Seed: 3, Load: 0.3, DurationMedian: 600, DurationSigma: 1.5,
			Sizes: []SizeWeight{{1, 4}, {2, 1}, {8, 2}, {16, 1}}}, func(t *testing.T, _, single *Result) {
			// Finishes back to back: ends with no arrival since the
			// previous end.
			var ends, arrivals []float64
			for _, j := range single.Jobs {
				arrivals = append(arrivals, j.Arrival)
				if j.End >= 0 {
					ends = append(ends, j.End)
				}
			}
			slices.Sort(ends)
			slices.Sort(arrivals)
			backToBack := 0
			for i := 1; i < len(ends); i++ {
				k, _ := slices.BinarySearch(arrivals, ends[i-1])
				if k == len(arrivals) || arrivals[k] >= ends[i] {
					backToBack++
				}
			}
			if backToBack < 10 {
				t.Fatalf("only %d finishes follow another with no arrival between: the trace does not test runs", backToBack)
			}
		}, 0, false, ""},
		{"settled reservation", contended, fewerBarriers, -1, false, ""},
		{"settled reservation, ordered by expected work", contended, fewerBarriers, -1, false, placement.QueueByWork},
		{"settled reservation, compact placements awaited", contended, func(t *testing.T, runs, single *Result) {
			t.Logf("barriers: %d, one at a time %d", runs.Summary.Barriers, single.Summary.Barriers)
		}, 0, false, ""},
		{"settled reservation, backfill", backfilled, fewerBarriers, -1, true, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr, err := Generate(tc.synth, inv.GPUs, inv.MaxNodeGPUs)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			replay := func(single bool) *Result {
				t.Helper()
				defer func(was bool) { oneAtATime = was }(oneAtATime)
				oneAtATime = single
				r, err := Run(ctx, Config{ClusterFile: clusterFile, Inventory: inv, Trace: tr, Strategy: "topology-aware", Seed: 1,
					ReserveAfter: 5 * time.Minute, MaxStretch: tc.maxStretch, Backfill: tc.backfill, QueueOrder: tc.order, DataDir: t.TempDir(), Stall: time.Minute, Samples: 50})
				if err != nil {
					t.Fatal(err)
				}
				return r
			}
			runs, single := replay(false), replay(true)
			tc.check(t, runs, single)
			same := func(x, y float64) bool { return x == y || (math.IsNaN(x) && math.IsNaN(y)) }
			for i, a := range single.Jobs {
				b := runs.Jobs[i]
				if a.ID != b.ID || a.Outcome != b.Outcome || a.Start != b.Start || a.Nodes != b.Nodes || !same(a.Comm, b.Comm) || !same(a.End, b.End) {
					t.Errorf("job %s: %s at %v on %d nodes, comm %v, end %v; with the shortcuts: %s %s at %v on %d, comm %v, end %v",
						a.ID, a.Outcome, a.Start, a.Nodes, a.Comm, a.End, b.ID, b.Outcome, b.Start, b.Nodes, b.Comm, b.End)
				}
			}
			if !slices.Equal(single.Timeline, runs.Timeline) {
				t.Errorf("timelines differ:\none at a time   %v\nwith shortcuts %v", single.Timeline, runs.Timeline)
			}
		})
	}
}

// TestDataDirOfAnEarlierReplayIsRefused: a second replay into the same
// data directory would find the first one's jobs and wait for outcomes
// that never come; it is refused, naming the directory.
func TestDataDirOfAnEarlierReplayIsRefused(t *testing.T) {
	t.Parallel()
	clusterFile := filepath.Join("..", "..", "deploy", "examples", "replay", "hetero-512.yaml")
	inv, err := LoadInventory(clusterFile)
	if err != nil {
		t.Fatal(err)
	}
	tr, err := Generate(SynthConfig{Jobs: 3, Seed: 1, Load: 0.5, DurationMedian: 60, DurationSigma: 0.1}, inv.GPUs, inv.MaxNodeGPUs)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	streams := filepath.Join(dir, "nats-blind")
	if err := os.MkdirAll(filepath.Join(streams, "jetstream"), 0o755); err != nil {
		t.Fatal(err)
	}
	_, err = Run(context.Background(), Config{ClusterFile: clusterFile, Inventory: inv, Trace: tr, Strategy: "blind", DataDir: dir})
	if err == nil || !strings.Contains(err.Error(), streams+" holds an earlier replay's streams") {
		t.Fatalf("replay into a used data directory: %v", err)
	}
}

// TestReservationSettled: the barrier after a finish may be left out
// under the reservation only once the head of the queue has waited longer
// than ReserveAfter, by more than the margin: in arrival order the
// highest priority, then the first to wait; ordered by expected ends,
// whose head the replay cannot name, every waiting job.
func TestReservationSettled(t *testing.T) {
	r := &runner{queue: map[int]bool{}}
	r.jobs = []jobState{{job: Job{Arrival: 0}}, {job: Job{Arrival: 100}}, {job: Job{Arrival: 250}}}
	r.subs = make([]events.JobSubmitted, 3)
	for _, tc := range []struct {
		order    string
		name     string
		now      float64
		waiting  []int
		priority int // of job 2
		want     bool
	}{
		{placement.QueueByArrival, "nobody waits", 1000, nil, 0, false},
		{placement.QueueByArrival, "the head waited longer", 301, []int{0, 1, 2}, 0, true},
		{placement.QueueByArrival, "the head exactly at the limit", 300, []int{0, 1, 2}, 0, false},
		{placement.QueueByArrival, "the head within the margin", 300.0005, []int{0, 1, 2}, 0, false},
		{placement.QueueByArrival, "the head has not waited enough", 350, []int{1, 2}, 0, false},
		{placement.QueueByArrival, "the head has, later jobs not", 401, []int{1, 2}, 0, true},
		{placement.QueueByArrival, "a later job of a higher priority heads the queue", 401, []int{1, 2}, 1, false},
		{placement.QueueByArrival, "and once it has waited long enough", 551, []int{1, 2}, 1, true},
		{placement.QueueByEnd, "nobody waits", 1000, nil, 0, false},
		{placement.QueueByEnd, "the first has waited longer, later jobs not", 401, []int{0, 1, 2}, 0, false},
		{placement.QueueByEnd, "the last within the margin", 550.0005, []int{0, 1, 2}, 0, false},
		{placement.QueueByEnd, "every job has", 551, []int{0, 1, 2}, 0, true},
		{placement.QueueByEnd, "every job still waiting has", 401, []int{0, 1}, 0, true},
	} {
		t.Run(tc.order+"/"+tc.name, func(t *testing.T) {
			r.cfg = Config{ReserveAfter: 5 * time.Minute, QueueOrder: tc.order}
			clear(r.queue)
			for _, i := range tc.waiting {
				r.queue[i] = true
			}
			r.now, r.subs[2].Priority = tc.now, tc.priority
			if got := r.reservationSettled(); got != tc.want {
				t.Errorf("settled at %v with %v waiting = %v, want %v", tc.now, tc.waiting, got, tc.want)
			}
		})
	}
}
