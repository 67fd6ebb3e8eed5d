package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"

	"github.com/toposched/toposched/deploy/examples"
	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/events/bus"
	"github.com/toposched/toposched/events/natsserver"
	"github.com/toposched/toposched/internal/client"
	"github.com/toposched/toposched/internal/textout"
	"github.com/toposched/toposched/services/discovery"
	"github.com/toposched/toposched/services/operator"
)

func newDemo(g *globals) *cobra.Command {
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Run every service on an embedded NATS server with a sample cluster and jobs, and print the decisions",
		Long: `demo starts an embedded NATS server on a free loopback port with a temporary
data dir, runs all services, publishes the sample cluster of
deploy/examples/cluster.yaml, submits the sample jobs of deploy/examples/jobs,
prints each decision, finishes a job so that a waiting one is placed, and exits.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if g.logLevel == "info" {
				g.logLevel = "warn" // the demo's output is the decisions
			}
			log, err := g.logger()
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			return runDemo(ctx, g, cmd.OutOrStdout(), log)
		},
	}
	cmd.Flags().DurationVar(&timeout, "timeout", time.Minute, "give up after this long")
	return cmd
}

func runDemo(ctx context.Context, g *globals, stdout io.Writer, log *slog.Logger) error {
	dir, err := os.MkdirTemp("", "toposched-demo-")
	if err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	defer func() { _ = os.RemoveAll(dir) }() // a temporary directory: best effort
	clusterYAML, err := examples.FS.ReadFile("cluster.yaml")
	if err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	clusterFile := filepath.Join(dir, "cluster.yaml")
	if err := os.WriteFile(clusterFile, clusterYAML, 0o600); err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	// Secure as serve is: no one else on the host signs in to the demo's
	// server while it runs.
	creds, err := natsserver.EnsureCredentials(filepath.Join(dir, "credentials"), []natsserver.Role{{Name: roleOperator}})
	if err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	operatorSeed, err := creds.Option(roleOperator)
	if err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	cfg := natsserver.DefaultConfig()
	cfg.Port, cfg.StoreDir, cfg.Credentials = -1, filepath.Join(dir, "nats"), creds
	srv, err := natsserver.Start(cfg)
	if err != nil {
		return err
	}
	defer srv.Shutdown()
	bcfg := g.busConfig(srv.ClientURL(), "demo", log)
	bcfg.NATSOptions = []nats.Option{operatorSeed}
	b, err := bus.Connect(ctx, bcfg)
	if err != nil {
		return err
	}
	// Closed as the demo ends: JetStream acknowledged all it published,
	// and the embedded server goes next.
	defer func() { _ = b.Close() }()
	op, err := operator.New(operator.Config{Services: operator.All, Discovery: discovery.Config{ClusterFile: clusterFile}, Sole: true},
		operator.Deps{Bus: b, Log: log})
	if err != nil {
		return err
	}
	stop, err := operator.Background(ctx, op)
	if err != nil {
		return err
	}
	defer func() { _ = stop() }() // a failed service shows as an outcome that never comes

	// out remembers the first failed write; the demo stops at the next
	// step with it.
	out := textout.New(stdout)
	out.Printf("toposched demo: embedded NATS at %s, sample cluster %q (4 x 8 A100 NVSwitch, 2 x 4 L40S PCIe)\n\n",
		srv.ClientURL(), "lab")
	outcomes := make(chan client.Outcome, 64)
	ready := make(chan struct{})
	watchCtx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	go func() {
		_ = client.Watch(watchCtx, b, client.FromStart, ready, func(o client.Outcome) error {
			outcomes <- o
			return nil
		})
	}()
	<-ready
	// await prints outcomes until one for job of the wanted kind arrives.
	await := func(job string, want func(client.Outcome) bool) error {
		for {
			select {
			case o := <-outcomes:
				if o.Released == nil {
					_ = client.WriteOutcome(out, o) // its error is out's
					out.Println()
				}
				if o.JobID() == job && want(o) {
					return nil
				}
			case <-ctx.Done():
				return fmt.Errorf("demo: no outcome for %s: %w", job, ctx.Err())
			}
		}
	}
	settled := func(o client.Outcome) bool { return o.Decided != nil || o.Rejected != nil || o.Pending != nil }
	for _, path := range examples.DemoJobs {
		data, err := examples.FS.ReadFile(path)
		if err != nil {
			return fmt.Errorf("demo: %w", err)
		}
		job, err := client.ParseJob(path, data)
		if err != nil {
			return fmt.Errorf("demo: %w", err)
		}
		out.Printf("$ topoctl submit %s\n", path)
		if err := out.Err(); err != nil {
			return err
		}
		if _, err := client.Submit(ctx, b, job); err != nil {
			return err
		}
		if err := await(job.JobID, settled); err != nil {
			return err
		}
	}
	// A person with the nats CLI, no CloudEvents headers, and a typo.
	typo := `{"job_id":"typo","gpu":8}`
	out.Printf("$ nats pub toposched.jobs.submitted '%s'\n", typo)
	if err := out.Err(); err != nil {
		return err
	}
	if err := b.PublishRaw(ctx, b.Subjects.Of(events.NameJobSubmitted), nil, []byte(typo)); err != nil {
		return err
	}
	if err := await("typo", settled); err != nil {
		return err
	}
	for _, job := range []string{"notebook-4", "bert-ddp8"} {
		out.Printf("$ topoctl finish %s\n", job)
		if err := out.Err(); err != nil {
			return err
		}
		if _, err := client.Finish(ctx, b, job, events.StatusSucceeded); err != nil {
			return err
		}
	}
	out.Println("# two nodes are free again: the waiting moe-ep4 is placed")
	if err := await("moe-ep4", func(o client.Outcome) bool { return o.Decided != nil }); err != nil {
		return err
	}
	st := op.PlacementService().Store().Snapshot()
	total, _ := st.Capacity("")
	out.Printf("done: %d of %d GPUs free. Each decision shows the cost model's prediction for the\n"+
		"topology-aware placement beside the blind first-fit baseline on the same cluster state.\n",
		st.FreeCount(), total)
	return out.Err()
}
