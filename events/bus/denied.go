package bus

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/nats-io/nats.go"
)

// DeniedError is a publish the server refused for the connection's
// permissions: its user's role may not publish on the subject (another
// tenant's jobs, another node's reports, the services' events). It is
// permanent: sending it again changes nothing.
type DeniedError struct {
	Subject string
}

func (e *DeniedError) Error() string {
	return fmt.Sprintf("publish %s: not permitted: the NATS user signed in may not publish on this subject "+
		"(docs/security.md: each role publishes its own part; topoctl --tenant picks a tenant's role)", e.Subject)
}

// denials tells the publishes waiting on a subject that the server
// refused it. NATS answers a publish it does not permit with an
// asynchronous error, not on the publish: without this, a JetStream
// publish would wait out its timeout and report only that.
type denials struct {
	mu      sync.Mutex
	waiting map[string][]context.CancelCauseFunc
}

// watch makes ctx end with a *DeniedError once the server refuses a
// publish on subject; stop unregisters it.
func (d *denials) watch(ctx context.Context, subject string) (context.Context, func()) {
	if d == nil {
		return ctx, func() {}
	}
	ctx, cancel := context.WithCancelCause(ctx)
	d.mu.Lock()
	if d.waiting == nil {
		d.waiting = map[string][]context.CancelCauseFunc{}
	}
	d.waiting[subject] = append(d.waiting[subject], cancel)
	n := len(d.waiting[subject]) - 1
	d.mu.Unlock()
	return ctx, func() {
		d.mu.Lock()
		if w := d.waiting[subject]; n < len(w) {
			w[n] = nil
			if allNil(w) {
				delete(d.waiting, subject)
			}
		}
		d.mu.Unlock()
		cancel(nil)
	}
}

func allNil(fs []context.CancelCauseFunc) bool {
	for _, f := range fs {
		if f != nil {
			return false
		}
	}
	return true
}

// handler is the connection's error handler: it reads a publish
// permission violation's subject and ends the publishes waiting on it.
func (d *denials) handler(next nats.ErrHandler) nats.ErrHandler {
	return func(nc *nats.Conn, sub *nats.Subscription, err error) {
		if subject, ok := deniedSubject(err); ok {
			d.mu.Lock()
			for _, cancel := range d.waiting[subject] {
				if cancel != nil {
					cancel(&DeniedError{Subject: subject})
				}
			}
			d.mu.Unlock()
		}
		if next != nil {
			next(nc, sub, err)
		}
	}
}

// deniedSubject reads the subject of a publish permission violation
// (nats: permissions violation for publish to "subject").
func deniedSubject(err error) (string, bool) {
	if !errors.Is(err, nats.ErrPermissionViolation) {
		return "", false
	}
	msg := strings.ToLower(err.Error())
	_, rest, ok := strings.Cut(msg, "for publish to ")
	if !ok {
		return "", false
	}
	// The subject as the server quoted it, in its own case.
	i := len(err.Error()) - len(rest)
	return strings.Trim(err.Error()[i:], `"' `), true
}
