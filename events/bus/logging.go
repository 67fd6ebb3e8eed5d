package bus

import (
	"context"
	"log/slog"
)

// LogHandler wraps h so that a record logged with the context of a handled
// event (Logger.InfoContext(ctx, ...) inside a handler) carries the event's
// correlation_id, which ties every line about one job's request together
// across services. Records without such a context pass unchanged.
func LogHandler(h slog.Handler) slog.Handler { return ctxHandler{h} }

type ctxHandler struct{ slog.Handler }

func (h ctxHandler) Handle(ctx context.Context, r slog.Record) error {
	if c, ok := CauseFrom(ctx); ok && c.CorrelationID != "" {
		r.AddAttrs(slog.String("correlation_id", c.CorrelationID))
	}
	return h.Handler.Handle(ctx, r)
}

func (h ctxHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return ctxHandler{h.Handler.WithAttrs(as)}
}

func (h ctxHandler) WithGroup(name string) slog.Handler {
	return ctxHandler{h.Handler.WithGroup(name)}
}
