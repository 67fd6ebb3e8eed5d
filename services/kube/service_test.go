package kube

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/events/bus"
	"github.com/toposched/toposched/events/eventstest"
)

// The component tests run the whole service against client-go's fake
// clientset and an embedded NATS server: what a real control plane adds
// (the controller manager, kubelets) is e2e/kube_test.go's.

// waitTimeout bounds every wait: generous for a loaded machine, never
// reached when the service works.
const waitTimeout = 30 * time.Second

// eventually polls cond until it holds, failing the test with cond's last
// word at the deadline.
func eventually(t *testing.T, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		ok, why := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s: %s", what, waitTimeout, why)
		}
		<-tick.C
	}
}

var podsResource = corev1.SchemeGroupVersion.WithResource("pods")

// fakeCluster is a fake clientset that binds as the API server does: a
// Binding sets the pod's spec.nodeName and merges the Binding's
// annotations into the pod's (the fake alone stores nothing for it).
type fakeCluster struct {
	*fake.Clientset
	mu       sync.Mutex
	bindings []*corev1.Binding
	// bindFault, where set, is the error a Binding of a pod gets.
	bindFault func(pod string) error
}

func newFakeCluster(objs ...runtime.Object) *fakeCluster {
	c := &fakeCluster{Clientset: fake.NewClientset(objs...)}
	c.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		create, ok := a.(k8stesting.CreateAction)
		if !ok || a.GetSubresource() != "binding" {
			return false, nil, nil
		}
		b := create.GetObject().(*corev1.Binding)
		c.mu.Lock()
		fault := c.bindFault
		c.mu.Unlock()
		if fault != nil {
			if err := fault(b.Name); err != nil {
				return true, nil, err
			}
		}
		// The reactor runs under the fake's lock: the tracker, not the
		// clientset, is read and written here.
		obj, err := c.Tracker().Get(podsResource, b.Namespace, b.Name)
		if err != nil {
			return true, nil, err
		}
		pod := obj.(*corev1.Pod).DeepCopy()
		if b.UID != "" && b.UID != pod.UID {
			return true, nil, apierrors.NewConflict(podsResource.GroupResource(), b.Name, errors.New("the pod's UID differs"))
		}
		if pod.Spec.NodeName != "" {
			return true, nil, apierrors.NewConflict(podsResource.GroupResource(), b.Name,
				fmt.Errorf("pod %s is already assigned to node %q", b.Name, pod.Spec.NodeName))
		}
		pod.Spec.NodeName = b.Target.Name
		if len(b.Annotations) > 0 && pod.Annotations == nil {
			pod.Annotations = map[string]string{}
		}
		maps.Copy(pod.Annotations, b.Annotations)
		if err := c.Tracker().Update(podsResource, pod, b.Namespace); err != nil {
			return true, nil, err
		}
		c.mu.Lock()
		c.bindings = append(c.bindings, b.DeepCopy())
		c.mu.Unlock()
		return true, b, nil
	})
	return c
}

func (c *fakeCluster) boundTo() map[string]*corev1.Binding {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[string]*corev1.Binding{}
	for _, b := range c.bindings {
		out[b.Name] = b
	}
	return out
}

func (c *fakeCluster) pod(t *testing.T, name string) *corev1.Pod {
	t.Helper()
	p, err := c.CoreV1().Pods("team-a").Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func (c *fakeCluster) claim(t *testing.T, name string) *resourceapi.ResourceClaim {
	t.Helper()
	cl, err := c.ResourceV1().ResourceClaims("team-a").Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return cl
}

// eventsOf are the Events on a pod, as "Reason: message".
func (c *fakeCluster) eventsOf(t *testing.T, pod string) []string {
	t.Helper()
	list, err := c.CoreV1().Events("team-a").List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range list.Items {
		if e.InvolvedObject.Kind == "Pod" && e.InvolvedObject.Name == pod {
			out = append(out, e.Reason+": "+e.Message)
		}
	}
	slices.Sort(out)
	return out
}

// gpuClass is the DeviceClass NVIDIA's chart installs.
func gpuClass() *resourceapi.DeviceClass {
	return &resourceapi.DeviceClass{
		ObjectMeta: metav1.ObjectMeta{Name: DefaultGPUDriver},
		Spec: resourceapi.DeviceClassSpec{Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
			Expression: "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'",
		}}}},
	}
}

// nodeUUID is the UUID of GPU index i of a node.
func nodeUUID(node string, i int) string {
	return fmt.Sprintf("GPU-%08x-0000-4000-8000-%012d", len(node)*7919+int(node[len(node)-1]), i)
}

// clusterNode is a Ready node with four GPUs: its topology (as agent
// discovery publishes it) and its ResourceSlice, whose devices' minors
// are not the GPUs' indexes (gpu-<m> is index 3-m), so that only the
// UUIDs match them.
func clusterNode(name string) (*corev1.Node, *resourceapi.ResourceSlice, *events.TopologyNode) {
	topo := &events.TopologyNode{Name: name, GPUModel: "NVIDIA H100 80GB HBM3"}
	var devices []resourceapi.Device
	for i := range 4 {
		topo.GPUs = append(topo.GPUs, events.GPU{Index: i, UUID: nodeUUID(name, i), BusID: smiBusIDs[i], Model: topo.GPUModel})
		devices = append(devices, gpuDevice(3-i, strings.ToLower(nodeUUID(name, i)), draBusIDs[i]))
	}
	return readyNode(name), nodeSlice(name+"-gpu.nvidia.com", name, DefaultGPUDriver, devices...), topo
}

// gangPod is pod index of a JobSet "train" of size pods (one pod per Job,
// as jobset makes them), holding the claim made from a template, with the
// claim as the controller manager makes it: a request "gpus" of n GPUs.
func gangPod(index, size, gpus int, annotations map[string]string) (*corev1.Pod, *resourceapi.ResourceClaim) {
	name := fmt.Sprintf("train-workers-%d-0", index)
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: name, UID: types.UID("pod-uid-" + name),
			Labels: map[string]string{
				LabelJobSetName: "train", LabelReplicatedJobName: "workers",
				LabelJobIndex: strconv.Itoa(index), LabelJobGlobalIndex: strconv.Itoa(index),
				LabelJobCompletionIndex: "0",
			},
			Annotations: map[string]string{AnnotationGangSize: strconv.Itoa(size)},
		},
		Spec: corev1.PodSpec{
			SchedulerName: DefaultSchedulerName, Hostname: name, Subdomain: "train",
			Containers: []corev1.Container{{Name: "main", Image: "trainer"}},
		},
	}
	maps.Copy(p.Annotations, annotations)
	return p, withClaim(p, gpus)
}

// lone is a pod of no workload with a claim of gpus GPUs.
func lone(name string, gpus int, annotations map[string]string) (*corev1.Pod, *resourceapi.ResourceClaim) {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: name, UID: types.UID("pod-uid-" + name), Annotations: annotations},
		Spec:       corev1.PodSpec{SchedulerName: DefaultSchedulerName, Containers: []corev1.Container{{Name: "main", Image: "trainer"}}},
	}
	return p, withClaim(p, gpus)
}

// withClaim gives the pod a claim from the template "gpus", made as the
// controller manager makes it, and returns the claim.
func withClaim(p *corev1.Pod, gpus int) *resourceapi.ResourceClaim {
	claim := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Name + "-gpus-x7k2p", UID: types.UID("claim-uid-" + p.Name),
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: p.Name, UID: p.UID, Controller: new(true)}}},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
			Name: "gpus",
			Exactly: &resourceapi.ExactDeviceRequest{
				DeviceClassName: DefaultGPUDriver, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: int64(gpus),
			},
		}}}},
	}
	p.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "gpus", ResourceClaimTemplateName: new("gpus")}}
	p.Spec.Containers[0].Resources.Claims = []corev1.ResourceClaim{{Name: "gpus"}}
	p.Status.ResourceClaimStatuses = []corev1.PodResourceClaimStatus{{Name: "gpus", ResourceClaimName: new(claim.Name)}}
	return claim
}

// env is the service running against a fake cluster and an embedded NATS
// server, with a second bus connection for the test (as placement and
// discovery would publish).
type env struct {
	t       *testing.T
	cluster *fakeCluster
	b       *bus.Bus // the test's connection
	stop    func()
	url     string
	ctx     context.Context

	mu   sync.Mutex
	jobs []bus.Record // jobs.submitted and jobs.finished, in stream order
}

// startEnv publishes topos, then starts the service on a fake cluster of
// objs, and follows the jobs stream.
func startEnv(t *testing.T, topos []*events.TopologyNode, objs ...runtime.Object) *env {
	t.Helper()
	srv := eventstest.Server(t)
	e := &env{t: t, cluster: newFakeCluster(objs...), b: eventstest.Bus(t, srv.ClientURL(), "test"), url: srv.ClientURL()}
	ctx := eventstest.Context(t, 2*time.Minute)
	e.ctx = ctx
	for _, n := range topos {
		if _, err := e.b.Publish(ctx, n); err != nil {
			t.Fatalf("publish topology of %s: %v", n.Name, err)
		}
	}
	followCtx, stopFollow := context.WithCancel(ctx)
	followed := make(chan error, 1)
	go func() {
		followed <- e.b.FollowFrom(followCtx, events.DomainJobs,
			[]string{e.b.Subjects.Of(events.NameJobSubmitted), e.b.Subjects.Of(events.NameJobFinished)}, 0, nil,
			func(r bus.Record) error {
				e.mu.Lock()
				e.jobs = append(e.jobs, r)
				e.mu.Unlock()
				return nil
			})
	}()
	t.Cleanup(func() {
		stopFollow()
		if err := <-followed; err != nil {
			t.Errorf("follow jobs: %v", err)
		}
	})

	e.start()
	return e
}

// start starts a service on the env's cluster and streams and waits until
// it is ready; a second start after stop is a restart, or a new leader.
func (e *env) start() {
	t := e.t
	t.Helper()
	log := slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	svc, err := New(Config{Resync: time.Hour}, Deps{Kube: e.cluster, Bus: eventstest.Bus(t, e.url, "kube"), Log: log})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(e.ctx)
	ran := make(chan error, 1)
	go func() { ran <- svc.Run(runCtx) }()
	var once sync.Once
	e.stop = func() {
		once.Do(func() {
			cancel()
			if err := <-ran; err != nil {
				t.Errorf("service: %v", err)
			}
		})
	}
	t.Cleanup(e.stop)
	select {
	case <-svc.Ready():
	case err := <-ran:
		ran <- err // for e.stop, which the cleanup calls
		t.Fatalf("service ended before it was ready: %v", err)
	case <-time.After(waitTimeout):
		t.Fatalf("service not ready within %s", waitTimeout)
	}
}

// testWriter sends the service's log to the test's.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// submitted are the jobs.submitted seen so far.
func (e *env) submitted() []events.JobSubmitted {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []events.JobSubmitted
	for _, r := range e.jobs {
		if r.Name == events.NameJobSubmitted {
			var ev events.JobSubmitted
			if err := e.b.Decode(r.Name, r.Body, &ev); err != nil {
				e.t.Fatalf("decode %s: %v", r.Name, err)
			}
			out = append(out, ev)
		}
	}
	return out
}

// finishedOf are the jobs.finished of a job seen so far.
func (e *env) finishedOf(id string) []events.JobFinished {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []events.JobFinished
	for _, r := range e.jobs {
		if r.Name == events.NameJobFinished {
			var ev events.JobFinished
			if err := e.b.Decode(r.Name, r.Body, &ev); err != nil {
				e.t.Fatalf("decode %s: %v", r.Name, err)
			}
			if ev.JobID == id {
				out = append(out, ev)
			}
		}
	}
	return out
}

// stored are the jobs.submitted and jobs.finished the jobs stream holds:
// once the service has stopped, all it published.
func (e *env) stored() (submitted []events.JobSubmitted, finished []events.JobFinished) {
	e.t.Helper()
	err := e.b.Replay(e.t.Context(), events.DomainJobs,
		[]string{e.b.Subjects.Of(events.NameJobSubmitted), e.b.Subjects.Of(events.NameJobFinished)},
		func(r bus.Record) error {
			switch r.Name {
			case events.NameJobSubmitted:
				var ev events.JobSubmitted
				if err := e.b.Decode(r.Name, r.Body, &ev); err != nil {
					return err
				}
				submitted = append(submitted, ev)
			case events.NameJobFinished:
				var ev events.JobFinished
				if err := e.b.Decode(r.Name, r.Body, &ev); err != nil {
					return err
				}
				finished = append(finished, ev)
			}
			return nil
		})
	if err != nil {
		e.t.Fatalf("replay jobs: %v", err)
	}
	return submitted, finished
}

// waitSubmitted waits for the gang's jobs.submitted.
func (e *env) waitSubmitted(gang string) events.JobSubmitted {
	e.t.Helper()
	var got events.JobSubmitted
	eventually(e.t, "jobs.submitted of gang "+gang, func() (bool, string) {
		for _, s := range e.submitted() {
			if s.Labels[LabelGang] == gang {
				got = s
				return true, ""
			}
		}
		return false, fmt.Sprintf("%d jobs.submitted, none of the gang", len(e.submitted()))
	})
	return got
}

// decide publishes a decision of ranks ("node/gpu/nic" each, rank i the
// i-th) for a job, as placement does.
func (e *env) decide(job string, ranks ...string) *events.PlacementDecided {
	e.t.Helper()
	d := decided(job, ranks...)
	byNode := map[string][]int{}
	var order []string
	for i, r := range d.Ranks {
		if byNode[r.Node] == nil {
			order = append(order, r.Node)
		}
		byNode[r.Node] = append(byNode[r.Node], r.GPU)
		d.Ranks[i].LocalRank = len(byNode[r.Node]) - 1
	}
	for _, n := range order {
		var vis []string
		for _, g := range byNode[n] {
			vis = append(vis, strconv.Itoa(g))
		}
		d.Nodes = append(d.Nodes, events.NodePlacement{Node: n, GPUs: byNode[n], CUDAVisibleDevices: strings.Join(vis, ",")})
	}
	d.Launch = &events.Launch{MasterAddr: d.Ranks[0].Node, MasterPort: 29500 + d.Ranks[0].GPU, SlurmNodelist: strings.Join(order, ","), MPIRankfile: "-"}
	if _, err := e.b.Publish(eventstest.Context(e.t, waitTimeout), d); err != nil {
		e.t.Fatalf("publish placement.decided: %v", err)
	}
	return d
}

// allocated renders a claim's allocation as sorted "pool/device" items.
func allocated(c *resourceapi.ResourceClaim) []string {
	if c.Status.Allocation == nil {
		return nil
	}
	var out []string
	for _, r := range c.Status.Allocation.Devices.Results {
		out = append(out, r.Pool+"/"+r.Device)
	}
	slices.Sort(out)
	return out
}

// TestServiceCarriesOutADecision runs a JobSet of two pods of two GPUs
// each through the service: submitted once whole, carried out exactly as
// decided (claims allocated the decided devices and reserved for their
// pods, pods bound with their rank environment), and finished once when
// the pods succeed.
func TestServiceCarriesOutADecision(t *testing.T) {
	nodeA, sliceA, topoA := clusterNode("node-a")
	nodeB, sliceB, topoB := clusterNode("node-b")
	ann := map[string]string{AnnotationParallelism: "tp=2,dp=2", AnnotationLabelPrefix + "team": "vision"}
	pod0, claim0 := gangPod(0, 2, 2, ann)
	pod1, claim1 := gangPod(1, 2, 2, ann)
	e := startEnv(t, []*events.TopologyNode{topoA, topoB},
		nodeA, nodeB, sliceA, sliceB, gpuClass(), claim0, claim1, pod0, pod1)

	gang := Gang{Namespace: "team-a", Kind: KindJobSet, Name: "train"}.Key()
	sub := e.waitSubmitted(gang)
	if !strings.HasPrefix(sub.JobID, JobIDPrefix+"team-a:train:") || !strings.HasSuffix(sub.JobID, "-1") || !events.ValidJobID(sub.JobID) {
		t.Errorf("job id %q, want a valid k8s:team-a:train:<hash>-1", sub.JobID)
	}
	if sub.GPUs != 4 || sub.GPUsPerNode != 2 || sub.Tenant != "team-a" {
		t.Errorf("submitted gpus %d, gpus_per_node %d, tenant %q; want 4, 2, team-a", sub.GPUs, sub.GPUsPerNode, sub.Tenant)
	}
	if want := map[string]string{"team": "vision", LabelGang: gang}; !maps.Equal(sub.Labels, want) {
		t.Errorf("submitted labels %v, want %v", sub.Labels, want)
	}
	if sub.Parallelism == nil || sub.Parallelism.TP != 2 || sub.Parallelism.DP != 2 {
		t.Errorf("submitted parallelism %+v, want tp=2,dp=2", sub.Parallelism)
	}

	// Pod 0 on node-b's GPUs 3 and 1, pod 1 on node-a's 0 and 2: neither
	// the first free GPUs nor, by the slices' naming, gpu-<index>.
	e.decide(sub.JobID, "node-b/3/mlx5_1", "node-b/1/mlx5_0", "node-a/0/mlx5_0", "node-a/2/mlx5_1")
	eventually(t, "both pods bound", func() (bool, string) {
		b := e.cluster.boundTo()
		return len(b) == 2, fmt.Sprintf("%d bindings; events of pod 0: %v", len(b), e.cluster.eventsOf(t, pod0.Name))
	})
	master := "train-workers-0-0.train.team-a.svc"
	wants := []struct {
		pod     *corev1.Pod
		claim   *resourceapi.ResourceClaim
		node    string
		devices []string // gpu-<3-index>
		ann     map[string]string
	}{
		{pod0, claim0, "node-b", []string{"node-b/gpu-0", "node-b/gpu-2"}, map[string]string{
			AnnotationJobID: sub.JobID, AnnotationRank: "0", AnnotationWorldSize: "4", AnnotationLocalRank: "0",
			AnnotationNodeRank: "0", AnnotationNprocPerNode: "2", AnnotationMasterAddr: master, AnnotationMasterPort: "29503",
			AnnotationGPUs: "3,1", AnnotationIBHCA: "mlx5_1,mlx5_0",
		}},
		{pod1, claim1, "node-a", []string{"node-a/gpu-1", "node-a/gpu-3"}, map[string]string{
			AnnotationJobID: sub.JobID, AnnotationRank: "2", AnnotationWorldSize: "4", AnnotationLocalRank: "0",
			AnnotationNodeRank: "1", AnnotationNprocPerNode: "2", AnnotationMasterAddr: master, AnnotationMasterPort: "29503",
			AnnotationGPUs: "0,2", AnnotationIBHCA: "mlx5_0,mlx5_1",
		}},
	}
	bindings := e.cluster.boundTo()
	for _, w := range wants {
		b := bindings[w.pod.Name]
		if b.Target.Kind != "Node" || b.Target.Name != w.node || b.UID != w.pod.UID {
			t.Errorf("pod %s: binding to %s %s (uid %s), want Node %s (uid %s)", w.pod.Name, b.Target.Kind, b.Target.Name, b.UID, w.node, w.pod.UID)
		}
		if !maps.Equal(b.Annotations, w.ann) {
			t.Errorf("pod %s: binding annotations\n got %v\nwant %v", w.pod.Name, b.Annotations, w.ann)
		}
		c := e.cluster.claim(t, w.claim.Name)
		if got := allocated(c); !slices.Equal(got, w.devices) {
			t.Errorf("claim %s allocated %v, decided %v", c.Name, got, w.devices)
		}
		if c.Status.Allocation != nil {
			for _, r := range c.Status.Allocation.Devices.Results {
				if r.Driver != DefaultGPUDriver || r.Request != "gpus" {
					t.Errorf("claim %s: result %+v, want driver %s, request gpus", c.Name, r, DefaultGPUDriver)
				}
			}
		}
		want := []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: w.pod.Name, UID: w.pod.UID}}
		if !slices.Equal(c.Status.ReservedFor, want) {
			t.Errorf("claim %s reserved for %v, want %v", c.Name, c.Status.ReservedFor, want)
		}
		if !slices.Contains(c.Finalizers, finalizer) || c.Annotations[AnnotationJobID] != sub.JobID {
			t.Errorf("claim %s: finalizers %v, job annotation %q; want %s and %s", c.Name, c.Finalizers, c.Annotations[AnnotationJobID], finalizer, sub.JobID)
		}
	}

	for _, p := range []*corev1.Pod{pod0, pod1} {
		cur := e.cluster.pod(t, p.Name)
		cur.Status.Phase = corev1.PodSucceeded
		if _, err := e.cluster.CoreV1().Pods("team-a").UpdateStatus(t.Context(), cur, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "jobs.finished", func() (bool, string) {
		return len(e.finishedOf(sub.JobID)) > 0, "no jobs.finished yet"
	})
	e.stop()
	submitted, finished := e.stored()
	if len(finished) != 1 || finished[0].JobID != sub.JobID || finished[0].Status != events.StatusSucceeded {
		t.Errorf("jobs.finished: %+v, want one, of %s, succeeded", finished, sub.JobID)
	}
	if len(submitted) != 1 {
		t.Errorf("%d jobs.submitted, want 1: %+v", len(submitted), submitted)
	}
}

// TestServiceMalformedAnnotation: a pod whose toposched.io/parallelism
// does not parse gets an Event naming the annotation, and no job; a pod
// beside it is submitted as ever.
func TestServiceMalformedAnnotation(t *testing.T) {
	nodeA, sliceA, topoA := clusterNode("node-a")
	bad, badClaim := lone("bad", 1, map[string]string{AnnotationParallelism: "tp=eight"})
	good, goodClaim := lone("good", 1, map[string]string{AnnotationParallelism: "tp=1"})
	e := startEnv(t, []*events.TopologyNode{topoA}, nodeA, sliceA, gpuClass(), badClaim, bad, goodClaim, good)

	e.waitSubmitted(Gang{Namespace: "team-a", Kind: KindPod, Name: "good"}.Key())
	field := "metadata.annotations['toposched.io/parallelism']"
	eventually(t, "an Event on the pod naming "+field, func() (bool, string) {
		evs := e.cluster.eventsOf(t, "bad")
		for _, ev := range evs {
			if strings.HasPrefix(ev, "FailedScheduling: ") && strings.Contains(ev, field) && strings.Contains(ev, "tp=eight") {
				return true, ""
			}
		}
		return false, fmt.Sprintf("events of pod bad: %q", evs)
	})
	e.stop()
	submitted, _ := e.stored()
	for _, s := range submitted {
		if s.Labels[LabelGang] == (Gang{Namespace: "team-a", Kind: KindPod, Name: "bad"}).Key() {
			t.Errorf("the pod with a malformed annotation was submitted: %+v", s)
		}
	}
	if p := e.cluster.pod(t, "bad"); p.Spec.NodeName != "" {
		t.Errorf("pod bad bound to %s", p.Spec.NodeName)
	}
}

// TestServiceUndoesAPartialCarryOut: a decision that cannot be carried
// out for the second pod (its decided GPU has no device) after the first
// pod's claim was allocated gives that claim back, binds no pod, and
// finishes the job as launch_failed with an Event on the pods saying why;
// the gang is not submitted again.
func TestServiceUndoesAPartialCarryOut(t *testing.T) {
	nodeA, sliceA, topoA := clusterNode("node-a")
	nodeB, sliceB, topoB := clusterNode("node-b")
	// node-b's GPU 1 (device gpu-2) is not in its slice.
	sliceB.Spec.Devices = slices.DeleteFunc(sliceB.Spec.Devices, func(d resourceapi.Device) bool { return d.Name == "gpu-2" })
	pod0, claim0 := gangPod(0, 2, 2, nil)
	pod1, claim1 := gangPod(1, 2, 2, nil)
	e := startEnv(t, []*events.TopologyNode{topoA, topoB},
		nodeA, nodeB, sliceA, sliceB, gpuClass(), claim0, claim1, pod0, pod1)

	sub := e.waitSubmitted(Gang{Namespace: "team-a", Kind: KindJobSet, Name: "train"}.Key())
	e.decide(sub.JobID, "node-a/0", "node-a/1", "node-b/0", "node-b/1")
	eventually(t, "jobs.finished", func() (bool, string) {
		return len(e.finishedOf(sub.JobID)) > 0, "no jobs.finished yet"
	})
	fin := e.finishedOf(sub.JobID)[0]
	why := "GPU 1 of node-b has no gpu.nvidia.com device in the node's ResourceSlices"
	if fin.Status != events.StatusFailed || fin.Reason != events.ReasonLaunchFailed || !strings.Contains(fin.Message, why) {
		t.Errorf("jobs.finished %+v, want failed, launch_failed, saying %q", fin, why)
	}
	// The first pod's claim was allocated before the second's failed...
	allocatedOnce := false
	for _, a := range e.cluster.Actions() {
		if u, ok := a.(k8stesting.UpdateAction); ok && a.GetResource().Resource == "resourceclaims" && a.GetSubresource() == "status" {
			if c := u.GetObject().(*resourceapi.ResourceClaim); c.Name == claim0.Name && c.Status.Allocation != nil {
				allocatedOnce = true
			}
		}
	}
	if !allocatedOnce {
		t.Errorf("claim %s was never allocated: the carry-out did not fail part way", claim0.Name)
	}
	// ...and is given back.
	eventually(t, "the first pod's claim given back", func() (bool, string) {
		c := e.cluster.claim(t, claim0.Name)
		ok := c.Status.Allocation == nil && len(c.Status.ReservedFor) == 0 && len(c.Finalizers) == 0 && c.Annotations[AnnotationJobID] == ""
		return ok, fmt.Sprintf("claim %s: allocated %v, reserved for %v, finalizers %v, annotations %v",
			c.Name, allocated(c), c.Status.ReservedFor, c.Finalizers, c.Annotations)
	})
	for _, p := range []*corev1.Pod{pod0, pod1} {
		eventually(t, "an Event on "+p.Name+" saying why", func() (bool, string) {
			evs := e.cluster.eventsOf(t, p.Name)
			for _, ev := range evs {
				if strings.HasPrefix(ev, "FailedScheduling: toposched cannot carry out its decision for job "+sub.JobID) && strings.Contains(ev, why) {
					return true, ""
				}
			}
			return false, fmt.Sprintf("events: %q", evs)
		})
	}
	e.stop()
	if b := e.cluster.boundTo(); len(b) != 0 {
		t.Errorf("pods bound: %v", slices.Sorted(maps.Keys(b)))
	}
	if c := e.cluster.claim(t, claim1.Name); c.Status.Allocation != nil {
		t.Errorf("claim %s allocated %v", c.Name, allocated(c))
	}
	submitted, finished := e.stored()
	if len(submitted) != 1 || len(finished) != 1 {
		t.Errorf("%d jobs.submitted and %d jobs.finished, want one each: %+v %+v", len(submitted), len(finished), submitted, finished)
	}
}

// TestServiceGangGoneBeforeDecision: a gang whose pods are deleted before
// placement decides is finished as cancelled, so that placement drops it.
func TestServiceGangGoneBeforeDecision(t *testing.T) {
	nodeA, sliceA, topoA := clusterNode("node-a")
	pod0, claim0 := gangPod(0, 2, 1, nil)
	pod1, claim1 := gangPod(1, 2, 1, nil)
	e := startEnv(t, []*events.TopologyNode{topoA}, nodeA, sliceA, gpuClass(), claim0, claim1, pod0, pod1)

	sub := e.waitSubmitted(Gang{Namespace: "team-a", Kind: KindJobSet, Name: "train"}.Key())
	if sub.GPUs != 2 || sub.GPUsPerNode != 0 {
		t.Errorf("submitted gpus %d, gpus_per_node %d; want 2, 0 (pods of one GPU go anywhere)", sub.GPUs, sub.GPUsPerNode)
	}
	for _, p := range []*corev1.Pod{pod0, pod1} {
		if err := e.cluster.CoreV1().Pods("team-a").Delete(t.Context(), p.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "jobs.finished", func() (bool, string) {
		return len(e.finishedOf(sub.JobID)) > 0, "no jobs.finished yet"
	})
	e.stop()
	_, finished := e.stored()
	if len(finished) != 1 || finished[0].JobID != sub.JobID || finished[0].Status != events.StatusCancelled {
		t.Errorf("jobs.finished %+v, want one, of %s, cancelled", finished, sub.JobID)
	}
}

// TestServiceJobFinishedMidCarryOut: a job finished from outside (a
// user's cancel) after its claims were allocated but before its pod could
// be bound gives the claims back, so that they hold no GPU for a pod that
// is not placed.
func TestServiceJobFinishedMidCarryOut(t *testing.T) {
	nodeA, sliceA, topoA := clusterNode("node-a")
	pod, claim := lone("train", 2, nil)
	e := startEnv(t, []*events.TopologyNode{topoA}, nodeA, sliceA, gpuClass(), claim, pod)
	e.cluster.mu.Lock()
	e.cluster.bindFault = func(string) error { return apierrors.NewInternalError(errors.New("etcd is slow")) }
	e.cluster.mu.Unlock()

	sub := e.waitSubmitted(Gang{Namespace: "team-a", Kind: KindPod, Name: "train"}.Key())
	e.decide(sub.JobID, "node-a/0", "node-a/1")
	eventually(t, "the claim allocated", func() (bool, string) {
		c := e.cluster.claim(t, claim.Name)
		return c.Status.Allocation != nil, "not allocated yet"
	})
	if _, err := e.b.Publish(t.Context(), &events.JobFinished{JobID: sub.JobID, Status: events.StatusCancelled, Reason: events.ReasonCancelled}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the claim given back", func() (bool, string) {
		c := e.cluster.claim(t, claim.Name)
		ok := c.Status.Allocation == nil && len(c.Status.ReservedFor) == 0 && len(c.Finalizers) == 0 && c.Annotations[AnnotationJobID] == ""
		return ok, fmt.Sprintf("claim %s: allocated %v, reserved for %v, finalizers %v, annotations %v",
			c.Name, allocated(c), c.Status.ReservedFor, c.Finalizers, c.Annotations)
	})
	if p := e.cluster.pod(t, pod.Name); p.Spec.NodeName != "" {
		t.Errorf("pod bound to %s", p.Spec.NodeName)
	}
}

// TestServiceRestartAfterAPodWent: a gang is bound, one of its pods is
// deleted, and the service restarts (or another replica leads). The new
// service must not take the pods left for a decision to carry out again
// (their ranks would not match it): it undoes nothing, deletes nothing,
// and finishes the job, cancelled, once the pods left have ended.
func TestServiceRestartAfterAPodWent(t *testing.T) {
	nodeA, sliceA, topoA := clusterNode("node-a")
	nodeB, sliceB, topoB := clusterNode("node-b")
	pod0, claim0 := gangPod(0, 2, 2, nil)
	pod1, claim1 := gangPod(1, 2, 2, nil)
	e := startEnv(t, []*events.TopologyNode{topoA, topoB},
		nodeA, nodeB, sliceA, sliceB, gpuClass(), claim0, claim1, pod0, pod1)
	sub := e.waitSubmitted(Gang{Namespace: "team-a", Kind: KindJobSet, Name: "train"}.Key())
	e.decide(sub.JobID, "node-a/0/", "node-a/1/", "node-b/0/", "node-b/1/")
	eventually(t, "both pods bound", func() (bool, string) {
		return len(e.cluster.boundTo()) == 2, fmt.Sprintf("%d bindings", len(e.cluster.boundTo()))
	})
	e.stop()
	if err := e.cluster.CoreV1().Pods("team-a").Delete(t.Context(), pod1.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.start()
	// The new service has seen the pod left and the job; it may take a
	// moment to look at the job: a finish, a deletion or a binding would
	// show by the time a later change of the pod has been handled.
	cur := e.cluster.pod(t, pod0.Name)
	cur.Status.Phase = corev1.PodRunning
	if _, err := e.cluster.CoreV1().Pods("team-a").UpdateStatus(t.Context(), cur, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	cur.Status.Phase = corev1.PodSucceeded
	if _, err := e.cluster.CoreV1().Pods("team-a").UpdateStatus(t.Context(), cur, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "jobs.finished", func() (bool, string) {
		return len(e.finishedOf(sub.JobID)) > 0, "no jobs.finished yet"
	})
	e.stop()
	_, finished := e.stored()
	if len(finished) != 1 || finished[0].Status != events.StatusCancelled || finished[0].Reason == events.ReasonLaunchFailed {
		t.Errorf("jobs.finished %+v, want one, cancelled (a pod went), not a failed launch", finished)
	}
	for _, a := range e.cluster.Actions() {
		if a.GetVerb() == "delete" && a.GetResource().Resource == "pods" && a.(interface{ GetName() string }).GetName() != pod1.Name {
			t.Errorf("the service deleted a pod: %v", a)
		}
	}
	if n := len(e.cluster.boundTo()); n != 2 {
		t.Errorf("%d bindings, want the 2 of the first carry-out", n)
	}
}
