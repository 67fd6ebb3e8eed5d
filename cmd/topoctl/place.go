package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/internal/client"
	"github.com/toposched/toposched/internal/formats/clusterfile"
	"github.com/toposched/toposched/internal/placer"
	"github.com/toposched/toposched/policies"
)

func newPlace(g *globals) *cobra.Command {
	var dryRun bool
	var cluster, occupiedFile, strategy, policyDir string
	cmd := &cobra.Command{
		Use:   "place --dry-run --cluster FILE [--occupied FILE] [--policies DIR|none] [--strategy topology-aware|blind|exhaustive] JOBFILE",
		Short: "Decide where a job would go, offline, and print the decision as placement.decided carries it",
		Long: `place --dry-run decides offline, with no operator running: the cluster of
--cluster, the GPUs of --occupied already in use (YAML or JSON: a list of
{node, gpus: [indices]}), and the job of JOBFILE. It prints the decision
exactly as placement.decided would carry it (-o json), with
prediction.comm_seconds_per_step and baseline.comm_seconds_per_step, or the
rejection or wait with every reason, counterfactual and explanation.

--policies DIR decides under the policy set of DIR (compiled and its Rego
tests run first, as the operator does); without it the shipped set applies,
as in toposched serve; --policies none turns policies off.

exhaustive is the optimum under the cost model, for jobs small enough to
enumerate; bigger ones are refused with a clear message.`,
		Example: "  topoctl place --dry-run --cluster deploy/examples/cluster.yaml deploy/examples/jobs/bert-ddp8.yaml -o json",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if !dryRun {
				return errors.New("place: only --dry-run is supported; submit jobs with topoctl submit")
			}
			if cluster == "" {
				return errors.New("place: --cluster is required")
			}
			c, err := clusterfile.LoadCluster(cluster)
			if err != nil {
				return err
			}
			var occupied []placer.Occupied
			if occupiedFile != "" {
				data, err := os.ReadFile(occupiedFile)
				if err != nil {
					return fmt.Errorf("place: --occupied: %w", err)
				}
				// The one decoder, strict: [0, 1.0] are GPUs 0 and 1, 1.5
				// and a misspelt field are refused naming the entry.
				body, err := client.YAMLToJSON(data)
				if err == nil {
					err = events.DecodeJSONStrict(body, &occupied)
				}
				if err != nil {
					return fmt.Errorf("place: --occupied %s: %w", occupiedFile, err)
				}
			}
			job, err := g.loadJob(args[0])
			if err != nil {
				return err
			}
			var set *policies.Set
			switch policyDir {
			case "none":
			case "":
				set, err = policies.Compile(policies.Default, "default")
			default:
				set, err = policies.CompileDir(policyDir)
			}
			if err != nil {
				return fmt.Errorf("place: --policies: %w", err)
			}
			name, v, err := placer.DryRun(c, occupied, *job, strategy, set)
			if err != nil {
				return err
			}
			if g.format == "json" {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(v)
			}
			o := client.Outcome{Name: name}
			switch x := v.(type) {
			case *events.PlacementDecided:
				o.Decided = x
			case *events.PlacementPending:
				o.Pending = x
			case *events.PlacementRejected:
				o.Rejected = x
			}
			return client.WriteOutcome(cmd.OutOrStdout(), o)
		},
	}
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "decide offline and print the decision (required)")
	cmd.Flags().StringVar(&cluster, "cluster", "", "cluster file (YAML or JSON)")
	cmd.Flags().StringVar(&occupiedFile, "occupied", "", "GPUs already in use: a list of {node, gpus: [indices]}")
	cmd.Flags().StringVar(&strategy, "strategy", placer.StrategyTopologyAware, "topology-aware, blind or exhaustive")
	cmd.Flags().StringVar(&policyDir, "policies", "", "policy set directory; none turns policies off (default: the shipped set)")
	return cmd
}
