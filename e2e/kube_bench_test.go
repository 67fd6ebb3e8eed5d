package e2e

// Benchmarks of the Kubernetes service against the real control plane
// (issue 47's targets), run only with -bench:
//
//	go test ./e2e/ -run '^$' -bench 'Kube' -benchtime 1x -count 3
//
// BenchmarkKubePods schedules 1,000 one-GPU pods (each a job of its own,
// its GPU a claim made from a ResourceClaimTemplate) on 125 kwok nodes of
// eight GPUs, through toposched serve and, as the baseline, through the
// real kube-scheduler against the same setup, with the pods created while
// the scheduler runs and before it starts. BenchmarkKubeGang checks that
// the decisions the service carries out are those topoctl place --dry-run
// gives for the same cluster state, then times 16-pod gangs of 8 GPUs a
// pod from their last pod's creation until every pod is bound.
//
// Each run starts a control plane of its own. Every component, the
// scheduler and this process share the machine's cores, so the figures
// are of the whole; the CPU each process used in the timed window is
// reported beside them (Linux only).

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
)

const (
	// benchPods one-GPU pods on benchPodNodes nodes of eight GPUs: the
	// cluster is full once every pod is bound, as in the howto's
	// kube-scheduler runs (800 pods on 100 nodes).
	benchPods     = 1000
	benchPodNodes = 125
	// benchCreators is how many goroutines create the pods.
	benchCreators = 8
	// benchClientQPS and benchClientBurst are the schedulers' client
	// limits in these runs: the howto's kube-scheduler runs used them, and
	// the harness gives the controller manager the same
	// (TOPOSCHED_BENCH_KUBE_QPS sets toposched's QPS, and twice that as
	// its burst).
	benchClientQPS   = 500
	benchClientBurst = 1000

	// benchGangNodes nodes hold two gangs of benchGangPods pods of eight
	// GPUs, so a gang never waits for the previous one's teardown.
	benchGangNodes = 32
	benchGangPods  = 16
	// benchGangs is how many gangs are timed, one after the other
	// (TOPOSCHED_BENCH_GANGS overrides it).
	benchGangs = 30

	// kubeSchedulerName is kube-scheduler's default profile.
	kubeSchedulerName = "default-scheduler"
)

// BenchmarkKubePods: 1,000 one-GPU pods from the first pod's creation (or
// from the scheduler's start, when the pods exist before it) until every
// pod is bound, by toposched and by kube-scheduler; and, with no
// scheduler, until the controller manager has made every pod's claim: the
// rate at which the machine makes pods that can be scheduled, which no
// scheduler's created-while-running rate can pass (it shares the cores).
func BenchmarkKubePods(b *testing.B) {
	for _, sched := range []string{"toposched", "kube-scheduler", noScheduler} {
		for _, before := range []bool{false, true} {
			if sched == noScheduler && before {
				continue
			}
			name := sched + "/created-while-running"
			if before {
				name = sched + "/created-before-start"
			}
			b.Run(name, func(b *testing.B) {
				var sum podsRun
				for range b.N {
					r := runKubePods(b, sched, before)
					sum.add(r)
				}
				sum.report(b, b.N)
			})
		}
	}
}

// podsRun is what one run of BenchmarkKubePods measured.
type podsRun struct {
	podsPerSec float64 // pods over the window
	window     float64 // seconds: first create (or scheduler start) to last bind
	ready      float64 // seconds from the scheduler's start until it said it schedules (before: from the window's start)
	fromReady  float64 // pods/s from that moment (created-before-start only)
	cores      map[string]float64
	writes     float64 // the apiserver's write requests a pod, from every client
	// schedMS is the scheduler's own CPU time a pod, in milliseconds
	// (serve's or kube-scheduler's, user and system): the figure to
	// compare when the scheduler's work is made cheaper. It moves with a
	// shared host's load less than pods/s does, but it moves: slower, the
	// scheduler does less work a wake-up (2.9-4.1 ms a pod for one tree
	// at loads of 8-16), so only runs back to back compare.
	schedMS float64
	// schedPeakMB is the scheduler's peak resident memory (VmHWM), so
	// that a runtime setting that trades memory for CPU shows both.
	schedPeakMB float64
}

func (r *podsRun) add(o podsRun) {
	r.podsPerSec += o.podsPerSec
	r.window += o.window
	r.ready += o.ready
	r.fromReady += o.fromReady
	r.writes += o.writes
	r.schedMS += o.schedMS
	r.schedPeakMB += o.schedPeakMB
	if r.cores == nil {
		r.cores = map[string]float64{}
	}
	for k, v := range o.cores {
		r.cores[k] += v
	}
}

// report reports the means of n runs.
func (r *podsRun) report(b *testing.B, n int) {
	f := float64(n)
	b.ReportMetric(r.podsPerSec/f, "pods/s")
	b.ReportMetric(r.window/f, "window-s")
	if r.fromReady > 0 {
		b.ReportMetric(r.ready/f, "start-s")
		b.ReportMetric(r.fromReady/f, "pods/s-from-ready")
	}
	for k, v := range r.cores {
		b.ReportMetric(v/f, k+"-cores")
	}
	b.ReportMetric(r.writes/f, "writes/pod")
	b.ReportMetric(r.schedMS/f, "sched-cpu-ms/pod")
	if r.schedPeakMB > 0 {
		b.ReportMetric(r.schedPeakMB/f, "sched-peak-MB")
	}
	// The timer runs through each whole run (a run takes longer than
	// the default -benchtime, so it is done once); its time is not the
	// figure, and ns/op 0 leaves it out.
	b.ReportMetric(0, "ns/op")
}

// runKubePods is one run: a control plane, 125 nodes, the scheduler, and
// 1,000 pods.
func runKubePods(b *testing.B, sched string, before bool) podsRun {
	b.Helper()
	kc := startKube(b)
	kc.addGPUClass(b)
	nodes := benchNodeNames(benchPodNodes)
	addBenchNodes(b, kc, nodes)
	kc.addClaimTemplate(b, kubeNS, "one-gpu", 1)
	schedName := schedulerName
	var start func() (time.Time, time.Time)
	switch sched {
	case "toposched":
		kc.grant(b, kubeRules(b))
		e := newBenchEnv(b, kc, nodes)
		start = func() (time.Time, time.Time) { return e.startServe(b) }
	case "kube-scheduler":
		schedName = kubeSchedulerName
		start = func() (time.Time, time.Time) { return startKubeScheduler(b, kc) }
	case noScheduler:
		start = func() (time.Time, time.Time) { now := time.Now(); return now, now }
	default:
		b.Fatalf("no scheduler %q", sched)
	}
	w := watchPods(b, kc)
	pods := make([]*corev1.Pod, benchPods)
	names := make([]string, benchPods)
	for i := range pods {
		names[i] = fmt.Sprintf("pod-%04d", i)
		pods[i] = lonePod(names[i], "one-gpu")
		pods[i].Spec.SchedulerName = schedName
	}
	uptime(b, "before "+sched)

	var t0, startedAt, readyAt time.Time
	var cpu0 cpuSample
	var req0 apiRequests
	if before {
		createPods(b, kc, pods, benchCreators)
		// The controller manager makes every claim first: what is timed
		// is the scheduler's work alone.
		waitFor(b, 5*time.Minute, func() (bool, string) {
			n := w.claimedCount()
			return n == benchPods, fmt.Sprintf("%d of %d claims made", n, benchPods)
		})
		cpu0, req0 = sampleCPU(), sampleRequests(b, kc)
		startedAt, readyAt = start()
		t0 = startedAt
	} else {
		startedAt, readyAt = start()
		cpu0, req0 = sampleCPU(), sampleRequests(b, kc)
		t0 = slices.MinFunc(createPods(b, kc, pods, benchCreators), func(a, b time.Time) int { return a.Compare(b) })
	}
	if sched == noScheduler {
		return createdOnly(b, kc, w, t0, cpu0, req0)
	}
	waitFor(b, 10*time.Minute, func() (bool, string) {
		n := w.boundCount()
		return n == benchPods, fmt.Sprintf("%d of %d pods bound", n, benchPods)
	})
	last := w.lastBound()
	cpu1 := sampleCPU()
	// Requests until every pod is Running (kwok's updates) and each
	// scheduler's Events are written, so that runs compare.
	waitFor(b, 5*time.Minute, func() (bool, string) {
		n := w.runningCount()
		return n == benchPods, fmt.Sprintf("%d of %d pods Running", n, benchPods)
	})
	reqs := sampleRequests(b, kc).since(req0)
	window := last.Sub(t0).Seconds()
	r := podsRun{podsPerSec: benchPods / window, window: window, cores: cpu1.coresSince(cpu0, window), writes: reqs.writes() / benchPods}
	proc := "kube-scheduler" // its command name
	if sched == "toposched" {
		proc = "serve"
	}
	r.schedMS = 1000 * (cpu1[proc] - cpu0[proc]) / benchPods
	r.schedPeakMB = peakRSSMB(proc)
	if before {
		r.ready = readyAt.Sub(startedAt).Seconds()
		r.fromReady = benchPods / last.Sub(readyAt).Seconds()
	}
	b.Logf("%s, pods created %s: %d pods bound in %.2f s from %s: %.1f pods/s; the scheduler was ready %.2f s after its start; CPU (cores over the window): %s",
		sched, map[bool]string{false: "while it runs", true: "before it starts"}[before], benchPods, window,
		map[bool]string{false: "the first create", true: "the scheduler's start"}[before], r.podsPerSec,
		readyAt.Sub(startedAt).Seconds(), formatCores(r.cores))
	b.Logf("apiserver requests a pod, %s; %s's CPU a pod: %.2f ms, its peak resident memory %.0f MB", reqs.perPod(benchPods), proc, r.schedMS, r.schedPeakMB)
	uptime(b, "after "+sched)
	checkOneGPUEach(b, kc, names)
	return r
}

// noScheduler names BenchmarkKubePods' runs with no scheduler.
const noScheduler = "no-scheduler"

// createdOnly ends a run with no scheduler: the window is from the first
// create until the controller manager has made the last pod's claim (and
// written it into the pod's status), the work every scheduler's window
// holds before it can bind.
func createdOnly(b *testing.B, kc *kubeCluster, w *podWatch, t0 time.Time, cpu0 cpuSample, req0 apiRequests) podsRun {
	b.Helper()
	waitFor(b, 10*time.Minute, func() (bool, string) {
		n := w.claimedCount()
		return n == benchPods, fmt.Sprintf("%d of %d claims made", n, benchPods)
	})
	cpu1 := sampleCPU()
	window := w.lastClaimed().Sub(t0).Seconds()
	reqs := sampleRequests(b, kc).since(req0)
	r := podsRun{podsPerSec: benchPods / window, window: window, cores: cpu1.coresSince(cpu0, window), writes: reqs.writes() / benchPods}
	b.Logf("no scheduler: %d pods created and their claims made in %.2f s from the first create: %.1f pods/s; CPU (cores over the window): %s",
		benchPods, window, r.podsPerSec, formatCores(r.cores))
	b.Logf("apiserver requests a pod, %s", reqs.perPod(benchPods))
	uptime(b, "after "+noScheduler)
	return r
}

// BenchmarkKubeGang: the decisions carried out are topoctl place
// --dry-run's for the same state, and 16-pod gangs of 8 GPUs a pod are
// bound soon after their last pod's creation (p50, p99, max of
// benchGangs gangs).
func BenchmarkKubeGang(b *testing.B) {
	gangs := benchGangs
	if s := os.Getenv("TOPOSCHED_BENCH_GANGS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			b.Fatalf("TOPOSCHED_BENCH_GANGS=%q: want a count of gangs", s)
		}
		gangs = n
	}
	// Each gang's time from its last pod's creation until its last pod
	// is bound, and the steps between: every claim made (the controller
	// manager), the job submitted and decided (when the streams stored
	// them), the pods bound.
	var lat, claimed, submitted, decided, bound []time.Duration
	equal := 0
	for range b.N {
		kc := startKube(b)
		kc.addGPUClass(b)
		nodes := benchNodeNames(benchGangNodes)
		addBenchNodes(b, kc, nodes)
		for _, n := range []int{1, 2, 4, 8} {
			kc.addClaimTemplate(b, kubeNS, gpusTemplate(n), n)
		}
		kc.grant(b, kubeRules(b))
		e := newBenchEnv(b, kc, nodes)
		e.startServe(b)
		w := watchPods(b, kc)
		equal += compareWithDryRun(b, e, w)
		uptime(b, "before the gangs")
		js := jsConnect(b, e.url())
		req0 := sampleRequests(b, kc)
		ann := map[string]string{"toposched.io/parallelism": fmt.Sprintf("tp=8,dp=%d", benchGangPods)}
		for g := range gangs {
			name := fmt.Sprintf("gang-%02d", g)
			pods := make([]*corev1.Pod, benchGangPods)
			names := make([]string, benchGangPods)
			for i := range pods {
				pods[i] = jobSetPod(name, i, benchGangPods, gpusTemplate(8), ann)
				names[i] = pods[i].Name
			}
			// The last pod is created no earlier than the last Create
			// call began: timed from there, a gang's time is not less
			// than it was.
			began := createPods(b, kc, pods, benchGangPods)
			lastCreated := slices.MaxFunc(began, func(a, b time.Time) int { return a.Compare(b) })
			waitFor(b, 2*time.Minute, func() (bool, string) {
				n := w.boundCount(names...)
				return n == len(names), fmt.Sprintf("gang %s: %d of %d pods bound; events of its first pod: %s", name, n, len(names), kc.eventsOf(b, names[0]))
			})
			last := w.lastBound(names...)
			id := kc.pod(b, names[0]).Annotations["toposched.io/placed-job"]
			_, sub := streamEvent(b, js, streamJobs, subjectSubmitted, id)
			_, dec := streamEvent(b, js, streamPlacement, subjectDecided, id)
			claimedAt := w.lastClaimed(names...)
			lat = append(lat, last.Sub(lastCreated))
			claimed = append(claimed, claimedAt.Sub(lastCreated))
			submitted = append(submitted, sub.Sub(claimedAt))
			decided = append(decided, dec.Sub(sub))
			bound = append(bound, last.Sub(dec))
			checkGang(b, kc, names)
			kc.deletePods(b, names...)
			waitNoClaims(b, kc)
		}
		// Of every client, from the first gang's creation to the last
		// one's deletion.
		b.Logf("apiserver requests a gang, created, bound and deleted, %s", sampleRequests(b, kc).since(req0).perPod(gangs))
		uptime(b, "after the gangs")
	}
	b.Logf("each gang's last pod bound after its last pod's creation (%d gangs): %v", len(lat), lat)
	for _, d := range [][]time.Duration{lat, claimed, submitted, decided, bound} {
		slices.Sort(d)
	}
	b.Logf("medians: claims made %v after the last creation, the job submitted %v later, decided %v later, every pod bound %v later; slowest: %v, %v, %v, %v",
		percentile(claimed, 50), percentile(submitted, 50), percentile(decided, 50), percentile(bound, 50),
		claimed[len(claimed)-1], submitted[len(submitted)-1], decided[len(decided)-1], bound[len(bound)-1])
	msOf := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	b.ReportMetric(msOf(percentile(lat, 50)), "p50-ms")
	b.ReportMetric(msOf(percentile(lat, 99)), "p99-ms")
	b.ReportMetric(msOf(lat[len(lat)-1]), "max-ms")
	b.ReportMetric(msOf(percentile(claimed, 50)), "claims-p50-ms")
	b.ReportMetric(msOf(percentile(submitted, 50)), "submit-p50-ms")
	b.ReportMetric(msOf(percentile(decided, 50)), "decide-p50-ms")
	b.ReportMetric(msOf(percentile(bound, 50)), "bind-p50-ms")
	b.ReportMetric(float64(equal)/float64(b.N), "dry-run-equal")
	b.ReportMetric(0, "ns/op")
}

func gpusTemplate(n int) string { return fmt.Sprintf("gpus-%d", n) }

// percentile is the nearest-rank percentile p (0-100) of durations.
func percentile(ds []time.Duration, p float64) time.Duration {
	sorted := slices.Sorted(slices.Values(ds))
	i := int(math.Ceil(p/100*float64(len(sorted)))) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

// compareWithDryRun runs a few lone pods of 1, 2, 4 and 8 GPUs, one after
// the other, and then a 16-pod gang beside them, and checks that what the
// service carried out for each (the nodes the pods are bound to, the GPUs
// their claims hold) is what topoctl place --dry-run decides for the job
// the service submitted, on the cluster file serve runs on, with the GPUs
// the claims held before the job as --occupied. It returns how many of
// the decisions were the dry run's, and leaves no pod behind.
func compareWithDryRun(b *testing.B, e *benchEnv, w *podWatch) int {
	b.Helper()
	type job struct {
		pods []*corev1.Pod
	}
	var jobs []job
	for i, n := range []int{1, 2, 4, 1, 8, 2, 1} {
		jobs = append(jobs, job{pods: []*corev1.Pod{lonePod(fmt.Sprintf("solo-%d", i), gpusTemplate(n))}})
	}
	gang := job{}
	for i := range benchGangPods {
		gang.pods = append(gang.pods, jobSetPod("gang-dry", i, benchGangPods, gpusTemplate(8),
			map[string]string{"toposched.io/parallelism": fmt.Sprintf("tp=8,dp=%d", benchGangPods)}))
	}
	jobs = append(jobs, gang)
	var all, said []string
	equal := 0
	for _, j := range jobs {
		occupied := occupiedGPUs(b, e.kubeCluster)
		names := make([]string, len(j.pods))
		for i, p := range j.pods {
			names[i] = p.Name
		}
		all = append(all, names...)
		createPods(b, e.kubeCluster, j.pods, len(j.pods))
		waitFor(b, 2*time.Minute, func() (bool, string) {
			n := w.boundCount(names...)
			return n == len(names), fmt.Sprintf("%d of %d pods of %s bound; events: %s", n, len(names), names[0], e.eventsOf(b, names[0]))
		})
		bound := make([]*corev1.Pod, len(names))
		for i, n := range names {
			bound[i] = e.pod(b, n)
		}
		id := bound[0].Annotations["toposched.io/placed-job"]
		dry := e.dryRun(b, id, occupied)
		got := e.decision(b, id)
		if !sameRanks(got.Ranks, dry.Ranks) {
			b.Errorf("job %s (pods %v): placement decided %v; topoctl place --dry-run with --occupied %v decides %v",
				id, names, rankList(got.Ranks), occupied, rankList(dry.Ranks))
			continue
		}
		same := true
		byRank := map[int]rankJSON{}
		for _, r := range dry.Ranks {
			byRank[r.Rank] = r
		}
		for _, p := range bound {
			first, err := strconv.Atoi(p.Annotations["toposched.io/rank"])
			if err != nil {
				b.Fatalf("pod %s: rank annotation %q: %v", p.Name, p.Annotations["toposched.io/rank"], err)
			}
			devs := allocatedDevices(e.claimOf(b, p))
			var want []string
			for r := first; r < first+len(devs); r++ {
				if byRank[r].Node != p.Spec.NodeName {
					same = false
					b.Errorf("job %s: pod %s (ranks from %d) is bound to %s; the dry run puts rank %d on %s", id, p.Name, first, p.Spec.NodeName, r, byRank[r].Node)
				}
				want = append(want, fmt.Sprintf("%s/gpu-%d", byRank[r].Node, byRank[r].GPU))
			}
			slices.Sort(want)
			if !slices.Equal(devs, want) {
				same = false
				b.Errorf("job %s: pod %s's claim holds %v; the dry run gives ranks %d.. %v", id, p.Name, devs, first, want)
			}
		}
		if same {
			equal++
			said = append(said, fmt.Sprintf("%s (%d GPUs, %d occupied before): %s", names[0], len(dry.Ranks), occupiedCount(occupied), nodesOf(dry.Ranks)))
		}
	}
	b.Logf("the service carried out topoctl place --dry-run's decision for %d of %d jobs: %s", equal, len(jobs), strings.Join(said, "; "))
	e.deletePods(b, all...)
	waitNoClaims(b, e.kubeCluster)
	return equal
}

// occupied is the --occupied file's entry of one node.
type occupied struct {
	Node string `json:"node"`
	GPUs []int  `json:"gpus"`
}

func occupiedCount(occ []occupied) int {
	n := 0
	for _, o := range occ {
		n += len(o.GPUs)
	}
	return n
}

// occupiedGPUs are the GPUs allocated to claims, by node (a device
// gpu-<minor> is GPU <minor> of the cluster file's model).
func occupiedGPUs(tb testing.TB, kc *kubeCluster) []occupied {
	tb.Helper()
	ctx, cancel := context.WithTimeout(tb.Context(), kubeCallTimeout)
	defer cancel()
	claims, err := kc.Client.ResourceV1().ResourceClaims(kubeNS).List(ctx, metav1.ListOptions{})
	if err != nil {
		tb.Fatal(err)
	}
	byNode := map[string][]int{}
	for _, c := range claims.Items {
		if c.Status.Allocation == nil {
			continue
		}
		for _, r := range c.Status.Allocation.Devices.Results {
			minor, err := strconv.Atoi(strings.TrimPrefix(r.Device, "gpu-"))
			if err != nil {
				tb.Fatalf("claim %s: device %s is not gpu-<minor>", c.Name, r.Device)
			}
			byNode[r.Pool] = append(byNode[r.Pool], minor)
		}
	}
	out := []occupied{}
	for n, gpus := range byNode {
		slices.Sort(gpus)
		out = append(out, occupied{Node: n, GPUs: gpus})
	}
	slices.SortFunc(out, func(a, b occupied) int { return strings.Compare(a.Node, b.Node) })
	return out
}

func sameRanks(a, b []rankJSON) bool {
	return slices.EqualFunc(a, b, func(x, y rankJSON) bool { return x.Rank == y.Rank && x.Node == y.Node && x.GPU == y.GPU })
}

// nodesOf says where ranks are: node/gpu,gpu,... in rank order.
func nodesOf(rs []rankJSON) string {
	var parts []string
	for i, r := range rs {
		if i == 0 || rs[i-1].Node != r.Node {
			parts = append(parts, r.Node+"/"+strconv.Itoa(r.GPU))
		} else {
			parts[len(parts)-1] += "," + strconv.Itoa(r.GPU)
		}
	}
	return strings.Join(parts, " ")
}

func rankList(rs []rankJSON) string {
	parts := make([]string, len(rs))
	for i, r := range rs {
		parts[i] = fmt.Sprintf("%d:%s/%d", r.Rank, r.Node, r.GPU)
	}
	return "[" + strings.Join(parts, " ") + "]"
}

// benchEnv is a control plane and toposched serve scheduling its pods.
type benchEnv struct {
	kubeEnv
}

// newBenchEnv writes the cluster file of the nodes (DGX H100s, as their
// ResourceSlices) for a serve that starts on startServe.
func newBenchEnv(tb testing.TB, kc *kubeCluster, nodes []string) *benchEnv {
	tb.Helper()
	var cluster strings.Builder
	cluster.WriteString("name: kube\nnodes:\n")
	for _, n := range nodes {
		fmt.Fprintf(&cluster, "  - {name: %s, model: dgx-h100}\n", n)
	}
	dir := tb.TempDir()
	e := &benchEnv{kubeEnv{kubeCluster: kc, cluster: filepath.Join(dir, "cluster.yaml"), dataDir: filepath.Join(dir, "data"), port: freePort(tb)}}
	writeKubeFile(tb, e.cluster, []byte(cluster.String()))
	return e
}

// startServe starts serve with the Kubernetes service, its client limits
// those of kube-scheduler in these runs, and returns when it started and
// when the service said it schedules pods.
func (e *benchEnv) startServe(tb testing.TB) (started, ready time.Time) {
	tb.Helper()
	qps, burst := benchClientQPS, benchClientBurst
	if s := os.Getenv("TOPOSCHED_BENCH_KUBE_QPS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			tb.Fatalf("TOPOSCHED_BENCH_KUBE_QPS=%q: want requests a second", s)
		}
		qps, burst = n, 2*n
	}
	// Runtime settings to try on serve alone, such as GOGC=400: set in
	// the benchmark's own environment they would reach the control
	// plane too.
	env := strings.Fields(os.Getenv("TOPOSCHED_BENCH_SERVE_ENV"))
	started = time.Now()
	e.serve = startServeEnv(tb, "serve", env, e.cluster, e.port, e.dataDir,
		"--kubeconfig", e.kubeconfigFor(tb, kubeToposched), "--lease-ttl", "2s",
		"--kube-qps", strconv.Itoa(qps), "--kube-burst", strconv.Itoa(burst))
	waitFor(tb, time.Minute, func() (bool, string) {
		mustBeAlive(tb, e.serve)
		return strings.Contains(e.serve.output(), "scheduling pods"), "the Kubernetes service has not logged 'scheduling pods'"
	})
	return started, time.Now()
}

// dryRun is topoctl place --dry-run's decision for the job id as the
// service submitted it, on serve's cluster file with occ occupied.
func (e *benchEnv) dryRun(tb testing.TB, id string, occ []occupied) decidedJSON {
	tb.Helper()
	dir := tb.TempDir()
	jobFile, occFile := filepath.Join(dir, "job.json"), filepath.Join(dir, "occupied.json")
	body, _ := streamEvent(tb, jsConnect(tb, e.url()), streamJobs, subjectSubmitted, id)
	writeKubeFile(tb, jobFile, body)
	occJSON, err := json.Marshal(occ)
	if err != nil {
		tb.Fatal(err)
	}
	writeKubeFile(tb, occFile, occJSON)
	out := topoctlOK(tb, e.url(), "place", "--dry-run", "--cluster", e.cluster, "--occupied", occFile, jobFile, "-o", "json")
	var d decidedJSON
	if err := json.Unmarshal([]byte(out), &d); err != nil || len(d.Ranks) == 0 {
		tb.Fatalf("topoctl place --dry-run for %s decided nothing (%v):\n%s", id, err, out)
	}
	return d
}

// streamEvent is the last event of stream on subject (or a subject
// scoped under it) about job id: its body, and when the stream stored it.
func streamEvent(tb testing.TB, js jetstream.JetStream, stream, subject, id string) ([]byte, time.Time) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(tb.Context(), 10*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, stream)
	if err != nil {
		tb.Fatalf("stream %s: %v", stream, err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		tb.Fatalf("stream %s: %v", stream, err)
	}
	for seq := info.State.LastSeq; seq >= info.State.FirstSeq && seq > 0; seq-- {
		m, err := s.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			tb.Fatalf("get %s #%d: %v", stream, seq, err)
		}
		if m.Subject != subject && !strings.HasPrefix(m.Subject, subject+".") {
			continue // the service's submissions are scoped to its identity
		}
		var probe struct {
			JobID string `json:"job_id"`
		}
		if json.Unmarshal(m.Data, &probe) == nil && probe.JobID == id {
			return m.Data, m.Time
		}
	}
	tb.Fatalf("no %s for job %s in %s", subject, id, stream)
	return nil, time.Time{}
}

// startKubeScheduler starts kube-scheduler (default profile, no leader
// election, client limits benchClientQPS and benchClientBurst) as the
// admin, and returns when it started and when it answered /healthz.
func startKubeScheduler(tb testing.TB, kc *kubeCluster) (started, ready time.Time) {
	tb.Helper()
	bin := filepath.Join(kubeBin(tb), "kube-scheduler")
	if _, err := os.Stat(bin); err != nil {
		tb.Skipf("no kube-scheduler beside the control plane (%v): run tools/kube/build.sh, which builds it too", err)
	}
	config := filepath.Join(kc.Dir, "kube-scheduler.yaml")
	writeKubeFile(tb, config, fmt.Appendf(nil, `apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection:
  kubeconfig: %q
  qps: %d
  burst: %d
leaderElection:
  leaderElect: false
`, kc.Kubeconfig, benchClientQPS, benchClientBurst))
	port := freePort(tb)
	started = time.Now()
	p := startKubeProc(tb, kc.Dir, "kube-scheduler", bin, "--config="+config,
		"--bind-address=127.0.0.1", fmt.Sprintf("--secure-port=%d", port), "--cert-dir="+filepath.Join(kc.Dir, "scheduler-certs"))
	p.waitHealthy(tb, fmt.Sprintf("https://127.0.0.1:%d/healthz", port), "", "ok")
	return started, time.Now()
}

// benchNodeNames are n node names that sort in order.
func benchNodeNames(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("node-%03d", i)
	}
	return out
}

// addBenchNodes is addNode and addGPUSlice (eight H100s) for many nodes
// at once: every node created, then each made Ready by kwok and its
// not-ready taint lifted.
func addBenchNodes(tb testing.TB, kc *kubeCluster, names []string) {
	tb.Helper()
	errs := parallel(len(names), 8, func(i int) error {
		ctx, cancel := context.WithTimeout(tb.Context(), kubeCallTimeout)
		defer cancel()
		_, err := kc.Client.CoreV1().Nodes().Create(ctx, kwokNode(names[i], nil), metav1.CreateOptions{})
		return err
	})
	if err := errors.Join(errs...); err != nil {
		tb.Fatalf("create nodes: %v", err)
	}
	want := map[string]bool{}
	for _, n := range names {
		want[n] = true
	}
	waitFor(tb, kubeStartTimeout, func() (bool, string) {
		ctx, cancel := context.WithTimeout(tb.Context(), kubeCallTimeout)
		defer cancel()
		list, err := kc.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		waiting := 0
		for i := range list.Items {
			n := &list.Items[i]
			if !want[n.Name] {
				continue
			}
			if !nodeReady(n) {
				waiting++
				continue
			}
			kept := slices.DeleteFunc(slices.Clone(n.Spec.Taints), func(tn corev1.Taint) bool { return tn.Key == notReadyTaint })
			if len(kept) != len(n.Spec.Taints) {
				waiting++
				n.Spec.Taints = kept
				_, _ = kc.Client.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}) // a conflict is tried again on the next look
			}
		}
		return waiting == 0 && len(list.Items) >= len(names), fmt.Sprintf("%d of %d nodes not Ready or still tainted %s", waiting, len(names), notReadyTaint)
	})
	for _, n := range names {
		kc.addGPUSlice(tb, n, h100s(n))
	}
}

// parallel runs f(0..n-1) on workers goroutines and returns its errors.
func parallel(n, workers int, f func(i int) error) []error {
	errs := make([]error, n)
	next := make(chan int)
	var wg sync.WaitGroup
	for range min(workers, n) {
		wg.Go(func() {
			for i := range next {
				errs[i] = f(i)
			}
		})
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	return errs
}

// createPods creates the pods on workers goroutines and returns when each
// Create call began, in the pods' order.
func createPods(tb testing.TB, kc *kubeCluster, pods []*corev1.Pod, workers int) []time.Time {
	tb.Helper()
	began := make([]time.Time, len(pods))
	errs := parallel(len(pods), workers, func(i int) error {
		ctx, cancel := context.WithTimeout(tb.Context(), kubeCallTimeout)
		defer cancel()
		began[i] = time.Now()
		_, err := kc.Client.CoreV1().Pods(pods[i].Namespace).Create(ctx, pods[i], metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("create pod %s: %w", pods[i].Name, err)
		}
		return nil
	})
	if err := errors.Join(errs...); err != nil {
		tb.Fatal(err)
	}
	return began
}

// podWatch is this process's pod informer on the scenario's namespace: it
// notes when each pod was first seen bound and whether its claim is made.
type podWatch struct {
	mu      sync.Mutex
	bound   map[string]time.Time
	claimed map[string]time.Time
	running map[string]bool
}

func watchPods(tb testing.TB, kc *kubeCluster) *podWatch {
	tb.Helper()
	w := &podWatch{bound: map[string]time.Time{}, claimed: map[string]time.Time{}, running: map[string]bool{}}
	factory := informers.NewSharedInformerFactoryWithOptions(kc.Client, 0, informers.WithNamespace(kubeNS))
	inf := factory.Core().V1().Pods().Informer()
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    w.see,
		UpdateFunc: func(_, obj any) { w.see(obj) },
	}); err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	factory.Start(ctx.Done())
	tb.Cleanup(func() {
		cancel()
		factory.Shutdown()
	})
	if !cache.WaitForCacheSync(tb.Context().Done(), inf.HasSynced) {
		tb.Fatal("the pod informer did not sync")
	}
	return w
}

func (w *podWatch) see(obj any) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	now := time.Now()
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, seen := w.bound[p.Name]; !seen && p.Spec.NodeName != "" {
		w.bound[p.Name] = now
	}
	if _, seen := w.claimed[p.Name]; !seen && slices.ContainsFunc(p.Status.ResourceClaimStatuses,
		func(st corev1.PodResourceClaimStatus) bool { return st.ResourceClaimName != nil }) {
		w.claimed[p.Name] = now
	}
	if p.Status.Phase == corev1.PodRunning {
		w.running[p.Name] = true
	}
}

func (w *podWatch) runningCount() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.running)
}

// boundCount is how many of names are bound (of all pods, without names).
func (w *podWatch) boundCount(names ...string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(names) == 0 {
		return len(w.bound)
	}
	n := 0
	for _, name := range names {
		if _, ok := w.bound[name]; ok {
			n++
		}
	}
	return n
}

func (w *podWatch) claimedCount() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.claimed)
}

// lastBound is when the last of names (of all pods, without names) was
// seen bound.
func (w *podWatch) lastBound(names ...string) time.Time { return w.last(w.bound, names) }

// lastClaimed is when the last of names was seen with its claim made.
func (w *podWatch) lastClaimed(names ...string) time.Time { return w.last(w.claimed, names) }

func (w *podWatch) last(m map[string]time.Time, names []string) time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	var last time.Time
	for name, at := range m {
		if (len(names) == 0 || slices.Contains(names, name)) && at.After(last) {
			last = at
		}
	}
	return last
}

// checkOneGPUEach checks the outcome of a pods run: every pod bound, its
// claim holding one GPU of its node, no GPU in two claims.
func checkOneGPUEach(tb testing.TB, kc *kubeCluster, names []string) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(tb.Context(), kubeCallTimeout)
	defer cancel()
	pods, err := kc.Client.CoreV1().Pods(kubeNS).List(ctx, metav1.ListOptions{})
	if err != nil {
		tb.Fatal(err)
	}
	claims, err := kc.Client.ResourceV1().ResourceClaims(kubeNS).List(ctx, metav1.ListOptions{})
	if err != nil {
		tb.Fatal(err)
	}
	byName := map[string]*resourcev1.ResourceClaim{}
	for i := range claims.Items {
		byName[claims.Items[i].Name] = &claims.Items[i]
	}
	seen := map[string]string{}
	checked := 0
	for i := range pods.Items {
		p := &pods.Items[i]
		if !slices.Contains(names, p.Name) {
			continue
		}
		checked++
		var cl *resourcev1.ResourceClaim
		for _, st := range p.Status.ResourceClaimStatuses {
			if st.ResourceClaimName != nil {
				cl = byName[*st.ResourceClaimName]
			}
		}
		if cl == nil {
			tb.Errorf("pod %s: no claim", p.Name)
			continue
		}
		devs := allocatedDevices(cl)
		if len(devs) != 1 || !strings.HasPrefix(devs[0], p.Spec.NodeName+"/") {
			tb.Errorf("pod %s on %q: its claim holds %v", p.Name, p.Spec.NodeName, devs)
		}
		for _, d := range devs {
			if prev, dup := seen[d]; dup {
				tb.Errorf("%s allocated to the claims of %s and %s", d, prev, p.Name)
			}
			seen[d] = p.Name
		}
	}
	if checked != len(names) {
		tb.Errorf("%d of %d pods found", checked, len(names))
	}
}

// checkGang checks a bound gang: each pod's claim holds 8 GPUs of its
// node, no GPU twice.
func checkGang(tb testing.TB, kc *kubeCluster, names []string) {
	tb.Helper()
	seen := map[string]string{}
	for _, n := range names {
		p := kc.pod(tb, n)
		devs := allocatedDevices(kc.claimOf(tb, p))
		if len(devs) != 8 {
			tb.Errorf("pod %s's claim holds %v, want 8 GPUs", n, devs)
		}
		for _, d := range devs {
			if !strings.HasPrefix(d, p.Spec.NodeName+"/") {
				tb.Errorf("pod %s is on %s but its claim holds %s", n, p.Spec.NodeName, d)
			}
			if prev, dup := seen[d]; dup {
				tb.Errorf("%s allocated to the claims of %s and %s", d, prev, n)
			}
			seen[d] = n
		}
	}
}

// waitNoClaims waits until the namespace has no claim left (the garbage
// collector deletes a deleted pod's claims, once the resourceclaim
// controller has removed their finalizer).
func waitNoClaims(tb testing.TB, kc *kubeCluster) {
	tb.Helper()
	waitFor(tb, 2*time.Minute, func() (bool, string) {
		ctx, cancel := context.WithTimeout(tb.Context(), kubeCallTimeout)
		defer cancel()
		list, err := kc.Client.ResourceV1().ResourceClaims(kubeNS).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		return len(list.Items) == 0, fmt.Sprintf("%d claims left", len(list.Items))
	})
}

// apiRequests are the apiserver's requests so far (its
// apiserver_request_total), by verb and resource.
type apiRequests map[string]float64

// sampleRequests reads the apiserver's /metrics.
func sampleRequests(tb testing.TB, kc *kubeCluster) apiRequests {
	tb.Helper()
	ctx, cancel := context.WithTimeout(tb.Context(), kubeCallTimeout)
	defer cancel()
	body, err := kc.Client.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		tb.Fatalf("apiserver /metrics: %v", err)
	}
	out := apiRequests{}
	for line := range strings.Lines(string(body)) {
		rest, ok := strings.CutPrefix(line, "apiserver_request_total{")
		if !ok {
			continue
		}
		labels, value, ok := strings.Cut(rest, "} ")
		if !ok {
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(value), 64)
		if err != nil {
			continue
		}
		l := map[string]string{}
		for kv := range strings.SplitSeq(labels, ",") {
			if k, val, ok := strings.Cut(kv, "="); ok {
				l[k] = strings.Trim(val, `"`)
			}
		}
		key := l["verb"] + " " + l["resource"]
		if l["subresource"] != "" {
			key += "/" + l["subresource"]
		}
		out[key] += v
	}
	return out
}

func (r apiRequests) since(r0 apiRequests) apiRequests {
	out := apiRequests{}
	for k, v := range r {
		if d := v - r0[k]; d > 0 {
			out[k] = d
		}
	}
	return out
}

// isWrite reports whether a request key (verb resource) writes.
func isWrite(key string) bool {
	verb, _, _ := strings.Cut(key, " ")
	return verb == "POST" || verb == "PUT" || verb == "PATCH" || verb == "DELETE" || verb == "APPLY"
}

func (r apiRequests) writes() float64 {
	n := 0.0
	for k, v := range r {
		if isWrite(k) {
			n += v
		}
	}
	return n
}

// perPod lists the writes, then the reads, of at least 0.05 a pod, most
// first.
func (r apiRequests) perPod(pods int) string {
	type kv struct {
		k string
		v float64
	}
	var out []string
	for _, writes := range []bool{true, false} {
		var list []kv
		all := 0.0
		for k, v := range r {
			if isWrite(k) != writes {
				continue
			}
			all += v
			if v/float64(pods) >= 0.05 {
				list = append(list, kv{k, v / float64(pods)})
			}
		}
		slices.SortFunc(list, func(a, b kv) int { return cmp.Compare(b.v, a.v) })
		parts := make([]string, 0, len(list)+1)
		for _, e := range list {
			parts = append(parts, fmt.Sprintf("%s %.2f", e.k, e.v))
		}
		parts = append(parts, fmt.Sprintf("all %.2f", all/float64(pods)))
		out = append(out, strings.Join(parts, ", "))
	}
	return "writes: " + out[0] + "; reads: " + out[1]
}

// uptime logs the load average, for the record of a shared machine.
func uptime(tb testing.TB, when string) {
	tb.Helper()
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		tb.Logf("load average %s: %s", when, strings.TrimSpace(string(b)))
	}
}

// cpuSample is the CPU seconds (user and system) used so far by this
// process ("bench") and by each of its children, by command name.
type cpuSample map[string]float64

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat's times: 100 on
// every Linux architecture Go runs on.
const clockTicks = 100

// sampleCPU reads /proc; empty where there is none.
func sampleCPU() cpuSample {
	out := cpuSample{}
	self := os.Getpid()
	dirs, _ := os.ReadDir("/proc")
	for _, d := range dirs {
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		data, err := os.ReadFile(filepath.Join("/proc", d.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ... utime stime: fields 14 and 15; comm
		// may hold spaces, so fields are counted after its ')'.
		s := string(data)
		open, close := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
		if open < 0 || close < open {
			continue
		}
		comm, rest := s[open+1:close], strings.Fields(s[close+1:])
		if len(rest) < 13 {
			continue
		}
		ppid, _ := strconv.Atoi(rest[1])
		if pid != self && ppid != self {
			continue
		}
		if pid == self {
			comm = "bench"
		}
		utime, _ := strconv.ParseFloat(rest[11], 64)
		stime, _ := strconv.ParseFloat(rest[12], 64)
		out[benchProcName(comm)] += (utime + stime) / clockTicks
	}
	return out
}

// peakRSSMB is the peak resident memory (VmHWM) of this process's child
// named name (benchProcName's names), in MB; 0 where there is none.
func peakRSSMB(name string) float64 {
	self := strconv.Itoa(os.Getpid())
	dirs, _ := os.ReadDir("/proc")
	for _, d := range dirs {
		if _, err := strconv.Atoi(d.Name()); err != nil {
			continue
		}
		data, err := os.ReadFile(filepath.Join("/proc", d.Name(), "status"))
		if err != nil {
			continue
		}
		var comm, ppid string
		kb := 0.0
		for line := range strings.Lines(string(data)) {
			k, v, _ := strings.Cut(line, ":")
			v = strings.TrimSpace(v)
			switch k {
			case "Name":
				comm = v
			case "PPid":
				ppid = v
			case "VmHWM":
				kb, _ = strconv.ParseFloat(strings.TrimSuffix(v, " kB"), 64)
			}
		}
		if ppid == self && benchProcName(comm) == name {
			return kb / 1000
		}
	}
	return 0
}

// benchProcName shortens a command name (the kernel keeps 15 bytes of it).
func benchProcName(comm string) string {
	switch comm {
	case "kube-apiserver":
		return "apiserver"
	case "kube-controller":
		return "kcm"
	case "toposched":
		return "serve"
	}
	return comm
}

// coresSince is the cores each process used on average over window
// seconds since s0.
func (s cpuSample) coresSince(s0 cpuSample, window float64) map[string]float64 {
	out := map[string]float64{}
	for k, v := range s {
		if d := v - s0[k]; d > 0 && window > 0 {
			out[k] = d / window
		}
	}
	return out
}

func formatCores(m map[string]float64) string {
	keys := make([]string, 0, len(m))
	total := 0.0
	for k, v := range m {
		keys = append(keys, k)
		total += v
	}
	sort.Strings(keys)
	parts := make([]string, 0, len(keys)+1)
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %.2f", k, m[k]))
	}
	parts = append(parts, fmt.Sprintf("total %.2f", total))
	return strings.Join(parts, ", ")
}
