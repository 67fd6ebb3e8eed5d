package policies

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"testing/fstest"
	"time"

	"github.com/open-policy-agent/opa/v1/topdown"
)

func TestDefaultCompilesAndTestsPass(t *testing.T) {
	s, res, err := Check(t.Context(), Default, "default")
	if err != nil {
		t.Fatalf("default set: %v", err)
	}
	if len(res) < 15 {
		t.Fatalf("ran %d Rego tests, want the shipped ones", len(res))
	}
	for _, r := range res {
		if !r.Pass {
			t.Errorf("%s.%s (%s:%d) failed: %s", r.Package, r.Name, r.File, r.Line, r.Error)
		}
	}
	if len(s.Revision) != 64 {
		t.Errorf("revision %q", s.Revision)
	}
}

func TestRefused(t *testing.T) {
	for _, tc := range []struct {
		dir  string
		want []string // substrings of errors: file:line and the reason
	}{
		{"forbidden", []string{"http.rego:4:", "undefined function http.send", "net.rego:4:", "undefined function net.lookup_ip_addr", "runtime.rego:4:", "undefined function opa.runtime"}},
		{"failing", []string{"always_test.rego:9:", "test_failed", "test_fails failed"}},
		{"syntax", []string{"broken.rego:", "rego_parse_error"}},
	} {
		t.Run(tc.dir, func(t *testing.T) {
			s, err := CompileDir(filepath.Join("testdata", tc.dir))
			if err == nil || s != nil {
				t.Fatalf("compiled: %v", s)
			}
			var es Errors
			if !errors.As(err, &es) || len(es) == 0 || es[0].File == "" || es[0].Line == 0 {
				t.Fatalf("error %T %v: want Errors with file and line", err, err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
}

func TestCapabilitiesDropForbidden(t *testing.T) {
	for _, b := range Capabilities().Builtins {
		for _, bad := range []string{"http.send", "net.lookup_ip_addr", "net.cidr_contains", "opa.runtime", "time.now_ns", "rand.intn", "uuid.rfc4122", "trace"} {
			if b.Name == bad {
				t.Errorf("%s still allowed", bad)
			}
		}
	}
	if c := Capabilities(); c.AllowNet == nil || len(c.AllowNet) != 0 {
		t.Errorf("AllowNet %v, want empty", c.AllowNet)
	}
}

func mustDefault(t testing.TB) *Set {
	t.Helper()
	s, err := Compile(Default, "default")
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func codes(vs []Violation) string {
	var c []string
	for _, v := range vs {
		c = append(c, v.Code)
	}
	return strings.Join(c, ",")
}

func TestEvalNode(t *testing.T) {
	s := mustDefault(t)
	node := Node{Name: "n1", GPUModel: "H100", Labels: map[string]string{"tenant": "a"}, GPUs: NodeGPUs{8, 8}}
	for _, tc := range []struct {
		name string
		job  JobClass
		node Node
		deny string
	}{
		{"same tenant and model", JobClass{Tenant: "a", GPUModel: "H100"}, node, ""},
		{"other tenant", JobClass{Tenant: "b"}, node, "tenant_mismatch"},
		{"other model", JobClass{Tenant: "a", GPUModel: "A100"}, node, "gpu_model_mismatch"},
		{"label pin", JobClass{Tenant: "a", Labels: map[string]string{"toposched.io/gpu-model": "A100"}}, node, "gpu_model_mismatch"},
		{"both", JobClass{Tenant: "b", GPUModel: "A100"}, node, "gpu_model_mismatch,tenant_mismatch"},
		{"shared node", JobClass{Tenant: "b"}, Node{Name: "n2", GPUModel: "H100"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := s.EvalNode(t.Context(), tc.job, tc.node)
			if err != nil {
				t.Fatal(err)
			}
			if got := codes(r.Deny); got != tc.deny {
				t.Errorf("deny %q, want %q (%v)", got, tc.deny, r.Deny)
			}
			// Cached: the same answer again.
			r2, _ := s.EvalNode(t.Context(), tc.job, tc.node)
			if codes(r2.Deny) != tc.deny {
				t.Errorf("cached deny %q", codes(r2.Deny))
			}
			for _, v := range r.Deny {
				if !strings.HasPrefix(v.Policy, "toposched.nodes.") || v.Msg == "" {
					t.Errorf("violation %+v", v)
				}
			}
		})
	}
	if n := s.CacheLen(); n != 6 {
		t.Errorf("cache holds %d, want 6", n)
	}
}

func candidate(gpus int, leaves []string, tp [][]string, nodes []PlacedNode, wholeFree int) PlacementInput {
	in := PlacementInput{Job: Job{ID: "j", GPUs: gpus}, Placement: Candidate{Nodes: nodes, Leaves: leaves}}
	for _, d := range tp {
		in.Placement.TPGroups = append(in.Placement.TPGroups, GroupSpan{NVLinkDomains: d})
	}
	in.Cluster.WholeFreeNodesByModel = map[string]int{"H100": wholeFree}
	return in
}

func TestEvalPlacement(t *testing.T) {
	s := mustDefault(t)
	whole := PlacedNode{Name: "n1", GPUModel: "H100", GPUs: 2, GPUsTotal: 8, GPUsFree: 8}
	part := PlacedNode{Name: "n2", GPUModel: "H100", GPUs: 2, GPUsTotal: 8, GPUsFree: 4}
	for _, tc := range []struct {
		name       string
		in         PlacementInput
		deny, warn string
		score      float64
	}{
		{"good", candidate(16, []string{"l1"}, [][]string{{"a"}, {"b"}}, nil, 10), "", "", 0},
		{"tp split", candidate(16, []string{"l1"}, [][]string{{"a", "b"}}, nil, 10), "tp_outside_nvlink", "", 0},
		{"too many leaves", candidate(8, []string{"l1", "l2"}, nil, nil, 10), "leaf_span", "", 0},
		{"breaks whole node", candidate(2, []string{"l1"}, nil, []PlacedNode{whole}, 1), "", "breaks_whole_node", 1},
		{"partial node", candidate(2, []string{"l1"}, nil, []PlacedNode{part}, 1), "", "", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := s.EvalPlacement(t.Context(), tc.in)
			if err != nil {
				t.Fatal(err)
			}
			if codes(r.Deny) != tc.deny || codes(r.Warn) != tc.warn || r.Score != tc.score {
				t.Errorf("got deny %q warn %q score %v, want %q %q %v", codes(r.Deny), codes(r.Warn), r.Score, tc.deny, tc.warn, tc.score)
			}
		})
	}
}

// A judge built once for a job gives each of its candidates, judged one
// after another and again, EvalPlacement's verdict: the job and cluster
// parts it shares between them are not changed by an evaluation.
func TestPlacementJudge(t *testing.T) {
	s := mustDefault(t)
	whole := PlacedNode{Name: "n1", GPUModel: "H100", GPUs: 2, GPUsTotal: 8, GPUsFree: 8}
	part := PlacedNode{Name: "n2", GPUModel: "H100", GPUs: 2, GPUsTotal: 8, GPUsFree: 4}
	cands := []Candidate{
		candidate(2, []string{"l1"}, nil, []PlacedNode{whole}, 1).Placement,
		candidate(2, []string{"l1", "l2"}, [][]string{{"a", "b"}}, []PlacedNode{part}, 1).Placement,
		candidate(2, []string{"l1"}, nil, []PlacedNode{part}, 1).Placement,
		{Nodes: []PlacedNode{whole}, Prediction: Prediction{CommSecondsPerStep: math.NaN()}},
	}
	in := candidate(2, nil, nil, nil, 1)
	j := s.PlacementJudge(in.Job, in.Cluster)
	for round := range 2 {
		for i, c := range cands {
			in.Placement = c
			want, werr := s.EvalPlacement(t.Context(), in)
			got, gerr := j.Eval(t.Context(), c)
			if fmt.Sprint(got, gerr) != fmt.Sprint(want, werr) {
				t.Errorf("round %d, candidate %d: judge says %v, %v; EvalPlacement %v, %v", round, i, got, gerr, want, werr)
			}
		}
	}
	if r, _ := j.Eval(t.Context(), cands[0]); codes(r.Warn) != "breaks_whole_node" {
		t.Errorf("the whole node's candidate: warn %q", codes(r.Warn))
	}
}

func TestFailClosed(t *testing.T) {
	s, err := CompileDir("testdata/divzero")
	if err != nil {
		t.Fatal(err)
	}
	r, err := s.EvalPlacement(t.Context(), PlacementInput{Placement: Candidate{Nodes: []PlacedNode{{Name: "n", GPUs: 1}}}})
	if err == nil || len(r.Deny) != 1 || r.Deny[0].Code != CodePolicyError || !strings.Contains(r.Deny[0].Msg, "divide by zero") {
		t.Errorf("placement: %+v, %v", r, err)
	}
	nr, err := s.EvalNode(t.Context(), JobClass{}, Node{Name: "n"})
	if err == nil || len(nr.Deny) != 1 || nr.Deny[0].Code != CodePolicyError {
		t.Errorf("node: %+v, %v", nr, err)
	}
	if s.CacheLen() != 0 {
		t.Errorf("an error result was cached")
	}
}

func TestEvalConcurrent(t *testing.T) {
	s := mustDefault(t)
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			for j := range 50 {
				r, err := s.EvalNode(t.Context(), JobClass{Tenant: "b"}, Node{Name: "n", Labels: map[string]string{"tenant": "a"}, Version: string(rune('a' + (i+j)%5))})
				if err != nil || codes(r.Deny) != "tenant_mismatch" {
					t.Errorf("%v %v", r, err)
					return
				}
			}
		})
	}
	wg.Wait()
}

func TestWatchRefusesBrokenEdit(t *testing.T) {
	dir := t.TempDir()
	good, err := os.ReadFile("default/tenant_isolation.rego")
	if err != nil {
		t.Fatal(err)
	}
	// Each edit lands whole (written beside, then renamed over), as an
	// editor saves: os.WriteFile truncates first, and a poll between the
	// truncation and the write reads an empty module and reports it.
	write := func(name, src string) {
		tmp := filepath.Join(t.TempDir(), name)
		if err := os.WriteFile(tmp, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	write("tenant_isolation.rego", string(good))
	sets := make(chan *Set, 10)
	errs := make(chan error, 10)
	go WatchEvery(t.Context(), dir, 10*time.Millisecond, func(s *Set) { sets <- s }, func(err error) { errs <- err })
	var first *Set
	select {
	case first = <-sets:
	case err := <-errs:
		t.Fatal(err)
	case <-time.After(5 * time.Second):
		t.Fatal("no first set")
	}
	write("tenant_isolation.rego", string(good)+"\ndeny contains x if {\n\tx := http.send({})\n}\n")
	select {
	case s := <-sets:
		t.Fatalf("broken edit accepted: %v", s)
	case err := <-errs:
		if !strings.Contains(err.Error(), "tenant_isolation.rego:17") {
			t.Errorf("error %v does not name file:line", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("broken edit not reported")
	}
	// A fixed edit replaces the set.
	write("tenant_isolation.rego", string(good)+"\n# fixed\n")
	select {
	case s := <-sets:
		if s.Revision == first.Revision {
			t.Error("same revision after an edit")
		}
	case err := <-errs:
		t.Fatal(err)
	case <-time.After(5 * time.Second):
		t.Fatal("fixed edit not picked up")
	}
}

func BenchmarkEvalNodeCached(b *testing.B) {
	s := mustDefault(b)
	job := JobClass{Tenant: "a", GPUModel: "H100", GPUs: 16, Labels: map[string]string{"team": "x"}}
	node := Node{Name: "n1", GPUModel: "H100", Labels: map[string]string{"tenant": "a", "zone": "z"}, GPUs: NodeGPUs{8, 8}, Domains: []string{"leaf1", "pod1"}}
	if _, err := s.EvalNode(b.Context(), job, node); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		_, _ = s.EvalNode(b.Context(), job, node)
	}
}

func BenchmarkEvalNodeUncached(b *testing.B) {
	s := mustDefault(b)
	job := JobClass{Tenant: "a", GPUModel: "H100", GPUs: 16}
	node := Node{Name: "n1", GPUModel: "H100", Labels: map[string]string{"tenant": "a"}, GPUs: NodeGPUs{8, 8}}
	i := 0
	for b.Loop() {
		i++
		node.GPUs.Free = i // a new node state each time
		_, _ = s.EvalNode(b.Context(), job, node)
	}
}

// BenchmarkEvalPlacement evaluates a 64-GPU candidate and a one-GPU one
// each on its own (EvalPlacement) and as a job's judge does, its job and
// cluster built once for every candidate.
func BenchmarkEvalPlacement(b *testing.B) {
	s := mustDefault(b)
	var nodes []PlacedNode
	var tp [][]string
	for i := range 8 {
		n := string(rune('a' + i))
		nodes = append(nodes, PlacedNode{Name: n, GPUModel: "H100", GPUs: 8, GPUsTotal: 8, GPUsFree: 8})
		tp = append(tp, []string{n + "/nvl0"})
	}
	one := candidate(1, []string{"l1"}, nil, []PlacedNode{{Name: "a", GPUModel: "H100", GPUs: 1, GPUsTotal: 8, GPUsFree: 3}}, 3)
	one.Job.Labels = map[string]string{"team": "x", "toposched.io/gpu-model": "H100"}
	one.Job.Groups = []Group{{Dimension: "dp", Size: 1, Count: 1}}
	one.Cluster.FreeGPUsByModel = map[string]int{"A100": 100, "H100": 40, "V100": 12}
	for _, c := range []struct {
		name string
		in   PlacementInput
	}{{"64gpus", candidate(64, []string{"l1", "l2"}, tp, nodes, 3)}, {"1gpu", one}} {
		b.Run(c.name+"/each", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := s.EvalPlacement(b.Context(), c.in); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(c.name+"/judge", func(b *testing.B) {
			b.ReportAllocs()
			j := s.PlacementJudge(c.in.Job, c.in.Cluster)
			for b.Loop() {
				if _, err := j.Eval(b.Context(), c.in.Placement); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestEvalCancelled: an evaluation stops when its context ends, before or
// while it runs, and its candidate is denied. (Evaluations are cancelled
// through context.AfterFunc rather than OPA's goroutine; a policy that
// would run for many seconds proves the cancellation reached it.)
func TestEvalCancelled(t *testing.T) {
	s, err := Compile(fstest.MapFS{"slow.rego": {Data: []byte(`package toposched.placement.slow

deny contains "slow" if {
	r := numbers.range(1, input.job.gpus)
	count({1 | some i in r; some j in r; some k in r}) > 0
}
`)}}, "slow")
	if err != nil {
		t.Fatal(err)
	}
	for _, early := range []bool{true, false} {
		ctx, cancel := context.WithCancel(t.Context())
		if early {
			cancel()
		} else {
			go cancel()
		}
		r, err := s.EvalPlacement(ctx, PlacementInput{Job: Job{ID: "j", GPUs: 400}})
		var terr *topdown.Error
		if !errors.As(err, &terr) || terr.Code != topdown.CancelErr {
			t.Fatalf("cancelled before the evaluation %v: error %v, want %s", early, err, topdown.CancelErr)
		}
		if codes(r.Deny) != CodePolicyError {
			t.Errorf("cancelled before the evaluation %v: deny %q, want %s", early, codes(r.Deny), CodePolicyError)
		}
	}
}

// TestVerdictQuery: each package's deny, warn and score are read by a
// query of those rules alone; a complete rule that is undefined counts as
// absent, a package with no verdict rules reads as nothing, a package name
// that is no identifier still resolves, and a helper no verdict reads is
// not evaluated (its error does not deny the candidate).
func TestVerdictQuery(t *testing.T) {
	fsys := fstest.MapFS{
		"scored.rego": {Data: []byte(`package toposched.placement.scored

score := 2 if input.job.gpus > 4

warn contains "big" if input.job.gpus > 4
`)},
		"helper.rego": {Data: []byte(`package toposched.placement.helper

unused := 1 / 0

deny contains {"code": "odd", "msg": "odd"} if input.job.gpus % 2 == 1
`)},
		"quoted.rego": {Data: []byte(`package toposched.placement["with-dash"]

deny contains {"code": "dash", "msg": "nine"} if input.job.gpus == 9
`)},
		"nothing.rego": {Data: []byte(`package toposched.placement.nothing

x := 1
`)},
	}
	s, err := Compile(fsys, "verdicts")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		gpus       int
		deny, warn string
		score      float64
	}{
		{2, "", "", 0},
		{3, "odd", "", 0},
		{8, "", "policy", 2},
		{9, "odd,dash", "policy", 2},
	} {
		r, err := s.EvalPlacement(t.Context(), PlacementInput{Job: Job{ID: "j", GPUs: tc.gpus}})
		if err != nil {
			t.Fatalf("%d GPUs: %v", tc.gpus, err)
		}
		if codes(r.Deny) != tc.deny || codes(r.Warn) != tc.warn || r.Score != tc.score {
			t.Errorf("%d GPUs: deny %q warn %q score %v, want %q %q %v", tc.gpus, codes(r.Deny), codes(r.Warn), r.Score, tc.deny, tc.warn, tc.score)
		}
	}
}
