package pattern

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"

	"github.com/toposched/toposched/events"
)

// messageLimit is NATS's max_payload and the streams' max_msg_size.
const messageLimit = 8 << 20

// TestBoundedBeforeWork: a job whose analysed form cannot be one message
// is refused by analysis with a reason naming the field, rather than
// published (and refused by NATS, forever).
func TestBoundedBeforeWork(t *testing.T) {
	t.Parallel()
	// Labels just under the 8 MB a submission may be.
	big := map[string]string{}
	for i := range 7 {
		big[fmt.Sprintf("l%d", i)] = strings.Repeat("x", 1<<20)
	}
	manyLabels := map[string]string{}
	for i := range 1000 {
		manyLabels[fmt.Sprintf("l%04d", i)] = "v"
	}
	longKey := map[string]string{strings.Repeat("k", 400): "v"}
	// 131,072 GPUs in five dimensions and three explicit groups over every
	// rank: under every count bound, over the size of one message.
	all := make([]int, 1<<17)
	for i := range all {
		all[i] = i
	}
	huge := events.JobSubmitted{JobID: "huge", GPUs: 1 << 17, Parallelism: &events.Parallelism{TP: 2, PP: 2, CP: 2, EP: 2},
		Groups: []events.CommGroup{
			{Name: "a", Collective: events.CollectiveAllReduce, Ranks: all, Bytes: 1},
			{Name: "b", Collective: events.CollectiveAllReduce, Ranks: all, Bytes: 1},
			{Name: "c", Collective: events.CollectiveAllReduce, Ranks: all, Bytes: 1},
		}}
	for _, tc := range []struct {
		name  string
		job   events.JobSubmitted
		code  string
		field string
	}{
		{"labels of 7 MB", events.JobSubmitted{JobID: "l", GPUs: 8, Labels: big}, "label_too_long", "labels.l0"},
		{"1000 labels", events.JobSubmitted{JobID: "l", GPUs: 8, Labels: manyLabels}, "too_many_labels", "labels"},
		{"400-character key", events.JobSubmitted{JobID: "l", GPUs: 8, Labels: longKey}, "label_too_long", "labels"},
		{"analysed over the limit", huge, "analysed_too_large", "groups"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			// The 131,072-GPU job is 2.5 MB in its compact analysed form
			// (TestCompactAnalysed): a limit of 1 MiB reaches the refusal.
			a, reasons := analyze(tc.job, 1<<20)
			if len(reasons) == 0 {
				body, _ := json.Marshal(a)
				t.Fatalf("analysed into %d bytes (limit %d), want a %s reason", len(body), messageLimit, tc.code)
			}
			if reasons[0].Code != tc.code || reasons[0].Field != tc.field {
				t.Fatalf("reasons %+v, want %s on %s", reasons[:min(len(reasons), 3)], tc.code, tc.field)
			}
			if !strings.Contains(reasons[0].Message, "limit") {
				t.Errorf("reason %q does not name the limit", reasons[0].Message)
			}
		})
	}
}

// TestReasonsBounded: a group listing a million bad ranks gets a bounded
// rejection, not a reason per rank (which would itself be over 8 MB).
func TestReasonsBounded(t *testing.T) {
	t.Parallel()
	ranks := make([]int, 1<<16)
	for i := range ranks {
		ranks[i] = 1 << 20
	}
	job := events.JobSubmitted{JobID: "bad", GPUs: 8,
		Groups: []events.CommGroup{{Name: "g", Collective: events.CollectiveAllReduce, Ranks: ranks, Bytes: 1}}}
	_, reasons := Analyze(job)
	body, _ := json.Marshal(events.PlacementRejected{JobID: job.JobID, Reasons: reasons})
	if len(reasons) == 0 || len(reasons) > 100 || len(body) > 64<<10 {
		t.Fatalf("%d reasons in %d bytes, want a bounded rejection", len(reasons), len(body))
	}
}

// TestAnalyzedSize: the estimate made before any group is built is never
// below the size of the analysed job, and above it by no more than its
// fixed allowances; the rank lists are counted exactly.
func TestAnalyzedSize(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(13, 7))
	pick := func(xs ...int) int { return xs[rng.IntN(len(xs))] }
	strategies := []string{"", events.StrategyDDP, events.StrategyZeRO1, events.StrategyZeRO3, events.StrategyFSDP, events.StrategyMegatron}
	checked := 0
	for i := range 400 {
		p := events.Parallelism{TP: pick(1, 2, 4, 8), PP: pick(1, 2, 3, 4), CP: pick(1, 2), EP: pick(1, 2)}
		dp := p.EP * pick(1, 2, 3, 5, 16)
		if i%50 == 0 {
			dp = p.EP * pick(512, 1024) // big: six-digit ranks
		}
		p.DP = dp
		gpus := p.TP * p.PP * p.CP * p.DP
		if gpus > MaxGPUs {
			continue
		}
		job := events.JobSubmitted{JobID: fmt.Sprintf("j%d", i), GPUs: gpus, Parallelism: &p, Strategy: strategies[rng.IntN(len(strategies))],
			Labels: map[string]string{"team": "llm", "app.kubernetes.io/name": strings.Repeat("é", rng.IntN(100))}}
		if rng.IntN(3) > 0 {
			job.Model = &events.Model{Parameters: 7e9, Layers: 8 * p.PP, HiddenSize: 4096 * p.TP, Heads: 32 * p.TP, SeqLen: 4096 * p.CP,
				GlobalBatchSize: 64 * p.DP, Dtype: events.DtypeBF16}
			if p.EP > 1 {
				job.Model.Experts = 8 * p.EP
			}
		}
		for g := range rng.IntN(4) {
			name := fmt.Sprintf("custom-%d-\u00e9\"", g%2)
			size := min(gpus, 1+rng.IntN(64))
			ranks := rng.Perm(gpus)[:size]
			c := events.CommGroup{Name: name, Collective: events.CollectiveAllReduce, Ranks: ranks, Bytes: 1 << 20}
			if g >= 2 { // same name: same shape
				c.Ranks = rng.Perm(gpus)[:len(job.Groups[g-2].Ranks)]
			}
			job.Groups = append(job.Groups, c)
		}
		a, reasons := Analyze(job)
		if len(reasons) > 0 {
			continue
		}
		checked++
		body, err := json.Marshal(a)
		if err != nil {
			t.Fatal(err)
		}
		est, _, _ := AnalyzedSize(job, a.Parallelism)
		names := map[string]bool{}
		for _, g := range job.Groups {
			names[g.Name] = true
		}
		slack := topOverhead + 5*dimensionOverhead + len(names)*(customOverhead+64)
		if est < len(body) || est > len(body)+slack {
			t.Fatalf("%s (%+v, %d groups): estimate %d, analysed %d bytes (allowance %d)", job.JobID, p, len(job.Groups), est, len(body), slack)
		}
	}
	if checked < 100 {
		t.Fatalf("only %d jobs analysed", checked)
	}
}

// TestReasonsCapped: a problem in each of thousands of groups is listed
// up to MaxReasons, the rest counted in the last reason.
func TestReasonsCapped(t *testing.T) {
	t.Parallel()
	groups := make([]events.CommGroup, MaxGroups)
	for i := range groups {
		groups[i] = events.CommGroup{Name: fmt.Sprintf("g%d", i), Collective: "gossip", Ranks: []int{0}, Bytes: 1}
	}
	_, reasons := Analyze(events.JobSubmitted{JobID: "many", GPUs: 1, Groups: groups})
	if len(reasons) != MaxReasons {
		t.Fatalf("%d reasons, want %d", len(reasons), MaxReasons)
	}
	last := reasons[len(reasons)-1]
	if last.Code != "more_problems" || !strings.Contains(last.Message, fmt.Sprintf("and %d more problems", MaxGroups-(MaxReasons-1))) {
		t.Errorf("last reason %+v", last)
	}
}

// TestCompactAnalysed: the 131,072-GPU job in five dimensions with three
// explicit groups over every rank was 4.5 MB analysed (every rank of every
// group listed, explicit ones twice) and refused; compact, it is the job's
// own size and a few KB, and it reads back as analysed.
func TestCompactAnalysed(t *testing.T) {
	t.Parallel()
	all := make([]int, MaxGPUs)
	for i := range all {
		all[i] = i
	}
	job := events.JobSubmitted{JobID: "huge", GPUs: MaxGPUs, Parallelism: &events.Parallelism{TP: 2, PP: 2, CP: 2, EP: 2}}
	for _, name := range []string{"a", "b", "c"} {
		job.Groups = append(job.Groups, events.CommGroup{Name: name, Collective: events.CollectiveAllReduce, Ranks: all, Bytes: 1})
	}
	a, reasons := Analyze(job)
	if len(reasons) > 0 {
		t.Fatalf("rejected: %+v", reasons)
	}
	body, err := json.Marshal(a)
	if err != nil {
		t.Fatal(err)
	}
	jobBody, _ := json.Marshal(job)
	if extra := len(body) - len(jobBody); extra > 8<<10 {
		t.Fatalf("analysed %d bytes, the job %d: %d more", len(body), len(jobBody), extra)
	}
	if est, _, _ := AnalyzedSize(job, a.Parallelism); est < len(body) {
		t.Fatalf("estimate %d below the %d bytes", est, len(body))
	}
	var back events.JobAnalyzed
	if err := events.DecodeJSON(body, &back); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(a, back) {
		t.Fatal("read back differs from the analysed job")
	}
	if n := len(a.Groups); n != 8 { // tp, cp, ep, dp, pp and three custom
		t.Fatalf("%d dimensions", n)
	}
}
