package launcher

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/events/bus"
)

// TelemetryPath is where the agent's endpoint takes runtime.telemetry
// bodies (POST, JSON), so that a rank reports without a NATS client; the
// ranks find the whole URL in TOPOSCHED_TELEMETRY_URL.
const TelemetryPath = "/v1/telemetry"

// EnvTelemetryURL is the rank environment variable naming the endpoint;
// EnvTelemetryToken the one holding the job's token, which a report must
// show (Authorization: Bearer TOKEN) to be taken for that job. The
// endpoint listens on loopback, where any local user reaches it; the token,
// in the environment of the job's ranks (readable by their user and root
// alone) and the agent's 0600 state file, keeps them from reporting for a
// job not theirs.
const (
	EnvTelemetryURL   = "TOPOSCHED_TELEMETRY_URL"
	EnvTelemetryToken = "TOPOSCHED_TELEMETRY_TOKEN"
)

// newToken is a job's telemetry token: 128 random bits, hex.
func newToken() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// tokenMatches reports whether an Authorization header shows token; no
// token (ranks an older agent started) matches nothing.
func tokenMatches(auth, token string) bool {
	got, ok := strings.CutPrefix(auth, "Bearer ")
	return ok && token != "" && subtle.ConstantTimeCompare([]byte(got), []byte(token)) == 1
}

// maxTelemetryBody bounds one report: the schema's 64 groups and 4096
// ranks fit in far less.
const maxTelemetryBody = 1 << 20

// serveTelemetry listens on addr (loopback: the ranks are on this node)
// until ctx ends, and returns the endpoint's URL once it listens.
func (a *Agent) serveTelemetry(ctx context.Context, addr string) (string, error) {
	l, err := a.listenTelemetry(addr)
	if err != nil {
		return "", fmt.Errorf("telemetry endpoint: %w", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+TelemetryPath, func(w http.ResponseWriter, r *http.Request) {
		code, msg := a.takeTelemetry(r.Context(), r.Header.Get("Authorization"), http.MaxBytesReader(w, r.Body, maxTelemetryBody))
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

// listenTelemetry listens on addr. With port 0 it first tries the port a
// previous run of the agent had (kept in the state dir): the ranks it
// adopts know that URL alone. Taken by then, any free port will do, and
// the adopted ranks' reports are lost.
func (a *Agent) listenTelemetry(addr string) (net.Listener, error) {
	kept := filepath.Join(a.cfg.StateDir, "telemetry.addr")
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	var l net.Listener
	if b, err := os.ReadFile(kept); err == nil && port == "0" {
		if h, _, err := net.SplitHostPort(string(b)); err == nil && h == host {
			l, _ = net.Listen("tcp", string(b))
		}
	}
	if l == nil {
		if l, err = net.Listen("tcp", addr); err != nil {
			return nil, err
		}
	}
	if err := os.WriteFile(kept, []byte(l.Addr().String()), 0o644); err != nil {
		a.log.Warn("telemetry address not kept: a restarted agent's endpoint may move", "err", err)
	}
	return l, nil
}

// takeTelemetry checks one report and publishes it: 202 once JetStream
// has it, 400 for a body its schema refuses (naming the fields), 404 for
// a job that runs no rank here, 401 for one without the job's token.
func (a *Agent) takeTelemetry(ctx context.Context, auth string, body io.Reader) (int, string) {
	b, err := io.ReadAll(body)
	if err != nil {
		return http.StatusRequestEntityTooLarge, fmt.Sprintf("body: %v", err)
	}
	var t events.RuntimeTelemetry
	if err := bus.Decode(events.NameRuntimeTelemetry, b, &t); err != nil {
		return http.StatusBadRequest, events.ExplainStructured(b, err).Error()
	}
	a.mu.Lock()
	rn, ok := a.runs[t.JobID]
	a.mu.Unlock()
	if !ok {
		return http.StatusNotFound, fmt.Sprintf("job_id: %s runs no rank on node %s", t.JobID, a.cfg.Node)
	}
	if !tokenMatches(auth, rn.token) {
		return http.StatusUnauthorized, fmt.Sprintf("Authorization: job %s's reports need \"Bearer $%s\" (its ranks' environment)", t.JobID, EnvTelemetryToken)
	}
	// Under this node's scope: an agent's credentials allow its node alone.
	if _, err := a.b.Publish(bus.WithScope(ctx, events.NodeScope(a.cfg.Node)), &t); err != nil {
		return http.StatusServiceUnavailable, fmt.Sprintf("publish: %v", err)
	}
	return http.StatusAccepted, "published"
}
