package client

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/internal/textout"
)

// Beyond compactOver rows, a table shows its first compactHead and last
// compactTail rows: a 1,024-rank job's ranks are in the JSON output, and a
// person reading a terminal needs the shape, not every line.
const (
	compactOver = 32
	compactHead = 16
	compactTail = 4
)

// timeLayout prints event times in UTC to the millisecond: events of one
// job are often milliseconds apart.
const timeLayout = "2006-01-02T15:04:05.000Z07:00"

// WriteExplain prints what happened to a job and why: its state, its
// events, and the latest outcome in full (a decision with its ranks,
// prediction against the blind baseline, policy warnings and how it was
// chosen; a wait or rejection with every reason and what would let the job
// fit).
func WriteExplain(w io.Writer, h *JobHistory) error {
	var b strings.Builder
	state := h.State
	if h.Status != "" {
		state += " (" + string(h.Status) + ")"
	}
	if state == "" {
		state = "unknown" // only events placement ignores
		fmt.Fprintf(&b, "%s: %s\n", h.JobID, state)
	} else {
		fmt.Fprintf(&b, "%s: %s at %s\n", h.JobID, state, stamp(h.Since))
	}
	if job := h.Submission(); job != nil {
		fmt.Fprintf(&b, "  %s\n", describeJob(job))
	}

	b.WriteString("\nevents:\n")
	t := newTab("TIME\tEVENT\tDETAIL")
	eachCompact(len(h.Events), func(i int) {
		e := h.Events[i]
		detail := summary(e)
		if e.Ignored {
			detail += " (ignored by placement)"
		}
		t.row("%s\t%s\t%s", stamp(e.Time), e.Name, detail)
	}, func(more int) { t.elide(fmt.Sprintf("%d more events", more)) })
	t.to(&b)

	if o := h.LastOutcome(); o != nil {
		switch d := o.Data.(type) {
		case *events.PlacementDecided:
			writeDecision(&b, o.Time, d)
		case *events.PlacementPending:
			writeRefusal(&b, "pending, latest answer at "+stamp(o.Time), d.Reasons, d.Counterfactuals, d.Explanation)
			writeTurn(&b, d.Turn)
		case *events.PlacementRejected:
			writeRefusal(&b, "rejected at "+stamp(o.Time), d.Reasons, d.Counterfactuals, d.Explanation)
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func writeDecision(b *strings.Builder, at time.Time, d *events.PlacementDecided) {
	fmt.Fprintf(b, "\ndecision at %s: %s, %d ranks on %s\n", stamp(at), d.Strategy, len(d.Ranks), plural(len(d.Nodes), "node"))
	t := newTab("NODE\tRANKS\tCUDA_VISIBLE_DEVICES")
	eachCompact(len(d.Nodes), func(i int) {
		n := d.Nodes[i]
		t.row("%s\t%s\t%s", n.Node, RanksOn(d, n.Node), n.CUDAVisibleDevices)
	}, func(more int) { t.elide(fmt.Sprintf("%d more nodes", more)) })
	t.to(b)

	b.WriteString("\n")
	t = newTab("RANK\tNODE\tGPU\tLOCAL\tNUMA\tNIC")
	eachCompact(len(d.Ranks), func(i int) {
		r := d.Ranks[i]
		numa := "-"
		if r.NUMA != nil {
			numa = strconv.Itoa(*r.NUMA)
		}
		t.row("%d\t%s\t%d\t%d\t%s\t%s", r.Rank, r.Node, r.GPU, r.LocalRank, numa, dash(r.NIC))
	}, func(more int) { t.elide(fmt.Sprintf("%d more ranks", more)) })
	t.to(b)

	writePrediction(b, d.Prediction, d.Baseline)

	if len(d.Warnings) > 0 {
		b.WriteString("\npolicy warnings:\n")
		writeReasonTable(b, d.Warnings)
	}
	writeExplanation(b, d.Explanation)
}

// writePrediction sets ours against the blind baseline, row by row.
func writePrediction(b *strings.Builder, ours, base *events.Prediction) {
	if ours == nil {
		return
	}
	b.WriteString("\npredicted communication per step:\n")
	preds := []*events.Prediction{ours}
	header := "\t" + dash(ours.Strategy)
	if base != nil {
		preds = append(preds, base)
		header += "\t" + dash(base.Strategy) + " (baseline)"
	}
	t := newTab(header)
	row := func(label string, f func(*events.Prediction) string) {
		cells := []string{label}
		for _, p := range preds {
			cells = append(cells, f(p))
		}
		t.row("%s", strings.Join(cells, "\t"))
	}
	row("total", func(p *events.Prediction) string { return seconds(p.CommSecondsPerStep) })
	var groups []string
	seen := map[string]bool{}
	for _, p := range preds {
		for _, g := range p.Groups {
			if !seen[g.Name] {
				seen[g.Name] = true
				groups = append(groups, g.Name)
			}
		}
	}
	eachCompact(len(groups), func(i int) {
		row("  "+groups[i], func(p *events.Prediction) string {
			for _, g := range p.Groups {
				if g.Name == groups[i] {
					return seconds(g.SecondsPerStep) + " (" + dash(g.Algorithm) + ")"
				}
			}
			return "-"
		})
	}, func(more int) { t.elide(fmt.Sprintf("%d more groups", more)) })
	// Compute by GPU model, where placement weighs it.
	if ours.ComputeSecondsPerStep > 0 || (base != nil && base.ComputeSecondsPerStep > 0) {
		row("compute", func(p *events.Prediction) string {
			if p.ComputeSecondsPerStep <= 0 {
				return "-"
			}
			return seconds(p.ComputeSecondsPerStep) + " (" + dash(p.GPUModel) + computeCorrection(p.ComputeCorrection) + ")"
		})
	}
	// Both need the job's step_compute_seconds; without it they are 0.
	if ours.CommFraction > 0 || (base != nil && base.CommFraction > 0) {
		row("comm fraction", func(p *events.Prediction) string { return percent(p.CommFraction) })
	}
	if ours.SpeedUp > 0 || (base != nil && base.SpeedUp > 0) {
		row("speed-up", func(p *events.Prediction) string { return strconv.FormatFloat(p.SpeedUp, 'f', 1, 64) + "x" })
	}
	t.to(b)
	switch {
	case base == nil:
		b.WriteString("  no baseline: blind first fit could not place the job on the same cluster state\n")
	case base.CommSecondsPerStep > 0:
		red := 100 * (1 - ours.CommSecondsPerStep/base.CommSecondsPerStep)
		switch {
		case red >= 0.05:
			fmt.Fprintf(b, "  %.1f%% less communication than blind first fit\n", red)
		case red <= -0.05:
			fmt.Fprintf(b, "  %.1f%% more communication than blind first fit\n", -red)
		default:
			b.WriteString("  as much communication as blind first fit\n")
		}
	}
}

// computeCorrection says what a calibration's compute factors made of a
// prediction's compute: ": x1.18 from 12 runs, online"; "" for none.
func computeCorrection(c *events.ComputeCorrection) string {
	if c == nil {
		return ""
	}
	out := fmt.Sprintf(": x%.2f from %s", c.Factor, plural(c.Samples, "run"))
	if c.Set != "" {
		out += ", " + c.Set
	}
	return out
}

func writeRefusal(b *strings.Builder, title string, reasons []events.Reason, cfs []events.Counterfactual, ex *events.Explanation) {
	b.WriteString("\n" + title + ":\n")
	writeReasonTable(b, reasons)
	if len(cfs) > 0 {
		b.WriteString("\nwould fit if:\n")
		t := newTab("KIND\tMESSAGE\tJOBS / POLICY")
		for _, c := range cfs {
			t.row("%s\t%s\t%s", c.Kind, c.Message, counterfactualDetail(c))
		}
		t.to(b)
	}
	writeExplanation(b, ex)
}

// writeTurn says where a waiting job is in the queue, ordered by expected
// ends: why a job that came later may start first.
func writeTurn(b *strings.Builder, t *events.QueueTurn) {
	if t == nil {
		return
	}
	how := "no run time learned yet, so its first wait"
	if t.ExpectedRunSeconds > 0 {
		how = "its first wait plus " + time.Duration(t.ExpectedRunSeconds*float64(time.Second)).Round(time.Second).String() +
			", the run time learned for jobs of its size"
		if t.NodeShare > 0 {
			how += fmt.Sprintf(", times %.3g, its share of a node", t.NodeShare)
		}
	}
	fmt.Fprintf(b, "\nqueue turn: %s (%s); jobs of its priority are tried in the order of their turns\n", stamp(t.At), how)
}

func writeReasonTable(b *strings.Builder, rs []events.Reason) {
	t := newTab("CODE\tFIELD\tPOLICY\tMESSAGE")
	for _, r := range rs {
		t.row("%s\t%s\t%s\t%s", r.Code, dash(r.Field), dash(r.Policy), r.Message)
	}
	t.to(b)
}

func writeExplanation(b *strings.Builder, ex *events.Explanation) {
	if ex == nil {
		return
	}
	rev := "no policy set in force"
	if ex.PolicyRevision != "" {
		rev = "policy revision " + ex.PolicyRevision
	}
	fmt.Fprintf(b, "\nhow placement looked (%s):\n", rev)
	fmt.Fprintf(b, "  %s with free GPUs of the job's model considered", plural(ex.NodesConsidered, "node"))
	if ex.NodesReserved > 0 {
		fmt.Fprintf(b, ", %d held back for an older job", ex.NodesReserved)
	}
	b.WriteString("\n")
	if len(ex.NodesDenied) > 0 {
		b.WriteString("\n")
		t := newTab("DENIED BY\tCODE\tNODES\tEXAMPLE")
		for _, d := range ex.NodesDenied {
			t.row("%s\t%s\t%d\t%s", d.Policy, d.Code, d.Nodes, d.Example)
		}
		t.to(b)
	}
	if len(ex.Levels) > 0 {
		b.WriteString("\n")
		t := newTab("LEVEL\tDOMAINS\tFITTING")
		for _, l := range ex.Levels {
			t.row("%s\t%d\t%d", l.Level, l.Domains, l.Fitting)
		}
		t.to(b)
	}
	if len(ex.Candidates) > 0 {
		b.WriteString("\n")
		t := newTab("CANDIDATE\tNODES\tLEAVES\tCOMM\tSCORE\tCOST\tOUTCOME\tREASONS")
		eachCompact(len(ex.Candidates), func(i int) {
			c := ex.Candidates[i]
			leaves := "-"
			if c.Leaves > 0 {
				leaves = strconv.Itoa(c.Leaves)
			}
			t.row("%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s", c.Domain, c.Nodes, leaves, seconds(c.CommSecondsPerStep),
				number(c.Score), number(c.Cost), c.Outcome, dash(reasonsInline(c.Reasons)))
		}, func(more int) { t.elide(fmt.Sprintf("%d more candidates", more)) })
		t.to(b)
	}
	writeFitTrade(b, ex.FitTrade)
	if bf := ex.Backfill; bf != nil {
		fmt.Fprintf(b, "\nbackfill: placed on nodes held for job %s: expected to end at %s, before the jobs on them (%s)\n",
			bf.HeldFor, bf.ExpectedEnd.UTC().Format(time.RFC3339), bf.DrainedBy.UTC().Format(time.RFC3339))
	}
}

// writeFitTrade says which way topology-aware weighed the job's speed
// against a fast node kept whole, and what each side was expected to pay.
func writeFitTrade(b *strings.Builder, tr *events.FitTrade) {
	if tr == nil {
		return
	}
	slower := 100 * (tr.TighterStepSeconds/tr.StepSeconds - 1)
	if tr.Made {
		fmt.Fprintf(b, "\nfit trade: took the tighter fit on %s, %.1f%% slower per step (%s against %s), keeping %s whole for a job of %d or more GPUs\n",
			tr.Tighter, slower, seconds(tr.TighterStepSeconds), seconds(tr.StepSeconds), tr.Node, tr.MinGPUs)
	} else {
		fmt.Fprintf(b, "\nfit trade: took the faster placement on %s, breaking its room for a job of %d or more GPUs; the tighter fit on %s was %.1f%% slower per step (%s against %s)\n",
			tr.Node, tr.MinGPUs, tr.Tighter, slower, seconds(tr.TighterStepSeconds), seconds(tr.StepSeconds))
	}
	if tr.HorizonSeconds == 0 {
		b.WriteString("  no run time learned yet: the tighter fit is taken as without a forecast\n")
		return
	}
	h := time.Duration(tr.HorizonSeconds * float64(time.Second)).Round(time.Second)
	fmt.Fprintf(b, "  needed within this job's expected run (%s): probability %.2f (%d waiting, %.2f arriving an hour, %d spare, %d ending)\n",
		h, tr.Probability, tr.Queued, tr.ArrivalsPerHour, tr.Spare, tr.Ending)
	fmt.Fprintf(b, "  expected cost: this job %s on the tighter fit; the jobs needing the room %s if broken\n",
		time.Duration(tr.JobCostSeconds*float64(time.Second)).Round(time.Second), time.Duration(tr.OthersCostSeconds*float64(time.Second)).Round(time.Second))
}

// summary is one line about an event for the events table.
func summary(e HistoryEvent) string {
	if e.Error != "" {
		return e.Error
	}
	if b := e.Body; b != nil {
		head := []rune(b.Head)
		head = head[:min(len(head), 48)]
		return fmt.Sprintf("body of %s not shown (sha256 %s, begins %s): %s", bytesIEC(int64(b.Size)), b.SHA256,
			strconv.QuoteToGraphic(string(head)), e.Invalid)
	}
	switch d := e.Data.(type) {
	case *events.JobSubmitted:
		return describeJob(d)
	case *events.JobAnalyzed:
		// Resolved: every dimension is at least 1; those of 1 say nothing.
		p := d.Parallelism
		for _, n := range []*int{&p.TP, &p.CP, &p.EP, &p.DP, &p.PP} {
			if *n == 1 {
				*n = 0
			}
		}
		s := parallelism(p)
		if s == "" {
			s = "no parallelism"
		}
		if d.BytesPerStepPerRank > 0 {
			s += "; " + bytesIEC(d.BytesPerStepPerRank) + " per step per rank"
		}
		if len(d.Warnings) > 0 {
			s += "; " + plural(len(d.Warnings), "warning")
		}
		return s
	case *events.PlacementDecided:
		s := fmt.Sprintf("%s, %d ranks on %s", d.Strategy, len(d.Ranks), plural(len(d.Nodes), "node"))
		if m := d.Migration; m != nil {
			s += fmt.Sprintf("; migrated by proposal %s from %s", m.ProposalID, NodesString(m.PreviousNodes))
		}
		return s
	case *events.PlacementMigration:
		return fmt.Sprintf("proposal %s (%s): to %s, %s less per step, break-even %s",
			d.ProposalID, d.Reason, NodesString(d.Nodes), seconds(d.GainSecondsPerStep), seconds(d.BreakEvenSeconds))
	case *events.JobMigrationAccepted:
		if d.ProposalID == "" {
			return "the latest proposal accepted"
		}
		return "proposal " + d.ProposalID + " accepted"
	case *events.PlacementMigrationRefused:
		return codes(d.Reasons)
	case *events.PlacementFinishRefused:
		return codes(d.Reasons)
	case *events.PlacementPending:
		return codes(d.Reasons)
	case *events.PlacementRejected:
		return codes(d.Reasons)
	case *events.JobFinished:
		s := string(d.Status)
		if d.Reason != "" {
			s += " (" + d.Reason + ")"
		}
		if d.Message != "" {
			s += ": " + d.Message
		}
		return s
	case *events.PlacementReleased:
		return string(d.Status) + ", " + plural(len(d.Nodes), "node") + " freed"
	}
	return ""
}

// describeJob says what a job asked for, in one line.
func describeJob(j *events.JobSubmitted) string {
	parts := []string{plural(j.GPUs, "GPU")}
	if j.GPUsPerNode > 0 {
		parts = append(parts, strconv.Itoa(j.GPUsPerNode)+" per node")
	}
	if j.GPUModel != "" {
		parts = append(parts, j.GPUModel)
	}
	if j.Parallelism != nil {
		if p := parallelism(*j.Parallelism); p != "" {
			parts = append(parts, p)
		}
	}
	if j.Strategy != "" {
		parts = append(parts, j.Strategy)
	}
	if j.Tenant != "" {
		parts = append(parts, "tenant "+j.Tenant)
	}
	if j.Priority != 0 {
		parts = append(parts, "priority "+strconv.Itoa(j.Priority))
	}
	return strings.Join(parts, ", ")
}

func parallelism(p events.Parallelism) string {
	var parts []string
	for _, d := range []struct {
		name string
		n    int
	}{{"tp", p.TP}, {"cp", p.CP}, {"ep", p.EP}, {"dp", p.DP}, {"pp", p.PP}} {
		if d.n > 0 {
			parts = append(parts, d.name+" "+strconv.Itoa(d.n))
		}
	}
	return strings.Join(parts, " ")
}

func codes(rs []events.Reason) string {
	cs := make([]string, 0, len(rs))
	for _, r := range rs {
		cs = append(cs, r.Code)
	}
	return strings.Join(cs, ", ")
}

func reasonsInline(rs []events.Reason) string {
	parts := make([]string, 0, len(rs))
	for _, r := range rs {
		s := r.Code
		if r.Policy != "" {
			s += " (" + r.Policy + ")"
		}
		parts = append(parts, s+": "+r.Message)
	}
	return strings.Join(parts, "; ")
}

func counterfactualDetail(c events.Counterfactual) string {
	var parts []string
	if len(c.Jobs) > 0 {
		parts = append(parts, strings.Join(c.Jobs, ", "))
	}
	if c.Policy != "" {
		parts = append(parts, c.Policy)
	}
	return dash(strings.Join(parts, "; "))
}

// eachCompact calls row for every index, or for the first and last few
// with elided(n) for the n between when there are more than compactOver.
func eachCompact(n int, row func(int), elided func(int)) {
	if n <= compactOver {
		for i := range n {
			row(i)
		}
		return
	}
	for i := range compactHead {
		row(i)
	}
	elided(n - compactHead - compactTail)
	for i := n - compactTail; i < n; i++ {
		row(i)
	}
}

// tab is one aligned table. An elision row is a one-character
// placeholder while the table is aligned, so that its text widens no
// column, and is written out in full afterwards.
type tab struct {
	buf     strings.Builder
	tw      *textout.Writer // a table into buf
	cols    int
	elision string
}

// newTab starts a table under header, whose columns are tab-separated.
func newTab(header string) *tab {
	t := &tab{cols: strings.Count(header, "\t") + 1}
	t.tw = textout.Table(&t.buf, 2, 4, 2, ' ', 0)
	t.row("%s", header)
	return t
}

// row writes one row, indented by two spaces.
func (t *tab) row(format string, args ...any) {
	t.tw.Printf("  "+format+"\n", args...)
}

// elide stands for the rows left out. The empty cells keep the rows after
// it in the same column block as those before.
func (t *tab) elide(msg string) {
	t.elision = "… " + msg
	t.row("%s%s", elisionMark, strings.Repeat("\t", t.cols-1))
}

// elisionMark is one column wide and appears in no table's data.
const elisionMark = "\u2026"

// to writes the aligned table to b, without trailing blanks.
func (t *tab) to(b *strings.Builder) {
	_ = t.tw.Flush()
	for line := range strings.Lines(t.buf.String()) {
		line = strings.TrimRight(line, " \n")
		if strings.TrimSpace(line) == elisionMark {
			line = "  " + t.elision
		}
		b.WriteString(line + "\n")
	}
}

func stamp(t time.Time) string { return t.UTC().Format(timeLayout) }

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func percent(f float64) string { return strconv.FormatFloat(100*f, 'f', 1, 64) + "%" }

func number(f float64) string { return strconv.FormatFloat(f, 'f', 3, 64) }

// bytesIEC prints a byte count with a binary unit.
func bytesIEC(n int64) string {
	const unit = 1024
	if n < unit {
		return strconv.FormatInt(n, 10) + " B"
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit && exp < 4; m /= unit {
		div *= unit
		exp++
	}
	return strconv.FormatFloat(float64(n)/float64(div), 'f', 1, 64) + " " + string("KMGTP"[exp]) + "iB"
}
