package events

import (
	"regexp"
	"time"
)

// Parallelism gives the degree of each parallel dimension of a job. A zero
// value means "not given"; analysis resolves defaults (1, and dp from gpus).
type Parallelism struct {
	TP int `json:"tp,omitempty"`
	PP int `json:"pp,omitempty"`
	DP int `json:"dp,omitempty"`
	EP int `json:"ep,omitempty"`
	CP int `json:"cp,omitempty"`
}

// Training strategies of JobSubmitted.Strategy: how data-parallel ranks
// share gradients and parameters.
const (
	StrategyDDP      = "ddp"
	StrategyFSDP     = "fsdp"
	StrategyZeRO1    = "zero1"
	StrategyZeRO2    = "zero2"
	StrategyZeRO3    = "zero3"
	StrategyMegatron = "megatron"
	StrategyPS       = "ps"
)

// Element types of Model.Dtype.
const (
	DtypeFP32 = "fp32"
	DtypeBF16 = "bf16"
	DtypeFP16 = "fp16"
	DtypeFP8  = "fp8"
)

// Collectives of Collective.Collective and CommGroup.Collective.
const (
	CollectiveAllReduce     = "all_reduce"
	CollectiveAllGather     = "all_gather"
	CollectiveReduceScatter = "reduce_scatter"
	CollectiveAllToAll      = "all_to_all"
	CollectiveSendRecv      = "send_recv"
	CollectiveBroadcast     = "broadcast"
)

// Bounds of Collective.Bound: what limits a call's time.
const (
	BoundLatency   = "latency"
	BoundBandwidth = "bandwidth"
)

// DimensionCustom is the dimension of the groups a job lists explicitly.
const DimensionCustom = "custom"

// Model is the size and shape of a job's model, from which analysis sizes
// its messages. A zero value means "not given".
type Model struct {
	Parameters      int64  `json:"parameters,omitempty"`
	Layers          int    `json:"layers,omitempty"`
	HiddenSize      int    `json:"hidden_size,omitempty"`
	Heads           int    `json:"heads,omitempty"`
	SeqLen          int    `json:"seq_len,omitempty"`
	MicroBatchSize  int    `json:"micro_batch_size,omitempty"`
	GlobalBatchSize int    `json:"global_batch_size,omitempty"`
	Dtype           string `json:"dtype,omitempty"`
	// Experts is the number of experts of each MoE layer; 0 for a dense model.
	Experts int `json:"experts,omitempty"`
	// TopK is the number of experts each token goes to; 0 means 1.
	TopK int `json:"top_k,omitempty"`
}

// CommGroup is a communication group a job lists explicitly, for patterns
// analysis does not derive. Groups of the same name are the members of one
// custom dimension.
type CommGroup struct {
	Name       string `json:"name"`
	Collective string `json:"collective"`
	Ranks      []int  `json:"ranks"`
	// Bytes is the message size of one call, as nccl-tests counts it.
	Bytes int64 `json:"bytes"`
	// CallsPerStep is how many calls a training step makes; 0 means 1.
	CallsPerStep int `json:"calls_per_step,omitempty"`
}

// JobSubmitted is a user's request to place a job (jobs.submitted).
type JobSubmitted struct {
	JobID       string            `json:"job_id"`
	Tenant      string            `json:"tenant,omitempty"`
	Priority    int               `json:"priority,omitempty"`
	GPUs        int               `json:"gpus"`
	GPUsPerNode int               `json:"gpus_per_node,omitempty"`
	GPUModel    string            `json:"gpu_model,omitempty"`
	Parallelism *Parallelism      `json:"parallelism,omitempty"`
	Labels      map[string]string `json:"labels,omitempty"`
	// Strategy is one of the Strategy constants; "" means ddp.
	Strategy string `json:"strategy,omitempty"`
	Model    *Model `json:"model,omitempty"`
	// StepComputeSeconds is the measured compute time of one training step.
	StepComputeSeconds float64 `json:"step_compute_seconds,omitempty"`
	// StepComputeSecondsByModel is the measured compute time of one step
	// on each GPU model it was measured on, by the model's name (such as
	// H100-SXM5-80GB). Where the job may land on several models, the one
	// it lands on sets its step time (package gpuspeed's JobCompute).
	StepComputeSecondsByModel map[string]float64 `json:"step_compute_seconds_by_model,omitempty"`
	// Layout is the rank layout, fastest-varying dimension first, such as
	// "tp-cp-ep-dp-pp" (the default when empty).
	Layout string      `json:"layout,omitempty"`
	Groups []CommGroup `json:"groups,omitempty"`
	// RestartCostSeconds is what stopping and relaunching the job costs
	// (checkpoint, relaunch, reload), for migration proposals' break-even;
	// 0 means DefaultRestartCostSeconds.
	RestartCostSeconds float64 `json:"restart_cost_seconds,omitempty"`

	// What the node agents run for each rank (toposched agent --exec); a
	// job without a command is placed alike and launched by someone else.
	Command string   `json:"command,omitempty"`
	Args    []string `json:"args,omitempty"`
	// Env holds NAME=value entries added to each rank's environment.
	Env []string `json:"env,omitempty"`
	// Workdir is the ranks' working directory on every node, an absolute
	// path.
	Workdir string `json:"workdir,omitempty"`
	// RunAs is the user the ranks run as, where the node agent runs as
	// root and allows that user (toposched agent --run-as-allow); "" is
	// the agent's default.
	RunAs string `json:"run_as,omitempty"`
}

// Collective is one kind of call a group makes in a training step.
type Collective struct {
	Collective string `json:"collective"`
	// Bytes is the message size of one call per rank, as nccl-tests counts
	// it: the buffer of an all-reduce, the gathered output of an all-gather,
	// the input of a reduce-scatter, a rank's whole buffer of an all-to-all,
	// one message of a send/recv.
	Bytes        int64  `json:"bytes"`
	CallsPerStep int    `json:"calls_per_step"`
	Bound        string `json:"bound"`
	Purpose      string `json:"purpose,omitempty"`
}

// RankGroups lists the communication groups of one parallel dimension: each
// member is the list of global ranks that talk within that group.
type RankGroups struct {
	Dimension string `json:"dimension"`
	// Name names a custom dimension, as the job did.
	Name string `json:"name,omitempty"`
	Size int    `json:"size"`
	// Members are the groups, each the global ranks that talk within it.
	// On the wire they are left out where the rest of the event gives
	// them (see JobAnalyzed.MarshalJSON); decoded, they are always there.
	Members     [][]int      `json:"members,omitzero"`
	Collectives []Collective `json:"collectives,omitempty"`
}

// JobAnalyzed is a validated job with its rank layout (jobs.analyzed).
type JobAnalyzed struct {
	Job         JobSubmitted `json:"job"`
	Parallelism Parallelism  `json:"parallelism"`
	// Order is the rank layout, fastest-varying dimension first.
	Order  []string     `json:"order"`
	Groups []RankGroups `json:"groups"`
	// MicroBatchesPerStep is global batch / (micro batch · dp), when known.
	MicroBatchesPerStep int `json:"micro_batches_per_step,omitempty"`
	// BytesPerStepPerRank is the most bytes any rank sends in a step, over
	// every call of every group it is in, with bandwidth-optimal algorithms:
	// bytes × calls × nccl-tests' bus factor (2(n-1)/n for all-reduce,
	// (n-1)/n for all-gather, reduce-scatter and all-to-all, 1 for
	// broadcast and for send/recv, counted at the sender).
	BytesPerStepPerRank int64 `json:"bytes_per_step_per_rank,omitempty"`
	// TotalBytesPerStep is the bytes all ranks send in a step.
	TotalBytesPerStep int64 `json:"total_bytes_per_step,omitempty"`
	// Warnings say which volumes could not be sized and why.
	Warnings []string `json:"warnings,omitempty"`
}

// JobStatus is how a job ended, as JobFinished and PlacementReleased carry
// it (the schema's jobStatus enum). It is a named type so that a finish
// status and a placement state (JobState) cannot be mixed up; on the wire it
// is the plain string.
type JobStatus string

// Job status values of JobFinished and PlacementReleased.
const (
	// StatusSucceeded: the job ran to completion.
	StatusSucceeded JobStatus = "succeeded"
	// StatusFailed: the job stopped with an error.
	StatusFailed JobStatus = "failed"
	// StatusCancelled: the job was stopped by a person, or withdrawn while
	// it still waited for GPUs.
	StatusCancelled JobStatus = "cancelled"
)

// Valid reports whether s is one of the statuses the schema allows.
func (s JobStatus) Valid() bool {
	switch s {
	case StatusSucceeded, StatusFailed, StatusCancelled, StatusLost:
		return true
	}
	return false
}

// JobFinished says a job ended, or was withdrawn while pending
// (jobs.finished). Its GPUs are freed.
type JobFinished struct {
	JobID   string    `json:"job_id"`
	Status  JobStatus `json:"status"`
	Message string    `json:"message,omitempty"`
	// Reason is one of the Reason constants of launch.go, where a
	// launcher or the watchdog finished the job.
	Reason string `json:"reason,omitempty"`
	// Ranks is how each rank ended, where a launcher knows; beyond
	// MaxFinishRanks ranks, only those that did not exit 0 (the first
	// MaxFinishRanks), to bound the event.
	Ranks []RankExit `json:"ranks,omitempty"`
}

// PlacementFinishRefused answers a jobs.finished that names a job but
// cannot be read (placement.finish_refused): a status outside the schema's,
// a body that breaks it, a ce-type of another event. Nothing changed: the
// job keeps its GPUs or its place in the queue until a finish that can be
// read arrives.
type PlacementFinishRefused struct {
	JobID string `json:"job_id"`
	// RequestID is the ce-id of the jobs.finished refused.
	RequestID string `json:"request_id"`
	// Reasons are every field and rule that failed.
	Reasons []Reason `json:"reasons"`
}

// JobState is where a job stands in placement: the state placement keeps
// for each job it knows (the store's Job.State), rebuilt from the placement
// stream. It travels in no event; the client's job history has states of
// its own, read from the streams. The constants carry the type's name
// (JobStateFinished, not JobFinished, which is the event).
type JobState string

// Job states.
const (
	// JobStatePending: the job waits for GPUs; it is retried when GPUs
	// free up or the topology changes (placement.pending).
	JobStatePending JobState = "pending"
	// JobStatePlaced: the job holds GPUs under a decision
	// (placement.decided).
	JobStatePlaced JobState = "placed"
	// JobStateRejected: the job can never be placed as asked, or is invalid
	// (placement.rejected); a new submission with the same id is taken.
	JobStateRejected JobState = "rejected"
	// JobStateFinished: the job ended or was withdrawn and its GPUs are free
	// (jobs.finished, then placement.released).
	JobStateFinished JobState = "finished"
)

// JobStates lists every job state.
var JobStates = []JobState{JobStatePending, JobStatePlaced, JobStateRejected, JobStateFinished}

// Valid reports whether s is one of the job states.
func (s JobState) Valid() bool {
	switch s {
	case JobStatePending, JobStatePlaced, JobStateRejected, JobStateFinished:
		return true
	}
	return false
}

// RankPlacement puts one global rank on a GPU of a node.
type RankPlacement struct {
	Rank      int    `json:"rank"`
	Node      string `json:"node"`
	GPU       int    `json:"gpu"`
	LocalRank int    `json:"local_rank"`
	// UUID of the GPU, where its node reported one.
	UUID string `json:"uuid,omitempty"`
	// NUMA node of the GPU (bind the rank's CPU and memory there); nil
	// when unknown.
	NUMA *int `json:"numa,omitempty"`
	// NIC is the GPU's nearest NIC (for NCCL_IB_HCA), where known.
	NIC string `json:"nic,omitempty"`
}

// NodePlacement is what a launcher needs on one node.
type NodePlacement struct {
	Node               string `json:"node"`
	GPUs               []int  `json:"gpus"`
	CUDAVisibleDevices string `json:"cuda_visible_devices"`
	// Torchrun are the torchrun arguments for this node.
	Torchrun []string `json:"torchrun,omitempty"`
	// SlurmGPUBind is srun's --gpu-bind value for this node's tasks
	// (map_gpu:<gpu of local rank 0>,<of local rank 1>,...).
	SlurmGPUBind string `json:"slurm_gpu_bind,omitempty"`
	// NCCLTopoXML describes the node's chosen GPUs and NICs in NCCL's
	// topology format (for NCCL_TOPO_FILE), where the node's topology is
	// known; left out for jobs on many nodes, to bound the event's size.
	NCCLTopoXML string `json:"nccl_topo_xml,omitempty"`
}

// Launch is what launchers need beyond the per-node entries.
type Launch struct {
	// MasterAddr is the node of rank 0 (torchrun's rendezvous host).
	MasterAddr string `json:"master_addr"`
	// MasterPort is the job's rendezvous port on it, which no other job
	// running with rank 0 on that node has (launch.MasterPort); 0 in
	// decisions made before it was carried.
	MasterPort int `json:"master_port,omitempty"`
	// SlurmNodelist is srun's --nodelist, in node order.
	SlurmNodelist string `json:"slurm_nodelist"`
	// MPIRankfile is an Open MPI rankfile (mpirun --rankfile) that puts
	// each rank on its node in local-rank slots.
	MPIRankfile string `json:"mpi_rankfile"`
}

// PlacementDecided is a gang decision covering every rank of a job
// (placement.decided).
type PlacementDecided struct {
	JobID     string          `json:"job_id"`
	Strategy  string          `json:"strategy"`
	Ranks     []RankPlacement `json:"ranks"`
	Nodes     []NodePlacement `json:"nodes"`
	DecidedAt time.Time       `json:"decided_at"`
	// Launch holds launcher artefacts: torchrun's master, Slurm's
	// nodelist, an Open MPI rankfile.
	Launch *Launch `json:"launch,omitempty"`
	// Prediction is the cost model's prediction for this placement;
	// Baseline the same for the topology-blind first fit on the same
	// cluster state (absent when blind could not place the job now).
	Prediction *Prediction `json:"prediction,omitempty"`
	Baseline   *Prediction `json:"baseline,omitempty"`
	// Warnings are the placement policies' warn results on this placement.
	Warnings []Reason `json:"warnings,omitempty"`
	// Explanation says how the placement was chosen.
	Explanation *Explanation `json:"explanation,omitempty"`
	// Migration is set when the decision moved a running job: it replaces
	// the job's previous decision (see migration.go).
	Migration *Migration `json:"migration,omitempty"`
}

// Explanation says how placement reached its outcome: what it looked at,
// what pruned the rest, and how the candidates scored.
type Explanation struct {
	// PolicyRevision is the policy set in force ("" when none).
	PolicyRevision string `json:"policy_revision,omitempty"`
	// NodesConsidered counts the nodes holding free GPUs of the job's model.
	NodesConsidered int `json:"nodes_considered"`
	// NodesDenied counts, per node-policy rule, the nodes it filtered out.
	NodesDenied []NodeDenial `json:"nodes_denied,omitempty"`
	// NodesReserved counts nodes held back for an older job (see
	// Reservation in the placement package).
	NodesReserved int `json:"nodes_reserved,omitempty"`
	// Levels are the domain levels tried, smallest first, with how many
	// domains of each level could have held the job.
	Levels []LevelCount `json:"levels,omitempty"`
	// Candidates are the placements scored, the chosen one first.
	Candidates []CandidateScore `json:"candidates,omitempty"`
	// FitTrade is topology-aware's weighing of this job's speed against
	// a fast node kept whole for the jobs expected next; nil when none
	// was weighed.
	FitTrade *FitTrade `json:"fit_trade,omitempty"`
	// Backfill is set when the job was placed on nodes held for another
	// (placement's --backfill): expected to end before they drain.
	Backfill *Backfill `json:"backfill,omitempty"`
}

// Backfill says why a job could run on nodes held for a waiting one: its
// expected end (now plus the mean run time learned for its size) is no
// later than the latest expected end of the jobs on them.
type Backfill struct {
	// HeldFor is the job the nodes are held for.
	HeldFor string `json:"held_for"`
	// ExpectedEnd is this job's; DrainedBy the held nodes'.
	ExpectedEnd time.Time `json:"expected_end"`
	DrainedBy   time.Time `json:"drained_by"`
}

// FitTrade is one weighing of a job's step time against a fast shape:
// the fastest one-node placement (on Node) would break a node whose free
// GPUs hold a job of MinGPUs or more; a tighter fit elsewhere (on
// Tighter) is slower but within the fit tolerance. The tighter fit is
// taken (Made) only where the forecast of demand says a job needing the
// shape is likely (Probability ≥ 0.5) before this job ends
// (HorizonSeconds, its expected run time).
type FitTrade struct {
	Made    bool   `json:"made"`
	Node    string `json:"node"`
	Tighter string `json:"tighter"`
	// NodeFree is Node's free GPUs at the decision; MinGPUs the least a
	// job needing the shape asks: more than would be left on Node once
	// broken, and at least this job's GPUs (where it takes the whole
	// node, the jobs as large face the same choice).
	NodeFree int `json:"node_free"`
	MinGPUs  int `json:"min_gpus"`
	// StepSeconds on the fastest placement and on the tighter fit.
	StepSeconds        float64 `json:"step_seconds"`
	TighterStepSeconds float64 `json:"tighter_step_seconds"`
	// HorizonSeconds is this job's expected run time (0: none learned
	// yet, and the trade is made as without a forecast).
	HorizonSeconds float64 `json:"horizon_seconds"`
	// Queued jobs needing the shape, their arrivals expected per hour,
	// the other free shapes like it (Spare) and the running jobs
	// expected to free one within the horizon (Ending).
	Queued          int     `json:"queued"`
	ArrivalsPerHour float64 `json:"arrivals_per_hour"`
	Spare           int     `json:"spare"`
	Ending          int     `json:"ending"`
	Probability     float64 `json:"probability"`
	// JobCostSeconds is what the tighter fit costs this job: its run
	// longer by the step times' ratio. OthersCostSeconds is what breaking
	// the shape is expected to cost the jobs needing it: those expected to
	// find none, each waiting half the horizon.
	JobCostSeconds    float64 `json:"job_cost_seconds"`
	OthersCostSeconds float64 `json:"others_cost_seconds"`
}

// NodeDenial counts the nodes one node-policy rule denied.
type NodeDenial struct {
	Policy string `json:"policy"`
	Code   string `json:"code"`
	// Example is the message of one of the denials.
	Example string `json:"example"`
	Nodes   int    `json:"nodes"`
}

// LevelCount is one level of domains (island, pcie, numa, node, leaf, pod,
// core, cluster) and how many of its domains had room for the job.
type LevelCount struct {
	Level   string `json:"level"`
	Domains int    `json:"domains"`
	Fitting int    `json:"fitting"`
}

// CandidateScore is one candidate placement and how it fared.
type CandidateScore struct {
	// Domain is the smallest domain holding the candidate, such as
	// leaf/l3 or node/dgx-001 (cluster when it spans the whole fabric).
	Domain string `json:"domain"`
	Nodes  int    `json:"nodes"`
	Leaves int    `json:"leaves,omitempty"`
	// CommSecondsPerStep is the cost model's prediction.
	CommSecondsPerStep float64 `json:"comm_seconds_per_step"`
	// Score is the placement policies' score (a penalty, added to Cost).
	Score float64 `json:"score,omitempty"`
	// Cost ranks the candidates: comm time relative to the fastest
	// candidate (1 is the fastest) plus Score.
	Cost float64 `json:"cost"`
	// Outcome is chosen, denied (by a policy; see Reasons) or costlier.
	Outcome string   `json:"outcome"`
	Reasons []Reason `json:"reasons,omitempty"`
}

// Candidate outcomes.
const (
	OutcomeChosen   = "chosen"
	OutcomeDenied   = "denied"
	OutcomeCostlier = "costlier"
)

// Counterfactual names a change under which a waiting or rejected job
// would fit.
type Counterfactual struct {
	// Kind is policy (a policy would have to allow it), jobs_finish (the
	// jobs listed would have to finish) or capacity (more GPUs are needed
	// than the cluster has, or the cluster less its unhealthy parts).
	Kind    string `json:"kind"`
	Message string `json:"message"`
	// Policy is the policy package that stands in the way, for kind policy.
	Policy string `json:"policy,omitempty"`
	// Jobs are the running jobs whose end would let the job fit, for kind
	// jobs_finish.
	Jobs []string `json:"jobs,omitempty"`
}

// Counterfactual kinds.
const (
	CounterfactualPolicy     = "policy"
	CounterfactualJobsFinish = "jobs_finish"
	CounterfactualCapacity   = "capacity"
)

// Prediction is a placement's predicted communication per training step.
type Prediction struct {
	Strategy           string  `json:"strategy"`
	CommSecondsPerStep float64 `json:"comm_seconds_per_step"`
	// CommFraction and SpeedUp need the job's step_compute_seconds.
	CommFraction float64           `json:"comm_fraction,omitempty"`
	SpeedUp      float64           `json:"speed_up,omitempty"`
	Groups       []GroupPrediction `json:"groups,omitempty"`
	// ComputeSecondsPerStep is the job's compute per step on GPUModel,
	// the slowest GPU model of the placement, where placement weighs
	// compute by GPU model (its CommFraction and SpeedUp are then on that
	// model); 0 where it does not.
	ComputeSecondsPerStep float64 `json:"compute_seconds_per_step,omitempty"`
	GPUModel              string  `json:"gpu_model,omitempty"`
	// ComputeCorrection is the measured correction of the speed table's
	// compute time that ComputeSecondsPerStep includes (the online compute
	// calibration's), where one is in force; nil where none is.
	ComputeCorrection *ComputeCorrection `json:"compute_correction,omitempty"`
}

// ComputeCorrection is what a calibration's compute factors made of a
// prediction's compute time.
type ComputeCorrection struct {
	// Factor is what the speed table's time was multiplied by: the GPU
	// model's factor over that of the model the job's time was scaled
	// from.
	Factor float64 `json:"factor"`
	// Samples are the runs the factor was measured from, Set the
	// calibration set that carries it ("online": the optimizer's).
	Samples int    `json:"samples"`
	Set     string `json:"set,omitempty"`
}

// GroupPrediction is one kind of group's predicted time per step (the
// slowest of its groups, which run side by side).
type GroupPrediction struct {
	Name           string  `json:"name"`
	Algorithm      string  `json:"algorithm"`
	SecondsPerStep float64 `json:"seconds_per_step"`
}

// Reason explains a rejection or a wait. Field names the job field to blame,
// as a JSON path such as "parallelism.tp", where one is.
type Reason struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	Field   string `json:"field,omitempty"`
	// Policy is the policy package the reason comes from, where it does.
	Policy string `json:"policy,omitempty"`
}

// PlacementPending says a job waits for GPUs (placement.pending); it is
// retried when GPUs free up or the topology changes.
type PlacementPending struct {
	JobID   string   `json:"job_id"`
	Reasons []Reason `json:"reasons"`
	// Counterfactuals say what would let the job fit, where placement
	// found something.
	Counterfactuals []Counterfactual `json:"counterfactuals,omitempty"`
	// Explanation says what placement looked at, when it got that far.
	Explanation *Explanation `json:"explanation,omitempty"`
	// Turn is the job's place in the queue, where placement orders it by
	// expected work or ends (--queue-order expected-work, expected-end).
	Turn *QueueTurn `json:"turn,omitempty"`
}

// QueueTurn is a waiting job's place in placement's queue: jobs of one
// priority are tried in the order of At, the job's first wait plus its
// expected run time weighed by its share of a node (expected work) or not
// (expected end), so that a small, short job does not wait behind every
// large or long one that came before it, and no job waits behind one that
// came more than its own weighed run time after it.
type QueueTurn struct {
	At time.Time `json:"at"`
	// ExpectedRunSeconds is the run time learned then for jobs of its
	// size (0: none learned yet, and At is when it first waited).
	ExpectedRunSeconds float64 `json:"expected_run_seconds"`
	// NodeShare, ordered by expected work (--queue-order expected-work),
	// is the job's GPUs over the most GPUs of its model on one node: At
	// is its first wait plus ExpectedRunSeconds times NodeShare. Absent
	// when ordered by expected ends (a share of 1).
	NodeShare float64 `json:"node_share,omitempty"`
}

// PlacementRejected says a job can never be placed or is invalid
// (placement.rejected). Every reason found is listed.
type PlacementRejected struct {
	JobID   string   `json:"job_id"`
	Reasons []Reason `json:"reasons"`
	// Counterfactuals say what would let the job fit, where placement
	// found something.
	Counterfactuals []Counterfactual `json:"counterfactuals,omitempty"`
	// Explanation says what placement looked at, when it got that far.
	Explanation *Explanation `json:"explanation,omitempty"`
}

// PlacementTerm opens a placement replica's term as the single applier:
// the replica publishes it when it takes the lease, before it rebuilds from
// the stream, and publishes every outcome of the term expecting this event
// to still be the last on its subject. A replica whose term has been
// followed by another's is thereby refused by JetStream itself: it cannot
// write a decision after a newer leader has started, whatever it believes
// about its lease (fencing).
type PlacementTerm struct {
	// Holder is the replica that leads the term.
	Holder string `json:"holder"`
	// LeaseRevision is the revision of the lease entry it took (0 for a
	// replica that runs without a lease).
	LeaseRevision uint64    `json:"lease_revision"`
	StartedAt     time.Time `json:"started_at"`
}

// PlacementReleased records that a job's GPUs were freed
// (placement.released). Placement publishes it so that its own stream is a
// complete, ordered log of allocations from which any replica rebuilds.
type PlacementReleased struct {
	JobID  string          `json:"job_id"`
	Status JobStatus       `json:"status"`
	Nodes  []NodePlacement `json:"nodes,omitempty"`
	// Reason is the jobs.finished's reason (agent_lost, ...), where it
	// gave one.
	Reason string `json:"reason,omitempty"`
	// Tenant is the tenant whose finish withdrew a job placement had not
	// seen yet: the withdrawal holds for that tenant's job of this id
	// alone, so that no tenant can withdraw another's job before it comes.
	Tenant string `json:"tenant,omitempty"`
}

// GPU health values.
const (
	HealthHealthy   = "healthy"
	HealthUnhealthy = "unhealthy"
)

// GPU describes one GPU of a node.
type GPU struct {
	Index     int    `json:"index"`
	UUID      string `json:"uuid,omitempty"`
	BusID     string `json:"bus_id,omitempty"`
	Model     string `json:"model,omitempty"`
	MemoryMiB int    `json:"memory_mib,omitempty"`
	// NUMA is the GPU's NUMA node; nil when unknown.
	NUMA        *int   `json:"numa,omitempty"`
	CPUAffinity string `json:"cpu_affinity,omitempty"`
	MIG         bool   `json:"mig,omitempty"`
	Health      string `json:"health,omitempty"`
}

// NIC describes one network interface of a node.
type NIC struct {
	Name     string  `json:"name"`
	BusID    string  `json:"bus_id,omitempty"`
	RateGbps float64 `json:"rate_gbps,omitempty"`
	RDMA     bool    `json:"rdma,omitempty"`
	// Transport is efa or tcp where NCCL's traffic does not go over
	// InfiniBand or RoCE (topology.NIC.Transport).
	Transport string `json:"transport,omitempty"`
	// NUMA is the NIC's NUMA node; nil when unknown.
	NUMA   *int   `json:"numa,omitempty"`
	Health string `json:"health,omitempty"`
}

// TopologyNode is one node's report (topology.node.<node>): the newest per
// node is its current description.
type TopologyNode struct {
	Name string `json:"name"`
	// Position is the node's place in enumeration order (the order of the
	// cluster file); the blind baseline fills nodes in this order.
	Position int               `json:"position"`
	GPUModel string            `json:"gpu_model,omitempty"`
	GPUs     []GPU             `json:"gpus"`
	Labels   map[string]string `json:"labels,omitempty"`
	// Removed withdraws the node from placement.
	Removed bool `json:"removed,omitempty"`

	// The node's inner topology, where a source describes it.
	NICs []NIC `json:"nics,omitempty"`
	// GPUPaths[i][j] is the path class between GPUs[i] and GPUs[j] as
	// nvidia-smi prints it: X, NV#, NVB, PIX, PXB, PHB, NODE, SYS.
	GPUPaths [][]string `json:"gpu_paths,omitempty"`
	// NICPaths[i][k] is the path class between GPUs[i] and NICs[k].
	NICPaths   [][]string `json:"nic_paths,omitempty"`
	NVSwitches int        `json:"nvswitches,omitempty"`
	NVLinkGen  int        `json:"nvlink_gen,omitempty"`
	PCIeGen    int        `json:"pcie_gen,omitempty"`
	// P2P[i][j] is whether GPUs[i] can use CUDA peer-to-peer to GPUs[j]
	// as nvidia-smi topo -p2p prints it (X, OK, NS, CNS, GNS, TNS, DRK,
	// U); absent where the source did not say (P2P is then assumed).
	P2P [][]string `json:"p2p,omitempty"`
	// CPU is the host's processor where the source says (NCCL XML): it
	// decides NCCL's P2P level and its inter-socket bandwidth.
	CPU *CPU `json:"cpu,omitempty"`
	// Source names where the description came from (a file, nvml).
	Source string `json:"source,omitempty"`
	// Warnings say what the source lacked.
	Warnings []string `json:"warnings,omitempty"`
	// Inferred are facts worked out rather than read (an NVLink
	// generation from NV18 on every pair, say), each with its ground.
	Inferred []string `json:"inferred,omitempty"`
}

// CPU is a node's host processor as NCCL's topology XML gives it.
type CPU struct {
	Arch   string `json:"arch,omitempty"`
	Vendor string `json:"vendor,omitempty"`
	Family int    `json:"family,omitempty"`
	Model  int    `json:"model,omitempty"`
}

// Switch is one fabric switch and what hangs below it. Rates are in Gb/s
// (as NIC.RateGbps and InfiniBand or Ethernet speeds are quoted); zero
// means unknown.
type Switch struct {
	Name string `json:"name"`
	// Tier is leaf, spine or core, or nvlink for a multi-node NVLink
	// domain (a GB200 NVL72 rack) whose nodes' GPUs share NVLink.
	Tier     string   `json:"tier"`
	Nodes    []string `json:"nodes,omitempty"`
	Switches []string `json:"switches,omitempty"`
	// LinkGbps is the rate of each link from this switch down to a child:
	// for a leaf, the links to the nodes' NICs.
	LinkGbps float64 `json:"link_gbps,omitempty"`
	// Uplinks counts the links from this switch up to its parents; 0 when
	// unknown.
	Uplinks int `json:"uplinks,omitempty"`
	// UplinkGbps is the rate of each of those links.
	UplinkGbps float64 `json:"uplink_gbps,omitempty"`
	// Oversubscription is the ratio of the switch's down capacity to its up
	// capacity (at least 1); 0 or absent means 1, non-blocking.
	Oversubscription float64 `json:"oversubscription,omitempty"`
	// Rail is, in a rail-optimized fabric, the rail a leaf serves: NIC k of
	// every node below it is wired to the leaf of rail k, so a node is
	// below one leaf per rail. Nil for a leaf that serves whole nodes.
	Rail *int `json:"rail,omitempty"`
	// NVLinks, for an nvlink domain, is the number of NVLinks between any
	// two of its GPUs (18 on GB200 NVL72).
	NVLinks int `json:"nvlinks,omitempty"`
}

// TopologyFabric describes the network between nodes (topology.fabric).
type TopologyFabric struct {
	Cluster  string   `json:"cluster"`
	Switches []Switch `json:"switches"`
	// Warnings say what an importer accepted but found odd (a node listed
	// under two leaves, of which the first was kept), for people to read.
	Warnings []string `json:"warnings,omitempty"`
}

// Health component kinds.
const (
	ComponentGPU    = "gpu"
	ComponentNVLink = "nvlink"
	ComponentNIC    = "nic"
	ComponentNode   = "node"
)

// TopologyHealth reports a change of health of one part of a node
// (topology.health.<node>). A part stays as last reported.
type TopologyHealth struct {
	Node       string    `json:"node"`
	Component  string    `json:"component"`
	ID         string    `json:"id,omitempty"`
	Health     string    `json:"health"`
	Reason     string    `json:"reason,omitempty"`
	ObservedAt time.Time `json:"observed_at"`
}

// TopologyHeld lists the GPUs of a node that something outside toposched
// holds (topology.held.<node>): the devices another scheduler allocated to
// its own Kubernetes ResourceClaims. Each report replaces the node's last
// one, so the stream's newest message per node is the whole state; an empty
// list gives them all back. Placement never gives a held GPU to a job.
type TopologyHeld struct {
	Node       string    `json:"node"`
	GPUs       []HeldGPU `json:"gpus,omitempty"`
	ObservedAt time.Time `json:"observed_at"`
}

// HeldGPU is one GPU held outside toposched, and by what.
type HeldGPU struct {
	Index int `json:"index"`
	// By names the holder, such as "claim team-a/trainer-0-gpus-x7k2p".
	By string `json:"by"`
}

// jobIDPattern is the shape of a job id, as in the schema: safe in NATS
// headers, file names and Slurm job names.
var jobIDPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$`)

// ValidJobID reports whether id has the shape of a job id.
func ValidJobID(id string) bool { return jobIDPattern.MatchString(id) }
