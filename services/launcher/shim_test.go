package launcher

import (
	"path/filepath"
	"testing"
)

func TestRunShim(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		argv     []string
		wantCode int
		want     shimExit
	}{
		{"exit 0", []string{"sh", "-c", "exit 0"}, 0, shimExit{ExitCode: 0}},
		{"exit 3", []string{"sh", "-c", "exit 3"}, 3, shimExit{ExitCode: 3}},
		{"killed by a signal", []string{"sh", "-c", "kill -TERM $$"}, 128 + 15, shimExit{ExitCode: -1, Signal: "terminated"}},
		{"no such program", []string{"/no/such/program"}, 127, shimExit{ExitCode: 127}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			file := filepath.Join(t.TempDir(), "rank-0.exit")
			if code := RunShim(file, tc.argv); code != tc.wantCode {
				t.Errorf("RunShim = %d, want %d", code, tc.wantCode)
			}
			got, ok := readShimExit(file)
			if !ok || got != tc.want {
				t.Errorf("exit file %+v (%v), want %+v", got, ok, tc.want)
			}
		})
	}
}
