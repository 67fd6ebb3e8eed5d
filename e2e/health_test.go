package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A GPU reported unhealthy with the nats CLI is shown as such by
// topoctl topology show and never placed on: a 4-GPU L40S job goes to the
// other L40S node.
//
// (A job without gpus_per_node would take the three healthy GPUs of the
// first node and one of the second: blind first fit.)
func TestHealthEventTakesGPUOutOfPlacement(t *testing.T) {
	needBinaries(t)
	t.Parallel()

	port := freePort(t)
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)
	serve := startServe(t, "serve", testdata(t, "cluster.yaml"), port, t.TempDir())
	js := jsConnect(t, url)
	waitFor(t, 30*time.Second, func() (bool, string) {
		mustBeAlive(t, serve)
		return consumerDrained(js, streamTopology, durablePlacementNode, 6)
	})

	body := `{"node":"pcie-l40s-001","component":"gpu","id":"0","health":"unhealthy","reason":"xid 79","observed_at":"2026-11-29T12:00:00Z"}`
	natsCLI(t, url, "pub", "toposched.topology.health.pcie-l40s-001", "--jetstream", body)
	waitFor(t, 30*time.Second, func() (bool, string) {
		mustBeAlive(t, serve)
		return consumerDrained(js, streamTopology, "placement-topology-health", 1)
	})

	nic := `{"node":"dgx-a100-001","component":"nic","id":"mlx5_0","health":"unhealthy","reason":"port down","observed_at":"2026-11-29T12:00:01Z"}`
	natsCLI(t, url, "pub", "toposched.topology.health.dgx-a100-001", "--jetstream", nic)
	waitFor(t, 30*time.Second, func() (bool, string) {
		mustBeAlive(t, serve)
		return consumerDrained(js, streamTopology, "placement-topology-health", 2)
	})

	show := topoctlOK(t, url, "topology", "show")
	for _, want := range []string{"GPU0 unhealthy (xid 79)", "! nic mlx5_0 down: port down"} {
		if !strings.Contains(show, want) {
			t.Errorf("topology show lacks %q:\n%s", want, show)
		}
	}
	job := filepath.Join(t.TempDir(), "l40s.yaml")
	if err := os.WriteFile(job, []byte("job_id: whole-l40s\ngpus: 4\ngpus_per_node: 4\ngpu_model: L40S\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	out := topoctlOK(t, url, "submit", job, "--wait", "--timeout", "30s")
	if !strings.Contains(out, "pcie-l40s-002") || strings.Contains(out, "pcie-l40s-001") {
		t.Errorf("the job was not placed on the healthy node:\n%s", out)
	}
}
