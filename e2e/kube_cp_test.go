package e2e

// A real Kubernetes control plane for the Kubernetes scenarios: etcd,
// kube-apiserver, kube-controller-manager and kwok (a fake kubelet), the
// versions tools/kube/build.sh builds, run as child processes on free
// loopback ports in the test's temporary directory. No kube-scheduler runs,
// so nothing but the scheduler under test binds a pod.

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

const (
	// kubeVersion is the control plane tools/kube/build.sh builds; its
	// default output directory is named after it.
	kubeVersion = "v1.36.3"

	// Identities in the apiserver's token file. kubeAdmin is in
	// system:masters; kubeToposched is in no group but the
	// system:authenticated every user gets, so it can do only what RBAC
	// grants it, as the service will run in a real cluster.
	kubeAdmin     = "e2e-admin"
	kubeToposched = "toposched"

	// gpuDriver is the DRA driver name of NVIDIA's gpu-kubelet-plugin, also
	// the name of the DeviceClass its chart installs.
	gpuDriver = "gpu.nvidia.com"
	// gpuRequest is the request name in the claim templates addClaimTemplate
	// makes.
	gpuRequest = "gpus"
	// schedulerName is what a pod names to be scheduled by toposched.
	schedulerName = "toposched"

	kwokNodeAnnotation = "kwok.x-k8s.io/node"
	// notReadyTaint is put on every new Node by the apiserver's
	// TaintNodesByCondition admission; the node lifecycle controller that
	// would lift it is not run (it would need kwok heartbeats).
	notReadyTaint = "node.kubernetes.io/not-ready"

	// kubeStopGrace is how long a component has to exit after SIGTERM
	// before it is killed: kube-apiserver takes a few seconds.
	kubeStopGrace = 10 * time.Second
	// kubeStartTimeout bounds each component's start: kube-apiserver takes
	// about 5 s on two idle cores, much longer on a loaded machine.
	kubeStartTimeout = 2 * time.Minute
	// kubeCallTimeout bounds one API call of a helper.
	kubeCallTimeout = 30 * time.Second
)

// kubeBin is the directory holding the control plane's binaries and kwok's
// stages: $KUBE_BIN, else tools/kube/build.sh's default. The test skips when
// the default directory lacks them (the build takes tens of minutes once
// per machine), and fails when KUBE_BIN names a directory that lacks them,
// since whoever set it (CI) meant the tests to run.
func kubeBin(t testing.TB) string {
	t.Helper()
	needBinaries(t)
	dir, explicit := os.Getenv("KUBE_BIN"), true
	if dir == "" {
		explicit = false
		cache := os.Getenv("XDG_CACHE_HOME")
		if cache == "" {
			home, err := os.UserHomeDir()
			if err != nil {
				t.Skipf("github.com/toposched/toposched/e2e: no KUBE_BIN and no home directory (%v): run tools/kube/build.sh and set KUBE_BIN to the directory it prints", err)
			}
			cache = filepath.Join(home, ".cache")
		}
		dir = filepath.Join(cache, "toposched", "kube-"+kubeVersion)
	}
	var missing []string
	for _, name := range []string{"etcd", "kube-apiserver", "kube-controller-manager", "kwok", "kwok-stages.yaml"} {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			missing = append(missing, name)
		}
	}
	switch {
	case len(missing) == 0:
		return dir
	case explicit:
		t.Fatalf("KUBE_BIN=%s lacks %s: run tools/kube/build.sh with that KUBE_BIN", dir, strings.Join(missing, ", "))
	default:
		t.Skipf("github.com/toposched/toposched/e2e: the Kubernetes control plane is not built (%s missing in %s): run tools/kube/build.sh (tens of minutes, once per machine)",
			strings.Join(missing, ", "), dir)
	}
	return ""
}

// kubeCluster is a running control plane.
type kubeCluster struct {
	// Dir holds the components' state, certificates and logs.
	Dir string
	// Kubeconfig is the path of a kubeconfig for the admin (system:masters).
	Kubeconfig string
	// RESTConfig is the admin's, with client limits raised (QPS 500,
	// burst 1000) from client-go's 5 and 10, which would pace a scenario.
	RESTConfig *rest.Config
	// Client is an admin client.
	Client kubernetes.Interface

	server string            // https://127.0.0.1:<port>
	tokens map[string]string // user -> bearer token
}

// startKube starts etcd, kube-apiserver, kube-controller-manager and kwok
// and returns once each answers its health check and the default
// namespace has its service account (pods can be created). Each component
// is stopped, in reverse order, when the test ends, and the tail of its log
// is printed if the test failed.
func startKube(t testing.TB) *kubeCluster {
	t.Helper()
	bin := kubeBin(t)
	dir := t.TempDir()
	c := &kubeCluster{Dir: dir, tokens: map[string]string{}}
	begin := time.Now()

	// Service account signing keys: kube-apiserver verifies and issues
	// tokens with them, the controller manager signs legacy ones.
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatalf("service account key: %v", err)
	}
	pub, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		t.Fatalf("service account key: %v", err)
	}
	saKey, saPub := filepath.Join(dir, "sa.key"), filepath.Join(dir, "sa.pub")
	writeKubeFile(t, saKey, pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}))
	writeKubeFile(t, saPub, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}))

	// The static token file: token,user,uid,"groups".
	var tokenFile strings.Builder
	for _, u := range []struct{ name, groups string }{{kubeAdmin, "system:masters"}, {kubeToposched, ""}} {
		c.tokens[u.name] = randomToken(t)
		fmt.Fprintf(&tokenFile, "%s,%s,uid-%s", c.tokens[u.name], u.name, u.name)
		if u.groups != "" {
			fmt.Fprintf(&tokenFile, ",%q", u.groups)
		}
		tokenFile.WriteString("\n")
	}
	tokens := filepath.Join(dir, "tokens.csv")
	writeKubeFile(t, tokens, []byte(tokenFile.String()))

	// etcd. Its data is thrown away with the test: no fsync.
	clientURL := fmt.Sprintf("http://127.0.0.1:%d", freePort(t))
	peerURL := fmt.Sprintf("http://127.0.0.1:%d", freePort(t))
	stepStart := time.Now()
	etcd := startKubeProc(t, dir, "etcd", filepath.Join(bin, "etcd"),
		"--name=e2e", "--data-dir="+filepath.Join(dir, "etcd"),
		"--listen-client-urls="+clientURL, "--advertise-client-urls="+clientURL,
		"--listen-peer-urls="+peerURL, "--initial-advertise-peer-urls="+peerURL,
		"--initial-cluster=e2e="+peerURL, "--unsafe-no-fsync", "--log-level=warn")
	etcd.waitHealthy(t, clientURL+"/health", "", `"health":"true"`)
	etcdTook := time.Since(stepStart)

	// kube-apiserver. --cert-dir: it makes a self-signed serving
	// certificate that clients skip verifying (loopback only).
	// --endpoint-reconciler-type=none: a loopback advertise address is not
	// a valid Endpoints address, and it would log that every 10 s.
	apiPort := freePort(t)
	c.server = fmt.Sprintf("https://127.0.0.1:%d", apiPort)
	stepStart = time.Now()
	api := startKubeProc(t, dir, "kube-apiserver", filepath.Join(bin, "kube-apiserver"),
		"--etcd-servers="+clientURL,
		"--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", fmt.Sprintf("--secure-port=%d", apiPort),
		"--cert-dir="+filepath.Join(dir, "apiserver-certs"),
		"--token-auth-file="+tokens,
		"--authorization-mode=RBAC",
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file="+saPub,
		"--service-account-signing-key-file="+saKey,
		"--service-cluster-ip-range=10.96.0.0/24",
		"--endpoint-reconciler-type=none")
	api.waitHealthy(t, c.server+"/readyz", c.tokens[kubeAdmin], "ok")
	apiTook := time.Since(stepStart)

	c.Kubeconfig = c.kubeconfigFor(t, kubeAdmin)
	c.RESTConfig = c.restConfigFor(t, kubeAdmin)
	client, err := kubernetes.NewForConfig(c.RESTConfig)
	if err != nil {
		t.Fatalf("kubernetes client: %v", err)
	}
	c.Client = client

	// kube-controller-manager and kwok start together: both only need the
	// apiserver. The controller manager's client limits are raised from
	// 20/s, which made it the bottleneck of DRA pods (two writes a pod).
	// Controllers: claims from templates, claim clean-up and finalizers
	// (resourceclaim), the "default" service account without which the
	// ServiceAccount admission refuses pods (serviceaccount), deletion of
	// a pod's generated claims (garbage-collector), namespace deletion.
	kcmPort, kwokPort := freePort(t), freePort(t)
	stepStart = time.Now()
	kcm := startKubeProc(t, dir, "kube-controller-manager", filepath.Join(bin, "kube-controller-manager"),
		"--kubeconfig="+c.Kubeconfig,
		"--bind-address=127.0.0.1", fmt.Sprintf("--secure-port=%d", kcmPort),
		"--cert-dir="+filepath.Join(dir, "kcm-certs"),
		"--leader-elect=false",
		"--controllers=resourceclaim-controller,serviceaccount-controller,serviceaccount-token-controller,garbage-collector-controller,namespace-controller",
		"--service-account-private-key-file="+saKey,
		"--kube-api-qps=500", "--kube-api-burst=1000")
	kwok := startKubeProc(t, dir, "kwok", filepath.Join(bin, "kwok"),
		"--kubeconfig="+c.Kubeconfig,
		"--config="+filepath.Join(bin, "kwok-stages.yaml"),
		"--manage-all-nodes=false",
		"--manage-nodes-with-annotation-selector="+kwokNodeAnnotation+"=fake",
		"--node-ip=127.0.0.1",
		fmt.Sprintf("--server-address=127.0.0.1:%d", kwokPort))
	kcm.waitHealthy(t, fmt.Sprintf("https://127.0.0.1:%d/healthz", kcmPort), "", "ok")
	kcmTook := time.Since(stepStart)
	kwok.waitHealthy(t, fmt.Sprintf("http://127.0.0.1:%d/healthz", kwokPort), "", "ok")
	kwokTook := time.Since(stepStart)

	waitFor(t, kubeStartTimeout, func() (bool, string) {
		kcm.mustRun(t)
		ctx, cancel := context.WithTimeout(t.Context(), kubeCallTimeout)
		defer cancel()
		if _, err := c.Client.CoreV1().ServiceAccounts("default").Get(ctx, "default", metav1.GetOptions{}); err != nil {
			return false, fmt.Sprintf("service account default/default: %v", err)
		}
		return true, ""
	})
	t.Logf("control plane up in %s: etcd %s, kube-apiserver %s, kube-controller-manager %s, kwok %s (those two started together), then the default service account",
		ms(time.Since(begin)), ms(etcdTook), ms(apiTook), ms(kcmTook), ms(kwokTook))
	return c
}

// kubeconfigFor writes a kubeconfig for user (kubeAdmin or kubeToposched)
// into the cluster's directory and returns its path.
func (c *kubeCluster) kubeconfigFor(t testing.TB, user string) string {
	t.Helper()
	token := c.token(t, user)
	path := filepath.Join(c.Dir, "kubeconfig-"+user)
	writeKubeFile(t, path, fmt.Appendf(nil, `apiVersion: v1
kind: Config
clusters:
- name: e2e
  cluster:
    server: %q
    insecure-skip-tls-verify: true
users:
- name: %q
  user:
    token: %q
contexts:
- name: e2e
  context:
    cluster: e2e
    user: %q
current-context: e2e
`, c.server, user, token, user))
	return path
}

// restConfigFor is the client configuration of user (kubeAdmin or
// kubeToposched), with QPS 500 and burst 1000.
func (c *kubeCluster) restConfigFor(t testing.TB, user string) *rest.Config {
	t.Helper()
	return &rest.Config{
		Host:            c.server,
		BearerToken:     c.token(t, user),
		TLSClientConfig: rest.TLSClientConfig{Insecure: true},
		QPS:             500,
		Burst:           1000,
		UserAgent:       "toposched-e2e/" + user,
		// Protobuf, as the controllers that create pods in a cluster
		// (kube-controller-manager's) and both schedulers speak: in JSON
		// the test's own pod creates and its watch of every pod made the
		// API server decode and encode a second format beside theirs, on
		// the two cores the benchmarks measure (every client here uses
		// built-in types only).
		ContentConfig: rest.ContentConfig{
			ContentType:        "application/vnd.kubernetes.protobuf",
			AcceptContentTypes: "application/vnd.kubernetes.protobuf,application/json",
		},
	}
}

func (c *kubeCluster) token(t testing.TB, user string) string {
	t.Helper()
	token, ok := c.tokens[user]
	if !ok {
		t.Fatalf("no user %q in the apiserver's token file (there are %s and %s)", user, kubeAdmin, kubeToposched)
	}
	return token
}

// addNode creates a kwok-managed Node (64 CPUs, 1 TiB, 110 pods), waits
// until kwok reports it Ready, and lifts the not-ready taint the apiserver
// put on it at creation (no node lifecycle controller runs to do it). It
// returns the node as it then is.
func (c *kubeCluster) addNode(t testing.TB, name string, labels map[string]string) *corev1.Node {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), kubeCallTimeout)
	defer cancel()
	if _, err := c.Client.CoreV1().Nodes().Create(ctx, kwokNode(name, labels), metav1.CreateOptions{}); err != nil {
		t.Fatalf("create node %s: %v", name, err)
	}
	var ready *corev1.Node
	waitFor(t, kubeStartTimeout, func() (bool, string) {
		ctx, cancel := context.WithTimeout(t.Context(), kubeCallTimeout)
		defer cancel()
		n, err := c.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, fmt.Sprintf("node %s: %v", name, err)
		}
		if !nodeReady(n) {
			return false, fmt.Sprintf("node %s not Ready yet (kwok): conditions %v", name, n.Status.Conditions)
		}
		kept := slices.DeleteFunc(slices.Clone(n.Spec.Taints), func(tn corev1.Taint) bool { return tn.Key == notReadyTaint })
		if len(kept) == len(n.Spec.Taints) {
			ready = n
			return true, ""
		}
		n.Spec.Taints = kept
		if _, err := c.Client.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
			return false, fmt.Sprintf("node %s: lift taint %s: %v", name, notReadyTaint, err)
		}
		return false, fmt.Sprintf("node %s: taint %s lifted, reading it back", name, notReadyTaint)
	})
	return ready
}

// kwokNode is a Node kwok manages: 64 CPUs, 1 TiB, 110 pods.
func kwokNode(name string, labels map[string]string) *corev1.Node {
	all := map[string]string{"kubernetes.io/hostname": name, "kubernetes.io/os": "linux"}
	for k, v := range labels {
		all[k] = v
	}
	res := corev1.ResourceList{
		corev1.ResourceCPU:    resource.MustParse("64"),
		corev1.ResourceMemory: resource.MustParse("1Ti"),
		corev1.ResourcePods:   resource.MustParse("110"),
	}
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name:        name,
			Labels:      all,
			Annotations: map[string]string{kwokNodeAnnotation: "fake"},
		},
		Status: corev1.NodeStatus{Capacity: res, Allocatable: res},
	}
}

func nodeReady(n *corev1.Node) bool {
	for _, cond := range n.Status.Conditions {
		if cond.Type == corev1.NodeReady {
			return cond.Status == corev1.ConditionTrue
		}
	}
	return false
}

// addGPUClass creates the DeviceClass gpu.nvidia.com as NVIDIA's chart
// (deviceclass-gpu.yaml) installs it for resource.k8s.io/v1: whole GPUs of
// the driver, also requestable as the extended resource nvidia.com/gpu.
func (c *kubeCluster) addGPUClass(t testing.TB) {
	t.Helper()
	class := &resourcev1.DeviceClass{
		ObjectMeta: metav1.ObjectMeta{Name: gpuDriver},
		Spec: resourcev1.DeviceClassSpec{
			Selectors: []resourcev1.DeviceSelector{{CEL: &resourcev1.CELDeviceSelector{
				Expression: "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'",
			}}},
			ExtendedResourceName: new("nvidia.com/gpu"),
		},
	}
	ctx, cancel := context.WithTimeout(t.Context(), kubeCallTimeout)
	defer cancel()
	if _, err := c.Client.ResourceV1().DeviceClasses().Create(ctx, class, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create device class %s: %v", gpuDriver, err)
	}
}

// sliceGPU is one GPU of a node's ResourceSlice. Product must be one of
// gpuProducts.
type sliceGPU struct {
	Minor    int    // the device is named gpu-<Minor>
	UUID     string // GPU-xxxxxxxx-...
	BusID    string // PCI address, 0000:18:00.0
	PCIeRoot string // pci<domain>:<bus>, pci0000:15
	Product  string // NVML's name, "NVIDIA H100 80GB HBM3"
}

// gpuProduct is what NVML reports for a product beyond its name.
type gpuProduct struct {
	architecture, computeCapability string
	memoryMiB                       int64
}

// gpuProducts are the products addGPUSlice knows, by NVML's name, with the
// total memory nvidia-smi reports.
var gpuProducts = map[string]gpuProduct{
	"NVIDIA H100 80GB HBM3": {"Hopper", "9.0.0", 81559},
	"NVIDIA H200":           {"Hopper", "9.0.0", 143771},
	"NVIDIA A100-SXM4-80GB": {"Ampere", "8.0.0", 81920},
	"NVIDIA B200":           {"Blackwell", "10.0.0", 183359},
}

// h100s is a node's eight H100s as on a DGX-class board: two GPUs behind
// each of four PCIe roots. node seeds the UUIDs so they differ between
// nodes.
func h100s(node string) []sliceGPU {
	roots := []string{"15", "36", "97", "b8"}
	buses := []string{"18", "2a", "3a", "5d", "9a", "ab", "ba", "db"}
	gpus := make([]sliceGPU, 8)
	for i := range gpus {
		gpus[i] = sliceGPU{
			Minor:    i,
			UUID:     fmt.Sprintf("GPU-%08x-0000-4000-8000-%012d", hash32(node), i),
			BusID:    "0000:" + buses[i] + ":00.0",
			PCIeRoot: "pci0000:" + roots[i/2],
			Product:  "NVIDIA H100 80GB HBM3",
		}
	}
	return gpus
}

// hash32 is a stable hash of s, for made-up identifiers.
func hash32(s string) uint32 {
	h := fnv.New32a()
	_, _ = h.Write([]byte(s))
	return h.Sum32()
}

// addGPUSlice publishes node's GPUs as NVIDIA's gpu-kubelet-plugin does:
// one ResourceSlice of driver gpu.nvidia.com, pool named after the node,
// owned by the Node, a device gpu-<minor> per GPU. The attributes are the
// plugin's for a full GPU (deviceinfo.go): the minor is only in the device
// name (no index or minor attribute); the bus ID is published as pcieBusID
// by releases up to 25.8 and as the standard resource.kubernetes.io/pciBusID
// since 25.12, so both are here; addressingMode, only on coherent-memory
// systems, is not.
func (c *kubeCluster) addGPUSlice(t testing.TB, node string, gpus []sliceGPU) *resourcev1.ResourceSlice {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), kubeCallTimeout)
	defer cancel()
	n, err := c.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("resource slice of node %s: %v", node, err)
	}
	str := func(s string) resourcev1.DeviceAttribute { return resourcev1.DeviceAttribute{StringValue: new(s)} }
	ver := func(s string) resourcev1.DeviceAttribute { return resourcev1.DeviceAttribute{VersionValue: new(s)} }
	devices := make([]resourcev1.Device, 0, len(gpus))
	for _, g := range gpus {
		p, ok := gpuProducts[g.Product]
		if !ok {
			t.Fatalf("resource slice of node %s: gpu-%d: product %q unknown (known: %v)", node, g.Minor, g.Product, slices.Sorted(maps.Keys(gpuProducts)))
		}
		if g.UUID == "" || g.BusID == "" || g.PCIeRoot == "" {
			t.Fatalf("resource slice of node %s: gpu-%d: UUID, BusID and PCIeRoot are required (%+v)", node, g.Minor, g)
		}
		devices = append(devices, resourcev1.Device{
			Name: fmt.Sprintf("gpu-%d", g.Minor),
			Attributes: map[resourcev1.QualifiedName]resourcev1.DeviceAttribute{
				"type":                            str("gpu"),
				"uuid":                            str(g.UUID),
				"productName":                     str(g.Product),
				"brand":                           str("Nvidia"),
				"architecture":                    str(p.architecture),
				"cudaComputeCapability":           ver(p.computeCapability),
				"driverVersion":                   ver("570.124.6"),
				"cudaDriverVersion":               ver("12.8.0"),
				"pcieBusID":                       str(g.BusID),
				"resource.kubernetes.io/pciBusID": str(g.BusID),
				"resource.kubernetes.io/pcieRoot": str(g.PCIeRoot),
			},
			Capacity: map[resourcev1.QualifiedName]resourcev1.DeviceCapacity{
				"memory": {Value: *resource.NewQuantity(p.memoryMiB<<20, resource.BinarySI)},
			},
		})
	}
	slice := &resourcev1.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{
			// As the kubelet's slice controller names them.
			GenerateName: node + "-" + gpuDriver + "-",
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: "v1", Kind: "Node", Name: node, UID: n.UID, Controller: new(true),
			}},
		},
		Spec: resourcev1.ResourceSliceSpec{
			Driver:   gpuDriver,
			NodeName: new(node),
			Pool:     resourcev1.ResourcePool{Name: node, Generation: 1, ResourceSliceCount: 1},
			Devices:  devices,
		},
	}
	out, err := c.Client.ResourceV1().ResourceSlices().Create(ctx, slice, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create resource slice of node %s: %v", node, err)
	}
	return out
}

// addClaimTemplate creates a ResourceClaimTemplate in ns asking for gpus
// whole GPUs of the class gpu.nvidia.com in one request named "gpus", with
// no constraint: where they are is the scheduler's choice.
func (c *kubeCluster) addClaimTemplate(t testing.TB, ns, name string, gpus int) {
	t.Helper()
	tmpl := &resourcev1.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: resourcev1.ResourceClaimTemplateSpec{Spec: resourcev1.ResourceClaimSpec{
			Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{{
				Name: gpuRequest,
				Exactly: &resourcev1.ExactDeviceRequest{
					DeviceClassName: gpuDriver,
					AllocationMode:  resourcev1.DeviceAllocationModeExactCount,
					Count:           int64(gpus),
				},
			}}},
		}},
	}
	ctx, cancel := context.WithTimeout(t.Context(), kubeCallTimeout)
	defer cancel()
	if _, err := c.Client.ResourceV1().ResourceClaimTemplates(ns).Create(ctx, tmpl, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create resource claim template %s/%s: %v", ns, name, err)
	}
}

// gpuPod is a pod for toposched whose one container holds the claim made
// from claimTemplate (see addClaimTemplate). kwok never pulls the image.
func gpuPod(ns, name, claimTemplate string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.PodSpec{
			SchedulerName: schedulerName,
			ResourceClaims: []corev1.PodResourceClaim{{
				Name:                      gpuRequest,
				ResourceClaimTemplateName: new(claimTemplate),
			}},
			Containers: []corev1.Container{{
				Name:  "main",
				Image: "registry.invalid/trainer:latest",
				Resources: corev1.ResourceRequirements{
					Claims: []corev1.ResourceClaim{{Name: gpuRequest}},
				},
			}},
		},
	}
}

// waitPodClaim waits for the controller manager to make pod's claim from
// its template and returns the claim's name.
func (c *kubeCluster) waitPodClaim(t testing.TB, ns, pod string) string {
	t.Helper()
	var name string
	waitFor(t, kubeCallTimeout, func() (bool, string) {
		ctx, cancel := context.WithTimeout(t.Context(), kubeCallTimeout)
		defer cancel()
		p, err := c.Client.CoreV1().Pods(ns).Get(ctx, pod, metav1.GetOptions{})
		if err != nil {
			return false, fmt.Sprintf("pod %s/%s: %v", ns, pod, err)
		}
		for _, s := range p.Status.ResourceClaimStatuses {
			if s.Name == gpuRequest && s.ResourceClaimName != nil {
				name = *s.ResourceClaimName
				return true, ""
			}
		}
		return false, fmt.Sprintf("pod %s/%s has no claim %q in status.resourceClaimStatuses yet (kube-controller-manager)", ns, pod, gpuRequest)
	})
	return name
}

// kubeProc is a control-plane component: its output goes to a log file in
// the cluster's directory.
type kubeProc struct {
	name string
	log  string
	cmd  *exec.Cmd
	done chan struct{}
	err  error // valid once done is closed
}

// startKubeProc starts bin with its output in dir/<name>.log. When the test
// ends it is sent SIGTERM, killed if it is still running kubeStopGrace
// later, and, if the test failed, the tail of its log is printed.
func startKubeProc(t testing.TB, dir, name, bin string, args ...string) *kubeProc {
	t.Helper()
	p := &kubeProc{name: name, log: filepath.Join(dir, name+".log"), done: make(chan struct{})}
	f, err := os.Create(p.log)
	if err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	defer func() { _ = f.Close() }() // the child holds its own copy
	p.cmd = exec.Command(bin, args...)
	p.cmd.Dir = dir
	p.cmd.Env = childEnv()
	p.cmd.Stdout, p.cmd.Stderr = f, f
	dieWithParent(p.cmd)
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	go func() {
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.stop(t)
		if t.Failed() {
			t.Logf("---- %s (%s), last lines of %s:\n%s", name, strings.Join(p.cmd.Args, " "), p.log, tailFile(p.log, 60))
		}
	})
	return p
}

// stop sends SIGTERM and waits for the exit, killing the process after
// kubeStopGrace.
func (p *kubeProc) stop(t testing.TB) {
	select {
	case <-p.done:
		return
	default:
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		t.Logf("SIGTERM to %s: %v", p.name, err)
	}
	select {
	case <-p.done:
	case <-time.After(kubeStopGrace):
		t.Logf("%s still running %s after SIGTERM: killing it", p.name, kubeStopGrace)
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// mustRun fails the test, with the tail of the log, if the process exited.
func (p *kubeProc) mustRun(t testing.TB) {
	t.Helper()
	select {
	case <-p.done:
		t.Fatalf("%s exited (%v); last lines of %s:\n%s", p.name, p.err, p.log, tailFile(p.log, 60))
	default:
	}
}

// waitHealthy polls url until it answers 200 with a body containing want
// (anything, if want is empty), as token's user if token is set.
func (p *kubeProc) waitHealthy(t testing.TB, url, token, want string) {
	t.Helper()
	client := &http.Client{
		Timeout: 5 * time.Second,
		// The components serve self-signed certificates on loopback.
		Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}},
	}
	defer client.CloseIdleConnections()
	waitFor(t, kubeStartTimeout, func() (bool, string) {
		p.mustRun(t)
		req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, url, nil)
		if err != nil {
			t.Fatalf("%s health check: %v", p.name, err)
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := client.Do(req)
		if err != nil {
			return false, fmt.Sprintf("%s: GET %s: %v", p.name, url, err)
		}
		body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		_ = resp.Body.Close()
		if err != nil {
			return false, fmt.Sprintf("%s: GET %s: %v", p.name, url, err)
		}
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), want) {
			return false, fmt.Sprintf("%s: GET %s: %s %q", p.name, url, resp.Status, body)
		}
		return true, ""
	})
}

// tailFile is the last n lines of the file at path.
func tailFile(path string, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return err.Error()
	}
	defer func() { _ = f.Close() }()
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if len(lines) > n {
			lines = lines[1:]
		}
	}
	if err := sc.Err(); err != nil {
		lines = append(lines, fmt.Sprintf("(reading %s: %v)", path, err))
	}
	return strings.Join(lines, "\n")
}

func writeKubeFile(t testing.TB, path string, data []byte) {
	t.Helper()
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

func randomToken(t testing.TB) string {
	t.Helper()
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// ms rounds a duration for the startup log.
func ms(d time.Duration) time.Duration { return d.Round(time.Millisecond) }
