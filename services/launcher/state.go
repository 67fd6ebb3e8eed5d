package launcher

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// jobState is what the agent writes when it starts a job's ranks, so that
// a restarted agent knows which processes are the job's.
type jobState struct {
	JobID string      `json:"job_id"`
	Ranks []rankState `json:"ranks"`
	// TelemetryToken is the job's pass to the telemetry endpoint, in its
	// ranks' environment: the file is the agent's alone (0600).
	TelemetryToken string `json:"telemetry_token,omitempty"`
}

type rankState struct {
	Rank int `json:"rank"`
	PID  int `json:"pid"`
	// Start is the process's start time (clock ticks since boot), to tell
	// it from a later process given the same pid.
	Start uint64 `json:"start"`
	// Log is the rank's output file; Exit the file its shim writes its
	// end to ("" without a shim).
	Log  string `json:"log"`
	Exit string `json:"exit,omitempty"`
}

const stateSuffix = ".job.json"

func statePath(dir, job string) string { return filepath.Join(dir, fileName(job)+stateSuffix) }

// logPath is where a rank's output goes.
func logPath(dir, job string, rank int) string {
	return filepath.Join(dir, fileName(job), fmt.Sprintf("rank-%d.log", rank))
}

// fileName makes a job id (letters, digits, . _ : -) one file name: ':' is
// not welcome on every file system.
func fileName(job string) string { return strings.ReplaceAll(job, ":", "_") }

func writeState(dir string, s jobState) error {
	b, err := json.Marshal(s)
	if err != nil {
		return err
	}
	tmp := statePath(dir, s.JobID) + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("state of %s: %w", s.JobID, err)
	}
	if err := os.Rename(tmp, statePath(dir, s.JobID)); err != nil {
		return fmt.Errorf("state of %s: %w", s.JobID, err)
	}
	return nil
}

func removeState(dir, job string) error {
	err := os.Remove(statePath(dir, job))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return err
}

// readStates reads every job state in dir; one that cannot be read is
// reported and skipped, so one torn file does not stop the agent.
func readStates(dir string) ([]jobState, []error) {
	files, err := filepath.Glob(filepath.Join(dir, "*"+stateSuffix))
	if err != nil {
		return nil, []error{err}
	}
	var out []jobState
	var errs []error
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		var s jobState
		if err := json.Unmarshal(b, &s); err != nil {
			errs = append(errs, fmt.Errorf("%s: not a job state: %w", f, err))
			continue
		}
		if s.JobID == "" {
			errs = append(errs, fmt.Errorf("%s: not a job state: no job_id", f))
			continue
		}
		out = append(out, s)
	}
	return out, errs
}
