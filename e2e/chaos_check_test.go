package e2e

// The chaos soak's checks against the running system: the checkpoint after
// each recovery, the optimizers' drain, the final audit, and the scrape of a
// placement replica's store from its /metrics.

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// checkpoint checks, with the launcher paused, that the leader's store is
// what the log says and that a probe job asking for exactly the GPUs the
// log has free is placed on them.
//
// There is no store API over the wire, so the check is in two parts. The
// leader's /metrics give its store's counts: free GPUs, and placed,
// pending and finished jobs. They must equal the log's, read
// before and after the scrape with nothing stored in between; the wait
// allows for handlers in flight (a decision is allocated a moment before it
// is stored) and for redeliveries of what a killed process held. Counts
// alone would miss a store that is free where the log is held and held
// where the log is free, so a probe job then asks for all the free GPUs:
// the leader can place it only on the GPUs its store has free, and the log
// check (no GPU in two live decisions) fails if any of them is held in the
// log; placed on free GPUs of the log, as many as the log has, it proves
// the two sets equal. If the log has none free, the probe asks for one and
// must wait. The probe is then finished (or withdrawn), and the launcher
// goes on.
func (c *chaosCluster) checkpoint(what string, n int, ld *chaosLoad, lg *chaosLog) {
	t := c.t
	t.Helper()
	ld.pause()
	defer ld.resume()
	var leader string
	var snap chaosSnapshot
	var st chaosStore
	waitFor(t, chaosCheckBound, func() (bool, string) {
		c.mustBeAlive()
		// Everything the launcher sent is delivered (what a killed
		// process holds may still wait for AckWait), so that little is
		// in flight when the probe comes.
		for _, d := range []struct{ stream, durable string }{
			{streamJobs, durableAnalysis},
			{streamJobs, durablePlacementAnalyzed},
			{streamJobs, durablePlacementFinished},
		} {
			ci, err := consumerInfo(c.js, d.stream, d.durable)
			if err != nil {
				return false, fmt.Sprintf("consumer %s: %v", d.durable, err)
			}
			if ci.NumPending > 0 {
				return false, fmt.Sprintf("consumer %s: %d undelivered", d.durable, ci.NumPending)
			}
		}
		before, err := lg.syncSnapshot()
		if err != nil {
			return false, fmt.Sprintf("read %s: %v", streamPlacement, err)
		}
		var why string
		if leader, why = c.leader(); why != "" {
			return false, why
		}
		if st, err = scrapePlacement(c.metrics[leader]); err != nil {
			return false, err.Error()
		}
		if snap, err = lg.syncSnapshot(); err != nil {
			return false, fmt.Sprintf("read %s: %v", streamPlacement, err)
		}
		if snap.seq != before.seq {
			return false, fmt.Sprintf("the log moved from #%d to #%d during the scrape", before.seq, snap.seq)
		}
		// Rejections are not compared: analysis publishes some, which
		// the leader's store learns of only when a term rebuilds.
		want := chaosStore{leader: true, known: true, free: snap.free, placed: snap.placed, pending: snap.pending,
			rejected: st.rejected, finished: snap.finished}
		if st != want {
			return false, fmt.Sprintf("leader %s's store %s, the log (up to #%d) %s", leader, st, snap.seq, want)
		}
		if len(snap.fits) > 0 {
			return false, fmt.Sprintf("the log (up to #%d) has %d GPUs free, yet %v wait though they fit", snap.seq, snap.free, snap.fits)
		}
		return true, ""
	})
	// The probe.
	id := fmt.Sprintf("%s%d", chaosProbePrefix, n)
	need := max(snap.free, 1)
	ld.submit(t, sigkillJob{JobID: id, GPUs: need})
	var out chaosMsg
	waitFor(t, chaosCheckBound, func() (bool, string) {
		c.mustBeAlive()
		var ok bool
		if out, ok = lg.outcomeOf(id); !ok {
			return false, fmt.Sprintf("probe %s (%d GPUs): no outcome yet: %s", id, need, lg.status())
		}
		return true, ""
	})
	var probe string
	status := "succeeded"
	switch out.subject {
	case subjectDecided:
		free := lg.probeFree(id)
		probe = fmt.Sprintf("probe %s placed at #%d on %d GPUs, free in the log before it: %d", id, out.seq, need, free)
		if snap.free == 0 {
			// A finish redelivered since the check freed some.
			probe += " (none were free at the check)"
		}
	case subjectPending:
		status = "cancelled"
		probe = fmt.Sprintf("probe %s (%d GPUs) pending at #%d", id, need, out.seq)
		if snap.free > 0 {
			// The continuous check has said whether the log had room at
			// the pending's point: a redelivered job may have taken the
			// free GPUs since the check.
			probe += " (the log's free GPUs changed since the check)"
		}
	default:
		t.Errorf("%s: probe %s (%d GPUs): %s at #%d: %s", what, id, need, out.subject, out.seq, out.data)
	}
	ld.finish(t, id, status)
	waitFor(t, chaosCheckBound, func() (bool, string) {
		c.mustBeAlive()
		if !lg.released(id) {
			return false, fmt.Sprintf("probe %s finished, no release yet: %s", id, lg.status())
		}
		return true, ""
	})
	lg.flush(t)
	verdict := "ok"
	if v := lg.violationCount(); v > 0 {
		verdict = fmt.Sprintf("%d violations in the log so far", v)
	}
	t.Logf("invariants %s: %s (log #%d: %d GPUs free, %d placed, %d pending, %d rejected, %d finished; leader %s's store agrees; %s; fences: %s)",
		what, verdict, snap.seq, snap.free, snap.placed, snap.pending, snap.rejected, snap.finished, leader, probe, lg.fences())
}

// optimizerDrained reports an optimizer-placement consumer that has not
// drained by deadline, with what the optimizers logged about it.
func (c *chaosCluster) optimizerDrained(deadline time.Time) {
	t := c.t
	t.Helper()
	var why string
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		var ok bool
		if ok, why = consumerDrained(c.js, streamPlacement, durableOptimizerDecided, 1); ok {
			return
		}
		if time.Now().After(deadline) {
			break
		}
		<-tick.C
	}
	var lines []string
	for _, p := range c.all {
		if strings.HasPrefix(p.name, "optimizer") {
			for _, l := range grepLines(p.output(), "Handler returned error", 5) {
				lines = append(lines, p.name+": "+l)
			}
		}
	}
	t.Errorf("the optimizers do not drain: %s; they logged:\n%s", why, strings.Join(lines, "\n"))
}

// finalAudit checks the whole log once more, read afresh, and every job's
// outcome.
func (c *chaosCluster) finalAudit(lg *chaosLog, ld *chaosLoad, faults []string) {
	t := c.t
	t.Helper()
	r := chaosReader{js: c.js}
	waitFor(t, 30*time.Second, func() (bool, string) {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if _, err := r.readMore(ctx); err != nil {
			return false, fmt.Sprintf("read %s afresh: %v", streamPlacement, err)
		}
		return true, ""
	})
	lg.mu.Lock()
	followed := slices.Clone(lg.r.msgs)
	lg.mu.Unlock()
	if len(followed) != len(r.msgs) {
		t.Errorf("the follower read %d messages of %s, a fresh read %d", len(followed), streamPlacement, len(r.msgs))
	}
	fresh := newChaosChecker(ld.spec)
	var evs []placementEvent
	for _, m := range r.msgs {
		fresh.apply(m)
		if m.subject != subjectTerm {
			evs = append(evs, placementEvent{seq: m.seq, subject: m.subject, jobID: m.jobID, body: m.data})
		}
	}
	lg.mu.Lock()
	seen := map[string]bool{}
	for _, v := range lg.c.violations {
		seen[v] = true
	}
	lg.mu.Unlock()
	for _, v := range fresh.violations {
		if !seen[v] {
			t.Errorf("placement log: %s", v)
		}
	}
	fresh.finishFences(t)
	live, pending := auditPlacements(t, evs)

	// Every job's outcome.
	submitted := ld.submittedIDs()
	finished := ld.finishedJobs()
	known := map[string]bool{}
	var nDecided, nFinished, nLive, nRejected, nWaiting, nWithdrawn, nProbes int
	for _, id := range submitted {
		known[id] = true
		if strings.HasPrefix(id, chaosProbePrefix) {
			nProbes++
		}
		j, _ := ld.spec(id)
		cnt := fresh.count[id]
		dec, rej, pen, rel := cnt[subjectDecided], cnt[subjectRejected], cnt[subjectPending], cnt[subjectReleased]
		status, byUs := finished[id]
		desc := fmt.Sprintf("%s (%d GPUs, %d per node; finished by the launcher: %q)", id, j.GPUs, j.GPUsPerNode, status)
		switch {
		case dec+rej+pen+rel == 0:
			t.Errorf("%s: lost, no outcome in %s", desc, streamPlacement)
		case rej > 0:
			nRejected++
			if !j.impossible {
				t.Errorf("%s fits the cluster but was rejected: events %v", desc, cnt)
			}
			// Analysis rejects an invalid job whatever placement did:
			// one cancelled early is both withdrawn and rejected.
			withdrawn := byUs && rel == 1
			if rej > 1 || dec+pen > 0 || (rel > 0 && !withdrawn) {
				t.Errorf("%s: events %v, want exactly one rejection", desc, cnt)
			}
		case dec > 0:
			nDecided++
			_, isLive := live[id]
			if pen > 1 || dec > 1 {
				t.Errorf("%s: events %v, want one decision after at most one pending", desc, cnt)
			}
			if byUs {
				nFinished++
				if rel != 1 || isLive {
					t.Errorf("%s: events %v, live %v; want one release after the decision", desc, cnt, isLive)
				}
			} else {
				nLive++
				if rel != 0 || !isLive {
					t.Errorf("%s never finished: events %v, live %v; want it live", desc, cnt, isLive)
				}
			}
		case rel > 0:
			nWithdrawn++
			if !byUs || rel > 1 || pen > 1 {
				t.Errorf("%s: events %v, want a withdrawal (one release, no decision) of a job the launcher cancelled", desc, cnt)
			}
		default:
			nWaiting++
			if byUs || pen != 1 || !pending[id] {
				t.Errorf("%s: events %v, pending at the end %v; want exactly one pending event and still waiting", desc, cnt, pending[id])
			}
		}
	}
	for id, cnt := range fresh.count {
		if !known[id] {
			t.Errorf("%s has events %v about %s, a job never submitted", streamPlacement, cnt, id)
		}
	}
	// Nothing lost on the way in either.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	jst, err := c.js.Stream(ctx, streamJobs)
	if err != nil {
		t.Fatal(err)
	}
	info, err := jst.Info(ctx, jetstream.WithSubjectFilter(subjectSubmitted))
	if err != nil {
		t.Fatal(err)
	}
	if got := info.State.Subjects[subjectSubmitted]; got != uint64(len(submitted)) {
		t.Errorf("%s holds %d submissions, the launcher had %d acknowledged", streamJobs, got, len(submitted))
	}
	if n := streamMessages(t, c.js, streamDLQ); n != 0 {
		t.Errorf("%s holds %d messages, want none", streamDLQ, n)
	}
	for _, err := range ld.errors() {
		t.Error(err)
	}
	c.mustBeAlive()
	for _, p := range c.all {
		for _, bad := range []string{"panic", "allocation conflicts"} {
			if lines := grepLines(p.output(), bad, 5); len(lines) > 0 {
				t.Errorf("%s logged %q, such as:\n%s", p.name, bad, strings.Join(lines, "\n"))
			}
		}
	}
	var optimizer strings.Builder
	for _, p := range c.all {
		if strings.HasPrefix(p.name, "optimizer") {
			optimizer.WriteString(p.output())
		}
	}
	if n := strings.Count(optimizer.String(), "double booking"); n > 0 {
		t.Logf("note: the optimizers logged %d double bookings (their view, not placement's log; not an invariant of this test)", n)
	}
	t.Logf("%d faults: %s", len(faults), strings.Join(faults, "; "))
	t.Logf("%d jobs (%d probes): %d decided (%d finished, %d live), %d waiting, %d withdrawn, %d rejected; "+
		"%d placement events, %d terms; fences: %s", len(submitted), nProbes, nDecided, nFinished, nLive, nWaiting,
		nWithdrawn, nRejected, len(r.msgs), len(fresh.markers), fresh.fenceSummary())
}

// chaosStore is what a placement replica's /metrics say of its store.
type chaosStore struct {
	leader, known                             bool
	free, placed, pending, rejected, finished int
}

func (s chaosStore) String() string {
	return fmt.Sprintf("{%d GPUs free, %d placed, %d pending, %d finished}", s.free, s.placed, s.pending, s.finished)
}

// scrapePlacement reads a placement replica's /metrics.
func scrapePlacement(addr string) (chaosStore, error) {
	var st chaosStore
	client := http.Client{Timeout: 2 * time.Second}
	resp, err := client.Get("http://" + addr + "/metrics")
	if err != nil {
		return st, err
	}
	body, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if err != nil {
		return st, err
	}
	if resp.StatusCode != http.StatusOK {
		return st, fmt.Errorf("GET %s/metrics: %s", addr, resp.Status)
	}
	for line := range strings.Lines(string(body)) {
		name, val, ok := strings.Cut(strings.TrimSpace(line), " ")
		if !ok || strings.HasPrefix(name, "#") {
			continue
		}
		v, err := strconv.ParseFloat(val, 64)
		if err != nil {
			continue
		}
		switch name {
		case "toposched_placement_leader":
			st.leader = v == 1
		case `toposched_store_gpus{kind="free"}`:
			st.known, st.free = true, int(v)
		case `toposched_store_jobs{state="placed"}`:
			st.placed = int(v)
		case `toposched_store_jobs{state="pending"}`:
			st.pending = int(v)
		case `toposched_store_jobs{state="rejected"}`:
			st.rejected = int(v)
		case `toposched_store_jobs{state="finished"}`:
			st.finished = int(v)
		}
	}
	return st, nil
}
