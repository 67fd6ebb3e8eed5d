package bus_test

import (
	"strings"
	"testing"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/events/bus"
)

// goWords are what a rejection must never say: they are encoding/json's
// words about Go types, not the user's about their fields.
var goWords = []string{"Go struct", "Go value", "unmarshal", "of type int", "of type uint", "of type float", "int64"}

// TestDecodeIntegersAsWritten: the event path takes a JSON number of
// integral value where an integer is expected, however it is written (the
// schema does too), and refuses the rest naming the field as the schema
// does, never in Go's words.
func TestDecodeIntegersAsWritten(t *testing.T) {
	t.Parallel()
	job := func(v *events.JobSubmitted) int { return v.GPUs }
	tests := []struct {
		name    string
		event   events.Name
		body    string
		check   func(v any) bool
		wantErr []string // all in the error, when it must fail
	}{
		{"gpus 8.0", events.NameJobSubmitted, `{"job_id":"a","gpus":8.0}`,
			func(v any) bool { return job(v.(*events.JobSubmitted)) == 8 }, nil},
		{"gpus 7e9", events.NameJobSubmitted, `{"job_id":"a","gpus":7e9}`,
			func(v any) bool { return job(v.(*events.JobSubmitted)) == 7_000_000_000 }, nil},
		{"priority -0.0", events.NameJobSubmitted, `{"job_id":"a","gpus":1,"priority":-0.0}`,
			func(v any) bool { return v.(*events.JobSubmitted).Priority == 0 }, nil},
		{"nested 64.0", events.NameJobSubmitted, `{"job_id":"a","gpus":1,"model":{"layers":96.0,"parameters":1.75e11}}`,
			func(v any) bool {
				m := v.(*events.JobSubmitted).Model
				return m != nil && m.Layers == 96 && m.Parameters == 175_000_000_000
			}, nil},
		{"group rank 1.0", events.NameJobSubmitted,
			`{"job_id":"a","gpus":2,"groups":[{"name":"g","collective":"all_reduce","ranks":[0.0,1e0],"bytes":1.048576e6}]}`,
			func(v any) bool {
				g := v.(*events.JobSubmitted).Groups
				return len(g) == 1 && g[0].Ranks[1] == 1 && g[0].Bytes == 1<<20
			}, nil},
		{"telemetry bytes 1048576.0", events.NameRuntimeTelemetry,
			`{"job_id":"j","step":100.0,"step_seconds":1,"compute_seconds":0.5,"groups":[{"group":"dp","seconds":0.1,"busbw_gbps":10,"bytes":1048576.0}]}`,
			func(v any) bool {
				tm := v.(*events.RuntimeTelemetry)
				return tm.Step == 100 && len(tm.Groups) == 1 && tm.Groups[0].Bytes == 1<<20
			}, nil},
		{"gpus 1e30", events.NameJobSubmitted, `{"job_id":"a","gpus":1e30}`, nil,
			[]string{"gpus is out of range: 1e30"}},
		{"layers 1e19", events.NameJobSubmitted, `{"job_id":"a","gpus":1,"model":{"layers":1e19}}`, nil,
			[]string{"model.layers is out of range: 1e19"}},
		{"rank 1e25", events.NameJobSubmitted,
			`{"job_id":"a","gpus":2,"groups":[{"name":"g","collective":"all_reduce","ranks":[0,1],"bytes":1},{"name":"h","collective":"all_reduce","ranks":[0,1],"bytes":1},{"name":"i","collective":"all_reduce","ranks":[1e25],"bytes":1}]}`,
			nil, []string{"groups[2].ranks[0] is out of range: 1e25"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			v := tc.event.New()
			err := bus.Decode(tc.event, []byte(tc.body), v)
			if tc.wantErr == nil {
				if err != nil {
					t.Fatalf("Decode: %v", err)
				}
				if !tc.check(v) {
					t.Fatalf("decoded %+v", v)
				}
				return
			}
			if err == nil {
				t.Fatalf("Decode took %s", tc.body)
			}
			for _, w := range tc.wantErr {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
			for _, w := range goWords {
				if strings.Contains(err.Error(), w) {
					t.Errorf("error %q speaks of Go types (%q)", err, w)
				}
			}
		})
	}
}
