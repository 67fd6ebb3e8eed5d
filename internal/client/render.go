package client

import (
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/internal/textout"
)

// WriteOutcome prints an outcome for people: a decision as a table of nodes
// and ranks, a wait or a rejection with every reason.
func WriteOutcome(w io.Writer, o Outcome) error {
	var b strings.Builder
	switch {
	case o.Decided != nil:
		d := o.Decided
		fmt.Fprintf(&b, "%s: decided by %s, %d ranks on %s\n", d.JobID, d.Strategy, len(d.Ranks), plural(len(d.Nodes), "node"))
		tw := textout.Table(&b, 2, 4, 2, ' ', 0)
		tw.Println("  NODE\tRANKS\tCUDA_VISIBLE_DEVICES")
		for _, n := range d.Nodes {
			tw.Printf("  %s\t%s\t%s\n", n.Node, RanksOn(d, n.Node), n.CUDAVisibleDevices)
		}
		_ = tw.Flush() // into b: cannot fail
		if p := d.Prediction; p != nil {
			fmt.Fprintf(&b, "  predicted communication: %s per step", seconds(p.CommSecondsPerStep))
			if base := d.Baseline; base != nil {
				fmt.Fprintf(&b, "; blind first fit: %s", seconds(base.CommSecondsPerStep))
				if base.CommSecondsPerStep > 0 {
					fmt.Fprintf(&b, " (%+.0f%%)", 100*(p.CommSecondsPerStep/base.CommSecondsPerStep-1))
				}
			}
			b.WriteString("\n")
		}
		for _, r := range d.Warnings {
			fmt.Fprintf(&b, "  warning %s: %s\n", reasonTag(r), r.Message)
		}
	case o.Pending != nil:
		fmt.Fprintf(&b, "%s: pending\n", o.Pending.JobID)
		writeReasons(&b, o.Pending.Reasons)
		writeCounterfactuals(&b, o.Pending.Counterfactuals)
	case o.Rejected != nil:
		fmt.Fprintf(&b, "%s: rejected\n", o.Rejected.JobID)
		writeReasons(&b, o.Rejected.Reasons)
		writeCounterfactuals(&b, o.Rejected.Counterfactuals)
	case o.Released != nil:
		fmt.Fprintf(&b, "%s: released (%s)\n", o.Released.JobID, o.Released.Status)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func writeReasons(b *strings.Builder, reasons []events.Reason) {
	for _, r := range reasons {
		fmt.Fprintf(b, "  - %s: %s\n", reasonTag(r), r.Message)
	}
}

// reasonTag is a reason's code with the field to blame and the policy it
// comes from, where known: "tp_split [parallelism.tp] (policy nvlink)".
func reasonTag(r events.Reason) string {
	s := r.Code
	if r.Field != "" {
		s += " [" + r.Field + "]"
	}
	if r.Policy != "" {
		s += " (policy " + r.Policy + ")"
	}
	return s
}

// writeCounterfactuals prints, one line each, what would let a job fit.
func writeCounterfactuals(b *strings.Builder, cfs []events.Counterfactual) {
	for _, c := range cfs {
		fmt.Fprintf(b, "  would fit if (%s): %s", c.Kind, c.Message)
		if len(c.Jobs) > 0 {
			fmt.Fprintf(b, " [jobs %s]", strings.Join(c.Jobs, ", "))
		}
		if c.Policy != "" {
			fmt.Fprintf(b, " [policy %s]", c.Policy)
		}
		b.WriteString("\n")
	}
}

// RanksOn lists the global ranks on node compactly, such as "0-7" or
// "0-3,8-11".
func RanksOn(d *events.PlacementDecided, node string) string {
	var parts []string
	start, prev := -1, -1
	flush := func() {
		switch {
		case start < 0:
		case start == prev:
			parts = append(parts, strconv.Itoa(start))
		default:
			parts = append(parts, strconv.Itoa(start)+"-"+strconv.Itoa(prev))
		}
	}
	for _, r := range d.Ranks {
		if r.Node != node {
			continue
		}
		if r.Rank != prev+1 || start < 0 {
			flush()
			start = r.Rank
		}
		prev = r.Rank
	}
	flush()
	return strings.Join(parts, ",")
}

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return strconv.Itoa(n) + " " + what + "s"
}

// seconds prints a duration in ms below a second.
func seconds(s float64) string {
	if s < 1 {
		return strconv.FormatFloat(s*1000, 'f', 1, 64) + " ms"
	}
	return strconv.FormatFloat(s, 'f', 2, 64) + " s"
}
