package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/events/bus"
	"github.com/toposched/toposched/internal/formats/clusterfile"
	"github.com/toposched/toposched/services/launcher"
)

// execFlags are the agent's launcher settings (--exec and what goes with it).
type execFlags struct {
	exec    bool
	cluster string
	cfg     launcher.Config
}

func (f *execFlags) register(fs *pflag.FlagSet) {
	fs.BoolVar(&f.exec, "exec", false, "launch the ranks decisions place on this node (the job's command, args, env, workdir), watch them and finish the job")
	fs.StringVar(&f.cluster, "cluster", "", "cluster file describing this node (--node), for a machine without NVML; needs --exec")
	fs.StringVar(&f.cfg.StateDir, "state-dir", "",
		"with --exec: where each job's state file and its ranks' output are kept (a restarted agent adopts the ranks found there; default: TMPDIR/toposched-agent/NODE)")
	fs.StringVar(&f.cfg.Address, "address", "", "with --exec: where other nodes reach this node's ranks, MASTER_ADDR when rank 0 runs here (default: the node name)")
	fs.DurationVar(&f.cfg.Heartbeat, "heartbeat", launcher.DefaultHeartbeat, "with --exec: how often to send agent.heartbeat (the watchdog's --agent-ttl must be several of them)")
	fs.DurationVar(&f.cfg.AgentTTL, "agent-ttl", launcher.DefaultAgentTTL,
		"with --exec: the watchdog's --agent-ttl (toposched serve's; give the same value): the ranks stop by themselves once this agent has been silent for it less --grace and one --heartbeat, before their GPUs are freed (0: they run on without their agent)")
	fs.DurationVar(&f.cfg.Grace, "grace", launcher.DefaultGrace, "with --exec: how long a rank asked to stop (SIGTERM) has before SIGKILL")
	fs.StringVar(&f.cfg.TelemetryListen, "telemetry-listen", "127.0.0.1:0",
		"with --exec: loopback HOST:PORT where ranks POST runtime.telemetry (TOPOSCHED_TELEMETRY_URL; port 0: any free one; empty: off)")
	fs.DurationVar(&f.cfg.TuningWait, "tuning-wait", launcher.DefaultTuningWait, "with --exec: how long a launch waits for the job's runtime.tuning")
	fs.StringSliceVar(&f.cfg.RunAsAllow, "run-as-allow", nil,
		"with --exec: the users a job's ranks may run as (its run_as, or --run-as-default). Required for an agent running as root, which runs each rank as its job's user; --run-as-allow root is the explicit opt-in to run ranks as root. An agent not running as root runs ranks only as itself, and a list given must name it")
	fs.StringVar(&f.cfg.RunAsDefault, "run-as-default", "", "with --exec: the user the ranks of a job that names no run_as run as (default: the agent's own user)")
}

// clusterGPUs reads node's GPU indices from a cluster file.
func clusterGPUs(path, node string) ([]int, error) {
	c, err := clusterfile.LoadCluster(path)
	if err != nil {
		return nil, fmt.Errorf("--cluster: %w", err)
	}
	n, err := c.Node(node)
	if err != nil {
		return nil, fmt.Errorf("--cluster %s: --node %s: %w", path, node, err)
	}
	gpus := make([]int, len(n.GPUs))
	for i, g := range n.GPUs {
		gpus[i] = g.Index
	}
	return gpus, nil
}

// connectAgent connects node's agent: the operator creates the streams
// (an agent's role may publish its node's reports and no more), and
// without credentials given it signs in with the node's seed in serve's
// credentials directory (agent-<node>.nk), where there is one.
func connectAgent(ctx context.Context, g *globals, node string, log *slog.Logger) (*bus.Bus, error) {
	url := g.natsURLOrLocal()
	role, err := events.NodeScope(node).Role()
	if err != nil {
		return nil, fmt.Errorf("--node: %w", err)
	}
	g.conn.Role = role
	bcfg := g.busConfig(url, "agent", log)
	bcfg.SkipStreams = true
	b, err := bus.Connect(ctx, bcfg)
	return b, g.conn.Explain(err)
}

// runLauncherOnly is the agent of a machine without NVML: --exec with the
// node taken from --cluster.
func runLauncherOnly(ctx context.Context, g *globals, f *execFlags, node string) error {
	if !f.exec {
		return errors.New("--cluster describes the node for --exec: give --exec too")
	}
	if node == "" {
		return errors.New("--cluster needs --node: the node of the cluster file this agent runs")
	}
	gpus, err := clusterGPUs(f.cluster, node)
	if err != nil {
		return err
	}
	if err := launcher.CheckRunAs(f.cfg); err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	log, err := g.logger()
	if err != nil {
		return err
	}
	b, err := connectAgent(ctx, g, node, log)
	if err != nil {
		return err
	}
	err = runLauncher(ctx, b, f, node, gpus, log)
	if cerr := b.Close(); cerr != nil {
		err = errors.Join(err, cerr)
	}
	return err
}

// runLauncher runs the agent's launcher until ctx ends.
func runLauncher(ctx context.Context, b *bus.Bus, f *execFlags, node string, gpus []int, log *slog.Logger) error {
	cfg := f.cfg
	cfg.Node, cfg.GPUs = node, gpus
	if cfg.StateDir == "" {
		// Per node: two agents on one machine (a test, a demo) must not
		// share their job states.
		cfg.StateDir = filepath.Join(os.TempDir(), "toposched-agent", node)
	}
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("agent: the rank shim is this binary: %w", err)
	}
	cfg.Shim = []string{exe, "agent", "rank-exec"}
	a, err := launcher.New(cfg, launcher.Deps{Bus: b, Log: log})
	if err != nil {
		return err
	}
	if err := a.Run(ctx); err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	return nil
}

// newRankExec is the rank shim the launcher starts each rank under
// (launcher.ShimMain, which reads its own command line): not a command for
// people.
func newRankExec() *cobra.Command {
	return &cobra.Command{
		Use:                "rank-exec [--alive FILE --silence D --grace D] [--gate-fd N] [--uid U --gid G --groups G,...] EXITFILE -- COMMAND ARGS...",
		Short:              "Run one rank and record how it ended (started by agent --exec)",
		Hidden:             true,
		DisableFlagParsing: true,
		Run: func(_ *cobra.Command, args []string) {
			os.Exit(launcher.ShimMain(args))
		},
	}
}

// defaultAgentTTL is serve's --agent-ttl.
const defaultAgentTTL = launcher.DefaultAgentTTL
