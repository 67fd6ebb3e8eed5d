package client

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/toposched/toposched/events"
)

var update = flag.Bool("update", false, "rewrite golden files")

func TestParseJob(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, src string
		wantErr   []string
	}{
		{name: "yaml", src: "job_id: a\ngpus: 16\nparallelism: {tp: 8}\n"},
		{name: "json", src: `{"job_id":"a","gpus":16,"parallelism":{"tp":8}}`},
		{name: "typo", src: "job_id: a\ngpu: 8\n", wantErr: []string{"f.yaml", "gpu: additionalProperties", "gpus: required"}},
		{name: "zero tp", src: "job_id: a\ngpus: 8\nparallelism: {tp: 0}\n", wantErr: []string{"parallelism.tp: minimum"}},
		{name: "not yaml", src: "job_id: [", wantErr: []string{"f.yaml"}},
		{name: "bad id", src: "job_id: 'a b'\ngpus: 1\n", wantErr: []string{"job_id: pattern"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			job, err := ParseJob("f.yaml", []byte(tc.src))
			if len(tc.wantErr) == 0 {
				if err != nil {
					t.Fatal(err)
				}
				if job.JobID != "a" || job.GPUs != 16 || job.Parallelism.TP != 8 {
					t.Fatalf("job %+v", job)
				}
				return
			}
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range tc.wantErr {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

func TestSampleJobsParse(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob("../../deploy/examples/jobs/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("sample jobs: %v", err)
	}
	for _, f := range files {
		if _, err := LoadJob(f); err != nil {
			t.Errorf("%s: %v", f, err)
		}
	}
}

func TestWriteOutcomeGolden(t *testing.T) {
	t.Parallel()
	d := &events.PlacementDecided{JobID: "j", Strategy: "blind"}
	for r := range 12 {
		node, gpu := "n1", r
		if r >= 8 {
			node, gpu = "n2", r-8
		}
		d.Ranks = append(d.Ranks, events.RankPlacement{Rank: r, Node: node, GPU: gpu, LocalRank: gpu})
	}
	d.Nodes = []events.NodePlacement{
		{Node: "n1", GPUs: []int{0, 1, 2, 3, 4, 5, 6, 7}, CUDAVisibleDevices: "0,1,2,3,4,5,6,7"},
		{Node: "n2", GPUs: []int{0, 1, 2, 3}, CUDAVisibleDevices: "0,1,2,3"},
	}
	warned := *d
	warned.JobID = "warned"
	warned.Prediction = &events.Prediction{CommSecondsPerStep: 0.5}
	warned.Baseline = &events.Prediction{CommSecondsPerStep: 2}
	warned.Warnings = []events.Reason{{Code: "leaf_span", Policy: "toposched.span", Message: "spans 2 leaves"}, {Code: "plain", Message: "no policy"}}
	var buf bytes.Buffer
	for _, o := range []Outcome{
		{Decided: d},
		{Decided: &warned},
		{Pending: &events.PlacementPending{JobID: "w", Reasons: []events.Reason{{Code: "insufficient_free_gpus", Field: "gpus", Message: "needs 16"}}}},
		{Pending: &events.PlacementPending{JobID: "w2",
			Reasons: []events.Reason{{Code: "tenant_mismatch", Policy: "toposched.tenancy", Message: "other tenants' nodes"}},
			Counterfactuals: []events.Counterfactual{
				{Kind: events.CounterfactualJobsFinish, Message: "these jobs finish", Jobs: []string{"a", "b"}},
				{Kind: events.CounterfactualPolicy, Message: "toposched.tenancy allowed tenant research on rack r2", Policy: "toposched.tenancy"},
			}}},
		{Rejected: &events.PlacementRejected{JobID: "r", Reasons: []events.Reason{{Code: "a", Message: "x"}, {Code: "b", Field: "gpus", Message: "y"}}}},
		{Rejected: &events.PlacementRejected{JobID: "r2", Reasons: []events.Reason{{Code: "exceeds_cluster", Field: "gpus", Message: "needs 4096"}},
			Counterfactuals: []events.Counterfactual{{Kind: events.CounterfactualCapacity, Message: "the cluster had 4032 more GPUs"}}}},
		{Released: &events.PlacementReleased{JobID: "j", Status: "succeeded"}},
	} {
		if err := WriteOutcome(&buf, o); err != nil {
			t.Fatal(err)
		}
	}
	golden := filepath.Join("testdata", "outcomes.golden")
	if *update {
		if err := os.WriteFile(golden, buf.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if buf.String() != string(want) {
		t.Errorf("output differs from %s (run with -update):\n%s", golden, buf.String())
	}
}

func TestRanksOn(t *testing.T) {
	t.Parallel()
	d := &events.PlacementDecided{}
	for _, r := range []struct {
		rank int
		node string
	}{{0, "a"}, {1, "a"}, {2, "b"}, {3, "a"}, {4, "a"}, {5, "a"}, {6, "b"}, {7, "a"}} {
		d.Ranks = append(d.Ranks, events.RankPlacement{Rank: r.rank, Node: r.node})
	}
	if got := RanksOn(d, "a"); got != "0-1,3-5,7" {
		t.Errorf("RanksOn(a) = %q", got)
	}
	if got := RanksOn(d, "b"); got != "2,6" {
		t.Errorf("RanksOn(b) = %q", got)
	}
	if got := RanksOn(d, "c"); got != "" {
		t.Errorf("RanksOn(c) = %q", got)
	}
}

func FuzzParseJob(f *testing.F) {
	files, _ := filepath.Glob("../../deploy/examples/jobs/*.yaml")
	for _, file := range files {
		data, err := os.ReadFile(file)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Add([]byte(`{"job_id":"a","gpus":1}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		job, err := ParseJob("fuzz.yaml", data)
		if err != nil {
			return
		}
		if !events.ValidJobID(job.JobID) || job.GPUs < 1 {
			t.Fatalf("accepted an invalid job %+v", job)
		}
	})
}
