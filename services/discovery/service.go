package discovery

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/events/bus"
	"github.com/toposched/toposched/internal/formats/clusterfile"
)

// Config says what discovery reads.
type Config struct {
	// ClusterFile is the YAML or JSON cluster description.
	ClusterFile string
	// Poll is how often the file is checked for changes; 0 disables it.
	Poll time.Duration
}

// Service publishes the cluster's topology.
type Service struct {
	cfg   Config
	bus   *bus.Bus
	log   *slog.Logger
	mtime time.Time // of the cluster file last published
}

// New returns the discovery service.
func New(cfg Config, b *bus.Bus, log *slog.Logger) *Service {
	if b == nil {
		panic("discovery: nil bus")
	}
	if log == nil {
		log = slog.Default()
	}
	return &Service{cfg: cfg, bus: b, log: log.With("component", "discovery")}
}

// Init publishes the cluster file once and returns when JetStream has
// stored every node, so that a service started after it sees the whole
// cluster.
func (s *Service) Init(ctx context.Context) error {
	mtime, err := s.publishFile(ctx)
	if err != nil {
		return err
	}
	s.mtime = mtime
	return nil
}

// Run publishes the cluster file unless Init did, then republishes it
// whenever it changes, until ctx ends.
func (s *Service) Run(ctx context.Context) error {
	if s.mtime.IsZero() {
		if err := s.Init(ctx); err != nil {
			return err
		}
	}
	mtime := s.mtime
	if s.cfg.Poll <= 0 {
		<-ctx.Done()
		return nil
	}
	tick := time.NewTicker(s.cfg.Poll)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
			st, err := os.Stat(s.cfg.ClusterFile)
			if err != nil || st.ModTime().Equal(mtime) {
				continue
			}
			if m, err := s.publishFile(ctx); err != nil {
				// A broken edit keeps the last good topology in place.
				s.log.Error("cluster file refused; keeping the last one", "err", err)
				mtime = st.ModTime()
			} else {
				mtime = m
			}
		}
	}
}

func (s *Service) publishFile(ctx context.Context) (time.Time, error) {
	st, err := os.Stat(s.cfg.ClusterFile)
	if err != nil {
		return time.Time{}, fmt.Errorf("cluster file: %w", err)
	}
	data, err := os.ReadFile(s.cfg.ClusterFile)
	if err != nil {
		return time.Time{}, fmt.Errorf("cluster file: %w", err)
	}
	c, err := clusterfile.ParseCluster(s.cfg.ClusterFile, data)
	if err != nil {
		return time.Time{}, err
	}
	sum := sha256.Sum256(data)
	return st.ModTime(), s.Publish(ctx, c, "cluster-file:"+hex.EncodeToString(sum[:8]))
}

// Publish sends every node of c, withdraws nodes published before that are
// no longer in c, and sends the fabric. version identifies this description:
// event ids derive from it, so publishing one version twice is de-duplicated.
func (s *Service) Publish(ctx context.Context, c clusterfile.Cluster, version string) error {
	ctx = bus.WithCause(ctx, events.Envelope{ID: version, CorrelationID: version})
	known := map[string]bool{}
	err := s.bus.Replay(ctx, "topology", []string{s.bus.Subjects.Of(events.NameTopologyNode)}, func(r bus.Record) error {
		var n events.TopologyNode
		if bus.Decode(r.Name, r.Body, &n) == nil {
			known[n.Name] = !n.Removed
		}
		return nil
	})
	if err != nil {
		return err
	}
	for i := range c.Nodes {
		if _, err := s.bus.Publish(ctx, &c.Nodes[i]); err != nil {
			return err
		}
		delete(known, c.Nodes[i].Name)
	}
	for name, live := range known {
		if !live {
			continue
		}
		if _, err := s.bus.Publish(ctx, &events.TopologyNode{Name: name, GPUs: []events.GPU{}, Removed: true}); err != nil {
			return err
		}
		s.log.Info("node withdrawn: no longer in the cluster file", "node", name)
	}
	if len(c.Fabric.Switches) > 0 {
		if _, err := s.bus.Publish(ctx, &c.Fabric); err != nil {
			return err
		}
	}
	s.log.Info("topology published", "cluster", c.Name, "nodes", len(c.Nodes), "version", version)
	return nil
}
