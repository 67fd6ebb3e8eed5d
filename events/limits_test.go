package events_test

import (
	"errors"
	"reflect"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/toposched/toposched/events"
)

// numbers is n small integers, each written as suffix says (".0": 3.0).
func numbers(n int, suffix string) string {
	var b strings.Builder
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(i%10) + suffix)
	}
	return b.String()
}

// DecodeJSON reads a body of hundreds of thousands of values without a
// document of its own (issue 46: 238 MB and 0.4 s for 400,000 ranks
// written 3.0): what it allocates is about what the decoded value holds
// and a copy of the body, whether the body is taken or refused.
func TestDecodeJSONBoundsLargeBodies(t *testing.T) {
	tests := []struct {
		name    string
		body    string
		field   string // of the problem; "" for a body taken
		maxKB   uint64
		ranks   int
		problem string
	}{
		{name: "400,000 ranks written 3.0", ranks: 400_000, maxKB: 24 << 10,
			body: `{"job_id":"x","gpus":1,"groups":[{"name":"a","collective":"all_reduce","bytes":1,"ranks":[` + numbers(400_000, ".0") + `]}]}`},
		{name: "args of 400,000 numbers", field: "args", maxKB: 16 << 10,
			body: `{"job_id":"x","gpus":1,"args":[` + numbers(400_000, "") + `]}`},
		{name: "1,000,000-deep nesting", problem: events.DecodeNotJSON, maxKB: 8 << 10,
			body: `{"job_id":"x","gpus":1,"args":` + strings.Repeat("[", 1_000_000) + strings.Repeat("]", 1_000_000) + `}`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var warm events.JobSubmitted
			_ = events.DecodeJSON([]byte(tc.body), &warm)
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			var job events.JobSubmitted
			err := events.DecodeJSON([]byte(tc.body), &job)
			runtime.ReadMemStats(&after)
			if alloc := (after.TotalAlloc - before.TotalAlloc) >> 10; alloc > tc.maxKB {
				t.Errorf("DecodeJSON allocated %d KB, want at most %d", alloc, tc.maxKB)
			}
			switch {
			case tc.field == "" && tc.problem == "":
				if err != nil || len(job.Groups) != 1 || len(job.Groups[0].Ranks) != tc.ranks {
					t.Fatalf("DecodeJSON = %v, %d groups", err, len(job.Groups))
				}
			default:
				var de *events.DecodeError
				if !errors.As(err, &de) || len(de.Problems) == 0 {
					t.Fatalf("DecodeJSON = %v, want a *DecodeError", err)
				}
				p := de.Problems[0]
				if (tc.field != "" && !strings.HasPrefix(p.Field, tc.field)) || (tc.problem != "" && p.Code != tc.problem) {
					t.Fatalf("problems %+v, want one at %s %s", de.Problems, tc.field, tc.problem)
				}
				noGoWords(t, err)
			}
		})
	}
}

// FuzzDecodeLarge holds decodeLarge, DecodeJSON's reading of a large
// body, to DecodeJSON's on bodies of any size: each takes what the other
// takes, the same way.
func FuzzDecodeLarge(f *testing.F) {
	for _, s := range []string{
		`{"job_id":"a","gpus":8}`, `{"job_id":"a","gpus":8.0}`, `{"job_id":"a","gpus":7e9}`, `{"job_id":"a","gpus":-0.0}`,
		`{"job_id":"a","gpus":2.5}`, `{"job_id":"a","gpus":1e30}`, `{"job_id":"a","gpus":1e`, `{"job_id":"a","gpus":1.}`,
		`{"job_id":"a","gpus":1,"step_compute_seconds":-0.0,"model":{"layers":96.0,"parameters":1.75e11}}`,
		`{"job_id":"a","gpus":2,"groups":[{"name":"g","collective":"all_reduce","ranks":[0.0,1e0],"bytes":1.048576e6}]}`,
		`{"job_id":"a\"8.0","gpus":"8"}`, `{"job_id":"a","gpus":[8]}`, `{"job_id":"a","gpus":null} x`,
		`{"job_id":"a","gpus":123456789012345678901234567890e-10}`, `{"job_id":"a","gpus":9223372036854775808.0}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var a, b events.JobSubmitted
		errA := events.DecodeJSON(body, &a)
		errB := events.DecodeLarge(body, &b, false)
		if (errA == nil) != (errB == nil) {
			t.Fatalf("%q: DecodeJSON says %v, decodeLarge %v", body, errA, errB)
		}
		if errA == nil && !reflect.DeepEqual(a, b) {
			t.Fatalf("%q: DecodeJSON %+v, decodeLarge %+v", body, a, b)
		}
		if errB != nil {
			var de *events.DecodeError
			if !errors.As(errB, &de) || len(de.Problems) == 0 {
				t.Fatalf("decodeLarge = %T %v, want a *DecodeError", errB, errB)
			}
			noGoWords(t, errB)
		}
	})
}
