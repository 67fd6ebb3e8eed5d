package slurm

import (
	"reflect"
	"testing"

	"github.com/toposched/toposched/events"
)

func TestHeld(t *testing.T) {
	running := func(id int, user, comment string, gpus map[string][]int) Job {
		j := Job{ID: id, User: user, State: "RUNNING", GPUs: gpus}
		if comment != "" {
			j.Comment, j.ToposchedJob = CommentPrefix+comment, comment
		}
		return j
	}
	decided := map[string]*events.PlacementDecided{"tj1": {JobID: "tj1", Nodes: []events.NodePlacement{{Node: "n1", GPUs: []int{0, 1}}}}}
	for _, tc := range []struct {
		name string
		jobs []Job
		want map[string][]events.HeldGPU
	}{
		{"none", nil, map[string][]events.HeldGPU{}},
		{"a foreign job's GPUs", []Job{running(5, "alice", "", map[string][]int{"n1": {2, 0}, "n2": {1}})},
			map[string][]events.HeldGPU{
				"n1": {{Index: 0, By: "slurm job 5 (alice)"}, {Index: 2, By: "slurm job 5 (alice)"}},
				"n2": {{Index: 1, By: "slurm job 5 (alice)"}},
			}},
		{"a decided toposched job's are placement's, not held",
			[]Job{running(6, "bob", "tj1", map[string][]int{"n1": {0, 1}})}, map[string][]events.HeldGPU{}},
		{"a decided job's GPUs outside its decision are held",
			[]Job{running(6, "bob", "tj1", map[string][]int{"n1": {1, 2}, "n2": {0}})},
			map[string][]events.HeldGPU{"n1": {{Index: 2, By: "slurm job 6 (bob)"}}, "n2": {{Index: 0, By: "slurm job 6 (bob)"}}}},
		{"a toposched job placement does not know of is held",
			[]Job{running(7, "bob", "tj9", map[string][]int{"n1": {3}})},
			map[string][]events.HeldGPU{"n1": {{Index: 3, By: "slurm job 7 (bob)"}}}},
		{"pending, completed and cancelled jobs hold nothing", []Job{
			{ID: 8, State: "PENDING", GPUs: map[string][]int{}},
			{ID: 9, State: "COMPLETED", GPUs: map[string][]int{"n1": {0}}},
			{ID: 10, State: "CANCELLED", GPUs: map[string][]int{"n1": {1}}},
		}, map[string][]events.HeldGPU{}},
		{"completing and suspended jobs still hold theirs", []Job{
			{ID: 11, User: "u", State: "COMPLETING", GPUs: map[string][]int{"n1": {0}}},
			{ID: 12, User: "u", State: "SUSPENDED", GPUs: map[string][]int{"n1": {1}}},
		}, map[string][]events.HeldGPU{"n1": {{Index: 0, By: "slurm job 11 (u)"}, {Index: 1, By: "slurm job 12 (u)"}}}},
		{"a placeholder released and running holds its GPUs for Slurm, not the decided job",
			[]Job{{ID: 13, User: "u", State: "RUNNING", Comment: CommentPrefix + "tj1" + PlaceholderSuffix, ToposchedJob: "tj1", Placeholder: true,
				GPUs: map[string][]int{"n1": {0}}}},
			map[string][]events.HeldGPU{"n1": {{Index: 0, By: "slurm job 13 (u)"}}}},
		{"a shared GPU is named for the lower job id", []Job{
			running(21, "b", "", map[string][]int{"n1": {0}}),
			running(20, "a", "", map[string][]int{"n1": {0}}),
		}, map[string][]events.HeldGPU{"n1": {{Index: 0, By: "slurm job 20 (a)"}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Held(tc.jobs, func(id string) *events.PlacementDecided { return decided[id] })
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("Held:\n got %v\nwant %v", got, tc.want)
			}
		})
	}
}

func TestEndStatus(t *testing.T) {
	for state, want := range map[string]events.JobStatus{
		"COMPLETED": events.StatusSucceeded, "CANCELLED": events.StatusCancelled, "FAILED": events.StatusFailed,
		"TIMEOUT": events.StatusFailed, "NODE_FAIL": events.StatusFailed, "OUT_OF_MEMORY": events.StatusFailed,
		"RUNNING": "", "PENDING": "", "COMPLETING": "",
	} {
		got, ok := endStatus(state)
		if got != want || ok != (want != "") {
			t.Errorf("endStatus(%s) = %q, %v; want %q", state, got, ok, want)
		}
	}
}

func TestMismatch(t *testing.T) {
	d := &events.PlacementDecided{JobID: "tj1", Nodes: []events.NodePlacement{
		{Node: "n1", GPUs: []int{3, 2}}, {Node: "n2", GPUs: []int{0}},
	}}
	for _, tc := range []struct {
		name string
		gpus map[string][]int
		want string
	}{
		{"same", map[string][]int{"n1": {2, 3}, "n2": {0}}, ""},
		{"other GPUs", map[string][]int{"n1": {0, 1}, "n2": {0}}, "n1: decided GPUs [2 3], Slurm gave [0 1]"},
		{"other node", map[string][]int{"n1": {2, 3}, "n3": {0}}, "n2: decided GPUs [0], Slurm gave []; n3: decided GPUs [], Slurm gave [0]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := mismatch(d, Job{ID: 4, GPUs: tc.gpus}); got != tc.want {
				t.Errorf("mismatch = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestOurHolds(t *testing.T) {
	for _, tc := range []struct {
		gpus []events.HeldGPU
		want bool
	}{
		{nil, true},
		{[]events.HeldGPU{{Index: 0, By: "slurm job 3 (root)"}}, true},
		{[]events.HeldGPU{{Index: 0, By: "slurm job 3 (root)"}, {Index: 1, By: "claim ns/x"}}, false},
	} {
		if got := ourHolds(tc.gpus); got != tc.want {
			t.Errorf("ourHolds(%v) = %v, want %v", tc.gpus, got, tc.want)
		}
	}
}
