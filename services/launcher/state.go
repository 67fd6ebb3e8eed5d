package launcher

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// The state directory holds, besides the agent's own files (agent.alive,
// telemetry.addr), one directory per job under jobs/, named by
// jobFileName(job id):
//
//	jobs/<name>/state.json   the job's jobState (0600), while its ranks run
//	jobs/<name>/rank-N.log   rank N's output (kept after the job ends)
//	jobs/<name>/rank-N.exit  how rank N ended, written by its shim
//
// The name is an injective encoding of the id, so that no two jobs share a
// file, whatever their ids; the state file's job_id says the same. An
// agent before this layout wrote <id with ':' as '_'>.job.json beside a
// directory of that name: readStates still reads those, for the ranks such
// an agent left running, and the job_id inside is what counts.

// jobState is what the agent writes when it starts a job's ranks, so that
// a restarted agent knows which processes are the job's.
type jobState struct {
	JobID string      `json:"job_id"`
	Ranks []rankState `json:"ranks"`
	// TelemetryToken is the job's pass to the telemetry endpoint, in its
	// ranks' environment: the file is the agent's alone (0600).
	TelemetryToken string `json:"telemetry_token,omitempty"`

	// path is the file the state was read from (or written to).
	path string
	// unreadable is set for a job whose state file is there but cannot
	// be read: its ranks may run, and are not known.
	unreadable error
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

const (
	jobsDir   = "jobs"
	stateFile = "state.json"
	// legacySuffix ends the state files of the layout before jobs/.
	legacySuffix = ".job.json"
	// maxFileName is the longest file name Linux file systems take.
	maxFileName = 255
)

// jobFileName is the name of a job's directory: the id's bytes, except
// that ':' (common in ids, and refused by some file systems) becomes '+',
// and every byte other than an ASCII letter, digit, '_', '-' or a '.' that
// is not the first becomes %XX (upper-case hex), '%' and '+' included. So
// two ids never share a name, a name is never "", "." or ".." and never
// holds a '/', and parseJobFileName gives the id back. A valid job id
// (events.ValidJobID) keeps its length; an id whose name would be longer
// than a file name may be is refused.
func jobFileName(id string) (string, error) {
	if id == "" {
		return "", errors.New("empty job id")
	}
	var sb strings.Builder
	for i := 0; i < len(id); i++ {
		c := id[i]
		switch {
		case plainByte(c, i):
			sb.WriteByte(c)
		case c == ':':
			sb.WriteByte('+')
		default:
			fmt.Fprintf(&sb, "%%%02X", c)
		}
	}
	if sb.Len() > maxFileName {
		return "", fmt.Errorf("job id of %d bytes: its file name would be %d bytes, over the %d a file name may have", len(id), sb.Len(), maxFileName)
	}
	return sb.String(), nil
}

// plainByte reports whether byte c at index i of an id stands for itself
// in its file name.
func plainByte(c byte, i int) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '_', c == '-':
		return true
	case c == '.':
		return i > 0
	}
	return false
}

// parseJobFileName is jobFileName's inverse. A name jobFileName would not
// make (a stray file, %xx in lower case, %41 for 'A') is an error, so that
// no two names stand for one id.
func parseJobFileName(name string) (string, error) {
	var sb strings.Builder
	for i := 0; i < len(name); i++ {
		switch c := name[i]; c {
		case '+':
			sb.WriteByte(':')
		case '%':
			if i+2 >= len(name) {
				return "", fmt.Errorf("file name %q: %% at %d without two hex digits", name, i)
			}
			hi, lo := unhex(name[i+1]), unhex(name[i+2])
			if hi < 0 || lo < 0 {
				return "", fmt.Errorf("file name %q: %% at %d without two upper-case hex digits", name, i)
			}
			sb.WriteByte(byte(hi<<4 | lo))
			i += 2
		default:
			sb.WriteByte(c)
		}
	}
	id := sb.String()
	if again, err := jobFileName(id); err != nil || again != name {
		return "", fmt.Errorf("file name %q: not the name of a job id", name)
	}
	return id, nil
}

func unhex(c byte) int {
	switch {
	case '0' <= c && c <= '9':
		return int(c - '0')
	case 'A' <= c && c <= 'F':
		return int(c-'A') + 10
	}
	return -1
}

// jobDir is the directory of a job's state and rank files.
func jobDir(stateDir, id string) (string, error) {
	name, err := jobFileName(id)
	if err != nil {
		return "", err
	}
	return filepath.Join(stateDir, jobsDir, name), nil
}

// makeJobDir creates the job's directory, the agent's alone: the ranks
// (another user, with run_as) write only through the descriptors they are
// given.
func makeJobDir(stateDir, id string) (string, error) {
	dir, err := jobDir(stateDir, id)
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(filepath.Join(stateDir, jobsDir), 0o700); err != nil {
		return "", err
	}
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return "", err
	}
	st, err := os.Lstat(dir)
	if err != nil {
		return "", err
	}
	if !st.IsDir() {
		return "", fmt.Errorf("%s: not a directory", dir)
	}
	return dir, nil
}

// writeState writes s into its job's directory, which must exist.
func writeState(stateDir string, s *jobState) error {
	b, err := json.Marshal(s)
	if err != nil {
		return err
	}
	dir, err := jobDir(stateDir, s.JobID)
	if err != nil {
		return err
	}
	path := filepath.Join(dir, stateFile)
	if err := os.WriteFile(path+".tmp", b, 0o600); err != nil {
		return err
	}
	if err := os.Rename(path+".tmp", path); err != nil {
		return err
	}
	s.path = path
	return nil
}

// removeState removes the file s was read from or written to.
func removeState(s *jobState) error {
	if s.path == "" {
		return nil
	}
	err := os.Remove(s.path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return err
}

// readStates reads every job state in the state directory, in its layout
// and the one before. One that cannot be read is reported and skipped, so
// one torn file does not stop the agent; in this layout its directory
// still names the job, which comes back marked unreadable. A job found in
// both layouts comes back once, from this one.
func readStates(stateDir string) ([]jobState, []error) {
	var out []jobState
	var errs []error
	seen := map[string]bool{}
	dirs, err := os.ReadDir(filepath.Join(stateDir, jobsDir))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, err)
	}
	for _, d := range dirs {
		id, err := parseJobFileName(d.Name())
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", filepath.Join(stateDir, jobsDir, d.Name()), err))
			continue
		}
		path := filepath.Join(stateDir, jobsDir, d.Name(), stateFile)
		s, err := readState(path)
		switch {
		case errors.Is(err, os.ErrNotExist):
			continue // a job that ended: its logs are kept
		case err == nil && s.JobID != id:
			err = fmt.Errorf("%s: job_id %q, but the directory is %q's", path, s.JobID, id)
		}
		if err != nil {
			errs = append(errs, err)
			s = jobState{JobID: id, path: path, unreadable: err}
		}
		seen[id] = true
		out = append(out, s)
	}
	legacy, err := filepath.Glob(filepath.Join(stateDir, "*"+legacySuffix))
	if err != nil {
		errs = append(errs, err)
	}
	for _, path := range legacy {
		s, err := readState(path)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if seen[s.JobID] {
			errs = append(errs, fmt.Errorf("%s: job %q has a state in %s too, which is the one read", path, s.JobID, jobsDir))
			continue
		}
		seen[s.JobID] = true
		out = append(out, s)
	}
	return out, errs
}

func readState(path string) (jobState, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return jobState{}, err
	}
	var s jobState
	if err := json.Unmarshal(b, &s); err != nil {
		return jobState{}, fmt.Errorf("%s: not a job state: %w", path, err)
	}
	if s.JobID == "" {
		return jobState{}, fmt.Errorf("%s: not a job state: no job_id", path)
	}
	s.path = path
	return s, nil
}

// rankLogPath and rankExitPath are where a rank's output and its shim's
// word on its end go, in the job's directory.
func rankLogPath(jobDir string, rank int) string {
	return filepath.Join(jobDir, fmt.Sprintf("rank-%d.log", rank))
}

func rankExitPath(jobDir string, rank int) string {
	return filepath.Join(jobDir, fmt.Sprintf("rank-%d.exit", rank))
}

// checkCaseSensitive refuses a state directory on a file system that
// folds case (macOS's default, a casefold directory): job ids that differ
// only in case would share their files there.
func checkCaseSensitive(dir string) error {
	f, err := os.CreateTemp(dir, ".case-probe-")
	if err != nil {
		return err
	}
	name := f.Name()
	defer func() { _ = os.Remove(name) }() // a probe; nothing to keep
	if err := f.Close(); err != nil {
		return err
	}
	upper := filepath.Join(dir, strings.ToUpper(filepath.Base(name)))
	if _, err := os.Stat(upper); err == nil {
		return fmt.Errorf("%s: the file system does not tell names apart by case, so job ids that differ only in case would share their files: use a directory on a case-sensitive one", dir)
	}
	return nil
}
