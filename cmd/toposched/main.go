// Command toposched is the operator: the services that discover topology,
// analyse jobs, place them and tune them, all in one process on an embedded
// NATS server (serve), one service per process (discovery, analysis,
// placement, optimizer), or a self-contained demo.
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/events/bus"
	"github.com/toposched/toposched/internal/natsflags"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := newRoot().ExecuteContext(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "toposched:", err)
		os.Exit(1)
	}
}

// globals are the flags every command shares.
type globals struct {
	natsURL   string
	prefix    string
	logLevel  string
	logFormat string
	// conn is how to authenticate to NATS and secure the connection;
	// replicas how many copies of each stream to ask for (ops.go).
	conn     natsflags.Flags
	replicas int
}

func newRoot() *cobra.Command {
	g := &globals{}
	root := &cobra.Command{
		Use:   "toposched",
		Short: "Topology-aware placement operator for multi-GPU training",
		Long: `toposched places the ranks of multi-GPU training jobs so that heavy traffic
stays on fast links. Its services talk only through NATS JetStream events:

  jobs.submitted -> analysis -> jobs.analyzed -> placement -> placement.decided
  cluster file   -> discovery -> topology.node.<node>    -> placement

Run everything in one process with an embedded NATS server:

  toposched serve --cluster cluster.yaml

or see it work on a sample cluster:

  toposched demo`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	pf := root.PersistentFlags()
	pf.StringVar(&g.natsURL, "nats-url", envOr("TOPOSCHED_NATS_URL", ""),
		"NATS server URL(s), comma separated (env TOPOSCHED_NATS_URL); serve embeds a server when empty")
	pf.StringVar(&g.prefix, "prefix", envOr("TOPOSCHED_PREFIX", events.DefaultPrefix), "first token of every event subject")
	pf.StringVar(&g.logLevel, "log-level", "info", "log level: debug, info, warn, error")
	pf.StringVar(&g.logFormat, "log-format", "text", "log format: text or json")
	g.registerOps(pf)
	root.AddCommand(newServe(g), newDemo(g), newAgent(g), newRoles(g), newKube(g))
	root.AddCommand(newModel(g))
	root.AddCommand(newQuality(g))
	root.AddCommand(newReplay(g), newScale(g))
	root.AddCommand(newLoad(g))
	root.AddCommand(newSlurmConf(g), newSlurmSync(g))
	for _, s := range []struct{ name, short string }{
		{"discovery", "Run the discovery service alone: publish the cluster's topology"},
		{"analysis", "Run the analysis service alone: validate jobs and compute their rank groups"},
		{"placement", "Run the placement service alone: decide where jobs run"},
		{"optimizer", "Run the optimizer service alone: follow live placements"},
	} {
		root.AddCommand(newSingle(g, s.name, s.short))
	}
	return root
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

func (g *globals) logger() (*slog.Logger, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(g.logLevel)); err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	opts := &slog.HandlerOptions{Level: level}
	switch strings.ToLower(g.logFormat) {
	case "text":
		return slog.New(bus.LogHandler(slog.NewTextHandler(os.Stderr, opts))), nil
	case "json":
		return slog.New(bus.LogHandler(slog.NewJSONHandler(os.Stderr, opts))), nil
	}
	return nil, fmt.Errorf("--log-format %q: expected text or json", g.logFormat)
}

func (g *globals) busConfig(url, source string, log *slog.Logger) bus.Config {
	return bus.Config{URL: url, Prefix: g.prefix, Source: "urn:toposched:" + source, Logger: log,
		Replicas: g.replicas, NATSOptions: g.natsOptions()}
}
