package events

import (
	"fmt"
	"net/url"
	"strings"
	"unicode/utf8"
)

// DefaultPrefix is the first subject token of every toposched event.
const DefaultPrefix = "toposched"

// Name is the wire name of an event, stable across Go renames.
type Name string

// The catalogue. Renaming a Go type never changes these.
const (
	NameJobSubmitted      Name = "jobs.submitted"
	NameJobAnalyzed       Name = "jobs.analyzed"
	NameJobFinished       Name = "jobs.finished"
	NamePlacementDecided  Name = "placement.decided"
	NamePlacementPending  Name = "placement.pending"
	NamePlacementRejected Name = "placement.rejected"
	NamePlacementReleased Name = "placement.released"
	NamePlacementTerm     Name = "placement.term"
	// NamePlacementFinishRefused answers a jobs.finished that names a job
	// but cannot be read.
	NamePlacementFinishRefused Name = "placement.finish_refused"
	NameTopologyNode           Name = "topology.node"
	NameTopologyFabric         Name = "topology.fabric"
	NameTopologyHealth         Name = "topology.health"
	// NameTopologyHeld lists the GPUs of a node held outside toposched
	// (another scheduler's Kubernetes ResourceClaims).
	NameTopologyHeld   Name = "topology.held"
	NamePolicyApplied  Name = "policy.applied"
	NamePolicyRejected Name = "policy.rejected"
	// The cost model's calibration sets, applied and refused (policy.go).
	NameCalibrationApplied  Name = "policy.calibration_applied"
	NameCalibrationRejected Name = "policy.calibration_rejected"

	// Migration (migration.go).
	NamePlacementMigration        Name = "placement.migration"
	NamePlacementMigrationRefused Name = "placement.migration_refused"
	NameJobMigrationAccepted      Name = "jobs.migration_accepted"

	// Runtime (runtime.go).
	NameRuntimeTuning    Name = "runtime.tuning"
	NameRuntimeTelemetry Name = "runtime.telemetry"
	NameRuntimeDiagnosis Name = "runtime.diagnosis"

	// Launch (launch.go).
	NameAgentHeartbeat Name = "agent.heartbeat"
	NameRankLog        Name = "runtime.rank_log"
	NameRanksExited    Name = "runtime.ranks_exited"
)

// Version is the schema version carried in every ce-type.
const Version = "v1"

// Catalogue lists every event name, in documentation order.
var Catalogue = []Name{
	NameJobSubmitted, NameJobAnalyzed, NameJobFinished,
	NamePlacementDecided, NamePlacementPending, NamePlacementRejected, NamePlacementReleased,
	NamePlacementTerm, NamePlacementFinishRefused,
	NameTopologyNode, NameTopologyFabric, NameTopologyHealth, NameTopologyHeld,
	NamePolicyApplied, NamePolicyRejected, NameCalibrationApplied, NameCalibrationRejected,
	NamePlacementMigration, NameJobMigrationAccepted, NamePlacementMigrationRefused,
	NameRuntimeTuning, NameRuntimeTelemetry, NameRuntimeDiagnosis,
	NameAgentHeartbeat, NameRankLog, NameRanksExited,
}

// NodeScoped reports whether the event's subject ends in a node token:
// what a node says of itself, so that a stream can keep each node's newest
// report and NATS permissions can let a node's agent speak for its node
// alone (scope.go).
func (n Name) NodeScoped() bool {
	switch n {
	case NameTopologyNode, NameTopologyHealth, NameTopologyHeld, NameAgentHeartbeat, NameRanksExited, NameRankLog:
		return true
	}
	return false
}

// Domain is the stream domain of the event, the first token of its name.
// It is looked up, not cut from the name, so that the catalogue states each
// event's stream once (TestNameDomain checks the two agree). A name outside
// the catalogue gets its first token, as a subject of it would travel on.
func (n Name) Domain() Domain {
	switch n {
	case NameJobSubmitted, NameJobAnalyzed, NameJobFinished, NameJobMigrationAccepted:
		return DomainJobs
	case NamePlacementDecided, NamePlacementPending, NamePlacementRejected, NamePlacementReleased,
		NamePlacementTerm, NamePlacementFinishRefused, NamePlacementMigration, NamePlacementMigrationRefused:
		return DomainPlacement
	case NameTopologyNode, NameTopologyFabric, NameTopologyHealth, NameTopologyHeld:
		return DomainTopology
	case NamePolicyApplied, NamePolicyRejected, NameCalibrationApplied, NameCalibrationRejected:
		return DomainPolicy
	case NameRuntimeTuning, NameRuntimeTelemetry, NameRuntimeDiagnosis, NameRankLog, NameRanksExited:
		return DomainRuntime
	case NameAgentHeartbeat:
		return DomainAgent
	}
	d, _, _ := strings.Cut(string(n), ".")
	return Domain(d)
}

// CEType is the CloudEvents type, such as io.toposched.placement.decided.v1.
func (n Name) CEType() string { return "io.toposched." + string(n) + "." + Version }

// NameOfCEType is the inverse of CEType.
func NameOfCEType(t string) (Name, bool) {
	s, ok := strings.CutPrefix(t, "io.toposched.")
	if !ok {
		return "", false
	}
	s, ok = strings.CutSuffix(s, "."+Version)
	if !ok {
		return "", false
	}
	for _, n := range Catalogue {
		if string(n) == s {
			return n, true
		}
	}
	return "", false
}

// New returns a pointer to a zero value of the event's Go type.
func (n Name) New() any {
	switch n {
	case NameJobSubmitted:
		return new(JobSubmitted)
	case NameJobAnalyzed:
		return new(JobAnalyzed)
	case NameJobFinished:
		return new(JobFinished)
	case NamePlacementDecided:
		return new(PlacementDecided)
	case NamePlacementPending:
		return new(PlacementPending)
	case NamePlacementRejected:
		return new(PlacementRejected)
	case NamePlacementReleased:
		return new(PlacementReleased)
	case NamePlacementTerm:
		return new(PlacementTerm)
	case NamePlacementFinishRefused:
		return new(PlacementFinishRefused)
	case NameTopologyNode:
		return new(TopologyNode)
	case NameTopologyFabric:
		return new(TopologyFabric)
	case NameTopologyHealth:
		return new(TopologyHealth)
	case NameTopologyHeld:
		return new(TopologyHeld)
	case NamePolicyApplied:
		return new(PolicyApplied)
	case NamePolicyRejected:
		return new(PolicyRejected)
	case NameCalibrationApplied:
		return new(CalibrationApplied)
	case NameCalibrationRejected:
		return new(CalibrationRejected)
	case NamePlacementMigration:
		return new(PlacementMigration)
	case NameJobMigrationAccepted:
		return new(JobMigrationAccepted)
	case NamePlacementMigrationRefused:
		return new(PlacementMigrationRefused)
	case NameRuntimeTuning:
		return new(RuntimeTuning)
	case NameRuntimeTelemetry:
		return new(RuntimeTelemetry)
	case NameRuntimeDiagnosis:
		return new(RuntimeDiagnosis)
	case NameAgentHeartbeat:
		return new(AgentHeartbeat)
	case NameRankLog:
		return new(RankLog)
	case NameRanksExited:
		return new(RanksExited)
	}
	return nil
}

// NameOf returns the event name of a value of one of the catalogue's types.
func NameOf(v any) (Name, error) {
	switch v.(type) {
	case *JobSubmitted, JobSubmitted:
		return NameJobSubmitted, nil
	case *JobAnalyzed, JobAnalyzed:
		return NameJobAnalyzed, nil
	case *JobFinished, JobFinished:
		return NameJobFinished, nil
	case *PlacementDecided, PlacementDecided:
		return NamePlacementDecided, nil
	case *PlacementPending, PlacementPending:
		return NamePlacementPending, nil
	case *PlacementRejected, PlacementRejected:
		return NamePlacementRejected, nil
	case *PlacementReleased, PlacementReleased:
		return NamePlacementReleased, nil
	case *PlacementTerm, PlacementTerm:
		return NamePlacementTerm, nil
	case *PlacementFinishRefused, PlacementFinishRefused:
		return NamePlacementFinishRefused, nil
	case *TopologyNode, TopologyNode:
		return NameTopologyNode, nil
	case *TopologyFabric, TopologyFabric:
		return NameTopologyFabric, nil
	case *TopologyHealth, TopologyHealth:
		return NameTopologyHealth, nil
	case *TopologyHeld, TopologyHeld:
		return NameTopologyHeld, nil
	case *PolicyApplied, PolicyApplied:
		return NamePolicyApplied, nil
	case *PolicyRejected, PolicyRejected:
		return NamePolicyRejected, nil
	case *CalibrationApplied, CalibrationApplied:
		return NameCalibrationApplied, nil
	case *CalibrationRejected, CalibrationRejected:
		return NameCalibrationRejected, nil
	case *PlacementMigration, PlacementMigration:
		return NamePlacementMigration, nil
	case *JobMigrationAccepted, JobMigrationAccepted:
		return NameJobMigrationAccepted, nil
	case *PlacementMigrationRefused, PlacementMigrationRefused:
		return NamePlacementMigrationRefused, nil
	case *RuntimeTuning, RuntimeTuning:
		return NameRuntimeTuning, nil
	case *RuntimeTelemetry, RuntimeTelemetry:
		return NameRuntimeTelemetry, nil
	case *RuntimeDiagnosis, RuntimeDiagnosis:
		return NameRuntimeDiagnosis, nil
	case *AgentHeartbeat, AgentHeartbeat:
		return NameAgentHeartbeat, nil
	case *RankLog, RankLog:
		return NameRankLog, nil
	case *RanksExited, RanksExited:
		return NameRanksExited, nil
	}
	return "", fmt.Errorf("events: %T is not in the catalogue", v)
}

// Subjects maps event names to NATS subjects under one prefix.
type Subjects struct {
	Prefix string
}

// NewSubjects returns the subjects under prefix, or DefaultPrefix if empty.
func NewSubjects(prefix string) Subjects {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	return Subjects{Prefix: prefix}
}

// Of is the subject of a non-node-scoped event, or the wildcard over all
// nodes for a node-scoped one.
func (s Subjects) Of(n Name) string {
	if n.NodeScoped() {
		return s.Prefix + "." + string(n) + ".*"
	}
	return s.Prefix + "." + string(n)
}

// ForNode is the subject of a node-scoped event about node.
func (s Subjects) ForNode(n Name, node string) string {
	return s.Prefix + "." + string(n) + "." + NodeToken(node)
}

// Domain is the wildcard subject over one domain, for a stream.
func (s Subjects) Domain(domain Domain) string { return s.Prefix + "." + string(domain) + ".>" }

// DeadLetter is the subject where messages that cannot be handled are kept.
func (s Subjects) DeadLetter() string { return s.Prefix + ".dlq" }

// NameOfSubject finds the event name of a subject under this prefix.
func (s Subjects) NameOfSubject(subject string) (Name, bool) {
	rest, ok := strings.CutPrefix(subject, s.Prefix+".")
	if !ok {
		return "", false
	}
	for _, n := range Catalogue {
		if rest == string(n) || ((n.NodeScoped() || n.IdentityScoped()) && strings.HasPrefix(rest, string(n)+".")) {
			return n, true
		}
	}
	return "", false
}

// NodeToken escapes a node (or tenant) name into one subject token: host
// names may hold dots, which NATS reads as token separators, and a
// tenant's name is what a user typed: wildcards, white space and control
// characters, which NATS subjects cannot carry, are escaped as %XX.
func NodeToken(node string) string {
	if !strings.ContainsFunc(node, tokenEscaped) {
		return node
	}
	var b strings.Builder
	for i := 0; i < len(node); i++ {
		c := node[i]
		if c < utf8.RuneSelf && tokenEscaped(rune(c)) {
			fmt.Fprintf(&b, "%%%02X", c)
			continue
		}
		b.WriteByte(c)
	}
	return b.String()
}

// tokenEscaped reports the characters NodeToken escapes.
func tokenEscaped(r rune) bool {
	return r <= ' ' || r == 0x7f || r == '%' || r == '.' || r == '*' || r == '>'
}

// NodeFromToken is the inverse of NodeToken.
func NodeFromToken(tok string) (string, error) {
	s, err := url.PathUnescape(tok)
	if err != nil {
		return "", fmt.Errorf("node token %q: %w", tok, err)
	}
	return s, nil
}
