// Command topoctl is the user's CLI for toposched: submit jobs, watch
// placement outcomes, finish jobs.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/events/bus"
	"github.com/toposched/toposched/internal/client"
	"github.com/toposched/toposched/internal/natsflags"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := newRoot().ExecuteContext(ctx); err != nil {
		var ee *exitError
		if errors.As(err, &ee) {
			if ee.msg != "" {
				fmt.Fprintln(os.Stderr, "topoctl:", ee.msg)
			}
			os.Exit(ee.code)
		}
		fmt.Fprintln(os.Stderr, "topoctl:", err)
		os.Exit(1)
	}
}

type globals struct {
	natsURL string
	prefix  string
	format  string
	// tenant is whose jobs this user submits, finishes and moves: the
	// scope of what it publishes (events.Scope), and, without
	// credentials given, the tenant-<tenant> seed serve generated.
	tenant string
	// conn is how to authenticate to NATS and secure the connection.
	conn natsflags.Flags
}

func newRoot() *cobra.Command {
	g := &globals{}
	root := &cobra.Command{
		Use:   "topoctl",
		Short: "Submit jobs to toposched and follow where they are placed",
		Long: `topoctl talks to a running toposched over NATS: it publishes jobs.submitted
and jobs.finished events and reads placement.decided, placement.pending and
placement.rejected.`,
		SilenceUsage:  true,
		SilenceErrors: true,
		// One check of the output format for every command.
		PersistentPreRunE: func(*cobra.Command, []string) error {
			if g.format != "table" && g.format != "json" && g.format != "dot" {
				return fmt.Errorf("--format %q: expected table, json or dot", g.format)
			}
			return nil
		},
	}
	pf := root.PersistentFlags()
	pf.StringVar(&g.natsURL, "nats-url", envOr("TOPOSCHED_NATS_URL", "nats://127.0.0.1:4222"),
		"NATS server URL(s) of the toposched deployment (env TOPOSCHED_NATS_URL)")
	pf.StringVar(&g.prefix, "prefix", envOr("TOPOSCHED_PREFIX", events.DefaultPrefix), "first token of every event subject")
	pf.StringVarP(&g.format, "format", "o", "table", "output format: table or json (topology show also takes dot)")
	pf.StringVar(&g.format, "output", "table", "same as --format")
	_ = pf.MarkHidden("output")
	pf.StringVar(&g.tenant, "tenant", os.Getenv("TOPOSCHED_TENANT"),
		"the tenant whose jobs you submit, finish and move (env TOPOSCHED_TENANT); a job without a tenant gets it, and one of another tenant is refused")
	g.conn.Register(pf)
	root.AddCommand(newSubmit(g), newWatch(g), newFinish(g), newTopology(g))
	root.AddCommand(newPolicy(g))
	root.AddCommand(newCalibration(g))
	root.AddCommand(newPlace(g))
	root.AddCommand(newExplain(g))
	root.AddCommand(newMigrate(g))
	root.AddCommand(newRun(g), newLaunchArgs(g), newSlurmArgs(g))
	return root
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

// connect connects as a user: a tenant's, or without --tenant an
// administrator's (the launcher role).
func (g *globals) connect(ctx context.Context) (*bus.Bus, error) {
	role := "launcher"
	if g.tenant != "" {
		var err error
		if role, err = events.TenantScope(g.tenant).Role(); err != nil {
			return nil, fmt.Errorf("--tenant: %w", err)
		}
	}
	return g.connectAs(ctx, role)
}

// connectPolicyAdmin connects as the one who pushes policy and
// calibration sets (the policy-admin role).
func (g *globals) connectPolicyAdmin(ctx context.Context) (*bus.Bus, error) {
	return g.connectAs(ctx, "policy-admin")
}

// connectAs connects with the credentials given, or else with role's seed
// in serve's credentials directory, where there is one.
func (g *globals) connectAs(ctx context.Context, role string) (*bus.Bus, error) {
	conn := g.conn
	conn.Role = role
	opts, err := conn.Options()
	if err != nil {
		return nil, err
	}
	b, err := bus.Connect(ctx, bus.Config{URL: g.natsURL, Prefix: g.prefix, Source: "urn:toposched:topoctl", ConnectTimeout: 5 * time.Second, SkipStreams: true,
		NATSOptions: opts, Scope: events.TenantScope(g.tenant)})
	return b, conn.Explain(err)
}

// loadJob reads a job file as client.LoadJob does, and makes it --tenant's
// job: a job naming no tenant gets it, and one naming another is refused
// here, rather than by the server's permissions.
func (g *globals) loadJob(path string) (*events.JobSubmitted, error) {
	job, err := client.LoadJob(path)
	if err != nil || g.tenant == "" {
		return job, err
	}
	switch job.Tenant {
	case "":
		job.Tenant = g.tenant
	case g.tenant:
	default:
		return nil, fmt.Errorf("%s: tenant: %q, but --tenant is %q: a tenant submits its own jobs only", path, job.Tenant, g.tenant)
	}
	return job, nil
}

// closeBus closes a command's connection on its way out. Its error is
// dropped: JetStream has acknowledged whatever the command published before
// the command returns, so a failed drain loses nothing it reported.
func closeBus(b *bus.Bus) { _ = b.Close() }

func (g *globals) print(w io.Writer, o client.Outcome) error {
	if g.format == "json" {
		var v any
		switch {
		case o.Decided != nil:
			v = o.Decided
		case o.Pending != nil:
			v = o.Pending
		case o.Rejected != nil:
			v = o.Rejected
		default:
			v = o.Released
		}
		return json.NewEncoder(w).Encode(struct {
			Event string `json:"event"`
			ID    string `json:"id"`
			Data  any    `json:"data"`
		}{string(o.Name), o.Env.ID, v})
	}
	return client.WriteOutcome(w, o)
}

func newSubmit(g *globals) *cobra.Command {
	var wait bool
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "submit FILE",
		Short: "Submit a job (YAML or JSON); with --wait, print its placement",
		Long: `submit checks a job file against the jobs.submitted schema, publishes it, and
with --wait prints the outcome: the decision as a table, or why it waits or was
rejected. With --wait a pending job keeps waiting for its decision.

A job file looks like:

  job_id: llm-tp8-dp2
  gpus: 16
  gpus_per_node: 8
  gpu_model: A100-SXM4-80GB
  parallelism: {tp: 8, dp: 2}`,
		Example: "  topoctl submit job.yaml --wait",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			job, err := g.loadJob(args[0])
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			b, err := g.connect(ctx)
			if err != nil {
				return err
			}
			defer closeBus(b)
			if !wait {
				env, err := client.Submit(ctx, b, job)
				if err != nil {
					return err
				}
				_, err = fmt.Fprintf(cmd.OutOrStdout(), "submitted %s (event %s)\n", job.JobID, env.ID)
				return err
			}
			ctx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			return submitAndWait(ctx, g, b, job, cmd.OutOrStdout())
		},
	}
	cmd.Flags().BoolVar(&wait, "wait", false, "wait for the decision or rejection and print it")
	cmd.Flags().DurationVar(&timeout, "timeout", 2*time.Minute, "with --wait, give up after this long")
	return cmd
}

func submitAndWait(ctx context.Context, g *globals, b *bus.Bus, job *events.JobSubmitted, out io.Writer) error {
	ready := make(chan struct{})
	errc := make(chan error, 1)
	var final, last client.Outcome
	go func() {
		errc <- client.Watch(ctx, b, client.FromNow, ready, func(o client.Outcome) error {
			if o.JobID() != job.JobID || o.Released != nil {
				return nil
			}
			if err := g.print(out, o); err != nil {
				return err
			}
			last = o
			if o.Final() {
				final = o
				return bus.ErrStop
			}
			return nil
		})
	}()
	select {
	case <-ready:
	case err := <-errc:
		return err
	}
	if _, err := client.Submit(ctx, b, job); err != nil {
		return err
	}
	if err := <-errc; err != nil {
		switch {
		case errors.Is(err, context.DeadlineExceeded) && last.Pending != nil:
			return fmt.Errorf("%s is still pending; it is placed when GPUs free up (topoctl watch shows when)", job.JobID)
		case errors.Is(err, context.DeadlineExceeded):
			return fmt.Errorf("no outcome for %s: is toposched running? A job id that was already submitted "+
				"gets no second answer; topoctl watch --all shows its history", job.JobID)
		}
		return fmt.Errorf("waiting for %s: %w", job.JobID, err)
	}
	if final.Rejected != nil {
		return fmt.Errorf("job %s rejected", job.JobID)
	}
	return nil
}

func newWatch(g *globals) *cobra.Command {
	var all bool
	cmd := &cobra.Command{
		Use:   "watch",
		Short: "Stream placement decisions, pending jobs and rejections as they happen",
		Long: `watch prints every placement outcome as it is published, until interrupted.
With --all it starts from the beginning of the placement stream.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			b, err := g.connect(ctx)
			if err != nil {
				return err
			}
			defer closeBus(b)
			from := client.FromNow
			if all {
				from = client.FromStart
			}
			err = client.Watch(ctx, b, from, nil, func(o client.Outcome) error {
				return g.print(cmd.OutOrStdout(), o)
			})
			if ctx.Err() != nil {
				return nil // interrupted: the normal way to stop watching
			}
			return err
		},
	}
	cmd.Flags().BoolVar(&all, "all", false, "start from the first outcome in the stream")
	return cmd
}

func newFinish(g *globals) *cobra.Command {
	var status string
	var wait time.Duration
	cmd := &cobra.Command{
		Use:   "finish JOB",
		Short: "Say a job ended, freeing its GPUs (or withdraw it while it waits)",
		Long: `finish says a job ended and prints what placement did with it: finished
(its GPUs are free), withdrawn (it was waiting, or not analysed yet, and will
never be placed), or that it had already finished. A job id nothing was ever
submitted under is an error, and nothing is sent. --wait bounds how long
placement's answer is awaited (0: send and return).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			switch events.JobStatus(status) {
			case events.StatusSucceeded, events.StatusFailed, events.StatusCancelled:
			default:
				return fmt.Errorf("--status %q: expected succeeded, failed or cancelled", status)
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
			id, out := args[0], cmd.OutOrStdout()
			if wait <= 0 {
				if _, err := client.Finish(ctx, b, id, events.JobStatus(status)); err != nil {
					return err
				}
				_, err = fmt.Fprintf(out, "finish of %s sent (%s)\n", id, status)
				return err
			}
			res, err := client.FinishAndWait(ctx, b, id, events.JobStatus(status), wait)
			if err != nil {
				return err
			}
			switch res.Outcome {
			case client.FinishUnknown:
				return fmt.Errorf("unknown job %s: nothing was ever submitted under this id; nothing sent", id)
			case client.FinishAlready:
				_, err = fmt.Fprintf(out, "%s had already finished (%s); nothing sent\n", id, res.History.Status)
			case client.FinishReleased:
				gpus := 0
				var nodes []string
				for _, n := range res.Released.Nodes {
					gpus += len(n.GPUs)
					nodes = append(nodes, n.Node)
				}
				_, err = fmt.Fprintf(out, "finished %s (%s): freed %d GPUs on %s\n", id, status, gpus, strings.Join(nodes, ", "))
			case client.FinishWithdrawn:
				_, err = fmt.Fprintf(out, "withdrawn %s (%s): it had not been placed, and never will be\n", id, status)
			case client.FinishRefused:
				var msgs []string
				for _, r := range res.Refused.Reasons {
					msgs = append(msgs, r.Message)
				}
				return fmt.Errorf("placement refused the finish of %s, nothing changed: %s", id, strings.Join(msgs, "; "))
			default:
				_, err = fmt.Fprintf(out, "finish of %s sent (%s); placement did not answer within %s\n", id, status, wait)
			}
			return err
		},
	}
	cmd.Flags().StringVar(&status, "status", string(events.StatusSucceeded), "how the job ended: succeeded, failed or cancelled")
	cmd.Flags().DurationVar(&wait, "wait", 10*time.Second, "how long to wait for placement's answer (0: send and return)")
	return cmd
}
