//go:build !nvml || !cgo

package main

import (
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// Built without NVML, the agent takes the NVML agent's whole command line
// and, asked to discover, says how to get a toposched that can.
func TestAgentWithoutNVMLSaysHowToGetIt(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"--print"},
		{"--print", "--sysfs", t.TempDir()},
		{"--node", "gpu-001", "--position", "3", "--label", "rack=r3", "--rediscover", "1m"},
		{"--node", "gpu-001", "--nats-token-file", "/nonexistent/token", "--exec", "--run-as-allow", "nobody"},
	} {
		_, err := runAgent(t, args...)
		if !errors.Is(err, errNoNVML) {
			t.Errorf("agent %s: got %v, want errNoNVML", strings.Join(args, " "), err)
		}
	}
	// The message is what a user on a GPU node reads: how to build it.
	for _, want := range []string{"-tags nvml", "CGO_ENABLED=1", "deploy/Dockerfile", "--exec --cluster FILE --node NAME"} {
		if !strings.Contains(errNoNVML.Error(), want) {
			t.Errorf("errNoNVML does not say %q: %v", want, errNoNVML)
		}
	}
}

// The README's commands (go run ./cmd/toposched demo, go test ./...) must
// not compile go-nvml: its cgo makes gcc print a page of deprecation
// warnings on a fresh build cache. Only a build with -tags nvml may
// reach it.
func TestDefaultBuildLeavesOutGoNVML(t *testing.T) {
	t.Parallel()
	cmd := exec.Command("go", "list", "-deps", "-test", "github.com/toposched/toposched/...")
	// A GOFLAGS=-tags=nvml of the caller's would put NVML back in.
	cmd.Env = append(os.Environ(), "GOFLAGS=")
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("go list: %v\n%s", err, ee.Stderr)
		}
		t.Fatalf("go list: %v", err)
	}
	var nvml []string
	for _, pkg := range strings.Fields(string(out)) {
		if strings.HasPrefix(pkg, "github.com/NVIDIA/go-nvml/") {
			nvml = append(nvml, pkg)
		}
	}
	if len(nvml) > 0 {
		t.Errorf("the default build of ./... depends on %s; keep go-nvml behind the nvml build tag", strings.Join(nvml, ", "))
	}
}
