//go:build cgo

package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/toposched/toposched/events/bus"
	"github.com/toposched/toposched/internal/formats/clusterfile"
	"github.com/toposched/toposched/services/discovery/nvml"
	"github.com/toposched/toposched/services/launcher"
)

func newAgent(g *globals) *cobra.Command {
	var cfg nvml.AgentConfig
	var ef execFlags
	var print bool
	cmd := &cobra.Command{
		Use:   "agent [--node NAME] [--position N] [--print] [--exec [--cluster FILE]]",
		Short: "Run the node agent: discover this node's GPUs, NVLinks and NICs through NVML and report them and their health",
		Long: `agent runs on each GPU node (a DaemonSet or a systemd unit). It discovers the
node through NVML (GPUs, NVLink peers and NVSwitches, PCIe paths, NUMA, NICs
from sysfs), publishes it on topology.node.<node>, and publishes every health
change (critical XIDs, NVLink state) on topology.health.<node>.

--print discovers once, prints the node's path matrix and exits, without NATS:
the check to run by hand on a GPU machine.

--exec also launches the ranks decisions place on the node, for jobs that name
a command: each with RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
MASTER_ADDR, MASTER_PORT, CUDA_VISIBLE_DEVICES, the job's env and the
runtime.tuning variables for that rank, bound with numactl to its GPU's NUMA
node where numactl is installed. When one rank fails the others are stopped
(SIGTERM, SIGKILL after --grace), on every node of the job; when all have
ended, the agent of rank 0's node publishes jobs.finished with each rank's
exit code. Heartbeats let the watchdog (toposched serve --agent-ttl) free the
GPUs of a job whose agent died; before it does, the ranks stop by themselves
(their shim sees no heartbeat for --agent-ttl less --grace less one
--heartbeat), so give the agent the watchdog's --agent-ttl. On a machine
without NVML, --cluster FILE names the cluster file that describes --node,
and nothing is discovered.

An agent with --exec running as root runs each rank as its job's run_as user
(or --run-as-default), only if --run-as-allow names it; it does not start
without --run-as-allow (--run-as-allow root lets ranks run as root). An agent
not running as root runs ranks only as itself.`,
		Example: `  toposched agent --print
  toposched agent --nats-url nats://nats:4222 --position 17 --label rack=r3
  toposched agent --nats-url nats://nats:4222 --exec --run-as-allow alice,bob --run-as-default nobody
  toposched agent --nats-url nats://nats:4222 --node gpu-001 --exec --cluster cluster.yaml --address 10.0.0.11
  toposched agent --nats-url nats://nats:4222 --node "$NODE_NAME" --nats-token-file /var/run/secrets/toposched/nats/token`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if ef.cluster != "" {
				return runLauncherOnly(cmd.Context(), g, &ef, cfg.NodeName)
			}
			lib := nvml.Library()
			if print {
				n, err := nvml.Discover(lib, cfg.Options)
				if err != nil {
					return err
				}
				ev := n.Event()
				return clusterfile.WriteMatrix(cmd.OutOrStdout(), ev, false, true)
			}
			if ef.exec {
				if err := launcher.CheckRunAs(ef.cfg); err != nil {
					return fmt.Errorf("agent: %w", err)
				}
			}
			log, err := g.logger()
			if err != nil {
				return err
			}
			if cfg.NodeName == "" {
				// NVML's discovery names the node after the host too; the
				// name is needed first, for the node's credentials.
				h, err := os.Hostname()
				if err != nil {
					return fmt.Errorf("--node: none given and no host name: %w", err)
				}
				cfg.NodeName = h
			}
			ctx := cmd.Context()
			b, err := connectAgent(ctx, g, cfg.NodeName, log)
			if err != nil {
				return err
			}
			agent, err := nvml.NewAgent(cfg, nvml.AgentDeps{Lib: lib, Publish: b, Log: log})
			if err != nil {
				_ = b.Close()
				return err
			}
			if ef.exec {
				err = runWithLauncher(ctx, agent, b, &ef, cfg.NodeName, log)
			} else if err = agent.Run(ctx); err != nil {
				err = fmt.Errorf("agent: %w", err)
			}
			// A failed drain is reported, as runServices does.
			if cerr := b.Close(); cerr != nil {
				err = errors.Join(err, cerr)
			}
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.NodeName, "node", "", "node name (default: the host name)")
	f.IntVar(&cfg.Position, "position", 0, "the node's place in enumeration order")
	f.StringToStringVar(&cfg.Labels, "label", nil, "node labels, key=value (repeatable)")
	f.StringVar(&cfg.SysfsRoot, "sysfs", "/", "root under which sys/ is read (NICs, NUMA, PCIe paths)")
	f.DurationVar(&cfg.Rediscover, "rediscover", 5*time.Minute, "how often to rediscover the node and report it again if it changed")
	f.BoolVar(&print, "print", false, "discover once, print the path matrix and exit (no NATS)")
	g.conn.RegisterTokenFile(f)
	ef.register(f)
	cmd.AddCommand(newRankExec())
	return cmd
}

// runWithLauncher runs the NVML agent and the launcher side by side; the
// first to fail stops the other.
func runWithLauncher(ctx context.Context, agent *nvml.Agent, b *bus.Bus, ef *execFlags, node string, log *slog.Logger) error {
	if node == "" {
		h, err := os.Hostname()
		if err != nil {
			return fmt.Errorf("--node: none given and no host name: %w", err)
		}
		node = h
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, 2)
	go func() {
		err := agent.Run(ctx)
		if err != nil {
			err = fmt.Errorf("agent: %w", err)
		}
		errc <- err
	}()
	// The GPUs are NVML's to report; the launcher does not check them.
	go func() { errc <- runLauncher(ctx, b, ef, node, nil, log) }()
	err := <-errc
	cancel()
	return errors.Join(err, <-errc)
}
