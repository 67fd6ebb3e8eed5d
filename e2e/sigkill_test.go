package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Names of the wire contract that only this test uses.
const (
	subjectFinished          = "toposched.jobs.finished"
	durablePlacementFinished = "placement-jobs-finished"
)

// sigkillJob is one job of the burst, as submitted.
type sigkillJob struct {
	JobID       string `json:"job_id"`
	GPUs        int    `json:"gpus"`
	GPUsPerNode int    `json:"gpus_per_node,omitempty"`
	// impossible jobs can never fit on the cluster: they must be rejected.
	impossible bool
}

// sigkillBurst returns n jobs for a cluster of nodes×perNode GPUs: every
// tenth can never fit (too many GPUs, too many per node, a per-node count
// that does not divide the total), a third of the rest ask for a per-node
// count, the others for 1 to 16 GPUs anywhere.
func sigkillBurst(rng *rand.Rand, n, nodes, perNode int) []sigkillJob {
	jobs := make([]sigkillJob, n)
	for i := range jobs {
		j := sigkillJob{JobID: fmt.Sprintf("sk-%03d", i)}
		switch {
		case i%10 == 7:
			j.impossible = true
			switch (i / 10) % 3 {
			case 0:
				j.GPUs = nodes*perNode + 1 + rng.IntN(64)
			case 1:
				j.GPUs, j.GPUsPerNode = 2*perNode, 2*perNode
			case 2:
				j.GPUs, j.GPUsPerNode = 12, 8
			}
		case i%3 == 0:
			j.GPUsPerNode = []int{1, 2, 4, 8}[rng.IntN(4)]
			j.GPUs = j.GPUsPerNode * (1 + rng.IntN(16/j.GPUsPerNode))
		default:
			j.GPUs = 1 + rng.IntN(16)
		}
		jobs[i] = j
	}
	return jobs
}

// placementCounts is how many messages the placement stream holds on each
// subject.
func placementCounts(t *testing.T, js jetstream.JetStream) map[string]uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, streamPlacement)
	if err != nil {
		t.Fatalf("stream %s: %v", streamPlacement, err)
	}
	info, err := s.Info(ctx, jetstream.WithSubjectFilter("toposched.placement.>"))
	if err != nil {
		t.Fatalf("stream %s: %v", streamPlacement, err)
	}
	out := map[string]uint64{"total": info.State.Msgs}
	for subj, n := range info.State.Subjects {
		out[subj] = n
	}
	return out
}

// finisher finishes some of the jobs it sees decided, as a launcher whose
// jobs end would, until it is stopped.
type finisher struct {
	mu       sync.Mutex
	js       jetstream.JetStream
	rng      *rand.Rand
	share    float64
	decided  []string        // jobs seen decided, in stream order
	last     uint64          // stream sequence of the last decision seen
	finished map[string]bool // jobs a finish was published (and acked) for
	errs     []error
	// catchUpErr is why the last catch-up read failed, if it did.
	catchUpErr error
	stopped    bool
	it         jetstream.MessagesContext
	done       chan struct{}
}

// startFinisher follows placement.decided from the start of the stream and
// publishes jobs.finished for a share of the jobs decided.
func startFinisher(t *testing.T, js jetstream.JetStream, rng *rand.Rand, share float64) *finisher {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cons, err := js.OrderedConsumer(ctx, streamPlacement, followDecided())
	if err != nil {
		t.Fatalf("ordered consumer on %s: %v", streamPlacement, err)
	}
	it, err := cons.Messages()
	if err != nil {
		t.Fatalf("ordered consumer on %s: %v", streamPlacement, err)
	}
	f := &finisher{js: js, rng: rng, share: share, finished: map[string]bool{}, it: it, done: make(chan struct{})}
	go func() {
		defer close(f.done)
		for {
			m, err := f.iter().Next()
			if err != nil {
				if errors.Is(err, jetstream.ErrMsgIteratorClosed) {
					return
				}
				// A NATS node's death can end the follower; a launcher
				// follows on, after the last decision it saw.
				if rerr := f.resubscribe(); rerr != nil {
					if !errors.Is(rerr, errFinisherStopped) {
						f.fail(fmt.Errorf("finisher: next decision: %w (follow again: %w)", err, rerr))
					}
					return
				}
				continue
			}
			f.mu.Lock()
			f.seeLocked(m)
			f.mu.Unlock()
		}
	}()
	t.Cleanup(f.stop)
	return f
}

// followDecided is the ordered consumer of placement.decided that the
// finisher reads with. nats.go re-creates an ordered consumer's
// server-side consumer after a fault, by default for ever and silently; a
// bound makes a failure an error, which the finisher answers by following
// again.
func followDecided() jetstream.OrderedConsumerConfig {
	return jetstream.OrderedConsumerConfig{FilterSubjects: []string{subjectDecided}, MaxResetAttempts: 5}
}

// seeLocked takes in one decision, from the follower or a catch-up read,
// once, and finishes the job with the finisher's share; f.mu is held.
func (f *finisher) seeLocked(m jetstream.Msg) {
	md, err := m.Metadata()
	if err != nil {
		f.errs = append(f.errs, fmt.Errorf("finisher: decision's metadata: %w", err))
		return
	}
	if md.Sequence.Stream <= f.last {
		return // seen by the other reader
	}
	f.last = md.Sequence.Stream
	var d decidedJSON
	if err := json.Unmarshal(m.Data(), &d); err != nil {
		f.errs = append(f.errs, fmt.Errorf("finisher: decision %q: %w", m.Data(), err))
		return
	}
	f.decided = append(f.decided, d.JobID)
	if !f.stopped && f.rng.Float64() < f.share {
		f.finishLocked(d.JobID)
	}
}

// catchUpLocked reads the decisions after the last one seen to the end of
// the stream, with a pull of its own. A JetStream follower can fall silent
// after a cluster node's death without an error (nats.go's ordered
// consumer re-creating its consumer, by default without end; see
// followDecided); a launcher that must not wait for ever asks the stream
// itself. f.mu is held.
func (f *finisher) catchUpLocked() error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cfg := followDecided()
	if f.last > 0 {
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, f.last+1
	}
	cons, err := f.js.OrderedConsumer(ctx, streamPlacement, cfg)
	if err != nil {
		return fmt.Errorf("catch up with decisions: %w", err)
	}
	for {
		batch, err := cons.Fetch(256, jetstream.FetchMaxWait(time.Second))
		if err != nil {
			return fmt.Errorf("catch up with decisions: %w", err)
		}
		n, pending := 0, uint64(0)
		for m := range batch.Messages() {
			n++
			if md, err := m.Metadata(); err == nil {
				pending = md.NumPending
			}
			f.seeLocked(m)
		}
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
			return fmt.Errorf("catch up with decisions: %w", err)
		}
		if n == 0 || pending == 0 {
			return nil
		}
	}
}

// finishLocked publishes a finish for job, once; f.mu is held across the
// publish, so that once stop returns no finish is on its way.
func (f *finisher) finishLocked(job string) {
	if f.finished[job] {
		return
	}
	body := fmt.Sprintf(`{"job_id":%q,"status":"succeeded"}`, job)
	// A publish cut by a NATS node's death may have been stored with its
	// acknowledgement lost: it is sent again under the same message id,
	// which JetStream stores once, as a launcher would. While the stream
	// elects a new leader the answer is "no response from stream" at once,
	// so the launcher backs off and keeps trying for a while rather than
	// a fixed number of times.
	var err error
	deadline := time.Now().Add(60 * time.Second)
	for wait := 100 * time.Millisecond; ; wait = min(2*wait, 2*time.Second) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err = f.js.Publish(ctx, subjectFinished, []byte(body), jetstream.WithMsgID("e2e-sigkill-finish-"+job))
		cancel()
		if err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(wait)
	}
	if err != nil {
		f.errs = append(f.errs, fmt.Errorf("finisher: publish finish of %s: %w", job, err))
		return
	}
	f.finished[job] = true
}

// finishSome finishes up to n of the jobs decided so far that are not
// finished yet, oldest first, so that GPUs free up whatever the random
// share did. It first reads the stream for decisions the follower has not
// delivered. It returns how many it finished.
func (f *finisher) finishSome(n int) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	// On a failure the follower may still deliver them; the caller's wait
	// for progress says whether that was enough, and a stall prints it.
	f.catchUpErr = f.catchUpLocked()
	done := 0
	for _, job := range f.decided {
		if done == n {
			break
		}
		if !f.finished[job] {
			f.finishLocked(job)
			done++
		}
	}
	return done
}

// String says what the finisher knows, for a test that stalls.
func (f *finisher) String() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return fmt.Sprintf("finisher: %d decisions seen (last at stream sequence %d), %d finished, errors %v, last catch-up: %v",
		len(f.decided), f.last, len(f.finished), f.errs, f.catchUpErr)
}

func (f *finisher) fail(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.errs = append(f.errs, err)
}

func (f *finisher) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.finished)
}

// stop ends the finisher; no finish is published after it returns.
func (f *finisher) stop() {
	f.mu.Lock()
	f.stopped = true
	it := f.it
	f.mu.Unlock()
	it.Stop()
	<-f.done
}

var errFinisherStopped = errors.New("finisher stopped")

func (f *finisher) iter() jetstream.MessagesContext {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.it
}

// resubscribe follows the decisions again after the last one seen, trying
// for a minute with back-off while the stream elects a leader.
func (f *finisher) resubscribe() error {
	f.mu.Lock()
	last := f.last
	f.mu.Unlock()
	cfg := followDecided()
	if last > 0 {
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, last+1
	}
	deadline := time.Now().Add(time.Minute)
	var err error
	for wait := 100 * time.Millisecond; ; wait = min(2*wait, 2*time.Second) {
		var it jetstream.MessagesContext
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		var cons jetstream.Consumer
		if cons, err = f.js.OrderedConsumer(ctx, streamPlacement, cfg); err == nil {
			it, err = cons.Messages()
		}
		cancel()
		if err == nil {
			f.mu.Lock()
			defer f.mu.Unlock()
			if f.stopped {
				it.Stop()
				return errFinisherStopped
			}
			f.it = it
			return nil
		}
		if time.Now().After(deadline) {
			return err
		}
		time.Sleep(wait)
	}
}

// killedBySIGKILL waits for p to end and fails the test unless SIGKILL
// ended it.
func killedBySIGKILL(t *testing.T, p *proc) {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s still running 10s after SIGKILL", p.name)
	}
	var ee *exec.ExitError
	if !errors.As(p.err, &ee) {
		t.Fatalf("%s after SIGKILL: %v, want killed by a signal", p.name, p.err)
	}
	if ws, ok := ee.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("%s after SIGKILL: %v, want killed by SIGKILL", p.name, p.err)
	}
}

// TestPlacementSIGKILLMidBurst runs every service as its own process on a
// real nats-server, submits a burst of 500 jobs while a launcher finishes
// some of those decided, and kills placement with SIGKILL twice in the
// middle of it, starting a new one each time. Once everything is handled,
// the placement log must hold exactly one outcome for every job, no job
// decided twice, no GPU held by two live jobs at any point, a release for
// every finished job, and no waiting job that fits in what is free.
func TestPlacementSIGKILLMidBurst(t *testing.T) {
	needBinaries(t)
	t.Parallel()
	start := time.Now()

	const (
		nodes, perNode = 16, 8
		total          = 500
		finishShare    = 0.5
		minDecided     = 150 // decisions before the end
	)
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("TOPOSCHED_E2E_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("TOPOSCHED_E2E_SEED=%s: %v", s, err)
		}
		seed = v
	}
	t.Logf("seed %d (rerun with TOPOSCHED_E2E_SEED=%d)", seed, seed)
	jobs := sigkillBurst(rand.New(rand.NewPCG(seed, 1)), total, nodes, perNode)
	byID := map[string]sigkillJob{}
	for _, j := range jobs {
		byID[j.JobID] = j
	}

	url, server := natsServer(t)
	env := childEnv()
	others := []*proc{
		server,
		startProc(t, "discovery", env, bins.toposched, "discovery", "--nats-url", url,
			"--cluster", testdata(t, "sixteen-nodes.yaml"), "--poll", "0"),
		startProc(t, "analysis", env, bins.toposched, "analysis", "--nats-url", url),
		startProc(t, "optimizer", env, bins.toposched, "optimizer", "--nats-url", url),
	}
	var placements []*proc // every placement process started, in order
	startPlacement := func() *proc {
		t.Helper()
		p := startProc(t, fmt.Sprintf("placement #%d", len(placements)+1), env, bins.toposched,
			"placement", "--nats-url", url)
		placements = append(placements, p)
		waitFor(t, 30*time.Second, func() (bool, string) {
			mustBeAlive(t, append(others, p)...)
			if !strings.Contains(p.output(), "state rebuilt from streams") {
				return false, p.name + " has not logged 'state rebuilt from streams'"
			}
			return true, ""
		})
		return p
	}
	alive := func() []*proc { return append(slices.Clone(others), placements[len(placements)-1]) }

	placement := startPlacement()
	js := jsConnect(t, url)
	waitFor(t, 30*time.Second, func() (bool, string) {
		mustBeAlive(t, alive()...)
		for _, c := range []struct{ stream, durable string }{
			{streamJobs, durableAnalysis},
			{streamJobs, durablePlacementAnalyzed},
			{streamJobs, durablePlacementFinished},
			{streamPlacement, durableOptimizerDecided},
		} {
			if ok, why := consumerExists(js, c.stream, c.durable); !ok {
				return false, why
			}
		}
		return consumerDrained(js, streamTopology, durablePlacementTopology, nodes)
	})
	t.Logf("services ready after %s", time.Since(start).Round(time.Millisecond))

	fin := startFinisher(t, js, rand.New(rand.NewPCG(seed, 2)), finishShare)

	// submit publishes jobs asynchronously; wait collects the PubAcks.
	var futures []jetstream.PubAckFuture
	submit := func(batch []sigkillJob) {
		t.Helper()
		for _, j := range batch {
			body, err := json.Marshal(j)
			if err != nil {
				t.Fatal(err)
			}
			f, err := js.PublishAsync(subjectSubmitted, body, jetstream.WithMsgID("e2e-sigkill-submit-"+j.JobID))
			if err != nil {
				t.Fatalf("publish %s: %v", j.JobID, err)
			}
			futures = append(futures, f)
		}
	}
	waitAcks := func() {
		t.Helper()
		select {
		case <-js.PublishAsyncComplete():
		case <-time.After(20 * time.Second):
			t.Fatalf("submissions not acknowledged after 20s")
		}
		for _, f := range futures {
			select {
			case <-f.Ok():
			case err := <-f.Err():
				t.Fatalf("submission %s: %v", f.Msg().Header.Get("Nats-Msg-Id"), err)
			case <-time.After(10 * time.Second):
				t.Fatalf("submission %s: no PubAck after 10s", f.Msg().Header.Get("Nats-Msg-Id"))
			}
		}
		futures = nil // each future's answer can be read once
	}
	// grown waits until the placement stream holds at least n more
	// decisions (and at least more messages) than before.
	grown := func(what string, before map[string]uint64, decided, msgs uint64) map[string]uint64 {
		t.Helper()
		var now map[string]uint64
		// Up to AckWait (30s) and then some: what a killed process held
		// comes back only then.
		waitFor(t, 45*time.Second, func() (bool, string) {
			mustBeAlive(t, alive()...)
			now = placementCounts(t, js)
			if now[subjectDecided] < before[subjectDecided]+decided || now["total"] < before["total"]+msgs {
				return false, fmt.Sprintf("%s: placement stream %v, waiting for %d more decisions and %d more messages than %v; %v",
					what, now, decided, msgs, before, fin)
			}
			return true, ""
		})
		return now
	}
	kill := func(p *proc) {
		t.Helper()
		p.signal(t, syscall.SIGKILL)
		killedBySIGKILL(t, p)
		c := placementCounts(t, js)
		var inFlight []string
		for _, d := range []string{durablePlacementAnalyzed, durablePlacementFinished} {
			if ci, err := consumerInfo(js, streamJobs, d); err == nil {
				inFlight = append(inFlight, fmt.Sprintf("%s: %d unacknowledged, %d undelivered", d, ci.NumAckPending, ci.NumPending))
			}
		}
		t.Logf("%s SIGKILLed at %s: placement stream %v, %d finishes so far; %s",
			p.name, time.Since(start).Round(time.Millisecond), c, fin.count(), strings.Join(inFlight, "; "))
	}

	// First part of the burst; kill once placement is deciding, while the
	// next part is arriving.
	submit(jobs[:150])
	grown("first decisions", map[string]uint64{}, 10, 0)
	submit(jobs[150:250])
	kill(placement)
	submit(jobs[250:330]) // while no placement runs
	waitAcks()

	// A new placement on the same NATS: it must carry on and decide more.
	placement = startPlacement()
	before := placementCounts(t, js)
	submit(jobs[330:420])
	fin.finishSome(5)
	grown("after the first restart", before, 3, 40)
	fin.finishSome(5) // releases and retries in flight when it dies
	kill(placement)

	// And once more. This placement stays up to the end: alive() watches
	// it, the last of placements.
	startPlacement()
	before = placementCounts(t, js)
	submit(jobs[420:])
	waitAcks()
	fin.finishSome(5)
	grown("after the second restart", before, 3, 20)
	// Turn the cluster over until many jobs have been decided: finish
	// some live jobs, wait for the decisions they make room for.
	for c := placementCounts(t, js); c[subjectDecided] < minDecided; {
		// Every live job may be finished already, its finish held by a
		// killed process until AckWait brings it back: then only wait.
		fin.finishSome(8)
		c = grown("turnover", c, 1, 0)
	}
	fin.stop()
	t.Logf("burst submitted, %d jobs finished, at %s", fin.count(), time.Since(start).Round(time.Millisecond))

	// Everything handled: every durable of the pipeline is drained. What
	// the killed processes held unacknowledged comes back after AckWait.
	for _, c := range []struct {
		stream, durable string
		atLeast         uint64
	}{
		{streamJobs, durableAnalysis, total},
		{streamJobs, durablePlacementAnalyzed, 1},
		{streamJobs, durablePlacementFinished, uint64(fin.count())},
		{streamPlacement, durableOptimizerDecided, 1},
	} {
		waitFor(t, 50*time.Second, func() (bool, string) {
			mustBeAlive(t, alive()...)
			return consumerDrained(js, c.stream, c.durable, c.atLeast)
		})
	}
	t.Logf("drained at %s", time.Since(start).Round(time.Millisecond))

	// The whole log.
	evs := readPlacements(t, js)
	live, pending := auditPlacements(t, evs)
	count := map[string]map[string]int{}
	decidedAt, releasedAt := map[string]uint64{}, map[string]uint64{}
	for _, ev := range evs {
		if count[ev.jobID] == nil {
			count[ev.jobID] = map[string]int{}
		}
		count[ev.jobID][ev.subject]++
		switch ev.subject {
		case subjectDecided:
			decidedAt[ev.jobID] = ev.seq
			var d decidedJSON
			if err := json.Unmarshal(ev.body, &d); err != nil {
				t.Fatalf("decision #%d: %v", ev.seq, err)
			}
			j, ok := byID[d.JobID]
			if !ok {
				t.Errorf("decision #%d for %s, a job never submitted", ev.seq, d.JobID)
				continue
			}
			if len(d.Ranks) != j.GPUs {
				t.Errorf("decision #%d for %s: %d ranks, want %d", ev.seq, d.JobID, len(d.Ranks), j.GPUs)
			}
			if j.GPUsPerNode > 0 {
				for _, n := range d.Nodes {
					if len(n.GPUs) != j.GPUsPerNode {
						t.Errorf("decision #%d for %s: %d GPUs on %s, want %d per node",
							ev.seq, d.JobID, len(n.GPUs), n.Node, j.GPUsPerNode)
					}
				}
			}
		case subjectReleased:
			releasedAt[ev.jobID] = ev.seq
		}
	}
	for id := range count {
		if _, ok := byID[id]; !ok {
			t.Errorf("placement stream has events %v about %s, a job never submitted", count[id], id)
		}
	}
	finished := map[string]bool{}
	fin.mu.Lock()
	for id := range fin.finished {
		finished[id] = true
	}
	errs := fin.errs
	fin.mu.Unlock()
	for _, err := range errs {
		t.Error(err)
	}

	var nDecided, nRejected, nWaiting, nLive int
	for _, j := range jobs {
		c := count[j.JobID]
		dec, rej, pen, rel := c[subjectDecided], c[subjectRejected], c[subjectPending], c[subjectReleased]
		switch {
		case j.impossible:
			nRejected++
			if rej != 1 || dec+pen+rel != 0 {
				t.Errorf("%s (%d GPUs, %d per node) can never fit: events %v, want exactly one rejection",
					j.JobID, j.GPUs, j.GPUsPerNode, c)
			}
		case dec+rej+pen == 0:
			t.Errorf("%s (%d GPUs, %d per node): lost, no outcome in %s", j.JobID, j.GPUs, j.GPUsPerNode, streamPlacement)
		case rej > 0:
			t.Errorf("%s (%d GPUs, %d per node) fits the cluster but was rejected: events %v",
				j.JobID, j.GPUs, j.GPUsPerNode, c)
		case dec == 1:
			nDecided++
			if pen > 1 {
				t.Errorf("%s: %d pending events, want at most one", j.JobID, pen)
			}
			_, isLive := live[j.JobID]
			if finished[j.JobID] {
				if rel != 1 || isLive || releasedAt[j.JobID] < decidedAt[j.JobID] {
					t.Errorf("%s finished: events %v, live %v, decided at #%d, released at #%d; want one release after the decision",
						j.JobID, c, isLive, decidedAt[j.JobID], releasedAt[j.JobID])
				}
			} else {
				nLive++
				if rel != 0 || !isLive {
					t.Errorf("%s never finished: events %v, live %v; want it live and never released", j.JobID, c, isLive)
				}
			}
		case dec == 0:
			nWaiting++
			if pen != 1 || rel != 0 || !pending[j.JobID] {
				t.Errorf("%s not decided: events %v, pending at the end %v; want exactly one pending event",
					j.JobID, c, pending[j.JobID])
			}
		default: // dec > 1 is reported by auditPlacements
		}
	}
	for id := range finished {
		if count[id][subjectDecided] == 0 {
			t.Errorf("finished %s that was never decided", id)
		}
	}

	// No waiting job fits in what is free: the queue was retried after
	// the last release.
	free := map[string]int{}
	for i := 1; i <= nodes; i++ {
		free[fmt.Sprintf("gpu-%03d", i)] = perNode
	}
	for _, d := range live {
		for _, g := range d.gpus() {
			if _, ok := free[g.node]; !ok {
				t.Errorf("%s holds GPU %s/%d, a node not in the cluster file", d.JobID, g.node, g.gpu)
			}
			free[g.node]--
		}
	}
	totalFree := 0
	for _, n := range free {
		totalFree += n
	}
	for id := range pending {
		j := byID[id]
		fits := j.GPUs <= totalFree
		if j.GPUsPerNode > 0 {
			roomy := 0
			for _, n := range free {
				if n >= j.GPUsPerNode {
					roomy++
				}
			}
			fits = roomy >= j.GPUs/j.GPUsPerNode
		}
		if fits {
			t.Errorf("%s (%d GPUs, %d per node) still waits although it fits: free GPUs per node %v",
				id, j.GPUs, j.GPUsPerNode, free)
		}
	}

	// Only the killed processes died, and no one saw anything wrong.
	mustBeAlive(t, alive()...)
	for _, p := range append(slices.Clone(others[1:]), placements...) {
		for _, bad := range []string{"panic", "double booking", "allocation conflicts", "no analysis left", "level=ERROR"} {
			if lines := grepLines(p.output(), bad, 5); len(lines) > 0 {
				t.Errorf("%s logged %q, such as:\n%s", p.name, bad, strings.Join(lines, "\n"))
			}
		}
	}
	// What the optimizer called a double booking, against the log.
	explainDoubleBookings(t, others[3].output(), evs)
	if n := streamMessages(t, js, streamDLQ); n != 0 {
		t.Errorf("%s holds %d messages, want none", streamDLQ, n)
	}
	t.Logf("%d jobs: %d decided (%d finished, %d live), %d waiting, %d rejected; %d placement events; %d GPUs free; took %s",
		total, nDecided, len(finished), nLive, nWaiting, nRejected, len(evs), totalFree, time.Since(start).Round(time.Millisecond))
}

// grepLines returns up to n lines of out that hold text.
func grepLines(out, text string, n int) []string {
	var lines []string
	for line := range strings.Lines(out) {
		if strings.Contains(line, text) && len(lines) < n {
			lines = append(lines, strings.TrimRight(line, "\n"))
		}
	}
	return lines
}

// explainDoubleBookings fails the test for every double booking the
// optimizer logged, saying for each whether the placement log agrees: if
// the other job's release comes before the decision in the log, the
// optimizer saw the two out of order.
func explainDoubleBookings(t *testing.T, out string, evs []placementEvent) {
	t.Helper()
	decided, released := map[string]uint64{}, map[string]uint64{}
	for _, ev := range evs {
		switch ev.subject {
		case subjectDecided:
			decided[ev.jobID] = ev.seq
		case subjectReleased:
			released[ev.jobID] = ev.seq
		}
	}
	field := func(line, key string) string {
		i := strings.Index(line, " "+key+"=")
		if i < 0 {
			return ""
		}
		v, _, _ := strings.Cut(line[i+len(key)+2:], " ")
		return v
	}
	type pair struct{ job, other string }
	gpus := map[pair][]string{}
	var order []pair
	for line := range strings.Lines(out) {
		if !strings.Contains(line, "double booking") {
			continue
		}
		k := pair{field(line, "job_id"), field(line, "other_job_id")}
		if gpus[k] == nil {
			order = append(order, k)
		}
		gpus[k] = append(gpus[k], field(line, "node")+"/"+field(line, "gpu"))
	}
	var stale int
	for _, k := range order {
		rel, ok := released[k.other]
		switch {
		case ok && rel < decided[k.job]:
			stale++
			t.Errorf("optimizer: double booking of %v between %s and %s, but in %s %s was decided at #%d and released at #%d, "+
				"before %s was decided at #%d: the optimizer applied the decision before the release that freed its GPUs",
				gpus[k], k.job, k.other, streamPlacement, k.other, decided[k.other], rel, k.job, decided[k.job])
		default:
			t.Errorf("optimizer: double booking of %v between %s (decided at #%d) and %s (decided at #%d, released at #%d)",
				gpus[k], k.job, decided[k.job], k.other, decided[k.other], rel)
		}
	}
	if len(order) > 0 {
		t.Logf("optimizer: %d double bookings reported, %d of them contradicted by the order of %s", len(order), stale, streamPlacement)
	}
}
