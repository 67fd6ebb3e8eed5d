package e2e

// The chaos soak's cluster: starting the NATS nodes and the services, the
// processes under their role names, finding the placement leader, and
// injecting the faults (SIGKILL and restart, SIGSTOP of the leader).

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

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
	keepJetStreamReachable(t, nc)
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
		if ok, why := consumerDrained(c.js, streamTopology, durablePlacementTopology, chaosNodes); !ok {
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
