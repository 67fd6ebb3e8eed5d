package e2e

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
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
		return consumerDrained(js, streamTopology, durablePlacementTopology, 6)
	})

	body := `{"node":"pcie-l40s-001","component":"gpu","id":"0","health":"unhealthy","reason":"xid 79","observed_at":"2026-11-29T12:00:00Z"}`
	natsCLI(t, url, "pub", "toposched.topology.health.pcie-l40s-001", "--jetstream", body)
	published := streamMessages(t, js, streamTopology)
	waitFor(t, 30*time.Second, func() (bool, string) {
		mustBeAlive(t, serve)
		return consumerDrained(js, streamTopology, durablePlacementTopology, published)
	})

	nic := `{"node":"dgx-a100-001","component":"nic","id":"mlx5_0","health":"unhealthy","reason":"port down","observed_at":"2026-11-29T12:00:01Z"}`
	natsCLI(t, url, "pub", "toposched.topology.health.dgx-a100-001", "--jetstream", nic)
	published = streamMessages(t, js, streamTopology)
	waitFor(t, 30*time.Second, func() (bool, string) {
		mustBeAlive(t, serve)
		return consumerDrained(js, streamTopology, durablePlacementTopology, published)
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

// readyz is serve's /readyz answer at the metrics address addr.
func readyz(addr string) (int, string, error) {
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get("http://" + addr + "/readyz")
	if err != nil {
		return 0, "", err
	}
	defer func() { _ = resp.Body.Close() }() // only read
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), err
}

// waitReadyz polls /readyz until it answers code with a body holding every
// one of want.
func waitReadyz(t *testing.T, addr string, code int, want []string, procs ...*proc) string {
	t.Helper()
	var body string
	waitFor(t, 30*time.Second, func() (bool, string) {
		mustBeAlive(t, procs...)
		got, b, err := readyz(addr)
		if err != nil {
			return false, "GET /readyz: " + err.Error()
		}
		body = b
		if got != code {
			return false, fmt.Sprintf("/readyz answered %d %q, want %d", got, b, code)
		}
		for _, w := range want {
			if !strings.Contains(b, w) {
				return false, fmt.Sprintf("/readyz answered %d %q, want it to name %q", got, b, w)
			}
		}
		return true, ""
	})
	return body
}

// TestDeletedConsumerIsCreatedAgain deletes analysis's durable consumer
// with the nats CLI under a running serve: serve creates it again by
// itself, /readyz answers 200 and a job submitted afterwards is analysed
// and placed. (It used to stay missing, /readyz 503 naming it and no job
// analysed, until serve was restarted. /readyz naming a missing consumer,
// for as long as it is missing, is cmd/toposched's
// TestReadyChecksStreamsAndConsumers: here it comes back within
// milliseconds, too soon for a probe to be sure to see it.)
func TestDeletedConsumerIsCreatedAgain(t *testing.T) {
	needBinaries(t)
	t.Parallel()
	port, metrics := freePort(t), fmt.Sprintf("127.0.0.1:%d", freePort(t))
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)
	serve := startServe(t, "serve", testdata(t, "two-nodes.yaml"), port, t.TempDir(), "--metrics-listen", metrics, "--poll", "0")
	waitReadyz(t, metrics, http.StatusOK, []string{"ready"}, serve)
	submitWaitDecided(t, url, writeJob(t, t.TempDir(), "before-rm", 8), "before-rm")

	natsCLI(t, url, "consumer", "rm", streamJobs, durableAnalysis, "-f")
	js := jsConnect(t, url)
	waitFor(t, 30*time.Second, func() (bool, string) {
		mustBeAlive(t, serve)
		return consumerExists(js, streamJobs, durableAnalysis)
	})
	waitReadyz(t, metrics, http.StatusOK, []string{"ready"}, serve)
	submitWaitDecided(t, url, writeJob(t, t.TempDir(), "after-rm", 8), "after-rm")
	// Where it starts (after the deleted one's ack floor as last looked
	// up) is events/bus's TestDeletedDurableIsCreatedAgain.
	recreated := regexp.MustCompile(`msg="durable consumer created again" durable=` + durableAnalysis + ` stream=` + streamJobs + ` from_seq=\d+`)
	if !recreated.MatchString(serve.output()) {
		t.Errorf("serve has not logged that it created %s again:\n%s", durableAnalysis, serve.output())
	}
	mustBeAlive(t, serve)
}
