package schemas

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// Every event has a fast path: a schema that grew a keyword fast.go does
// not translate would fall back to the library alone, correct but slow.
func TestFastCoversEvents(t *testing.T) {
	t.Parallel()
	m, err := compiled()
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range Names() {
		if _, err := compileFast(m[name]); err != nil {
			t.Errorf("%s: no fast path: %v", name, err)
		}
	}
}

// library is Validate through the library alone.
func library(t testing.TB, name string, body []byte) error {
	t.Helper()
	m, err := compiled()
	if err != nil {
		t.Fatal(err)
	}
	return validateWith(name, m[name], body)
}

// fastVerdict is the fast path's verdict on a body of the named event,
// as Validate reads it (readFast), and the problem of a failure.
func fastVerdict(t testing.TB, name string, body []byte) (result, Problem) {
	t.Helper()
	fast, err := fastPrograms()
	if err != nil {
		t.Fatal(err)
	}
	r, p, _ := readFast(fast[name], body)
	return r, p
}

// fastAccepts reports whether the fast path passes a body of the named
// event.
func fastAccepts(t testing.TB, name string, body []byte) bool {
	t.Helper()
	r, _ := fastVerdict(t, name, body)
	return r == passes
}

// agree fails the test unless the library's verdict on body, lib, is the
// fast path's (r, p): a pass, or a failure among whose problems is p (the
// same field and rule).
func agree(t testing.TB, what string, body []byte, r result, p Problem, lib error) {
	t.Helper()
	switch r {
	case passes:
		if lib != nil {
			t.Fatalf("%s: the fast path passes what the library refuses (%v):\n%.2000s", what, lib, body)
		}
	case fails:
		p = newValidationError([]Problem{p}).Problems[0] // clipped, as Validate answers it
		var ve *ValidationError
		if !errors.As(lib, &ve) {
			t.Fatalf("%s: the fast path fails (%v) what the library passes (%v):\n%.2000s", what, p, lib, body)
		}
		if !slices.ContainsFunc(ve.Problems, func(q Problem) bool { return sameProblem(p, q) }) {
			t.Fatalf("%s: the fast path's problem %v is not among the library's:\n%v\nbody:\n%.2000s", what, p, ve, body)
		}
	}
}

// sameProblem reports whether the fast path's problem p is the library's
// q: the same rule at the same field. The library places a property name
// that breaks propertyNames at the first object, in key order, holding a
// property of that name (collect's keyLocation), which may be another
// object than the one read: there, the name is enough.
func sameProblem(p, q Problem) bool {
	if p.Rule != q.Rule {
		return false
	}
	if p.Field == q.Field {
		return true
	}
	return p.Rule == "propertyNames" && lastStep(p.Field) == lastStep(q.Field)
}

// lastStep is the last property of a dotted path: b of a.b, ["x.y"] of
// a["x.y"].
func lastStep(field string) string {
	if strings.HasSuffix(field, "]") {
		return field[strings.LastIndex(field, "["):]
	}
	return field[strings.LastIndex(field, ".")+1:]
}

// The fast path (fast.go) accepts no body the library refuses, and
// declines few it accepts: seeded mutations of every example of every
// event (a property dropped, repeated or spelled with an escape, or added
// under a name of each kind propertyNames tells apart; a value replaced
// by one of every JSON type, by numbers at and past the
// schemas' bounds spelled several ways, by strings empty, long, escaped,
// non-ASCII or date-like; an array item repeated or respelled), rendered
// with their properties in random order.
func TestFastAgrees(t *testing.T) {
	t.Parallel()
	valid, invalid := examples(t)
	for _, e := range valid {
		if !fastAccepts(t, e.event, e.body) {
			t.Errorf("%s: the fast path declines a valid example", e.path)
		}
	}
	rng := rand.New(rand.NewPCG(11, 12))
	bodies, libOK, fastOK, fastFails := 0, 0, 0, 0
	for round := range 240 {
		for _, e := range append(slices.Clone(valid), invalid...) {
			doc, verr := decode(e.body)
			if verr != nil {
				continue // a body the reading refuses: FuzzFastAgrees has those
			}
			m := mutator{rng: rng, escape: rng.IntN(20) == 0, repeat: rng.IntN(20) == 0}
			for range round % 3 {
				doc = m.mutate(doc)
			}
			body := m.render(doc)
			bodies++
			libErr := library(t, e.event, body)
			lib := libErr == nil
			r, p := fastVerdict(t, e.event, body)
			if lib {
				libOK++
			}
			switch r {
			case passes:
				fastOK++
			case fails:
				fastFails++
			}
			agree(t, e.event, body, r, p, libErr)
		}
	}
	t.Logf("%d bodies: the library accepts %d; the fast path accepts %d and says where %d fail", bodies, libOK, fastOK, fastFails)
	if bodies < 10000 || libOK < bodies/10 || libOK == bodies {
		t.Fatalf("%d bodies, %d valid: the mutations do not test both verdicts", bodies, libOK)
	}
	// It leaves undecided only unique items that are neither numbers nor
	// strings, which no event has: it decides every body here.
	if fastOK != libOK || fastOK+fastFails != bodies {
		t.Fatalf("the fast path accepts %d of the %d bodies the library accepts, and fails %d of the %d others",
			fastOK, libOK, fastFails, bodies-libOK)
	}
}

// FuzzFastAgrees holds the fast path to the library on any body.
func FuzzFastAgrees(f *testing.F) {
	names := Names()
	valid, invalid := examples(f)
	for _, e := range append(valid, invalid...) {
		f.Add(uint8(slices.Index(names, e.event)), e.body)
	}
	for _, s := range []string{`{"a":1,"a":2}`, `{"\u0061":1,"a":2}`, `{"gpus":[1,1.0]}`, `1e999`, `[[[[[]]]]]`} {
		f.Add(uint8(0), []byte(s))
	}
	// The reader's bounds and answers (issue 46): an escaped or non-ASCII
	// name, a repeat past the names compared one by one, unique items
	// by value, nesting at and past MaxDepth, an array past its maxItems
	// then broken, a string past its maxLength.
	jobs := uint8(slices.Index(names, "jobs.submitted"))
	node := uint8(slices.Index(names, "topology.node"))
	many := ""
	for i := range 20 {
		many += fmt.Sprintf(`,"k%d":"v"`, i)
	}
	for _, s := range []struct {
		event uint8
		body  string
	}{
		{jobs, `{"\u006aob_id":"a","gpus":1}`},
		{jobs, `{"job_id":"a","gpus":1,"labels":{"é":"x","\u00e9":"y"}}`},
		{jobs, `{"job_id":"a","gpus":1,"labels":{"k3":"w"` + many + `}}`},
		{jobs, `{"job_id":"a","gpus":1,"x":` + strings.Repeat("[", MaxDepth) + strings.Repeat("]", MaxDepth) + `}`},
		{jobs, `{"job_id":"a","gpus":1,"args":` + strings.Repeat("[", MaxDepth+1) + strings.Repeat("]", MaxDepth+1) + `}`},
		{jobs, `{"job_id":"a","gpus":1,"args":[` + strings.Repeat(`"a",`, 4097) + `x`},
		{jobs, `{"job_id":"a","gpus":1,"command":"` + strings.Repeat("c", 4097) + `"}`},
		{node, `{"name":"n","gpus":[{"index":0},{"index":1}],"nics":[],"gpu_paths":[["X","NV12"],["NV12","X"]],"gpu_model":"A","paths":[1,1.0]}`},
	} {
		f.Add(s.event, []byte(s.body))
	}
	f.Fuzz(func(t *testing.T, i uint8, body []byte) {
		name := names[int(i)%len(names)]
		r, p := fastVerdict(t, name, body)
		agree(t, name, body, r, p, library(t, name, body))
	})
}

// mutator changes decoded documents at random and renders them.
type mutator struct {
	rng *rand.Rand
	// escape and repeat: render spells the first property name it
	// writes with an escape, or repeats it.
	escape, repeat bool
}

// replacements are the values a mutation puts in place of another.
var replacements = []string{`null`, `true`, `false`, `0`, `-0`, `0.0`, `1`, `1.0`, `1e0`, `-1`, `0.5`, `1.5`, `2`, `7`,
	`8`, `63`, `64`, `65`, `100`, `1e2`, `1024`, `65535`, `65536`, `1e6`, `1000001`, `9007199254740993`,
	`9223372036854775807`, `9223372036854775808`, `1e308`, `-1e308`, `1e-7`, `""`, `"a"`, `"A"`, `"node-1"`,
	`"é"`, `"\u0041"`, `"a\"b"`, `"ring"`, `"nvls"`, `"dp"`, `"tp"`, `"simple"`, `"ll128"`, `"NCCL_ALGO"`, `"nccl_algo"`,
	`"2026-12-06T07:44:26Z"`, `"2026-13-06T07:44:26Z"`, `"2026-12-06 07:44:26"`, `"0"`, `"123"`, `[]`, `[0]`,
	`[0,1]`, `[1,1]`, `["a","a"]`, `{}`, `{"a":"b"}`, `{"NCCL_ALGO":"ring"}`}

// propertyNames are the names a mutation adds a property under.
var propertyNames = []string{"extra", "NCCL_PROTO", "NCCL_ALGO", "nccl_proto", "9LIVES", "0", "17", "0123", "x.y/z",
	"team", "é", "", strings.Repeat("k", 318)}

func init() {
	// A long string, and one past every maxLength.
	replacements = append(replacements, strconv.Quote(string(bytes.Repeat([]byte("x"), 320))),
		strconv.Quote(string(bytes.Repeat([]byte("y"), 5000))))
}

func (m mutator) value() any {
	doc, verr := decode([]byte(replacements[m.rng.IntN(len(replacements))]))
	if verr != nil {
		panic(verr)
	}
	return doc
}

// mutate changes one place of doc, chosen at random, and returns the doc.
func (m mutator) mutate(doc any) any {
	var places []any // the objects and arrays of doc
	var walk func(v any)
	walk = func(v any) {
		switch x := v.(type) {
		case map[string]any:
			places = append(places, x)
			for _, k := range slices.Sorted(maps.Keys(x)) {
				walk(x[k])
			}
		case []any:
			places = append(places, x)
			for _, e := range x {
				walk(e)
			}
		}
	}
	walk(doc)
	if len(places) == 0 {
		return m.value()
	}
	switch p := places[m.rng.IntN(len(places))].(type) {
	case map[string]any:
		keys := slices.Sorted(maps.Keys(p))
		switch op := m.rng.IntN(4); {
		case op == 0 && len(keys) > 0:
			delete(p, keys[m.rng.IntN(len(keys))])
		case op == 1:
			// A name of each kind the schemas' propertyNames and
			// additionalProperties tell apart, with a sibling's value
			// half the time (so the rest of the body may stay valid).
			name := propertyNames[m.rng.IntN(len(propertyNames))]
			if len(keys) > 0 && m.rng.IntN(2) == 0 {
				p[name] = p[keys[m.rng.IntN(len(keys))]]
			} else {
				p[name] = m.value()
			}
		case len(keys) > 0:
			p[keys[m.rng.IntN(len(keys))]] = m.value()
		}
	case []any:
		switch op := m.rng.IntN(4); {
		case op == 0 && len(p) > 0:
			// A repeat, or the same number spelled otherwise.
			x := p[m.rng.IntN(len(p))]
			if n, ok := x.(json.Number); ok && plainInt(string(n)) && m.rng.IntN(2) == 0 {
				x = json.Number(string(n) + ".0")
			}
			p = append(p, x)
			return m.replace(doc, places, p)
		case len(p) > 0:
			p[m.rng.IntN(len(p))] = m.value()
		}
	}
	return doc
}

// replace puts a grown array back where it was found (append may have
// moved it).
func (m mutator) replace(doc any, places []any, grown []any) any {
	var fix func(v any) any
	fix = func(v any) any {
		switch x := v.(type) {
		case map[string]any:
			for k, e := range x {
				x[k] = fix(e)
			}
		case []any:
			if len(x) > 0 && len(grown) == len(x)+1 && &x[0] == &grown[0] {
				return grown
			}
			for i, e := range x {
				x[i] = fix(e)
			}
		}
		return v
	}
	return fix(doc)
}

// render writes doc as JSON with each object's properties in random
// order.
func (m *mutator) render(doc any) []byte {
	var b bytes.Buffer
	var write func(v any)
	write = func(v any) {
		switch x := v.(type) {
		case map[string]any:
			keys := slices.Sorted(maps.Keys(x))
			m.rng.Shuffle(len(keys), func(i, j int) { keys[i], keys[j] = keys[j], keys[i] })
			if len(keys) > 0 && m.repeat {
				keys = append(keys, keys[0])
				m.repeat = false
			}
			b.WriteByte('{')
			for i, k := range keys {
				if i > 0 {
					b.WriteByte(',')
				}
				if k != "" && m.escape {
					fmt.Fprintf(&b, `"\u%04x%s"`, k[0], k[1:])
					m.escape = false
				} else {
					b.WriteString(strconv.Quote(k))
				}
				b.WriteString(": ")
				write(x[k])
			}
			b.WriteByte('}')
		case []any:
			b.WriteByte('[')
			for i, e := range x {
				if i > 0 {
					b.WriteString(", ")
				}
				write(e)
			}
			b.WriteByte(']')
		default:
			enc, err := json.Marshal(x)
			if err != nil {
				panic(err)
			}
			b.Write(enc)
		}
	}
	write(doc)
	return b.Bytes()
}

// FuzzFastGrammar holds the fast path's reading of JSON to Validate's
// (json.Valid, then no repeated property, no number out of range, no
// nesting past MaxDepth), with a schema that admits every value (check)
// and with none (measure): each passes exactly what that reading takes,
// and its problem is one of that reading's.
func FuzzFastGrammar(f *testing.F) {
	valid, invalid := examples(f)
	for _, e := range append(valid, invalid...) {
		f.Add(e.body)
	}
	for _, s := range []string{``, ` `, `{}`, `[]`, `{"a":}`, `{"a" 1}`, `{"a":1,}`, `[1,]`, `[,1]`, `{,}`, `01`, `-`, `-0`, `1.`,
		`.5`, `1e`, `1e+`, `1E-2`, `-0.0e0`, `tru`, `nul`, `true false`, `"\u12"`, `"\u12G4"`, `"\x"`, "\"\x01\"", `"\/"`,
		`{"a":1} x`, `{"a":1 "b":2}`, `[1 2]`, `[[[[]]]]`, `"`, `{"a`, `{"a":"b`, `1e400`, `123456789012345678`, `1234567890123456789`} {
		f.Add([]byte(s))
	}
	for _, depth := range []int{MaxDepth, MaxDepth + 1, 10001} {
		f.Add([]byte(strings.Repeat("[", depth) + strings.Repeat("]", depth)))
		f.Add([]byte(strings.Repeat(`{"a":`, depth) + "1" + strings.Repeat("}", depth)))
	}
	f.Add([]byte(`{"\u0061":1,"a":2}`))
	f.Add([]byte(`{"k0":0,"k1":1,"k2":2,"k3":3,"k4":4,"k5":5,"k6":6,"k7":7,"k8":8,"k9":9,"k10":10,"k11":11,"k12":12,"k13":13,"k14":14,"k15":15,"k16":16,"k3":17}`))
	anything := &fastSchema{minLen: -1, maxLen: -1, minProps: -1, maxProps: -1, minItems: -1, maxItems: -1}
	f.Fuzz(func(t *testing.T, body []byte) {
		_, verr := decode(body)
		var lib error
		if verr != nil {
			lib = verr
		}
		r, p := fastVerdictOf(anything, body)
		agree(t, "check", body, r, p, lib)
		if r == undecided {
			t.Fatalf("check leaves %q undecided", body)
		}
		if json.Valid(body) {
			// measure reads what json.Valid takes (readFast).
			m, mp, _ := measure(body)
			agree(t, "measure", body, m, mp, lib)
		}
	})
}

// keywordSchema uses every keyword fast.go translates, in the forms the
// event schemas use today and in those they do not (an integer type
// beside anyOf, which the number vocabulary leaves to the library; the
// library's own bounds; allOf; a recursive $ref; the false schema).
const keywordSchema = `{"$id": "https://toposched.dev/test/k.json", "type": "object", "required": ["id"],
	"additionalProperties": false, "maxProperties": 6,
	"properties": {
		"id": {"type": "string", "minLength": 1, "maxLength": 5, "pattern": "^[a-z]+$"},
		"n": {"type": "integer", "minimum": 0, "maximum": 9},
		"x": {"type": "number", "exclusiveMinimum": 0, "multipleOf": 0.5},
		"i": {"type": "integer", "anyOf": [{"minimum": 10}, {"const": -1}]},
		"r": {"anyOf": [{"exclusiveMaximum": 2.5, "multipleOf": 0.25}, {"type": "string", "enum": ["a", "b"]}]},
		"c": {"const": "on"},
		"e": {"enum": ["ring", "tree"]},
		"t": {"type": "string", "format": "date-time"},
		"m": {"type": "object", "minProperties": 1, "maxProperties": 3, "propertyNames": {"$ref": "#/$defs/envName"},
			"additionalProperties": {"type": "string", "maxLength": 3}},
		"l": {"type": "array", "minItems": 1, "maxItems": 4, "uniqueItems": true, "items": {"type": ["integer", "string"]}},
		"a": {"allOf": [{"type": "array"}, {"maxItems": 3}], "items": {"$ref": "#/$defs/tree"}},
		"f": false,
		"u": {"type": ["null", "boolean"]}
	},
	"$defs": {
		"envName": {"pattern": "^[A-Z_][A-Z0-9_]*$", "maxLength": 8},
		"tree": {"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/tree"}}}, "additionalProperties": false}
	}}`

// The fast path gives the library's verdict on seeded bodies of a schema
// that uses every keyword it translates (keywordSchema): it accepts
// exactly what the library accepts, and where it refuses, its problem is
// one of the library's.
func TestFastAgreesOnKeywords(t *testing.T) {
	t.Parallel()
	ours, _ := vocabSchemas(t, "https://toposched.dev/test/k.json", keywordSchema)
	fast, err := compileFast(ours)
	if err != nil {
		t.Fatal(err)
	}
	lib := func(body []byte) error {
		doc, verr := decode(body)
		if verr != nil {
			return verr
		}
		err := ours.Validate(doc)
		if err == nil {
			return nil
		}
		var jerr *jsonschema.ValidationError
		if !errors.As(err, &jerr) {
			t.Fatalf("validate: %v", err)
		}
		var probs []Problem
		collect(jerr, doc, &probs)
		return newValidationError(probs)
	}
	pools := map[string][]string{
		"id": {`"abc"`, `"a"`, `""`, `"abcdef"`, `"ab1"`, `"AB"`, `1`, `"\u0061"`},
		"n":  {`0`, `9`, `10`, `-1`, `1.0`, `4.5`, `9e0`, `"3"`, `1e400`, `null`},
		"x":  {`0.5`, `1`, `0`, `-0.5`, `0.25`, `1e2`, `100.5`, `true`},
		"i":  {`10`, `11`, `-1`, `-1.0`, `0`, `9`, `10.5`, `1e1`, `"10"`},
		"r":  {`0`, `2.25`, `2.5`, `0.3`, `-1`, `"a"`, `"c"`, `null`},
		"c":  {`"on"`, `"off"`, `"o\u006e"`, `1`},
		"e":  {`"ring"`, `"tree"`, `"nvls"`, `0`},
		"t":  {`"2026-12-06T07:44:26Z"`, `"2026-12-06T07:44:26.5+01:00"`, `"2026-13-06T07:44:26Z"`, `"yesterday"`, `1`},
		"m":  {`{"A":"x"}`, `{}`, `{"A":"x","B":"y","C":"z","D":"w"}`, `{"a":"x"}`, `{"TOO_LONG_X":"x"}`, `{"A":"long"}`, `{"A":1}`, `{"A":"x","A":"y"}`},
		"l":  {`[1]`, `[1,2]`, `[1,1]`, `["a","a"]`, `["a",1]`, `[1,1.0]`, `[]`, `[1,2,3,4,5]`, `[1.5]`, `[-0,0]`, `["a","b","c"]`},
		"a":  {`[]`, `[{}]`, `[{"kids":[{"kids":[]}]}]`, `[{"kids":[{"x":1}]}]`, `[{},{},{},{}]`, `{}`},
		"f":  {`1`, `null`},
		"u":  {`null`, `true`, `false`, `0`},
		"zz": {`1`},
	}
	names := slices.Sorted(maps.Keys(pools))
	rng := rand.New(rand.NewPCG(5, 6))
	accepted, agreed := 0, 0
	for range 20000 {
		var b strings.Builder
		b.WriteString("{")
		n := 0
		for _, k := range names {
			if (k == "id" && rng.IntN(12) > 0) || rng.IntN(5) == 0 {
				if n > 0 {
					b.WriteString(",")
				}
				n++
				fmt.Fprintf(&b, "%q:%s", k, pools[k][rng.IntN(len(pools[k]))])
			}
		}
		b.WriteString("}")
		body := []byte(b.String())
		libErr := lib(body)
		r, p := fastVerdictOf(fast, body)
		agree(t, "keywords", body, r, p, libErr)
		if r == undecided {
			t.Fatalf("the fast path leaves undecided: %s", body)
		}
		if libErr == nil {
			accepted++
			if r == passes {
				agreed++
			}
		}
	}
	t.Logf("20000 bodies: the library accepts %d, the fast path %d", accepted, agreed)
	if accepted < 1000 {
		t.Fatalf("only %d valid bodies: the pools test one verdict", accepted)
	}
}

// fastVerdictOf is readFast's verdict with a schema of a test's own.
func fastVerdictOf(f *fastSchema, body []byte) (result, Problem) {
	r, p, _ := readFast(f, body)
	return r, p
}
