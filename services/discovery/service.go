package discovery

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
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

// Validate reports every problem at once.
func (c Config) Validate() error {
	var errs []error
	if c.ClusterFile == "" {
		errs = append(errs, errors.New("discovery: cluster file: required"))
	}
	if c.Poll < 0 {
		errs = append(errs, fmt.Errorf("discovery: poll %s: must not be negative (0 disables it)", c.Poll))
	}
	return errors.Join(errs...)
}

// Deps are the ports the service uses.
type Deps struct {
	Publish bus.Publisher
	// Read reads the topology stream, to withdraw nodes no longer listed.
	Read     bus.Reader
	Subjects events.Subjects
	// Log is nil for slog.Default.
	Log *slog.Logger
}

func (d Deps) validate() error {
	var errs []error
	if d.Publish == nil {
		errs = append(errs, errors.New("discovery: deps: Publish is required"))
	}
	if d.Read == nil {
		errs = append(errs, errors.New("discovery: deps: Read is required"))
	}
	return errors.Join(errs...)
}

// Service publishes the cluster's topology.
type Service struct {
	cfg      Config
	pub      bus.Publisher
	read     bus.Reader
	subjects events.Subjects
	log      *slog.Logger
	ready    chan struct{}
}

// New returns the discovery service.
func New(cfg Config, deps Deps) (*Service, error) {
	if err := errors.Join(cfg.Validate(), deps.validate()); err != nil {
		return nil, err
	}
	log := deps.Log
	if log == nil {
		log = slog.Default()
	}
	return &Service{cfg: cfg, pub: deps.Publish, read: deps.Read, subjects: deps.Subjects,
		log: log.With("component", "discovery"), ready: make(chan struct{})}, nil
}

// Ready is closed once the cluster file has been published and JetStream
// has stored every node, so that a service started after it sees the
// whole cluster.
func (s *Service) Ready() <-chan struct{} { return s.ready }

// Run publishes the cluster file, then republishes it whenever it changes,
// until ctx ends. A file that cannot be read or parsed at the start is an
// error; a broken edit later keeps the last good topology in place.
func (s *Service) Run(ctx context.Context) error {
	mtime, err := s.publishFile(ctx)
	if err != nil {
		return err
	}
	close(s.ready)
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
	return st.ModTime(), s.publish(ctx, c, "cluster-file:"+hex.EncodeToString(sum[:8]))
}

// publish sends every node of c, withdraws nodes published before that are
// no longer in c, and sends the fabric. version identifies this description:
// event ids derive from it, so publishing one version twice is de-duplicated.
func (s *Service) publish(ctx context.Context, c clusterfile.Cluster, version string) error {
	ctx = bus.WithCause(ctx, events.Envelope{ID: version, CorrelationID: version})
	known := map[string]bool{}
	err := s.read.Replay(ctx, events.DomainTopology, []string{s.subjects.Of(events.NameTopologyNode)}, func(r bus.Record) error {
		var n events.TopologyNode
		if s.read.Decode(r.Name, r.Body, &n) == nil {
			known[n.Name] = !n.Removed
		}
		return nil
	})
	if err != nil {
		return err
	}
	for i := range c.Nodes {
		if _, err := s.pub.Publish(ctx, &c.Nodes[i]); err != nil {
			return err
		}
		delete(known, c.Nodes[i].Name)
	}
	for name, live := range known {
		if !live {
			continue
		}
		if _, err := s.pub.Publish(ctx, &events.TopologyNode{Name: name, GPUs: []events.GPU{}, Removed: true}); err != nil {
			return err
		}
		s.log.Info("node withdrawn: no longer in the cluster file", "node", name)
	}
	if len(c.Fabric.Switches) > 0 {
		if _, err := s.pub.Publish(ctx, &c.Fabric); err != nil {
			return err
		}
	}
	s.log.Info("topology published", "cluster", c.Name, "nodes", len(c.Nodes), "version", version)
	return nil
}
