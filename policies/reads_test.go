package policies

import (
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"io/fs"
	"math/rand/v2"
	"slices"
	"testing"
	"testing/fstest"
)

func TestInputReads(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		rego      string
		job, node []string // fields read; "*" for all; "labels.K" for a label read by key, "labels.*" for all labels
	}{
		{"the shipped set", "", []string{"gpu_model", "labels", "labels.toposched.io/gpu-model", "tenant"}, []string{"gpu_model", "labels", "labels.tenant", "name"}},
		{"one field", `deny contains {"code": "c", "msg": "m"} if input.node.gpus.free < 2`, nil, []string{"gpus"}},
		{"an import", "import input.node as n\ndeny contains {\"code\": \"c\", \"msg\": \"m\"} if n.domains[0] == \"leaf:l1\"", nil, []string{"domains"}},
		{"input whole", `deny contains {"code": "c", "msg": "m"} if count(object.keys(input)) > 5`, []string{"*"}, []string{"*"}},
		{"input.node whole", `deny contains {"code": "c", "msg": "m"} if object.get(input.node, "x", 0) > 5`, nil, []string{"*"}},
		{"a variable key", `deny contains {"code": "c", "msg": "m"} if { some k; input.node[k] == "x" }`, nil, []string{"*"}},
		{"a key read from the input", `deny contains {"code": "c", "msg": "m"} if input.node.labels[input.job.tenant] == "no"`, []string{"tenant"}, []string{"labels", "labels.*"}},
		{"labels whole", `deny contains {"code": "c", "msg": "m"} if count(input.job.labels) > 3`, []string{"labels", "labels.*"}, nil},
		{"a function", "f(x) if input.job.priority > x\ndeny contains {\"code\": \"c\", \"msg\": \"m\"} if f(3)", []string{"priority"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var s *Set
			if tc.rego == "" {
				s = mustDefault(t)
			} else {
				var err error
				s, err = Compile(fstest.MapFS{"p.rego": {Data: []byte("package toposched.nodes.p\n" + tc.rego + "\n")}}, "t")
				if err != nil {
					t.Fatal(err)
				}
			}
			if got := fieldsOf(s.reads.job, jobFields); !slices.Equal(got, tc.job) {
				t.Errorf("job fields %v, want %v", got, tc.job)
			}
			if got := fieldsOf(s.reads.node, nodeFields); !slices.Equal(got, tc.node) {
				t.Errorf("node fields %v, want %v", got, tc.node)
			}
		})
	}
}

// defaultFiles is a copy of the shipped set's files.
func defaultFiles(t *testing.T) fstest.MapFS {
	t.Helper()
	out := fstest.MapFS{}
	err := fs.WalkDir(Default, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := fs.ReadFile(Default, p)
		out[p] = &fstest.MapFile{Data: data}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

var (
	jobFields  = []string{"gpu_model", "gpus", "gpus_per_node", "labels", "priority", "tenant"}
	nodeFields = []string{"domains", "gpu_model", "gpus", "labels", "name"}
)

// fieldsOf lists the part's fields read, of those the input has, with
// the labels read.
func fieldsOf(p partReads, fields []string) []string {
	if p.all {
		return []string{"*"}
	}
	var out []string
	for _, f := range fields {
		if p.fields[f] {
			out = append(out, f)
		}
		if f == "labels" && p.allLabels {
			out = append(out, "labels.*")
		} else if f == "labels" {
			for _, k := range p.labelKeys {
				out = append(out, "labels."+k)
			}
		}
	}
	return out
}

// The node cache keyed on the fields the policies read gives the same
// verdicts as evaluating every time: seeded jobs and nodes that differ in
// every field, through a set whose policies read some fields of each.
func TestNodeCacheByReadsIsExact(t *testing.T) {
	t.Parallel()
	files := defaultFiles(t)
	files["free.rego"] = &fstest.MapFile{Data: []byte(`package toposched.nodes.free
warn contains {"code": "few_free", "msg": sprintf("%d free", [input.node.gpus.free])} if input.node.gpus.free < input.job.gpus
`)}
	s, err := Compile(files, "t")
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(7, 7))
	pick := func(xs ...string) string { return xs[rng.IntN(len(xs))] }
	for i := range 3000 {
		job := JobClass{Tenant: pick("", "a", "b"), Priority: rng.IntN(3), GPUs: 1 + rng.IntN(8), GPUsPerNode: rng.IntN(2) * 8,
			GPUModel: pick("", "H100", "A100"), Labels: map[string]string{"toposched.io/gpu-model": pick("H100", "A100"), "x": pick("1", "2")}}
		node := Node{Name: fmt.Sprintf("n%d", rng.IntN(6)), Labels: map[string]string{"tenant": pick("a", "b"), "rack": pick("r1", "r2")},
			GPUModel: pick("H100", "A100"), GPUs: NodeGPUs{Total: 8, Free: rng.IntN(9)}, Domains: []string{pick("leaf:l1", "leaf:l2")}}
		got, err := s.EvalNode(t.Context(), job, node)
		if err != nil {
			t.Fatal(err)
		}
		want, err := s.evalNode(t.Context(), job, node)
		if err != nil {
			t.Fatal(err)
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("case %d: job %+v node %+v: cached %+v, evaluated %+v", i, job, node, got, want)
		}
	}
	if n := s.CacheLen(); n >= 3000 {
		t.Errorf("cache holds %d results for 3000 evaluations: nothing shared", n)
	}
}

// TestHasherIsFNV: the cache key's hash is hash/fnv's FNV-1a of each
// string's length (eight bytes, little end first) and bytes, and of each
// integer's eight bytes.
func TestHasherIsFNV(t *testing.T) {
	for _, in := range [][]any{
		{},
		{""},
		{"tenant-a", 3, -1},
		{0, "toposched.io/gpu-model", "H100", 1 << 40},
	} {
		h, f := newHasher(), fnv.New64a()
		var buf [8]byte
		for _, x := range in {
			switch x := x.(type) {
			case string:
				h.str(x)
				binary.LittleEndian.PutUint64(buf[:], uint64(len(x)))
				f.Write(buf[:])
				f.Write([]byte(x))
			case int:
				h.int(x)
				binary.LittleEndian.PutUint64(buf[:], uint64(x))
				f.Write(buf[:])
			}
		}
		if h.sum != f.Sum64() {
			t.Errorf("%v: %x, hash/fnv %x", in, h.sum, f.Sum64())
		}
	}
}

// A set reads the job's id only where a rule can reach it; the retry of
// the queue shares one job's wait with its twins on that answer.
func TestReadsJobID(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, rego string
		want       bool
	}{
		{"the shipped set", "", false},
		{"the id by name", `package toposched.placement.p
deny contains {"code": "c", "msg": "m"} if startswith(input.job.id, "x")`, true},
		{"input.job whole", `package toposched.placement.p
deny contains {"code": "c", "msg": "m"} if count(object.keys(input.job)) > 3`, true},
		{"input whole", `package toposched.placement.p
deny contains {"code": "c", "msg": "m"} if count(object.keys(input)) > 3`, true},
		{"a variable key", `package toposched.placement.p
deny contains {"code": "c", "msg": "m"} if { some k; input.job[k] == "x" }`, true},
		{"a function", `package toposched.placement.p
f(x) if input.job.id == x
deny contains {"code": "c", "msg": "m"} if f("x")`, true},
		{"other fields", `package toposched.placement.p
deny contains {"code": "c", "msg": "m"} if { input.job.tenant == "a"; input.job.labels.x == "y"; count(input.placement.leaves) > 2 }`, false},
		{"a node rule", `package toposched.nodes.p
deny contains {"code": "c", "msg": "m"} if input.job.gpus > input.node.gpus.free`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var s *Set
			if tc.rego == "" {
				s = mustDefault(t)
			} else {
				var err error
				s, err = Compile(fstest.MapFS{"p.rego": {Data: []byte(tc.rego + "\n")}}, "t")
				if err != nil {
					t.Fatal(err)
				}
			}
			if got := s.ReadsJobID(); got != tc.want {
				t.Errorf("ReadsJobID() = %v, want %v", got, tc.want)
			}
		})
	}
	if (*Set)(nil).ReadsJobID() {
		t.Error("a nil set reads a job's id")
	}
}
