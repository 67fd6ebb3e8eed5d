package events

import "time"

// The runtime domain: what the optimizer tells a running job, what the job
// reports back, and what the optimizer makes of it.
//
//   - runtime.tuning: for every placement.decided, the NCCL and binding
//     settings the cost model justifies for that placement, as
//     environment a launcher applies without reading anything else.
//   - runtime.telemetry: a running job's measured step, compute and
//     per-group communication times (see deploy/examples/telemetry).
//   - runtime.diagnosis: the optimizer's finding when telemetry and
//     prediction are compared, published when the finding changes.

// Tuning kinds, in Recommendation.Kind.
const (
	// TuningAlgorithm: an NCCL algorithm and protocol (NCCL_ALGO,
	// NCCL_PROTO) other than the one NCCL's own tuner would pick.
	TuningAlgorithm = "nccl_algorithm"
	// TuningBucket: a gradient bucket size that hides the all-reduce's
	// latency term (TOPOSCHED_BUCKET_CAP_MB).
	TuningBucket = "bucket_size"
	// TuningNIC: each rank pinned to its GPU's nearest NIC (NCCL_IB_HCA).
	TuningNIC = "nic_affinity"
)

// Env variables of runtime.tuning that are not NCCL's: the training
// script or launcher reads them.
const (
	// EnvBucketCapMB is the DDP bucket size (DistributedDataParallel's
	// bucket_cap_mb) or FSDP's minimum wrapped size, in MiB.
	EnvBucketCapMB = "TOPOSCHED_BUCKET_CAP_MB"
	// EnvNUMANode is the NUMA node a rank binds its CPUs and memory to
	// (numactl --cpunodebind=N --membind=N).
	EnvNUMANode = "TOPOSCHED_NUMA_NODE"
	// EnvNumactl is the numactl arguments that bind a rank, for launchers
	// that prefix the rank's command with numactl.
	EnvNumactl = "TOPOSCHED_NUMACTL"
)

// TuningEnv is environment for a job's ranks, by scope: a launcher sets
// All, then Nodes[node], then Ranks[rank] (the global rank in decimal),
// each overriding the one before. Values are strings, as in a process's
// environment.
type TuningEnv struct {
	All   map[string]string            `json:"all,omitempty"`
	Nodes map[string]map[string]string `json:"nodes,omitempty"`
	Ranks map[string]map[string]string `json:"ranks,omitempty"`
}

// TuningFile is a file a launcher writes on a node before starting its
// ranks, because an env value names it (NCCL_TOPO_FILE).
type TuningFile struct {
	Node    string `json:"node"`
	Path    string `json:"path"`
	Content string `json:"content"`
}

// ByteRange is a range of message sizes in bytes, both ends included.
type ByteRange struct {
	Min int64 `json:"min"`
	Max int64 `json:"max"`
}

// Recommendation is one setting the cost model justifies, with what it
// gains.
type Recommendation struct {
	// Group is the group kind it is for: a parallel dimension (dp, tp,
	// ...) or a custom group's name.
	Group      string `json:"group"`
	Collective string `json:"collective"`
	// BytesRange is the message sizes over which the choice holds: where
	// the recommended algorithm and protocol stay the best of those the
	// settings allow, around the group's own message size.
	BytesRange ByteRange `json:"bytes_range"`
	// Algorithm and Protocol are what the group runs under the settings
	// (ring, tree, nvls; ll, ll128, simple).
	Algorithm string `json:"algorithm"`
	Protocol  string `json:"protocol"`
	// Kind is one of the Tuning constants.
	Kind string `json:"kind"`
	// Settings are the env variables the recommendation sets.
	Settings []string `json:"settings"`
	// DefaultAlgorithm and DefaultProtocol are what NCCL's own tuner
	// would pick (see the optimizer's tuning doc), where they differ.
	DefaultAlgorithm string `json:"default_algorithm,omitempty"`
	DefaultProtocol  string `json:"default_protocol,omitempty"`
	Reason           string `json:"reason"`
	// PredictedGainSeconds is the time per training step the setting
	// saves, by the cost model: always positive.
	PredictedGainSeconds float64 `json:"predicted_gain_seconds"`
}

// TunedGroup is one group kind's predicted communication under the tuned
// settings: what telemetry is compared with.
type TunedGroup struct {
	// Name is the group kind (dp, tp, ...), as in Recommendation.Group.
	Name       string `json:"name"`
	Collective string `json:"collective"`
	// Members is how many groups of this kind run side by side, each of
	// Ranks ranks.
	Members      int    `json:"members"`
	Ranks        int    `json:"ranks"`
	Bytes        int64  `json:"bytes"`
	CallsPerStep int    `json:"calls_per_step"`
	Algorithm    string `json:"algorithm"`
	Protocol     string `json:"protocol"`
	// SecondsPerStep is the predicted time of all calls of a step;
	// BusBWGBps the nccl-tests bus bandwidth of one call.
	SecondsPerStep float64 `json:"seconds_per_step"`
	BusBWGBps      float64 `json:"busbw_gbps"`
}

// RuntimeTuning is the settings for a decided job (runtime.tuning). It is
// published for every placement.decided, also when nothing beats NCCL's
// defaults (no recommendation, bindings only), so a launcher can wait for
// it.
type RuntimeTuning struct {
	JobID string `json:"job_id"`
	// DecidedAt is the decision's decided_at: a migrated job is tuned
	// again, and a launcher takes the tuning of the decision it starts.
	DecidedAt time.Time `json:"decided_at"`
	// NCCLVersion is the oldest NCCL that reads the settings (the
	// per-collective NCCL_ALGO and NCCL_PROTO syntax came with 2.24).
	NCCLVersion string    `json:"nccl_version"`
	Env         TuningEnv `json:"env"`
	// Files are written by the launcher on each node before its ranks
	// start.
	Files           []TuningFile     `json:"files,omitempty"`
	Recommendations []Recommendation `json:"recommendations"`
	// Notes say why settings were left out (for people).
	Notes  []string     `json:"notes,omitempty"`
	Groups []TunedGroup `json:"groups,omitempty"`
	// PredictedCommSecondsPerStep is the step's communication under the
	// settings; DefaultCommSecondsPerStep under NCCL's own choices.
	PredictedCommSecondsPerStep float64 `json:"predicted_comm_seconds_per_step"`
	DefaultCommSecondsPerStep   float64 `json:"default_comm_seconds_per_step"`
}

// Telemetry bounds: a message beyond them is refused (dead letters).
const (
	MaxTelemetryGroups = 64
	MaxTelemetryRanks  = 4096
)

// GroupTelemetry is one group's measured communication in a step. A group
// gives Seconds, BusBWGBps or both.
type GroupTelemetry struct {
	// Group is the group kind (dp, tp, ...) as in runtime.tuning's
	// groups; the slowest member's figures when several run side by side.
	Group      string `json:"group"`
	Collective string `json:"collective,omitempty"`
	// Seconds is the time of the group's calls in the step (summed).
	Seconds float64 `json:"seconds,omitempty"`
	// BusBWGBps is the measured nccl-tests bus bandwidth of one call.
	BusBWGBps float64 `json:"busbw_gbps,omitempty"`
	// Bytes and Calls are the message size and calls measured.
	Bytes int64 `json:"bytes,omitempty"`
	Calls int   `json:"calls,omitempty"`
}

// RankTelemetry is optional per-rank detail.
type RankTelemetry struct {
	Rank int    `json:"rank"`
	Node string `json:"node,omitempty"`
	// NIC is the HCA the rank's NCCL uses (its NCCL_IB_HCA, or what
	// NCCL_DEBUG=INFO printed).
	NIC    string  `json:"nic,omitempty"`
	TxGBps float64 `json:"tx_gbps,omitempty"`
	RxGBps float64 `json:"rx_gbps,omitempty"`
}

// RuntimeTelemetry is what a running job measured over a step
// (runtime.telemetry); a job reports every few steps.
type RuntimeTelemetry struct {
	JobID string `json:"job_id"`
	Step  int64  `json:"step"`
	// StepSeconds is the wall time of the step; ComputeSeconds the part
	// spent computing (forward and backward without waiting on
	// communication).
	StepSeconds    float64          `json:"step_seconds"`
	ComputeSeconds float64          `json:"compute_seconds"`
	Groups         []GroupTelemetry `json:"groups,omitempty"`
	Ranks          []RankTelemetry  `json:"ranks,omitempty"`
	// ReportedAt is when the reporter measured it.
	ReportedAt *time.Time `json:"reported_at,omitempty"`
}

// Findings of a diagnosis.
const (
	FindingAsPredicted  = "as_predicted"
	FindingComputeBound = "compute_bound"
	FindingLinkDegraded = "link_degraded"
	FindingCongestion   = "congestion"
	FindingNICAffinity  = "nic_affinity"
	// FindingUnexplained: slower than predicted, and none of the causes
	// above is seen.
	FindingUnexplained = "unexplained"
)

// GroupEvidence compares one group's measured and predicted communication.
type GroupEvidence struct {
	Group            string  `json:"group"`
	MeasuredSeconds  float64 `json:"measured_seconds"`
	PredictedSeconds float64 `json:"predicted_seconds"`
	// Ratio is measured over predicted time (2: twice as slow).
	Ratio              float64 `json:"ratio"`
	MeasuredBusBWGBps  float64 `json:"measured_busbw_gbps,omitempty"`
	PredictedBusBWGBps float64 `json:"predicted_busbw_gbps,omitempty"`
}

// SharedLink is a link of the job's placement that other live jobs use too.
type SharedLink struct {
	// Link names it as the cost model does: uplink:<leaf>, nic:<node>:<nic>.
	Link string   `json:"link"`
	Jobs []string `json:"jobs"`
}

// NICEvidence is a rank whose NIC is not the recommended one.
type NICEvidence struct {
	Rank        int    `json:"rank"`
	Node        string `json:"node"`
	Recommended string `json:"recommended"`
	Reported    string `json:"reported"`
}

// DiagnosisEvidence is what a finding rests on.
type DiagnosisEvidence struct {
	MeasuredStepSeconds    float64 `json:"measured_step_seconds"`
	MeasuredComputeSeconds float64 `json:"measured_compute_seconds"`
	// MeasuredCommSeconds is the step less its compute: the communication
	// not hidden behind compute.
	MeasuredCommSeconds  float64 `json:"measured_comm_seconds"`
	PredictedCommSeconds float64 `json:"predicted_comm_seconds"`
	// Ratio is the slowest group's measured over predicted time (or, with
	// no group figures, measured over predicted communication).
	Ratio float64 `json:"ratio"`
	// CommFraction is measured communication over the step.
	CommFraction  float64          `json:"comm_fraction"`
	Groups        []GroupEvidence  `json:"groups,omitempty"`
	SharedLinks   []SharedLink     `json:"shared_links,omitempty"`
	NeighbourJobs []string         `json:"neighbour_jobs,omitempty"`
	Health        []TopologyHealth `json:"health,omitempty"`
	NICs          []NICEvidence    `json:"nics,omitempty"`
	// ExplainedSeconds is the prediction with the cause found taken into
	// account (the neighbours' load on shared links, the degraded links,
	// the farther NICs); 0 where the model cannot say.
	ExplainedSeconds float64 `json:"explained_seconds,omitempty"`
}

// RuntimeDiagnosis is the optimizer's finding on a running job
// (runtime.diagnosis), published when it changes.
type RuntimeDiagnosis struct {
	JobID   string `json:"job_id"`
	Finding string `json:"finding"`
	// Previous is the finding this one replaces; empty for the first.
	Previous string `json:"previous,omitempty"`
	Message  string `json:"message"`
	// Step is the telemetry's step the finding was made on.
	Step        int64             `json:"step"`
	Evidence    DiagnosisEvidence `json:"evidence"`
	DiagnosedAt time.Time         `json:"diagnosed_at"`
}
