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
