package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/internal/calibration"
	"github.com/toposched/toposched/internal/collective"
	"github.com/toposched/toposched/internal/textout"
)

func newCalibration(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "calibration",
		Short: "Publish and inspect the cost model's calibration set (the calibration KV bucket)",
		Long: `The cost model of placement and the optimizer predicts with a calibration set:
the share of line rate each kind of link achieves (toposched model calibrate fits
one from nccl-tests runs). A set pushed to the bucket <prefix>-calibration
overrides every replica's --calibration file; the optimizer's online calibration
moves it from jobs' telemetry, as new versions named "online". The bucket keeps
the last 32 versions.`,
	}
	cmd.AddCommand(newCalibrationPush(g), newCalibrationShow(g), newCalibrationWithdraw(g))
	return cmd
}

func newCalibrationPush(g *globals) *cobra.Command {
	var wait bool
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "push FILE",
		Short: "Check a calibration set, push it to the calibration bucket and wait for a replica to apply it",
		Long: `push reads FILE as every replica will: a set that is cut off, not JSON, has an
unknown field or an impossible number (an efficiency above line rate, a negative
one, one below its kind of link's floor) or a fit that disagrees with the
efficiency it fitted is refused with file, line and field before NATS is
touched. A set that passes is put, unchanged, under the key "set" of
<prefix>-calibration; an efficiency more than 3 times from the documented one,
or a source named by an absolute path, is pushed with a warning on stderr.

Each placement and optimizer replica checks it again and answers with
policy.calibration_applied, or policy.calibration_rejected naming the line (the
set in force then stays). With --wait (the default) push prints the first answer
for this push and exits non-zero on a rejection.`,
		Example: "  toposched model calibrate --topology node.txt --nccl-tests ar.txt --out lab.json\n  topoctl calibration push lab.json",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return calibrationPush(cmd.Context(), g, cmd.OutOrStdout(), cmd.ErrOrStderr(), args[0], wait, timeout)
		},
	}
	cmd.Flags().BoolVar(&wait, "wait", true, "wait for a replica to apply or reject the set, and print its answer")
	cmd.Flags().DurationVar(&timeout, "timeout", time.Minute, "with --wait, give up after this long")
	return cmd
}

func calibrationPush(ctx context.Context, g *globals, out, errOut io.Writer, file string, wait bool, timeout time.Duration) error {
	data, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	cal, err := collective.ParseCalibration(file, data)
	if err != nil {
		return refusedLocally(out, file, err)
	}
	for _, w := range cal.Warnings() {
		if _, err := fmt.Fprintf(errOut, "warning: %s: %s\n", file, w); err != nil {
			return err
		}
	}
	b, err := g.connectPolicyAdmin(ctx)
	if err != nil {
		return err
	}
	defer closeBus(b)
	kv, err := calibration.OpenKV(ctx, b.JetStream(), g.prefix)
	if err != nil {
		return err
	}
	waitCtx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var answers <-chan any
	var errc <-chan error
	if wait {
		answers, errc, err = followPolicyDomain(waitCtx, b)
		if err != nil {
			return err
		}
	}
	rev, kvRev, err := calibration.Push(ctx, kv, file, data)
	if err != nil {
		return err
	}
	if g.format != "json" {
		if _, err := fmt.Fprintf(out, "pushed %s@%s to %s (kv revision %d)\n", nameOr(cal.Name), shortRev(rev), kv.Bucket(), kvRev); err != nil {
			return err
		}
	}
	if !wait {
		if g.format == "json" {
			return json.NewEncoder(out).Encode(map[string]any{"revision": rev, "kv_revision": kvRev})
		}
		return nil
	}
	for {
		select {
		case v := <-answers:
			switch e := v.(type) {
			case *events.CalibrationApplied:
				if e.KVRevision != kvRev {
					continue
				}
				if g.format == "json" {
					return printPolicyEvent(out, events.NameCalibrationApplied, e)
				}
				return writeCalibrationApplied(out, e)
			case *events.CalibrationRejected:
				if e.KVRevision != kvRev {
					continue
				}
				if g.format == "json" {
					if err := printPolicyEvent(out, events.NameCalibrationRejected, e); err != nil {
						return err
					}
				} else if err := writeCalibrationRejected(out, e); err != nil {
					return err
				}
				return fmt.Errorf("calibration %s@%s rejected by the operator", nameOr(cal.Name), shortRev(rev))
			}
		case err := <-errc:
			if err == nil {
				err = waitCtx.Err()
			}
			if errors.Is(err, context.DeadlineExceeded) {
				return fmt.Errorf("pushed %s@%s, but no placement or optimizer replica answered within %s: is one running? (topoctl calibration show tells what is in force)",
					nameOr(cal.Name), shortRev(rev), timeout)
			}
			return err
		}
	}
}

// refusedLocally prints a file's refusal, one reason a line, and says that
// nothing was pushed.
func refusedLocally(out io.Writer, file string, err error) error {
	w := textout.New(out)
	var errs collective.CalibrationErrors
	if errors.As(err, &errs) {
		for _, e := range errs {
			w.Println(e.Error())
		}
	}
	refused := fmt.Errorf("calibration %s refused; nothing pushed: %w", file, err)
	if werr := w.Err(); werr != nil {
		return errors.Join(refused, werr)
	}
	return refused
}

func nameOr(name string) string {
	if name == "" {
		return "unnamed"
	}
	return name
}

func writeCalibrationApplied(out io.Writer, e *events.CalibrationApplied) error {
	w := textout.New(out)
	w.Printf("applied by %s (%s): %s@%s from %s", e.Replica, strings.Join(e.Services, ", "), e.Name, shortRev(e.Revision), e.Source)
	if e.Previous != "" {
		w.Printf(" (replaced %s)", shortRev(e.Previous))
	}
	w.Println()
	w.Printf("  %s\n", efficiencyLine(e.Efficiency))
	return w.Err()
}

func efficiencyLine(e events.LinkEfficiency) string {
	return fmt.Sprintf("efficiency: nvlink %.3f, nvls %.3f, pcie %.3f, net %.3f, efa %.3f, tcp %.3f; step overhead %.2f us%s",
		e.NVLink, e.NVLS, e.PCIe, e.Net, e.EFA, e.TCP, e.StepOverheadUS, callOverhead(e.OpOverheadUS))
}

// callOverhead is ", call overhead N us" where a set fitted one, else "".
func callOverhead(us float64) string {
	if us == 0 {
		return ""
	}
	return fmt.Sprintf(", call overhead %.2f us", us)
}

func writeCalibrationRejected(out io.Writer, e *events.CalibrationRejected) error {
	w := textout.New(out)
	w.Printf("rejected by %s: %s@%s from %s (kv revision %d)\n", e.Replica, e.Name, shortRev(e.Revision), e.Source, e.KVRevision)
	for _, ce := range e.Errors {
		where := "value"
		if ce.Line > 0 {
			where = fmt.Sprintf("line %d", ce.Line)
		}
		if ce.Field != "" {
			where += ": " + ce.Field
		}
		w.Printf("  %s: %s\n", where, ce.Message)
	}
	w.Printf("the set in force stays: %s\n", shortRev(e.InForce))
	return w.Err()
}

func newCalibrationShow(g *globals) *cobra.Command {
	var history bool
	cmd := &cobra.Command{
		Use:   "show",
		Short: "Show the calibration in the bucket and the one each replica last applied",
		Long: `show prints the set in the calibration bucket (its efficiencies, the evidence
of each fit as stored, and the warnings push printed: an efficiency more than 3
times from the documented one), with --history every stored version, and from the policy stream the
last policy.calibration_applied of every replica that announced one, newest first.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return calibrationShow(cmd.Context(), g, cmd.OutOrStdout(), history)
		},
	}
	cmd.Flags().BoolVar(&history, "history", false, "list every stored version, oldest first")
	return cmd
}

// storedSet is one version of the bucket, as show prints it.
type storedSet struct {
	Revision   string                  `json:"revision"`
	KVRevision uint64                  `json:"kv_revision"`
	Created    time.Time               `json:"created"`
	Withdrawn  bool                    `json:"withdrawn,omitempty"`
	Set        *collective.Calibration `json:"set,omitempty"`
	Error      string                  `json:"error,omitempty"`
	// Warnings are the set's (collective.Calibration.Warnings), as push
	// printed them.
	Warnings []string `json:"warnings,omitempty"`
}

func storedOf(e calibration.Entry) storedSet {
	s := storedSet{Revision: e.Revision, KVRevision: e.KVRevision, Created: e.Created.UTC(), Withdrawn: e.Deleted, Set: e.Set}
	if e.Err != nil {
		s.Error = e.Err.Error()
	}
	if e.Set != nil {
		s.Warnings = e.Set.Warnings()
	}
	return s
}

func calibrationShow(ctx context.Context, g *globals, out io.Writer, history bool) error {
	b, err := g.connect(ctx)
	if err != nil {
		return err
	}
	defer closeBus(b)
	var stored []storedSet
	kv, err := b.JetStream().KeyValue(ctx, calibration.BucketName(g.prefix))
	switch {
	case errors.Is(err, jetstream.ErrBucketNotFound):
	case err != nil:
		return fmt.Errorf("calibration bucket: %w", err)
	case history:
		hist, err := calibration.HistoryOf(ctx, kv)
		if err != nil {
			return err
		}
		for _, e := range hist {
			stored = append(stored, storedOf(e))
		}
	default:
		e, err := calibration.InForce(ctx, kv)
		if err != nil {
			return err
		}
		if e != nil {
			stored = append(stored, storedOf(*e))
		}
	}
	replicas, err := lastApplied(ctx, b, events.NameCalibrationApplied, func(e *events.CalibrationApplied) (string, time.Time) { return e.Replica, e.AppliedAt })
	if err != nil {
		return err
	}
	if g.format == "json" {
		return json.NewEncoder(out).Encode(struct {
			Stored   []storedSet                  `json:"stored"`
			Replicas []*events.CalibrationApplied `json:"replicas"`
		}{stored, replicas})
	}
	w := textout.New(out)
	if len(stored) == 0 {
		w.Println("bucket: no set (replicas use their --calibration file or the documented efficiencies)")
	}
	for _, s := range stored {
		at := s.Created.Format(time.RFC3339)
		switch {
		case s.Withdrawn:
			w.Printf("kv revision %d at %s: withdrawn (replicas fall back to their --calibration file or the defaults)\n", s.KVRevision, at)
		case s.Error != "":
			w.Printf("kv revision %d at %s: refused value %s: %s\n", s.KVRevision, at, shortRev(s.Revision), s.Error)
		default:
			w.Printf("kv revision %d at %s: %s@%s\n", s.KVRevision, at, nameOr(s.Set.Name), shortRev(s.Revision))
			eff := s.Set.Resolved()
			w.Printf("  %s\n", efficiencyLine(events.LinkEfficiency{NVLink: eff.NVLink, NVLS: eff.NVLS, PCIe: eff.PCIe, Net: eff.Net,
				EFA: eff.EFA, TCP: eff.TCP, StepOverheadUS: eff.StepOverheadUS, OpOverheadUS: eff.OpOverheadUS}))
			for _, model := range slices.Sorted(maps.Keys(s.Set.Models)) {
				e := s.Set.Models[model]
				w.Printf("  on %s nodes (0: the cluster's): nvlink %.3f, nvls %.3f, pcie %.3f, net %.3f, efa %.3f, tcp %.3f; step overhead %.2f us%s\n",
					model, e.NVLink, e.NVLS, e.PCIe, e.Net, e.EFA, e.TCP, e.StepOverheadUS, callOverhead(e.OpOverheadUS))
			}
			for _, f := range s.Set.Fits {
				kind := f.Kind
				if f.Model != "" {
					kind = f.Model + " " + kind
				}
				w.Printf("  fit %s: %.3f from %d samples (measured/predicted %.3f before): %s\n", kind, f.Efficiency, f.Samples, f.Ratio, strings.Join(f.Sources, ", "))
			}
			for _, f := range s.Set.Compute {
				w.Printf("  compute %s: x%.3f the speed table's time, from %d jobs (measured/predicted %.3f before its last move)", f.Model, f.Factor, f.Samples, f.Ratio)
				if len(f.Sources) > 0 {
					w.Printf(": %s", strings.Join(f.Sources, ", "))
				}
				w.Println()
			}
			for _, warn := range s.Warnings {
				w.Printf("  warning: %s\n", warn)
			}
		}
	}
	w.Println()
	if len(replicas) == 0 {
		w.Println("no replica has announced a calibration")
		return w.Err()
	}
	for _, e := range replicas {
		w.Printf("%s (%s): %s@%s from %s", e.Replica, strings.Join(e.Services, ", "), e.Name, shortRev(e.Revision), e.Source)
		if e.KVRevision != 0 {
			w.Printf(" (kv revision %d)", e.KVRevision)
		}
		w.Printf(" at %s\n  %s\n", e.AppliedAt.UTC().Format(time.RFC3339), efficiencyLine(e.Efficiency))
	}
	return w.Err()
}

func newCalibrationWithdraw(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "withdraw",
		Short: "Withdraw the set in the bucket: replicas fall back to their --calibration file or the defaults",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			b, err := g.connectPolicyAdmin(cmd.Context())
			if err != nil {
				return err
			}
			defer closeBus(b)
			kv, err := calibration.OpenKV(cmd.Context(), b.JetStream(), g.prefix)
			if err != nil {
				return err
			}
			if err := kv.Delete(cmd.Context(), calibration.KVKey); err != nil {
				return fmt.Errorf("withdraw calibration from %s: %w", kv.Bucket(), err)
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "withdrew the set in %s\n", kv.Bucket())
			return err
		},
	}
}
