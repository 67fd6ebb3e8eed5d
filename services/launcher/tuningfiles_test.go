package launcher

import (
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/toposched/toposched/events"
)

// The tuning files go into the agent's own directory, never to the path a
// published event names: a root agent wrote there, following a link any
// local user could have left in /tmp (issue 46's review). The ranks' env
// points at the new place.
func TestTuningFilesStayInTheStateDir(t *testing.T) {
	stateDir, elsewhere := t.TempDir(), t.TempDir()
	victim := filepath.Join(elsewhere, "victim")
	if err := os.WriteFile(victim, []byte("keep"), 0o600); err != nil {
		t.Fatal(err)
	}
	named := filepath.Join(elsewhere, "topo.xml")
	if err := os.Symlink(victim, named); err != nil {
		t.Fatal(err)
	}
	// A link where the job's directory goes is replaced, not followed.
	if err := os.MkdirAll(filepath.Join(stateDir, tuningDir), 0o755); err != nil {
		t.Fatal(err)
	}
	job := "j:1"
	name, err := jobFileName(job)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(elsewhere, filepath.Join(stateDir, tuningDir, name)); err != nil {
		t.Fatal(err)
	}
	moved, err := writeTuningFiles(stateDir, job, []events.TuningFile{{Node: "a", Path: named, Content: "<system/>"},
		{Node: "a", Path: "/tmp/other/topo.xml", Content: "<other/>"}})
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(victim); string(b) != "keep" {
		t.Fatalf("the file behind the event's path was written: %q", b)
	}
	if _, err := os.Stat(filepath.Join(elsewhere, "0-topo.xml")); err == nil {
		t.Fatal("the tuning file went through the link in the state dir")
	}
	for from, to := range moved {
		if !strings.HasPrefix(to, filepath.Join(stateDir, tuningDir, name)+string(filepath.Separator)) {
			t.Errorf("%s moved to %s, outside the job's tuning directory", from, to)
		}
		if st, err := os.Stat(to); err != nil || st.Mode().Perm() != 0o644 {
			t.Errorf("%s: %v %v, want a file every rank may read", to, st, err)
		}
	}
	if len(moved) != 2 || moved[named] == moved["/tmp/other/topo.xml"] {
		t.Fatalf("moved %v, want two files apart", moved)
	}
	p := &plan{ranks: []rankSpec{{env: []string{"A=1", "NCCL_TOPO_FILE=" + named}}}}
	p.relocate(moved)
	if got := p.ranks[0].env[1]; got != "NCCL_TOPO_FILE="+moved[named] {
		t.Fatalf("env %q, want the moved file", got)
	}
	if err := removeTuningFiles(stateDir, job); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(stateDir, tuningDir, name)); !os.IsNotExist(err) {
		t.Fatalf("the job's tuning files stay after it: %v", err)
	}
}

// A state directory someone else could swap is refused: a link, a
// directory of another user above it, or one writable by others without
// the sticky bit.
func TestCheckOwnDir(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("no Unix owners on Windows")
	}
	base := t.TempDir()
	own := filepath.Join(base, "own")
	if err := os.Mkdir(own, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := checkOwnDir(own); err != nil {
		t.Fatalf("a directory of the agent's own refused: %v", err)
	}
	link := filepath.Join(base, "link")
	if err := os.Symlink(own, link); err != nil {
		t.Fatal(err)
	}
	if err := checkOwnDir(link); err == nil || !strings.Contains(err.Error(), "symbolic link") {
		t.Fatalf("a link: %v, want a refusal", err)
	}
	open := filepath.Join(base, "open")
	if err := os.Mkdir(open, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(open, 0o777); err != nil {
		t.Fatal(err)
	}
	inside := filepath.Join(open, "agent")
	if err := os.Mkdir(inside, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := checkOwnDir(inside); err == nil || !strings.Contains(err.Error(), "writable by others") {
		t.Fatalf("under a world-writable directory: %v, want a refusal", err)
	}
	if err := os.Chmod(open, 0o777|os.ModeSticky); err != nil {
		t.Fatal(err)
	}
	if err := checkOwnDir(inside); err != nil {
		t.Fatalf("under a sticky directory (as /tmp): %v", err)
	}
	if os.Geteuid() != 0 {
		return // chown to another user needs root
	}
	theirs := filepath.Join(base, "theirs")
	if err := os.Mkdir(theirs, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(theirs, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	if err := checkOwnDir(filepath.Join(theirs)); err == nil || !strings.Contains(err.Error(), "belongs to user 65534") {
		t.Fatalf("another user's directory: %v, want a refusal", err)
	}
}
