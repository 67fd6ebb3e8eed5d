package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/toposched/toposched/events/bus"
	"github.com/toposched/toposched/events/natsserver"
	"github.com/toposched/toposched/internal/calibration"
	"github.com/toposched/toposched/internal/collective"
	"github.com/toposched/toposched/internal/natsflags"
	"github.com/toposched/toposched/internal/placer"
	"github.com/toposched/toposched/services/discovery"
	"github.com/toposched/toposched/services/kube"
	"github.com/toposched/toposched/services/launcher"
	"github.com/toposched/toposched/services/operator"
	"github.com/toposched/toposched/services/placement"
	"github.com/toposched/toposched/services/slurm"
)

type serveFlags struct {
	cluster          string
	listen           string
	dataDir          string
	natsConfig       string
	services         []string
	poll             time.Duration
	strategy         string
	reserve          time.Duration
	maxStretch       float64
	computeReference string
	queueOrder       string
	backfill         bool
	policies         string
	ops              opsFlags
	// insecureLoopback: no credentials on the loopback listener.
	insecureLoopback bool
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

Clients sign in, on loopback too, with one of:
  - the credentials in DATA_DIR/credentials (the default): nkey seed files,
    mode 0600, one per user (the path is logged, the secret is not). serve
    writes operator.nk (its services), launcher.nk (an administrator: topoctl
    finds it there) and policy-admin.nk on first start; 'toposched roles
    issue --agent NODE --tenant T' adds a node's agent (agent-NODE.nk) or a
    tenant's users (tenant-T.nk), which serve takes in within a second, and
    a removed file is a user signed out;
  - --nats-config FILE: a nats-server configuration with its users (such as
    deploy/nats/standalone.conf); the services then connect with --nats-user,
    --nats-creds or --nats-nkey. --listen and --data-dir override its listen
    and store_dir;
  - --insecure-loopback: nobody signs in, on a loopback listener only (anyone
    on the host may then submit, decide and run commands through the agents).

With --nats-url it connects to an existing NATS deployment instead.

Placement runs the shipped Rego policy set, or the one in --policies DIR
(reloaded when its files change), or none with --policies none. A set pushed
with topoctl policy push overrides it while it is the newer of the two.

SIGTERM or Ctrl-C stops it gracefully: handlers in flight finish, nothing
that was not handled is acknowledged, and the server flushes its streams.`,
		Example: `  toposched serve --cluster deploy/examples/cluster.yaml
  # every interface, authenticated with the credentials in /var/lib/toposched/credentials:
  toposched serve --cluster cluster.yaml --listen 0.0.0.0:4222 --data-dir /var/lib/toposched
  toposched roles issue --dir /var/lib/toposched/credentials --agents-from cluster.yaml --tenant research
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
	cmd.Flags().StringVar(&f.dataDir, "data-dir", natsflags.DataDir(),
		"embedded NATS JetStream storage directory, and its credentials in DATA_DIR/credentials (env TOPOSCHED_DATA_DIR, which topoctl and the agents read to find their seeds)")
	cmd.Flags().BoolVar(&f.insecureLoopback, "insecure-loopback", false,
		"let clients on this host in without credentials (loopback listeners only): anyone on the host may then submit jobs, write decisions and run commands through the agents")
	cmd.Flags().StringVar(&f.natsConfig, "nats-config", "",
		"nats-server configuration file for the embedded server (users, accounts, TLS, limits); the services connect with --nats-user, --nats-creds or --nats-nkey")
	cmd.Flags().StringSliceVar(&f.services, "services", operator.All, "services to run")
	cmd.Flags().DurationVar(&f.poll, "poll", 5*time.Second, "how often discovery checks the cluster file for changes (0: never)")
	cmd.Flags().StringVar(&f.strategy, "strategy", "topology-aware", "placement strategy: "+strings.Join(placer.Names(true), ", ")+" (blind: the first-fit baseline)")
	cmd.Flags().DurationVar(&f.reserve, "reserve-after", placement.DefaultReserveAfter, "how long the head of the queue waits before nodes are held for it so small jobs cannot starve it (0: at once; negative: never)")
	maxStretchFlag(cmd.Flags(), &f.maxStretch)
	queueOrderFlag(cmd.Flags(), &f.queueOrder)
	backfillFlag(cmd.Flags(), &f.backfill)
	computeReferenceFlag(cmd.Flags(), &f.computeReference)
	cmd.Flags().StringVar(&f.policies, "policies", "", policiesUsage)
	f.ops.register(cmd.Flags(), true)
	f.ops.kube.register(cmd.Flags(), false)
	f.ops.slurm.register(cmd.Flags(), false)
	return cmd
}

const policiesUsage = "Rego policy set directory, reloaded when its files change; 'none' turns policies off; " +
	"empty: the shipped set. A newer set pushed with topoctl policy push overrides it"

// defaultListen is the embedded server's address: this host only.
const defaultListen = "127.0.0.1:4222"

func runServe(ctx context.Context, g *globals, f *serveFlags) error {
	log, err := g.logger()
	if err != nil {
		return err
	}
	conn := natsConn{url: g.natsURL}
	g.conn.Role = roleOperator // serve's seed, where no credentials are given
	sole := false
	if conn.url == "" {
		// Replicas share a NATS cluster (--nats-url); the embedded server
		// serves this process's services alone.
		sole = true
		emb, err := startEmbedded(ctx, embeddedFlags{listen: f.listen, dataDir: f.dataDir, config: f.natsConfig, prefix: g.prefix,
			insecure: f.insecureLoopback}, log)
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
		Services:  f.services,
		Discovery: discovery.Config{ClusterFile: f.cluster, Poll: f.poll},
		Placement: placement.Config{Strategy: f.strategy, ReserveAfter: &f.reserve, MaxStretch: maxStretch(f.maxStretch), ComputeReference: f.computeReference, QueueOrder: f.queueOrder, Backfill: f.backfill},
		Policies:  f.policies, Replica: f.ops.replica, LeaseTTL: f.ops.leaseTTL, Sole: sole,
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
	// insecure lets clients in without credentials (loopback only).
	insecure bool
}

// startEmbedded starts serve's embedded server. Clients must sign in: by
// default with the nkey users whose seeds serve keeps in its credentials
// directory (generating the operator's, launcher's and policy-admin's on
// first start, and taking in the agents and tenants toposched roles issue
// there, while it runs), or as the users of --nats-config. With
// --insecure-loopback, and only on loopback, anyone on the host may do
// anything.
func startEmbedded(ctx context.Context, f embeddedFlags, log *slog.Logger) (natsConn, error) {
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
	switch {
	case f.config != "" && f.insecure:
		return natsConn{}, errors.New("--insecure-loopback and --nats-config: the config's users decide who signs in; choose one")
	case f.insecure && !natsserver.IsLoopback(host):
		return natsConn{}, fmt.Errorf("--insecure-loopback: --listen %s reaches beyond this host; an open server listens on loopback only", f.listen)
	case f.insecure:
		log.Warn("embedded NATS without credentials (--insecure-loopback): anyone on this host may submit, decide and run commands through the agents", "listen", f.listen)
	case f.config == "":
		// The credentials live in the data dir: check it first, so that
		// an unwritable one is named as such.
		if err := natsserver.CheckStoreDir(f.dataDir); err != nil {
			return natsConn{}, fmt.Errorf("embedded nats: %w", err)
		}
		dir := natsflags.CredentialsDir(f.dataDir)
		made, err := natsserver.EnsureCredentials(dir, servedRoles(f.prefix))
		if err != nil {
			return natsConn{}, fmt.Errorf("embedded nats: credentials: %w", err)
		}
		creds, err := readCredentials(dir, f.prefix, log)
		if err != nil {
			return natsConn{}, err
		}
		opt, err := creds.Option(roleOperator)
		if err != nil {
			return natsConn{}, err
		}
		cfg.Credentials, conn.opts = creds, []nats.Option{opt}
		log.Info("embedded NATS requires credentials (nkey seed files, mode 0600; toposched roles issue adds agents and tenants)",
			"listen", f.listen, "dir", dir, "generated", made.Created(), "roles", creds.Roles(),
			"launcher", made.File(roleLauncher), "policy_admin", made.File(rolePolicyAdmin))
	}
	srv, err := natsserver.Start(cfg)
	if err != nil {
		if f.config != "" {
			return natsConn{}, fmt.Errorf("--nats-config %s: %w", f.config, err)
		}
		return natsConn{}, err // it names the address or the data dir
	}
	conn.url, conn.srv = srv.ClientURL(), srv
	if cfg.Credentials != nil {
		go watchCredentials(ctx, srv, cfg.Credentials, f.prefix, log)
	}
	return conn, nil
}

// credentialsPoll is how often serve looks for seed files added to or
// removed from its credentials directory: an agent issued a credential
// signs in within it.
const credentialsPoll = time.Second

// credentialsReread is how often serve reads its credentials directory's
// seeds again though the directory has not changed (a seed edited in
// place).
const credentialsReread = 30 * time.Second

// readCredentials reads the users of serve's credentials directory; a
// file that is no role of this deployment is logged and left out.
func readCredentials(dir, prefix string, log *slog.Logger) (*natsserver.Credentials, error) {
	creds, errs := natsserver.ReadCredentials(dir, roles{prefix}.permissions)
	for _, err := range errs {
		log.Warn("credentials: file left out", "err", err)
	}
	if creds == nil {
		return nil, fmt.Errorf("embedded nats: credentials in %s: %w", dir, errors.Join(errs...))
	}
	return creds, nil
}

// watchCredentials keeps the server's users those of the credentials
// directory until ctx ends: a seed file added (toposched roles issue) is a
// user that may sign in, one removed a user the server disconnects.
func watchCredentials(ctx context.Context, srv *natsserver.Server, in *natsserver.Credentials, prefix string, log *slog.Logger) {
	tick := time.NewTicker(credentialsPoll)
	defer tick.Stop()
	// The directory's mtime moves when a seed is added, removed or
	// renamed into place (as roles issue writes them): only then are its
	// files read again, and every credentialsReread besides, so that a
	// directory of thousands of agents' seeds is not read every second.
	var seen time.Time
	var read time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		st, err := os.Stat(in.Dir)
		if err == nil && st.ModTime().Equal(seen) && time.Since(read) < credentialsReread {
			continue
		}
		if err == nil {
			seen = st.ModTime()
		}
		read = time.Now()
		creds, errs := natsserver.ReadCredentials(in.Dir, roles{prefix}.permissions)
		if creds == nil || creds.Equal(in) {
			continue
		}
		if creds.File(roleOperator) == "" {
			// The services' own: without it they could not sign in again.
			log.Error("credentials: operator.nk is gone from the credentials directory; the users stay as they were", "dir", in.Dir)
			continue
		}
		for _, err := range errs {
			log.Warn("credentials: file left out", "err", err)
		}
		if err := srv.SetCredentials(creds); err != nil {
			log.Error("credentials: the server's users not changed", "err", err)
			continue
		}
		log.Info("credentials changed: the server's users are now those of the directory", "dir", in.Dir, "roles", creds.Roles())
		in = creds
	}
}

// runServices connects to NATS, runs the services until ctx ends, then
// stops them gracefully and drains the connection.
func runServices(ctx context.Context, g *globals, conn natsConn, source string, cfg operator.Config, ops *opsFlags, log *slog.Logger) error {
	// A flag at fault is named before anything is connected or started.
	if err := cfg.Validate(); err != nil {
		return err
	}
	if err := ops.applyMemoryLimit(log); err != nil {
		return err
	}
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
	deps := operator.Deps{Log: log}
	mr.observe(&bcfg, &deps)
	b, err := bus.Connect(ctx, bcfg)
	if err != nil {
		return err
	}
	deps.Bus = b
	op, err := operator.New(cfg, deps)
	if err != nil {
		_ = b.Close()
		return err
	}
	// The services outlive the signal: they stop after the Kubernetes
	// and Slurm services below, which hand their leases over the bus.
	stopOp, err := operator.Background(ctx, op)
	if err != nil {
		_ = b.Close()
		return err
	}
	// The Kubernetes and Slurm services, where they run, are part of
	// /readyz: a replica leading one is ready once its caches are synced
	// and its state rebuilt.
	var kubeR *kubeRun
	var slurmR *slurmRun
	var extra []func() error
	if ops.kube.enabled() {
		kubeR = &kubeRun{}
		if mr != nil {
			kubeR.met = kube.NewMetrics(mr.m.Registry())
		}
		extra = append(extra, kubeR.ready)
	}
	if ops.slurm.on {
		slurmR = &slurmRun{}
		if mr != nil {
			slurmR.met = slurm.NewMetrics(mr.m.Registry())
		}
		extra = append(extra, slurmR.ready)
	}
	if err := mr.serve(ops, b, op, cfg.Services, conn.srv, g, extra...); err != nil {
		_ = stopOp()
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
		wd, err := launcher.NewWatchdog(launcher.WatchdogConfig{AgentTTL: ops.agentTTL}, launcher.Deps{Bus: b, Log: log})
		if err != nil {
			_ = stopOp()
			_ = b.Close()
			return err
		}
		go func() { wdDone <- wd.Run(wdCtx) }()
	}
	var kubeDone chan error // nil, never ready, when it does not run
	if kubeR != nil {
		kubeDone = make(chan error, 1)
		go func() { kubeDone <- runKube(wdCtx, b, &ops.kube, ops, kubeR, log) }()
	}
	var slurmDone chan error // nil, never ready, when it does not run
	if slurmR != nil {
		slurmDone = make(chan error, 1)
		go func() { slurmDone <- runSlurm(wdCtx, b, &ops.slurm, ops, slurmR, log) }()
	}
	select {
	case <-ctx.Done():
		log.Info("shutting down")
	case <-op.Done():
	case err := <-wdDone:
		// The watchdog only fails when NATS does: the services are
		// about to notice as well.
		log.Error("launch watchdog stopped", "err", err)
	case err := <-kubeDone:
		log.Error("kubernetes service stopped", "err", err)
		kubeDone = nil
	case err := <-slurmDone:
		log.Error("slurm sync service stopped", "err", err)
		slurmDone = nil
	}
	wdStop()
	if slurmDone != nil {
		if err := <-slurmDone; err != nil {
			log.Error("slurm sync service stopped", "err", err)
		}
	}
	if kubeDone != nil {
		// It hands its lease over on the way out, over the bus.
		if err := <-kubeDone; err != nil {
			log.Error("kubernetes service stopped", "err", err)
		}
	}
	err = stopOp()
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
	var computeRef, queueOrder string
	var backfill bool
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
			url := g.natsURLOrLocal()
			// Its own role's seed in serve's credentials directory, where
			// no credentials are given and there is one.
			g.conn.Role = name
			// A replica's events name it in ce-source, so an audit of the
			// placement log can tell which replica wrote what.
			source := name
			if ops.replica != "" {
				source = name + ":" + ops.replica
			}
			return runServices(cmd.Context(), g, natsConn{url: url}, source, operator.Config{
				Services:  []string{name},
				Discovery: discovery.Config{ClusterFile: cluster, Poll: poll},
				Placement: placement.Config{Strategy: strategy, ReserveAfter: &reserve, MaxStretch: maxStretch(stretch), ComputeReference: computeRef, QueueOrder: queueOrder, Backfill: backfill},
				Policies:  policySet, Replica: ops.replica, LeaseTTL: ops.leaseTTL,
			}, &ops, log.With("service", name))
		},
	}
	if name == operator.Discovery {
		cmd.Flags().StringVar(&cluster, "cluster", "", "cluster file (YAML or JSON) to publish")
		cmd.Flags().DurationVar(&poll, "poll", 5*time.Second, "how often to check the cluster file for changes (0: never)")
		_ = cmd.MarkFlagRequired("cluster")
	}
	if name == operator.Placement {
		cmd.Flags().StringVar(&strategy, "strategy", "topology-aware", "placement strategy: "+strings.Join(placer.Names(true), ", ")+" (blind: the first-fit baseline)")
		cmd.Flags().DurationVar(&reserve, "reserve-after", placement.DefaultReserveAfter, "how long the head of the queue waits before nodes are held for it (0: at once; negative: never)")
		maxStretchFlag(cmd.Flags(), &stretch)
		queueOrderFlag(cmd.Flags(), &queueOrder)
		backfillFlag(cmd.Flags(), &backfill)
		computeReferenceFlag(cmd.Flags(), &computeRef)
		cmd.Flags().StringVar(&policySet, "policies", "", policiesUsage)
	}
	if name == operator.Optimizer {
		// The optimizer plans moves and learns the models' compute speeds
		// with placement's reference: give it the same one.
		computeReferenceFlag(cmd.Flags(), &computeRef)
	}
	ops.register(cmd.Flags(), name == operator.Placement)
	return cmd
}

// computeReferenceFlag registers --compute-reference, placement's
// weighing of compute by GPU model (placement.Config.ComputeReference).
func computeReferenceFlag(fs *pflag.FlagSet, v *string) {
	fs.StringVar(v, "compute-reference", "", "weigh a job's compute by the GPU model of each candidate, its step_compute_seconds (or the estimate from its model's size) "+
		"taken as measured on this model, such as a100 (internal/gpuspeed's table; empty: compute the same on every model)")
}

// queueOrderFlag registers --queue-order, the order in which placement
// tries the waiting jobs of one priority (placement.Config.QueueOrder).
func queueOrderFlag(fs *pflag.FlagSet, v *string) {
	fs.StringVar(v, "queue-order", placement.QueueByEnd, "the order waiting jobs of one priority are tried in: "+placement.QueueByEnd+
		" (each one's first wait plus the run time learned for its size), "+placement.QueueByWork+
		" (the same run time times its share of a node) or "+placement.QueueByArrival)
}

// backfillFlag registers --backfill (placement.Config.Backfill).
func backfillFlag(fs *pflag.FlagSet, v *bool) {
	fs.BoolVar(v, "backfill", false, "let a job run on nodes held for the queue's head when it is expected to end before the jobs on them, "+
		"from the run times learned for each size (EASY backfilling with learned means for estimates; off: held nodes take no other job)")
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
