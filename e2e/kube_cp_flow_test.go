package e2e

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// claimFinalizer is the finalizer a scheduler puts on a claim before it
// allocates it, so that the claim is not deleted while allocated.
const claimFinalizer = "resource.kubernetes.io/delete-protection"

// TestKubeControlPlane proves the harness with the DRA flow a secondary
// scheduler performs: a pod for toposched whose claim the controller
// manager makes from a template; the claim allocated and reserved in one
// status write; the pod bound by a Binding that carries the rank in its
// annotations; kwok runs it; deleting it takes its claim. On the way it
// checks what the API server accepts and refuses of a scheduler: the
// allocation is immutable, a claim can be deallocated (and allocated
// again) as kube-scheduler's unreserve does, reservedFor needs an
// allocation, a pod binds once, and the toposched identity can do only what
// RBAC grants it.
func TestKubeControlPlane(t *testing.T) {
	c := startKube(t)
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	const ns = "default"

	// The admin kubeconfig file works, and the server has the version stamp
	// clients need.
	admin := clientFromKubeconfig(t, c.Kubeconfig)
	v, err := admin.Discovery().ServerVersion()
	if err != nil {
		t.Fatalf("server version through %s: %v", c.Kubeconfig, err)
	}
	if v.GitVersion != kubeVersion {
		t.Fatalf("server version %q, want %q", v.GitVersion, kubeVersion)
	}

	for _, name := range []string{"node-a", "node-b"} {
		n := c.addNode(t, name, map[string]string{"topology.kubernetes.io/zone": "z1"})
		if n.Labels["topology.kubernetes.io/zone"] != "z1" || n.Labels["kubernetes.io/hostname"] != name {
			t.Errorf("node %s labels %v", name, n.Labels)
		}
		if got := n.Status.Allocatable.Cpu().String(); got != "64" {
			t.Errorf("node %s allocatable cpu %s, want 64 (taints %v)", name, got, n.Spec.Taints)
		}
		for _, tn := range n.Spec.Taints {
			if tn.Key == notReadyTaint {
				t.Errorf("node %s still has taint %s", name, notReadyTaint)
			}
		}
		s := c.addGPUSlice(t, name, h100s(name))
		if len(s.Spec.Devices) != 8 || s.Spec.Pool.Name != name || *s.Spec.NodeName != name {
			t.Fatalf("slice of %s: %d devices, pool %q, node %q", name, len(s.Spec.Devices), s.Spec.Pool.Name, *s.Spec.NodeName)
		}
	}
	c.addGPUClass(t)
	class, err := c.Client.ResourceV1().DeviceClasses().Get(ctx, gpuDriver, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("device class %s: extendedResourceName %v (kept by the apiserver: %t)", class.Name, deref(class.Spec.ExtendedResourceName), class.Spec.ExtendedResourceName != nil)
	c.addClaimTemplate(t, ns, "two-gpus", 2)

	// The pod, and its claim from the controller manager.
	pod := gpuPod(ns, "trainer-0", "two-gpus")
	pod.Annotations = map[string]string{"toposched.io/job": "train"}
	pod, err = c.Client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create pod: %v", err)
	}
	start := time.Now()
	claimName := c.waitPodClaim(t, ns, pod.Name)
	t.Logf("claim %s made from the template %s after the pod", claimName, ms(time.Since(start)))
	claim, err := c.Client.ResourceV1().ResourceClaims(ns).Get(ctx, claimName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if owner := metav1.GetControllerOf(claim); owner == nil || owner.UID != pod.UID {
		t.Errorf("claim %s controller %+v, want pod %s", claimName, owner, pod.UID)
	}

	// Allocate: the finalizer first, then allocation and reservation in one
	// status write.
	start = time.Now()
	claim = allocateClaim(t, c.Client, claim, pod, "node-a", "gpu-2", "gpu-3")

	// An allocation cannot be changed once set.
	swapped := claim.DeepCopy()
	swapped.Status.Allocation.Devices.Results[1].Device = "gpu-4"
	_, err = c.Client.ResourceV1().ResourceClaims(ns).UpdateStatus(ctx, swapped, metav1.UpdateOptions{})
	if !apierrors.IsInvalid(err) {
		t.Fatalf("changing a set allocation: %v, want Invalid", err)
	}
	t.Logf("changing a set allocation is refused: %v", err)

	// Bind with the rank in the Binding's annotations: the apiserver copies
	// them onto the pod, next to the pod's own.
	bindPod(t, c.Client, pod, "node-a", map[string]string{"toposched.io/rank": "0", "toposched.io/master-addr": "trainer-0.default.svc"})
	boundAt := time.Now()
	bound, err := c.Client.CoreV1().Pods(ns).Get(ctx, pod.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if bound.Spec.NodeName != "node-a" {
		t.Fatalf("pod bound to %q, want node-a", bound.Spec.NodeName)
	}
	for k, want := range map[string]string{"toposched.io/rank": "0", "toposched.io/master-addr": "trainer-0.default.svc", "toposched.io/job": "train"} {
		if got, ok := bound.Annotations[k]; !ok || got != want {
			t.Errorf("pod annotation %s = %q (present %t), want %q; annotations %v", k, got, ok, want, bound.Annotations)
		}
	}
	t.Logf("bound to %s in %s (finalizer, allocation, binding); pod annotations after the Binding: %v", bound.Spec.NodeName, ms(time.Since(start)), bound.Annotations)

	// A pod binds once: a second Binding is a conflict.
	err = c.Client.CoreV1().Pods(ns).Bind(ctx, &corev1.Binding{
		ObjectMeta: metav1.ObjectMeta{Name: pod.Name, Namespace: ns, UID: pod.UID},
		Target:     corev1.ObjectReference{Kind: "Node", Name: "node-b"},
	}, metav1.CreateOptions{})
	if !apierrors.IsConflict(err) {
		t.Fatalf("second binding of a bound pod: %v, want Conflict", err)
	}
	t.Logf("second binding is refused: %v", err)

	running := waitPodPhase(t, c.Client, ns, pod.Name, corev1.PodRunning)
	t.Logf("pod Running (kwok) %s after the binding", ms(time.Since(boundAt)))
	if running.Annotations["toposched.io/rank"] != "0" {
		t.Errorf("pod annotations once Running: %v, want the rank still there", running.Annotations)
	}
	claim, err = c.Client.ResourceV1().ResourceClaims(ns).Get(ctx, claimName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := allocatedDevices(claim); !slices.Equal(got, []string{"node-a/gpu-2", "node-a/gpu-3"}) {
		t.Errorf("claim %s holds %v, want node-a/gpu-2 and node-a/gpu-3", claimName, got)
	}
	if len(claim.Status.ReservedFor) != 1 || claim.Status.ReservedFor[0].UID != pod.UID {
		t.Errorf("claim %s reserved for %+v, want the pod alone", claimName, claim.Status.ReservedFor)
	}

	// Deallocation, as kube-scheduler's unreserve does it: a second pod's
	// claim, allocated and reserved, then both cleared in one status write.
	pod1, err := c.Client.CoreV1().Pods(ns).Create(ctx, gpuPod(ns, "trainer-1", "two-gpus"), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create pod: %v", err)
	}
	claim1, err := c.Client.ResourceV1().ResourceClaims(ns).Get(ctx, c.waitPodClaim(t, ns, pod1.Name), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	claim1 = allocateClaim(t, c.Client, claim1, pod1, "node-b", "gpu-0", "gpu-1")
	keepReserved := claim1.DeepCopy()
	keepReserved.Status.Allocation = nil
	_, err = c.Client.ResourceV1().ResourceClaims(ns).UpdateStatus(ctx, keepReserved, metav1.UpdateOptions{})
	if !apierrors.IsInvalid(err) {
		t.Fatalf("clearing the allocation of a reserved claim: %v, want Invalid", err)
	}
	t.Logf("clearing the allocation but not reservedFor is refused: %v", err)
	dealloc := claim1.DeepCopy()
	dealloc.Status.Allocation, dealloc.Status.ReservedFor = nil, nil
	claim1, err = c.Client.ResourceV1().ResourceClaims(ns).UpdateStatus(ctx, dealloc, metav1.UpdateOptions{})
	if err != nil {
		t.Fatalf("deallocating claim %s (allocation and reservedFor cleared in one status write): %v", dealloc.Name, err)
	}
	if claim1.Status.Allocation != nil || len(claim1.Status.ReservedFor) != 0 {
		t.Fatalf("claim %s after deallocation: allocation %+v, reservedFor %+v", claim1.Name, claim1.Status.Allocation, claim1.Status.ReservedFor)
	}
	t.Logf("claim %s deallocated: allocation and reservedFor cleared in one status write, accepted", claim1.Name)
	// Deallocated, it can be allocated again, elsewhere.
	claim1 = allocateClaim(t, c.Client, claim1, pod1, "node-b", "gpu-4", "gpu-5")
	bindPod(t, c.Client, pod1, "node-b", map[string]string{"toposched.io/rank": "2"})
	waitPodPhase(t, c.Client, ns, pod1.Name, corev1.PodRunning)
	if got := allocatedDevices(claim1); !slices.Equal(got, []string{"node-b/gpu-4", "node-b/gpu-5"}) {
		t.Errorf("claim %s holds %v after reallocation, want node-b/gpu-4 and node-b/gpu-5", claim1.Name, got)
	}

	// The toposched identity, through its kubeconfig file: nothing until
	// RBAC grants it.
	tc := clientFromKubeconfig(t, c.kubeconfigFor(t, kubeToposched))
	_, err = tc.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if !apierrors.IsForbidden(err) {
		t.Fatalf("toposched lists pods with no role: %v, want Forbidden", err)
	}
	t.Logf("toposched without a role: %v", err)
	if _, err := c.Client.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "e2e-pod-reader"},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "watch"}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Client.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "e2e-pod-reader"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "e2e-pod-reader"},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: kubeToposched}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, kubeCallTimeout, func() (bool, string) {
		l, err := tc.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, fmt.Sprintf("toposched lists pods once granted: %v", err)
		}
		return len(l.Items) == 2, fmt.Sprintf("toposched sees %d pods, want 2", len(l.Items))
	})
	if _, err := tc.ResourceV1().ResourceClaims(ns).List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("toposched lists claims with a pod reader role: %v, want Forbidden", err)
	}

	// Deleting the pods takes their claims: kwok ends the pods, the garbage
	// collector deletes the claims, the resourceclaim controller lifts the
	// finalizer of claims no longer reserved.
	start = time.Now()
	for _, p := range []*corev1.Pod{pod, pod1} {
		if err := c.Client.CoreV1().Pods(ns).Delete(ctx, p.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatalf("delete pod %s: %v", p.Name, err)
		}
	}
	waitFor(t, time.Minute, func() (bool, string) {
		pods, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		claims, err := c.Client.ResourceV1().ResourceClaims(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		if len(pods.Items)+len(claims.Items) > 0 {
			var left []string
			for _, p := range pods.Items {
				left = append(left, "pod "+p.Name)
			}
			for _, cl := range claims.Items {
				left = append(left, fmt.Sprintf("claim %s (finalizers %v, reserved for %d)", cl.Name, cl.Finalizers, len(cl.Status.ReservedFor)))
			}
			return false, fmt.Sprintf("left after deleting the pods: %v", left)
		}
		return true, ""
	})
	t.Logf("pods and their claims gone %s after the deletes", ms(time.Since(start)))
}

// allocateClaim does what a scheduler does to allocate claim to pod: the
// delete-protection finalizer, then allocation (devices of node's pool) and
// reservation for the pod in one status write. It returns the claim as
// written.
func allocateClaim(t *testing.T, client kubernetes.Interface, claim *resourcev1.ResourceClaim, pod *corev1.Pod, node string, devices ...string) *resourcev1.ResourceClaim {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), kubeCallTimeout)
	defer cancel()
	claims := client.ResourceV1().ResourceClaims(claim.Namespace)
	if !slices.Contains(claim.Finalizers, claimFinalizer) {
		claim = claim.DeepCopy()
		claim.Finalizers = append(claim.Finalizers, claimFinalizer)
		var err error
		if claim, err = claims.Update(ctx, claim, metav1.UpdateOptions{}); err != nil {
			t.Fatalf("finalizer on claim %s: %v", claim.Name, err)
		}
	}
	results := make([]resourcev1.DeviceRequestAllocationResult, len(devices))
	for i, d := range devices {
		results[i] = resourcev1.DeviceRequestAllocationResult{Request: gpuRequest, Driver: gpuDriver, Pool: node, Device: d}
	}
	claim = claim.DeepCopy()
	claim.Status.Allocation = &resourcev1.AllocationResult{
		Devices: resourcev1.DeviceAllocationResult{Results: results},
		NodeSelector: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
			MatchFields: []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{node}}},
		}}},
	}
	claim.Status.ReservedFor = []resourcev1.ResourceClaimConsumerReference{{Resource: "pods", Name: pod.Name, UID: pod.UID}}
	out, err := claims.UpdateStatus(ctx, claim, metav1.UpdateOptions{})
	if err != nil {
		t.Fatalf("allocate claim %s (%s %v) for pod %s: %v", claim.Name, node, devices, pod.Name, err)
	}
	return out
}

// bindPod binds pod to node with a Binding carrying annotations; the
// pod's UID is a precondition, as kube-scheduler sets it.
func bindPod(t *testing.T, client kubernetes.Interface, pod *corev1.Pod, node string, annotations map[string]string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), kubeCallTimeout)
	defer cancel()
	err := client.CoreV1().Pods(pod.Namespace).Bind(ctx, &corev1.Binding{
		ObjectMeta: metav1.ObjectMeta{Name: pod.Name, Namespace: pod.Namespace, UID: pod.UID, Annotations: annotations},
		Target:     corev1.ObjectReference{Kind: "Node", Name: node},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("bind pod %s to %s: %v", pod.Name, node, err)
	}
}

// waitPodPhase waits for the pod to reach phase and returns it.
func waitPodPhase(t *testing.T, client kubernetes.Interface, ns, name string, phase corev1.PodPhase) *corev1.Pod {
	t.Helper()
	var pod *corev1.Pod
	waitFor(t, time.Minute, func() (bool, string) {
		ctx, cancel := context.WithTimeout(t.Context(), kubeCallTimeout)
		defer cancel()
		p, err := client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, fmt.Sprintf("pod %s/%s: %v", ns, name, err)
		}
		pod = p
		return p.Status.Phase == phase, fmt.Sprintf("pod %s/%s phase %q on %q, want %q", ns, name, p.Status.Phase, p.Spec.NodeName, phase)
	})
	return pod
}

// allocatedDevices is the claim's allocation as sorted pool/device names.
func allocatedDevices(claim *resourcev1.ResourceClaim) []string {
	if claim.Status.Allocation == nil {
		return nil
	}
	var out []string
	for _, r := range claim.Status.Allocation.Devices.Results {
		out = append(out, r.Pool+"/"+r.Device)
	}
	slices.Sort(out)
	return out
}

// clientFromKubeconfig is a client as a program given the kubeconfig file
// would build it.
func clientFromKubeconfig(t *testing.T, path string) kubernetes.Interface {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		t.Fatalf("kubeconfig %s: %v", path, err)
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatalf("kubeconfig %s: %v", path, err)
	}
	return client
}

func deref[T any](p *T) any {
	if p == nil {
		return nil
	}
	return *p
}
