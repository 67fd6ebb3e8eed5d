package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// natsNode is one server of a test cluster.
type natsNode struct {
	name string
	url  string
	p    *proc
}

// natsCluster starts three nats-server processes on loopback, each on the
// shipped deploy/nats/cluster.conf (and its users), told apart by their
// environment as in production, and returns once JetStream's meta group has
// a leader.
func natsCluster(t *testing.T) []natsNode {
	t.Helper()
	dir := natsConfDir(t, "cluster.conf")
	type ports struct{ client, route int }
	ps := make([]ports, 3)
	for i := range ps {
		ps[i] = ports{freePort(t), freePort(t)}
	}
	routes := make([]string, 3)
	for i, p := range ps {
		routes[i] = fmt.Sprintf("NATS_ROUTE_%d=nats-route://route:%s@127.0.0.1:%d", i+1, rolePasswords["NATS_ROUTE_PASSWORD"], p.route)
	}
	nodes := make([]natsNode, 3)
	for i, p := range ps {
		name := fmt.Sprintf("nats-%d", i+1)
		env := serverEnv(append([]string{
			"NATS_SERVER_NAME=" + name,
			fmt.Sprintf("NATS_LISTEN=127.0.0.1:%d", p.client),
			fmt.Sprintf("NATS_CLUSTER_LISTEN=127.0.0.1:%d", p.route),
			"NATS_STORE_DIR=" + t.TempDir(),
		}, routes...)...)
		nodes[i] = natsNode{name: name, url: fmt.Sprintf("nats://127.0.0.1:%d", p.client),
			p: startProc(t, name, env, bins.natsServer, "-c", filepath.Join(dir, "main.conf"))}
	}
	waitFor(t, 60*time.Second, func() (bool, string) {
		for _, n := range nodes {
			mustBeAlive(t, n.p)
			if !strings.Contains(n.p.output(), "Server is ready") {
				return false, n.name + " has not logged 'Server is ready'"
			}
		}
		nc, err := nats.Connect(clusterURL(nodes, 0), nats.UserInfo("operator", userPassword("operator")), nats.Timeout(2*time.Second))
		if err != nil {
			return false, fmt.Sprintf("connect: %v", err)
		}
		defer nc.Close()
		js, _ := jetstream.New(nc)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if _, err := js.AccountInfo(ctx); err != nil {
			return false, fmt.Sprintf("jetstream account info: %v", err)
		}
		return true, ""
	})
	return nodes
}

// clusterURL lists every node, starting from node first, so that replicas
// spread their connections over the cluster.
func clusterURL(nodes []natsNode, first int) string {
	urls := make([]string, len(nodes))
	for i := range nodes {
		urls[i] = nodes[(first+i)%len(nodes)].url
	}
	return strings.Join(urls, ",")
}

// clusterJobs is the size of the burst: the 1,000 (about 70 s on
// two cores), or TOPOSCHED_E2E_CLUSTER_JOBS to try another size.
func clusterJobs(t *testing.T) int {
	if s := os.Getenv("TOPOSCHED_E2E_CLUSTER_JOBS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 50 {
			t.Fatalf("TOPOSCHED_E2E_CLUSTER_JOBS=%s: want a number of at least 50", s)
		}
		return n
	}
	return 1000
}

// TestClusterReplicasSIGKILL runs the deployment of a company: a 3-node
// JetStream cluster configured by deploy/nats (streams at replication 3,
// users and roles), two replicas of every service as separate processes,
// a launcher submitting a burst of jobs and finishing some. In the middle
// of the burst one NATS node and the placement replica holding the lease
// are killed with SIGKILL. The other placement replica must take the lease
// and carry on, and in the end every job has exactly one outcome (decided,
// pending or rejected), no GPU was ever held by two jobs, every submission
// is in the jobs stream and nothing went to the dead letters.
func TestClusterReplicasSIGKILL(t *testing.T) {
	needBinaries(t)
	t.Parallel()
	start := time.Now()
	const (
		nodesN, perNode = 16, 8
		finishShare     = 0.5
	)
	total := clusterJobs(t)
	minDecided := total * 3 / 10
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("TOPOSCHED_E2E_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("TOPOSCHED_E2E_SEED=%s: %v", s, err)
		}
		seed = v
	}
	t.Logf("%d jobs, seed %d (rerun with TOPOSCHED_E2E_SEED=%d)", total, seed, seed)
	jobs := sigkillBurst(rand.New(rand.NewPCG(seed, 1)), total, nodesN, perNode)
	byID := map[string]sigkillJob{}
	for _, j := range jobs {
		byID[j.JobID] = j
	}

	nodes := natsCluster(t)
	t.Logf("NATS cluster ready after %s", time.Since(start).Round(time.Millisecond))
	opEnv := asUser("operator")
	common := func(i int) []string {
		return []string{"--nats-url", clusterURL(nodes, i), "--nats-user", "operator", "--replicas", "3"}
	}
	var services []*proc
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
		services = append(services, p)
		if i == 0 {
			// The first process creates the R3 streams; the rest find
			// them. (All at once works too, through the services'
			// retries, but on two loaded cores the cluster may take a
			// minute to create every stream while eight processes ask.)
			waitFor(t, 90*time.Second, func() (bool, string) {
				mustBeAlive(t, p)
				return strings.Contains(p.output(), "services running"), s.name + " has not logged 'services running'"
			})
		}
	}
	placements := map[string]*proc{}
	for i, name := range []string{"placement-a", "placement-b"} {
		placements[name] = startProc(t, name, opEnv, bins.toposched,
			append([]string{"placement", "--replica", name, "--lease-ttl", "3s"}, common(i)...)...)
	}
	natsProcs := []*proc{nodes[0].p, nodes[1].p, nodes[2].p}
	alive := func() []*proc {
		out := append(append([]*proc{}, services...), natsProcs...)
		for _, p := range placements {
			out = append(out, p)
		}
		return out
	}

	// The test's own connections: an operator's to audit, a launcher's to
	// submit (as a launcher would, with its role).
	auditNC, err := nats.Connect(clusterURL(nodes, 1), nats.UserInfo("operator", userPassword("operator")),
		nats.Timeout(5*time.Second), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(auditNC.Close)
	keepJetStreamReachable(t, auditNC)
	js, err := jetstream.New(auditNC)
	if err != nil {
		t.Fatal(err)
	}
	launcher := connectAs(t, clusterURL(nodes, 2), "launcher", nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))

	waitFor(t, 90*time.Second, func() (bool, string) {
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
		return consumerDrained(js, streamTopology, durablePlacementTopology, nodesN)
	})
	// Every stream is replicated on the three nodes.
	for _, s := range []string{streamJobs, streamPlacement, streamTopology} {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		st, err := js.Stream(ctx, s)
		if err != nil {
			cancel()
			t.Fatal(err)
		}
		info, err := st.Info(ctx)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		if info.Config.Replicas != 3 {
			t.Fatalf("stream %s has %d replicas, want 3", s, info.Config.Replicas)
		}
	}
	leader := leaseHolder(t, js)
	if placements[leader] == nil {
		t.Fatalf("lease held by %q, not a placement replica", leader)
	}
	t.Logf("services ready after %s; %s leads placement", time.Since(start).Round(time.Millisecond), leader)

	fin := startFinisher(t, js, rand.New(rand.NewPCG(seed, 2)), finishShare)
	var futures []jetstream.PubAckFuture
	submit := func(batch []sigkillJob) {
		t.Helper()
		for _, j := range batch {
			body, err := json.Marshal(j)
			if err != nil {
				t.Fatal(err)
			}
			f, err := launcher.js.PublishAsync(subjectSubmitted, body, jetstream.WithMsgID("e2e-cluster-submit-"+j.JobID))
			if err != nil {
				t.Fatalf("publish %s: %v", j.JobID, err)
			}
			futures = append(futures, f)
		}
	}
	// waitAcks waits for the submissions' PubAcks and sends again, under
	// the same ids, those lost with the killed node: a few rounds, each
	// with one deadline for all its answers.
	var waitAcks func(round int)
	waitAcks = func(round int) {
		t.Helper()
		select {
		case <-launcher.js.PublishAsyncComplete():
		case <-time.After(60 * time.Second):
		}
		var retry []sigkillJob
		deadline := time.After(10 * time.Second)
		expired := false
		for _, f := range futures {
			if !expired {
				select {
				case <-f.Ok():
					continue
				case <-f.Err(): //nolint:errcheck // the submission is sent again below, whatever the error
					// Lost with the killed node before its PubAck.
				case <-deadline:
					// No answer at all: the acknowledgement died with
					// the node. Ambiguous, like a lost PubAck.
					expired = true
				}
			}
			if expired {
				select {
				case <-f.Ok():
					continue
				default:
				}
			}
			// The launcher publishes again under the same id: a copy
			// that was stored is dropped.
			id := strings.TrimPrefix(f.Msg().Header.Get("Nats-Msg-Id"), "e2e-cluster-submit-")
			retry = append(retry, byID[id])
		}
		futures = nil
		if len(retry) > 0 {
			if round >= 5 {
				t.Fatalf("%d submissions still unacknowledged after %d rounds", len(retry), round)
			}
			t.Logf("%d submissions republished after the node loss", len(retry))
			submit(retry)
			waitAcks(round + 1)
		}
	}
	grown := func(what string, before map[string]uint64, decided uint64) map[string]uint64 {
		t.Helper()
		var now map[string]uint64
		waitFor(t, 90*time.Second, func() (bool, string) {
			mustBeAlive(t, alive()...)
			now = placementCounts(t, js)
			if now[subjectDecided] < before[subjectDecided]+decided {
				return false, fmt.Sprintf("%s: placement stream %v, waiting for %d more decisions than %v; %v", what, now, decided, before, fin)
			}
			return true, ""
		})
		return now
	}

	third := total / 3
	submit(jobs[:third])
	grown("first decisions", map[string]uint64{}, 10)
	submit(jobs[third : 2*third])
	// Mid-burst: a NATS node and the leading placement replica die.
	killed := nodes[0]
	natsProcs = natsProcs[1:]
	killed.p.signal(t, syscall.SIGKILL)
	killedBySIGKILL(t, killed.p)
	lp := placements[leader]
	delete(placements, leader)
	lp.signal(t, syscall.SIGKILL)
	killedBySIGKILL(t, lp)
	// The streams whose leader was on the dead node elect another.
	waitFor(t, 60*time.Second, func() (bool, string) {
		for _, s := range []string{streamJobs, streamPlacement, streamTopology} {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			st, err := js.Stream(ctx, s)
			if err == nil {
				_, err = st.Info(ctx)
			}
			cancel()
			if err != nil {
				return false, fmt.Sprintf("stream %s: %v", s, err)
			}
		}
		return true, ""
	})
	t.Logf("SIGKILLed %s and %s; streams answer again at %s: placement stream %v", killed.name, leader, time.Since(start).Round(time.Millisecond), placementCounts(t, js))
	submit(jobs[2*third:])
	waitAcks(1)

	var survivor string
	for name := range placements {
		survivor = name
	}
	waitFor(t, 60*time.Second, func() (bool, string) {
		mustBeAlive(t, alive()...)
		if h := leaseHolder(t, js); h != survivor {
			return false, fmt.Sprintf("lease held by %q, want %s", h, survivor)
		}
		return strings.Contains(placements[survivor].output(), "lease taken"), survivor + " has not logged 'lease taken'"
	})
	t.Logf("%s took the lease at %s", survivor, time.Since(start).Round(time.Millisecond))

	for c := placementCounts(t, js); c[subjectDecided] < uint64(minDecided); {
		fin.finishSome(8)
		c = grown("turnover", c, 1)
	}
	fin.stop()
	for _, c := range []struct {
		stream, durable string
		atLeast         uint64
	}{
		{streamJobs, durableAnalysis, uint64(total)},
		{streamJobs, durablePlacementAnalyzed, 1},
		{streamJobs, durablePlacementFinished, uint64(fin.count())},
	} {
		waitFor(t, 90*time.Second, func() (bool, string) {
			mustBeAlive(t, alive()...)
			return consumerDrained(js, c.stream, c.durable, c.atLeast)
		})
	}
	t.Logf("drained at %s", time.Since(start).Round(time.Millisecond))

	// No event lost: every submission is in the jobs stream once.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	jst, err := js.Stream(ctx, streamJobs)
	if err != nil {
		t.Fatal(err)
	}
	info, err := jst.Info(ctx, jetstream.WithSubjectFilter(subjectSubmitted))
	if err != nil {
		t.Fatal(err)
	}
	if n := info.State.Subjects[subjectSubmitted]; n != uint64(total) {
		t.Errorf("%s holds %d submissions, want %d", streamJobs, n, total)
	}

	evs := readPlacements(t, js)
	live, pending := auditPlacements(t, evs)
	count := map[string]map[string]int{}
	for _, ev := range evs {
		if count[ev.jobID] == nil {
			count[ev.jobID] = map[string]int{}
		}
		count[ev.jobID][ev.subject]++
	}
	finished := map[string]bool{}
	fin.mu.Lock()
	for id := range fin.finished {
		finished[id] = true
	}
	for _, err := range fin.errs {
		t.Error(err)
	}
	fin.mu.Unlock()
	var nDecided, nRejected, nWaiting int
	for _, j := range jobs {
		c := count[j.JobID]
		dec, rej, pen, rel := c[subjectDecided], c[subjectRejected], c[subjectPending], c[subjectReleased]
		switch {
		case j.impossible:
			nRejected++
			if rej != 1 || dec+pen+rel != 0 {
				t.Errorf("%s can never fit: events %v, want exactly one rejection", j.JobID, c)
			}
		case dec+rej+pen == 0:
			t.Errorf("%s: lost, no outcome in %s", j.JobID, streamPlacement)
		case rej > 0 || dec > 1 || pen > 1:
			t.Errorf("%s (%d GPUs, %d per node): events %v, want one decision (after at most one wait) or one wait",
				j.JobID, j.GPUs, j.GPUsPerNode, c)
		case dec == 1:
			nDecided++
			_, isLive := live[j.JobID]
			if finished[j.JobID] == isLive || (finished[j.JobID] && rel != 1) {
				t.Errorf("%s: finished %v, live %v, events %v", j.JobID, finished[j.JobID], isLive, c)
			}
		default:
			nWaiting++
			if !pending[j.JobID] {
				t.Errorf("%s: not decided and not waiting at the end: events %v", j.JobID, c)
			}
		}
	}
	if n := streamMessages(t, js, streamDLQ); n != 0 {
		t.Errorf("%s holds %d messages, want none", streamDLQ, n)
	}
	mustBeAlive(t, alive()...)
	for _, p := range placements {
		for _, bad := range []string{"panic", "allocation conflicts", "no analysis left", "level=ERROR"} {
			if lines := grepLines(p.output(), bad, 5); len(lines) > 0 {
				t.Errorf("%s logged %q, such as:\n%s", p.name, bad, strings.Join(lines, "\n"))
			}
		}
	}
	t.Logf("%d jobs: %d decided (%d finished), %d waiting, %d rejected; %d placement events; took %s",
		total, nDecided, len(finished), nWaiting, nRejected, len(evs), time.Since(start).Round(time.Millisecond))
}

// leaseHolder reads placement's lease from the KV bucket.
func leaseHolder(t *testing.T, js jetstream.JetStream) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	kv, err := js.KeyValue(ctx, "toposched-leases")
	if err != nil {
		return ""
	}
	e, err := kv.Get(ctx, "placement")
	if err != nil {
		return ""
	}
	var v struct {
		Holder string `json:"holder"`
	}
	_ = json.Unmarshal(e.Value(), &v)
	return v.Holder
}
