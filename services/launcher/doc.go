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
// through the state file it wrote at launch, or reports them gone.
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
package launcher
