package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"sigs.k8s.io/yaml"
)

// The Kubernetes service end to end: toposched serve --kubeconfig against
// a real kube-apiserver, kube-controller-manager (claims from templates)
// and kwok (fake kubelets), signed in as a user with exactly the chart's
// ClusterRole rules.

// kubeNS is the namespace the scenarios' pods run in (its tenant).
const kubeNS = "default"

// kubeRules are the Kubernetes service's ClusterRole rules as the Helm
// chart ships them.
func kubeRules(t testing.TB) []rbacv1.PolicyRule {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(moduleRoot, "deploy/helm/toposched/files/kube-rules.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var rules []rbacv1.PolicyRule
	if err := yaml.UnmarshalStrict(data, &rules); err != nil {
		t.Fatalf("kube-rules.yaml: %v", err)
	}
	return rules
}

// grant gives the toposched user rules, as the chart's ClusterRole and
// ClusterRoleBinding do (a second grant replaces the first).
func (c *kubeCluster) grant(t testing.TB, rules []rbacv1.PolicyRule) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), kubeCallTimeout)
	defer cancel()
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "toposched-kube"}, Rules: rules}
	roles := c.Client.RbacV1().ClusterRoles()
	if _, err := roles.Create(ctx, role, metav1.CreateOptions{}); apierrors.IsAlreadyExists(err) {
		cur, err := roles.Get(ctx, role.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		cur.Rules = rules
		if _, err := roles.Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		return
	} else if err != nil {
		t.Fatal(err)
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "toposched-kube"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: "User", APIGroup: "rbac.authorization.k8s.io", Name: kubeToposched}},
	}
	if _, err := c.Client.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// kubeEnv is a control plane with GPU nodes and toposched serve running
// the Kubernetes service against it.
type kubeEnv struct {
	*kubeCluster
	cluster, dataDir string
	port             int
	serve            *proc
	// apart: the service runs as its own process (toposched kube, with
	// its own NATS identity and metrics endpoint), not inside serve.
	apart   bool
	kube    *proc
	metrics string // apart's metrics endpoint, HOST:PORT
}

// startKubeEnv starts a control plane with the nodes (each a DGX H100 with
// its eight GPUs in a ResourceSlice), grants the service the chart's
// rules, and starts serve on a cluster file of the same nodes.
func startKubeEnv(t testing.TB, nodes ...string) *kubeEnv {
	t.Helper()
	return newKubeEnv(t, false, nodes...)
}

// startKubeEnvApart is startKubeEnv with the Kubernetes service run as
// toposched kube beside serve, signed in as its own role.
func startKubeEnvApart(t testing.TB, nodes ...string) *kubeEnv {
	t.Helper()
	return newKubeEnv(t, true, nodes...)
}

func newKubeEnv(t testing.TB, apart bool, nodes ...string) *kubeEnv {
	t.Helper()
	needBinaries(t)
	kc := startKube(t)
	kc.grant(t, kubeRules(t))
	kc.addGPUClass(t)
	var cluster strings.Builder
	cluster.WriteString("name: kube\nnodes:\n")
	for _, n := range nodes {
		kc.addNode(t, n, map[string]string{"kubernetes.io/hostname": n})
		kc.addGPUSlice(t, n, h100s(n))
		fmt.Fprintf(&cluster, "  - {name: %s, model: dgx-h100}\n", n)
	}
	dir := t.TempDir()
	e := &kubeEnv{kubeCluster: kc, cluster: filepath.Join(dir, "cluster.yaml"), dataDir: filepath.Join(dir, "data"), port: freePort(t), apart: apart}
	if err := os.WriteFile(e.cluster, []byte(cluster.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	e.start(t)
	return e
}

// start starts (or restarts) serve with the Kubernetes service and waits
// until it schedules.
func (e *kubeEnv) start(t testing.TB) {
	t.Helper()
	kube := []string{"--kubeconfig", e.kubeconfigFor(t, kubeToposched), "--lease-ttl", "2s"}
	if !e.apart {
		e.serve = startServe(t, "serve", e.cluster, e.port, e.dataDir, kube...)
		e.waitScheduling(t, e.serve)
		return
	}
	// The service's seed, kube.nk, as an administrator issues it before
	// serve starts (serve takes in later ones within a second or so).
	issueRoles(t, credentialsDir(e.dataDir), "--services")
	e.serve = startServe(t, "serve", e.cluster, e.port, e.dataDir, "--lease-ttl", "2s")
	e.metrics = fmt.Sprintf("127.0.0.1:%d", freePort(t))
	e.kube = startProc(t, "kube", childEnv("TOPOSCHED_DATA_DIR="+e.dataDir), bins.toposched,
		append([]string{"kube", "--nats-url", e.url(), "--metrics-listen", e.metrics}, kube...)...)
	e.waitScheduling(t, e.kube)
}

// waitScheduling waits for the Kubernetes service in p to schedule.
func (e *kubeEnv) waitScheduling(t testing.TB, p *proc) {
	t.Helper()
	waitFor(t, time.Minute, func() (bool, string) {
		mustBeAlive(t, p)
		return strings.Contains(p.output(), "scheduling pods"), "the Kubernetes service has not logged 'scheduling pods'"
	})
}

func (e *kubeEnv) url() string { return fmt.Sprintf("nats://127.0.0.1:%d", e.port) }

// jobSetPod is pod index of a JobSet's replicated job "workers" as the
// JobSet controller makes it (one pod per Job), holding the claim made
// from tmpl.
func jobSetPod(jobset string, index, size int, tmpl string, annotations map[string]string) *corev1.Pod {
	p := gpuPod(kubeNS, fmt.Sprintf("%s-workers-%d-0", jobset, index), tmpl)
	p.Labels = map[string]string{
		"jobset.sigs.k8s.io/jobset-name":           jobset,
		"jobset.sigs.k8s.io/replicatedjob-name":    "workers",
		"jobset.sigs.k8s.io/job-index":             strconv.Itoa(index),
		"jobset.sigs.k8s.io/job-global-index":      strconv.Itoa(index),
		"batch.kubernetes.io/job-completion-index": "0",
	}
	p.Annotations = map[string]string{"toposched.io/gang-size": strconv.Itoa(size)}
	for k, v := range annotations {
		p.Annotations[k] = v
	}
	p.Spec.Hostname = p.Name
	p.Spec.Subdomain = jobset
	return p
}

func (c *kubeCluster) createPod(t testing.TB, p *corev1.Pod) *corev1.Pod {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), kubeCallTimeout)
	defer cancel()
	out, err := c.Client.CoreV1().Pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create pod %s: %v", p.Name, err)
	}
	return out
}

func (c *kubeCluster) pod(t testing.TB, name string) *corev1.Pod {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), kubeCallTimeout)
	defer cancel()
	p, err := c.Client.CoreV1().Pods(kubeNS).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("pod %s: %v", name, err)
	}
	return p
}

// waitBound waits for the pods to be bound and returns them.
func (c *kubeCluster) waitBound(t testing.TB, timeout time.Duration, names ...string) []*corev1.Pod {
	t.Helper()
	out := make([]*corev1.Pod, len(names))
	waitFor(t, timeout, func() (bool, string) {
		for i, n := range names {
			out[i] = c.pod(t, n)
			if out[i].Spec.NodeName == "" {
				return false, fmt.Sprintf("pod %s is not bound; its events: %s", n, c.eventsOf(t, n))
			}
		}
		return true, ""
	})
	return out
}

// eventsOf is what kubectl describe shows of a pod's events.
func (c *kubeCluster) eventsOf(t testing.TB, pod string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), kubeCallTimeout)
	defer cancel()
	list, err := c.Client.CoreV1().Events(kubeNS).List(ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("involvedObject.name", pod).String()})
	if err != nil {
		return err.Error()
	}
	var out []string
	for _, e := range list.Items {
		out = append(out, e.Reason+": "+e.Message)
	}
	return strings.Join(out, " | ")
}

// claimOf is the claim made for the pod's "gpus" template claim.
func (c *kubeCluster) claimOf(t testing.TB, p *corev1.Pod) *resourcev1.ResourceClaim {
	t.Helper()
	cl, ok := c.madeClaim(t, p)
	if !ok {
		t.Fatalf("pod %s has no claim made from its template yet", p.Name)
	}
	return cl
}

// madeClaim is claimOf, ok false while the controller manager has not
// made the claim yet.
func (c *kubeCluster) madeClaim(t testing.TB, p *corev1.Pod) (*resourcev1.ResourceClaim, bool) {
	t.Helper()
	name := ""
	for _, st := range p.Status.ResourceClaimStatuses {
		if st.Name == gpuRequest && st.ResourceClaimName != nil {
			name = *st.ResourceClaimName
		}
	}
	if name == "" {
		return nil, false
	}
	ctx, cancel := context.WithTimeout(t.Context(), kubeCallTimeout)
	defer cancel()
	cl, err := c.Client.ResourceV1().ResourceClaims(p.Namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return cl, true
}

// decision is placement's decision for a job of the Kubernetes service.
func (e *kubeEnv) decision(t testing.TB, job string) decidedJSON {
	t.Helper()
	return decisionOf(t, &launchCluster{url: e.url()}, job)
}

// labelNode sets labels on a node, as a cluster's provisioning does.
func (c *kubeCluster) labelNode(t *testing.T, name string, labels map[string]string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), kubeCallTimeout)
	defer cancel()
	n, err := c.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	maps.Copy(n.Labels, labels)
	if _, err := c.Client.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// waitFabric waits for the fabric the nodes' labels describe to be
// published, with want switches.
func (e *kubeEnv) waitFabric(t *testing.T, want int) {
	t.Helper()
	js := jsConnect(t, e.url())
	waitFor(t, time.Minute, func() (bool, string) {
		ctx, cancel := context.WithTimeout(t.Context(), kubeCallTimeout)
		defer cancel()
		s, err := js.Stream(ctx, streamTopology)
		if err != nil {
			return false, err.Error()
		}
		m, err := s.GetLastMsgForSubject(ctx, "toposched.topology.fabric")
		if err != nil {
			return false, "no fabric: " + err.Error()
		}
		var f struct {
			Cluster  string `json:"cluster"`
			Switches []any  `json:"switches"`
		}
		if err := json.Unmarshal(m.Data, &f); err != nil {
			t.Fatal(err)
		}
		return f.Cluster == "kubernetes-node-labels" && len(f.Switches) == want, fmt.Sprintf("fabric %s", m.Data)
	})
}

// TestKubeJobSetTP8DP2 schedules a 2-node TP8xDP2 JobSet: every pod is
// bound to the node placement decided, every claim holds exactly the
// decided GPUs, and the rank annotations are right. The nodes' rack
// labels are the fabric: the gang goes to the two nodes of one rack, not
// to the first two nodes.
func TestKubeJobSetTP8DP2(t *testing.T) {
	e := startKubeEnv(t, "node-a", "node-b", "node-c")
	for node, rack := range map[string]string{"node-a": "r1", "node-b": "r2", "node-c": "r1"} {
		e.labelNode(t, node, map[string]string{"topology.kubernetes.io/zone": "z", "toposched.io/rack": rack})
	}
	e.waitFabric(t, 4) // zone z (core), z/- (spine: no block label), racks z/-/r1 and z/-/r2 (leaves)
	e.addClaimTemplate(t, kubeNS, "eight-gpus", 8)
	ann := map[string]string{"toposched.io/parallelism": "tp=8,dp=2"}
	for i := range 2 {
		e.createPod(t, jobSetPod("train", i, 2, "eight-gpus", ann))
	}
	pods := e.waitBound(t, time.Minute, "train-workers-0-0", "train-workers-1-0")
	job := pods[0].Annotations["toposched.io/placed-job"]
	if job == "" || pods[1].Annotations["toposched.io/placed-job"] != job {
		t.Fatalf("pods tagged with jobs %q and %q, want one", job, pods[1].Annotations["toposched.io/placed-job"])
	}
	d := e.decision(t, job)
	if len(d.Ranks) != 16 {
		t.Fatalf("decision has %d ranks, want 16", len(d.Ranks))
	}
	nodes := map[string]bool{}
	for i, p := range pods {
		var want []string
		node := ""
		for _, r := range d.Ranks {
			if r.Rank/8 == i {
				want = append(want, fmt.Sprintf("%s/gpu-%d", r.Node, r.GPU))
				node = r.Node
			}
		}
		slices.Sort(want)
		if p.Spec.NodeName != node {
			t.Errorf("pod %s bound to %s, decided %s", p.Name, p.Spec.NodeName, node)
		}
		nodes[node] = true
		if got := allocatedDevices(e.claimOf(t, p)); !slices.Equal(got, want) {
			t.Errorf("pod %s's claim holds %v, decided %v", p.Name, got, want)
		}
		wantAnn := map[string]string{
			"toposched.io/rank": strconv.Itoa(8 * i), "toposched.io/world-size": "16", "toposched.io/node-rank": strconv.Itoa(i),
			"toposched.io/nproc-per-node": "8", "toposched.io/master-addr": "train-workers-0-0.train." + kubeNS + ".svc",
			"toposched.io/master-port": "29500",
		}
		for k, v := range wantAnn {
			if p.Annotations[k] != v {
				t.Errorf("pod %s: annotation %s = %q, want %q", p.Name, k, p.Annotations[k], v)
			}
		}
	}
	if len(nodes) != 2 || !nodes["node-a"] || !nodes["node-c"] {
		t.Errorf("the gang is on nodes %v, want node-a and node-c, the nodes of rack r1", nodes)
	}
	for _, p := range pods {
		waitPodPhase(t, e.Client, kubeNS, p.Name, corev1.PodRunning)
		if ev := e.eventsOf(t, p.Name); !strings.Contains(ev, "Scheduled") {
			t.Errorf("pod %s's events %q do not say it was scheduled", p.Name, ev)
		}
	}
}

// deletePods deletes pods and waits until they are gone (kwok finishes a
// bound pod's deletion; an unbound one goes at once).
func (c *kubeCluster) deletePods(t testing.TB, names ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), kubeCallTimeout)
	defer cancel()
	for _, n := range names {
		if err := c.Client.CoreV1().Pods(kubeNS).Delete(ctx, n, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Fatal(err)
		}
	}
	waitFor(t, time.Minute, func() (bool, string) {
		for _, n := range names {
			if _, err := c.Client.CoreV1().Pods(kubeNS).Get(ctx, n, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				return false, "pod " + n + " is not gone"
			}
		}
		return true, ""
	})
}

// lonePod is a pod of its own, a job of its own, holding the claim made
// from tmpl.
func lonePod(name, tmpl string) *corev1.Pod { return gpuPod(kubeNS, name, tmpl) }

// TestKubeGangWaits: a gang that does not fit stays Pending with an Event
// that says why, and starts once GPUs free. The service runs as toposched
// kube, signed in as its own NATS role, and its metrics count the gangs.
func TestKubeGangWaits(t *testing.T) {
	e := startKubeEnvApart(t, "node-a", "node-b")
	e.addClaimTemplate(t, kubeNS, "eight-gpus", 8)
	for i := range 2 {
		e.createPod(t, jobSetPod("first", i, 2, "eight-gpus", nil))
	}
	e.waitBound(t, time.Minute, "first-workers-0-0", "first-workers-1-0")
	e.createPod(t, jobSetPod("second", 0, 1, "eight-gpus", nil))
	waitFor(t, time.Minute, func() (bool, string) {
		ev := e.eventsOf(t, "second-workers-0-0")
		return strings.Contains(ev, "FailedScheduling") && strings.Contains(ev, "waiting for GPUs"), "events of the waiting pod: " + ev
	})
	if p := e.pod(t, "second-workers-0-0"); p.Spec.NodeName != "" || p.Status.Phase != corev1.PodPending {
		t.Fatalf("the gang that does not fit is %s on %q", p.Status.Phase, p.Spec.NodeName)
	}
	e.deletePods(t, "first-workers-0-0", "first-workers-1-0")
	p := e.waitBound(t, time.Minute, "second-workers-0-0")[0]
	if got := allocatedDevices(e.claimOf(t, p)); len(got) != 8 {
		t.Fatalf("the second gang's claim holds %v, want 8 GPUs", got)
	}
	waitReadyz(t, e.metrics, http.StatusOK, []string{"ready"}, e.kube)
	m, err := scrapeMetrics(e.metrics)
	if err != nil {
		t.Fatal(err)
	}
	if m["toposched_kube_gangs_bound_total"] != 2 || m["toposched_kube_pods_bound_total"] != 3 || m["toposched_kube_leading"] != 1 {
		t.Errorf("metrics: gangs bound %v, pods bound %v, leading %v; want 2, 3, 1",
			m["toposched_kube_gangs_bound_total"], m["toposched_kube_pods_bound_total"], m["toposched_kube_leading"])
	}
	if m[`toposched_events_published_total{event="jobs.submitted"}`] != 2 {
		t.Errorf("metrics: %v jobs.submitted published, want 2", m[`toposched_events_published_total{event="jobs.submitted"}`])
	}
}

// TestKubeForeignClaims: GPUs allocated by another scheduler's claims are
// never given; a pod deleted frees its GPUs for the next.
func TestKubeForeignClaims(t *testing.T) {
	e := startKubeEnv(t, "node-a")
	e.addClaimTemplate(t, kubeNS, "four-gpus", 4)
	// Another scheduler's pod: its claim holds gpu-0..3 of node-a.
	other := gpuPod(kubeNS, "other", "four-gpus")
	other.Spec.SchedulerName = "default-scheduler"
	other = e.createPod(t, other)
	claim := e.waitPodClaim(t, kubeNS, "other")
	ctx, cancel := context.WithTimeout(t.Context(), kubeCallTimeout)
	defer cancel()
	cl, err := e.Client.ResourceV1().ResourceClaims(kubeNS).Get(ctx, claim, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	allocateClaim(t, e.Client, cl, other, "node-a", "gpu-0", "gpu-1", "gpu-2", "gpu-3")
	bindPod(t, e.Client, other, "node-a", nil)

	e.createPod(t, lonePod("mine-1", "four-gpus"))
	p := e.waitBound(t, time.Minute, "mine-1")[0]
	want := []string{"node-a/gpu-4", "node-a/gpu-5", "node-a/gpu-6", "node-a/gpu-7"}
	if got := allocatedDevices(e.claimOf(t, p)); !slices.Equal(got, want) {
		t.Fatalf("toposched's claim holds %v, want %v (gpu-0..3 are another scheduler's)", got, want)
	}
	e.createPod(t, lonePod("mine-2", "four-gpus"))
	waitFor(t, time.Minute, func() (bool, string) {
		ev := e.eventsOf(t, "mine-2")
		return strings.Contains(ev, "waiting for GPUs"), "events of the pod that does not fit: " + ev
	})
	e.deletePods(t, "mine-1")
	p = e.waitBound(t, time.Minute, "mine-2")[0]
	if got := allocatedDevices(e.claimOf(t, p)); !slices.Equal(got, want) {
		t.Fatalf("the next pod's claim holds %v, want the freed %v", got, want)
	}
}

// TestKubeKilledBetweenAllocateAndBind: serve is SIGKILLed while the
// claims of a gang are allocated and its pods not bound (the service may
// not bind yet: its binding right is taken away). After a restart with the
// right given back no claim stays allocated to a pod that is not bound,
// and no device is allocated twice.
func TestKubeKilledBetweenAllocateAndBind(t *testing.T) {
	e := startKubeEnv(t, "node-a", "node-b")
	rules := kubeRules(t)
	noBind := slices.DeleteFunc(slices.Clone(rules), func(r rbacv1.PolicyRule) bool { return slices.Contains(r.Resources, "pods/binding") })
	e.grant(t, noBind)
	e.addClaimTemplate(t, kubeNS, "eight-gpus", 8)
	names := []string{"train-workers-0-0", "train-workers-1-0"}
	for i := range 2 {
		e.createPod(t, jobSetPod("train", i, 2, "eight-gpus", nil))
	}
	waitFor(t, time.Minute, func() (bool, string) {
		for _, n := range names {
			if cl, ok := e.madeClaim(t, e.pod(t, n)); !ok || allocatedDevices(cl) == nil {
				return false, "the claim of " + n + " is not allocated"
			}
		}
		return true, ""
	})
	e.serve.signal(t, syscall.SIGKILL)
	killedBySIGKILL(t, e.serve)
	e.grant(t, rules)
	e.start(t)
	pods := e.waitBound(t, time.Minute, names...)
	seen := map[string]string{}
	for _, p := range pods {
		cl := e.claimOf(t, p)
		devs := allocatedDevices(cl)
		if len(devs) != 8 {
			t.Errorf("pod %s's claim holds %v, want 8 GPUs", p.Name, devs)
		}
		for _, d := range devs {
			if prev, dup := seen[d]; dup {
				t.Errorf("%s allocated to the claims of %s and %s", d, prev, p.Name)
			}
			seen[d] = p.Name
			if !strings.HasPrefix(d, p.Spec.NodeName+"/") {
				t.Errorf("pod %s is on %s but its claim holds %s", p.Name, p.Spec.NodeName, d)
			}
		}
	}
	ctx, cancel := context.WithTimeout(t.Context(), kubeCallTimeout)
	defer cancel()
	claims, err := e.Client.ResourceV1().ResourceClaims(kubeNS).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, cl := range claims.Items {
		if cl.Status.Allocation == nil {
			continue
		}
		for _, r := range cl.Status.ReservedFor {
			if p := e.pod(t, r.Name); p.Spec.NodeName == "" {
				t.Errorf("claim %s is allocated to pod %s, which is not bound", cl.Name, r.Name)
			}
		}
	}
}

// TestKubeBadInput: a malformed annotation, an unknown DeviceClass and a
// claim selector that cannot be evaluated each leave their pod Pending
// with an Event naming the field; a good pod beside them is scheduled.
func TestKubeBadInput(t *testing.T) {
	e := startKubeEnv(t, "node-a")
	e.addClaimTemplate(t, kubeNS, "one-gpu", 1)
	ctx, cancel := context.WithTimeout(t.Context(), kubeCallTimeout)
	defer cancel()
	template := func(name, class, selector string) {
		req := resourcev1.ExactDeviceRequest{DeviceClassName: class, AllocationMode: resourcev1.DeviceAllocationModeExactCount, Count: 1}
		if selector != "" {
			req.Selectors = []resourcev1.DeviceSelector{{CEL: &resourcev1.CELDeviceSelector{Expression: selector}}}
		}
		tmpl := &resourcev1.ResourceClaimTemplate{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: kubeNS},
			Spec: resourcev1.ResourceClaimTemplateSpec{Spec: resourcev1.ResourceClaimSpec{
				Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{{Name: gpuRequest, Exactly: &req}}},
			}},
		}
		if _, err := e.Client.ResourceV1().ResourceClaimTemplates(kubeNS).Create(ctx, tmpl, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	template("no-class", "no-such-class", "")
	// Valid CEL that fails when evaluated: the driver publishes no such
	// attribute.
	template("bad-selector", gpuDriver, "device.attributes['"+gpuDriver+"'].noSuchAttribute == 'x'")

	badAnn := lonePod("bad-annotation", "one-gpu")
	badAnn.Annotations = map[string]string{"toposched.io/parallelism": "tp=eight"}
	e.createPod(t, badAnn)
	e.createPod(t, lonePod("bad-class", "no-class"))
	e.createPod(t, lonePod("bad-selector", "bad-selector"))
	e.createPod(t, lonePod("good", "one-gpu"))

	for pod, field := range map[string]string{
		"bad-annotation": "metadata.annotations['toposched.io/parallelism']",
		"bad-class":      "deviceClassName",
		"bad-selector":   "noSuchAttribute",
	} {
		waitFor(t, time.Minute, func() (bool, string) {
			ev := e.eventsOf(t, pod)
			return strings.Contains(ev, field), fmt.Sprintf("events of %s do not name %s: %s", pod, field, ev)
		})
	}
	e.waitBound(t, time.Minute, "good")
	for _, n := range []string{"bad-annotation", "bad-class", "bad-selector"} {
		if p := e.pod(t, n); p.Spec.NodeName != "" {
			t.Errorf("pod %s was bound to %s", n, p.Spec.NodeName)
		}
	}
}
