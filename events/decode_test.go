package events_test

import (
	"encoding/json"
	"errors"
	"math"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	jsonv1 "github.com/go-json-experiment/json/v1"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/schemas"
)

// goWords are encoding/json's words about Go types: no rejection says them.
var goWords = []string{"Go struct", "Go value", "unmarshal", "of type", "int64", "uint64", "float64", "struct field"}

func noGoWords(t *testing.T, err error) {
	t.Helper()
	for _, w := range goWords {
		if strings.Contains(err.Error(), w) {
			t.Errorf("error %q speaks of Go types (%q)", err, w)
		}
	}
}

// sample holds one field of each kind DecodeJSON treats apart.
type sample struct {
	I     int               `json:"i,omitempty"`
	I8    int8              `json:"i8,omitempty"`
	U     uint64            `json:"u,omitempty"`
	U16   uint16            `json:"u16,omitempty"`
	F     float64           `json:"f,omitempty"`
	F32   float32           `json:"f32,omitempty"`
	S     string            `json:"s,omitempty"`
	B     bool              `json:"b,omitempty"`
	P     *int              `json:"p,omitempty"`
	L     []int             `json:"l,omitempty"`
	A     [2]int64          `json:"a,omitempty"`
	M     map[string]int    `json:"m,omitempty"`
	K     map[int]string    `json:"k,omitempty"`
	T     time.Time         `json:"t,omitzero"`
	N     json.Number       `json:"n,omitempty"`
	R     json.RawMessage   `json:"r,omitempty"`
	X     any               `json:"x,omitempty"`
	Bytes []byte            `json:"bytes,omitempty"`
	Inner *inner            `json:"inner,omitempty"`
	Lab   map[string]string `json:"labels,omitempty"`
	embedded
}

type inner struct {
	Deep []inner `json:"deep,omitempty"`
	V    int     `json:"v,omitempty"`
}

type embedded struct {
	E int `json:"e,omitempty"`
}

func TestDecodeJSON(t *testing.T) {
	t.Parallel()
	seven := 7
	tests := []struct {
		name string
		body string
		want sample
		// problems are the Field and Code of each problem, in order;
		// msg is in the error when set.
		problems [][2]string
		msg      string
	}{
		{name: "plain integers", body: `{"i":8,"u":18446744073709551615,"i8":-128}`, want: sample{I: 8, U: math.MaxUint64, I8: -128}},
		{name: "8.0", body: `{"i":8.0}`, want: sample{I: 8}},
		{name: "7e9", body: `{"i":7e9}`, want: sample{I: 7_000_000_000}},
		{name: "7E+9", body: `{"i":7E+9}`, want: sample{I: 7_000_000_000}},
		{name: "-0.0", body: `{"i":-0.0,"u":-0.0}`, want: sample{}},
		{name: "0e999999999999", body: `{"i":0e999999999999}`, want: sample{}},
		{name: "1.048576e6", body: `{"u":1.048576e6}`, want: sample{U: 1 << 20}},
		{name: "250e-2 is not whole", body: `{"i":250e-2}`, problems: [][2]string{{"i", events.DecodeNotWhole}},
			msg: "i must be a whole number, got 250e-2"},
		{name: "2500e-2", body: `{"i":2500e-2}`, want: sample{I: 25}},
		{name: "largest int64", body: `{"i":9223372036854775807,"a":[9.223372036854775807e18,-9223372036854775808]}`,
			want: sample{I: math.MaxInt64, A: [2]int64{math.MaxInt64, math.MinInt64}}},
		{name: "past int64", body: `{"i":9223372036854775808}`, problems: [][2]string{{"i", events.DecodeOutOfRange}},
			msg: "i is out of range: 9223372036854775808 (the largest is 9223372036854775807)"},
		{name: "below int64", body: `{"i":-9.3e18}`, problems: [][2]string{{"i", events.DecodeOutOfRange}},
			msg: "i is out of range: -9.3e18 (the smallest is -9223372036854775808)"},
		{name: "1e30", body: `{"i":1e30}`, problems: [][2]string{{"i", events.DecodeOutOfRange}}, msg: "i is out of range: 1e30"},
		{name: "huge exponent", body: `{"i":1e99999999999999999999}`, problems: [][2]string{{"i", events.DecodeOutOfRange}}},
		{name: "tiny exponent", body: `{"i":1e-99999999999999999999}`, problems: [][2]string{{"i", events.DecodeNotWhole}}},
		{name: "int8 past", body: `{"i8":128.0}`, problems: [][2]string{{"i8", events.DecodeOutOfRange}}, msg: "the largest is 127"},
		{name: "uint16 past", body: `{"u16":65536}`, problems: [][2]string{{"u16", events.DecodeOutOfRange}}, msg: "the largest is 65535"},
		{name: "negative unsigned", body: `{"u":-1}`, problems: [][2]string{{"u", events.DecodeOutOfRange}}, msg: "the smallest is 0"},
		{name: "2.5", body: `{"i":2.5}`, problems: [][2]string{{"i", events.DecodeNotWhole}}, msg: "i must be a whole number, got 2.5"},
		{name: "pointer", body: `{"p":7.0}`, want: sample{P: &seven}},
		{name: "list", body: `{"l":[1.0,2e0,3]}`, want: sample{L: []int{1, 2, 3}}},
		{name: "list item", body: `{"l":[1,2,3.5]}`, problems: [][2]string{{"l[2]", events.DecodeNotWhole}}},
		{name: "map value", body: `{"m":{"a.b":1.0,"c":2}}`, want: sample{M: map[string]int{"a.b": 1, "c": 2}}},
		{name: "map value path", body: `{"m":{"app.kubernetes.io/x":1.5}}`,
			problems: [][2]string{{`m["app.kubernetes.io/x"]`, events.DecodeNotWhole}}},
		{name: "int map key", body: `{"k":{"1":"a"}}`, want: sample{K: map[int]string{1: "a"}}},
		{name: "bad int map key", body: `{"k":{"x":"a"}}`, problems: [][2]string{{"k.x", events.DecodeWrongType}}},
		{name: "nested", body: `{"inner":{"deep":[{"v":1.0},{"deep":[{"v":2.25}]}]}}`,
			problems: [][2]string{{"inner.deep[1].deep[0].v", events.DecodeNotWhole}}},
		{name: "embedded", body: `{"e":3.0}`, want: sample{embedded: embedded{E: 3}}},
		{name: "case-folded name", body: `{"I":4.0}`, want: sample{I: 4}},
		{name: "floats untouched", body: `{"f":2.5,"f32":1e38,"i":1.0}`, want: sample{F: 2.5, F32: 1e38, I: 1}},
		{name: "float32 past", body: `{"f32":1e39,"i":1.0}`, problems: [][2]string{{"f32", events.DecodeOutOfRange}}},
		{name: "number and raw untouched", body: `{"n":2.5,"r":{"a":1.5},"x":[1.5],"i":1.0}`,
			want: sample{N: "2.5", R: json.RawMessage(`{"a":1.5}`), X: []any{1.5}, I: 1}},
		{name: "time", body: `{"t":"2025-03-14T09:26:53Z","i":1.0}`, want: sample{T: time.Date(2025, 3, 14, 9, 26, 53, 0, time.UTC), I: 1}},
		{name: "bad time", body: `{"t":"yesterday","i":1.0}`, problems: [][2]string{{"t", events.DecodeWrongType}}, msg: "RFC 3339"},
		{name: "string for int", body: `{"i":"8"}`, problems: [][2]string{{"i", events.DecodeWrongType}},
			msg: `i must be a whole number, got the string "8"`},
		{name: "number for string", body: `{"s":8.0}`, problems: [][2]string{{"s", events.DecodeWrongType}}, msg: "s must be a string, got the number 8.0"},
		{name: "object for list", body: `{"l":{}}`, problems: [][2]string{{"l", events.DecodeWrongType}}},
		{name: "list for bool", body: `{"b":[]}`, problems: [][2]string{{"b", events.DecodeWrongType}}},
		{name: "number for bytes", body: `{"bytes":1}`, problems: [][2]string{{"bytes", events.DecodeWrongType}}},
		{name: "null leaves it", body: `{"i":null,"l":null,"inner":null}`, want: sample{}},
		{name: "every problem, sorted by field", body: `{"u":1.5,"i":2.5,"labels":{"b":1,"a":true}}`,
			problems: [][2]string{{"i", events.DecodeNotWhole}, {"labels.a", events.DecodeWrongType},
				{"labels.b", events.DecodeWrongType}, {"u", events.DecodeNotWhole}}},
		{name: "unknown fields ignored", body: `{"zzz":1.5,"i":1.0}`, want: sample{I: 1}},
		{name: "not json", body: `{"i":`, problems: [][2]string{{"", events.DecodeNotJSON}}, msg: "not JSON at byte offset"},
		{name: "trailing data", body: `{"i":1} {}`, problems: [][2]string{{"", events.DecodeNotJSON}}},
		{name: "not an object", body: `[1.5]`, problems: [][2]string{{"", events.DecodeWrongType}}, msg: "the body must be an object, got a list"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var got sample
			err := events.DecodeJSON([]byte(tc.body), &got)
			if tc.problems == nil {
				if err != nil {
					t.Fatalf("DecodeJSON(%s): %v", tc.body, err)
				}
				if !reflect.DeepEqual(got, tc.want) {
					t.Fatalf("DecodeJSON(%s) = %+v, want %+v", tc.body, got, tc.want)
				}
				return
			}
			var de *events.DecodeError
			if !errors.As(err, &de) {
				t.Fatalf("DecodeJSON(%s) = %v, want a *DecodeError", tc.body, err)
			}
			var probs [][2]string
			for _, p := range de.Problems {
				probs = append(probs, [2]string{p.Field, p.Code})
			}
			if !reflect.DeepEqual(probs, tc.problems) {
				t.Errorf("problems %v, want %v (%v)", probs, tc.problems, err)
			}
			if !strings.Contains(err.Error(), tc.msg) {
				t.Errorf("error %q does not say %q", err, tc.msg)
			}
			noGoWords(t, err)
		})
	}
}

func TestDecodeJSONStrict(t *testing.T) {
	t.Parallel()
	var got []struct {
		Node string `json:"node"`
		GPUs []int  `json:"gpus"`
	}
	if err := events.DecodeJSONStrict([]byte(`[{"node":"a","gpus":[0.0,1]}]`), &got); err != nil || len(got) != 1 || got[0].GPUs[0] != 0 {
		t.Fatalf("DecodeJSONStrict: %+v %v", got, err)
	}
	err := events.DecodeJSONStrict([]byte(`[{"node":"a","gpu":[0]},{"node":"b","gpus":[1.5]}]`), &got)
	if err == nil || err.Error() != "[0].gpu is not a known field; [1].gpus[0] must be a whole number, got 1.5" {
		t.Fatalf("DecodeJSONStrict = %v", err)
	}
	if err := events.DecodeJSONStrict([]byte(`[] x`), &got); err == nil {
		t.Fatal("trailing data taken")
	}
}

// TestDecodeJSONMatchesUnmarshal: where encoding/json takes a body,
// DecodeJSON gives the same value, so the events it already read are read
// the same.
func TestDecodeJSONMatchesUnmarshal(t *testing.T) {
	t.Parallel()
	for _, body := range []string{
		`{"job_id":"a","gpus":8,"labels":{"x":"y"},"model":{"layers":96,"parameters":175000000000},"step_compute_seconds":1.5}`,
		`{"job_id":"a","gpus":2,"groups":[{"name":"g","collective":"all_reduce","ranks":[0,1],"bytes":1048576}]}`,
	} {
		var a, b events.JobSubmitted
		if err := json.Unmarshal([]byte(body), &a); err != nil {
			t.Fatal(err)
		}
		if err := events.DecodeJSON([]byte(body), &b); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(a, b) {
			t.Errorf("DecodeJSON %+v, json.Unmarshal %+v", b, a)
		}
	}
}

func TestDecodeJSONNeedsAPointer(t *testing.T) {
	t.Parallel()
	var s sample
	if err := events.DecodeJSON([]byte(`{}`), s); err == nil {
		t.Fatal("decoded into a non-pointer")
	}
}

// FuzzDecodeJSON: whatever the body, DecodeJSON does not panic, fails only
// with a *DecodeError whose messages name no Go type, takes every integer
// it is given as written in any form, and agrees with the schema: a
// jobs.submitted body the schema takes decodes, unless a number is past a
// 64-bit integer (which the schema cannot say).
func FuzzDecodeJSON(f *testing.F) {
	for _, s := range []string{
		`{"job_id":"a","gpus":8}`, `{"job_id":"a","gpus":8.0}`, `{"job_id":"a","gpus":7e9}`, `{"job_id":"a","gpus":-0.0}`,
		`{"job_id":"a","gpus":2.5}`, `{"job_id":"a","gpus":1e30}`, `{"job_id":"a","gpus":1e-30}`,
		`{"job_id":"a","gpus":1,"model":{"layers":96.0,"parameters":1.75e11}}`,
		`{"job_id":"a","gpus":2,"groups":[{"name":"g","collective":"all_reduce","ranks":[0.0,1e0],"bytes":1.048576e6}]}`,
		`{"job_id":"a","gpus":1,"labels":{"app.kubernetes.io/name":"x"}}`,
		`{"job_id":"a","gpus":"8"}`, `{"job_id":"a","gpus":[8]}`, `{"job_id":"a","gpus":null}`,
		`{"job_id":"a","gpus":0e99999999999999999999}`, `{"job_id":"a","gpus":1e99999999999999999999}`,
		`{"job_id":"a","gpus":9223372036854775807}`, `{"job_id":"a","gpus":9223372036854775808}`,
		`{"job_id":"a","gpus":123456789012345678901234567890e-10}`,
		`{`, `[]`, `null`, `1.5`, `{"job_id":"a","gpus":1} x`, `{"GPUS":8.0}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var job events.JobSubmitted
		err := events.DecodeJSON(body, &job)
		if err != nil {
			var de *events.DecodeError
			if !errors.As(err, &de) || len(de.Problems) == 0 {
				t.Fatalf("DecodeJSON = %T %v, want a *DecodeError with problems", err, err)
			}
			noGoWords(t, err)
		}
		// encoding/json and DecodeJSON's faster engine (jsonv1) take the
		// same bodies, the same way.
		var plain, fast events.JobSubmitted
		errPlain, errFast := json.Unmarshal(body, &plain), jsonv1.Unmarshal(body, &fast)
		if (errPlain == nil) != (errFast == nil) || errPlain == nil && !reflect.DeepEqual(plain, fast) {
			t.Fatalf("%q: encoding/json %+v (%v), jsonv1 %+v (%v)", body, plain, errPlain, fast, errFast)
		}
		// Whatever encoding/json takes, DecodeJSON takes the same way.
		if errPlain == nil {
			if err != nil {
				t.Fatalf("json.Unmarshal takes %q, DecodeJSON says %v", body, err)
			}
			if !reflect.DeepEqual(plain, job) {
				t.Fatalf("%q: DecodeJSON %+v, json.Unmarshal %+v", body, job, plain)
			}
		}
		// What the schema takes, DecodeJSON takes, bar 64-bit range.
		if schemas.Validate(string(events.NameJobSubmitted), body) == nil && err != nil {
			var de *events.DecodeError
			errors.As(err, &de)
			for _, p := range de.Problems {
				if p.Code != events.DecodeOutOfRange {
					t.Fatalf("the schema takes %q, DecodeJSON says %v", body, err)
				}
			}
		}
		// Rewriting an integer in another form changes nothing.
		if err == nil && json.Valid(body) {
			re := regexp.MustCompile(`"gpus":` + itoa(job.GPUs) + `([,}\s])`)
			alt := re.ReplaceAllString(string(body), `"gpus":`+itoa(job.GPUs)+`.0e0$1`)
			var again events.JobSubmitted
			if err := events.DecodeJSON([]byte(alt), &again); err != nil || again.GPUs != job.GPUs {
				t.Fatalf("%q decodes gpus %d, %q gives %d, %v", body, job.GPUs, alt, again.GPUs, err)
			}
		}
	})
}

func itoa(n int) string { b, _ := json.Marshal(n); return string(b) }

// The error's text is bounded (it travels in a dead letter's header); the
// problems are all there.
func TestDecodeErrorBounded(t *testing.T) {
	t.Parallel()
	var v struct {
		L []int `json:"l"`
	}
	err := events.DecodeJSON([]byte(`{"l":[`+strings.TrimSuffix(strings.Repeat("0.5,", 1000), ",")+`]}`), &v)
	var de *events.DecodeError
	if !errors.As(err, &de) || len(de.Problems) != 1000 || strings.Count(err.Error(), ";") != 100 ||
		!strings.HasSuffix(err.Error(), "; and 900 more problems") {
		t.Fatalf("%d problems, error of %d bytes", len(de.Problems), len(err.Error()))
	}
}

// A value with a decoder of its own that fails in its own words (not
// DecodeJSON's, as JobAnalyzed's does) is read again as any body is:
// DecodeJSON still answers with a *DecodeError.
func TestDecodeJSONOwnDecoder(t *testing.T) {
	t.Parallel()
	var at time.Time
	err := events.DecodeJSON([]byte(`"yesterday"`), &at)
	var de *events.DecodeError
	if !errors.As(err, &de) {
		t.Fatalf("DecodeJSON(yesterday) = %T %v, want a *DecodeError", err, err)
	}
	if err := events.DecodeJSON([]byte(`"2026-12-06T10:00:00Z"`), &at); err != nil || at.Year() != 2026 {
		t.Fatalf("DecodeJSON(a date) = %v, %v", at, err)
	}
}
