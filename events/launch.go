package events

import "time"

// The launch events: what the node agents that start a job's ranks
// (toposched agent --exec) say while they run them.
//
//   - agent.heartbeat.<node>: an agent is alive, where it can be reached
//     and which jobs it holds ranks of. A job whose agent falls silent for
//     the watchdog's TTL is finished as lost (jobs.finished, reason
//     agent_lost), which frees its GPUs. The agent stream keeps only each
//     node's newest heartbeat.
//   - runtime.rank_log: a batch of one rank's output lines, bounded in
//     size and number, for topoctl run to print.
//   - runtime.ranks_exited: every rank an agent ran for a job has exited
//     (or could not start): each rank's exit code and the node's verdict.
//     The agents of the job's other nodes stop their ranks when it says
//     failed (gang semantics); the agent of rank 0's node publishes
//     jobs.finished once every node has reported.

// StatusLost is a job whose launcher stopped answering, or that no
// launcher ever started: its GPUs are freed without knowing how its ranks
// ended.
const StatusLost JobStatus = "lost"

// Reasons of JobFinished.Reason and RanksExited.Reason.
const (
	// ReasonRanksExited: every rank exited by itself.
	ReasonRanksExited = "ranks_exited"
	// ReasonRankFailed: a rank exited with an error, or was killed; the
	// others were stopped.
	ReasonRankFailed = "rank_failed"
	// ReasonLaunchFailed: a rank could not be started (the command, the
	// workdir or the env of the job is at fault; Field names it).
	ReasonLaunchFailed = "launch_failed"
	// ReasonPeerFailed: the ranks were stopped because another node's
	// ranks failed.
	ReasonPeerFailed = "peer_failed"
	// ReasonRanksGone: a restarted agent found the ranks it had started
	// gone; how they ended is not known.
	ReasonRanksGone = "ranks_gone"
	// ReasonAgentLost: the agent running the job's ranks on a node fell
	// silent for longer than the watchdog's TTL.
	ReasonAgentLost = "agent_lost"
	// ReasonNoAgent: no agent took the job's ranks on a node within the
	// watchdog's TTL of its decision.
	ReasonNoAgent = "no_agent"
	// ReasonCancelled: a person stopped the job (topoctl run's Ctrl-C).
	ReasonCancelled = "cancelled"
)

// MaxFinishRanks bounds JobFinished.Ranks (the schema's maxItems).
const MaxFinishRanks = 4096

// RankExit is how one rank ended.
type RankExit struct {
	Rank int    `json:"rank"`
	Node string `json:"node"`
	// ExitCode is the process's exit status; -1 when it was killed by a
	// signal (Signal names it), never started, or its end is unknown.
	ExitCode int    `json:"exit_code"`
	Signal   string `json:"signal,omitempty"`
	// Stopped is set when the agent stopped the rank (gang stop or
	// cancellation) rather than the rank ending by itself.
	Stopped bool `json:"stopped,omitempty"`
}

// AgentJob is a job an agent holds ranks of.
type AgentJob struct {
	JobID string `json:"job_id"`
	Ranks []int  `json:"ranks"`
}

// AgentHeartbeat says a node agent is alive (agent.heartbeat.<node>).
type AgentHeartbeat struct {
	Node string `json:"node"`
	// Agent identifies this run of the agent: a restart gets a new one.
	Agent     string    `json:"agent"`
	StartedAt time.Time `json:"started_at"`
	SentAt    time.Time `json:"sent_at"`
	// IntervalSeconds is how often the agent sends a heartbeat.
	IntervalSeconds float64 `json:"interval_seconds"`
	// Address is where the node's ranks can be reached from other nodes
	// (MASTER_ADDR when rank 0 runs there).
	Address string `json:"address"`
	// Jobs are the jobs the agent has taken, from their decision until
	// their release.
	Jobs []AgentJob `json:"jobs,omitempty"`
	// RanksStopAfterSeconds is how long after the start of its last
	// heartbeat the agent's ranks stop by themselves when no other
	// follows (its silence and grace): the watchdog warns when it is not
	// below its TTL. 0 (absent) when they run on without their agent.
	RanksStopAfterSeconds float64 `json:"ranks_stop_after_seconds,omitempty"`
}

// RankLog is a batch of one rank's output (runtime.rank_log).
type RankLog struct {
	JobID string `json:"job_id"`
	Rank  int    `json:"rank"`
	Node  string `json:"node"`
	// Seq counts the rank's log events from 1.
	Seq   int64    `json:"seq"`
	Lines []string `json:"lines"`
	// Dropped counts the lines left out before these, over the agent's
	// limits (line length, lines per second, bytes per rank).
	Dropped int64 `json:"dropped,omitempty"`
}

// RanksExited says every rank an agent ran for a job has ended
// (runtime.ranks_exited).
type RanksExited struct {
	JobID string `json:"job_id"`
	Node  string `json:"node"`
	// Status is succeeded when every rank exited 0, else failed.
	Status JobStatus `json:"status"`
	// Reason is one of the Reason constants.
	Reason string `json:"reason"`
	// Field names the job field at fault, for launch_failed.
	Field   string     `json:"field,omitempty"`
	Message string     `json:"message,omitempty"`
	Ranks   []RankExit `json:"ranks"`
}
