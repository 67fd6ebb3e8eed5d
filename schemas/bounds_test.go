package schemas

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/toposched/toposched/events"
)

// Every array, open object and string of every schema is bounded: an
// array by maxItems, an object whose properties are not all named by
// maxProperties, a string by maxLength, an enum, a const, a format or an
// anchored pattern of bounded repeats. And no schema nests deeper than
// MaxDepth.
func TestSchemasBoundEveryContainer(t *testing.T) {
	t.Parallel()
	files, err := fs.Glob(FS, dir+"/*"+suffix)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		b, err := FS.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var doc any
		if err := json.Unmarshal(b, &doc); err != nil {
			t.Fatal(err)
		}
		name := strings.TrimSuffix(path.Base(f), suffix)
		boundedSchema(t, name, "", doc)
	}
}

// boundedPattern is an anchored pattern without * or + or {n,}.
var unboundedRepeat = regexp.MustCompile(`[*+]|\{[0-9]+,\}`)

func boundedSchema(t *testing.T, name, at string, v any) {
	t.Helper()
	s, ok := v.(map[string]any)
	if !ok {
		return
	}
	types := map[string]bool{}
	switch ty := s["type"].(type) {
	case string:
		types[ty] = true
	case []any:
		for _, x := range ty {
			types[x.(string)] = true
		}
	}
	has := func(k string) bool { _, ok := s[k]; return ok }
	if types["array"] && !has("maxItems") {
		t.Errorf("%s: %s: an array without maxItems", name, at)
	}
	if (types["object"] || has("properties") || has("additionalProperties")) && s["additionalProperties"] != false && !has("maxProperties") {
		t.Errorf("%s: %s: an object open to any property without maxProperties", name, at)
	}
	if types["string"] && !has("maxLength") && !has("enum") && !has("const") && !has("format") {
		p, _ := s["pattern"].(string)
		if !strings.HasPrefix(p, "^") || !strings.HasSuffix(p, "$") || unboundedRepeat.MatchString(p) {
			t.Errorf("%s: %s: a string without maxLength (pattern %q)", name, at, p)
		}
	}
	for k, x := range s {
		switch k {
		case "properties", "$defs":
			for n, sub := range x.(map[string]any) {
				boundedSchema(t, name, at+"."+n, sub)
			}
		case "items", "additionalProperties", "propertyNames":
			boundedSchema(t, name, at+"."+k, x)
		case "anyOf", "allOf", "oneOf":
			for i, sub := range x.([]any) {
				boundedSchema(t, name, fmt.Sprintf("%s.%s[%d]", at, k, i), sub)
			}
		}
	}
}

// No event nests deeper than MaxDepth, which is the events package's
// bound.
func TestMaxDepthFitsEvents(t *testing.T) {
	t.Parallel()
	if MaxDepth != events.MaxDepth {
		t.Fatalf("schemas.MaxDepth %d, events.MaxDepth %d", MaxDepth, events.MaxDepth)
	}
	valid, _ := examples(t)
	for _, e := range valid {
		if d := nesting(e.body); d > MaxDepth/4 {
			t.Errorf("%s nests %d deep, too close to MaxDepth %d", e.path, d, MaxDepth)
		}
	}
}

// nesting is how deep a valid body's arrays and objects nest.
func nesting(body []byte) int {
	d, deepest := 0, 0
	dec := json.NewDecoder(bytes.NewReader(body))
	for {
		tok, err := dec.Token()
		if err != nil {
			return deepest
		}
		switch tok {
		case json.Delim('['), json.Delim('{'):
			d++
			deepest = max(deepest, d)
		case json.Delim(']'), json.Delim('}'):
			d--
		}
	}
}

// hostile are bodies a careless or hostile publisher sent (issue 46):
// each must be refused at once, at the field and by the rule given,
// without building a document.
func hostile() []struct {
	name, event string
	body        []byte
	field, rule string
} {
	ints := func(n int) string {
		var b strings.Builder
		for i := range n {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(strconv.Itoa(i % 10))
		}
		return b.String()
	}
	unknown := func(n int) string {
		var b strings.Builder
		for i := range n {
			fmt.Fprintf(&b, `,"p%d":1`, i)
		}
		return b.String()
	}
	var groups strings.Builder
	for g := range 512 {
		if g > 0 {
			groups.WriteByte(',')
		}
		ranks := ints(256)
		if g == 511 {
			ranks += ",-1" // one rank below its minimum, at the very end
		}
		fmt.Fprintf(&groups, `{"name":"g","collective":"all_reduce","bytes":1,"ranks":[%s]}`, ranks)
	}
	deep := strings.Repeat("[", 1_000_000) + strings.Repeat("]", 1_000_000)
	return []struct {
		name, event string
		body        []byte
		field, rule string
	}{
		// The first problem in reading order: args holds strings.
		{"args of 400,000 numbers", "jobs.submitted", []byte(`{"job_id":"x","gpus":1,"args":[` + ints(400_000) + `]}`), "args[0]", "type"},
		{"args of 400,000 strings", "jobs.submitted", []byte(`{"job_id":"x","gpus":1,"args":[` + strings.TrimSuffix(strings.Repeat(`"a",`, 400_000), ",") + `]}`),
			"args", "maxItems"},
		// Broken after the bound: reading stops at the 4,097th item.
		{"args past maxItems, then not JSON", "jobs.submitted", []byte(`{"job_id":"x","gpus":1,"args":[` + strings.Repeat(`"a",`, 5000) + `x`), "", "json"},
		{"400,000 unknown properties", "jobs.submitted", []byte(`{"job_id":"x","gpus":1` + unknown(400_000) + `}`), "p0", "additionalProperties"},
		{"1,000,000-deep nesting", "jobs.submitted", []byte(deep), "", "json"},
		{"62 arrays deep, within MaxDepth", "jobs.submitted", []byte(`{"job_id":"x","gpus":1,"labels":` + strings.Repeat("[", 62) + strings.Repeat("]", 62) + `}`),
			"labels", "type"},
		// The reading's problems come first, as decode reports them.
		{"65 arrays deep, past an unknown property", "jobs.submitted", []byte(`{"job_id":"x","gpus":1,"x":` + strings.Repeat("[", 65) + strings.Repeat("]", 65) + `}`),
			"x" + strings.Repeat("[0]", 63), "depth"},
		{"a string of 8 MB", "jobs.submitted", []byte(`{"job_id":"x","gpus":1,"command":"` + strings.Repeat("c", 8<<20-100) + `"}`), "command", "maxLength"},
		{"131,073 ranks in 512 groups, the last below its minimum", "jobs.submitted",
			[]byte(`{"job_id":"x","gpus":131072,"groups":[` + groups.String() + `]}`), "groups[511].ranks[256]", "minimum"},
	}
}

// Validate answers each hostile body of issue 46 with the first problem
// at its field, allocating little: not the 436 MB and a second that the
// library took for 400,000 numbers.
func TestValidateBoundsHostileBodies(t *testing.T) {
	for _, tc := range hostile() {
		t.Run(tc.name, func(t *testing.T) {
			if err := Validate(tc.event, tc.body); err == nil { // warm up the compiled schemas
				t.Fatal("Validate passes a hostile body")
			}
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			err := Validate(tc.event, tc.body)
			runtime.ReadMemStats(&after)
			var ve *ValidationError
			if !errors.As(err, &ve) || len(ve.Problems) == 0 {
				t.Fatalf("Validate = %v, want a *ValidationError", err)
			}
			p := ve.Problems[0]
			if tc.rule != "json" && (len(ve.Problems) != 1 || p.Field != tc.field || p.Rule != tc.rule) {
				t.Errorf("problems %v, want one: %s by %s", ve.Problems, tc.field, tc.rule)
			}
			if tc.rule == "json" && p.Rule != "json" {
				t.Errorf("problems %v, want not JSON", ve.Problems)
			}
			if len(p.Field) > maxProblemText+len("…") || len(p.Message) > maxProblemText+len("…") {
				t.Errorf("problem of %d and %d bytes, want at most %d each", len(p.Field), len(p.Message), maxProblemText)
			}
			// One document of the body would be hundreds of MB; reading
			// it keeps 8 bytes per property name (to find a repeated one)
			// and little else.
			if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 8<<20 {
				t.Errorf("Validate allocated %d KB", alloc>>10)
			}
		})
	}
}

// The fast path's "fails" of the hostile bodies is the library's where
// the library can afford them (all but the deepest), and check stops at
// the bound: a body broken after its 4,097th argument fails by maxItems.
func TestFastFailsAtTheBound(t *testing.T) {
	t.Parallel()
	fast, err := fastPrograms()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range hostile() {
		if tc.rule == "json" && !strings.Contains(tc.name, "maxItems") {
			continue
		}
		r, p, _ := fast[tc.event].check(tc.body)
		if tc.rule == "json" {
			if r != fails || p.Rule != "maxItems" || p.Field != "args" {
				t.Errorf("%s: check = %v %v, want args by maxItems (read no further)", tc.name, r, p)
			}
			continue
		}
		if len(tc.body) > 1<<20 {
			continue // the library's document would be too big to hold here
		}
		rf, pf := fastVerdict(t, tc.event, tc.body)
		agree(t, tc.name, tc.body, rf, pf, library(t, tc.event, tc.body))
	}
}

// largeSubmission is a valid jobs.submitted of 512 explicit groups of
// 256 ranks (131,072 ranks, about 900 KB): the large body the fast path
// must pass as quickly as it did before it learnt to fail.
func largeSubmission() []byte {
	var b bytes.Buffer
	b.WriteString(`{"job_id":"big","gpus":131072,"groups":[`)
	for g := range 512 {
		if g > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`{"name":"g","collective":"all_reduce","bytes":1048576,"ranks":[`)
		for r := range 256 {
			if r > 0 {
				b.WriteByte(',')
			}
			b.WriteString(strconv.Itoa(g*256 + r))
		}
		b.WriteString(`]}`)
	}
	b.WriteString(`]}`)
	return b.Bytes()
}

// BenchmarkValidateLarge validates a valid body of 131,072 ranks.
func BenchmarkValidateLarge(b *testing.B) {
	body := largeSubmission()
	if err := Validate("jobs.submitted", body); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		if err := Validate("jobs.submitted", body); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkValidateHostile validates the hostile bodies of issue 46.
func BenchmarkValidateHostile(b *testing.B) {
	for _, tc := range hostile() {
		b.Run(strings.ReplaceAll(tc.name, " ", "_"), func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(tc.body)))
			for b.Loop() {
				if Validate(tc.event, tc.body) == nil {
					b.Fatal("passes")
				}
			}
		})
	}
}

// An event whose schema has no fast path still has its bodies measured
// before the library reads them: one past maxLibraryValues values, or
// nested past MaxDepth, is refused without a document; a small one gets
// the library's every problem.
func TestValidateWithoutFastPath(t *testing.T) {
	t.Parallel()
	m, err := compiled()
	if err != nil {
		t.Fatal(err)
	}
	s := m["jobs.submitted"]
	tests := []struct {
		body        string
		field, rule string
		problems    int
	}{
		{`{"job_id":"x","gpus":1,"args":[` + strings.TrimSuffix(strings.Repeat(`"a",`, maxLibraryValues), ",") + `]}`, "", "size", 1},
		{`{"job_id":"x","gpus":1,"args":` + strings.Repeat("[", MaxDepth) + strings.Repeat("]", MaxDepth) + `}`,
			"args" + strings.Repeat("[0]", MaxDepth-1), "depth", 1},
		{`{"job_id":"x","gpus":0,"args":[1,2]}`, "args[0]", "type", 3},
	}
	for _, tc := range tests {
		err := validate("jobs.submitted", s, nil, []byte(tc.body))
		var ve *ValidationError
		if !errors.As(err, &ve) || len(ve.Problems) != tc.problems || !slices.ContainsFunc(ve.Problems,
			func(p Problem) bool { return p.Field == tc.field && p.Rule == tc.rule }) {
			t.Errorf("%.60s: %v, want %d problems, among them %s by %s", tc.body, err, tc.problems, tc.field, tc.rule)
		}
	}
}
