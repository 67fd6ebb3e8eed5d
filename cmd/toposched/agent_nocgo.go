//go:build !cgo

package main

import (
	"errors"

	"github.com/spf13/cobra"
)

// Without cgo there is no NVML: the agent runs ranks for a node a cluster
// file describes (--exec --cluster), and says why it cannot discover.
func newAgent(g *globals) *cobra.Command {
	var ef execFlags
	var node string
	cmd := &cobra.Command{
		Use:   "agent --node NAME --exec --cluster FILE",
		Short: "Run the node agent's launcher (NVML discovery needs a build with cgo)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if ef.cluster == "" {
				return errors.New("agent: this toposched was built without cgo, so it has no NVML; build it with CGO_ENABLED=1, or give --exec --cluster FILE --node NAME")
			}
			return runLauncherOnly(cmd.Context(), g, &ef, node)
		},
	}
	cmd.Flags().StringVar(&node, "node", "", "node name, as the cluster file has it")
	ef.register(cmd.Flags())
	cmd.AddCommand(newRankExec())
	return cmd
}
