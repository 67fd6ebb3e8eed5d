package events

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"time"
)

// CloudEvents 1.0 binary-mode attributes as NATS headers, and the headers
// toposched adds for tracing.
const (
	HeaderSpecVersion   = "ce-specversion"
	HeaderType          = "ce-type"
	HeaderSource        = "ce-source"
	HeaderID            = "ce-id"
	HeaderTime          = "ce-time"
	HeaderSubject       = "ce-subject"
	HeaderContentType   = "content-type"
	HeaderCorrelationID = "ce-correlationid"
	HeaderCausationID   = "ce-causationid"
	// HeaderMsgID is JetStream's de-duplication key; it always equals ce-id.
	HeaderMsgID = "Nats-Msg-Id"
	// HeaderError carries why a message went to the dead-letter subject.
	HeaderError = "toposched-error"
	// HeaderDeadSubject is the subject a dead letter was first published on.
	HeaderDeadSubject = "toposched-dead-subject"

	SpecVersion = "1.0"
	ContentType = "application/json"
)

// Envelope is the CloudEvents context of one message.
type Envelope struct {
	ID            string
	Type          string
	Source        string
	Subject       string
	Time          time.Time
	CorrelationID string
	CausationID   string
	// Scope is the identity the event was published under, read from the
	// subject it came on (received events only; see scope.go).
	Scope Scope
}

// MaxHeaders is the most headers EachHeader sets.
const MaxHeaders = 10

// Headers renders the envelope as NATS headers, Nats-Msg-Id included.
func (e Envelope) Headers() map[string]string {
	h := make(map[string]string, MaxHeaders)
	e.EachHeader(func(k, v string) { h[k] = v })
	return h
}

// EachHeader calls set with each header Headers holds, for a caller that
// writes them into a map of its own: every event sent and every one
// received is addressed, and a map built only to be copied is garbage.
func (e Envelope) EachHeader(set func(key, value string)) {
	set(HeaderSpecVersion, SpecVersion)
	set(HeaderType, e.Type)
	set(HeaderSource, e.Source)
	set(HeaderID, e.ID)
	set(HeaderTime, e.Time.UTC().Format(time.RFC3339Nano))
	set(HeaderContentType, ContentType)
	set(HeaderMsgID, e.ID)
	if e.Subject != "" {
		set(HeaderSubject, e.Subject)
	}
	if e.CorrelationID != "" {
		set(HeaderCorrelationID, e.CorrelationID)
	}
	if e.CausationID != "" {
		set(HeaderCausationID, e.CausationID)
	}
}

// Delivery is what the transport knows of a received message, used to fill
// in an envelope its publisher left out (a person with the nats CLI).
type Delivery struct {
	Subject string
	Stream  string
	Seq     uint64
	Time    time.Time
}

// ParseEnvelope reads the envelope of a received message, filling in what is
// missing: the event type from the subject, the id from the stream position
// (stable across redeliveries, so derived events de-duplicate), the time from
// the stream, the subject from the body's key field (or, for a CloudEvents
// structured-mode body, from its subject or data). It fails when the event
// type can be read from neither header nor subject, or when the ce-type
// header is not a toposched event type or not the subject's: then the error
// is an *EnvelopeError and the envelope is filled in all the same, from the
// subject's event, so that the sender can be answered.
func ParseEnvelope(subjects Subjects, h map[string]string, body []byte, d Delivery) (Envelope, Name, error) {
	e := Envelope{
		ID:            h[HeaderID],
		Type:          h[HeaderType],
		Source:        h[HeaderSource],
		Subject:       h[HeaderSubject],
		CorrelationID: h[HeaderCorrelationID],
		CausationID:   h[HeaderCausationID],
	}
	name, ok := subjects.NameOfSubject(d.Subject)
	// A message read on another subject than its event's (a dead letter)
	// has no scope to read.
	onOwnSubject := ok
	var typeErr *EnvelopeError
	if e.Type != "" {
		if n, known := NameOfCEType(e.Type); known && (!ok || n == name) {
			name, ok = n, true
		} else {
			typeErr = &EnvelopeError{Header: HeaderType, Value: e.Type, Subject: d.Subject}
			if ok {
				typeErr.Want = name.CEType()
			}
		}
	}
	if !ok {
		if typeErr != nil {
			return e, "", typeErr
		}
		return e, "", fmt.Errorf("subject %s: not a toposched event subject", d.Subject)
	}
	if e.Type == "" {
		e.Type = name.CEType()
	}
	if e.ID == "" {
		e.ID = h[HeaderMsgID]
	}
	if e.ID == "" {
		e.ID = fmt.Sprintf("%s-%d", d.Stream, d.Seq)
	}
	if e.Source == "" {
		e.Source = "urn:toposched:unknown-publisher"
	}
	if t, err := time.Parse(time.RFC3339Nano, h[HeaderTime]); err == nil {
		e.Time = t
	} else {
		e.Time = d.Time
	}
	if e.Subject == "" {
		e.Subject = KeyOfBody(name, body)
	}
	if e.Subject == "" {
		if s, ok := ParseStructured(body); ok {
			e.Subject = s.Key(name)
		}
	}
	if e.CorrelationID == "" {
		e.CorrelationID = e.ID
	}
	if typeErr != nil {
		return e, "", typeErr
	}
	if onOwnSubject {
		scope, err := subjects.ScopeOfSubject(name, d.Subject)
		if err != nil {
			return e, name, err
		}
		e.Scope = scope
	}
	return e, name, nil
}

// KeyOfBody reads the field that identifies what an event is about (job id,
// node, cluster) from a JSON body without validating the rest, so that even a
// malformed job can be answered by its id. It returns "" when none is found.
func KeyOfBody(name Name, body []byte) string {
	var probe struct {
		JobID   string `json:"job_id"`
		Node    string `json:"node"`
		Name    string `json:"name"`
		Cluster string `json:"cluster"`
		Rev     string `json:"revision"`
		Holder  string `json:"holder"`
		Job     struct {
			JobID string `json:"job_id"`
		} `json:"job"`
	}
	if json.Unmarshal(body, &probe) != nil {
		return ""
	}
	switch name {
	case NamePlacementTerm:
		return probe.Holder
	case NameAgentHeartbeat:
		return probe.Node
	}
	switch name.Domain() {
	case DomainJobs, DomainPlacement, DomainRuntime:
		if probe.JobID != "" {
			return probe.JobID
		}
		return probe.Job.JobID
	}
	switch name {
	case NameTopologyNode:
		return probe.Name
	case NameTopologyHealth, NameTopologyHeld:
		return probe.Node
	case NameTopologyFabric:
		return probe.Cluster
	case NamePolicyApplied, NamePolicyRejected, NameCalibrationApplied, NameCalibrationRejected:
		return probe.Rev
	}
	return ""
}

// KeyOf returns the ce-subject of an event value: its job id, node, cluster
// or policy revision.
func KeyOf(v any) string {
	switch e := v.(type) {
	case *JobSubmitted:
		return e.JobID
	case *JobAnalyzed:
		return e.Job.JobID
	case *JobFinished:
		return e.JobID
	case *PlacementDecided:
		return e.JobID
	case *PlacementPending:
		return e.JobID
	case *PlacementRejected:
		return e.JobID
	case *PlacementReleased:
		return e.JobID
	case *PlacementTerm:
		return e.Holder
	case *PlacementFinishRefused:
		return e.JobID
	case *TopologyNode:
		return e.Name
	case *TopologyFabric:
		return e.Cluster
	case *TopologyHealth:
		return e.Node
	case *TopologyHeld:
		return e.Node
	case *PolicyApplied:
		return e.Revision
	case *PolicyRejected:
		return e.Revision
	case *CalibrationApplied:
		return e.Revision
	case *CalibrationRejected:
		return e.Revision
	case *PlacementMigration:
		return e.JobID
	case *JobMigrationAccepted:
		return e.JobID
	case *PlacementMigrationRefused:
		return e.JobID
	case *RuntimeTuning:
		return e.JobID
	case *RuntimeTelemetry:
		return e.JobID
	case *RuntimeDiagnosis:
		return e.JobID
	case *AgentHeartbeat:
		return e.Node
	case *RankLog:
		return e.JobID
	case *RanksExited:
		return e.JobID
	}
	return ""
}

// DeriveID makes the id of an event caused by another one. It is a pure
// function of the cause and what was derived, so that when a handler runs
// twice for one input (a redelivery after a crash), its outputs carry the same
// ids and JetStream drops the copies.
func DeriveID(causeID string, name Name, key string) string {
	sum := sha256.Sum256([]byte(causeID + "\x00" + string(name) + "\x00" + key))
	return hex.EncodeToString(sum[:16])
}
