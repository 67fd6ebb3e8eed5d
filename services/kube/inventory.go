package kube

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/structured"

	"github.com/toposched/toposched/events"
)

// Device attributes NVIDIA's gpu-kubelet-plugin publishes (its
// deviceinfo.go), in the driver's domain unless qualified, and the
// standard PCI one of k8s.io/dynamic-resource-allocation/deviceattribute.
const (
	attrType     = "type"
	attrUUID     = "uuid"
	attrBusID    = "pcieBusID"
	attrStdBusID = "resource.kubernetes.io/pciBusID"
)

// inventory is one node's GPUs as both sides know them: toposched's
// topology (by index) and the DRA driver's ResourceSlices (by device).
type inventory struct {
	node string
	// device is the DRA device of each toposched GPU index that has one.
	device map[int]structured.DeviceID
	// index is the other way round.
	index map[structured.DeviceID]int
	// missing are toposched's GPUs no device matched.
	missing []int
	// slices are the node's slices, of every driver.
	slices []*resourceapi.ResourceSlice
}

// inventoryOf matches a node's GPU devices to its topology's GPUs, by UUID
// and else by PCI bus id. A topology that names neither for any GPU (a
// cluster file's model preset) is matched by the minor number in the
// device's name, gpu-<minor>, taken as the GPU's index: NVIDIA's driver
// names devices so, and NVML's index is the minor on common boards but not
// on every one, which is why discovery by the agent (UUIDs) is the exact
// way. The caller holds mu (for topo).
func (s *Service) inventoryOf(node string) inventory {
	inv := inventory{node: node, device: map[int]structured.DeviceID{}, index: map[structured.DeviceID]int{}}
	objs, _ := s.slices.GetIndexer().ByIndex(indexSliceNode, node)
	for _, o := range objs {
		inv.slices = append(inv.slices, o.(*resourceapi.ResourceSlice))
	}
	slices.SortFunc(inv.slices, func(a, b *resourceapi.ResourceSlice) int { return strings.Compare(a.Name, b.Name) })
	topo := s.topo[node]
	if topo == nil {
		return inv
	}
	byUUID := map[string]int{}
	byBus := map[string]int{}
	byIndex := map[int]bool{}
	for _, g := range topo.gpus {
		byIndex[g.Index] = true
		if g.UUID != "" {
			byUUID[strings.ToLower(g.UUID)] = g.Index
		}
		if b, ok := normalBusID(g.BusID); ok {
			byBus[b] = g.Index
		}
	}
	for _, sl := range inv.slices {
		if sl.Spec.Driver != s.cfg.GPUDriver {
			continue
		}
		for _, d := range sl.Spec.Devices {
			if t, ok := attrString(d.Attributes, sl.Spec.Driver, attrType); ok && t != "gpu" {
				continue // a MIG slice or another kind of device
			}
			idx, ok := -1, false
			if u, has := attrString(d.Attributes, sl.Spec.Driver, attrUUID); has {
				idx, ok = byUUID[strings.ToLower(u)]
			}
			if !ok {
				for _, name := range []string{attrStdBusID, attrBusID} {
					if v, has := attrString(d.Attributes, sl.Spec.Driver, name); has {
						if b, good := normalBusID(v); good {
							if idx, ok = byBus[b]; ok {
								break
							}
						}
					}
				}
			}
			if !ok && len(byUUID) == 0 && len(byBus) == 0 {
				if n, err := strconv.Atoi(strings.TrimPrefix(d.Name, "gpu-")); err == nil && strings.HasPrefix(d.Name, "gpu-") && byIndex[n] {
					idx, ok = n, true
				}
			}
			if !ok {
				continue
			}
			id := structured.MakeDeviceID(sl.Spec.Driver, sl.Spec.Pool.Name, d.Name)
			if _, dup := inv.device[idx]; dup {
				continue // two devices claim one GPU: the first (by slice name) wins
			}
			inv.device[idx], inv.index[id] = id, idx
		}
	}
	for _, g := range topo.gpus {
		if _, ok := inv.device[g.Index]; !ok {
			inv.missing = append(inv.missing, g.Index)
		}
	}
	return inv
}

// attrString reads a string attribute by its name in the driver's domain
// or qualified.
func attrString(attrs map[resourceapi.QualifiedName]resourceapi.DeviceAttribute, driver, name string) (string, bool) {
	for _, k := range []string{name, driver + "/" + name} {
		if a, ok := attrs[resourceapi.QualifiedName(k)]; ok && a.StringValue != nil {
			return *a.StringValue, true
		}
	}
	return "", false
}

// normalBusID puts a PCI address in one form: nvidia-smi writes the domain
// with eight digits (00000000:18:00.0), the DRA driver with four. What is
// no PCI address (a bus beyond 8 bits, a device beyond 5, a function
// beyond 3) is refused, not matched.
func normalBusID(s string) (string, bool) {
	s = strings.ToLower(strings.TrimSpace(s))
	parts := strings.Split(s, ":")
	if len(parts) == 2 {
		parts = append([]string{"0"}, parts...)
	}
	if len(parts) != 3 {
		return "", false
	}
	dev, fn, ok := strings.Cut(parts[2], ".")
	if !ok {
		return "", false
	}
	var nums [4]uint64
	for i, p := range []string{parts[0], parts[1], dev, fn} {
		bits := []int{32, 8, 5, 3}[i]
		n, err := strconv.ParseUint(p, 16, bits)
		if err != nil {
			return "", false
		}
		nums[i] = n
	}
	return fmt.Sprintf("%04x:%02x:%02x.%x", nums[0], nums[1], nums[2], nums[3]), true
}

// nodeUnusable says why a node takes no toposched pods, "" when it does:
// gone, cordoned, not ready, or tainted with a taint toposched's pods do
// not tolerate (every taint but the dedicated one).
func (s *Service) nodeUnusable(node string) string {
	raw, ok, _ := s.nodes.GetIndexer().GetByKey(node)
	if !ok {
		return "no Kubernetes node of this name"
	}
	n := raw.(*corev1.Node)
	if n.Spec.Unschedulable {
		return "node " + node + " is cordoned"
	}
	ready := false
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			ready = c.Status == corev1.ConditionTrue
		}
	}
	if !ready {
		return "node " + node + " is not ready"
	}
	for _, t := range n.Spec.Taints {
		if t.Key == s.cfg.DedicatedTaint || t.Effect == corev1.TaintEffectPreferNoSchedule {
			continue
		}
		return "node " + node + " has taint " + t.Key + ":" + string(t.Effect)
	}
	return ""
}

// heldOn works out what of a node's GPUs toposched may not give out: all
// of them on an unusable node, those no device matches, and those
// allocated to claims that are not a live toposched job's (other
// schedulers' claims, and those of toposched's jobs that ended, until
// they are given back). The caller holds mu.
func (s *Service) heldOn(node string) []events.HeldGPU {
	topo := s.topo[node]
	if topo == nil {
		return nil
	}
	held := map[int]string{}
	if why := s.nodeUnusable(node); why != "" {
		for _, g := range topo.gpus {
			held[g.Index] = why
		}
	} else {
		inv := s.inventoryOf(node)
		for _, idx := range inv.missing {
			held[idx] = "no " + s.cfg.GPUDriver + " device in the node's ResourceSlices matches this GPU"
		}
		for _, sl := range inv.slices {
			objs, _ := s.claims.GetIndexer().ByIndex(indexPool, poolKey(sl.Spec.Driver, sl.Spec.Pool.Name))
			for _, o := range objs {
				c := o.(*resourceapi.ResourceClaim)
				if s.liveClaim(c) {
					continue
				}
				for _, r := range c.Status.Allocation.Devices.Results {
					if idx, ok := inv.index[structured.MakeDeviceID(r.Driver, r.Pool, r.Device)]; ok {
						held[idx] = "claim " + c.Namespace + "/" + c.Name
					}
				}
			}
		}
	}
	out := make([]events.HeldGPU, 0, len(held))
	for idx, by := range held {
		out = append(out, events.HeldGPU{Index: idx, By: by})
	}
	slices.SortFunc(out, func(a, b events.HeldGPU) int { return cmp.Compare(a.Index, b.Index) })
	return out
}

// liveClaim reports whether a claim's devices are a live toposched job's:
// placement counts them under the job, not as held.
func (s *Service) liveClaim(c *resourceapi.ResourceClaim) bool {
	j, ok := s.jobs[c.Annotations[AnnotationJobID]]
	return ok && j.decided != nil && !j.finished
}

// syncNode publishes a node's holds where they differ from what the
// topology stream last said.
func (s *Service) syncNode(ctx context.Context, node string) error {
	s.mu.Lock()
	if s.topo[node] == nil {
		s.mu.Unlock()
		return nil
	}
	held := s.heldOn(node)
	same := heldKey(held) == s.heldSeen[node]
	s.mu.Unlock()
	if same {
		return nil
	}
	if _, err := s.bus.Publish(ctx, &events.TopologyHeld{Node: node, GPUs: held, ObservedAt: time.Now().UTC()}); err != nil {
		return fmt.Errorf("publish held GPUs of %s: %w", node, err)
	}
	s.mu.Lock()
	s.heldSeen[node] = heldKey(held)
	s.mu.Unlock()
	return nil
}
