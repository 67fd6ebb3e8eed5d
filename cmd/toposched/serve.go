package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"github.com/toposched/toposched/events/bus"
	"github.com/toposched/toposched/events/natsserver"
	"github.com/toposched/toposched/services/operator"
	"github.com/toposched/toposched/services/placement"
)

type serveFlags struct {
	cluster  string
	listen   string
	dataDir  string
	services []string
	poll     time.Duration
	strategy string
	reserve  time.Duration
	policies string
	ops      opsFlags
}

func newServe(g *globals) *cobra.Command {
	f := &serveFlags{}
	cmd := &cobra.Command{
		Use:   "serve --cluster FILE [--listen HOST:PORT --data-dir DIR | --nats-url URL]",
		Short: "Run every service in one process, on an embedded NATS server unless --nats-url is given",
		Long: `serve runs discovery, analysis, placement and optimizer in one process.

Without --nats-url it starts an embedded NATS server with JetStream listening on
--listen (loopback by default) and keeping its streams in --data-dir, so a
restart with the same data dir keeps every pending job and allocation.
Launchers and topoctl connect to that address.

With --nats-url it connects to an existing NATS deployment instead.

Placement runs the shipped Rego policy set, or the one in --policies DIR
(reloaded when its files change), or none with --policies none. A set pushed
with topoctl policy push overrides it while it is the newer of the two.

SIGTERM or Ctrl-C stops it gracefully: handlers in flight finish, nothing
that was not handled is acknowledged, and the server flushes its streams.`,
		Example: `  toposched serve --cluster deploy/examples/cluster.yaml
  toposched serve --cluster cluster.yaml --listen 0.0.0.0:4222 --data-dir /var/lib/toposched
  toposched serve --cluster cluster.yaml --nats-url nats://nats-0:4222,nats://nats-1:4222
  toposched serve --cluster cluster.yaml --policies /etc/toposched/policies`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runServe(cmd.Context(), g, f)
		},
	}
	cmd.Flags().StringVar(&f.cluster, "cluster", "", "cluster file (YAML or JSON) that discovery publishes")
	cmd.Flags().StringVar(&f.listen, "listen", "127.0.0.1:4222", "embedded NATS listen address")
	cmd.Flags().StringVar(&f.dataDir, "data-dir", "toposched-data", "embedded NATS JetStream storage directory")
	cmd.Flags().StringSliceVar(&f.services, "services", operator.All, "services to run")
	cmd.Flags().DurationVar(&f.poll, "poll", 5*time.Second, "how often discovery checks the cluster file for changes (0: never)")
	cmd.Flags().StringVar(&f.strategy, "strategy", "topology-aware", "placement strategy: topology-aware or blind (the first-fit baseline)")
	cmd.Flags().DurationVar(&f.reserve, "reserve-after", placement.DefaultReserveAfter, "how long the head of the queue waits before nodes are held for it so small jobs cannot starve it (0: at once; negative: never)")
	cmd.Flags().StringVar(&f.policies, "policies", "", policiesUsage)
	f.ops.register(cmd.Flags(), true)
	return cmd
}

const policiesUsage = "Rego policy set directory, reloaded when its files change; 'none' turns policies off; " +
	"empty: the shipped set. A newer set pushed with topoctl policy push overrides it"

func runServe(ctx context.Context, g *globals, f *serveFlags) error {
	log, err := g.logger()
	if err != nil {
		return err
	}
	url := g.natsURL
	sole := false
	if url == "" {
		// Replicas share a NATS cluster (--nats-url); the embedded server
		// serves this process's services alone.
		sole = true
		srv, err := startEmbedded(f.listen, f.dataDir, log)
		if err != nil {
			return err
		}
		defer srv.Shutdown()
		url = srv.ClientURL()
		log.Info("embedded NATS ready", "url", url, "data_dir", f.dataDir)
	}
	return runServices(ctx, g, url, "operator", operator.Config{
		Services: f.services, ClusterFile: f.cluster, Poll: f.poll, Strategy: f.strategy, Policies: f.policies, ReserveAfter: &f.reserve,
		Replica: f.ops.replica, LeaseTTL: f.ops.leaseTTL, Sole: sole,
	}, &f.ops, log)
}

func startEmbedded(listen, dataDir string, log *slog.Logger) (*natsserver.Server, error) {
	host, portText, err := net.SplitHostPort(listen)
	if err != nil {
		return nil, fmt.Errorf("--listen %q: %w", listen, err)
	}
	port, err := strconv.Atoi(portText)
	if err != nil {
		return nil, fmt.Errorf("--listen %q: port: %w", listen, err)
	}
	cfg := natsserver.DefaultConfig()
	cfg.Host, cfg.Port, cfg.StoreDir = host, port, dataDir
	cfg.Logger = log
	return natsserver.Start(cfg)
}

// runServices connects to NATS, runs the services until ctx ends, then
// stops them gracefully and drains the connection.
func runServices(ctx context.Context, g *globals, url, source string, cfg operator.Config, ops *opsFlags, log *slog.Logger) error {
	mr := newMetricsRun(ops)
	bcfg := g.busConfig(url, source, log)
	mr.observe(&bcfg, &cfg)
	b, err := bus.Connect(ctx, bcfg)
	if err != nil {
		return err
	}
	op, err := operator.Start(ctx, b, cfg, log)
	if err != nil {
		_ = b.Close()
		return err
	}
	if err := mr.serve(ops, b, op, g); err != nil {
		_ = op.Stop()
		_ = b.Close()
		return err
	}
	defer func() {
		if err := mr.close(); err != nil {
			log.Warn("metrics endpoint", "err", err)
		}
	}()
	select {
	case <-ctx.Done():
		log.Info("shutting down")
	case <-op.Done():
	}
	err = op.Stop()
	if cerr := b.Close(); cerr != nil {
		err = errors.Join(err, cerr)
	}
	if err == nil {
		log.Info("stopped")
	}
	return err
}

func newSingle(g *globals, name, short string) *cobra.Command {
	var cluster, strategy, policySet string
	var reserve time.Duration
	var poll time.Duration
	var ops opsFlags
	cmd := &cobra.Command{
		Use:   name,
		Short: short,
		Long: short + `.

It connects to the NATS deployment at --nats-url (default nats://127.0.0.1:4222,
or TOPOSCHED_NATS_URL). Several replicas of a service share its durable
consumers: each event is handled by one of them.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, err := g.logger()
			if err != nil {
				return err
			}
			url := g.natsURL
			if url == "" {
				url = "nats://127.0.0.1:4222"
			}
			return runServices(cmd.Context(), g, url, name,
				operator.Config{Services: []string{name}, ClusterFile: cluster, Poll: poll, Strategy: strategy, Policies: policySet, ReserveAfter: &reserve,
					Replica: ops.replica, LeaseTTL: ops.leaseTTL}, &ops, log.With("service", name))
		},
	}
	if name == operator.Discovery {
		cmd.Flags().StringVar(&cluster, "cluster", "", "cluster file (YAML or JSON) to publish")
		cmd.Flags().DurationVar(&poll, "poll", 5*time.Second, "how often to check the cluster file for changes (0: never)")
		_ = cmd.MarkFlagRequired("cluster")
	}
	if name == operator.Placement {
		cmd.Flags().StringVar(&strategy, "strategy", "topology-aware", "placement strategy: topology-aware or blind (the first-fit baseline)")
		cmd.Flags().DurationVar(&reserve, "reserve-after", placement.DefaultReserveAfter, "how long the head of the queue waits before nodes are held for it (0: at once; negative: never)")
		cmd.Flags().StringVar(&policySet, "policies", "", policiesUsage)
	}
	ops.register(cmd.Flags(), name == operator.Placement)
	return cmd
}
