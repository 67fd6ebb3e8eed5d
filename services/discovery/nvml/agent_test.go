//go:build nvml && cgo

package nvml

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/events/bus"
	"github.com/toposched/toposched/events/eventstest"
)

// The agent reports a mock DGX A100 (every pair NV12 through NVSwitch),
// then publishes an XID 79 on GPU2 as a health change.
func TestAgentReportsNodeAndHealth(t *testing.T) {
	t.Parallel()
	srv := dgxa100.New()
	wire(srv, fabric{
		links: 12,
		link: func(i, l int) link {
			return link{up: true, remote: fmt.Sprintf("0000:%02x:00.0", 0xc4+l/2), typ: nvml.NVLINK_DEVICE_TYPE_SWITCH, typed: true, version: uint32(nvml.NVLINK_VERSION_3_0)}
		},
		ancestor: noAncestor(t),
		numa:     func(i int) int { return i / 4 },
		affinity: func(i int) []uint { return cpuMask(i / 4) },
	})
	var mu sync.Mutex
	script := []nvml.EventData{{Device: srv.Devices[2], EventType: nvml.EventTypeXidCriticalError, EventData: 79}}
	set := &mock.EventSet{}
	for _, d := range srv.Devices {
		dev := d.(*server.Device)
		dev.GetSupportedEventTypesFunc = func() (uint64, nvml.Return) { return nvml.EventTypeAll, nvml.SUCCESS }
		dev.RegisterEventsFunc = func(uint64, nvml.EventSet) nvml.Return { return nvml.SUCCESS }
	}
	srv.EventSetCreateFunc = func() (nvml.EventSet, nvml.Return) { return set, nvml.SUCCESS }
	srv.EventSetFreeFunc = func(nvml.EventSet) nvml.Return { return nvml.SUCCESS }
	srv.EventSetWaitFunc = func(nvml.EventSet, uint32) (nvml.EventData, nvml.Return) {
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

	ns := eventstest.Server(t)
	b := eventstest.Bus(t, ns.ClientURL(), "agent")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	agent, err := NewAgent(AgentConfig{
		Options:  Options{NodeName: "dgx-7", SysfsRoot: t.TempDir()},
		Position: 7, Labels: map[string]string{"rack": "r2"},
		Watcher: &Watcher{Poll: time.Hour, Wait: 10 * time.Millisecond},
	}, AgentDeps{Lib: srv, Publish: b, Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	go func() { done <- agent.Run(ctx) }()

	var node *events.TopologyNode
	var health *events.TopologyHealth
	deadline := time.Now().Add(20 * time.Second)
	for (node == nil || health == nil) && time.Now().Before(deadline) {
		err := b.Replay(context.Background(), events.DomainTopology, []string{b.Subjects.Domain(events.DomainTopology)}, func(r bus.Record) error {
			switch r.Name {
			case events.NameTopologyNode:
				node = new(events.TopologyNode)
				return bus.Decode(r.Name, r.Body, node)
			case events.NameTopologyHealth:
				health = new(events.TopologyHealth)
				return bus.Decode(r.Name, r.Body, health)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond) // polling the stream for the agent's output
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("agent.Run: %v", err)
	}
	if node == nil || health == nil {
		t.Fatalf("node %v, health %v", node, health)
	}
	if node.Name != "dgx-7" || node.Position != 7 || node.Labels["rack"] != "r2" || len(node.GPUs) != 8 ||
		node.GPUPaths[0][7] != "NV12" || node.NVSwitches != 6 || node.GPUs[0].Health != events.HealthHealthy {
		t.Fatalf("node report %+v", node)
	}
	if health.Node != "dgx-7" || health.ID != "2" || health.Health != events.HealthUnhealthy {
		t.Fatalf("health %+v", health)
	}
}
