package schemas

import (
	"bytes"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/toposched/toposched/events"
)

// example is one example payload of an event.
type example struct {
	event string
	path  string // path in FS
	body  []byte
}

// examples returns the valid and the invalid examples of every event.
func examples(t testing.TB) (valid, invalid []example) {
	t.Helper()
	err := fs.WalkDir(FS, dir+"/examples", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		if path.Ext(p) != ".json" {
			t.Errorf("%s: examples must be .json files", p)
			return nil
		}
		b, err := FS.ReadFile(p)
		if err != nil {
			return err
		}
		// v1/examples/<event>/[invalid/]<file>.json
		parts := strings.Split(strings.TrimPrefix(p, dir+"/examples/"), "/")
		switch {
		case len(parts) == 2:
			valid = append(valid, example{parts[0], p, b})
		case len(parts) == 3 && parts[1] == "invalid":
			invalid = append(invalid, example{parts[0], p, b})
		default:
			t.Errorf("%s: unexpected place for an example", p)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("walk examples: %v", err)
	}
	return valid, invalid
}

// schemaDocs returns every schema file parsed, by $id.
func schemaDocs(t testing.TB) map[string]map[string]any {
	t.Helper()
	files, err := fs.Glob(FS, dir+"/*"+suffix)
	if err != nil {
		t.Fatalf("glob: %v", err)
	}
	docs := make(map[string]map[string]any)
	for _, f := range files {
		b, err := FS.ReadFile(f)
		if err != nil {
			t.Fatalf("read %s: %v", f, err)
		}
		var doc map[string]any
		if err := json.Unmarshal(b, &doc); err != nil {
			t.Fatalf("parse %s: %v", f, err)
		}
		id, _ := doc["$id"].(string)
		docs[id] = doc
	}
	return docs
}

func catalogue() []string {
	var names []string
	for _, n := range events.Catalogue {
		names = append(names, string(n))
	}
	sort.Strings(names)
	return names
}

func TestSchemasCompile(t *testing.T) {
	t.Parallel()
	m, err := compile()
	if err != nil {
		t.Fatalf("compile: %v", err)
	}
	if len(m) != len(Names()) {
		t.Errorf("compiled %d schemas, want %d", len(m), len(Names()))
	}
}

func TestNamesMatchCatalogue(t *testing.T) {
	t.Parallel()
	if got, want := Names(), catalogue(); !slices.Equal(got, want) {
		t.Errorf("Names() = %v, want the catalogue %v", got, want)
	}
}

func TestSchemaHeaders(t *testing.T) {
	t.Parallel()
	for _, n := range events.Catalogue {
		t.Run(string(n), func(t *testing.T) {
			t.Parallel()
			b, err := Schema(string(n))
			if err != nil {
				t.Fatalf("Schema: %v", err)
			}
			var doc map[string]any
			if err := json.Unmarshal(b, &doc); err != nil {
				t.Fatalf("parse: %v", err)
			}
			want := map[string]string{
				"$schema": "https://json-schema.org/draft/2020-12/schema",
				"$id":     BaseURL + string(n) + suffix,
				"title":   string(n),
			}
			for k, v := range want {
				if doc[k] != v {
					t.Errorf("%s = %v, want %q", k, doc[k], v)
				}
			}
			if d, _ := doc["description"].(string); !strings.Contains(d, n.CEType()) {
				t.Errorf("description %q does not name the CloudEvents type %s", d, n.CEType())
			}
		})
	}
}

func TestSchemaUnknown(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"", "jobs", "jobs.submitted.v1", "../schemas", "examples/jobs.submitted/minimal", ".", "v1"} {
		if _, err := Schema(name); !errors.Is(err, ErrUnknownEvent) {
			t.Errorf("Schema(%q) error = %v, want ErrUnknownEvent", name, err)
		}
		if err := Validate(name, []byte(`{}`)); !errors.Is(err, ErrUnknownEvent) {
			t.Errorf("Validate(%q) error = %v, want ErrUnknownEvent", name, err)
		}
	}
	// The shared definitions are a schema but not an event.
	if _, err := Schema(Common); err != nil {
		t.Errorf("Schema(%q): %v", Common, err)
	}
	if err := Validate(Common, []byte(`{}`)); !errors.Is(err, ErrUnknownEvent) {
		t.Errorf("Validate(%q) error = %v, want ErrUnknownEvent", Common, err)
	}
}

// TestDescriptions walks every schema: each property needs a description,
// and each object with properties must refuse unknown ones.
func TestDescriptions(t *testing.T) {
	t.Parallel()
	for id, doc := range schemaDocs(t) {
		var walk func(loc string, v any)
		walk = func(loc string, v any) {
			switch v := v.(type) {
			case map[string]any:
				if props, ok := v["properties"].(map[string]any); ok {
					if v["additionalProperties"] != false {
						t.Errorf("%s#%s: object with properties lacks additionalProperties: false", id, loc)
					}
					for name, p := range props {
						if d, _ := p.(map[string]any)["description"].(string); d == "" {
							t.Errorf("%s#%s/properties/%s: no description", id, loc, name)
						}
					}
				}
				for k, e := range v {
					walk(loc+"/"+k, e)
				}
			case []any:
				for _, e := range v {
					walk(loc+"/[]", e)
				}
			}
		}
		walk("", doc)
		if d, _ := doc["description"].(string); d == "" {
			t.Errorf("%s: no description", id)
		}
	}
}

func TestExamplesPresent(t *testing.T) {
	t.Parallel()
	valid, invalid := examples(t)
	nv, ni := map[string]int{}, map[string]int{}
	for _, e := range valid {
		nv[e.event]++
	}
	for _, e := range invalid {
		ni[e.event]++
	}
	for _, n := range catalogue() {
		if nv[n] < 2 {
			t.Errorf("%s: %d valid examples, want at least 2", n, nv[n])
		}
		if ni[n] < 1 {
			t.Errorf("%s: no invalid example", n)
		}
		delete(nv, n)
		delete(ni, n)
	}
	for n := range nv {
		t.Errorf("examples for %q, which is not in the catalogue", n)
	}
	for n := range ni {
		t.Errorf("invalid examples for %q, which is not in the catalogue", n)
	}
}

// TestValidExamples proves each valid example matches its schema and its Go
// type: it decodes strictly and encodes back to the same JSON.
func TestValidExamples(t *testing.T) {
	t.Parallel()
	valid, _ := examples(t)
	for _, e := range valid {
		t.Run(strings.TrimPrefix(e.path, dir+"/examples/"), func(t *testing.T) {
			t.Parallel()
			if err := Validate(e.event, e.body); err != nil {
				t.Fatalf("Validate:\n%v", err)
			}
			v := events.Name(e.event).New()
			if v == nil {
				t.Fatalf("events.Name(%q).New() = nil", e.event)
			}
			// The events decoder, as the services read bodies: integers
			// may be written 8.0; unknown fields are refused.
			if err := events.DecodeJSONStrict(e.body, v); err != nil {
				t.Fatalf("decode into %T: %v", v, err)
			}
			out, err := json.Marshal(v)
			if err != nil {
				t.Fatalf("encode %T: %v", v, err)
			}
			var a, b any
			if err := json.Unmarshal(e.body, &a); err != nil {
				t.Fatalf("parse example: %v", err)
			}
			if err := json.Unmarshal(out, &b); err != nil {
				t.Fatalf("parse encoding: %v", err)
			}
			// A type with its own encoding (jobs.analyzed's compact form)
			// may write the example otherwise, but must read back the
			// same value.
			if _, own := v.(json.Marshaler); own {
				if err := Validate(e.event, out); err != nil {
					t.Fatalf("the encoding breaks the schema: %v\n%s", err, out)
				}
				again := events.Name(e.event).New()
				if err := events.DecodeJSONStrict(out, again); err != nil {
					t.Fatalf("decode the encoding %s: %v", out, err)
				}
				if !reflect.DeepEqual(v, again) {
					t.Errorf("round trip through %T changed the value:\nexample: %s\nencoded: %s", v, bytes.TrimSpace(e.body), out)
				}
				return
			}
			if !reflect.DeepEqual(a, b) {
				t.Errorf("round trip through %T changed the example:\nexample: %s\nencoded: %s", v, bytes.TrimSpace(e.body), out)
			}
		})
	}
}

func TestInvalidExamples(t *testing.T) {
	t.Parallel()
	_, invalid := examples(t)
	for _, e := range invalid {
		t.Run(strings.TrimPrefix(e.path, dir+"/examples/"), func(t *testing.T) {
			t.Parallel()
			err := Validate(e.event, e.body)
			var ve *ValidationError
			if !errors.As(err, &ve) {
				t.Fatalf("Validate = %v, want a *ValidationError", err)
			}
			if len(ve.Problems) == 0 {
				t.Fatalf("ValidationError without problems")
			}
		})
	}
}

// where is a Problem without its message, which is for people and may change
// with the validator.
type where struct{ Field, Rule string }

func wheres(err error) ([]where, bool) {
	var ve *ValidationError
	if !errors.As(err, &ve) {
		return nil, false
	}
	var w []where
	for _, p := range ve.Problems {
		w = append(w, where{p.Field, p.Rule})
	}
	return w, true
}

func TestProblemsOfExamples(t *testing.T) {
	t.Parallel()
	tests := []struct {
		file string // under v1/examples
		want []where
	}{
		{"jobs.submitted/invalid/missing-job-id.json", []where{{"job_id", "required"}}},
		{"jobs.submitted/invalid/gpus-zero.json", []where{{"gpus", "minimum"}}},
		{"jobs.submitted/invalid/unknown-field-gpu.json", []where{{"gpu", "additionalProperties"}}},
		{"jobs.submitted/invalid/parallelism-tp-zero.json", []where{{"parallelism.tp", "minimum"}}},
		{"jobs.submitted/invalid/job-id-space.json", []where{{"job_id", "pattern"}}},
		{"jobs.submitted/invalid/workdir-relative.json", []where{{"workdir", "pattern"}}},
		{"jobs.submitted/invalid/args-nul.json", []where{{"args[3]", "pattern"}}},
		{"jobs.submitted/invalid/run-as-option.json", []where{{"run_as", "pattern"}}},
		{"jobs.submitted/invalid/not-an-object.json", []where{{"", "type"}}},
		{"jobs.submitted/invalid/truncated.json", []where{{"", "json"}}},
		{"jobs.submitted/invalid/several.json", []where{
			{"gpus", "type"},
			{"job_id", "pattern"},
			{"labels.team", "type"},
			{"parallelism.sp", "additionalProperties"},
			{"priority", "type"},
		}},
		{"jobs.analyzed/invalid/job-missing-job-id.json", []where{{"job.job_id", "required"}}},
		{"placement.decided/invalid/negative-gpu.json", []where{{"ranks[3].gpu", "minimum"}}},
		{"placement.pending/invalid/reason-missing-code.json", []where{{"reasons[0].code", "required"}}},
		{"topology.health/invalid/bad-time.json", []where{{"observed_at", "format"}}},
		{"topology.fabric/invalid/bad-tier.json", []where{{"switches[0].tier", "enum"}}},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			t.Parallel()
			b, err := FS.ReadFile(dir + "/examples/" + tt.file)
			if err != nil {
				t.Fatalf("read: %v", err)
			}
			event, _, _ := strings.Cut(tt.file, "/")
			err = Validate(event, b)
			got, ok := wheres(err)
			if !ok {
				t.Fatalf("Validate = %v, want a *ValidationError", err)
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("problems = %v, want %v\nerror:\n%v", got, tt.want, err)
			}
		})
	}
}

func TestProblems(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		event string
		body  string
		want  []where
	}{
		{"not json", "jobs.submitted", `{"job_id": x}`, []where{{"", "json"}}},
		{"empty body", "jobs.submitted", ``, []where{{"", "json"}}},
		{"trailing data", "jobs.submitted", `{"job_id":"a","gpus":1} {}`, []where{{"", "json"}}},
		{"null", "jobs.finished", `null`, []where{{"", "type"}}},
		{"missing both", "jobs.finished", `{}`, []where{{"job_id", "required"}, {"status", "required"}}},
		{"two unknown", "jobs.finished", `{"job_id":"a","status":"failed","b":1,"a":2}`,
			[]where{{"a", "additionalProperties"}, {"b", "additionalProperties"}}},
		{"dotted label key", "jobs.submitted", `{"job_id":"a","gpus":1,"labels":{"app.kubernetes.io/name":1}}`,
			[]where{{`labels["app.kubernetes.io/name"]`, "type"}}},
		{"digit key is not an index", "jobs.submitted", `{"job_id":"a","gpus":1,"labels":{"3":true}}`,
			[]where{{`labels["3"]`, "type"}}},
		{"nested array", "jobs.analyzed",
			`{"job":{"job_id":"a","gpus":2},"parallelism":{"dp":2},"order":["dp"],"groups":[{"dimension":"dp","size":2,"members":[[0,-1]]}]}`,
			[]where{{"groups[0].members[0][1]", "minimum"}}},
		{"nested required", "placement.decided",
			`{"job_id":"a","strategy":"topology","ranks":[{"rank":0,"node":"n","gpu":0}],"nodes":[{"node":"n","gpus":[0],"cuda_visible_devices":"0"}],"decided_at":"2025-03-14T09:26:53Z"}`,
			[]where{{"ranks[0].local_rank", "required"}}},
		{"long job id", "jobs.finished", `{"job_id":"` + strings.Repeat("a", 129) + `","status":"failed"}`,
			[]where{{"job_id", "pattern"}}},
		{"longest job id", "jobs.finished", `{"job_id":"` + strings.Repeat("a", 128) + `","status":"failed"}`, nil},
		{"negative priority", "jobs.submitted", `{"job_id":"a","gpus":1,"priority":-100}`, nil},
		{"huge number", "jobs.submitted", `{"job_id":"a","gpus":1e5000000}`, []where{{"gpus", "number"}}},
		{"tiny number", "jobs.submitted", `{"job_id":"a","gpus":1,"priority":1e-999999}`, []where{{"priority", "number"}}},
		{"zero with huge exponent", "jobs.submitted", `{"job_id":"a","gpus":1,"priority":0e-99999999999999999999}`, []where{{"priority", "number"}}},
		{"number beyond float64", "topology.node", `{"name":"n","position":2e308,"gpus":[]}`, []where{{"position", "number"}}},
		{"long number", "topology.node", `{"name":"n","position":0,"gpus":[{"index":1` + strings.Repeat("0", 100) + `}]}`, []where{{"gpus[0].index", "number"}}},
		{"duplicate property", "jobs.analyzed",
			`{"job":{"job_id":"a","gpus":2},"parallelism":{"dp":2},"order":["dp"],"groups":[{"dimension":"dp","size":"","size":2,"members":[]}]}`,
			[]where{{"groups[0].size", "json"}}},
		{"duplicate quoted key", "jobs.submitted", `{"job_id":"a","gpus":1,"labels":{"a.b":"1","a.b":"2"}}`,
			[]where{{`labels["a.b"]`, "json"}}},
		// RFC 3339 allows these; Go's time.Time does not.
		{"leap second", "topology.health", `{"node":"n","component":"node","health":"healthy","observed_at":"2016-12-31T23:59:60Z"}`,
			[]where{{"observed_at", "pattern"}}},
		{"lower-case t", "topology.health", `{"node":"n","component":"node","health":"healthy","observed_at":"2025-03-14t09:26:53Z"}`,
			[]where{{"observed_at", "pattern"}}},
		{"offset time", "topology.health", `{"node":"n","component":"node","health":"healthy","observed_at":"2025-03-14T09:26:53.5-07:00"}`, nil},
		// JSON Schema counts 8.0 as an integer, and so does the events
		// decoder (events.DecodeJSON), though encoding/json alone would not.
		{"integral float", "jobs.submitted", `{"job_id":"a","gpus":8.0}`, nil},
		{"integral exponent", "jobs.submitted", `{"job_id":"a","gpus":7e9,"priority":-0.0}`, nil},
		{"fraction", "jobs.submitted", `{"job_id":"a","gpus":2.5}`, []where{{"gpus", "type"}}},
		{"many labels", "jobs.submitted", `{"job_id":"a","gpus":1,"labels":{` + labels(65) + `}}`, []where{{"labels", "maxProperties"}}},
		{"most labels", "jobs.submitted", `{"job_id":"a","gpus":1,"labels":{` + labels(64) + `}}`, nil},
		{"long label value", "jobs.submitted", `{"job_id":"a","gpus":1,"labels":{"team":"` + strings.Repeat("é", 1025) + `"}}`,
			[]where{{"labels.team", "maxLength"}}},
		{"longest label value", "topology.node", `{"name":"n","position":0,"gpus":[],"labels":{"team":"` + strings.Repeat("é", 1024) + `"}}`, nil},
		{"p2p matrix and cpu", "topology.node", `{"name":"n","position":0,"gpus":[],"p2p":[["X","NS"],["NS","X"]],"cpu":{"arch":"x86_64","vendor":"GenuineIntel","family":6,"model":85}}`, nil},
		{"bad p2p status", "topology.node", `{"name":"n","position":0,"gpus":[],"p2p":[["X","MAYBE"]]}`, []where{{"p2p[0][1]", "enum"}}},
		{"long label key", "jobs.submitted", `{"job_id":"a","gpus":1,"labels":{"` + strings.Repeat("k", 318) + `":"v"}}`,
			[]where{{"labels." + strings.Repeat("k", 318), "propertyNames"}}},
		{"many groups", "jobs.submitted", `{"job_id":"a","gpus":1,"groups":[` +
			strings.TrimSuffix(strings.Repeat(`{"name":"g","collective":"all_reduce","ranks":[0],"bytes":1},`, 4097), ",") + `]}`,
			[]where{{"groups", "maxItems"}}},
		{"ranks out of order", "jobs.submitted", `{"gpus":0,"job_id":" ","parallelism":{"tp":0,"pp":0}}`,
			[]where{{"gpus", "minimum"}, {"job_id", "pattern"}, {"parallelism.pp", "minimum"}, {"parallelism.tp", "minimum"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := Validate(tt.event, []byte(tt.body))
			if tt.want == nil {
				if err != nil {
					t.Fatalf("Validate:\n%v", err)
				}
				return
			}
			got, ok := wheres(err)
			if !ok {
				t.Fatalf("Validate = %v, want a *ValidationError", err)
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("problems = %v, want %v\nerror:\n%v", got, tt.want, err)
			}
		})
	}
}

// labels renders n labels as JSON members.
func labels(n int) string {
	m := make([]string, n)
	for i := range m {
		m[i] = `"l` + strconv.Itoa(i) + `":"v"`
	}
	return strings.Join(m, ",")
}

func TestErrorString(t *testing.T) {
	t.Parallel()
	err := Validate("jobs.submitted", []byte(`{"gpus":0,"gpu":1}`))
	want := "gpu: additionalProperties: unknown property\n" +
		"gpus: minimum: got 0, want 1\n" +
		"job_id: required: missing property"
	if err == nil || err.Error() != want {
		t.Errorf("error =\n%v\nwant\n%s", err, want)
	}
	err = Validate("jobs.submitted", []byte(`{"job_id":"a","gpus":2.50,"model":{"layers":1e-3}}`))
	want = "gpus: type: must be a whole number, got 2.50\n" +
		"model.layers: type: must be a whole number, got 1e-3"
	if err == nil || err.Error() != want {
		t.Errorf("error =\n%v\nwant\n%s", err, want)
	}
	ranks := strings.TrimSuffix(strings.Repeat("-1,", 1000), ",")
	err = Validate("jobs.submitted", []byte(`{"job_id":"a","gpus":1,"groups":[{"name":"g","collective":"all_reduce","bytes":1,"ranks":[`+ranks+`]}]}`))
	var ve *ValidationError
	if !errors.As(err, &ve) || len(ve.Problems) != 1000 || strings.Count(err.Error(), "\n") != maxErrorLines ||
		!strings.HasSuffix(err.Error(), "\nand 900 more problems") {
		t.Errorf("a thousand problems: %d lines, ending %q", strings.Count(err.Error(), "\n")+1, err.Error()[max(0, len(err.Error())-40):])
	}
	err = Validate("jobs.submitted", []byte(`{"job_id": x}`))
	if err == nil || !strings.HasPrefix(err.Error(), "(root): json: ") || !strings.Contains(err.Error(), "offset 12") {
		t.Errorf("error = %v, want the root, the rule json and the byte offset 12", err)
	}
}

// TestSchemaMatchesGoType walks each event's Go type and its schema side by
// side, so that neither can change without the other: the same properties,
// required exactly where the json tag lacks omitempty, and JSON types that
// the Go types decode.
func TestSchemaMatchesGoType(t *testing.T) {
	t.Parallel()
	docs := schemaDocs(t)
	for _, n := range events.Catalogue {
		t.Run(string(n), func(t *testing.T) {
			t.Parallel()
			id := BaseURL + string(n) + suffix
			doc, ok := docs[id]
			if !ok {
				t.Fatalf("no schema %s", id)
			}
			typ := reflect.TypeOf(n.New()).Elem()
			matchType(t, docs, string(n), typ, id, doc)
		})
	}
}

var timeType = reflect.TypeFor[time.Time]()

// matchType checks schema sch, found in the document base, against Go type
// typ at the path loc.
func matchType(t *testing.T, docs map[string]map[string]any, loc string, typ reflect.Type, base string, sch map[string]any) {
	t.Helper()
	base, sch = resolve(t, docs, base, sch)
	for typ.Kind() == reflect.Pointer {
		typ = typ.Elem()
	}
	wantType := func(want string) {
		t.Helper()
		if sch["type"] != want {
			t.Errorf("%s: schema type %v, want %q for Go %s", loc, sch["type"], want, typ)
		}
	}
	switch {
	case typ == timeType:
		wantType("string")
		if sch["format"] != "date-time" {
			t.Errorf("%s: format %v, want date-time for time.Time", loc, sch["format"])
		}
	case typ.Kind() == reflect.Struct:
		wantType("object")
		if sch["additionalProperties"] != false {
			t.Errorf("%s: additionalProperties %v, want false for Go %s", loc, sch["additionalProperties"], typ)
		}
		props, _ := sch["properties"].(map[string]any)
		var fields, required []string
		for i := range typ.NumField() {
			f := typ.Field(i)
			if !f.IsExported() {
				continue
			}
			if f.Anonymous {
				t.Fatalf("%s: embedded field %s: not supported by this test", loc, f.Name)
			}
			tag := f.Tag.Get("json")
			if tag == "-" {
				continue
			}
			name, opts, _ := strings.Cut(tag, ",")
			if name == "" {
				name = f.Name
			}
			fields = append(fields, name)
			if o := strings.Split(opts, ","); !slices.Contains(o, "omitempty") && !slices.Contains(o, "omitzero") {
				required = append(required, name)
			}
			p, ok := props[name].(map[string]any)
			if !ok {
				t.Errorf("%s: Go field %s.%s (json %q) has no property in the schema", loc, typ.Name(), f.Name, name)
				continue
			}
			matchType(t, docs, join(loc, name), f.Type, base, p)
		}
		var propNames []string
		for k := range props {
			propNames = append(propNames, k)
		}
		var schemaRequired []string
		if r, ok := sch["required"].([]any); ok {
			for _, v := range r {
				schemaRequired = append(schemaRequired, v.(string))
			}
		}
		sort.Strings(fields)
		sort.Strings(required)
		sort.Strings(propNames)
		sort.Strings(schemaRequired)
		if !slices.Equal(propNames, fields) {
			t.Errorf("%s: schema properties %v, Go %s has json fields %v", loc, propNames, typ, fields)
		}
		if !slices.Equal(schemaRequired, required) {
			t.Errorf("%s: schema requires %v, Go %s has fields without omitempty or omitzero %v", loc, schemaRequired, typ, required)
		}
	case typ.Kind() == reflect.Slice || typ.Kind() == reflect.Array:
		wantType("array")
		items, ok := sch["items"].(map[string]any)
		if !ok {
			t.Errorf("%s: array without an items schema", loc)
			return
		}
		matchType(t, docs, loc+"[]", typ.Elem(), base, items)
	case typ.Kind() == reflect.Map:
		wantType("object")
		if typ.Key().Kind() != reflect.String {
			t.Fatalf("%s: map key %s: not supported by this test", loc, typ.Key())
		}
		ap, ok := sch["additionalProperties"].(map[string]any)
		if !ok {
			t.Errorf("%s: map without an additionalProperties schema", loc)
			return
		}
		matchType(t, docs, loc+"[*]", typ.Elem(), base, ap)
	case typ.Kind() == reflect.String:
		wantType("string")
	case typ.Kind() == reflect.Bool:
		wantType("boolean")
	case typ.Kind() >= reflect.Int && typ.Kind() <= reflect.Int64:
		wantType("integer")
	case typ.Kind() >= reflect.Uint && typ.Kind() <= reflect.Uint64:
		wantType("integer")
		if m, ok := sch["minimum"].(float64); !ok || m < 0 {
			t.Errorf("%s: unsigned Go %s needs a minimum of at least 0", loc, typ)
		}
	case typ.Kind() == reflect.Float32 || typ.Kind() == reflect.Float64:
		wantType("number")
	default:
		t.Errorf("%s: Go %s: not supported by this test", loc, typ)
	}
}

func join(loc, name string) string {
	if loc == "" {
		return name
	}
	return loc + "." + name
}

// resolve follows $ref (absolute, or a fragment within base) to the schema it
// names, returning the document that holds it as the new base.
func resolve(t *testing.T, docs map[string]map[string]any, base string, sch map[string]any) (string, map[string]any) {
	t.Helper()
	for range 16 {
		ref, ok := sch["$ref"].(string)
		if !ok {
			return base, sch
		}
		if len(sch) > 2 || (len(sch) == 2 && sch["description"] == nil) {
			// Keywords beside $ref apply too; this test reads only the target.
			t.Errorf("%s: $ref %s has sibling keywords other than description", base, ref)
		}
		u, frag, _ := strings.Cut(ref, "#")
		if u != "" {
			base = u
		}
		doc, ok := docs[base]
		if !ok {
			t.Fatalf("$ref %s: no schema %s", ref, base)
		}
		var cur any = doc
		for _, tok := range strings.Split(strings.TrimPrefix(frag, "/"), "/") {
			if tok == "" {
				continue
			}
			tok = strings.NewReplacer("~1", "/", "~0", "~").Replace(tok)
			m, ok := cur.(map[string]any)
			if !ok {
				t.Fatalf("$ref %s: %q is not in an object", ref, tok)
			}
			cur = m[tok]
		}
		sch, ok = cur.(map[string]any)
		if !ok {
			t.Fatalf("$ref %s: does not name a schema", ref)
		}
	}
	t.Fatalf("%s: $ref chain too long", base)
	return "", nil
}

// FuzzValidate checks that Validate never panics and fails only with a
// *ValidationError whose problems are sorted, whatever the body.
func FuzzValidate(f *testing.F) {
	names := Names()
	valid, invalid := examples(f)
	for _, e := range append(valid, invalid...) {
		f.Add(uint8(slices.Index(names, e.event)), e.body)
	}
	for _, s := range []string{``, `null`, `[]`, `"x"`, `1e999`, `{"job_id":"a","gpus":1e400}`, `{"a":{"b":[[[[1]]]]}}`} {
		f.Add(uint8(0), []byte(s))
	}
	f.Fuzz(func(t *testing.T, i uint8, body []byte) {
		name := names[int(i)%len(names)]
		err := Validate(name, body)
		if err == nil {
			return
		}
		var ve *ValidationError
		if !errors.As(err, &ve) {
			t.Fatalf("Validate(%q) = %T %v, want nil or *ValidationError", name, err, err)
		}
		if len(ve.Problems) == 0 {
			t.Fatalf("Validate(%q): ValidationError without problems", name)
		}
		if !sort.SliceIsSorted(ve.Problems, func(a, b int) bool {
			pa, pb := ve.Problems[a], ve.Problems[b]
			return pa.Field < pb.Field || (pa.Field == pb.Field && pa.Rule < pb.Rule)
		}) {
			t.Fatalf("Validate(%q): problems not sorted: %v", name, ve.Problems)
		}
		_ = ve.Error()
	})
}

// BenchmarkValidate checks the valid examples of the events a decision
// costs (the body's parse and the schema's check).
func BenchmarkValidate(b *testing.B) {
	for _, name := range []string{"jobs.submitted", "jobs.analyzed", "placement.decided", "topology.node"} {
		body, err := os.ReadFile(filepath.Join("v1", "examples", name, "full.json"))
		if err != nil {
			b.Fatal(err)
		}
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				if err := Validate(name, body); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// FuzzDecodeAsEncodingJSON checks that decode reads a body as a
// json.Decoder with UseNumber does, wherever it finds no problem, and
// refuses exactly what encoding/json refuses.
func FuzzDecodeAsEncodingJSON(f *testing.F) {
	valid, invalid := examples(f)
	for _, e := range append(valid, invalid...) {
		f.Add(e.body)
	}
	for _, s := range []string{``, ` null `, `[]`, `{}`, `"x"`, `"\u00e9\ud83d\ude00\\\"\/"`, "\"\xff\xfe\"", `"é"`, `1e999`,
		`{"a":{"b":[[[[1, -2.5e3, true, false, null]]]]}}`, `{"a":1,"a":2}`, `[1,2] x`, `{"a" : [ ] , "b" : { } }`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		doc, verr := decode(body)
		var want any
		d := json.NewDecoder(bytes.NewReader(body))
		d.UseNumber()
		err := d.Decode(&want)
		if err == nil && d.More() {
			err = errors.New("trailing data")
		}
		if err == nil {
			var probe json.RawMessage
			err = json.Unmarshal(body, &probe)
		}
		switch {
		case err != nil:
			if verr == nil || verr.Problems[0].Rule != "json" || !strings.HasPrefix(verr.Problems[0].Message, "not JSON") {
				t.Fatalf("decode(%q) = %v; encoding/json refuses it: %v", body, verr, err)
			}
		case verr != nil:
			for _, p := range verr.Problems {
				if p.Message != "duplicate property" && p.Rule != "number" && p.Rule != "depth" {
					t.Fatalf("decode(%q): %v; encoding/json reads it", body, verr)
				}
			}
		case !reflect.DeepEqual(doc, want):
			t.Fatalf("decode(%q) = %#v, encoding/json %#v", body, doc, want)
		}
	})
}
