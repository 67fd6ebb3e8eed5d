package bus

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"

	"github.com/toposched/toposched/events"
)

func TestLogHandlerAddsCorrelationID(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(LogHandler(slog.NewTextHandler(&buf, nil))).With("component", "test")
	ctx := context.WithValue(context.Background(), causeKey{}, events.Envelope{ID: "e1", CorrelationID: "c1"})
	log.InfoContext(ctx, "about a job", "job_id", "j")
	log.Info("no context")
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 2 || !strings.Contains(lines[0], "job_id=j correlation_id=c1") || strings.Contains(lines[1], "correlation_id") {
		t.Fatalf("log:\n%s", buf.String())
	}
}
