package launcher

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/events/bus"
)

// TelemetryPath is where the agent's endpoint takes runtime.telemetry
// bodies (POST, JSON), so that a rank reports without a NATS client; the
// ranks find the whole URL in TOPOSCHED_TELEMETRY_URL.
const TelemetryPath = "/v1/telemetry"

// EnvTelemetryURL is the rank environment variable naming the endpoint.
const EnvTelemetryURL = "TOPOSCHED_TELEMETRY_URL"

// maxTelemetryBody bounds one report: the schema's 64 groups and 4096
// ranks fit in far less.
const maxTelemetryBody = 1 << 20

// serveTelemetry listens on addr (loopback: the ranks are on this node)
// until ctx ends, and returns the endpoint's URL once it listens.
func (a *Agent) serveTelemetry(ctx context.Context, addr string) (string, error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return "", fmt.Errorf("telemetry endpoint: %w", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+TelemetryPath, func(w http.ResponseWriter, r *http.Request) {
		code, msg := a.takeTelemetry(r.Context(), http.MaxBytesReader(w, r.Body, maxTelemetryBody))
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.WriteHeader(code)
		_, _ = io.WriteString(w, msg+"\n")
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	go func() {
		if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			a.log.Error("telemetry endpoint stopped", "err", err)
		}
	}()
	return "http://" + l.Addr().String() + TelemetryPath, nil
}

// takeTelemetry checks one report and publishes it: 202 once JetStream
// has it, 400 for a body its schema refuses (naming the fields), 404 for
// a job that runs no rank here.
func (a *Agent) takeTelemetry(ctx context.Context, body io.Reader) (int, string) {
	b, err := io.ReadAll(body)
	if err != nil {
		return http.StatusRequestEntityTooLarge, fmt.Sprintf("body: %v", err)
	}
	var t events.RuntimeTelemetry
	if err := bus.Decode(events.NameRuntimeTelemetry, b, &t); err != nil {
		return http.StatusBadRequest, events.ExplainStructured(b, err).Error()
	}
	a.mu.Lock()
	_, ok := a.runs[t.JobID]
	a.mu.Unlock()
	if !ok {
		return http.StatusNotFound, fmt.Sprintf("job_id: %s runs no rank on node %s", t.JobID, a.cfg.Node)
	}
	if _, err := a.b.Publish(ctx, &t); err != nil {
		return http.StatusServiceUnavailable, fmt.Sprintf("publish: %v", err)
	}
	return http.StatusAccepted, "published"
}
