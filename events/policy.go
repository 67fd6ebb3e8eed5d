package events

import "time"

// Where a policy set came from, in PolicyApplied.Source and
// PolicyRejected.Source.
const (
	// PolicySourceDefault is the shipped set, compiled into the binary.
	PolicySourceDefault = "default"
	// PolicySourceDirectory is a directory given with --policies.
	PolicySourceDirectory = "directory"
	// PolicySourceKV is a set pushed to the NATS KV bucket (topoctl
	// policy push).
	PolicySourceKV = "kv"
)

// PolicyApplied says a placement replica put a policy set in force. Each
// replica publishes its own, so a push is answered once per replica.
type PolicyApplied struct {
	// Revision is the SHA-256 of the set's files (names and contents), hex:
	// the same for the same files wherever they are compiled.
	Revision string `json:"revision"`
	// Name is the set's name: its directory, "default", or the name it was
	// pushed under.
	Name string `json:"name"`
	// Source is default, directory or kv.
	Source string `json:"source"`
	// KVRevision is the KV entry's revision for a pushed set; 0 otherwise.
	KVRevision uint64 `json:"kv_revision,omitempty"`
	// Files are the set's .rego files and data file, sorted.
	Files []string `json:"files"`
	// TestsPassed is how many of the set's Rego tests passed (all of them
	// did, or the set would have been refused).
	TestsPassed int `json:"tests_passed"`
	// Previous is the revision the set replaced; empty when there was none.
	Previous string `json:"previous,omitempty"`
	// Replica names the process that put the set in force.
	Replica string `json:"replica"`
	// AppliedAt is when it was put in force.
	AppliedAt time.Time `json:"applied_at"`
}

// PolicyError is one reason a policy set was refused: a file that does not
// parse or compile, a forbidden built-in, a failed Rego test.
type PolicyError struct {
	// File is the path inside the set; empty when no file is to blame.
	File string `json:"file"`
	// Line is 1-based; 0 when unknown.
	Line int `json:"line"`
	// Message says what is wrong.
	Message string `json:"message"`
	// Code is OPA's error code (rego_parse_error, rego_type_error, ...) or
	// one of test_failed, test_error, data_error, io_error, bundle_error.
	Code string `json:"code"`
}

// PolicyRejected says a policy set was refused; the set in force before it
// stays. Replicas that refuse the same value of the same source publish the
// same event id, so JetStream keeps one.
type PolicyRejected struct {
	// Revision is the refused set's revision (see PolicyApplied.Revision);
	// for a pushed value that is not a bundle at all, the SHA-256 of the
	// value.
	Revision string `json:"revision"`
	// Name is the set's name, as in PolicyApplied.
	Name string `json:"name"`
	// Source is default, directory or kv.
	Source string `json:"source"`
	// KVRevision is the KV entry's revision for a pushed set; 0 otherwise.
	KVRevision uint64 `json:"kv_revision,omitempty"`
	// Errors are every reason, in file and line order.
	Errors []PolicyError `json:"errors"`
	// InForce is the revision that stays in force; empty when none is.
	InForce string `json:"in_force,omitempty"`
	// Replica names the process that reported it (the first of those that
	// did: the others' copies are dropped as duplicates).
	Replica string `json:"replica"`
	// RejectedAt is when it was refused.
	RejectedAt time.Time `json:"rejected_at"`
}

// Where a cost-model calibration came from, in CalibrationApplied.Source
// and CalibrationRejected.Source.
const (
	// CalibrationSourceDefault is the model's documented efficiencies.
	CalibrationSourceDefault = "default"
	// CalibrationSourceFile is a file given with --calibration.
	CalibrationSourceFile = "file"
	// CalibrationSourceKV is a set in the calibration KV bucket, pushed
	// with topoctl calibration push or moved there by the optimizer's
	// online calibration.
	CalibrationSourceKV = "kv"
)

// LinkEfficiency is the share of line rate each kind of link achieves,
// the per-step overhead and the overhead of a call, of the calibration in
// force (every value resolved: the defaults where the set leaves one out;
// a call's is 0 unless fitted).
type LinkEfficiency struct {
	NVLink         float64 `json:"nvlink"`
	NVLS           float64 `json:"nvls"`
	PCIe           float64 `json:"pcie"`
	Net            float64 `json:"net"`
	EFA            float64 `json:"efa"`
	TCP            float64 `json:"tcp"`
	StepOverheadUS float64 `json:"step_overhead_us"`
	OpOverheadUS   float64 `json:"op_overhead_us,omitempty"`
}

// CalibrationApplied says a replica's cost model now predicts with a
// calibration set: placement's choices and predictions and the optimizer's
// tuning and diagnoses. Each replica publishes its own.
type CalibrationApplied struct {
	// Revision is the SHA-256 of the set's file or value, hex; "default"
	// for the documented efficiencies.
	Revision string `json:"revision"`
	// Name is the set's name, as written by model calibrate ("online"
	// for the optimizer's moves).
	Name string `json:"name"`
	// Source is default, file or kv.
	Source string `json:"source"`
	// KVRevision is the KV entry's revision; 0 otherwise.
	KVRevision uint64         `json:"kv_revision,omitempty"`
	Efficiency LinkEfficiency `json:"efficiency"`
	// Models are the efficiencies on nodes of a GPU model, by model, where
	// the set has them (each resolved over Efficiency).
	Models map[string]LinkEfficiency `json:"models,omitempty"`
	// Compute are the GPU models' compute factors in force (measured
	// compute over the speed table's), by model, where the set has them
	// (the optimizer's online compute calibration).
	Compute map[string]float64 `json:"compute,omitempty"`
	// Previous is the revision it replaced; empty at start-up.
	Previous string `json:"previous,omitempty"`
	// Services are the services of this replica that use it (placement,
	// optimizer).
	Services []string `json:"services"`
	Replica  string   `json:"replica"`
	// AppliedAt is when it was put in force.
	AppliedAt time.Time `json:"applied_at"`
}

// CalibrationError is one reason a calibration set was refused.
type CalibrationError struct {
	// Line is 1-based; 0 when no line is to blame.
	Line int `json:"line"`
	// Field is the JSON path of the refused value (efficiency.nvlink);
	// empty for the value as a whole.
	Field   string `json:"field,omitempty"`
	Message string `json:"message"`
}

// CalibrationRejected says a calibration set was refused; the set in
// force stays. Replicas refusing the same entry publish the same event id.
type CalibrationRejected struct {
	// Revision is the refused value's SHA-256, hex.
	Revision string `json:"revision"`
	// Name is the set's name where it could be read, else "unknown".
	Name       string `json:"name"`
	Source     string `json:"source"`
	KVRevision uint64 `json:"kv_revision,omitempty"`
	// Errors are every reason, in line order.
	Errors []CalibrationError `json:"errors"`
	// InForce is the revision that stays in force.
	InForce    string    `json:"in_force"`
	Replica    string    `json:"replica"`
	RejectedAt time.Time `json:"rejected_at"`
}
