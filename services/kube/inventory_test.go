package kube

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/events/bus"
)

func TestNormalBusID(t *testing.T) {
	tests := []struct {
		in   string
		want string // "" for not a PCI address
	}{
		{"0000:18:00.0", "0000:18:00.0"},     // the DRA driver's
		{"00000000:18:00.0", "0000:18:00.0"}, // nvidia-smi's
		{"00000000:DB:00.0", "0000:db:00.0"}, // nvidia-smi writes hex upper case
		{"0000:db:00.0", "0000:db:00.0"},
		{"0000:Db:1F.7", "0000:db:1f.7"},
		{"  0000:18:00.0\n", "0000:18:00.0"},
		{"18:00.0", "0000:18:00.0"}, // lspci's, without a domain
		{"0001:18:00.0", "0001:18:00.0"},
		{"00010000:18:00.0", "10000:18:00.0"}, // a VMD domain, above 16 bits
		{"0:18:0.0", "0000:18:00.0"},
		{"", ""},
		{"gpu-0", ""},
		{"GPU-5b3f0b07-1f4e-7c8d-2a3b-4c5d6e7f8a9b", ""},
		{"0000:18:00", ""},     // no function
		{"0000:18:00.0.0", ""}, // two functions
		{"0000:0000:18:00.0", ""},
		{"0000::00.0", ""},
		{"0000:18:.0", ""},
		{"0000:18:00.", ""},
		{"0000:zz:00.0", ""},
		{"0000:0x18:00.0", ""},
		{"0000:+18:00.0", ""},
		{"0000:1_8:00.0", ""},
		{"100000000:18:00.0", ""}, // a domain beyond 32 bits
		{"0000:100:00.0", ""},     // a bus beyond 8 bits
		{"0000:18:20.0", ""},      // a device beyond 5 bits
		{"0000:18:00.8", ""},      // a function beyond 3 bits
	}
	for _, tt := range tests {
		got, ok := normalBusID(tt.in)
		if ok != (tt.want != "") || got != tt.want {
			t.Errorf("normalBusID(%q) = %q, %v; want %q, %v", tt.in, got, ok, tt.want, tt.want != "")
		}
	}
}

// canonicalBusID is normalBusID's form.
var canonicalBusID = regexp.MustCompile(`^[0-9a-f]{4,8}:[0-9a-f]{2}:[01][0-9a-f]\.[0-7]$`)

func FuzzNormalBusID(f *testing.F) {
	for _, s := range []string{"0000:18:00.0", "00000000:DB:00.0", "18:00.0", "0000:18:00", "", "::.", "0:0:0.0", "ffffffff:ff:1f.7", "0000:100:00.0", "0000:18:20.0", "0000:18:00.8"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got, ok := normalBusID(s)
		if !ok {
			if got != "" {
				t.Fatalf("normalBusID(%q) = %q, false; want \"\" with false", s, got)
			}
			return
		}
		if !canonicalBusID.MatchString(got) {
			t.Fatalf("normalBusID(%q) = %q, not in the canonical form", s, got)
		}
		again, ok := normalBusID(got)
		if !ok || again != got {
			t.Fatalf("normalBusID(%q) = %q, but normalBusID(%q) = %q, %v", s, got, got, again, ok)
		}
		// The case nvidia-smi writes is the case the driver does not.
		if up, ok := normalBusID(strings.ToUpper(got)); !ok || up != got {
			t.Fatalf("normalBusID(%q) = %q, %v; want %q", strings.ToUpper(got), up, ok, got)
		}
	})
}

// unitService is a Service whose informers are never started: a test
// puts objects in their stores. Its bus is never used (inventoryOf and
// heldOn publish nothing), so it is a zero Bus, not a connection.
func unitService(t *testing.T, cfg Config) *Service {
	t.Helper()
	s, err := New(cfg, Deps{Kube: fake.NewClientset(), Bus: &bus.Bus{}})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func add(t *testing.T, inf cache.SharedIndexInformer, objs ...any) {
	t.Helper()
	for _, o := range objs {
		if err := inf.GetIndexer().Add(o); err != nil {
			t.Fatal(err)
		}
	}
}

// readyNode is a Ready, schedulable node without taints.
func readyNode(name string) *corev1.Node {
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Status:     corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}},
	}
}

// device is a DRA device with string attributes, written as NVIDIA's
// gpu-kubelet-plugin writes them (unqualified: the driver's domain).
func device(name string, attrs ...string) resourceapi.Device {
	d := resourceapi.Device{Name: name, Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{}}
	for i := 0; i+1 < len(attrs); i += 2 {
		d.Attributes[resourceapi.QualifiedName(attrs[i])] = resourceapi.DeviceAttribute{StringValue: new(attrs[i+1])}
	}
	return d
}

// gpuDevice is a full GPU as the plugin publishes it.
func gpuDevice(minor int, uuid, busID string) resourceapi.Device {
	return device(fmt.Sprintf("gpu-%d", minor), "type", "gpu", "uuid", uuid, "pcieBusID", busID, "resource.kubernetes.io/pciBusID", busID)
}

// nodeSlice is a ResourceSlice of driver on node, its pool named after
// the node.
func nodeSlice(name, node, driver string, devices ...resourceapi.Device) *resourceapi.ResourceSlice {
	return &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: resourceapi.ResourceSliceSpec{
			Driver: driver, NodeName: new(node),
			Pool:    resourceapi.ResourcePool{Name: node, Generation: 1, ResourceSliceCount: 1},
			Devices: devices,
		},
	}
}

// allocatedClaim is a claim in team-a allocated the devices of driver
// gpu.nvidia.com in pool, annotated with job where job is not "".
func allocatedClaim(name, job, pool string, devices ...string) *resourceapi.ResourceClaim {
	c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: name, UID: "uid-" + types.UID(name)}}
	if job != "" {
		c.Annotations = map[string]string{AnnotationJobID: job}
	}
	alloc := &resourceapi.AllocationResult{}
	for _, d := range devices {
		alloc.Devices.Results = append(alloc.Devices.Results, resourceapi.DeviceRequestAllocationResult{
			Request: "gpus", Driver: DefaultGPUDriver, Pool: pool, Device: d})
	}
	c.Status.Allocation = alloc
	return c
}

// H100 identities of node-a's GPUs as nvidia-smi reports them (domain
// of eight digits, upper case) and as the driver publishes them.
var (
	uuids     = []string{"GPU-5B3F0B07-1F4E-7C8D-2A3B-4C5D6E7F8A90", "GPU-5B3F0B07-1F4E-7C8D-2A3B-4C5D6E7F8A91", "GPU-5B3F0B07-1F4E-7C8D-2A3B-4C5D6E7F8A92", "GPU-5B3F0B07-1F4E-7C8D-2A3B-4C5D6E7F8A93"}
	smiBusIDs = []string{"00000000:18:00.0", "00000000:2A:00.0", "00000000:3A:00.0", "00000000:5D:00.0"}
	draBusIDs = []string{"0000:18:00.0", "0000:2a:00.0", "0000:3a:00.0", "0000:5d:00.0"}
)

// topoGPUs are node-a's four GPUs as agent discovery reports them.
func topoGPUs() []events.GPU {
	out := make([]events.GPU, 4)
	for i := range out {
		out[i] = events.GPU{Index: i, UUID: uuids[i], BusID: smiBusIDs[i], Model: "NVIDIA H100 80GB HBM3"}
	}
	return out
}

// driverGPUs are node-a's four GPUs as the DRA driver publishes them.
func driverGPUs() []resourceapi.Device {
	out := make([]resourceapi.Device, 4)
	for i := range out {
		out[i] = gpuDevice(i, strings.ToLower(uuids[i]), draBusIDs[i])
	}
	return out
}

// matched renders an inventory's matching: "index=device" by index, then
// "missing=[...]".
func matched(inv inventory) string {
	var parts []string
	idxs := make([]int, 0, len(inv.device))
	for i := range inv.device {
		idxs = append(idxs, i)
	}
	slices.Sort(idxs)
	for _, i := range idxs {
		id := inv.device[i]
		if back, ok := inv.index[id]; !ok || back != i {
			parts = append(parts, fmt.Sprintf("%d=%s(index says %d)", i, id.Device, back))
			continue
		}
		if id.Driver.String() != DefaultGPUDriver {
			parts = append(parts, fmt.Sprintf("%d=%s/%s", i, id.Driver, id.Device))
			continue
		}
		parts = append(parts, fmt.Sprintf("%d=%s", i, id.Device))
	}
	if len(inv.index) != len(inv.device) {
		parts = append(parts, fmt.Sprintf("index has %d entries, device %d", len(inv.index), len(inv.device)))
	}
	return strings.Join(parts, " ") + fmt.Sprintf(" missing=%v", inv.missing)
}

func TestInventoryOf(t *testing.T) {
	gpuWith := func(i int, uuid, bus string) events.GPU { return events.GPU{Index: i, UUID: uuid, BusID: bus} }
	tests := []struct {
		name   string
		topo   []events.GPU
		slices []*resourceapi.ResourceSlice
		want   string
	}{
		{
			name:   "by UUID, any case",
			topo:   topoGPUs(),
			slices: []*resourceapi.ResourceSlice{nodeSlice("s", "node-a", DefaultGPUDriver, driverGPUs()...)},
			want:   "0=gpu-0 1=gpu-1 2=gpu-2 3=gpu-3 missing=[]",
		},
		{
			// The minor in a device's name need not be NVML's index:
			// the UUID says which GPU a device is.
			name: "by UUID, minors not the indexes",
			topo: topoGPUs()[:2],
			slices: []*resourceapi.ResourceSlice{nodeSlice("s", "node-a", DefaultGPUDriver,
				gpuDevice(0, uuids[1], draBusIDs[1]), gpuDevice(1, uuids[0], draBusIDs[0]))},
			want: "0=gpu-1 1=gpu-0 missing=[]",
		},
		{
			name: "by bus id, the topology without UUIDs",
			topo: []events.GPU{gpuWith(0, "", smiBusIDs[2]), gpuWith(1, "", smiBusIDs[0])},
			slices: []*resourceapi.ResourceSlice{nodeSlice("s", "node-a", DefaultGPUDriver,
				device("gpu-0", "type", "gpu", "uuid", uuids[0], "pcieBusID", draBusIDs[0]),                         // releases up to 25.8
				device("gpu-2", "type", "gpu", "uuid", uuids[2], "resource.kubernetes.io/pciBusID", draBusIDs[2]))}, // since 25.12
			want: "0=gpu-2 1=gpu-0 missing=[]",
		},
		{
			name: "by bus id where the UUIDs differ",
			topo: []events.GPU{gpuWith(0, "GPU-other", smiBusIDs[1])},
			slices: []*resourceapi.ResourceSlice{nodeSlice("s", "node-a", DefaultGPUDriver,
				gpuDevice(0, uuids[0], draBusIDs[0]), gpuDevice(1, uuids[1], draBusIDs[1]))},
			want: "0=gpu-1 missing=[]",
		},
		{
			name: "by the driver's qualified attribute names",
			topo: []events.GPU{gpuWith(0, uuids[3], "")},
			slices: []*resourceapi.ResourceSlice{nodeSlice("s", "node-a", DefaultGPUDriver,
				device("gpu-3", "gpu.nvidia.com/type", "gpu", "gpu.nvidia.com/uuid", uuids[3]))},
			want: "0=gpu-3 missing=[]",
		},
		{
			// A cluster file's model preset names GPUs by index alone.
			name: "by minor where the topology names neither",
			topo: []events.GPU{{Index: 0}, {Index: 1}, {Index: 2}},
			slices: []*resourceapi.ResourceSlice{nodeSlice("s", "node-a", DefaultGPUDriver,
				gpuDevice(2, uuids[2], draBusIDs[2]), gpuDevice(0, uuids[0], draBusIDs[0]), gpuDevice(1, uuids[1], draBusIDs[1]),
				gpuDevice(7, uuids[3], draBusIDs[3]), device("gpu-x", "type", "gpu"), device("nic-1"))},
			want: "0=gpu-0 1=gpu-1 2=gpu-2 missing=[]",
		},
		{
			name: "not by minor where the topology names a UUID",
			topo: []events.GPU{gpuWith(0, "GPU-not-here", ""), {Index: 1}},
			slices: []*resourceapi.ResourceSlice{nodeSlice("s", "node-a", DefaultGPUDriver,
				gpuDevice(0, uuids[0], draBusIDs[0]), gpuDevice(1, uuids[1], draBusIDs[1]))},
			want: " missing=[0 1]",
		},
		{
			name: "not by minor where the topology names a bus id",
			topo: []events.GPU{gpuWith(0, "", "00000000:99:00.0"), {Index: 1}},
			slices: []*resourceapi.ResourceSlice{nodeSlice("s", "node-a", DefaultGPUDriver,
				gpuDevice(0, uuids[0], draBusIDs[0]), gpuDevice(1, uuids[1], draBusIDs[1]))},
			want: " missing=[0 1]",
		},
		{
			// A MIG device carries its parent's bus id: only the full
			// GPU is the topology's GPU.
			name: "a MIG device is not a GPU",
			topo: []events.GPU{gpuWith(0, "", smiBusIDs[0]), gpuWith(1, "", smiBusIDs[1])},
			slices: []*resourceapi.ResourceSlice{nodeSlice("s", "node-a", DefaultGPUDriver,
				device("gpu-0-mig-1g10gb-0", "type", "mig", "uuid", "MIG-0", "parentUUID", uuids[0], "pcieBusID", draBusIDs[0]),
				gpuDevice(0, uuids[0], draBusIDs[0]),
				device("gpu-1-mig-1g10gb-0", "type", "mig", "uuid", "MIG-1", "parentUUID", uuids[1], "pcieBusID", draBusIDs[1]))},
			want: "0=gpu-0 missing=[1]",
		},
		{
			name: "another driver's devices are not GPUs",
			topo: topoGPUs()[:2],
			slices: []*resourceapi.ResourceSlice{
				nodeSlice("a-nic", "node-a", "dra.net", device("gpu-1", "type", "gpu", "uuid", uuids[1], "pcieBusID", draBusIDs[1])),
				nodeSlice("b-gpu", "node-a", DefaultGPUDriver, gpuDevice(0, uuids[0], draBusIDs[0])),
			},
			want: "0=gpu-0 missing=[1]",
		},
		{
			name: "another node's devices are not its GPUs",
			topo: topoGPUs()[:1],
			slices: []*resourceapi.ResourceSlice{
				nodeSlice("s", "node-b", DefaultGPUDriver, gpuDevice(0, uuids[0], draBusIDs[0])),
			},
			want: " missing=[0]",
		},
		{
			name: "a device of no GPU is left out",
			topo: topoGPUs()[:1],
			slices: []*resourceapi.ResourceSlice{nodeSlice("s", "node-a", DefaultGPUDriver,
				gpuDevice(0, uuids[0], draBusIDs[0]), gpuDevice(5, "GPU-unknown", "0000:c1:00.0"))},
			want: "0=gpu-0 missing=[]",
		},
		{
			name:   "no slices",
			topo:   topoGPUs()[:2],
			slices: nil,
			want:   " missing=[0 1]",
		},
		{
			name: "two devices of one GPU: the first slice by name wins",
			topo: topoGPUs()[:1],
			slices: []*resourceapi.ResourceSlice{
				nodeSlice("z", "node-a", DefaultGPUDriver, gpuDevice(9, uuids[0], draBusIDs[0])),
				nodeSlice("a", "node-a", DefaultGPUDriver, gpuDevice(0, uuids[0], draBusIDs[0])),
			},
			want: "0=gpu-0 missing=[]",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := unitService(t, Config{})
			for _, sl := range tt.slices {
				add(t, s.slices, sl)
			}
			s.topo["node-a"] = &nodeGPUs{gpus: tt.topo}
			inv := s.inventoryOf("node-a")
			if got := matched(inv); got != tt.want {
				t.Errorf("inventory: %s\n          want %s", got, tt.want)
			}
			if len(inv.slices) != countOn(tt.slices, "node-a") {
				t.Errorf("inventory has %d slices, the node has %d", len(inv.slices), countOn(tt.slices, "node-a"))
			}
		})
	}
}

func countOn(sls []*resourceapi.ResourceSlice, node string) int {
	n := 0
	for _, sl := range sls {
		if *sl.Spec.NodeName == node {
			n++
		}
	}
	return n
}

// held renders holds as "index:by" items.
func held(hs []events.HeldGPU) string {
	parts := make([]string, len(hs))
	for i, h := range hs {
		parts[i] = fmt.Sprintf("%d:%s", h.Index, h.By)
	}
	return strings.Join(parts, "; ")
}

func TestHeldOn(t *testing.T) {
	const noDevice = "no gpu.nvidia.com device in the node's ResourceSlices matches this GPU"
	live := &jobState{id: "k8s:team-a:train:0123456789ab-1", decided: &events.PlacementDecided{JobID: "k8s:team-a:train:0123456789ab-1"}}
	ended := &jobState{id: "k8s:team-a:old:0123456789ab-1", decided: &events.PlacementDecided{JobID: "k8s:team-a:old:0123456789ab-1"}, finished: true}
	waiting := &jobState{id: "k8s:team-a:wait:0123456789ab-1"}
	tainted := func(key string, effect corev1.TaintEffect) *corev1.Node {
		n := readyNode("node-a")
		n.Spec.Taints = []corev1.Taint{{Key: key, Effect: effect}}
		return n
	}
	cordoned := readyNode("node-a")
	cordoned.Spec.Unschedulable = true
	notReady := readyNode("node-a")
	notReady.Status.Conditions[0].Status = corev1.ConditionFalse
	unknown := readyNode("node-a")
	unknown.Status.Conditions[0].Status = corev1.ConditionUnknown
	noConditions := readyNode("node-a")
	noConditions.Status.Conditions = nil
	allHeld := func(why string) string {
		return fmt.Sprintf("0:%s; 1:%s; 2:%s; 3:%s", why, why, why, why)
	}

	tests := []struct {
		name    string
		node    *corev1.Node // nil: no Node object
		devices []resourceapi.Device
		claims  []*resourceapi.ResourceClaim
		want    string
	}{
		{name: "all free", node: readyNode("node-a"), devices: driverGPUs(), want: ""},
		{name: "a GPU without a device", node: readyNode("node-a"), devices: driverGPUs()[1:], want: "0:" + noDevice},
		{
			name: "another scheduler's claim", node: readyNode("node-a"), devices: driverGPUs(),
			claims: []*resourceapi.ResourceClaim{allocatedClaim("foreign", "", "node-a", "gpu-1", "gpu-3")},
			want:   "1:claim team-a/foreign; 3:claim team-a/foreign",
		},
		{
			name: "a live toposched job's claim", node: readyNode("node-a"), devices: driverGPUs(),
			claims: []*resourceapi.ResourceClaim{allocatedClaim("mine", live.id, "node-a", "gpu-0", "gpu-2")},
			want:   "",
		},
		{
			name: "a finished toposched job's claim, still allocated", node: readyNode("node-a"), devices: driverGPUs(),
			claims: []*resourceapi.ResourceClaim{allocatedClaim("old", ended.id, "node-a", "gpu-2")},
			want:   "2:claim team-a/old",
		},
		{
			name: "a claim naming a job not decided", node: readyNode("node-a"), devices: driverGPUs(),
			claims: []*resourceapi.ResourceClaim{allocatedClaim("early", waiting.id, "node-a", "gpu-0")},
			want:   "0:claim team-a/early",
		},
		{
			name: "a claim naming a job the streams do not know", node: readyNode("node-a"), devices: driverGPUs(),
			claims: []*resourceapi.ResourceClaim{allocatedClaim("stray", "k8s:team-a:gone:0123456789ab-1", "node-a", "gpu-3")},
			want:   "3:claim team-a/stray",
		},
		{
			name: "claims of another pool and of no GPU", node: readyNode("node-a"), devices: driverGPUs(),
			claims: []*resourceapi.ResourceClaim{
				allocatedClaim("elsewhere", "", "node-b", "gpu-0"),
				allocatedClaim("not-a-gpu", "", "node-a", "gpu-9"),
			},
			want: "",
		},
		{
			name: "a device gone and a claim on the rest", node: readyNode("node-a"), devices: driverGPUs()[:3],
			claims: []*resourceapi.ResourceClaim{allocatedClaim("foreign", "", "node-a", "gpu-0")},
			want:   "0:claim team-a/foreign; 3:" + noDevice,
		},
		{name: "cordoned", node: cordoned, devices: driverGPUs(), want: allHeld("node node-a is cordoned")},
		{name: "not ready", node: notReady, devices: driverGPUs(), want: allHeld("node node-a is not ready")},
		{name: "readiness unknown", node: unknown, devices: driverGPUs(), want: allHeld("node node-a is not ready")},
		{name: "no Ready condition", node: noConditions, devices: driverGPUs(), want: allHeld("node node-a is not ready")},
		{name: "no Node", node: nil, devices: driverGPUs(), want: allHeld("no Kubernetes node of this name")},
		{name: "tainted NoSchedule", node: tainted("nvidia.com/gpu", corev1.TaintEffectNoSchedule), devices: driverGPUs(),
			want: allHeld("node node-a has taint nvidia.com/gpu:NoSchedule")},
		{name: "tainted NoExecute", node: tainted("node.kubernetes.io/unreachable", corev1.TaintEffectNoExecute), devices: driverGPUs(),
			want: allHeld("node node-a has taint node.kubernetes.io/unreachable:NoExecute")},
		{name: "tainted PreferNoSchedule", node: tainted("busy", corev1.TaintEffectPreferNoSchedule), devices: driverGPUs(), want: ""},
		{name: "the dedicated taint", node: tainted(DefaultDedicatedTaint, corev1.TaintEffectNoSchedule), devices: driverGPUs(), want: ""},
		{name: "the dedicated taint, NoExecute", node: tainted(DefaultDedicatedTaint, corev1.TaintEffectNoExecute), devices: driverGPUs(), want: ""},
		{
			// An unusable node's GPUs are held for that, whatever holds
			// them besides.
			name: "cordoned, with another scheduler's claim", node: cordoned, devices: driverGPUs(),
			claims: []*resourceapi.ResourceClaim{allocatedClaim("foreign", "", "node-a", "gpu-1")},
			want:   allHeld("node node-a is cordoned"),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := unitService(t, Config{})
			if tt.node != nil {
				add(t, s.nodes, tt.node)
			}
			add(t, s.slices, nodeSlice("node-a-gpu", "node-a", DefaultGPUDriver, tt.devices...))
			add(t, s.slices, nodeSlice("node-b-gpu", "node-b", DefaultGPUDriver, driverGPUs()...))
			for _, c := range tt.claims {
				add(t, s.claims, c)
			}
			s.topo["node-a"] = &nodeGPUs{gpus: topoGPUs()}
			for _, j := range []*jobState{live, ended, waiting} {
				cp := *j
				s.jobs[j.id] = &cp
			}
			if got := held(s.heldOn("node-a")); got != tt.want {
				t.Errorf("held:\n got %s\nwant %s", got, tt.want)
			}
		})
	}
}

// TestHeldUntilDeallocated: a finished job's claim holds its GPUs until
// it is given back; a job that finishes turns its claims' GPUs held.
func TestHeldUntilDeallocated(t *testing.T) {
	s := unitService(t, Config{})
	add(t, s.nodes, readyNode("node-a"))
	add(t, s.slices, nodeSlice("node-a-gpu", "node-a", DefaultGPUDriver, driverGPUs()...))
	s.topo["node-a"] = &nodeGPUs{gpus: topoGPUs()}
	id := "k8s:team-a:train:0123456789ab-1"
	s.setGang(s.job(id), "team-a/Pod/train")
	s.jobs[id].decided = &events.PlacementDecided{JobID: id}
	c := allocatedClaim("train-gpus", id, "node-a", "gpu-0", "gpu-1")
	add(t, s.claims, c)

	if got := held(s.heldOn("node-a")); got != "" {
		t.Fatalf("a live job's claim: held %q, want none", got)
	}
	s.finished(s.jobs[id])
	if got, want := held(s.heldOn("node-a")), "0:claim team-a/train-gpus; 1:claim team-a/train-gpus"; got != want {
		t.Fatalf("the job finished, its claim allocated: held %q, want %q", got, want)
	}
	given := c.DeepCopy()
	given.Status.Allocation, given.Status.ReservedFor = nil, nil
	if err := s.claims.GetIndexer().Update(given); err != nil {
		t.Fatal(err)
	}
	if got := held(s.heldOn("node-a")); got != "" {
		t.Fatalf("the claim given back: held %q, want none", got)
	}
}

func TestHeldOnUnknownNode(t *testing.T) {
	s := unitService(t, Config{})
	add(t, s.nodes, readyNode("node-a"))
	if got := s.heldOn("node-a"); got != nil {
		t.Errorf("a node the topology does not know: held %v, want nil", got)
	}
}

// TestHeldOnConfig: the dedicated taint and the GPU driver are the
// configured ones.
func TestHeldOnConfig(t *testing.T) {
	s := unitService(t, Config{DedicatedTaint: "example.com/gpu-team", GPUDriver: "gpu.example.com"})
	n := readyNode("node-a")
	n.Spec.Taints = []corev1.Taint{{Key: "example.com/gpu-team", Effect: corev1.TaintEffectNoSchedule}}
	add(t, s.nodes, n)
	add(t, s.slices, nodeSlice("node-a-gpu", "node-a", "gpu.example.com", driverGPUs()[:3]...))
	add(t, s.slices, nodeSlice("node-a-nvidia", "node-a", DefaultGPUDriver, driverGPUs()...))
	s.topo["node-a"] = &nodeGPUs{gpus: topoGPUs()}
	if got, want := held(s.heldOn("node-a")), "3:no gpu.example.com device in the node's ResourceSlices matches this GPU"; got != want {
		t.Errorf("held %q, want %q", got, want)
	}
	n = n.DeepCopy()
	n.Spec.Taints[0].Key = DefaultDedicatedTaint
	if err := s.nodes.GetIndexer().Update(n); err != nil {
		t.Fatal(err)
	}
	if got := held(s.heldOn("node-a")); !strings.Contains(got, "has taint "+DefaultDedicatedTaint) {
		t.Errorf("the default dedicated taint on a service configured with another: held %q, want every GPU held for the taint", got)
	}
}
