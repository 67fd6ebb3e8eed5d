//go:build nvml && cgo

package nvml

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/internal/topology"
)

// CriticalXIDs are the XIDs that make a GPU unhealthy, with what they mean.
// They are the hardware faults of NVIDIA's XID catalogue
// (https://docs.nvidia.com/deploy/xid-errors/) whose resolution is a GPU
// reset or service, not an application restart. XIDs not listed, such as
// 13, 31, 43, 45, 68 and 109 (faults of the application, which NVIDIA's
// k8s-device-plugin also skips), leave the GPU healthy.
var CriticalXIDs = map[uint64]string{
	48: "double-bit ECC error",
	63: "ECC page retirement or row remapping recorded; reset to apply",
	64: "ECC page retirement or row remapping failed",
	74: "NVLink error",
	79: "GPU has fallen off the bus",
	92: "high single-bit ECC error rate",
	94: "contained ECC error",
	95: "uncontained ECC error",
}

// DefaultHealthPoll is how often a Watcher reads the NVLink states (NVML
// has no events for them).
const DefaultHealthPoll = 10 * time.Second

// Watcher watches a node's GPU and NVLink health. The zero value is ready
// to use with the defaults.
type Watcher struct {
	// Poll is how often NVLink states are read; 0 means DefaultHealthPoll.
	Poll time.Duration
	// Wait bounds one wait for NVML events, and so how soon Watch notices
	// ctx ending; 0 means 1 s.
	Wait time.Duration
	// XIDs are the critical XIDs; nil means CriticalXIDs.
	XIDs map[uint64]string
	// Now stamps the events; nil means time.Now.
	Now func() time.Time
}

// WatchHealth watches node's GPUs (as Discover found them) with the
// default Watcher until ctx ends. See Watcher.Watch.
func WatchHealth(ctx context.Context, lib nvml.Interface, node *topology.Node, fn func(events.TopologyHealth)) error {
	return (&Watcher{}).Watch(ctx, lib, node, fn)
}

// watched is one GPU under watch.
type watched struct {
	id    string // the GPU's index, as health events name it
	dev   nvml.Device
	uuid  string
	links []int        // links up at the start, in order
	up    map[int]bool // their state when last read
	lost  bool
}

// Watch reports changes of health of node's GPUs and NVLinks to fn until
// ctx ends; then it returns nil. It initialises lib and shuts it down on
// return; where the library is missing the error wraps
// ErrNVMLNotAvailable.
//
// A GPU becomes unhealthy on a critical XID (XIDs), when NVML says it is
// lost, or when NVML cannot open it at the start. A link that was up at
// the start and goes down makes component nvlink, id "<gpu>/<link>",
// unhealthy; coming back up, healthy. GPUs are named by their index and
// found by UUID where the node has it. Nothing is reported for parts that
// stay as they were at the start. fn is called from one goroutine at a
// time.
func (w *Watcher) Watch(ctx context.Context, lib nvml.Interface, node *topology.Node, fn func(events.TopologyHealth)) error {
	if fn == nil || node == nil {
		return errors.New("nvml: Watch needs a node and a function to report to")
	}
	if err := initLib(lib); err != nil {
		return err
	}
	defer release(lib.Shutdown)

	poll := w.Poll
	if poll <= 0 {
		poll = DefaultHealthPoll
	}
	xids := w.XIDs
	if xids == nil {
		xids = CriticalXIDs
	}
	now := w.Now
	if now == nil {
		now = time.Now
	}
	var mu sync.Mutex
	emit := func(component, id, health, reason string) {
		mu.Lock()
		defer mu.Unlock()
		fn(events.TopologyHealth{
			Node: node.Name, Component: component, ID: id,
			Health: health, Reason: reason, ObservedAt: now(),
		})
	}

	var gpus []*watched
	for _, g := range node.GPUs {
		wg := &watched{id: strconv.Itoa(g.Index), uuid: g.UUID, up: map[int]bool{}}
		var ret nvml.Return
		if g.UUID != "" {
			wg.dev, ret = call(func() (nvml.Device, nvml.Return) { return lib.DeviceGetHandleByUUID(g.UUID) })
		} else {
			wg.dev, ret = call(func() (nvml.Device, nvml.Return) { return lib.DeviceGetHandleByIndex(g.Index) })
		}
		if ret != nvml.SUCCESS {
			emit(events.ComponentGPU, wg.id, events.HealthUnhealthy, fmt.Sprintf("NVML cannot open the GPU: %v", ret))
			continue
		}
		for l := range nvml.NVLINK_MAX_LINKS {
			st, ret := call(func() (nvml.EnableState, nvml.Return) { return wg.dev.GetNvLinkState(l) })
			if unavailable(ret) {
				break
			}
			if ret == nvml.SUCCESS && st == nvml.FEATURE_ENABLED {
				wg.links = append(wg.links, l)
				wg.up[l] = true
			}
		}
		gpus = append(gpus, wg)
	}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var done sync.WaitGroup
	if set, ok := w.register(lib, gpus); ok {
		done.Go(func() { w.waitEvents(ctx, lib, set, gpus, xids, emit) })
		defer func() {
			cancel()
			done.Wait()
			release(func() nvml.Return { return lib.EventSetFree(set) })
		}()
	}

	tick := time.NewTicker(poll)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
			pollLinks(gpus, emit)
		}
	}
}

// register creates an event set and registers every GPU for critical XID
// events; ok is false when no GPU could be registered.
func (w *Watcher) register(lib nvml.Interface, gpus []*watched) (set nvml.EventSet, ok bool) {
	set, ret := call(lib.EventSetCreate)
	if ret != nvml.SUCCESS || set == nil {
		return nil, false
	}
	for _, g := range gpus {
		mask := uint64(nvml.EventTypeXidCriticalError)
		if sup, ret := call(g.dev.GetSupportedEventTypes); ret == nvml.SUCCESS {
			mask &= sup
		}
		if mask == 0 {
			continue
		}
		if call0(func() nvml.Return { return g.dev.RegisterEvents(mask, set) }) == nvml.SUCCESS {
			ok = true
		}
	}
	if !ok {
		release(func() nvml.Return { return lib.EventSetFree(set) })
		return nil, false
	}
	return set, true
}

// waitEvents reports critical XIDs until ctx ends.
func (w *Watcher) waitEvents(ctx context.Context, lib nvml.Interface, set nvml.EventSet, gpus []*watched, xids map[uint64]string, emit func(component, id, health, reason string)) {
	wait := w.Wait
	if wait <= 0 {
		wait = time.Second
	}
	ms := uint32(max(wait.Milliseconds(), 1))
	for ctx.Err() == nil {
		data, ret := call(func() (nvml.EventData, nvml.Return) { return lib.EventSetWait(set, ms) })
		switch {
		case ret == nvml.ERROR_TIMEOUT:
			continue
		case unavailable(ret):
			return
		case ret != nvml.SUCCESS:
			// ERROR_GPU_IS_LOST and the like: the poll reports the GPU;
			// back off so a failing wait does not spin.
			select {
			case <-ctx.Done():
			case <-time.After(wait):
			}
			continue
		}
		if data.EventType&nvml.EventTypeXidCriticalError == 0 {
			continue
		}
		reason, critical := xids[data.EventData]
		if !critical {
			continue
		}
		g := gpuOf(gpus, data.Device)
		if g == nil {
			continue
		}
		emit(events.ComponentGPU, g.id, events.HealthUnhealthy, fmt.Sprintf("XID %d: %s", data.EventData, reason))
	}
}

// gpuOf finds the watched GPU an event names, by handle or by UUID.
func gpuOf(gpus []*watched, dev nvml.Device) *watched {
	if dev == nil {
		return nil
	}
	for _, g := range gpus {
		if g.dev == dev {
			return g
		}
	}
	uuid, ret := call(dev.GetUUID)
	if ret != nvml.SUCCESS {
		return nil
	}
	for _, g := range gpus {
		if g.uuid != "" && g.uuid == uuid {
			return g
		}
	}
	return nil
}

// pollLinks reads the state of every link that was up at the start and
// reports the ones that changed; a GPU NVML has lost is reported once.
func pollLinks(gpus []*watched, emit func(component, id, health, reason string)) {
	for _, g := range gpus {
		if g.lost {
			continue
		}
		for _, l := range g.links {
			st, ret := call(func() (nvml.EnableState, nvml.Return) { return g.dev.GetNvLinkState(l) })
			if ret == nvml.ERROR_GPU_IS_LOST {
				g.lost = true
				emit(events.ComponentGPU, g.id, events.HealthUnhealthy, "NVML: GPU is lost")
				break
			}
			if ret != nvml.SUCCESS {
				continue
			}
			up := st == nvml.FEATURE_ENABLED
			if up == g.up[l] {
				continue
			}
			g.up[l] = up
			id := g.id + "/" + strconv.Itoa(l)
			if up {
				emit(events.ComponentNVLink, id, events.HealthHealthy, "NVLink up again")
			} else {
				emit(events.ComponentNVLink, id, events.HealthUnhealthy, "NVLink down")
			}
		}
	}
}
