package e2e

// The chaos soak's load: the launcher that submits jobs and finishes them as
// their outcomes come.

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// chaosLoad is the launcher: it submits one job per tick and finishes jobs
// as their outcomes come: most decided jobs after a short run, a few never
// (at most chaosLongJobs at a time), half the pending ones cancelled after
// a while, and now and then a job cancelled right after its submission,
// before analysis may have seen it.
type chaosLoad struct {
	gate sync.Mutex // held by each tick; pause holds it
	mu   sync.Mutex
	js   jetstream.JetStream
	// tickRNG is the launcher's, eventRNG the follower's (each under mu).
	tickRNG, eventRNG *rand.Rand
	jobs              []sigkillJob
	next              int
	specs             map[string]sigkillJob // every job submitted or being submitted
	submitted         []string              // acknowledged, in order
	finished          map[string]string     // acknowledged finishes: status by job
	scheduled         map[string]bool       // a finish is due or sent
	due               []chaosDue
	long              map[string]bool
	errs              []error
	stopOnce          sync.Once
	stopCh, done      chan struct{}
}

// chaosLongJobs bounds the jobs that run to the end of the soak, so that
// the cluster keeps turning over.
const chaosLongJobs = 4

type chaosDue struct {
	at          time.Time
	job, status string
}

func newChaosLoad(js jetstream.JetStream, jobs []sigkillJob, seed uint64) *chaosLoad {
	return &chaosLoad{js: js, jobs: jobs, tickRNG: rand.New(rand.NewPCG(seed, 4)), eventRNG: rand.New(rand.NewPCG(seed, 5)),
		specs: map[string]sigkillJob{}, finished: map[string]string{}, scheduled: map[string]bool{}, long: map[string]bool{}}
}

func (ld *chaosLoad) run() {
	ld.stopCh, ld.done = make(chan struct{}), make(chan struct{})
	go func() {
		defer close(ld.done)
		tick := time.NewTicker(chaosSubmitEvery)
		defer tick.Stop()
		for {
			select {
			case <-ld.stopCh:
				return
			case <-tick.C:
				ld.tick()
			}
		}
	}()
}

// stop ends the launcher; nothing is published after it returns.
func (ld *chaosLoad) stop() {
	ld.stopOnce.Do(func() {
		if ld.stopCh != nil {
			close(ld.stopCh)
			<-ld.done
		}
	})
}

func (ld *chaosLoad) pause()  { ld.gate.Lock() }
func (ld *chaosLoad) resume() { ld.gate.Unlock() }

func (ld *chaosLoad) spec(id string) (sigkillJob, bool) {
	ld.mu.Lock()
	defer ld.mu.Unlock()
	j, ok := ld.specs[id]
	return j, ok
}

func (ld *chaosLoad) fail(err error) {
	ld.mu.Lock()
	ld.errs = append(ld.errs, err)
	ld.mu.Unlock()
}

// tick submits the next job and sends the finishes that are due.
func (ld *chaosLoad) tick() {
	ld.gate.Lock()
	defer ld.gate.Unlock()
	ld.mu.Lock()
	var j sigkillJob
	more := ld.next < len(ld.jobs)
	if more {
		j = ld.jobs[ld.next]
		ld.next++
	}
	ld.mu.Unlock()
	if more {
		if err := ld.publishJob(j); err != nil {
			ld.fail(err)
		} else {
			ld.mu.Lock()
			if ld.tickRNG.Float64() < 0.03 {
				// Withdrawn at once: analysis may not have seen it yet.
				ld.scheduled[j.JobID] = true
				ld.due = append(ld.due, chaosDue{time.Now().Add(time.Duration(ld.tickRNG.IntN(300)) * time.Millisecond), j.JobID, "cancelled"})
			}
			ld.mu.Unlock()
		}
	}
	now := time.Now()
	ld.mu.Lock()
	var send []chaosDue
	keep := ld.due[:0]
	for _, d := range ld.due {
		if d.at.After(now) {
			keep = append(keep, d)
		} else {
			send = append(send, d)
		}
	}
	ld.due = keep
	ld.mu.Unlock()
	for _, d := range send {
		if err := ld.publishFinish(d.job, d.status); err != nil {
			ld.fail(err)
		}
	}
}

// onEvent schedules finishes as the log tells of decisions and pendings.
func (ld *chaosLoad) onEvent(m chaosMsg) {
	if strings.HasPrefix(m.jobID, chaosProbePrefix) {
		return
	}
	ld.mu.Lock()
	defer ld.mu.Unlock()
	if _, ours := ld.specs[m.jobID]; !ours {
		return
	}
	after := func(lo, hi time.Duration) time.Time {
		return time.Now().Add(lo + time.Duration(ld.eventRNG.Int64N(int64(hi-lo))))
	}
	switch m.subject {
	case subjectDecided:
		if ld.scheduled[m.jobID] {
			return
		}
		if ld.eventRNG.Float64() < 0.85 || len(ld.long) >= chaosLongJobs {
			ld.scheduled[m.jobID] = true
			ld.due = append(ld.due, chaosDue{after(500*time.Millisecond, 4*time.Second), m.jobID, "succeeded"})
		} else {
			ld.long[m.jobID] = true
		}
	case subjectPending:
		if !ld.scheduled[m.jobID] && ld.eventRNG.Float64() < 0.5 {
			ld.scheduled[m.jobID] = true
			ld.due = append(ld.due, chaosDue{after(time.Second, 5*time.Second), m.jobID, "cancelled"})
		}
	case subjectReleased:
		delete(ld.long, m.jobID)
	}
}

func (ld *chaosLoad) publishJob(j sigkillJob) error {
	ld.mu.Lock()
	ld.specs[j.JobID] = j
	ld.mu.Unlock()
	body, err := json.Marshal(j)
	if err != nil {
		return err
	}
	if err := chaosPublish(ld.js, subjectSubmitted, body, "e2e-chaos-submit-"+j.JobID); err != nil {
		return fmt.Errorf("launcher: submit %s: %w", j.JobID, err)
	}
	ld.mu.Lock()
	ld.submitted = append(ld.submitted, j.JobID)
	ld.mu.Unlock()
	return nil
}

func (ld *chaosLoad) publishFinish(job, status string) error {
	body := fmt.Sprintf(`{"job_id":%q,"status":%q}`, job, status)
	if err := chaosPublish(ld.js, subjectFinished, []byte(body), "e2e-chaos-finish-"+job); err != nil {
		return fmt.Errorf("launcher: finish %s (%s): %w", job, status, err)
	}
	ld.mu.Lock()
	ld.finished[job] = status
	ld.mu.Unlock()
	return nil
}

// submit and finish publish for the test itself (the probes), failing it
// on an error.
func (ld *chaosLoad) submit(t *testing.T, j sigkillJob) {
	t.Helper()
	if err := ld.publishJob(j); err != nil {
		t.Fatal(err)
	}
}

func (ld *chaosLoad) finish(t *testing.T, job, status string) {
	t.Helper()
	if err := ld.publishFinish(job, status); err != nil {
		t.Fatal(err)
	}
}

func (ld *chaosLoad) submittedIDs() []string {
	ld.mu.Lock()
	defer ld.mu.Unlock()
	return slices.Clone(ld.submitted)
}

func (ld *chaosLoad) finishedJobs() map[string]string {
	ld.mu.Lock()
	defer ld.mu.Unlock()
	out := map[string]string{}
	for k, v := range ld.finished {
		out[k] = v
	}
	return out
}

func (ld *chaosLoad) finishCount() int {
	ld.mu.Lock()
	defer ld.mu.Unlock()
	return len(ld.finished)
}

func (ld *chaosLoad) errors() []error {
	ld.mu.Lock()
	defer ld.mu.Unlock()
	return slices.Clone(ld.errs)
}

// chaosPublish publishes as a launcher would through a fault: again under
// the same message id (JetStream stores it once) with a backoff, for up to
// a minute.
func chaosPublish(js jetstream.JetStream, subject string, body []byte, msgID string) error {
	deadline := time.Now().Add(60 * time.Second)
	for wait := 100 * time.Millisecond; ; wait = min(2*wait, 2*time.Second) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := js.Publish(ctx, subject, body, jetstream.WithMsgID(msgID))
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return err
		}
		time.Sleep(wait) // the backoff between retries of one publish
	}
}
