package bus

import "errors"

// transientError marks a failure worth retrying: the broker was unreachable,
// a publish timed out. Every other handler error is permanent and sends the
// message to the dead-letter subject.
type transientError struct{ err error }

func (e transientError) Error() string { return e.err.Error() }
func (e transientError) Unwrap() error { return e.err }

// Transient marks err as worth retrying; nil stays nil.
func Transient(err error) error {
	if err == nil {
		return nil
	}
	return transientError{err}
}

// IsTransient reports whether err, or an error it wraps, was marked Transient.
func IsTransient(err error) bool {
	var t transientError
	return errors.As(err, &t)
}
