package launcher

import (
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"
)

// checkFileName fails unless name is a single, ordinary file name.
func checkFileName(t testing.TB, id, name string) {
	t.Helper()
	switch {
	case name == "" || name == "." || name == "..":
		t.Errorf("id %q: file name %q", id, name)
	case strings.ContainsAny(name, "/\x00"):
		t.Errorf("id %q: file name %q holds a '/' or a NUL", id, name)
	case len(name) > maxFileName:
		t.Errorf("id %q: file name of %d bytes", id, len(name))
	case strings.HasPrefix(name, "."):
		t.Errorf("id %q: file name %q is hidden", id, name)
	}
	for i := range len(name) {
		if c := name[i]; c < 0x21 || c > 0x7e {
			t.Errorf("id %q: file name %q holds byte %#x", id, name, c)
		}
	}
}

func TestJobFileName(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		id, want string
	}{
		{"job-1", "job-1"},
		{"llm.tp8_dp2", "llm.tp8_dp2"},
		// Ids differing only in punctuation.
		{"r:1", "r+1"},
		{"r_1", "r_1"},
		{"r.1", "r.1"},
		{"r-1", "r-1"},
		// The escapes escaped.
		{"r+1", "r%2B1"},
		{"r%1", "r%251"},
		{"r%2B1", "r%252B1"},
		// Path-like ids stay one name.
		{"zz", "zz"},
		{"zz.job.json", "zz.job.json"},
		{"x.tmp", "x.tmp"},
		{"rank-0.log", "rank-0.log"},
		{"state.json", "state.json"},
		{".", "%2E"},
		{"..", "%2E."},
		{".hidden", "%2Ehidden"},
		{"a/b", "a%2Fb"},
		{"../../etc/passwd", "%2E.%2F..%2Fetc%2Fpasswd"},
		// What the schema refuses, the agent still names apart.
		{"a b", "a%20b"},
		{"a\x00b", "a%00b"},
		{"é", "%C3%A9"},
		{"\xff", "%FF"},
		{"Job", "Job"},
		{"job", "job"},
		{strings.Repeat(":", 128), strings.Repeat("+", 128)},
		{strings.Repeat("x", 255), strings.Repeat("x", 255)},
	} {
		got, err := jobFileName(tc.id)
		if err != nil || got != tc.want {
			t.Errorf("jobFileName(%q) = %q, %v; want %q", tc.id, got, err, tc.want)
			continue
		}
		checkFileName(t, tc.id, got)
		if back, err := parseJobFileName(got); err != nil || back != tc.id {
			t.Errorf("parseJobFileName(%q) = %q, %v; want %q", got, back, err, tc.id)
		}
	}
	for _, id := range []string{"", strings.Repeat("x", 256), strings.Repeat("/", 86)} {
		if name, err := jobFileName(id); err == nil {
			t.Errorf("jobFileName(%q) = %q, want an error", id, name)
		}
	}
}

func TestParseJobFileNameRefuses(t *testing.T) {
	t.Parallel()
	for _, name := range []string{
		"", ".", "..", ".x", "a:b", "a b", "a/b", "%", "%4", "%4g", "%2e", "%41", "%5F", "a%2", "é",
		"agent.alive" + "/x", strings.Repeat("x", 256),
	} {
		if id, err := parseJobFileName(name); err == nil {
			t.Errorf("parseJobFileName(%q) = %q, want an error: jobFileName makes no such name", name, id)
		}
	}
}

// randomID draws an id from alphabets chosen to collide under a careless
// encoding: punctuation, the escapes, path separators, NUL, non-ASCII.
func randomID(r *rand.Rand) string {
	alphabets := []string{
		"abcXYZ019",
		"._:-",
		"%+_:",
		"/.\x00 ",
		"éü€",
	}
	n := 1 + r.IntN(40)
	var sb strings.Builder
	for range n {
		switch r.IntN(6) {
		case 5:
			sb.WriteByte(byte(r.IntN(256)))
		default:
			a := []rune(alphabets[r.IntN(len(alphabets))])
			sb.WriteRune(a[r.IntN(len(a))])
		}
	}
	return sb.String()
}

// TestJobFileNameProperty: over many ids, every name is one file name,
// no two ids share a name, and each name gives its id back.
func TestJobFileNameProperty(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(46, 1))
	byName := map[string]string{}
	for range 20000 {
		id := randomID(r)
		name, err := jobFileName(id)
		if err != nil {
			t.Fatalf("jobFileName(%q): %v", id, err)
		}
		checkFileName(t, id, name)
		if other, ok := byName[name]; ok && other != id {
			t.Fatalf("ids %q and %q share the file name %q", other, id, name)
		}
		byName[name] = id
		if back, err := parseJobFileName(name); err != nil || back != id {
			t.Fatalf("parseJobFileName(%q) = %q, %v; want %q", name, back, err, id)
		}
	}
	if len(byName) < 10000 {
		t.Fatalf("only %d distinct ids drawn", len(byName))
	}
}

// FuzzJobFileName: any string either is refused or names one file, and
// any name parseJobFileName takes is the name of what it returns.
func FuzzJobFileName(f *testing.F) {
	for _, s := range []string{"r:1", "r_1", "zz.job.json", "%2B", "+", ".", "..", "a/b", "\x00", "é"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if name, err := jobFileName(s); err == nil {
			checkFileName(t, s, name)
			if back, err := parseJobFileName(name); err != nil || back != s {
				t.Fatalf("parseJobFileName(jobFileName(%q)) = %q, %v", s, back, err)
			}
		} else if s != "" && len(s) <= maxFileName/3 {
			t.Fatalf("jobFileName(%q): %v", s, err)
		}
		if id, err := parseJobFileName(s); err == nil {
			if again, _ := jobFileName(id); again != s {
				t.Fatalf("parseJobFileName(%q) = %q, whose name is %q", s, id, again)
			}
			if !utf8.ValidString(s) {
				t.Fatalf("parseJobFileName took %q", s)
			}
		}
	})
}

func TestStates(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	var want []jobState
	for _, id := range []string{"r:1", "r_1", "zz", "zz.job.json"} {
		jd, err := makeJobDir(dir, id)
		if err != nil {
			t.Fatal(err)
		}
		s := jobState{JobID: id, Ranks: []rankState{{Rank: 0, PID: 10, Start: 99, Log: rankLogPath(jd, 0), Exit: rankExitPath(jd, 0)}}}
		if err := writeState(dir, &s); err != nil {
			t.Fatal(err)
		}
		want = append(want, s)
	}
	// A job whose ranks ended leaves its logs, not its state; a stray
	// name is not a job.
	if _, err := makeJobDir(dir, "ended"); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, jobsDir, "a:b"), 0o700); err != nil {
		t.Fatal(err)
	}
	got, errs := readStates(dir)
	byID := map[string]jobState{}
	for _, s := range got {
		byID[s.JobID] = s
	}
	if len(got) != len(want) {
		t.Errorf("read %d states, want %d: %+v", len(got), len(want), got)
	}
	for _, w := range want {
		if g := byID[w.JobID]; !reflect.DeepEqual(g, w) {
			t.Errorf("state of %s: %+v, want %+v", w.JobID, g, w)
		}
	}
	if len(errs) != 1 || !strings.Contains(errs[0].Error(), "a:b") {
		t.Errorf("errors %v, want one, for the stray directory", errs)
	}
	for _, w := range want {
		if err := removeState(&w); err != nil {
			t.Fatal(err)
		}
		if err := removeState(&w); err != nil {
			t.Errorf("removing a state twice: %v", err)
		}
	}
	if got, _ := readStates(dir); len(got) != 0 {
		t.Errorf("states after removal: %+v", got)
	}
}

// TestStatesUnreadable: a torn state file, or one that names another job,
// still says its job was started here.
func TestStatesUnreadable(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for id, body := range map[string]string{"torn": `{"job_id": "torn", "ra`, "empty": `{}`, "other": `{"job_id": "r:1", "ranks": []}`} {
		jd, err := makeJobDir(dir, id)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(jd, stateFile), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	got, errs := readStates(dir)
	if len(got) != 3 || len(errs) != 3 {
		t.Fatalf("states %+v, errors %v: want three, unreadable", got, errs)
	}
	for _, s := range got {
		if s.unreadable == nil || len(s.Ranks) != 0 || !strings.HasSuffix(s.path, stateFile) {
			t.Errorf("state %+v: want it unreadable, without ranks", s)
		}
		if s.JobID != "torn" && s.JobID != "empty" && s.JobID != "other" {
			t.Errorf("state of %q: the directory names the job", s.JobID)
		}
	}
}

// TestStatesLegacy: the state files of an agent before jobs/ are read,
// the job_id inside them counting (their names are lossy), and one
// superseded by a state in jobs/ is not read twice.
func TestStatesLegacy(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	legacy := map[string]string{
		"r_1.job.json":  `{"job_id":"r:1","ranks":[{"rank":0,"pid":10,"start":5,"log":"/s/r_1/rank-0.log","exit":"/s/r_1/rank-0.exit"}],"telemetry_token":"t"}`,
		"zz.job.json":   `{"job_id":"zz","ranks":[]}`,
		"both.job.json": `{"job_id":"both","ranks":[]}`,
		"torn.job.json": `{"job_`,
	}
	for name, body := range legacy {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := makeJobDir(dir, "both"); err != nil {
		t.Fatal(err)
	}
	if err := writeState(dir, &jobState{JobID: "both", Ranks: []rankState{{Rank: 1, PID: 11}}}); err != nil {
		t.Fatal(err)
	}
	got, errs := readStates(dir)
	byID := map[string]jobState{}
	for _, s := range got {
		byID[s.JobID] = s
	}
	if len(got) != 3 {
		t.Fatalf("states %+v, want r:1, zz and both", got)
	}
	want := jobState{JobID: "r:1", TelemetryToken: "t", path: filepath.Join(dir, "r_1.job.json"),
		Ranks: []rankState{{Rank: 0, PID: 10, Start: 5, Log: "/s/r_1/rank-0.log", Exit: "/s/r_1/rank-0.exit"}}}
	if !reflect.DeepEqual(byID["r:1"], want) {
		t.Errorf("legacy state %+v, want %+v", byID["r:1"], want)
	}
	if s := byID["both"]; len(s.Ranks) != 1 || filepath.Base(s.path) != stateFile {
		t.Errorf("state of both %+v, want the one in %s", s, jobsDir)
	}
	if len(errs) != 2 {
		t.Errorf("errors %v, want the torn file and the superseded one", errs)
	}
	// Removed once the job is done, as a state in jobs/ is.
	s := byID["r:1"]
	if err := removeState(&s); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "r_1.job.json")); !os.IsNotExist(err) {
		t.Errorf("legacy state still there: %v", err)
	}
}

// TestMakeJobDir: a job's directory is the agent's alone, and a file
// where it should be is an error, not a directory of another job.
func TestMakeJobDir(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	jd, err := makeJobDir(dir, "zz")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{filepath.Join(dir, jobsDir), jd} {
		if fi, err := os.Stat(p); err != nil || fi.Mode().Perm() != 0o700 {
			t.Errorf("%s: %v, %v; want a directory of mode 0700", p, fi.Mode(), err)
		}
	}
	if again, err := makeJobDir(dir, "zz"); err != nil || again != jd {
		t.Errorf("makeJobDir again: %q, %v", again, err)
	}
	name, _ := jobFileName("f")
	if err := os.WriteFile(filepath.Join(dir, jobsDir, name), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := makeJobDir(dir, "f"); err == nil {
		t.Errorf("makeJobDir over a file: no error")
	}
}

func TestCheckCaseSensitive(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	if err := checkCaseSensitive(dir); err != nil {
		t.Fatalf("a Linux temporary directory: %v", err)
	}
	if left, _ := os.ReadDir(dir); len(left) != 0 {
		t.Errorf("the probe left %v", left)
	}
}
