package pattern

import (
	"strings"
	"testing"

	"github.com/toposched/toposched/events"
)

// TestBounds: a job past a size bound is refused with one clear reason
// naming the field and the limit.
func TestBounds(t *testing.T) {
	many := make([]events.CommGroup, MaxGroups+1)
	for i := range many {
		many[i] = events.CommGroup{Name: "g", Collective: "all_reduce", Bytes: 1, Ranks: []int{0}}
	}
	for _, tc := range []struct {
		name  string
		job   events.JobSubmitted
		code  string
		field string
	}{
		{"gpus", events.JobSubmitted{JobID: "big", GPUs: MaxGPUs + 1}, "too_many_gpus", "gpus"},
		{"groups", events.JobSubmitted{JobID: "chatty", GPUs: 1, Groups: many}, "too_many_groups", "groups"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, reasons := Analyze(tc.job)
			if len(reasons) != 1 || reasons[0].Code != tc.code || reasons[0].Field != tc.field || !strings.Contains(reasons[0].Message, "limit") {
				t.Fatalf("reasons %+v, want one %s on %s naming the limit", reasons, tc.code, tc.field)
			}
		})
	}
}
