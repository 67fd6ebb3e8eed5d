package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/toposched/toposched/events/eventstest"
	"github.com/toposched/toposched/internal/calibration"
)

func TestModelCalibrate(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	topo := filepath.Join("..", "..", "internal", "formats", "nvsmi", "testdata", "a100-sxm-8gpu-nv12-17nic_xuesongtap-blog.txt")
	pcie := filepath.Join("..", "..", "internal", "formats", "nvsmi", "testdata", "rtx4090-8gpu-pcie-switch_nccl-tests-issue-307.txt")
	meas := filepath.Join("..", "..", "internal", "formats", "nccltests", "testdata", "aws-p4de-a100_2node-16gpu-efa_all_reduce_awsome-distributed-training.txt")
	data, err := os.ReadFile(meas)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(data), "\n")
	cut := filepath.Join(dir, "cut_all_reduce.txt")
	last := lines[len(lines)/2]
	if err := os.WriteFile(cut, []byte(strings.Join(lines[:len(lines)/2], "\n")+"\n"+last[:len(last)/2]+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "set.json")

	got, err := runModel(t, "calibrate", "--topology", topo, "--nodes", "2", "--nccl-tests", meas, "--out", out)
	if err != nil || !strings.Contains(got, "net     efficiency") || !strings.Contains(got, "wrote "+out) {
		t.Fatalf("calibrate: %v\n%s", err, got)
	}
	if got, err := runModel(t, "predict", "--topology", topo, "--bytes", "1G", "--calibration", out); err != nil || !strings.Contains(got, "busbw") {
		t.Fatalf("predict --calibration: %v\n%s", err, got)
	}
	// Per node model: two fits, one set.
	models := filepath.Join(dir, "models.json")
	if got, err := runModel(t, "calibrate", "--topology", topo, "--nodes", "2", "--nccl-tests", meas, "--model", "A100-SXM4-80GB", "--out", models); err != nil ||
		!strings.Contains(got, "A100-SXM4-80GB net efficiency") {
		t.Fatalf("calibrate --model: %v\n%s", err, got)
	}
	if got, err := runModel(t, "calibrate", "--topology", topo, "--nodes", "2", "--nccl-tests", meas, "--model", "A100-SXM4-40GB", "--into", models, "--out", models); err != nil {
		t.Fatalf("calibrate --into: %v\n%s", err, got)
	}
	set, err := loadCalibration(models)
	if err != nil || len(set.Models) != 2 || set.Models["A100-SXM4-80GB"].Net == 0 || set.Models["A100-SXM4-40GB"].Net == 0 || set.Efficiency.Net != 0 {
		t.Fatalf("set %+v %v", set, err)
	}
	bad := filepath.Join(dir, "bad.json")
	if err := os.WriteFile(bad, []byte(`{"version": 1, "efficiency": {"net": 7}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		args []string
		want []string
	}{
		{"cut off", []string{"calibrate", "--topology", topo, "--nodes", "2", "--nccl-tests", cut, "--out", filepath.Join(dir, "x.json")},
			[]string{"cut_all_reduce.txt:", "cut off"}},
		{"another topology", []string{"calibrate", "--topology", pcie, "--nccl-tests", meas, "--out", filepath.Join(dir, "y.json")},
			[]string{"aws-p4de", "above", "line rate"}},
		{"no collective in the name", []string{"calibrate", "--topology", topo, "--nccl-tests", bad, "--out", filepath.Join(dir, "z.json")},
			[]string{"bad.json", "--collective"}},
		{"bad calibration", []string{"predict", "--topology", topo, "--bytes", "1G", "--calibration", bad},
			[]string{"bad.json", "bad.json:1: efficiency.net: 7"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := runModel(t, tc.args...)
			if err == nil {
				t.Fatal("accepted")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
	for _, f := range []string{"x.json", "y.json", "z.json"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err == nil {
			t.Errorf("%s written after a refusal", f)
		}
	}
}

// predict --calibration-from reads the set in force in a running
// operator's bucket, and predicts as --calibration with the same file does.
func TestModelPredictCalibrationFrom(t *testing.T) {
	t.Parallel()
	srv := eventstest.Server(t)
	b := eventstest.Bus(t, srv.ClientURL(), "test")
	ctx := eventstest.Context(t, 30*time.Second)
	pcie := filepath.Join("..", "..", "internal", "formats", "nvsmi", "testdata", "rtx4090-8gpu-pcie-switch_nccl-tests-issue-307.txt")
	file := filepath.Join(t.TempDir(), "lab.json")
	set := []byte(`{"version": 1, "name": "lab", "efficiency": {"pcie": 0.5}}`)
	if err := os.WriteFile(file, set, 0o600); err != nil {
		t.Fatal(err)
	}
	url := srv.ClientURL()
	empty, err := runModel(t, "predict", "--topology", pcie, "--bytes", "1G", "--calibration-from", url, "--prefix", b.Subjects.Prefix)
	if err != nil || !strings.Contains(empty, "calibrated: no calibration bucket") {
		t.Fatalf("before any push: %v\n%s", err, empty)
	}
	kv, err := calibration.OpenKV(ctx, b.JetStream(), b.Subjects.Prefix)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := calibration.Push(ctx, kv, file, set); err != nil {
		t.Fatal(err)
	}
	fromKV, err := runModel(t, "predict", "--topology", pcie, "--bytes", "1G", "--calibration-from", url, "--prefix", b.Subjects.Prefix)
	if err != nil || !strings.Contains(fromKV, "calibrated: lab@"+calibration.Revision(set)[:12]) {
		t.Fatalf("from the bucket: %v\n%s", err, fromKV)
	}
	fromFile, err := runModel(t, "predict", "--topology", pcie, "--bytes", "1G", "--calibration", file)
	if err != nil {
		t.Fatal(err)
	}
	busbw := func(out string) string {
		for _, l := range strings.Split(out, "\n") {
			if strings.HasPrefix(l, "busbw:") {
				return l
			}
		}
		return ""
	}
	if busbw(fromKV) == "" || busbw(fromKV) != busbw(fromFile) || busbw(fromKV) == busbw(empty) {
		t.Errorf("bucket %q, file %q, defaults %q", busbw(fromKV), busbw(fromFile), busbw(empty))
	}
}
