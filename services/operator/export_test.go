package operator

import (
	"context"
	"log/slog"
	"testing"

	"github.com/toposched/toposched/events/bus"
)

// StartOn builds an operator of cfg on b and runs it in the background
// (Background) until stop, or the test's end; it returns once the
// operator is ready, or with the error New or Run gave before.
func StartOn(tb testing.TB, ctx context.Context, b *bus.Bus, cfg Config, log *slog.Logger) (op *Operator, stop func() error, err error) {
	tb.Helper()
	op, err = New(cfg, Deps{Bus: b, Log: log})
	if err != nil {
		return nil, nil, err
	}
	stop, err = Background(ctx, op)
	if err != nil {
		return nil, nil, err
	}
	tb.Cleanup(func() { _ = stop() })
	return op, stop, nil
}
