package policies

import (
	"sync/atomic"
	"time"
)

// evalObserver, when set, is told how long each Rego evaluation took (cache
// hits are not evaluations). The operator's metrics set it.
var evalObserver atomic.Pointer[func(time.Duration)]

// SetEvalObserver installs fn as the observer of evaluation times; nil
// removes it.
func SetEvalObserver(fn func(time.Duration)) {
	if fn == nil {
		evalObserver.Store(nil)
		return
	}
	evalObserver.Store(&fn)
}

func observeEval(start time.Time) {
	if fn := evalObserver.Load(); fn != nil {
		(*fn)(time.Since(start))
	}
}
