package slurm

import (
	"fmt"
	"os"
	"reflect"
	"strings"
	"testing"
)

// testdata/squeue-running.json is squeue --json of Slurm 22.05.8 (Debian's
// slurm-wlm, shared/howto/slurm's cluster) with a foreign job holding 2
// GPUs of n1, a toposched job on one GPU of each of n1 and n2, and a job
// pending. testdata/squeue-ctld-down.json is what the same squeue printed,
// exit status 0, once slurmctld was stopped.

func TestParseSqueueGolden(t *testing.T) {
	data, err := os.ReadFile("testdata/squeue-running.json")
	if err != nil {
		t.Fatal(err)
	}
	got, err := ParseSqueue(data)
	if err != nil {
		t.Fatal(err)
	}
	want := []Job{
		{ID: 1, Name: "foreign", User: "root", State: "RUNNING", Nodes: []string{"n1"}, GPUs: map[string][]int{"n1": {0, 1}}},
		{ID: 2, Name: "tj1", User: "root", State: "RUNNING", Comment: "toposched-job=tj1", ToposchedJob: "tj1",
			Nodes: []string{"n1", "n2"}, GPUs: map[string][]int{"n1": {2}, "n2": {0}}},
		{ID: 3, Name: "wrap", User: "root", State: "PENDING", GPUs: map[string][]int{}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("ParseSqueue:\n got %+v\nwant %+v", got, want)
	}
}

// A placeholder names its toposched job; its comment's suffix is no part
// of the id.
func TestParseSqueuePlaceholder(t *testing.T) {
	for _, tc := range []struct {
		comment, job string
		placeholder  bool
	}{
		{"toposched-job=tj1", "tj1", false},
		{"toposched-job=tj1" + PlaceholderSuffix, "tj1", true},
		{" toposched-job=tj1 (placeholder) ", "tj1", true},
		{"(placeholder)", "", false},
		{"", "", false},
	} {
		doc := fmt.Sprintf(`{"jobs":[{"job_id":7,"job_state":"PENDING","comment":%q}]}`, tc.comment)
		jobs, err := ParseSqueue([]byte(doc))
		if err != nil {
			t.Fatalf("comment %q: %v", tc.comment, err)
		}
		if j := jobs[0]; j.ToposchedJob != tc.job || j.Placeholder != tc.placeholder {
			t.Errorf("comment %q: job %q placeholder %v, want %q %v", tc.comment, j.ToposchedJob, j.Placeholder, tc.job, tc.placeholder)
		}
	}
}

func TestParseSqueueCtldDown(t *testing.T) {
	data, err := os.ReadFile("testdata/squeue-ctld-down.json")
	if err != nil {
		t.Fatal(err)
	}
	jobs, err := ParseSqueue(data)
	if err == nil || !strings.Contains(err.Error(), "Failed while looking for jobs") {
		t.Fatalf("ParseSqueue of slurmctld down: jobs %v, err %v; want the failure, not an empty queue", jobs, err)
	}
}

func TestParseSqueueErrors(t *testing.T) {
	for _, tc := range []struct {
		name, doc, want string
	}{
		{"not json", `squeue: error: Invalid user`, "squeue --json"},
		{"bad hostlist", `{"jobs":[{"job_id":7,"nodes":"n[1-","gres_detail":[]}]}`, `job 7: nodes "n[1-"`},
		{"more gres than nodes", `{"jobs":[{"job_id":8,"nodes":"n1","gres_detail":["gpu:1(IDX:0)","gpu:1(IDX:1)"]}]}`, "job 8: gres_detail has 2 entries for 1 nodes"},
		{"bad index", `{"jobs":[{"job_id":9,"nodes":"n1","gres_detail":["gpu:h100:1(IDX:x)"]}]}`, "job 9: gres_detail of n1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseSqueue([]byte(tc.doc))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want one containing %q", err, tc.want)
			}
		})
	}
}

func TestGresIndices(t *testing.T) {
	for _, tc := range []struct {
		detail string
		want   []int
		err    string
	}{
		{"gpu:h100:2(IDX:2-3)", []int{2, 3}, ""},
		{"gpu:h100:3(IDX:0,2-3)", []int{0, 2, 3}, ""},
		{"gpu:g0:0(IDX:),gpu:g1:1(IDX:1),gpu:g2:0(IDX:),gpu:g3:1(IDX:3)", []int{1, 3}, ""},
		{"gpu:1(IDX:0)", []int{0}, ""},
		{"gpu(IDX:5)", []int{5}, ""},
		{"mps:100(0/100),gpu:h100:1(IDX:1)", []int{1}, ""},
		{"", nil, ""},
		{"gpu:h100:1", nil, ""},
		{"gpu:h100:1(IDX:1", nil, "no ')'"},
		{"gpu:h100:1(IDX:3-1)", nil, "out of 0-"},
		{"gpu:h100:1(IDX:0-999999999)", nil, "out of 0-"},
		{"gpu:h100:1(IDX:-1)", nil, "index"},
	} {
		got, err := GresIndices(tc.detail)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("GresIndices(%q): %v, %v; want an error containing %q", tc.detail, got, err, tc.err)
			}
			continue
		}
		if err != nil || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("GresIndices(%q) = %v, %v; want %v", tc.detail, got, err, tc.want)
		}
	}
}

func FuzzParseSqueue(f *testing.F) {
	for _, file := range []string{"testdata/squeue-running.json", "testdata/squeue-ctld-down.json"} {
		data, err := os.ReadFile(file)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Add([]byte(`{"jobs":[{"job_id":1,"job_state":"RUNNING","nodes":"a[01-02]","gres_detail":["gpu:g0:1(IDX:0)","gpu:2(IDX:0-1)"]}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		jobs, err := ParseSqueue(data)
		if err != nil {
			return
		}
		for _, j := range jobs {
			for node, gpus := range j.GPUs {
				if len(gpus) == 0 {
					t.Errorf("job %d: node %s listed with no GPUs", j.ID, node)
				}
				for _, g := range gpus {
					if g < 0 || g > maxGRESIndex {
						t.Errorf("job %d: node %s: GPU index %d", j.ID, node, g)
					}
				}
			}
		}
	})
}

func FuzzGresIndices(f *testing.F) {
	for _, s := range []string{"gpu:h100:2(IDX:2-3)", "gpu:g0:0(IDX:),gpu:g1:1(IDX:1)", "gpu(IDX:0,2-3)", "mps:100(0/100)"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		idx, err := GresIndices(s)
		if err != nil {
			return
		}
		for i, g := range idx {
			if g < 0 || g > maxGRESIndex || (i > 0 && idx[i-1] >= g) {
				t.Fatalf("GresIndices(%q) = %v: not sorted distinct indices in range", s, idx)
			}
		}
	})
}
