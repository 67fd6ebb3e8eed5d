package bus

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill"

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

// A handler fenced by a newer term is logged as a warning, with its
// fields; any other handler error stays an error. (The cluster e2e failed
// on level=ERROR lines that were a replica stepping down as designed.)
func TestFencedHandlerErrorIsAWarning(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	w := fencedAsWarning{watermill.NewSlogLogger(log), log}.With(watermill.LogFields{"handler_name": "h"})
	w.Error("Handler returned error", fmt.Errorf("publish toposched.placement.pending: %w", ErrFenced), watermill.LogFields{"message_uuid": "m1"})
	w.Error("Handler returned error", errors.New("disk on fire"), nil)
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("logged %q", buf.String())
	}
	for _, want := range []string{"level=WARN", "handler_name=h", "message_uuid=m1", "fenced"} {
		if !strings.Contains(lines[0], want) {
			t.Errorf("fenced line %q lacks %q", lines[0], want)
		}
	}
	if !strings.Contains(lines[1], "level=ERROR") || !strings.Contains(lines[1], "disk on fire") {
		t.Errorf("other error logged as %q", lines[1])
	}
}

// An outcome the stream has not confirmed, and a message left for later
// on purpose, are warnings too: the message comes back.
func TestRetriedHandlerErrorsAreWarnings(t *testing.T) {
	for _, err := range []error{
		Transient(fmt.Errorf("publish toposched.placement.decided: %w: the answer was lost", ErrUnconfirmed)),
		Transient(fmt.Errorf("job j: not decided in its handler's time: %w", ErrLater)),
	} {
		var buf bytes.Buffer
		log := slog.New(slog.NewTextHandler(&buf, nil))
		w := fencedAsWarning{watermill.NewSlogLogger(log), log}
		w.Error("Handler returned error", err, nil)
		if line := buf.String(); !strings.Contains(line, "level=WARN") || !strings.Contains(line, "comes back") {
			t.Errorf("%v logged as %q", err, line)
		}
	}
}

// The retry middleware logs only before another attempt of a transient
// error: a warning, with its fields. What the retries do not cure the
// router logs as an error (fencedAsWarning's other errors above).
func TestRetryingIsAWarning(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	w := retriesAsWarning{fencedAsWarning{watermill.NewSlogLogger(log), log}}.With(watermill.LogFields{"handler_name": "h"})
	w.Error("Error occurred, retrying", Transient(errors.New("catch up with topology: context deadline exceeded")), watermill.LogFields{"retry_no": 1})
	line := buf.String()
	for _, want := range []string{"level=WARN", "handler_name=h", "retry_no=1", "catch up with topology"} {
		if !strings.Contains(line, want) {
			t.Errorf("retry line %q lacks %q", line, want)
		}
	}
}

// The router's per-message lines are logged only at the levels they map
// to, and skipped (fields and all) below them.
func TestRouterLinesFollowTheLevel(t *testing.T) {
	for _, tc := range []struct {
		level slog.Level
		want  int // lines of the three calls
	}{
		{slog.LevelInfo, 0},
		{slog.LevelDebug, 2},
		{watermill.LevelTrace, 3},
	} {
		var buf bytes.Buffer
		log := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: tc.level}))
		w := fencedAsWarning{watermill.NewSlogLoggerWithLevelMapping(log, map[slog.Level]slog.Level{slog.LevelInfo: slog.LevelDebug}), log}
		w.Trace("received", watermill.LogFields{"message_uuid": "m1"})
		w.Debug("handled", watermill.LogFields{"message_uuid": "m1"})
		w.Info("acked", watermill.LogFields{"message_uuid": "m1"})
		if got := strings.Count(buf.String(), "message_uuid=m1"); got != tc.want {
			t.Errorf("level %v: %d lines, want %d:\n%s", tc.level, got, tc.want, buf.String())
		}
	}
}
