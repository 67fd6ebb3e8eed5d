package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/internal/client"
)

func newMigrate(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "migrate",
		Short: "List the optimizer's migration proposals and accept one",
		Long: `The optimizer proposes moving a running job (placement.migration) when a
placement it predicts faster is free now: a congested uplink, a degraded link,
GPUs freed. A proposal says what a step would save and its break-even time:
restart cost × step time / gain per step, after which the moved job is ahead.
Nothing moves until you accept; placement then applies exactly the proposed
GPUs, or refuses if they are no longer free or the job has moved since.`,
	}
	cmd.AddCommand(newMigrateList(g), newMigrateAccept(g))
	return cmd
}

func newMigrateList(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "list",
		Short: "List the latest migration proposal of every running job",
		Long: `list reads the placement stream and prints, per running job with a proposal,
its latest one: open (it can be accepted), stale (the job has moved since) or
applied, with the gain per step, the break-even time and the placements.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if g.format != "table" && g.format != "json" {
				return fmt.Errorf("--format %q: migrate list prints table or json", g.format)
			}
			ctx := cmd.Context()
			b, err := g.connect(ctx)
			if err != nil {
				return err
			}
			defer closeBus(b)
			ps, err := client.Proposals(ctx, b)
			if err != nil {
				return err
			}
			if g.format == "json" {
				if ps == nil {
					ps = []client.Proposal{}
				}
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(ps)
			}
			return client.WriteProposals(cmd.OutOrStdout(), ps)
		},
	}
}

func newMigrateAccept(g *globals) *cobra.Command {
	var proposal string
	var wait bool
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "accept JOB",
		Short: "Accept a job's migration proposal (the latest, or --proposal ID)",
		Long: `accept publishes jobs.migration_accepted. Placement re-checks the proposed GPUs
and moves the job in one step: new GPUs reserved, the ones it leaves freed, a
new placement.decided (with its migration: the proposal and the nodes left)
for the launcher to restart the job from. A stale proposal is refused
(placement.migration_refused) and nothing changes.

With --wait it prints the new placement or why it was refused (exit status 1).`,
		Example: "  topoctl migrate accept llm-7b --wait\n  topoctl migrate accept llm-7b --proposal 3f9a2c",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if g.format != "table" && g.format != "json" {
				return fmt.Errorf("--format %q: migrate accept prints table or json", g.format)
			}
			job := args[0]
			if !events.ValidJobID(job) {
				return fmt.Errorf("job id %q: expected letters, digits, '.', '_', ':' or '-'", job)
			}
			if proposal != "" && !events.ValidJobID(proposal) {
				return fmt.Errorf("--proposal %q: expected letters, digits, '.', '_', ':' or '-'", proposal)
			}
			ctx := cmd.Context()
			b, err := g.connect(ctx)
			if err != nil {
				return err
			}
			defer closeBus(b)
			out := cmd.OutOrStdout()
			if !wait {
				env, err := client.AcceptMigration(ctx, b, job, proposal)
				if err != nil {
					return err
				}
				_, err = fmt.Fprintf(out, "accepted the migration of %s (event %s); topoctl watch shows the new placement\n", job, env.ID)
				return err
			}
			ctx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			_, ans, err := client.AcceptMigrationAndWait(ctx, b, job, proposal)
			if errors.Is(err, context.DeadlineExceeded) {
				return fmt.Errorf("no answer to the migration of %s within %s: is toposched running?", job, timeout)
			}
			if err != nil {
				return err
			}
			if g.format == "json" {
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				if err := enc.Encode(ans); err != nil {
					return err
				}
			} else if err := client.WriteMigrationAnswer(out, ans); err != nil {
				return err
			}
			if ans.Refused != nil {
				return fmt.Errorf("migration of %s refused", job)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&proposal, "proposal", "", "the proposal to accept (default: the job's latest)")
	cmd.Flags().BoolVar(&wait, "wait", false, "wait for the new placement or the refusal and print it")
	cmd.Flags().DurationVar(&timeout, "timeout", time.Minute, "with --wait, give up after this long")
	return cmd
}
