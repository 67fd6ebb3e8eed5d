//go:build !cgo

package main

import (
	"errors"

	"github.com/spf13/cobra"
)

// Without cgo there is no NVML: the agent says so rather than vanishing
// from --help.
func newAgent(*globals) *cobra.Command {
	return &cobra.Command{
		Use:   "agent",
		Short: "Run the node agent (needs a build with cgo for NVML)",
		RunE: func(*cobra.Command, []string) error {
			return errors.New("agent: this toposched was built without cgo, so it has no NVML; build it with CGO_ENABLED=1")
		},
	}
}
