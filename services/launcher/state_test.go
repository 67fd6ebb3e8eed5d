package launcher

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestStates(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	want := jobState{JobID: "job:1", Ranks: []rankState{{Rank: 0, PID: 10, Start: 99, Log: "/l/0", Exit: "/l/0.exit"}}}
	if err := writeState(dir, want); err != nil {
		t.Fatal(err)
	}
	if base := filepath.Base(statePath(dir, "job:1")); strings.Contains(base, ":") {
		t.Errorf("state file %q holds a ':'", base)
	}
	for name, body := range map[string]string{"torn" + stateSuffix: `{"job_id": "x", "ra`, "empty" + stateSuffix: `{}`} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	got, errs := readStates(dir)
	if len(got) != 1 || !reflect.DeepEqual(got[0], want) {
		t.Errorf("states %+v, want %+v", got, want)
	}
	if len(errs) != 2 {
		t.Errorf("errors %v, want one per unreadable file", errs)
	}
	if err := removeState(dir, "job:1"); err != nil {
		t.Fatal(err)
	}
	if err := removeState(dir, "job:1"); err != nil {
		t.Errorf("removing a state twice: %v", err)
	}
	if got, _ := readStates(dir); len(got) != 0 {
		t.Errorf("states after removal: %+v", got)
	}
}
