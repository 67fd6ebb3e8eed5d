package aware

import (
	"bufio"
	"bytes"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/internal/fixtures"
	"github.com/toposched/toposched/internal/placer/engine"
	"github.com/toposched/toposched/internal/placer/outcome"
)

// BenchmarkPlaceSmall is the decision time of one- and few-GPU jobs (the
// bulk of a busy queue) on a half-full 10k-GPU cluster of DGX H100 nodes,
// with and without an explanation asked for, baseline included as the
// service runs it (PlaceWithBaseline).
func BenchmarkPlaceSmall(b *testing.B) {
	snap := cluster(b, 1280, 0.5)
	for _, n := range []int{1, 2, 8} {
		for _, explain := range []bool{false, true} {
			b.Run(fmt.Sprintf("gpus=10240/job=%d/explain=%v", n, explain), func(b *testing.B) {
				j := fixtures.SyntheticJob("j", n, min(n, 8), 1)
				b.ReportAllocs()
				for b.Loop() {
					opts := engine.Options{}
					if explain {
						opts.Explain = &engine.Explain{}
					}
					if r, _ := PlaceWithBaseline(engine.Request{Snap: snap, Job: j, Options: opts}); r.Verdict != outcome.Placed {
						b.Fatal(r.Reasons)
					}
				}
			})
		}
	}
}

var update = flag.Bool("update", false, "rewrite testdata/decisions.golden from the current decisions")

// goldenDecisions is the file TestDecisionGolden holds the decisions to.
var goldenDecisions = filepath.Join("testdata", "decisions.golden")

// decisionCase is one decision of TestDecisionGolden's seeded mix.
type decisionCase struct {
	name       string
	ours, base outcome.Result
	explain    *engine.Explain // nil when the case asks for none
}

// decisionVariants name the variants of each job: plain, a GPU model
// asked for, gpus_per_node, a node filter, a placement judge, a model
// with no explanation asked for.
var decisionVariants = []string{"plain", "model-h100", "gpus-per-node", "filter", "judge", "model-a10-unexplained"}

// decisionCases places a seeded mix of clusters (24 to 63 nodes of four
// kinds, 20/50/80% held, some GPUs unhealthy, leaves of 4 nodes and pods
// of 16) and jobs (1 to 64 GPUs, TP 1 to 8) with each variant: 1152
// cases. The local search is bounded by evaluations, not time, so the
// decisions do not depend on the machine's speed.
func decisionCases(t *testing.T) []decisionCase {
	t.Helper()
	var out []decisionCase
	for seed := range uint64(6) {
		rng := rand.New(rand.NewPCG(seed, 99))
		var specs []spec
		kinds := []events.TopologyNode{dgx(t, "", "dgx-h100"), dgx(t, "", "pcie-8gpu"), pairs(""), fixtures.PlainNode("", "A100", 8)}
		nodes := 24 + rng.IntN(40)
		for i := range nodes {
			sp := spec{name: fmt.Sprintf("n%03d", i), ev: kinds[rng.IntN(len(kinds))]}
			occ := []float64{0.2, 0.5, 0.8}[rng.IntN(3)]
			for g := range len(sp.ev.GPUs) {
				switch {
				case rng.Float64() < occ:
					sp.held = append(sp.held, g)
				case rng.IntN(20) == 0:
					sp.unhealthy = append(sp.unhealthy, g)
				}
			}
			specs = append(specs, sp)
		}
		st := build(t, specs...)
		fab := map[string][]string{}
		for i, sp := range specs {
			fab[sp.name] = []string{fmt.Sprintf("leaf:l%d", i/4), fmt.Sprintf("pod:p%d", i/16)}
		}
		if err := st.UpsertFabric(fab); err != nil {
			t.Fatal(err)
		}
		snap := st.Snapshot()
		for _, n := range []int{1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64} {
			for _, tp := range []int{1, 2, 4, 8} {
				if n%tp != 0 {
					continue
				}
				for variant := range decisionVariants {
					j := fixtures.SyntheticJob("j", n, tp, 1)
					opts := engine.Options{MaxEvals: 30, Budget: -1, Explain: &engine.Explain{}}
					switch variant {
					case 1:
						j.Job.GPUModel = "H100"
					case 2:
						j.Job.GPUsPerNode = min(n, tp)
					case 3:
						opts.Filter = func(n engine.NodeView) bool { return n.Node.Name[len(n.Node.Name)-1]%3 != 0 }
					case 4:
						opts.Judge = func(c engine.Candidate) engine.Judgement {
							if strings.HasPrefix(c.Domain, "node:") || len(c.GPUs)%3 == 0 {
								return engine.Judgement{Deny: true, Reasons: []events.Reason{{Code: "no", Message: c.Domain}}}
							}
							return engine.Judgement{Score: float64(len(c.Domain)%3) / 4}
						}
					case 5:
						j.Job.GPUModel = "A10"
						opts.Explain = nil
					}
					ours, base := PlaceWithBaseline(engine.Request{Snap: snap, Job: j, Options: opts})
					out = append(out, decisionCase{
						name: fmt.Sprintf("s%d/n%d/tp%d/%s", seed, n, tp, decisionVariants[variant]),
						ours: ours, base: base, explain: opts.Explain,
					})
				}
			}
		}
	}
	return out
}

// line is the case's decision on one line: its name, then ours (verdict,
// GPUs in rank order as node:indices runs, reasons), blind's baseline
// ("same" when it is ours) and the explanation, every field and every
// float in full (shortest exact form), so that any change to a decision
// shows.
func (c decisionCase) line() string {
	var b strings.Builder
	b.WriteString(c.name)
	b.WriteString(" ours=")
	writeResult(&b, c.ours)
	b.WriteString(" base=")
	if sameResult(c.ours, c.base) {
		b.WriteString("same")
	} else {
		writeResult(&b, c.base)
	}
	x := c.explain
	if x == nil {
		b.WriteString(" explain=none")
		return b.String()
	}
	e := x.Explanation
	fmt.Fprintf(&b, " considered=%d", e.NodesConsidered)
	if e.PolicyRevision != "" {
		fmt.Fprintf(&b, " revision=%q", e.PolicyRevision)
	}
	for _, d := range e.NodesDenied {
		fmt.Fprintf(&b, " denied=%s:%s:%d:%q", d.Policy, d.Code, d.Nodes, d.Example)
	}
	if e.NodesReserved != 0 {
		fmt.Fprintf(&b, " reserved=%d", e.NodesReserved)
	}
	b.WriteString(" levels=")
	if len(e.Levels) == 0 {
		b.WriteString("-")
	}
	for i, l := range e.Levels {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, "%s:%d/%d", l.Level, l.Domains, l.Fitting)
	}
	for _, cs := range e.Candidates {
		fmt.Fprintf(&b, " cand={%s nodes=%d", cs.Domain, cs.Nodes)
		if cs.Leaves != 0 {
			fmt.Fprintf(&b, " leaves=%d", cs.Leaves)
		}
		fmt.Fprintf(&b, " comm=%s cost=%s", float(cs.CommSecondsPerStep), float(cs.Cost))
		if cs.Score != 0 {
			fmt.Fprintf(&b, " score=%s", float(cs.Score))
		}
		b.WriteString(" " + cs.Outcome)
		writeReasons(&b, " reasons=", cs.Reasons)
		b.WriteByte('}')
	}
	j := x.Judgement
	if j.Deny {
		b.WriteString(" judged=deny")
	}
	if j.Score != 0 {
		fmt.Fprintf(&b, " judged-score=%s", float(j.Score))
	}
	writeReasons(&b, " judged-reasons=", j.Reasons)
	writeReasons(&b, " judged-warnings=", j.Warnings)
	if x.PolicyDenied {
		b.WriteString(" policy-denied")
	}
	return b.String()
}

func float(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }

// writeResult writes "placed n1:0,1+n2:4" or "wait reasons=...".
func writeResult(b *strings.Builder, r outcome.Result) {
	b.WriteString(r.Verdict.String())
	for i, g := range r.GPUs {
		switch {
		case i == 0:
			b.WriteString(" " + g.Node + ":")
		case g.Node != r.GPUs[i-1].Node:
			b.WriteString("+" + g.Node + ":")
		default:
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(g.Index))
	}
	writeReasons(b, " reasons=", r.Reasons)
}

// writeReasons writes code[@field][#policy]:"message", comma-separated,
// after prefix; nothing when there are none.
func writeReasons(b *strings.Builder, prefix string, rs []events.Reason) {
	for i, r := range rs {
		if i == 0 {
			b.WriteString(prefix)
		} else {
			b.WriteByte(',')
		}
		b.WriteString(r.Code)
		if r.Field != "" {
			b.WriteString("@" + r.Field)
		}
		if r.Policy != "" {
			b.WriteString("#" + r.Policy)
		}
		b.WriteString(":" + strconv.Quote(r.Message))
	}
}

func sameResult(a, b outcome.Result) bool {
	if a.Verdict != b.Verdict || len(a.GPUs) != len(b.GPUs) || len(a.Reasons) != len(b.Reasons) {
		return false
	}
	for i := range a.GPUs {
		if a.GPUs[i] != b.GPUs[i] {
			return false
		}
	}
	for i := range a.Reasons {
		if a.Reasons[i] != b.Reasons[i] {
			return false
		}
	}
	return true
}

// TestDecisionGolden holds every decision (verdict, GPUs, reasons and the
// explanation) of decisionCases, one line per case, to
// testdata/decisions.golden: a speed-up must leave every decision as it
// was. A change that means to decide differently rewrites it with
// -update, and the diff of the file shows what changed.
func TestDecisionGolden(t *testing.T) {
	cases := decisionCases(t)
	var got bytes.Buffer
	for _, c := range cases {
		got.WriteString(c.line())
		got.WriteByte('\n')
	}
	if *update {
		if err := os.MkdirAll(filepath.Dir(goldenDecisions), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(goldenDecisions, got.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	data, err := os.ReadFile(goldenDecisions)
	if err != nil {
		t.Fatalf("%v (run with -update to write it)", err)
	}
	wantNames, want := goldenLines(t, data)
	gotNames, gotLines := goldenLines(t, got.Bytes())
	diffGolden(t, wantNames, want, gotNames, gotLines)
}

// goldenLines maps each line's case name (its first field) to the line,
// keeping the names in order.
func goldenLines(t *testing.T, data []byte) ([]string, map[string]string) {
	t.Helper()
	var names []string
	lines := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			continue
		}
		name, _, _ := strings.Cut(line, " ")
		if _, dup := lines[name]; dup {
			t.Fatalf("case %s twice", name)
		}
		names = append(names, name)
		lines[name] = line
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return names, lines
}

// diffGolden reports, case by case, the first 10 lines that differ.
func diffGolden(t *testing.T, wantNames []string, want map[string]string, gotNames []string, got map[string]string) {
	t.Helper()
	var diffs []string
	changed := 0
	report := func(s string) {
		changed++
		if len(diffs) < 10 {
			diffs = append(diffs, s)
		}
	}
	for _, name := range gotNames {
		w, ok := want[name]
		switch {
		case !ok:
			report(fmt.Sprintf("%s: new case\n  got:  %s", name, got[name]))
		case w != got[name]:
			report(fmt.Sprintf("%s:\n  want: %s\n  got:  %s", name, w, got[name]))
		}
	}
	for _, name := range wantNames {
		if _, ok := got[name]; !ok {
			report(fmt.Sprintf("%s: case gone\n  want: %s", name, want[name]))
		}
	}
	if changed > 0 {
		t.Errorf("%d of %d decisions differ from %s (if that is meant, rerun with -update); the first %d:\n%s",
			changed, len(gotNames), goldenDecisions, len(diffs), strings.Join(diffs, "\n"))
	}
}
