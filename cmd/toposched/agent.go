package main

import (
	"time"

	"github.com/spf13/cobra"
)

// agentFlags are what NVML discovery reports the node as and where it
// looks besides NVML. They are declared in every build, so that a
// toposched built without NVML takes the same command line and says what
// it lacks rather than that a flag is unknown.
type agentFlags struct {
	node       string
	position   int
	labels     map[string]string
	sysfs      string
	rediscover time.Duration
	print      bool
}

func newAgent(g *globals) *cobra.Command {
	var af agentFlags
	var ef execFlags
	cmd := &cobra.Command{
		Use:   "agent [--node NAME] [--position N] [--print] [--exec [--cluster FILE]]",
		Short: "Run the node agent: discover this node's GPUs, NVLinks and NICs through NVML and report them and their health",
		Long: `agent runs on each GPU node (a DaemonSet or a systemd unit). It discovers the
node through NVML (GPUs, NVLink peers and NVSwitches, PCIe paths, NUMA, NICs
from sysfs), publishes it on topology.node.<node>, and publishes every health
change (critical XIDs, NVLink state) on topology.health.<node>. NVML discovery
is in a toposched built with -tags nvml and cgo, as the image deploy/Dockerfile
builds is: CGO_CFLAGS="-O2 -g -Wno-deprecated-declarations" go build -tags nvml
./cmd/toposched.

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
without NVML, or with a toposched built without it, --cluster FILE names the
cluster file that describes --node, and nothing is discovered.

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
				return runLauncherOnly(cmd.Context(), g, &ef, af.node)
			}
			return runNVMLAgent(cmd, g, &af, &ef)
		},
	}
	f := cmd.Flags()
	f.StringVar(&af.node, "node", "", "node name (default: the host name)")
	f.IntVar(&af.position, "position", 0, "the node's place in enumeration order")
	f.StringToStringVar(&af.labels, "label", nil, "node labels, key=value (repeatable)")
	f.StringVar(&af.sysfs, "sysfs", "/", "root under which sys/ is read (NICs, NUMA, PCIe paths)")
	f.DurationVar(&af.rediscover, "rediscover", 5*time.Minute, "how often to rediscover the node and report it again if it changed")
	f.BoolVar(&af.print, "print", false, "discover once, print the path matrix and exit (no NATS)")
	g.conn.RegisterTokenFile(f)
	ef.register(f)
	cmd.AddCommand(newRankExec())
	return cmd
}
