//go:build nvml && cgo

package main

import (
	"errors"
	"testing"

	"github.com/toposched/toposched/services/discovery/nvml"
)

// Built with NVML, agent --print reaches the system's NVML: it prints the
// node on a GPU machine, and elsewhere fails for want of the library, not
// for want of the build.
func TestAgentPrintReachesNVML(t *testing.T) {
	t.Parallel()
	out, err := runAgent(t, "--print", "--sysfs", t.TempDir())
	if err != nil && !errors.Is(err, nvml.ErrNVMLNotAvailable) {
		t.Fatalf("agent --print: %v, want success or nvml.ErrNVMLNotAvailable\n%s", err, out)
	}
	t.Logf("agent --print: %v\n%s", err, out)
}
