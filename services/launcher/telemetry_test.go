package launcher

import (
	"context"
	"log/slog"
	"net/http"
	"strings"
	"testing"
)

// TestTakeTelemetryToken: a report is taken for a job only with that
// job's token; what is refused never reaches the bus (nil here).
func TestTakeTelemetryToken(t *testing.T) {
	t.Parallel()
	a, err := New(Config{Node: "a", StateDir: t.TempDir(), RunAsAllow: selfAllow(t)}, Deps{Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	a.runs["j1"] = &run{id: "j1", token: "t1"}
	a.runs["j2"] = &run{id: "j2", token: "t2"}
	a.runs["old"] = &run{id: "old"} // started by an agent without tokens
	report := func(job string) string {
		return `{"job_id": "` + job + `", "step": 100, "step_seconds": 0.31, "compute_seconds": 0.22}`
	}
	for _, tc := range []struct {
		name, auth, body string
		wantCode         int
		wantMsg          string
	}{
		{"no token", "", report("j1"), http.StatusUnauthorized, "Bearer $TOPOSCHED_TELEMETRY_TOKEN"},
		{"another job's token", "Bearer t2", report("j1"), http.StatusUnauthorized, "job j1's reports"},
		{"not a bearer", "t1", report("j1"), http.StatusUnauthorized, "job j1's reports"},
		{"a prefix of the token", "Bearer t", report("j1"), http.StatusUnauthorized, "job j1's reports"},
		{"a job without a token takes nothing", "Bearer ", report("old"), http.StatusUnauthorized, "job old's reports"},
		{"a job not here", "Bearer t1", report("j3"), http.StatusNotFound, "job_id: j3 runs no rank on node a"},
		{"a body the schema refuses", "Bearer t1", `{"job_id": "j1"}`, http.StatusBadRequest, "step"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			code, msg := a.takeTelemetry(context.Background(), tc.auth, strings.NewReader(tc.body))
			if code != tc.wantCode || !strings.Contains(msg, tc.wantMsg) {
				t.Errorf("takeTelemetry = %d %q, want %d and %q", code, msg, tc.wantCode, tc.wantMsg)
			}
		})
	}
}

func TestNewToken(t *testing.T) {
	t.Parallel()
	x, y := newToken(), newToken()
	if len(x) != 32 || x == y {
		t.Errorf("tokens %q and %q: want 32 hex digits, each its own", x, y)
	}
	if !tokenMatches("Bearer "+x, x) || tokenMatches("Bearer "+y, x) {
		t.Errorf("tokenMatches does not tell %q from %q", x, y)
	}
}
