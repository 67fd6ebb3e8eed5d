package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
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

// chaosCluster is the deployment under test: the NATS nodes and the
// services, each under its role name ("nats-2", "placement-a"), with the
// process now running it.
type chaosCluster struct {
	t        *testing.T
	start    time.Time
	procs    map[string]*proc
	down     map[string]bool // killed and not yet restarted
	lives    map[string]int  // incarnations started per role
	all      []*proc         // every process started, in order
	metrics  map[string]string
	js       jetstream.JetStream
	launcher *roleConn
}

// startChaosCluster starts the NATS cluster and the services as
// TestClusterReplicasSIGKILL does. The placement replicas also serve
// /metrics (the leader's store, read by the checks) and run with no
// policies and no reservation, so that whether a job fits is a matter of
// free GPUs alone, which the log tells.
func startChaosCluster(t *testing.T, start time.Time) *chaosCluster {
	t.Helper()
	c := &chaosCluster{t: t, start: start, procs: map[string]*proc{}, down: map[string]bool{},
		lives: map[string]int{}, metrics: map[string]string{}}
	nodes := natsCluster(t)
	for _, n := range nodes {
		c.add(n.name, n.p)
	}
	t.Logf("NATS cluster ready after %s", since(start))
	// The test's own connections: an operator's to audit, a launcher's
	// to submit and finish.
	nc, err := nats.Connect(clusterURL(nodes, 1), nats.UserInfo("operator", userPassword("operator")),
		nats.Timeout(5*time.Second), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	if c.js, err = jetstream.New(nc); err != nil {
		t.Fatal(err)
	}
	opEnv := asUser("operator")
	common := func(i int) []string {
		return []string{"--nats-url", clusterURL(nodes, i), "--nats-user", "operator", "--replicas", "3"}
	}
	for i, s := range []struct {
		name string
		args []string
	}{
		{"discovery-a", []string{"discovery", "--cluster", testdata(t, "sixteen-nodes.yaml"), "--poll", "0"}},
		{"discovery-b", []string{"discovery", "--cluster", testdata(t, "sixteen-nodes.yaml"), "--poll", "0"}},
		{"analysis-a", []string{"analysis"}},
		{"analysis-b", []string{"analysis"}},
		{"optimizer-a", []string{"optimizer"}},
		{"optimizer-b", []string{"optimizer"}},
	} {
		p := startProc(t, s.name, opEnv, bins.toposched, append(s.args, common(i)...)...)
		c.add(s.name, p)
		if i == 0 {
			// The first creates the R3 streams, the others find them.
			// And once they have their leaders and replicas: a service
			// whose first rebuild meets a stream without its leader yet
			// ("no responders") exits (seen with the optimizer).
			c.waitLogged(p, 0, "services running", 90*time.Second)
			waitFor(t, 90*time.Second, func() (bool, string) {
				c.mustBeAlive()
				return c.streamsCaughtUp(streamJobs, streamPlacement, streamTopology)
			})
		}
	}
	for i, name := range []string{"placement-a", "placement-b"} {
		c.metrics[name] = fmt.Sprintf("127.0.0.1:%d", freePort(t))
		c.add(name, startProc(t, name, opEnv, bins.toposched,
			append([]string{"placement", "--replica", name, "--lease-ttl", chaosLeaseTTL.String(),
				"--metrics-listen", c.metrics[name], "--policies", "none", "--reserve-after=-1s"}, common(i)...)...))
	}
	c.launcher = connectAs(t, clusterURL(nodes, 2), "launcher", nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	waitFor(t, 90*time.Second, func() (bool, string) {
		c.mustBeAlive()
		for _, d := range []struct{ stream, durable string }{
			{streamJobs, durableAnalysis},
			{streamJobs, durablePlacementAnalyzed},
			{streamJobs, durablePlacementFinished},
			{streamPlacement, durableOptimizerDecided},
		} {
			if ok, why := consumerExists(c.js, d.stream, d.durable); !ok {
				return false, why
			}
		}
		if ok, why := consumerDrained(c.js, streamTopology, durablePlacementNode, chaosNodes); !ok {
			return false, why
		}
		_, why := c.leader()
		return why == "", why
	})
	leader, _ := c.leader()
	t.Logf("services ready after %s; %s leads placement", since(start), leader)
	return c
}

func (c *chaosCluster) add(role string, p *proc) {
	c.procs[role] = p
	c.lives[role]++
	c.all = append(c.all, p)
}

// mustBeAlive fails the test if a process that should run has exited.
func (c *chaosCluster) mustBeAlive() {
	c.t.Helper()
	var ps []*proc
	for role, p := range c.procs {
		if !c.down[role] {
			ps = append(ps, p)
		}
	}
	mustBeAlive(c.t, ps...)
}

// waitLogged waits until p has written text after the first from bytes of
// its output.
func (c *chaosCluster) waitLogged(p *proc, from int, text string, timeout time.Duration) {
	c.t.Helper()
	waitFor(c.t, timeout, func() (bool, string) {
		c.mustBeAlive()
		if !strings.Contains(p.output()[from:], text) {
			return false, fmt.Sprintf("%s has not logged %q", p.name, text)
		}
		return true, ""
	})
}

// kill SIGKILLs role's process and waits for it to die.
func (c *chaosCluster) kill(role string) {
	c.t.Helper()
	p := c.procs[role]
	c.down[role] = true
	p.signal(c.t, syscall.SIGKILL)
	killedBySIGKILL(c.t, p)
}

// restart starts role's process again, with the same binary, flags and
// environment (for a NATS node: its ports and its store directory).
func (c *chaosCluster) restart(role string) *proc {
	c.t.Helper()
	old := c.procs[role]
	p := startProc(c.t, fmt.Sprintf("%s#%d", role, c.lives[role]+1), old.cmd.Env, old.cmd.Path, old.cmd.Args[1:]...)
	c.add(role, p)
	delete(c.down, role)
	return p
}

// leader is the placement replica that holds the lease and says so on its
// /metrics; why says what is missing when there is none.
func (c *chaosCluster) leader() (name, why string) {
	c.t.Helper()
	h := leaseHolder(c.t, c.js)
	addr, ok := c.metrics[h]
	if !ok {
		return "", fmt.Sprintf("lease held by %q, not a placement replica", h)
	}
	if c.down[h] {
		return "", fmt.Sprintf("lease held by %s, which is down", h)
	}
	st, err := scrapePlacement(addr)
	if err != nil {
		return "", fmt.Sprintf("lease held by %s: %v", h, err)
	}
	if !st.leader || !st.known {
		return "", fmt.Sprintf("lease held by %s, whose /metrics say leader %v, store known %v", h, st.leader, st.known)
	}
	return h, ""
}

// waitLeader waits for a placement replica to lead and returns it.
func (c *chaosCluster) waitLeader() string {
	c.t.Helper()
	var leader string
	waitFor(c.t, chaosRecoveryBound, func() (bool, string) {
		c.mustBeAlive()
		var why string
		leader, why = c.leader()
		return why == "", why
	})
	return leader
}

func otherPlacement(name string) string {
	if name == "placement-a" {
		return "placement-b"
	}
	return "placement-a"
}

// streamsCaughtUp is a waitFor condition: every one of streams has a
// leader and two current replicas.
func (c *chaosCluster) streamsCaughtUp(streams ...string) (bool, string) {
	for _, s := range streams {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		st, err := c.js.Stream(ctx, s)
		var info *jetstream.StreamInfo
		if err == nil {
			info, err = st.Info(ctx)
		}
		cancel()
		if err != nil {
			return false, fmt.Sprintf("stream %s: %v", s, err)
		}
		if info.Cluster == nil || info.Cluster.Leader == "" {
			return false, fmt.Sprintf("stream %s has no leader", s)
		}
		current := 0
		for _, r := range info.Cluster.Replicas {
			if r.Current && !r.Offline {
				current++
			}
		}
		if current != 2 {
			return false, fmt.Sprintf("stream %s (leader %s): %d of its other replicas current", s, info.Cluster.Leader, current)
		}
	}
	return true, ""
}

// inject makes fault n of the given kind and waits for the recovery; it
// returns the fault's description and when it was over.
func (c *chaosCluster) inject(n int, kind string, rng *rand.Rand, lg *chaosLog) (string, time.Time) {
	t := c.t
	t.Helper()
	at := time.Now()
	downFor := time.Duration(rng.IntN(4000)) * time.Millisecond
	pick := func(base string) string { return base + "-" + string(rune('a'+rng.IntN(2))) }
	logf := func(format string, args ...any) string {
		desc := fmt.Sprintf(format, args...)
		t.Logf("fault %d at %s: %s", n, at.Sub(c.start).Round(100*time.Millisecond), desc)
		return desc
	}
	var desc string
	switch kind {
	case faultNATS:
		role := fmt.Sprintf("nats-%d", 1+rng.IntN(3))
		desc = logf("SIGKILL %s, restarted %s later", role, downFor)
		c.kill(role)
		time.Sleep(downFor) // the schedule's pacing: how long the node stays down
		p := c.restart(role)
		c.waitLogged(p, 0, "Server is ready", chaosRecoveryBound)
		waitFor(t, chaosRecoveryBound, func() (bool, string) {
			c.mustBeAlive()
			return c.streamsCaughtUp(streamJobs, streamPlacement, streamTopology, streamLeases)
		})
	case faultLeader, faultStandby:
		leader := c.waitLeader()
		role := leader
		if kind == faultStandby {
			role = otherPlacement(leader)
		}
		desc = logf("SIGKILL %s (%s), restarted %s later", role, strings.TrimPrefix(kind, "placement "), downFor)
		c.kill(role)
		time.Sleep(downFor) // the schedule's pacing: how long the replica stays down
		p := c.restart(role)
		c.waitLogged(p, 0, "services running", chaosRecoveryBound)
		var now string
		waitFor(t, chaosRecoveryBound, func() (bool, string) {
			c.mustBeAlive()
			var why string
			if now, why = c.leader(); why != "" {
				return false, why
			}
			if kind == faultLeader {
				// A new term, the restarted replica's (its own lease,
				// taken back) or the standby's (after the lapse).
				if _, ok := lg.markerAfter(now, at); !ok {
					return false, fmt.Sprintf("%s leads but has stored no term marker since the fault: %s", now, lg.status())
				}
			}
			return true, ""
		})
		if now != leader {
			t.Logf("fault %d: %s leads now", n, now)
		}
	case faultAnalysis, faultOptimizer, faultDiscovery:
		role := pick(kind)
		desc = logf("SIGKILL %s, restarted %s later", role, downFor)
		c.kill(role)
		time.Sleep(downFor) // the schedule's pacing: how long the replica stays down
		p := c.restart(role)
		c.waitLogged(p, 0, "services running", chaosRecoveryBound)
	case faultStop:
		desc = c.stopLeader(n, at, rng, lg, logf)
	default:
		t.Fatalf("fault kind %q", kind)
	}
	recovered := time.Now()
	t.Logf("fault %d recovered at %s (%s after the fault): %s", n, recovered.Sub(c.start).Round(100*time.Millisecond),
		recovered.Sub(at).Round(100*time.Millisecond), lg.status())
	return desc, recovered
}

// stopLeader is the fencing case: the leader is frozen with SIGSTOP for
// longer than its lease TTL, the standby must take the lease and open a
// term, and the leader, resumed with SIGCONT, must step down without any
// outcome stored (the log's fence check sees to the latter).
func (c *chaosCluster) stopLeader(n int, at time.Time, rng *rand.Rand, lg *chaosLog, logf func(string, ...any) string) string {
	t := c.t
	t.Helper()
	leader := c.waitLeader()
	standby := otherPlacement(leader)
	stopFor := 2*chaosLeaseTTL + time.Duration(rng.IntN(int(chaosLeaseTTL/time.Millisecond)))*time.Millisecond
	desc := logf("SIGSTOP %s (leader) for %s", leader, stopFor.Round(100*time.Millisecond))
	p := c.procs[leader]
	p.signal(t, syscall.SIGSTOP)
	stopped := time.Now()
	var term chaosMarker
	waitFor(t, chaosRecoveryBound, func() (bool, string) {
		c.mustBeAlive()
		if now, why := c.leader(); now != standby {
			return false, fmt.Sprintf("%s frozen, %s should lead: %s", leader, standby, why)
		}
		var ok bool
		if term, ok = lg.markerAfter(standby, stopped); !ok {
			return false, fmt.Sprintf("%s leads but has stored no term marker since the SIGSTOP: %s", standby, lg.status())
		}
		return true, ""
	})
	took := time.Since(stopped)
	time.Sleep(stopFor - took) // the schedule's pacing: the rest of the freeze
	from := len(p.output())
	p.signal(t, syscall.SIGCONT)
	resumed := time.Now()
	// The resumed replica finds its lease gone and stands by.
	waitFor(t, chaosRecoveryBound, func() (bool, string) {
		c.mustBeAlive()
		st, err := scrapePlacement(c.metrics[leader])
		if err != nil || st.leader {
			return false, fmt.Sprintf("%s resumed %s ago, still leading by its /metrics (%v)", leader, since(resumed), err)
		}
		if now, why := c.leader(); now != standby {
			return false, fmt.Sprintf("%s should lead: %s", standby, why)
		}
		return true, ""
	})
	out := p.output()[from:]
	t.Logf("fault %d: %s took the lease %s into the freeze (term marker #%d, lease revision %d); %s, resumed, stood down "+
		"(logged %d 'lease lost', %d fenced publishes)", n, standby, took.Round(100*time.Millisecond), term.seq, term.rev, leader,
		strings.Count(out, "lease lost"), strings.Count(out, "a newer placement term has started"))
	return desc
}

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

// chaosMsg is one message of the placement stream, term markers included.
type chaosMsg struct {
	seq     uint64
	subject string
	at      time.Time // when the stream stored it
	header  nats.Header
	data    []byte
	jobID   string
}

// chaosReader reads the placement stream by sequence, from the start, and
// tolerates a cluster in the middle of a fault: a read that fails is taken
// up again on the next call.
type chaosReader struct {
	js   jetstream.JetStream
	msgs []chaosMsg
}

// readMore reads what was stored since the last call, and returns it.
func (r *chaosReader) readMore(ctx context.Context) ([]chaosMsg, error) {
	s, err := r.js.Stream(ctx, streamPlacement)
	if err != nil {
		return nil, err
	}
	info, err := s.Info(ctx)
	if err != nil {
		return nil, err
	}
	if info.State.FirstSeq > 1 {
		return nil, fmt.Errorf("%s starts at #%d: messages lost", streamPlacement, info.State.FirstSeq)
	}
	var got []chaosMsg
	for seq := uint64(len(r.msgs)) + 1; seq <= info.State.LastSeq; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if err != nil {
			// The stream deletes nothing: a message not found below
			// the last sequence is one not yet readable, or lost.
			return got, fmt.Errorf("get #%d of %d: %w", seq, info.State.LastSeq, err)
		}
		cm := chaosMsg{seq: seq, subject: m.Subject, at: m.Time, header: m.Header, data: m.Data}
		if m.Subject != subjectTerm {
			var probe struct {
				JobID string `json:"job_id"`
			}
			_ = json.Unmarshal(m.Data, &probe) // a body that is not JSON is the checker's to report
			cm.jobID = probe.JobID
		}
		r.msgs = append(r.msgs, cm)
		got = append(got, cm)
	}
	return got, nil
}

// chaosLog follows the placement stream as it grows and checks each
// message as it comes (chaosChecker).
type chaosLog struct {
	mu       sync.Mutex
	r        chaosReader
	c        *chaosChecker
	lastErr  error
	reported int // violations already reported with t.Errorf
	onEvent  func(chaosMsg)

	stopOnce sync.Once
	stop     chan struct{}
	done     chan struct{}
}

// follow reads the stream every 100 ms until stopFollow.
func (l *chaosLog) follow() {
	l.stop, l.done = make(chan struct{}), make(chan struct{})
	go func() {
		defer close(l.done)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-l.stop:
				return
			case <-tick.C:
				_ = l.sync() // kept in lastErr, shown by status
			}
		}
	}()
}

func (l *chaosLog) stopFollow() {
	l.stopOnce.Do(func() {
		if l.stop != nil {
			close(l.stop)
			<-l.done
		}
	})
}

// sync reads and checks what was stored since the last call, then tells
// onEvent about each message.
func (l *chaosLog) sync() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	l.mu.Lock()
	got, err := l.r.readMore(ctx)
	for _, m := range got {
		l.c.apply(m)
	}
	l.lastErr = err
	l.mu.Unlock()
	if l.onEvent != nil {
		for _, m := range got {
			l.onEvent(m)
		}
	}
	return err
}

// chaosSnapshot is the log's state at one point.
type chaosSnapshot struct {
	seq                                       uint64
	free, placed, pending, rejected, finished int
	fits                                      []string // waiting jobs that fit in what is free
}

// syncSnapshot reads the log up to its end and returns its state.
func (l *chaosLog) syncSnapshot() (chaosSnapshot, error) {
	if err := l.sync(); err != nil {
		return chaosSnapshot{}, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	c := l.c
	s := chaosSnapshot{seq: uint64(len(l.r.msgs)), free: c.totalFree(), placed: len(c.live), pending: len(c.pending),
		rejected: len(c.rejected), finished: len(c.released)}
	for id := range c.pending {
		if j, ok := c.spec(id); ok && c.fits(j) {
			s.fits = append(s.fits, id)
		}
	}
	slices.Sort(s.fits)
	return s, nil
}

// status is a line on the log for a wait's message.
func (l *chaosLog) status() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	cnt := map[string]int{}
	for _, m := range l.r.msgs {
		cnt[strings.TrimPrefix(m.subject, "toposched.placement.")]++
	}
	s := fmt.Sprintf("placement log at #%d %v", len(l.r.msgs), cnt)
	if l.lastErr != nil {
		s += fmt.Sprintf(" (last read: %v)", l.lastErr)
	}
	return s
}

// progressAfter is the first decision or pending of a launcher's job
// stored after t.
func (l *chaosLog) progressAfter(t time.Time) (chaosMsg, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, m := range l.r.msgs {
		if m.at.After(t) && (m.subject == subjectDecided || m.subject == subjectPending) && !strings.HasPrefix(m.jobID, chaosProbePrefix) {
			return m, true
		}
	}
	return chaosMsg{}, false
}

// markerAfter is holder's first term marker stored after t.
func (l *chaosLog) markerAfter(holder string, t time.Time) (chaosMarker, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, m := range l.c.markers {
		if m.holder == holder && m.at.After(t) {
			return m, true
		}
	}
	return chaosMarker{}, false
}

// outcomeOf is the first decision, pending or rejection of job.
func (l *chaosLog) outcomeOf(job string) (chaosMsg, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, m := range l.r.msgs {
		if m.jobID == job && (m.subject == subjectDecided || m.subject == subjectPending || m.subject == subjectRejected) {
			return m, true
		}
	}
	return chaosMsg{}, false
}

func (l *chaosLog) released(job string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.c.released[job]
}

func (l *chaosLog) probeFree(job string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.c.freeAtDecision[job]
}

func (l *chaosLog) violationCount() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.c.violations)
}

func (l *chaosLog) fences() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.c.fenceSummary()
}

// flush reports the violations found since the last flush.
func (l *chaosLog) flush(t *testing.T) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, v := range l.c.violations[l.reported:] {
		t.Errorf("placement log: %s", v)
	}
	l.reported = len(l.c.violations)
}

// dump logs, for a failed run, the faults, the terms and the end of the log.
func (l *chaosLog) dump(t *testing.T, faults []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var b strings.Builder
	fmt.Fprintf(&b, "faults: %s\nterms:\n", strings.Join(faults, "; "))
	for _, m := range l.c.markers {
		fmt.Fprintf(&b, "  #%d at %s: %s, lease revision %d, ce-source %s\n", m.seq, m.at.Format("15:04:05.000"), m.holder, m.rev, m.source)
	}
	msgs := l.r.msgs
	if len(msgs) > 400 {
		msgs = msgs[len(msgs)-400:]
	}
	b.WriteString("last messages:\n")
	for _, m := range msgs {
		fmt.Fprintf(&b, "  #%d %s %s %s fence=%s source=%s %.200s\n", m.seq, m.at.Format("15:04:05.000"), m.subject, m.jobID,
			m.header.Get(headerFence), m.header.Get("ce-source"), m.data)
	}
	t.Logf("---- placement log:\n%s", b.String())
}

// chaosMarker is a term marker of the placement stream.
type chaosMarker struct {
	seq    uint64
	at     time.Time
	holder string
	rev    uint64
	source string
}

// chaosChecker applies the placement log one message at a time and records
// every broken invariant.
type chaosChecker struct {
	spec    func(string) (sigkillJob, bool)
	markers []chaosMarker
	// Outcomes stored with and without a fence, and whose ce-source names
	// a replica or not.
	fenced, replicaNamed, replicaUnnamed int
	unfenced                             []uint64
	// others counts outcomes by publishers other than placement
	// (analysis's rejections), by ce-source.
	others map[string]int

	holder         map[gpuKey]string
	live           map[string]decidedJSON
	pending        map[string]bool
	rejected       map[string]bool
	released       map[string]bool
	count          map[string]map[string]int
	freeAtDecision map[string]int
	violations     []string
}

func newChaosChecker(spec func(string) (sigkillJob, bool)) *chaosChecker {
	return &chaosChecker{spec: spec, holder: map[gpuKey]string{}, live: map[string]decidedJSON{}, pending: map[string]bool{},
		rejected: map[string]bool{}, released: map[string]bool{}, count: map[string]map[string]int{}, freeAtDecision: map[string]int{},
		others: map[string]int{}}
}

func (c *chaosChecker) violate(m chaosMsg, format string, args ...any) {
	c.violations = append(c.violations, fmt.Sprintf("#%d %s %s: ", m.seq, strings.TrimPrefix(m.subject, "toposched."), m.jobID)+
		fmt.Sprintf(format, args...))
}

// replicaOf is the replica a message's ce-source names, if any.
func replicaOf(h nats.Header) string {
	if r, ok := strings.CutPrefix(h.Get("ce-source"), placementSource+":"); ok {
		return r
	}
	return ""
}

func (c *chaosChecker) freeByNode() map[string]int {
	free := map[string]int{}
	for i := 1; i <= chaosNodes; i++ {
		free[fmt.Sprintf("gpu-%03d", i)] = chaosPerNode
	}
	for g := range c.holder {
		free[g.node]--
	}
	return free
}

func (c *chaosChecker) totalFree() int {
	return chaosNodes*chaosPerNode - len(c.holder)
}

// fits says whether the log has room for j now.
func (c *chaosChecker) fits(j sigkillJob) bool {
	if j.impossible {
		return false
	}
	if j.GPUsPerNode == 0 {
		return j.GPUs <= c.totalFree()
	}
	roomy := 0
	for _, n := range c.freeByNode() {
		if n >= j.GPUsPerNode {
			roomy++
		}
	}
	return roomy >= j.GPUs/j.GPUsPerNode
}

func (c *chaosChecker) apply(m chaosMsg) {
	if m.subject == subjectTerm {
		var b struct {
			Holder        string `json:"holder"`
			LeaseRevision uint64 `json:"lease_revision"`
		}
		if err := json.Unmarshal(m.data, &b); err != nil || b.Holder == "" {
			c.violate(m, "term marker %q: %v", m.data, err)
			return
		}
		if r := replicaOf(m.header); r != "" && r != b.Holder {
			c.violate(m, "term marker of %s published by %s", b.Holder, r)
		}
		if n := len(c.markers); n > 0 && b.LeaseRevision <= c.markers[n-1].rev {
			c.violate(m, "term of %s on lease revision %d, not above %d of the term before (#%d, %s)",
				b.Holder, b.LeaseRevision, c.markers[n-1].rev, c.markers[n-1].seq, c.markers[n-1].holder)
		}
		c.markers = append(c.markers, chaosMarker{seq: m.seq, at: m.at, holder: b.Holder, rev: b.LeaseRevision,
			source: m.header.Get("ce-source")})
		return
	}
	if !chaosOutcomes[m.subject] {
		return
	}
	// Fencing: the outcome was stored under the last term before it.
	// Analysis rejects an invalid job itself, on placement.rejected,
	// with its own ce-source: not placement's outcome, not fenced.
	if src := m.header.Get("ce-source"); src != "" && src != placementSource && !strings.HasPrefix(src, placementSource+":") {
		c.others[src]++
	} else if len(c.markers) == 0 {
		c.violate(m, "an outcome before any term marker")
	} else {
		cur := c.markers[len(c.markers)-1]
		if f := m.header.Get(headerFence); f != "" {
			c.fenced++
			if f != strconv.FormatUint(cur.seq, 10) {
				by := "no term marker"
				for _, mk := range c.markers {
					if strconv.FormatUint(mk.seq, 10) == f {
						by = "the term marker of " + mk.holder
					}
				}
				c.violate(m, "stored fenced on #%s (%s) while the last term is #%d of %s: an outcome from a replica without the lease",
					f, by, cur.seq, cur.holder)
			}
		} else {
			c.unfenced = append(c.unfenced, m.seq)
		}
		if r := replicaOf(m.header); r != "" {
			c.replicaNamed++
			if r != cur.holder {
				c.violate(m, "published by %s in the term of %s (#%d): an outcome from a replica without the lease", r, cur.holder, cur.seq)
			}
		} else {
			c.replicaUnnamed++
		}
	}
	if m.jobID == "" {
		c.violate(m, "no job_id: %q", m.data)
		return
	}
	if c.count[m.jobID] == nil {
		c.count[m.jobID] = map[string]int{}
	}
	c.count[m.jobID][m.subject]++
	n := c.count[m.jobID][m.subject]
	j, known := c.spec(m.jobID)
	switch m.subject {
	case subjectDecided:
		var d decidedJSON
		if err := json.Unmarshal(m.data, &d); err != nil {
			c.violate(m, "%v", err)
			return
		}
		if n > 1 {
			c.violate(m, "decided %d times", n)
		}
		if c.released[d.JobID] {
			c.violate(m, "decided after its release")
		}
		if c.rejected[d.JobID] {
			c.violate(m, "decided after its rejection")
		}
		if known && len(d.Ranks) != j.GPUs {
			c.violate(m, "%d ranks for %d GPUs", len(d.Ranks), j.GPUs)
		}
		if known && j.GPUsPerNode > 0 {
			for _, nd := range d.Nodes {
				if len(nd.GPUs) != j.GPUsPerNode {
					c.violate(m, "%d GPUs on %s, want %d per node", len(nd.GPUs), nd.Node, j.GPUsPerNode)
				}
			}
		}
		c.freeAtDecision[d.JobID] = c.totalFree()
		free := c.freeByNode()
		for _, g := range d.gpus() {
			if _, ok := free[g.node]; !ok || g.gpu < 0 || g.gpu >= chaosPerNode {
				c.violate(m, "GPU %s/%d is not in the cluster", g.node, g.gpu)
			}
			if other, ok := c.holder[g]; ok {
				c.violate(m, "GPU %s/%d given while %s holds it", g.node, g.gpu, other)
			}
			c.holder[g] = d.JobID
		}
		c.live[d.JobID] = d
		delete(c.pending, d.JobID)
	case subjectPending:
		if n > 1 {
			c.violate(m, "pending %d times", n)
		}
		if _, ok := c.live[m.jobID]; ok {
			c.violate(m, "pending while it holds a decision")
		}
		if known && c.fits(j) {
			c.violate(m, "pending (%d GPUs, %d per node) although the log has room for it: free GPUs per node %v",
				j.GPUs, j.GPUsPerNode, c.freeByNode())
		}
		c.pending[m.jobID] = true
	case subjectRejected:
		if n > 1 {
			c.violate(m, "rejected %d times", n)
		}
		c.rejected[m.jobID] = true
		delete(c.pending, m.jobID)
	case subjectReleased:
		var rel struct {
			Nodes []nodeJSON `json:"nodes"`
		}
		if err := json.Unmarshal(m.data, &rel); err != nil {
			c.violate(m, "%v", err)
			return
		}
		if n > 1 {
			c.violate(m, "released %d times", n)
		}
		var freed []gpuKey
		for _, nd := range rel.Nodes {
			for _, g := range nd.GPUs {
				freed = append(freed, gpuKey{nd.Node, g})
			}
		}
		d, isLive := c.live[m.jobID]
		if isLive {
			held := d.gpus()
			slices.SortFunc(held, cmpGPU)
			slices.SortFunc(freed, cmpGPU)
			if !slices.Equal(held, freed) {
				c.violate(m, "releases %v, the decision holds %v", freed, held)
			}
			for _, g := range held {
				delete(c.holder, g)
			}
		} else if len(freed) > 0 {
			c.violate(m, "releases %v, but the job holds no decision", freed)
		}
		delete(c.live, m.jobID)
		delete(c.pending, m.jobID)
		c.released[m.jobID] = true
	}
}

func cmpGPU(a, b gpuKey) int {
	if a.node != b.node {
		return strings.Compare(a.node, b.node)
	}
	return a.gpu - b.gpu
}

// fenceSummary says how the outcomes were attributed to their terms.
func (c *chaosChecker) fenceSummary() string {
	s := fmt.Sprintf("%d of placement's outcomes fenced on their term's marker, %d without a fence header", c.fenced, len(c.unfenced))
	if c.replicaNamed == 0 {
		s += "; ce-source names no replica (" + placementSource + "), replica attribution by ce-source skipped"
	} else {
		s += fmt.Sprintf("; %d name their replica in ce-source, %d do not", c.replicaNamed, c.replicaUnnamed)
	}
	for src, n := range c.others {
		s += fmt.Sprintf("; %d from %s", n, src)
	}
	return s
}

// finishFences reports, over the whole log, outcomes stored without the
// fence that the others carry: an unconditional publish could come from
// any replica.
func (c *chaosChecker) finishFences(t *testing.T) {
	t.Helper()
	switch {
	case len(c.unfenced) > 0 && c.fenced > 0:
		t.Errorf("placement log: %d outcomes stored without a fence (%s), such as #%v, while %d carry one",
			len(c.unfenced), headerFence, c.unfenced[:min(len(c.unfenced), 10)], c.fenced)
	case len(c.unfenced) > 0:
		t.Logf("note: no outcome carries %s in the stream: the fence is checked by the term order and ce-source only", headerFence)
	}
	if c.replicaNamed > 0 && c.replicaUnnamed > 0 {
		t.Errorf("placement log: %d outcomes name their replica in ce-source, %d do not", c.replicaNamed, c.replicaUnnamed)
	}
}

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
