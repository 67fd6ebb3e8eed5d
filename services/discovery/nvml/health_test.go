//go:build nvml && cgo

package nvml

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/internal/topology"
)

var t0 = time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)

// nodeOf discovers the mock's node for the watcher.
func nodeOf(t *testing.T, srv *server.Server) *topology.Node {
	t.Helper()
	n, err := Discover(srv, Options{NodeName: "n1", SysfsRoot: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// watch runs the watcher until stop is called or the test ends; events
// arrive on the channel.
func watch(t *testing.T, w *Watcher, srv *server.Server, n *topology.Node) (ch <-chan events.TopologyHealth, stop func()) {
	t.Helper()
	c := make(chan events.TopologyHealth, 16)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Watch(ctx, srv, n, func(h events.TopologyHealth) { c <- h }) }()
	stop = sync.OnceFunc(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Watch: %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Error("Watch did not return after its context ended")
		}
	})
	t.Cleanup(stop)
	return c, stop
}

func next(t *testing.T, ch <-chan events.TopologyHealth) events.TopologyHealth {
	t.Helper()
	select {
	case h := <-ch:
		return h
	case <-time.After(5 * time.Second):
		t.Fatal("no health event")
	}
	return events.TopologyHealth{}
}

// A scripted XID 13 (the application's fault) on GPU3, then XID 79 on
// GPU5: only GPU5 becomes unhealthy.
func TestWatchHealthXID(t *testing.T) {
	t.Parallel()
	srv := dgxa100.New()
	wire(srv, fabric{ancestor: func(i, j int) (nvml.GpuTopologyLevel, nvml.Return) { return nvml.TOPOLOGY_SYSTEM, nvml.SUCCESS }})
	n := nodeOf(t, srv)

	set := &mock.EventSet{}
	var mu sync.Mutex
	registered := map[int]uint64{}
	freed := false
	for i, d := range srv.Devices {
		dev := d.(*server.Device)
		dev.GetSupportedEventTypesFunc = func() (uint64, nvml.Return) { return nvml.EventTypeAll, nvml.SUCCESS }
		dev.RegisterEventsFunc = func(mask uint64, s nvml.EventSet) nvml.Return {
			mu.Lock()
			defer mu.Unlock()
			if s == set {
				registered[i] = mask
			}
			return nvml.SUCCESS
		}
	}
	srv.EventSetCreateFunc = func() (nvml.EventSet, nvml.Return) { return set, nvml.SUCCESS }
	srv.EventSetFreeFunc = func(s nvml.EventSet) nvml.Return {
		mu.Lock()
		defer mu.Unlock()
		freed = s == set
		return nvml.SUCCESS
	}
	script := []nvml.EventData{
		{Device: srv.Devices[3], EventType: nvml.EventTypeXidCriticalError, EventData: 13},
		{Device: srv.Devices[5], EventType: nvml.EventTypeXidCriticalError, EventData: 79},
	}
	srv.EventSetWaitFunc = func(s nvml.EventSet, ms uint32) (nvml.EventData, nvml.Return) {
		mu.Lock()
		defer mu.Unlock()
		if len(script) > 0 {
			e := script[0]
			script = script[1:]
			return e, nvml.SUCCESS
		}
		time.Sleep(time.Millisecond)
		return nvml.EventData{}, nvml.ERROR_TIMEOUT
	}

	w := &Watcher{Poll: time.Hour, Wait: 10 * time.Millisecond, Now: func() time.Time { return t0 }}
	ch, stop := watch(t, w, srv, n)
	got := next(t, ch)
	want := events.TopologyHealth{
		Node: "n1", Component: events.ComponentGPU, ID: "5", Health: events.HealthUnhealthy,
		Reason: "XID 79: GPU has fallen off the bus", ObservedAt: t0,
	}
	if got != want {
		t.Errorf("got %+v\nwant %+v", got, want)
	}
	select {
	case h := <-ch:
		t.Errorf("unexpected %+v", h)
	case <-time.After(50 * time.Millisecond):
	}
	stop()
	mu.Lock()
	defer mu.Unlock()
	if len(registered) != 8 || registered[0] != nvml.EventTypeXidCriticalError {
		t.Errorf("registered %v", registered)
	}
	if !freed {
		t.Error("event set not freed")
	}
}

// A link going down, coming back, and a GPU NVML loses; no event sets
// here (EventSetCreate is not supported), so the poll alone reports.
func TestWatchHealthNVLink(t *testing.T) {
	t.Parallel()
	srv := dgxa100.New()
	var mu sync.Mutex
	down := map[[2]int]bool{{2, 11}: true} // down from the start: never reported
	lost := map[int]bool{}
	wire(srv, fabric{
		links: 12,
		link: func(i, l int) link {
			mu.Lock()
			defer mu.Unlock()
			return link{up: !down[[2]int{i, l}], remote: fmt.Sprintf("0000:%02x:00.0", 0xc4+l/2), typ: nvml.NVLINK_DEVICE_TYPE_SWITCH, typed: true}
		},
		ancestor: func(i, j int) (nvml.GpuTopologyLevel, nvml.Return) { return nvml.TOPOLOGY_SYSTEM, nvml.SUCCESS },
	})
	n := nodeOf(t, srv)
	if n.GPUPaths[2][3].String() != "NV11" {
		t.Fatalf("GPU2-GPU3 %s, want NV11 (one of GPU2's links is down)", n.GPUPaths[2][3])
	}
	for i, d := range srv.Devices {
		dev := d.(*server.Device)
		state := dev.GetNvLinkStateFunc
		dev.GetNvLinkStateFunc = func(l int) (nvml.EnableState, nvml.Return) {
			mu.Lock()
			gone := lost[i]
			mu.Unlock()
			if gone {
				return 0, nvml.ERROR_GPU_IS_LOST
			}
			return state(l)
		}
	}
	started := make(chan struct{})
	srv.EventSetCreateFunc = func() (nvml.EventSet, nvml.Return) {
		close(started)
		return nil, nvml.ERROR_NOT_SUPPORTED
	}
	set := func(f func()) {
		mu.Lock()
		defer mu.Unlock()
		f()
	}

	w := &Watcher{Poll: 5 * time.Millisecond, Now: func() time.Time { return t0 }}
	ch, _ := watch(t, w, srv, n)
	<-started
	for _, step := range []struct {
		change func()
		want   events.TopologyHealth
	}{
		{func() { down[[2]int{2, 7}] = true }, events.TopologyHealth{Component: "nvlink", ID: "2/7", Health: "unhealthy", Reason: "NVLink down"}},
		{func() { delete(down, [2]int{2, 7}) }, events.TopologyHealth{Component: "nvlink", ID: "2/7", Health: "healthy", Reason: "NVLink up again"}},
		{func() { lost[6] = true }, events.TopologyHealth{Component: "gpu", ID: "6", Health: "unhealthy", Reason: "NVML: GPU is lost"}},
	} {
		set(step.change)
		step.want.Node, step.want.ObservedAt = "n1", t0
		if got := next(t, ch); got != step.want {
			t.Errorf("got %+v\nwant %+v", got, step.want)
		}
	}
	select {
	case h := <-ch:
		t.Errorf("unexpected %+v", h)
	case <-time.After(50 * time.Millisecond):
	}
}

// A GPU NVML cannot open when the watch starts is reported unhealthy.
func TestWatchHealthMissingGPU(t *testing.T) {
	t.Parallel()
	srv := dgxa100.New()
	wire(srv, fabric{ancestor: func(i, j int) (nvml.GpuTopologyLevel, nvml.Return) { return nvml.TOPOLOGY_SYSTEM, nvml.SUCCESS }})
	n := nodeOf(t, srv)
	n.GPUs[4].UUID = "GPU-gone"
	ch, _ := watch(t, &Watcher{Poll: time.Hour, Now: func() time.Time { return t0 }}, srv, n)
	got := next(t, ch)
	if got.Component != "gpu" || got.ID != "4" || got.Health != "unhealthy" {
		t.Errorf("got %+v", got)
	}
}
