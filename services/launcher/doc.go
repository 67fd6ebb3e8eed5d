// Package launcher turns placement decisions into running ranks and makes
// sure none of them holds GPUs after it is gone.
//
// An Agent runs on each node (toposched agent --exec). It follows
// placement.decided and starts, as child processes, the ranks a decision
// puts on its node, for jobs whose jobs.submitted names a command: each
// with RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
// MASTER_PORT, CUDA_VISIBLE_DEVICES, the job's env, the runtime.tuning
// variables for that rank, and numactl binding to the GPU's NUMA node
// where numactl and that node exist. Each rank's output goes to a file in
// the agent's state directory, which the agent reads back as bounded
// runtime.rank_log batches; so a rank outlives its agent (no pipe to
// break), and a restarted agent adopts the ranks still running, found
// through the state file it wrote at launch, or reports them gone. Each
// job's files are in a directory of its own, named by an injective
// encoding of its id (state.go), and no job runs twice: a job with a state
// is adopted or reported, never started again, a rank starts only once its
// state is written, and the state goes only once the report is out.
//
// Where the agent runs as root, the ranks run as the job's user (run_as),
// one of those Config.RunAsAllow lists; without a list a root agent does
// not start (runas.go). What a failed launch tells the submitter names the
// job's field and value, never the agent's environment.
//
// Gang semantics span nodes through runtime.ranks_exited: an agent
// publishes it once every rank it ran for a job has ended; when one rank
// fails, the agent stops its other ranks (SIGTERM, then SIGKILL after the
// grace period) and the job's other agents, seeing the failed report, stop
// theirs. The agent of rank 0's node publishes jobs.finished once every
// node of the decision has reported, with each rank's exit code. A release
// (the job finished or cancelled by anyone else) stops the ranks too.
//
// The Watchdog runs beside the services (toposched serve --agent-ttl). It
// follows the agents' agent.heartbeat.<node> and finishes as lost
// (jobs.finished status lost, reason agent_lost) a job whose agent has been
// silent for the TTL, and (reason no_agent) a job with a command that no
// agent took within the TTL of its decision: placement frees the GPUs of
// both, as it does for any finish, so placement itself needs no timer.
//
// A GPU is never given away while a rank of a silent agent still runs on
// it. Each rank runs under a shim (RunShim) that watches the agent's alive
// file, whose mtime the agent sets to the start of every heartbeat NATS
// took. Once it is older than Config.Silence (the TTL less --grace less one
// heartbeat), the shim stops its rank: SIGTERM, SIGKILL after the grace,
// then what is left of its process group. The ranks of an agent the
// watchdog last heard at t are thus gone by t + TTL - heartbeat + a poll,
// before it finishes their job at t + TTL. So the agents must be given the
// watchdog's TTL (toposched agent --agent-ttl, the same as serve's), and an
// agent restarted within the silence adopts its ranks; later it finds them
// ended (ranks_gone, or the job already lost and released). The heartbeats
// say when the ranks would stop, and the watchdog warns of an agent whose
// ranks would outlive its TTL.
package launcher
