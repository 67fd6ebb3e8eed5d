package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestPlaceDryRun(t *testing.T) {
	t.Parallel()
	cluster := "../../deploy/examples/cluster.yaml"
	occupied := filepath.Join(t.TempDir(), "occupied.yaml")
	if err := os.WriteFile(occupied, []byte("- {node: dgx-a100-001, gpus: [0, 1, 2, 3]}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	job := "../../deploy/examples/jobs/bert-ddp8.yaml"
	var d struct {
		Strategy string `json:"strategy"`
		Nodes    []struct {
			Node string `json:"node"`
		} `json:"nodes"`
		Prediction struct {
			Comm float64 `json:"comm_seconds_per_step"`
		} `json:"prediction"`
		Baseline struct {
			Strategy string  `json:"strategy"`
			Comm     float64 `json:"comm_seconds_per_step"`
		} `json:"baseline"`
	}
	out := run(t, "place", "--dry-run", "--cluster", cluster, "--occupied", occupied, job, "-o", "json")
	if err := json.Unmarshal([]byte(out), &d); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	// Blind fills the hole on dgx-a100-001 and spills over; ours takes a
	// whole node, and is predicted faster.
	if d.Strategy != "topology-aware" || len(d.Nodes) != 1 || d.Nodes[0].Node == "dgx-a100-001" ||
		d.Baseline.Strategy != "blind" || !(d.Prediction.Comm < d.Baseline.Comm) {
		t.Fatalf("decision %+v", d)
	}
	out = run(t, "place", "--dry-run", "--strategy", "blind", "--cluster", cluster, "--occupied", occupied, job)
	if !strings.Contains(out, "dgx-a100-001  0-3    4,5,6,7") {
		t.Errorf("blind dry run:\n%s", out)
	}
	root := newRoot()
	root.SetArgs([]string{"place", "--dry-run", "--strategy", "exhaustive", "--cluster", cluster, "../../deploy/examples/jobs/llm-tp8-dp2.yaml"})
	root.SetOut(&strings.Builder{})
	if err := root.Execute(); err == nil || !strings.Contains(err.Error(), "exceed the limit") {
		t.Errorf("exhaustive on a big job: %v", err)
	}
}

// On a fragmented lab cluster where the heuristics' multi-node choice is
// predicted slower than blind first fit, the decision is never worse than
// the baseline it is published beside; policies ride along.
func TestPlaceDryRunNeverWorseThanBlind(t *testing.T) {
	t.Parallel()
	occupied := filepath.Join(t.TempDir(), "occupied.yaml")
	held := "- {node: dgx-a100-001, gpus: [0, 1, 2, 3]}\n- {node: dgx-a100-002, gpus: [0, 1, 2, 3]}\n- {node: dgx-a100-003, gpus: [0, 1, 2, 3]}\n"
	if err := os.WriteFile(occupied, []byte(held), 0o600); err != nil {
		t.Fatal(err)
	}
	var d struct {
		Prediction struct {
			Comm float64 `json:"comm_seconds_per_step"`
		} `json:"prediction"`
		Baseline struct {
			Comm float64 `json:"comm_seconds_per_step"`
		} `json:"baseline"`
		Explanation struct {
			PolicyRevision string `json:"policy_revision"`
			Candidates     []struct {
				Outcome string `json:"outcome"`
			} `json:"candidates"`
		} `json:"explanation"`
	}
	out := run(t, "place", "--dry-run", "--cluster", "../../deploy/examples/cluster.yaml", "--occupied", occupied,
		"../../deploy/examples/jobs/moe-ep4.yaml", "-o", "json")
	if err := json.Unmarshal([]byte(out), &d); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if d.Prediction.Comm > d.Baseline.Comm*1.005 {
		t.Errorf("predicted %.3f s per step, blind %.3f s: worse than the baseline", d.Prediction.Comm, d.Baseline.Comm)
	}
	if d.Explanation.PolicyRevision == "" || len(d.Explanation.Candidates) == 0 || d.Explanation.Candidates[0].Outcome != "chosen" {
		t.Errorf("explanation %+v, want the shipped policies' revision and the chosen candidate first", d.Explanation)
	}
}
