//go:build nvml && cgo

package nvml

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
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

// DefaultRediscover is how often an agent discovers its node again.
const DefaultRediscover = 5 * time.Minute

// AgentConfig says how a node agent reports its node.
type AgentConfig struct {
	Options
	// Position is the node's place in enumeration order; agents of one
	// cluster should be given distinct positions (the blind baseline fills
	// nodes in this order).
	Position int
	Labels   map[string]string
	// Rediscover is how often the node is discovered again and, if it
	// changed, reported again; 0 means DefaultRediscover.
	Rediscover time.Duration
	// Watcher watches health; nil means the defaults.
	Watcher *Watcher
}

// Validate reports every problem at once.
func (c AgentConfig) Validate() error {
	if c.Rediscover < 0 {
		return fmt.Errorf("agent: rediscover %s: must not be negative (0 is the default, %s)", c.Rediscover, DefaultRediscover)
	}
	return nil
}

// AgentDeps are what an agent uses: the NVML library (the real one, or
// go-nvml's mock in tests) and the port it publishes on.
type AgentDeps struct {
	Lib     nvml.Interface
	Publish bus.Publisher
	// Log is nil for slog.Default.
	Log *slog.Logger
}

// Agent is the node agent: it discovers this node through NVML, publishes
// it on topology.node.<node>, publishes every health change on
// topology.health.<node>, and reports the node again when a rediscovery
// finds it changed. Reports carry the GPUs the agent has seen fail, so a
// later report does not undo a health event.
type Agent struct {
	cfg   AgentConfig
	lib   nvml.Interface
	pub   bus.Publisher
	log   *slog.Logger
	ready chan struct{}

	mu        sync.Mutex
	unhealthy map[int]string // GPU index -> reason
}

// NewAgent returns the node agent.
func NewAgent(cfg AgentConfig, deps AgentDeps) (*Agent, error) {
	var errs []error
	errs = append(errs, cfg.Validate())
	if deps.Lib == nil {
		errs = append(errs, errors.New("agent: deps: Lib is required"))
	}
	if deps.Publish == nil {
		errs = append(errs, errors.New("agent: deps: Publish is required"))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if cfg.Rediscover == 0 {
		cfg.Rediscover = DefaultRediscover
	}
	if cfg.Watcher == nil {
		cfg.Watcher = &Watcher{}
	}
	log := deps.Log
	if log == nil {
		log = slog.Default()
	}
	return &Agent{cfg: cfg, lib: deps.Lib, pub: deps.Publish, log: log, ready: make(chan struct{}), unhealthy: map[int]string{}}, nil
}

// Ready is closed once the node's first report is stored.
func (a *Agent) Ready() <-chan struct{} { return a.ready }

// Run reports the node, then watches its health and rediscovers it until
// ctx ends.
func (a *Agent) Run(ctx context.Context) error {
	cfg, lib := a.cfg, a.lib
	n, err := Discover(lib, cfg.Options)
	if err != nil {
		return err
	}
	log := a.log.With("component", "agent", "node", n.Name)
	a.log = log
	if err := a.report(ctx, n); err != nil {
		return err
	}
	close(a.ready)
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

// report publishes the node with the GPUs seen failing marked unhealthy.
// Its event id is derived from its content: the same report twice is one.
func (a *Agent) report(ctx context.Context, n *topology.Node) error {
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
	_, err = a.pub.Publish(ctx, &ev)
	return err
}

// health publishes one health change and remembers GPU failures.
func (a *Agent) health(ctx context.Context, h events.TopologyHealth) {
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
	if _, err := a.pub.Publish(ctx, &h); err != nil {
		a.log.Error("publish health", "component", h.Component, "id", h.ID, "err", err)
		return
	}
	a.log.Info("health changed", "component", h.Component, "id", h.ID, "health", h.Health, "reason", h.Reason)
}
