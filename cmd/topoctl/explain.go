package main

import (
	"encoding/json"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/internal/client"
)

func newExplain(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "explain JOB",
		Short: "Say what happened to a job and why: its state, events and latest outcome",
		Long: `explain reads every event about a job from the jobs and placement streams and
prints its state (submitted, analyzed, pending, decided, rejected, finished) with
times, the events in order, and the latest outcome in full:

  a decision: its nodes and CUDA_VISIBLE_DEVICES, every rank's node, GPU, local
  rank, NUMA node and NIC (the first and last beyond 32 ranks), the predicted
  communication against the blind first fit's (and, where placement weighs
  compute by GPU model, each one's compute on its slowest GPU model, with the
  comm fraction and speed-up on it), the policies' warnings, and how
  placement chose (policy revision, nodes considered and denied, domain levels,
  candidates and their costs);

  a wait or a rejection: every reason with the field and policy to blame, and
  what would let the job fit.

A body larger than 64 KiB that breaks its schema (a submission of megabytes
of numbers) is not decoded or shown: its size, SHA-256 (as a dead letter too
large to copy gives it in toposched-dead-sha256) and first bytes are, with why
the schema refuses it. A finish placement refused is marked ignored.

--format json prints the whole history: every event with its data.`,
		Example: "  topoctl explain llm-tp8-dp2\n  topoctl explain llm-tp8-dp2 -o json",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if g.format != "table" && g.format != "json" {
				return fmt.Errorf("--format %q: explain prints table or json", g.format)
			}
			if !events.ValidJobID(args[0]) {
				return fmt.Errorf("job id %q: expected letters, digits, '.', '_', ':' or '-'", args[0])
			}
			ctx := cmd.Context()
			b, err := g.connect(ctx)
			if err != nil {
				return err
			}
			defer closeBus(b)
			h, err := client.History(ctx, b, args[0])
			if err != nil {
				return err
			}
			if g.format == "json" {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(h)
			}
			return client.WriteExplain(cmd.OutOrStdout(), h)
		},
	}
}
