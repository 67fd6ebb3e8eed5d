package bus

import (
	"context"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/toposched/toposched/events"
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
