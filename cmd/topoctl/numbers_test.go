package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestPlaceDryRunNumbersAsWritten: the dry run reads the job and the
// occupied GPUs with the one decoder: 8.0 is 8, and a fraction is refused
// naming the field in the file's words.
func TestPlaceDryRunNumbersAsWritten(t *testing.T) {
	t.Parallel()
	cluster := "../../deploy/examples/cluster.yaml"
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	job := write("job.json", `{"job_id":"py","gpus":8.0,"parallelism":{"tp":8.0}}`)
	occupied := write("occupied.json", `[{"node":"dgx-a100-001","gpus":[0.0,1.0,2e0,3]}]`)
	out := run(t, "place", "--dry-run", "--cluster", cluster, "--occupied", occupied, job)
	if !strings.Contains(out, "py") || strings.Contains(out, "rejected") {
		t.Fatalf("dry run of a job with 8.0:\n%s", out)
	}
	for _, tc := range []struct {
		name     string
		job, occ string
		want     []string
	}{
		{"fractional gpus", `{"job_id":"py","gpus":2.5}`, "", []string{"gpus", "whole number", "2.5"}},
		{"huge gpus", `{"job_id":"py","gpus":1e30}`, "", []string{"gpus is out of range: 1e30"}},
		{"fractional occupied gpu", `{"job_id":"py","gpus":8}`, `[{"node":"dgx-a100-001","gpus":[0,1.5]}]`,
			[]string{"occupied", "[0].gpus[1] must be a whole number, got 1.5"}},
		{"unknown occupied field", `{"job_id":"py","gpus":8}`, `[{"node":"dgx-a100-001","gpu":[0]}]`,
			[]string{"occupied", "[0].gpu"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			args := []string{"place", "--dry-run", "--cluster", cluster}
			if tc.occ != "" {
				args = append(args, "--occupied", write(strings.ReplaceAll(tc.name, " ", "-")+"-occupied.json", tc.occ))
			}
			args = append(args, write(strings.ReplaceAll(tc.name, " ", "-")+".json", tc.job))
			root := newRoot()
			root.SetArgs(args)
			root.SetOut(&strings.Builder{})
			root.SetErr(&strings.Builder{})
			err := root.Execute()
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
			for _, w := range []string{"Go struct", "Go value", "unmarshal", "of type", "!!float"} {
				if strings.Contains(err.Error(), w) {
					t.Errorf("error %q speaks of Go or YAML types (%q)", err, w)
				}
			}
		})
	}
}
