package bus

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/schemas"
)

// invalidEnvelope handles a message whose envelope a typed handler cannot
// take (a ce-type that is unknown or another event's): the handler's
// Invalid hook, if any, is told, with the envelope as far as it could be
// read (its subject is the job id of the body, for a job), so that it may
// answer the sender as it does for a body that breaks its schema. The
// returned error sends the message to the dead-letter subject; if the hook
// fails, its error is returned instead (a Transient one is retried).
func invalidEnvelope(m *message.Message, env events.Envelope, err error,
	invalid func(ctx context.Context, env events.Envelope, body []byte, err error) error) error {
	err = fmt.Errorf("envelope: %w", err)
	if invalid == nil || env.ID == "" {
		return err
	}
	if ierr := invalid(WithCause(m.Context(), env), env, m.Payload, err); ierr != nil {
		return ierr
	}
	return err
}

// Reason codes of ReasonsOf beside the schema's (schema_<rule>) and the
// decoder's.
const (
	// CodeWrongEventType: the ce-type header is another event's, or none
	// of toposched's.
	CodeWrongEventType = "wrong_event_type"
	// CodeStructuredMode: the body is a CloudEvents structured-mode event.
	CodeStructuredMode = "structured_mode"
	// CodeWrongScope: the subject's scope does not fit the event, or the
	// body speaks for another node or tenant than its subject's.
	CodeWrongScope = "wrong_scope"
)

// ReasonsOf turns why a message could not be read into the reasons of its
// answer (a rejection, a refused finish or migration): one per schema problem (schema_<rule>) or decoding problem
// (events.DecodeProblem's code), or one for a wrong ce-type or a
// structured-mode body. Each reason's field and message are clipped (to
// 1 KiB and 4 KiB), so that the answer's publish cannot fail for the size
// of what the message held.
func ReasonsOf(err error) []events.Reason {
	return clipReasons(reasonsOf(err))
}

func reasonsOf(err error) []events.Reason {
	var ee *events.EnvelopeError
	if errors.As(err, &ee) {
		msg := fmt.Sprintf("header %s = %q is not a toposched event type", ee.Header, ee.Value)
		if _, known := events.NameOfCEType(ee.Value); known {
			msg = fmt.Sprintf("header %s = %q is another event's type", ee.Header, ee.Value)
		}
		if ee.Want != "" {
			msg += fmt.Sprintf(": a message sent on %s must have %s %s, or none", ee.Subject, ee.Header, ee.Want)
		}
		return []events.Reason{{Code: CodeWrongEventType, Message: msg}}
	}
	var sc *events.ScopeError
	if errors.As(err, &sc) {
		return []events.Reason{{Code: CodeWrongScope, Field: sc.Field, Message: sc.Error()}}
	}
	var sj *events.SubjectError
	if errors.As(err, &sj) {
		return []events.Reason{{Code: CodeWrongScope, Message: sj.Error()}}
	}
	var se *events.StructuredModeError
	if errors.As(err, &se) {
		return []events.Reason{{Code: CodeStructuredMode, Message: se.Error()}}
	}
	var de *events.DecodeError
	if errors.As(err, &de) {
		out := make([]events.Reason, 0, len(de.Problems))
		for _, p := range de.Problems {
			out = append(out, events.Reason{Code: p.Code, Field: p.Field, Message: p.Message})
		}
		return out
	}
	var ve *schemas.ValidationError
	if !errors.As(err, &ve) {
		return []events.Reason{{Code: "invalid", Message: err.Error()}}
	}
	out := make([]events.Reason, 0, len(ve.Problems))
	for _, p := range ve.Problems {
		field := p.Field
		msg := p.Message
		if field != "" {
			msg = fmt.Sprintf("%s: %s", field, p.Message)
		}
		out = append(out, events.Reason{Code: "schema_" + p.Rule, Field: field, Message: msg})
	}
	return out
}

// Bounds of what a rejection carries: a field or message of a reason
// (an unknown property's name, a value quoted, may be megabytes), and a
// dead letter's headers.
const (
	maxReasonField   = 1 << 10
	maxReasonMessage = 4 << 10
	// maxDeadHeader bounds each header of a dead letter, the error
	// included: the error of a body with a problem in each of a million
	// values, or a header a publisher made megabytes long, must not make
	// the dead letter too large to keep.
	maxDeadHeader = 4 << 10
	// maxDeadHeaderName drops a header whose name is longer.
	maxDeadHeaderName = 256
	// maxDeadHeaders bounds a dead letter's headers together, well under
	// the 64 KiB the server takes; past it only the envelope's and
	// toposched's own are kept, each clipped to maxDeadKeptHeader.
	maxDeadHeaders    = 16 << 10
	maxDeadKeptHeader = 1 << 10
	// deadPrefix is how much of a body too large to copy its dead letter
	// keeps, beside the body's size and SHA-256.
	deadPrefix = 4 << 10
	// deadSlack is room under the limit for what the transport adds to
	// a message (the header block's first line and its end, Nats-Msg-Id).
	deadSlack = 1 << 10
)

// clip shortens s to at most n bytes, at a character's start, marking the
// cut.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

// clipReasons bounds the field and message of each reason, so that an
// answer built from them is never refused for its size.
func clipReasons(rs []events.Reason) []events.Reason {
	for i := range rs {
		rs[i].Field, rs[i].Message = clip(rs[i].Field, maxReasonField), clip(rs[i].Message, maxReasonMessage)
	}
	return rs
}

// deadKept are the headers a dead letter keeps when it has too many.
var deadKept = map[string]bool{events.HeaderSpecVersion: true, events.HeaderType: true, events.HeaderSource: true,
	events.HeaderID: true, events.HeaderTime: true, events.HeaderSubject: true, events.HeaderContentType: true,
	events.HeaderCorrelationID: true, events.HeaderCausationID: true, events.HeaderError: true, events.HeaderDeadSubject: true}

// fitDeadLetter makes the dead letter m fit in one message of the bus,
// whatever the message it copies held: every header clipped to
// maxDeadHeader (one named past maxDeadHeaderName dropped), only the
// envelope's and toposched's kept if they are still more than
// maxDeadHeaders, and a body that does not fit beside them replaced by its
// first deadPrefix bytes, with its size and SHA-256 in the headers.
func (b *Bus) fitDeadLetter(m *message.Message) {
	for k, v := range m.Metadata {
		switch {
		case len(k) > maxDeadHeaderName:
			delete(m.Metadata, k)
		case len(v) > maxDeadHeader:
			m.Metadata[k] = clip(v, maxDeadHeader)
		}
	}
	if headerBytes(m.Metadata) > maxDeadHeaders {
		for k, v := range m.Metadata {
			switch {
			case strings.HasPrefix(k, "_"): // the transport's, never sent
			case !deadKept[k]:
				delete(m.Metadata, k)
			case k != events.HeaderError:
				m.Metadata[k] = clip(v, maxDeadKeptHeader)
			}
		}
	}
	limit := b.messageLimit() - deadSlack
	if headerBytes(m.Metadata)+len(m.UUID)+len(m.Payload) <= limit {
		return
	}
	sum := sha256.Sum256(m.Payload)
	m.Metadata.Set(events.HeaderDeadSize, strconv.Itoa(len(m.Payload)))
	m.Metadata.Set(events.HeaderDeadSHA256, hex.EncodeToString(sum[:]))
	m.Payload = m.Payload[:min(len(m.Payload), deadPrefix)]
}

// headerBytes is what metadata takes as NATS headers ("key: value\r\n"),
// leaving out the transport's own facts (keys starting with "_").
func headerBytes(md message.Metadata) int {
	n := 0
	for k, v := range md {
		if !strings.HasPrefix(k, "_") {
			n += len(k) + len(v) + len(": \r\n")
		}
	}
	return n
}

// messageLimit is the most one message may hold on this bus: the
// server's max_payload or the streams' max_msg_size, the lower.
func (b *Bus) messageLimit() int {
	limit := streamMaxMsgSize
	if p := int(b.nc.MaxPayload()); p > 0 {
		limit = min(limit, p)
	}
	return limit
}
