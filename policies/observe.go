package policies

import (
	"context"
	"time"
)

type evalObserverKey struct{}

// WithEvalObserver returns ctx carrying fn, which every Rego evaluation
// made with that context is told its duration (cache hits are not
// evaluations). The observer travels with the call rather than sitting in
// a package variable, so two services (or two tests) in one process each
// see only their own evaluations.
func WithEvalObserver(ctx context.Context, fn func(time.Duration)) context.Context {
	return context.WithValue(ctx, evalObserverKey{}, fn)
}

func observeEval(ctx context.Context, start time.Time) {
	if fn, ok := ctx.Value(evalObserverKey{}).(func(time.Duration)); ok && fn != nil {
		fn(time.Since(start))
	}
}
