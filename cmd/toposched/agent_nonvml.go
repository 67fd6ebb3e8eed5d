//go:build !nvml || !cgo

package main

import (
	"errors"

	"github.com/spf13/cobra"
)

// errNoNVML is what the agent of a toposched built without NVML answers
// when asked to discover. The default build leaves NVML out: go-nvml is
// cgo, and compiling it prints a page of gcc warnings that the README's
// commands, which need no GPU, should not (services/discovery/nvml's doc).
var errNoNVML = errors.New("agent: this toposched was built without NVML discovery; " +
	"build it with the tag nvml and cgo (CGO_ENABLED=1, a C compiler): " +
	`CGO_CFLAGS="-O2 -g -Wno-deprecated-declarations" go build -tags nvml ./cmd/toposched, ` +
	"or run the image deploy/Dockerfile builds; on a machine without NVML give --exec --cluster FILE --node NAME")

// runNVMLAgent says that this build has no NVML: only --exec --cluster,
// which describes the node from a file, runs.
func runNVMLAgent(*cobra.Command, *globals, *agentFlags, *execFlags) error {
	return errNoNVML
}
