package client

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/toposched/toposched/events"
)

// TestParseJobNumbersAsWritten: a job file, YAML or JSON, may write an
// integer as 8.0 or 7e9 (Python's json.dumps writes 8.0); a fraction or a
// number past any integer is refused naming the field, never in Go's words.
func TestParseJobNumbersAsWritten(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, src string
		gpus      int
		layers    int
		wantErr   []string
	}{
		{name: "json 8.0", src: `{"job_id":"a","gpus":8.0,"model":{"layers":96.0}}`, gpus: 8, layers: 96},
		{name: "yaml 8.0", src: "job_id: a\ngpus: 8.0\nmodel: {layers: 9.6e1}\n", gpus: 8, layers: 96},
		{name: "json 7e9", src: `{"job_id":"a","gpus":7e9}`, gpus: 7_000_000_000},
		{name: "json fraction", src: `{"job_id":"a","gpus":2.5}`, wantErr: []string{"f.yaml", "gpus", "whole number", "2.5"}},
		{name: "yaml fraction", src: "job_id: a\ngpus: 8\nmodel: {layers: 2.5}\n", wantErr: []string{"model.layers", "whole number", "2.5"}},
		{name: "json 1e30", src: `{"job_id":"a","gpus":1e30}`, wantErr: []string{"f.yaml", "gpus is out of range"}},
		{name: "yaml 1e30", src: "job_id: a\ngpus: 1\nmodel: {parameters: 1e30}\n", wantErr: []string{"model.parameters is out of range"}},
		{name: "yaml infinity", src: "job_id: a\ngpus: 1\nstep_compute_seconds: .inf\n", wantErr: []string{"step_compute_seconds", "not a finite number"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			job, err := ParseJob("f.yaml", []byte(tc.src))
			if len(tc.wantErr) == 0 {
				if err != nil {
					t.Fatal(err)
				}
				if job.GPUs != tc.gpus || (tc.layers != 0 && (job.Model == nil || job.Model.Layers != tc.layers)) {
					t.Fatalf("job %+v", job)
				}
				return
			}
			if err == nil {
				t.Fatalf("took %+v", job)
			}
			for _, w := range tc.wantErr {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
			for _, w := range []string{"Go struct", "Go value", "unmarshal", "of type", "unsupported value", "int64", "float64"} {
				if strings.Contains(err.Error(), w) {
					t.Errorf("error %q speaks of Go types (%q)", err, w)
				}
			}
		})
	}
}

// TestHistoryReadsNumbersAsWritten: a stored event whose publisher wrote
// 8.0 reads back as the services read it.
func TestHistoryReadsNumbersAsWritten(t *testing.T) {
	t.Parallel()
	var e HistoryEvent
	err := json.Unmarshal([]byte(`{"event":"jobs.submitted","id":"x","time":"2025-03-14T09:26:53Z","stored":"2025-03-14T09:26:53Z",`+
		`"stream":"TOPOSCHED_JOBS","seq":1,"data":{"job_id":"a","gpus":8.0}}`), &e)
	if err != nil {
		t.Fatal(err)
	}
	if j, ok := e.Data.(*events.JobSubmitted); !ok || j.GPUs != 8 {
		t.Fatalf("data %#v", e.Data)
	}
}
