package bus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

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

// checkScope reads the body of a node-scoped event, or of a jobs.submitted
// under a tenant, far enough to check that it agrees with its subject's
// scope (events.CheckScope): for a reader that decodes later, or only
// some of what it reads. A body that does not decode is left to that
// reader's own decoding.
func (b *Bus) checkScope(name events.Name, scope events.Scope, body []byte) error {
	if scope.IsZero() || (!name.NodeScoped() && name != events.NameJobSubmitted) {
		return nil
	}
	v := name.New()
	if json.Unmarshal(body, v) != nil {
		return nil
	}
	return events.CheckScope(scope, v)
}

// ReasonsOf turns why a message could not be read into the reasons of its
// answer (a rejection, a refused finish or migration): one per schema problem (schema_<rule>) or decoding problem
// (events.DecodeProblem's code), or one for a wrong ce-type or a
// structured-mode body.
func ReasonsOf(err error) []events.Reason {
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
