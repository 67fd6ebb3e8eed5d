package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The online calibration end to end on `toposched serve`: a job alone on
// its node reports its data-parallel all-reduce at 80% of the predicted
// bus bandwidth, report after report; the optimizer moves the calibration
// (a version named online in the bucket), every service applies it
// (policy.calibration_applied), and topoctl calibration show prints it.
// A bad set pushed past topoctl's own check is refused by the replica
// with its line, and the online set stays.
func TestOnlineCalibrationThroughServe(t *testing.T) {
	needBinaries(t)
	t.Parallel()
	dir := t.TempDir()
	serve, url := serveTwoLeaves(t, dir)
	js := jsConnect(t, url)
	file := filepath.Join(dir, "train.yaml")
	if err := os.WriteFile(file, []byte("job_id: train\ngpu_model: A100-SXM4-80GB\ngpus: 4\ngpus_per_node: 4\nstrategy: ddp\n"+
		"model: {parameters: 1000000000, dtype: bf16}\nstep_compute_seconds: 0.5\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	submitWaitDecided(t, url, file, "train")

	tuned := tunedDP(t, serve, js, "train")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// Two batches of the online calibration's 32 observations.
	for step := range 64 {
		body, err := json.Marshal(map[string]any{
			"job_id": "train", "step": step, "step_seconds": 0.5 + 1.25*tuned.SecondsPerStep, "compute_seconds": 0.5,
			"groups": []map[string]any{{"group": "dp", "collective": "all_reduce", "busbw_gbps": 0.8 * tuned.BusBWGBps, "bytes": tuned.Bytes}},
		})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := js.Publish(ctx, subjectTelemetry, body); err != nil {
			t.Fatal(err)
		}
	}
	type applied struct {
		Name       string             `json:"name"`
		Source     string             `json:"source"`
		KVRevision uint64             `json:"kv_revision"`
		Services   []string           `json:"services"`
		Efficiency map[string]float64 `json:"efficiency"`
	}
	var online applied
	waitFor(t, 60*time.Second, func() (bool, string) {
		mustBeAlive(t, serve)
		for _, m := range readStream(t, js, "TOPOSCHED_POLICY", "toposched.policy.calibration_applied") {
			var a applied
			if json.Unmarshal(m, &a) == nil && a.Name == "online" && a.Source == "kv" && len(a.Services) == 2 {
				online = a
			}
		}
		return online.Name != "", "no policy.calibration_applied of an online set"
	})
	t.Logf("online set applied: %+v (dp predicted %.1f GB/s)", online, tuned.BusBWGBps)
	moved := false
	for kind, v := range online.Efficiency {
		def := map[string]float64{"nvlink": 0.8, "nvls": 0.611, "pcie": 0.8, "net": 0.96, "efa": 0.96, "tcp": 0.96, "step_overhead_us": 2.8}[kind]
		if v < def*0.999 {
			moved = true
			if v < def*0.95*0.95-1e-9 {
				t.Errorf("%s moved from %.3f to %.3f in at most two steps of 5%%", kind, def, v)
			}
		}
	}
	if !moved {
		t.Errorf("online set moved nothing down: %+v", online.Efficiency)
	}

	r := topoctl(t, url, "calibration", "show")
	if r.code != 0 || !strings.Contains(r.stdout, "online@") || !strings.Contains(r.stdout, "telemetry:train@") {
		t.Errorf("calibration show: exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}

	// A bad value straight into the bucket: refused with its line, the
	// online set stays in force.
	kv, err := js.KeyValue(ctx, "toposched-calibration")
	if err != nil {
		t.Fatal(err)
	}
	badRev, err := kv.Put(ctx, "set", []byte("{\"version\": 1,\n \"efficiency\": {\"pcie\": -3}}"))
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, func() (bool, string) {
		mustBeAlive(t, serve)
		for _, m := range readStream(t, js, "TOPOSCHED_POLICY", "toposched.policy.calibration_rejected") {
			var rj struct {
				KVRevision uint64 `json:"kv_revision"`
				Errors     []struct {
					Line  int    `json:"line"`
					Field string `json:"field"`
				} `json:"errors"`
			}
			if json.Unmarshal(m, &rj) == nil && rj.KVRevision == badRev {
				if len(rj.Errors) != 1 || rj.Errors[0].Line != 2 || rj.Errors[0].Field != "efficiency.pcie" {
					return false, fmt.Sprintf("rejection %s", m)
				}
				return true, ""
			}
		}
		return false, "no policy.calibration_rejected of the bad value"
	})
}
