package events

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// EnvelopeError says which CloudEvents attribute of a received message is
// wrong, so that a service can answer the sender in those words. The
// message's other attributes are still read (ParseEnvelope returns them
// beside it): a malformed message that names its job gets an answer.
type EnvelopeError struct {
	// Header is the attribute at fault, such as ce-type.
	Header string
	// Value is what the message carried.
	Value string
	// Want is what the message's subject takes ("" when the subject is not
	// a toposched event's).
	Want string
	// Subject is the NATS subject the message came on.
	Subject string
}

func (e *EnvelopeError) Error() string {
	if e.Want == "" {
		return fmt.Sprintf("header %s: unknown event type %q", e.Header, e.Value)
	}
	if _, known := NameOfCEType(e.Value); !known {
		return fmt.Sprintf("header %s: unknown event type %q (subject %s takes %s)", e.Header, e.Value, e.Subject, e.Want)
	}
	return fmt.Sprintf("header %s: event type %q does not belong on subject %s (it takes %s)", e.Header, e.Value, e.Subject, e.Want)
}

// StructuredEvent is the part of a CloudEvents structured-mode body
// (an object with specversion, type and data) that says what it is about.
type StructuredEvent struct {
	SpecVersion string          `json:"specversion"`
	Type        string          `json:"type"`
	ID          string          `json:"id"`
	Subject     string          `json:"subject"`
	Data        json.RawMessage `json:"data"`
}

// ParseStructured reports whether body is a CloudEvents structured-mode
// event: a JSON object with a string specversion and a data member. No
// toposched event has either property.
func ParseStructured(body []byte) (StructuredEvent, bool) {
	b := bytes.TrimSpace(body)
	if len(b) == 0 || b[0] != '{' {
		return StructuredEvent{}, false
	}
	var s StructuredEvent
	if json.Unmarshal(b, &s) != nil || s.SpecVersion == "" || len(s.Data) == 0 {
		return StructuredEvent{}, false
	}
	return s, true
}

// Key is what the structured event is about, as ParseEnvelope reads a
// subject: its subject attribute, else the key field of its data.
func (s StructuredEvent) Key(name Name) string {
	if s.Subject != "" {
		return s.Subject
	}
	return KeyOfBody(name, s.Data)
}

// StructuredModeError says a body was refused because it is a CloudEvents
// structured-mode event, which toposched does not take: its events travel
// in binary mode, the event itself as the body and the attributes as ce-
// headers. Err is the schema's verdict on the body as it came.
type StructuredModeError struct {
	Event StructuredEvent
	Err   error
}

func (e *StructuredModeError) Error() string {
	return "the body is a CloudEvents structured-mode event (specversion, type, data); toposched takes binary mode: " +
		"send the event's data as the body and its attributes as ce- headers"
}

func (e *StructuredModeError) Unwrap() error { return e.Err }

// ExplainStructured returns err, why body was refused, as a
// *StructuredModeError when body is a structured-mode CloudEvent, so that
// the sender reads the one mistake rather than every property the schema
// missed; any other err is returned as it is.
func ExplainStructured(body []byte, err error) error {
	if err == nil {
		return nil
	}
	if s, ok := ParseStructured(body); ok {
		return &StructuredModeError{Event: s, Err: err}
	}
	return err
}
