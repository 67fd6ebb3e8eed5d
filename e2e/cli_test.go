package e2e

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestNatsCLIJobsThroughSeparateProcesses runs each service as its own
// process on a standalone nats-server and drives it only with the nats CLI,
// as someone without topoctl would: bare JSON bodies, CloudEvents headers
// typed by hand, invalid and non-JSON bodies, a resubmission.
func TestNatsCLIJobsThroughSeparateProcesses(t *testing.T) {
	needBinaries(t)
	t.Parallel()

	url, server := natsServer(t)
	cluster := testdata(t, "cluster.yaml")
	env := childEnv()
	procs := []*proc{
		server,
		startProc(t, "discovery", env, bins.toposched, "discovery", "--nats-url", url, "--cluster", cluster),
		startProc(t, "analysis", env, bins.toposched, "analysis", "--nats-url", url),
		startProc(t, "placement", env, bins.toposched, "placement", "--nats-url", url),
		startProc(t, "optimizer", env, bins.toposched, "optimizer", "--nats-url", url),
	}

	// Ready: every consumer exists and placement has taken in the six
	// nodes of the cluster file.
	js := jsConnect(t, url)
	waitFor(t, 30*time.Second, func() (bool, string) {
		mustBeAlive(t, procs...)
		for _, c := range []struct{ stream, durable string }{
			{streamJobs, durableAnalysis},
			{streamJobs, durablePlacementAnalyzed},
			{streamPlacement, durableOptimizerDecided},
		} {
			if ok, why := consumerExists(js, c.stream, c.durable); !ok {
				return false, why
			}
		}
		return consumerDrained(js, streamTopology, durablePlacementTopology, 6)
	})

	// The outcomes are read back with the CLI too, through pull consumers.
	for _, c := range []struct{ name, subject string }{
		{"e2e-decided", subjectDecided},
		{"e2e-rejected", subjectRejected},
	} {
		natsCLI(t, url, "consumer", "add", streamPlacement, c.name,
			"--pull", "--deliver", "all", "--ack", "explicit", "--filter", c.subject, "--defaults")
	}

	// pub publishes with the CLI and returns what it said (on stderr).
	pub := func(body string, headers ...string) string {
		t.Helper()
		args := []string{"pub", subjectSubmitted, "--jetstream"}
		for _, h := range headers {
			args = append(args, "-H", h)
		}
		args = append(args, body)
		r := natsCLIResult(t, url, args...)
		if r.code != 0 {
			t.Fatalf("nats %s: exit %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), r.code, r.stdout, r.stderr)
		}
		return r.stdout + r.stderr
	}
	// A bare body, as a person types it: no header at all.
	pub(`{"job_id":"cli-bare","gpus":8,"gpus_per_node":8,"parallelism":{"tp":8}}`)
	// The same kind of job with its CloudEvents envelope typed by hand.
	ceID := fmt.Sprintf("e2e-cli-ce-%d", time.Now().UnixNano())
	ceHeaders := []string{
		"ce-specversion:1.0",
		"ce-type:io.toposched.jobs.submitted.v1",
		"ce-source:urn:e2e",
		"ce-id:" + ceID,
		"ce-time:" + time.Now().UTC().Format(time.RFC3339),
		"ce-subject:cli-ce",
		"content-type:application/json",
		"Nats-Msg-Id:" + ceID,
	}
	ceBody := `{"job_id":"cli-ce","gpus":8,"gpus_per_node":8,"parallelism":{"tp":8}}`
	pub(ceBody, ceHeaders...)
	// Invalid against the schema, and valid but inconsistent.
	pub(`{"job_id":"cli-bad","gpus":0}`)
	pub(`{"job_id":"cli-inconsistent","gpus":8,"parallelism":{"tp":4,"pp":2,"dp":2}}`)
	// Not JSON at all.
	pub(`not json`)
	// cli-ce again with the same Nats-Msg-Id: JetStream drops the copy.
	if out := pub(ceBody, ceHeaders...); !strings.Contains(out, "Duplicate: true") {
		t.Errorf("republishing cli-ce with Nats-Msg-Id %s: the CLI did not report a duplicate:\n%s", ceID, out)
	}
	// cli-bare again, another body and no headers: a new message, the same
	// job id. It must not be placed a second time.
	pub(`{"job_id":"cli-bare","gpus":16,"gpus_per_node":8,"parallelism":{"tp":8,"dp":2}}`)

	// Once analysis has handled all of the above, its outputs are in the
	// jobs stream ahead of the marker's, and placement takes them in order:
	// the marker's decision comes after whatever the resubmission caused.
	waitFor(t, 30*time.Second, func() (bool, string) {
		mustBeAlive(t, procs...)
		return consumerDrained(js, streamJobs, durableAnalysis, 1)
	})
	pub(`{"job_id":"cli-marker","gpus":8,"gpus_per_node":8}`)

	decided := map[string][]decidedJSON{}
	cliCollect(t, url, "e2e-decided", procs, func(body string) {
		var d decidedJSON
		if err := json.Unmarshal([]byte(body), &d); err != nil {
			t.Fatalf("placement.decided body %q: %v", body, err)
		}
		decided[d.JobID] = append(decided[d.JobID], d)
	}, func() (bool, string) {
		return len(decided["cli-marker"]) > 0, fmt.Sprintf("decisions so far: %v", keys(decided))
	})
	rejected := map[string][]reasonsJSON{}
	cliCollect(t, url, "e2e-rejected", procs, func(body string) {
		var r reasonsJSON
		if err := json.Unmarshal([]byte(body), &r); err != nil {
			t.Fatalf("placement.rejected body %q: %v", body, err)
		}
		rejected[r.JobID] = append(rejected[r.JobID], r)
	}, func() (bool, string) {
		return len(rejected["cli-bad"]) > 0 && len(rejected["cli-inconsistent"]) > 0,
			fmt.Sprintf("rejections so far: %v", keys(rejected))
	})

	// Decisions: one each, a whole node each, no GPU twice.
	for job, n := range map[string]int{"cli-bare": 1, "cli-ce": 1, "cli-marker": 1} {
		if got := len(decided[job]); got != n {
			t.Errorf("%s: %d decisions, want %d: %+v", job, got, n, decided[job])
		}
	}
	for job := range decided {
		if job != "cli-bare" && job != "cli-ce" && job != "cli-marker" {
			t.Errorf("unexpected decision for %s: %+v", job, decided[job])
		}
	}
	seen := map[gpuKey]string{}
	for job, ds := range decided {
		for _, d := range ds {
			for _, g := range d.gpus() {
				if other, ok := seen[g]; ok {
					t.Errorf("GPU %s/%d in the decisions of both %s and %s", g.node, g.gpu, other, job)
				}
				seen[g] = job
			}
		}
	}
	for _, job := range []string{"cli-bare", "cli-ce"} {
		if len(decided[job]) == 0 {
			continue
		}
		d := decided[job][0]
		if len(d.Ranks) != 8 {
			t.Errorf("%s: %d ranks, want 8", job, len(d.Ranks))
		}
		if len(d.Nodes) != 1 || d.Nodes[0].CUDAVisibleDevices != "0,1,2,3,4,5,6,7" {
			t.Errorf("%s: nodes %+v, want one node with cuda_visible_devices 0,1,2,3,4,5,6,7", job, d.Nodes)
		}
	}

	// Rejections name the field to blame.
	for job := range rejected {
		if job != "cli-bad" && job != "cli-inconsistent" {
			t.Errorf("unexpected rejection of %s: %+v", job, rejected[job])
		}
	}
	if r := rejected["cli-bad"]; len(r) != 1 || !hasReason(r[0], "gpus", "") {
		t.Errorf("cli-bad: rejections %+v, want one with a reason on field gpus", r)
	}
	if r := rejected["cli-inconsistent"]; len(r) != 1 || !hasReason(r[0], "parallelism", "4·2·2") ||
		!hasReason(r[0], "parallelism", "16") || !hasReason(r[0], "parallelism", "gpus = 8") {
		t.Errorf("cli-inconsistent: rejections %+v, want one on field parallelism showing 4·2·2… = 16 and gpus = 8", r)
	}

	// The body that is not JSON is kept in the dead letters, with why.
	var dead storedMsg
	waitFor(t, 30*time.Second, func() (bool, string) {
		mustBeAlive(t, procs...)
		var info struct {
			State struct {
				Messages uint64 `json:"messages"`
				FirstSeq uint64 `json:"first_seq"`
				LastSeq  uint64 `json:"last_seq"`
			} `json:"state"`
		}
		out := natsCLI(t, url, "stream", "info", streamDLQ, "--json")
		if err := json.Unmarshal([]byte(out), &info); err != nil {
			t.Fatalf("nats stream info %s --json: %v\n%s", streamDLQ, err, out)
		}
		var bodies []string
		for seq := info.State.FirstSeq; info.State.Messages > 0 && seq <= info.State.LastSeq; seq++ {
			m := cliStreamGet(t, url, streamDLQ, seq)
			if string(m.Data) == "not json" {
				dead = m
				return true, ""
			}
			bodies = append(bodies, string(m.Data))
		}
		return false, fmt.Sprintf("%s holds %d messages, none is 'not json': %q", streamDLQ, info.State.Messages, bodies)
	})
	hdr := parseHeaders(dead.Header)
	if e := hdr["toposched-error"]; !strings.Contains(strings.ToLower(e), "json") {
		t.Errorf("dead letter %q: toposched-error %q does not mention json; headers %v", dead.Data, e, hdr)
	}
	if s := hdr["toposched-dead-subject"]; s != subjectSubmitted {
		t.Errorf("dead letter %q: toposched-dead-subject %q, want %s", dead.Data, s, subjectSubmitted)
	}

	// Nothing died on the way, and the optimizer saw no double booking.
	mustBeAlive(t, procs...)
	for _, p := range procs[1:] {
		if out := p.output(); strings.Contains(out, "double booking") || strings.Contains(out, "panic") {
			t.Errorf("%s logged a double booking or a panic:\n%s", p.name, out)
		}
	}
}

// cliCollect reads a CLI pull consumer on the placement stream with
// `nats consumer next --raw`, handing each body to add, until done holds;
// then it reads once more, so that whatever came after is checked too.
func cliCollect(t *testing.T, url, consumer string, procs []*proc, add func(body string), done func() (bool, string)) {
	t.Helper()
	waitFor(t, 30*time.Second, func() (bool, string) {
		mustBeAlive(t, procs...)
		cliDrain(t, url, consumer, add)
		return done()
	})
	cliDrain(t, url, consumer, add)
}

// cliDrain fetches, and acknowledges, every message the consumer holds.
func cliDrain(t *testing.T, url, consumer string, add func(body string)) {
	t.Helper()
	var info struct {
		NumPending uint64 `json:"num_pending"`
	}
	out := natsCLI(t, url, "consumer", "info", streamPlacement, consumer, "--json")
	if err := json.Unmarshal([]byte(out), &info); err != nil {
		t.Fatalf("nats consumer info --json: %v\n%s", err, out)
	}
	if info.NumPending == 0 {
		return
	}
	out = natsCLI(t, url, "consumer", "next", streamPlacement, consumer,
		"--count", strconv.FormatUint(info.NumPending, 10), "--raw")
	for line := range strings.Lines(out) {
		if line = strings.TrimSpace(line); line != "" {
			add(line)
		}
	}
}

// storedMsg is the JSON of `nats stream get --json`; headers and data are
// base64 there, which []byte decodes.
type storedMsg struct {
	Subject string `json:"subject"`
	Seq     uint64 `json:"seq"`
	Header  []byte `json:"hdrs"`
	Data    []byte `json:"data"`
}

func cliStreamGet(t *testing.T, url, stream string, seq uint64) storedMsg {
	t.Helper()
	out := natsCLI(t, url, "stream", "get", stream, strconv.FormatUint(seq, 10), "--json")
	var m storedMsg
	if err := json.Unmarshal([]byte(out), &m); err != nil {
		t.Fatalf("nats stream get %s %d --json: %v\n%s", stream, seq, err, out)
	}
	return m
}

// parseHeaders reads NATS wire headers ("NATS/1.0\r\nK: V\r\n...") into a
// map keyed by lower-cased name.
func parseHeaders(raw []byte) map[string]string {
	h := map[string]string{}
	for i, line := range strings.Split(string(raw), "\r\n") {
		if i == 0 || line == "" {
			continue
		}
		k, v, ok := strings.Cut(line, ":")
		if ok {
			h[strings.ToLower(strings.TrimSpace(k))] = strings.TrimSpace(v)
		}
	}
	return h
}

// hasReason reports whether r has a reason on field whose message holds
// text.
func hasReason(r reasonsJSON, field, text string) bool {
	for _, x := range r.Reasons {
		if x.Field == field && strings.Contains(x.Message, text) {
			return true
		}
	}
	return false
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}
