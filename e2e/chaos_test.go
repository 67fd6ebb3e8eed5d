package e2e

import (
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The chaos soak's settings.
const (
	// chaosDefaultMinutes is the soak's length without
	// TOPOSCHED_E2E_CHAOS_MINUTES: with the start-up of the cluster and
	// the final drain, about 60 to 90 s on two cores.
	chaosDefaultMinutes = 0.7
	// chaosProgressBound is how soon after a fault's recovery the log
	// must hold a new decision (or a pending, when nothing fits): generous
	// for two loaded cores, and above AckWait (30 s), after which what a
	// killed process held comes back.
	chaosProgressBound = 60 * time.Second
	// chaosRecoveryBound bounds each recovery: a restarted process up, a
	// NATS node caught up, a placement replica leading.
	chaosRecoveryBound = 60 * time.Second
	// chaosCheckBound bounds each check that waits for the system to
	// settle: the leader's store agreeing with the log, a probe's outcome.
	chaosCheckBound = 60 * time.Second
	// chaosLeaseTTL is the placement replicas' --lease-ttl.
	chaosLeaseTTL = 3 * time.Second
	// chaosSubmitEvery paces the launcher: one submission per tick.
	chaosSubmitEvery = 200 * time.Millisecond

	chaosNodes, chaosPerNode = 16, 8 // testdata/sixteen-nodes.yaml
	chaosProbePrefix         = "chaos-probe-"
	streamLeases             = "KV_toposched-leases"
	subjectMigrationRefused  = "toposched.placement.migration_refused"
	// headerFence is the fence JetStream checked a placement outcome
	// against: the stream sequence of the term marker its publisher held.
	headerFence = "Nats-Expected-Last-Subject-Sequence"
	// placementSource is placement's ce-source; a replica's name follows
	// it after a colon where the binary names its replicas.
	placementSource = "urn:toposched:placement"
)

// chaosOutcomes are the subjects placement's leader publishes fenced on its
// term marker. (placement.migration is the optimizer's proposal.)
var chaosOutcomes = map[string]bool{
	subjectDecided: true, subjectPending: true, subjectRejected: true, subjectReleased: true,
	subjectMigrationRefused: true,
}

// The fault kinds.
const (
	faultNATS      = "nats"
	faultLeader    = "placement leader"
	faultStandby   = "placement standby"
	faultAnalysis  = "analysis"
	faultOptimizer = "optimizer"
	faultDiscovery = "discovery"
	faultStop      = "sigstop leader"
)

// TestChaosSoak runs the deployment of TestClusterReplicasSIGKILL (a 3-node
// JetStream cluster on deploy/nats, two replicas of every service) under a
// steady load of submissions and finishes, and injects a fault every few
// seconds on a seeded schedule: SIGKILL and restart, with the same flags, of
// a NATS node, the placement leader, the placement standby, or a replica of
// analysis, optimizer or discovery; SIGSTOP of the placement leader for
// longer than its lease TTL, then SIGCONT. After each recovery it waits for
// progress and checks the invariants; at the end it drains the pipeline and
// checks the whole placement log. TOPOSCHED_E2E_CHAOS_MINUTES sets its
// length, TOPOSCHED_E2E_SEED its seed.
//
// What it checks, continuously over the placement log as it grows and
// again over the whole log at the end:
//   - fencing: every outcome lies after a term marker and was stored fenced
//     on that very marker (its Nats-Expected-Last-Subject-Sequence header),
//     so that no replica without the lease got an outcome stored; where
//     ce-source names a replica, it is the marker's holder; lease
//     revisions grow from term to term;
//   - no GPU in two live decisions, no job decided twice, no release of
//     GPUs a job does not hold, no decision after a withdrawal;
//   - the log and the leader's decisions agree: a job is put pending only
//     when the log, replayed up to that point, has no room for it (with no
//     policies and no reservation, room is all that decides), and a
//     decision takes only GPUs the log has free;
//
// after each recovery:
//   - progress: a decision (or a pending) within chaosProgressBound;
//   - the leader's store equals the log: its free GPUs and its placed,
//     pending and finished jobs (its /metrics) equal the log's,
//     no waiting job fits in what the log has free, and a fresh probe job
//     asking for exactly the GPUs the log has free is placed on them;
//
// at the end:
//   - every submitted job has exactly one final outcome (decided once,
//     rejected once, still pending, or withdrawn), none lost, and a
//     release for every job finished;
//   - auditPlacements over the whole log, an empty dead-letter stream, and
//     no process that logged "panic" or "allocation conflicts".
func TestChaosSoak(t *testing.T) {
	if testing.Short() {
		t.Skip("the chaos soak runs the real binaries on a 3-node NATS cluster for TOPOSCHED_E2E_CHAOS_MINUTES minutes " +
			fmt.Sprintf("(default %v); skipped with -short", chaosDefaultMinutes))
	}
	needBinaries(t)
	t.Parallel()
	start := time.Now()
	minutes := chaosDefaultMinutes
	if s := os.Getenv("TOPOSCHED_E2E_CHAOS_MINUTES"); s != "" {
		v, err := strconv.ParseFloat(s, 64)
		if err != nil || v <= 0 {
			t.Fatalf("TOPOSCHED_E2E_CHAOS_MINUTES=%s: want a positive number of minutes", s)
		}
		minutes = v
	}
	soak := time.Duration(minutes * float64(time.Minute))
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("TOPOSCHED_E2E_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("TOPOSCHED_E2E_SEED=%s: %v", s, err)
		}
		seed = v
	}
	t.Logf("chaos soak for %s (TOPOSCHED_E2E_CHAOS_MINUTES=%v), seed %d (rerun with TOPOSCHED_E2E_SEED=%d)",
		soak, minutes, seed, seed)
	// Enough jobs for the launcher's pace, and then some.
	jobs := sigkillBurst(rand.New(rand.NewPCG(seed, 1)), int(soak/chaosSubmitEvery)+1000, chaosNodes, chaosPerNode)
	faultRNG := rand.New(rand.NewPCG(seed, 3))

	c := startChaosCluster(t, start)
	lg := &chaosLog{r: chaosReader{js: c.js}}
	ld := newChaosLoad(c.launcher.js, jobs, seed)
	lg.c = newChaosChecker(ld.spec)
	lg.onEvent = ld.onEvent
	lg.follow()
	var faults []string
	t.Cleanup(func() {
		lg.stopFollow()
		if t.Failed() {
			lg.dump(t, faults)
		}
	})
	ld.run()
	t.Cleanup(ld.stop)
	waitFor(t, chaosCheckBound, func() (bool, string) {
		c.mustBeAlive()
		if _, ok := lg.progressAfter(time.Time{}); !ok {
			return false, "no decision yet: " + lg.status()
		}
		return true, ""
	})
	chaosStart := time.Now()
	t.Logf("load running at %s: %s", since(start), lg.status())

	sched := &chaosSchedule{rng: faultRNG}
	for n := 1; ; n++ {
		// The schedule's pacing: a few seconds of plain load between faults.
		time.Sleep(time.Duration(2000+faultRNG.IntN(3000)) * time.Millisecond)
		if time.Since(chaosStart) >= soak {
			break
		}
		kind := sched.next()
		desc, recovered := c.inject(n, kind, faultRNG, lg)
		faults = append(faults, desc)
		lg.flush(t)
		// Progress: a new decision, or a pending when nothing fits,
		// from the load (not the probes) after the recovery.
		waitFor(t, chaosProgressBound-time.Since(recovered), func() (bool, string) {
			c.mustBeAlive()
			if _, ok := lg.progressAfter(recovered); !ok {
				return false, fmt.Sprintf("fault %d (%s): no decision or pending since the recovery %s ago: %s",
					n, desc, since(recovered), lg.status())
			}
			return true, ""
		})
		m, _ := lg.progressAfter(recovered)
		t.Logf("progress after fault %d: %s of %s at #%d, %s after the recovery", n,
			strings.TrimPrefix(m.subject, "toposched."), m.jobID, m.seq, m.at.Sub(recovered).Round(time.Millisecond))
		c.checkpoint(fmt.Sprintf("after recovery from fault %d", n), n, ld, lg)
	}

	// The end: the launcher stops, the pipeline drains.
	ld.stop()
	submitted := ld.submittedIDs()
	t.Logf("soak over at %s after %d faults; %d jobs submitted, %d finishes; draining", since(start), len(faults),
		len(submitted), ld.finishCount())
	for _, d := range []struct {
		stream, durable string
		atLeast         uint64
	}{
		{streamJobs, durableAnalysis, uint64(len(submitted))},
		{streamJobs, durablePlacementAnalyzed, 1},
		{streamJobs, durablePlacementFinished, 1},
	} {
		waitFor(t, 90*time.Second, func() (bool, string) {
			c.mustBeAlive()
			return consumerDrained(c.js, d.stream, d.durable, d.atLeast)
		})
	}
	t.Logf("drained at %s", since(start))
	// The optimizers are no part of placement's invariants, but a consumer
	// of theirs that never drains is a fault of its own: reported, after
	// AckWait and a few redeliveries, without stopping the audit.
	c.optimizerDrained(time.Now().Add(40 * time.Second))
	c.checkpoint("at the end", len(faults)+1, ld, lg)
	lg.stopFollow()
	lg.flush(t)
	c.finalAudit(lg, ld, faults)
	t.Logf("took %s", since(start))
}

// since is the time since t, rounded for the log.
func since(t time.Time) time.Duration { return time.Since(t).Round(100 * time.Millisecond) }

// chaosSchedule picks the faults: first the three that move or threaten the
// lease and the streams (a NATS node, the leader's SIGKILL, the leader's
// SIGSTOP) in a seeded order, so that even the default length has them,
// then every kind, shuffled, round after round.
type chaosSchedule struct {
	rng   *rand.Rand
	queue []string
	round int
}

func (s *chaosSchedule) next() string {
	if len(s.queue) == 0 {
		kinds := []string{faultNATS, faultLeader, faultStop, faultStandby, faultAnalysis, faultOptimizer, faultDiscovery}
		if s.round == 0 {
			kinds = kinds[:3]
		}
		s.round++
		s.rng.Shuffle(len(kinds), func(i, j int) { kinds[i], kinds[j] = kinds[j], kinds[i] })
		s.queue = kinds
	}
	k := s.queue[0]
	s.queue = s.queue[1:]
	return k
}
