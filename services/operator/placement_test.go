package operator_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/events/bus"
	"github.com/toposched/toposched/events/eventstest"
	"github.com/toposched/toposched/internal/client"
	"github.com/toposched/toposched/services/discovery"
	"github.com/toposched/toposched/services/operator"
)

const cluster = `name: t
nodes:
  - {name: a, count: 2, gpus: 8, gpu_model: A100}
  - {name: p, gpus: 4, gpu_model: L40S}
`

// world is a server, a bus, running services and a log of outcomes.
type world struct {
	t       *testing.T
	dir     string
	b       *bus.Bus
	op      *operator.Operator
	stop    func() error
	mu      sync.Mutex
	seen    []client.Outcome
	changed chan struct{}
}

func newWorld(t *testing.T, dir string) *world {
	t.Helper()
	srv := eventstest.ServerAt(t, filepath.Join(dir, "nats"))
	w := &world{t: t, dir: dir, b: eventstest.Bus(t, srv.ClientURL(), "test"), changed: make(chan struct{}, 1)}
	file := filepath.Join(dir, "cluster.yaml")
	if err := os.WriteFile(file, []byte(cluster), 0o600); err != nil {
		t.Fatal(err)
	}
	w.start(file)
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = client.Watch(ctx, w.b, client.FromStart, ready, func(o client.Outcome) error {
			w.mu.Lock()
			w.seen = append(w.seen, o)
			w.mu.Unlock()
			select {
			case w.changed <- struct{}{}:
			default:
			}
			return nil
		})
	}()
	<-ready
	t.Cleanup(func() { cancel(); <-done })
	return w
}

func (w *world) start(file string) {
	w.t.Helper()
	op, stop, err := operator.StartOn(w.t, context.Background(), w.b,
		operator.Config{Services: operator.All, Discovery: discovery.Config{ClusterFile: file}}, nil)
	if err != nil {
		w.t.Fatal(err)
	}
	w.op, w.stop = op, stop
	// Wait until discovery's topology is in the store.
	w.until(func() bool { total, _ := op.PlacementService().Store().Snapshot().Capacity(""); return total == 20 }, "topology loaded")
}

func (w *world) submit(job events.JobSubmitted) {
	w.t.Helper()
	if _, err := client.Submit(context.Background(), w.b, &job); err != nil {
		w.t.Fatal(err)
	}
}

func (w *world) finish(id string) {
	w.t.Helper()
	if _, err := client.Finish(context.Background(), w.b, id, events.StatusSucceeded); err != nil {
		w.t.Fatal(err)
	}
}

// until waits for cond, re-checking whenever an outcome arrives; a 100 ms
// tick covers conditions on the store rather than on outcomes.
func (w *world) until(cond func() bool, what string) {
	w.t.Helper()
	deadline := time.After(20 * time.Second)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-w.changed:
		case <-tick.C:
		case <-deadline:
			w.t.Fatalf("timed out waiting for %s; outcomes: %v", what, w.summary())
		}
	}
}

// outcomes returns the outcomes seen for a job, in order.
func (w *world) outcomes(id string) []client.Outcome {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []client.Outcome
	for _, o := range w.seen {
		if o.JobID() == id {
			out = append(out, o)
		}
	}
	return out
}

func (w *world) last(id string) client.Outcome {
	o := w.outcomes(id)
	if len(o) == 0 {
		return client.Outcome{}
	}
	return o[len(o)-1]
}

func (w *world) await(id string, name events.Name) client.Outcome {
	w.t.Helper()
	w.until(func() bool { return w.last(id).Name == name }, id+" "+string(name))
	return w.last(id)
}

func (w *world) summary() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var s []string
	for _, o := range w.seen {
		s = append(s, fmt.Sprintf("%s:%s", o.JobID(), o.Name))
	}
	return s
}

// checkNoDoubleBooking replays every decision and release and fails if a GPU
// is ever held by two live jobs.
func (w *world) checkNoDoubleBooking() {
	w.t.Helper()
	w.mu.Lock()
	defer w.mu.Unlock()
	holder := map[string]string{}
	decided := map[string]int{}
	for _, o := range w.seen {
		switch {
		case o.Decided != nil:
			decided[o.Decided.JobID]++
			for _, r := range o.Decided.Ranks {
				k := fmt.Sprintf("%s/%d", r.Node, r.GPU)
				if h, ok := holder[k]; ok {
					w.t.Fatalf("GPU %s given to %s while %s holds it", k, o.Decided.JobID, h)
				}
				holder[k] = o.Decided.JobID
			}
		case o.Released != nil:
			for k, h := range holder {
				if h == o.Released.JobID {
					delete(holder, k)
				}
			}
		}
	}
	for id, n := range decided {
		if n > 1 {
			w.t.Fatalf("job %s decided %d times", id, n)
		}
	}
}

func TestDecidePendingFinish(t *testing.T) {
	t.Parallel()
	w := newWorld(t, t.TempDir())
	w.submit(events.JobSubmitted{JobID: "big", GPUs: 16, GPUsPerNode: 8, GPUModel: "A100", Parallelism: &events.Parallelism{TP: 8}})
	d := w.await("big", events.NamePlacementDecided).Decided
	if len(d.Ranks) != 16 || len(d.Nodes) != 2 || d.Nodes[0].CUDAVisibleDevices != "0,1,2,3,4,5,6,7" || d.Strategy != "topology-aware" || d.Prediction == nil || d.Baseline == nil || d.Baseline.Strategy != "blind" {
		t.Fatalf("decision %+v", d)
	}
	if d.Ranks[9].Node != "a-002" || d.Ranks[9].LocalRank != 1 || d.Ranks[9].GPU != 1 {
		t.Fatalf("rank 9 %+v", d.Ranks[9])
	}
	w.submit(events.JobSubmitted{JobID: "wait", GPUs: 8, GPUModel: "A100"})
	p := w.await("wait", events.NamePlacementPending).Pending
	if p.Reasons[0].Field != "gpus" {
		t.Fatalf("pending reasons %+v", p.Reasons)
	}
	w.finish("big")
	w.await("wait", events.NamePlacementDecided)
	w.await("big", events.NamePlacementReleased)
	w.checkNoDoubleBooking()
}

func TestRejections(t *testing.T) {
	t.Parallel()
	w := newWorld(t, t.TempDir())
	tests := []struct {
		job   events.JobSubmitted
		field string
		code  string
	}{
		{events.JobSubmitted{JobID: "huge", GPUs: 64}, "gpus", "exceeds_cluster_capacity"},
		{events.JobSubmitted{JobID: "model", GPUs: 1, GPUModel: "H100"}, "gpu_model", "unknown_gpu_model"},
		{events.JobSubmitted{JobID: "wide", GPUs: 16, GPUsPerNode: 16}, "gpus_per_node", "exceeds_node_size"},
		{events.JobSubmitted{JobID: "arith", GPUs: 8, Parallelism: &events.Parallelism{TP: 3}}, "gpus", "inconsistent_parallelism"},
	}
	for _, tc := range tests {
		w.submit(tc.job)
	}
	for _, tc := range tests {
		r := w.await(tc.job.JobID, events.NamePlacementRejected).Rejected
		if r.Reasons[0].Field != tc.field || r.Reasons[0].Code != tc.code {
			t.Errorf("%s: reasons %+v, want %s on %s", tc.job.JobID, r.Reasons, tc.code, tc.field)
		}
	}
	// A malformed body that names its job is answered too.
	if err := w.b.PublishRaw(context.Background(), "toposched.jobs.submitted", nil, []byte(`{"job_id":"raw","gpus":0}`)); err != nil {
		t.Fatal(err)
	}
	r := w.await("raw", events.NamePlacementRejected).Rejected
	if r.Reasons[0].Field != "gpus" || r.Reasons[0].Code != "schema_minimum" {
		t.Errorf("raw: reasons %+v", r.Reasons)
	}
}

func TestDuplicateSubmissionHasNoSecondEffect(t *testing.T) {
	t.Parallel()
	w := newWorld(t, t.TempDir())
	job := events.JobSubmitted{JobID: "once", GPUs: 4}
	w.submit(job)
	w.await("once", events.NamePlacementDecided)
	job.GPUs = 8 // same id, another body, another event id
	w.submit(job)
	w.submit(events.JobSubmitted{JobID: "marker", GPUs: 1})
	w.await("marker", events.NamePlacementDecided)
	if n := len(w.outcomes("once")); n != 1 {
		t.Fatalf("once has %d outcomes, want 1", n)
	}
	// A rejected job may be corrected and submitted again.
	w.submit(events.JobSubmitted{JobID: "fixme", GPUs: 99})
	w.await("fixme", events.NamePlacementRejected)
	w.submit(events.JobSubmitted{JobID: "fixme", GPUs: 2})
	w.await("fixme", events.NamePlacementDecided)
	w.checkNoDoubleBooking()
}

func TestHealthTakesGPUOutOfPlacement(t *testing.T) {
	t.Parallel()
	w := newWorld(t, t.TempDir())
	_, err := w.b.Publish(context.Background(), &events.TopologyHealth{
		Node: "p", Component: events.ComponentGPU, ID: "0", Health: events.HealthUnhealthy,
		Reason: "xid 79", ObservedAt: time.Now().UTC(),
	})
	if err != nil {
		t.Fatal(err)
	}
	w.until(func() bool { return w.op.PlacementService().Store().Snapshot().FreeCount() == 19 }, "GPU p/0 unhealthy")
	w.submit(events.JobSubmitted{JobID: "l40s", GPUs: 3, GPUModel: "L40S"})
	d := w.await("l40s", events.NamePlacementDecided).Decided
	if d.Nodes[0].CUDAVisibleDevices != "1,2,3" {
		t.Fatalf("placed on %s, want the three healthy GPUs", d.Nodes[0].CUDAVisibleDevices)
	}
}

func TestRestartKeepsAllocationsAndPendingJobs(t *testing.T) {
	t.Parallel()
	w := newWorld(t, t.TempDir())
	w.submit(events.JobSubmitted{JobID: "first", GPUs: 16, GPUModel: "A100"})
	w.await("first", events.NamePlacementDecided)
	w.submit(events.JobSubmitted{JobID: "queued", GPUs: 8, GPUModel: "A100", Priority: 1})
	w.await("queued", events.NamePlacementPending)
	if err := w.stop(); err != nil {
		t.Fatal(err)
	}
	// A new placement replica rebuilds from the streams alone.
	w.start(filepath.Join(w.dir, "cluster.yaml"))
	snap := w.op.PlacementService().Store().Snapshot()
	if got := len(snap.GPUsOfJob("first")); got != 16 {
		t.Fatalf("after restart first holds %d GPUs, want 16", got)
	}
	if q := snap.PendingQueue(); len(q) != 1 || q[0].ID != "queued" || q[0].Spec.Job.GPUs != 8 {
		t.Fatalf("after restart queue is %+v", q)
	}
	w.submit(events.JobSubmitted{JobID: "late", GPUs: 2, GPUModel: "A100"})
	w.await("late", events.NamePlacementPending)
	w.finish("first")
	w.await("queued", events.NamePlacementDecided)
	w.await("late", events.NamePlacementDecided)
	w.checkNoDoubleBooking()
}

// A burst of submissions and finishes from several goroutines: every job
// ends decided, pending or rejected, and no GPU is ever held twice.
func TestBurstNeverDoubleBooks(t *testing.T) {
	t.Parallel()
	w := newWorld(t, t.TempDir())
	const n = 60
	var wg sync.WaitGroup
	for g := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := g; i < n; i += 3 {
				w.submit(events.JobSubmitted{JobID: fmt.Sprintf("j%02d", i), GPUs: 1 + i%6})
			}
		}()
	}
	wg.Wait()
	for i := 0; i < n; i += 2 {
		id := fmt.Sprintf("j%02d", i)
		w.until(func() bool { return len(w.outcomes(id)) > 0 }, id+" answered")
		w.finish(id)
	}
	for i := range n {
		id := fmt.Sprintf("j%02d", i)
		w.until(func() bool { return len(w.outcomes(id)) > 0 }, id+" answered")
	}
	w.checkNoDoubleBooking()
}

// A finish says what placement did with it: a placed job's GPUs freed, a
// waiting job withdrawn, a second finish answered from the history without
// sending anything, and an id nothing was submitted under refused.
func TestFinishTellsWhatHappened(t *testing.T) {
	t.Parallel()
	w := newWorld(t, t.TempDir())
	ctx := context.Background()
	w.submit(events.JobSubmitted{JobID: "run", GPUs: 16, GPUsPerNode: 8, GPUModel: "A100"})
	w.await("run", events.NamePlacementDecided)
	w.submit(events.JobSubmitted{JobID: "queued", GPUs: 8, GPUModel: "A100"})
	w.await("queued", events.NamePlacementPending)

	for _, tc := range []struct {
		job  string
		want client.FinishOutcome
	}{
		{"queued", client.FinishWithdrawn},
		{"run", client.FinishReleased},
		{"run", client.FinishAlready},
		{"never-submitted", client.FinishUnknown},
	} {
		res, err := client.FinishAndWait(ctx, w.b, tc.job, events.StatusCancelled, 20*time.Second)
		if err != nil {
			t.Fatalf("finish %s: %v", tc.job, err)
		}
		if res.Outcome != tc.want {
			t.Errorf("finish %s: %q, want %q", tc.job, res.Outcome, tc.want)
		}
	}
	// The withdrawn job was never placed afterwards, not even when the
	// released GPUs made room for it.
	for _, o := range w.outcomes("queued") {
		if o.Decided != nil {
			t.Errorf("queued was placed after its withdrawal: %+v", o.Decided)
		}
	}
	w.checkNoDoubleBooking()
}
