//go:build cgo

package nvml

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"reflect"
	"strconv"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/events/bus"
	"github.com/toposched/toposched/internal/topology"
)

// AgentConfig says how a node agent reports its node.
type AgentConfig struct {
	Options
	// Position is the node's place in enumeration order; agents of one
	// cluster should be given distinct positions (the blind baseline fills
	// nodes in this order).
	Position int
	Labels   map[string]string
	// Rediscover is how often the node is discovered again and, if it
	// changed, reported again; 0 means 5 minutes.
	Rediscover time.Duration
	// Watcher watches health; nil means the defaults.
	Watcher *Watcher
}

// RunAgent is the node agent: it discovers this node through NVML,
// publishes it on topology.node.<node>, publishes every health change on
// topology.health.<node>, and reports the node again when a rediscovery
// finds it changed, until ctx ends. Reports carry the GPUs the agent has
// seen fail, so a later report does not undo a health event.
func RunAgent(ctx context.Context, lib nvml.Interface, b *bus.Bus, cfg AgentConfig, log *slog.Logger) error {
	if cfg.Rediscover <= 0 {
		cfg.Rediscover = 5 * time.Minute
	}
	if cfg.Watcher == nil {
		cfg.Watcher = &Watcher{}
	}
	n, err := Discover(lib, cfg.Options)
	if err != nil {
		return err
	}
	log = log.With("component", "agent", "node", n.Name)
	a := &agent{b: b, cfg: cfg, log: log, unhealthy: map[int]string{}}
	if err := a.report(ctx, n); err != nil {
		return err
	}
	log.Info("node reported", "gpus", len(n.GPUs), "nics", len(n.NICs), "nvswitches", n.NVSwitches, "warnings", len(n.Warnings))

	watchErr := make(chan error, 1)
	go func() {
		watchErr <- cfg.Watcher.Watch(ctx, lib, n, func(h events.TopologyHealth) {
			a.health(ctx, h)
		})
	}()
	tick := time.NewTicker(cfg.Rediscover)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return <-watchErr
		case err := <-watchErr:
			return fmt.Errorf("health watch: %w", err)
		case <-tick.C:
			m, err := Discover(lib, cfg.Options)
			if err != nil {
				log.Error("rediscovery failed; keeping the last report", "err", err)
				continue
			}
			if !reflect.DeepEqual(m, n) {
				if err := a.report(ctx, m); err != nil {
					log.Error("report", "err", err)
					continue
				}
				n = m
				log.Info("node changed; reported again")
			}
		}
	}
}

type agent struct {
	b   *bus.Bus
	cfg AgentConfig
	log *slog.Logger

	mu        sync.Mutex
	unhealthy map[int]string // GPU index -> reason
}

// report publishes the node with the GPUs seen failing marked unhealthy.
// Its event id is derived from its content: the same report twice is one.
func (a *agent) report(ctx context.Context, n *topology.Node) error {
	a.mu.Lock()
	unhealthy := maps.Clone(a.unhealthy)
	a.mu.Unlock()
	ev := n.Event()
	ev.Position, ev.Labels = a.cfg.Position, a.cfg.Labels
	if len(n.GPUs) > 0 {
		ev.GPUModel = n.GPUs[0].Model
	}
	for i := range ev.GPUs {
		ev.GPUs[i].Health = events.HealthHealthy
		if _, bad := unhealthy[ev.GPUs[i].Index]; bad {
			ev.GPUs[i].Health = events.HealthUnhealthy
		}
	}
	body, err := json.Marshal(ev)
	if err != nil {
		return fmt.Errorf("encode node report: %w", err)
	}
	sum := sha256.Sum256(body)
	version := "nvml:" + ev.Name + ":" + hex.EncodeToString(sum[:8])
	ctx = bus.WithCause(ctx, events.Envelope{ID: version, CorrelationID: version})
	_, err = a.b.Publish(ctx, &ev)
	return err
}

// health publishes one health change and remembers GPU failures.
func (a *agent) health(ctx context.Context, h events.TopologyHealth) {
	if h.Component == events.ComponentGPU {
		if i, err := strconv.Atoi(h.ID); err == nil {
			a.mu.Lock()
			if h.Health == events.HealthUnhealthy {
				a.unhealthy[i] = h.Reason
			} else {
				delete(a.unhealthy, i)
			}
			a.mu.Unlock()
		}
	}
	if _, err := a.b.Publish(ctx, &h); err != nil {
		a.log.Error("publish health", "component", h.Component, "id", h.ID, "err", err)
		return
	}
	a.log.Info("health changed", "component", h.Component, "id", h.ID, "health", h.Health, "reason", h.Reason)
}
