package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/toposched/toposched/events/bus"
	"github.com/toposched/toposched/events/natsserver"
	"github.com/toposched/toposched/internal/calibration"
	"github.com/toposched/toposched/internal/collective"
	"github.com/toposched/toposched/internal/placer"
	"github.com/toposched/toposched/services/launcher"
	"github.com/toposched/toposched/services/operator"
	"github.com/toposched/toposched/services/placement"
)

type serveFlags struct {
	cluster    string
	listen     string
	dataDir    string
	natsConfig string
	services   []string
	poll       time.Duration
	strategy   string
	reserve    time.Duration
	maxStretch float64
	policies   string
	ops        opsFlags
}

func newServe(g *globals) *cobra.Command {
	f := &serveFlags{}
	cmd := &cobra.Command{
		Use:   "serve --cluster FILE [--listen HOST:PORT --data-dir DIR | --nats-url URL]",
		Short: "Run every service in one process, on an embedded NATS server unless --nats-url is given",
		Long: `serve runs discovery, analysis, placement and optimizer in one process.

Without --nats-url it starts an embedded NATS server with JetStream listening on
--listen (127.0.0.1:4222: this host only) and keeping its streams in --data-dir,
so a restart with the same data dir keeps every pending job and allocation.
Launchers and topoctl connect to that address. The data dir must be writable
(serve fails at once, naming it, if not), and JetStream's storage is capped
by the free space of its filesystem.

An address other than loopback (such as 0.0.0.0:4222, every interface) needs
authentication, one of:
  - generated credentials: on first start serve writes an nkey seed per role
    into DATA_DIR/credentials (mode 0600; the path is logged, the secret is
    not): operator.nk (the services in this process use it), launcher.nk
    (topoctl --nats-nkey FILE: submit, finish, accept, watch, read) and
    agent.nk (toposched agent --nats-nkey FILE: topology and health);
  - --nats-config FILE: a nats-server configuration with its users (such as
    deploy/nats/standalone.conf); the services then connect with --nats-user,
    --nats-creds or --nats-nkey. --listen and --data-dir override its listen
    and store_dir.
With neither it refuses to start.

With --nats-url it connects to an existing NATS deployment instead.

Placement runs the shipped Rego policy set, or the one in --policies DIR
(reloaded when its files change), or none with --policies none. A set pushed
with topoctl policy push overrides it while it is the newer of the two.

SIGTERM or Ctrl-C stops it gracefully: handlers in flight finish, nothing
that was not handled is acknowledged, and the server flushes its streams.`,
		Example: `  toposched serve --cluster deploy/examples/cluster.yaml
  # every interface, authenticated with the credentials generated in /var/lib/toposched/credentials:
  toposched serve --cluster cluster.yaml --listen 0.0.0.0:4222 --data-dir /var/lib/toposched
  # every interface, authenticated by the users of a NATS config:
  toposched serve --cluster cluster.yaml --listen 0.0.0.0:4222 --nats-config nats.conf --nats-user operator
  toposched serve --cluster cluster.yaml --nats-url nats://nats-0:4222,nats://nats-1:4222
  toposched serve --cluster cluster.yaml --policies /etc/toposched/policies`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runServe(cmd.Context(), g, f)
		},
	}
	cmd.Flags().StringVar(&f.cluster, "cluster", "", "cluster file (YAML or JSON) that discovery publishes")
	cmd.Flags().StringVar(&f.listen, "listen", defaultListen,
		"embedded NATS listen address; one beyond loopback needs authentication (generated credentials in --data-dir, or --nats-config)")
	cmd.Flags().StringVar(&f.dataDir, "data-dir", "toposched-data", "embedded NATS JetStream storage directory (and its generated credentials)")
	cmd.Flags().StringVar(&f.natsConfig, "nats-config", "",
		"nats-server configuration file for the embedded server (users, accounts, TLS, limits); the services connect with --nats-user, --nats-creds or --nats-nkey")
	cmd.Flags().StringSliceVar(&f.services, "services", operator.All, "services to run")
	cmd.Flags().DurationVar(&f.poll, "poll", 5*time.Second, "how often discovery checks the cluster file for changes (0: never)")
	cmd.Flags().StringVar(&f.strategy, "strategy", "topology-aware", "placement strategy: topology-aware or blind (the first-fit baseline)")
	cmd.Flags().DurationVar(&f.reserve, "reserve-after", placement.DefaultReserveAfter, "how long the head of the queue waits before nodes are held for it so small jobs cannot starve it (0: at once; negative: never)")
	maxStretchFlag(cmd.Flags(), &f.maxStretch)
	cmd.Flags().StringVar(&f.policies, "policies", "", policiesUsage)
	f.ops.register(cmd.Flags(), true)
	return cmd
}

const policiesUsage = "Rego policy set directory, reloaded when its files change; 'none' turns policies off; " +
	"empty: the shipped set. A newer set pushed with topoctl policy push overrides it"

// defaultListen is the embedded server's address: this host only.
const defaultListen = "127.0.0.1:4222"

// credentialsDir is where serve keeps the credentials it generates, inside
// the data dir.
const credentialsDir = "credentials"

func runServe(ctx context.Context, g *globals, f *serveFlags) error {
	log, err := g.logger()
	if err != nil {
		return err
	}
	conn := natsConn{url: g.natsURL}
	sole := false
	if conn.url == "" {
		// Replicas share a NATS cluster (--nats-url); the embedded server
		// serves this process's services alone.
		sole = true
		emb, err := startEmbedded(embeddedFlags{listen: f.listen, dataDir: f.dataDir, config: f.natsConfig, prefix: g.prefix}, log)
		if err != nil {
			return err
		}
		defer emb.srv.Shutdown()
		conn = emb
		log.Info("embedded NATS ready", "url", conn.url, "data_dir", f.dataDir, "auth", emb.srv.RequiresAuth())
	} else if f.natsConfig != "" {
		return errors.New("--nats-config configures the embedded server: not with --nats-url")
	}
	return runServices(ctx, g, conn, "operator", operator.Config{
		Services: f.services, ClusterFile: f.cluster, Poll: f.poll, Strategy: f.strategy, Policies: f.policies, ReserveAfter: &f.reserve,
		MaxStretch: maxStretch(f.maxStretch), Replica: f.ops.replica, LeaseTTL: f.ops.leaseTTL, Sole: sole,
	}, &f.ops, log)
}

// natsConn is where the services connect, and as whom.
type natsConn struct {
	url string
	// opts sign in; nil takes the --nats-* flags.
	opts []nats.Option
	// srv is the embedded server, nil with --nats-url.
	srv *natsserver.Server
}

// embeddedFlags are serve's settings of its embedded server.
type embeddedFlags struct {
	listen, dataDir, config, prefix string
}

// startEmbedded starts serve's embedded server. On loopback it needs no
// authentication; beyond loopback it takes the users of --nats-config, or
// else generates credentials in the data dir and signs the services in as
// their operator.
func startEmbedded(f embeddedFlags, log *slog.Logger) (natsConn, error) {
	host, portText, err := net.SplitHostPort(f.listen)
	if err != nil {
		return natsConn{}, fmt.Errorf("--listen %q: %w", f.listen, err)
	}
	port, err := strconv.Atoi(portText)
	if err != nil {
		return natsConn{}, fmt.Errorf("--listen %q: port: %w", f.listen, err)
	}
	if host == "" {
		host = "127.0.0.1" // ":4222" is this host only, as the server has it
	}
	cfg := natsserver.DefaultConfig()
	cfg.Host, cfg.Port, cfg.StoreDir, cfg.ConfigFile = host, port, f.dataDir, f.config
	cfg.Logger = log
	var conn natsConn
	if f.config == "" && !natsserver.IsLoopback(host) {
		// The credentials live in the data dir: check it first, so that
		// an unwritable one is named as such.
		if err := natsserver.CheckStoreDir(f.dataDir); err != nil {
			return natsConn{}, fmt.Errorf("embedded nats: %w", err)
		}
		creds, err := natsserver.EnsureCredentials(filepath.Join(f.dataDir, credentialsDir), generatedRoles(f.prefix))
		if err != nil {
			return natsConn{}, fmt.Errorf("--listen %s beyond loopback needs credentials: %w", f.listen, err)
		}
		opt, err := creds.Option(roleOperator)
		if err != nil {
			return natsConn{}, err
		}
		cfg.Credentials, conn.opts = creds, []nats.Option{opt}
		log.Info("embedded NATS requires credentials (nkey seed files, mode 0600)",
			"listen", f.listen, "dir", creds.Dir, "generated", creds.Created(),
			"operator", creds.File(roleOperator), "launcher", creds.File(roleLauncher), "agent", creds.File(roleAgent))
	}
	srv, err := natsserver.Start(cfg)
	if err != nil {
		if f.config != "" {
			return natsConn{}, fmt.Errorf("--nats-config %s: %w", f.config, err)
		}
		return natsConn{}, err // it names the address or the data dir
	}
	conn.url, conn.srv = srv.ClientURL(), srv
	return conn, nil
}

// runServices connects to NATS, runs the services until ctx ends, then
// stops them gracefully and drains the connection.
func runServices(ctx context.Context, g *globals, conn natsConn, source string, cfg operator.Config, ops *opsFlags, log *slog.Logger) error {
	if ops.calibration != "" {
		data, err := os.ReadFile(ops.calibration)
		if err != nil {
			return fmt.Errorf("--calibration: %w", err)
		}
		cal, err := collective.ParseCalibration(ops.calibration, data)
		if err != nil {
			return fmt.Errorf("--calibration: %w", err)
		}
		cfg.Calibration, cfg.CalibrationRevision = cal, calibration.Revision(data)
		log.Info("base calibration read", "file", ops.calibration, "name", cal.Name, "efficiency", cal.Efficiency)
	}
	cfg.OnlineCalibration = ops.online
	mr := newMetricsRun(ops)
	bcfg := g.busConfig(conn.url, source, log)
	if conn.opts != nil {
		bcfg.NATSOptions = conn.opts
	}
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
	if err := mr.serve(ops, b, op, cfg.Services, conn.srv, g); err != nil {
		_ = op.Stop()
		_ = b.Close()
		return err
	}
	defer func() {
		if err := mr.close(); err != nil {
			log.Warn("metrics endpoint", "err", err)
		}
	}()
	wdDone := make(chan error, 1)
	wdCtx, wdStop := context.WithCancel(ctx)
	defer wdStop()
	// A stream deleted under the running services is created again (the
	// bus creates a durable's stream itself; this covers the others).
	go b.KeepStreams(wdCtx)
	if ops.agentTTL > 0 && slices.Contains(cfg.Services, operator.Placement) {
		wd, err := launcher.NewWatchdog(b, ops.agentTTL, log)
		if err != nil {
			_ = op.Stop()
			_ = b.Close()
			return err
		}
		go func() { wdDone <- wd.Run(wdCtx) }()
	}
	select {
	case <-ctx.Done():
		log.Info("shutting down")
	case <-op.Done():
	case err := <-wdDone:
		// The watchdog only fails when NATS does: the services are
		// about to notice as well.
		log.Error("launch watchdog stopped", "err", err)
	}
	wdStop()
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
	var stretch float64
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
			// A replica's events name it in ce-source, so an audit of the
			// placement log can tell which replica wrote what.
			source := name
			if ops.replica != "" {
				source = name + ":" + ops.replica
			}
			return runServices(cmd.Context(), g, natsConn{url: url}, source,
				operator.Config{Services: []string{name}, ClusterFile: cluster, Poll: poll, Strategy: strategy, Policies: policySet, ReserveAfter: &reserve,
					MaxStretch: maxStretch(stretch), Replica: ops.replica, LeaseTTL: ops.leaseTTL}, &ops, log.With("service", name))
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
		maxStretchFlag(cmd.Flags(), &stretch)
		cmd.Flags().StringVar(&policySet, "policies", "", policiesUsage)
	}
	ops.register(cmd.Flags(), name == operator.Placement)
	return cmd
}

// maxStretchFlag registers --max-stretch, placement's bound on how much
// slower than its ideal placement a job spread over nodes may start
// (placer.Compact).
func maxStretchFlag(fs *pflag.FlagSet, v *float64) {
	fs.Float64Var(v, "max-stretch", placer.DefaultMaxStretch, "a topology-aware job spread over nodes waits, until nodes held for it as the queue's head hold it, "+
		"rather than start where its predicted step time is more than this many times its ideal placement's (0: off; needs --reserve-after)")
}

// maxStretch is --max-stretch as placement.Config.MaxStretch, where 0 is
// the default and a negative bound is off.
func maxStretch(flag float64) float64 {
	if flag <= 0 {
		return -1
	}
	return flag
}
