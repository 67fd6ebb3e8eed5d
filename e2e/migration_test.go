package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// optimizerMigrates says whether the optimizer diagnoses congestion from
// runtime.telemetry and proposes the migration itself (it does); false
// plays the optimizer's part with the nats CLI, to test placement's side
// alone.
const optimizerMigrates = true

const (
	streamRuntime    = "TOPOSCHED_RUNTIME"
	subjectTelemetry = "toposched.runtime.telemetry"
	subjectDiagnosis = "toposched.runtime.diagnosis"
	subjectMigration = "toposched.placement.migration"
	subjectTuning    = "toposched.runtime.tuning"
)

// Wire shapes of the migration scenario, declared here as the other tests
// declare theirs.
type (
	predictionJSON struct {
		CommSecondsPerStep float64 `json:"comm_seconds_per_step"`
		Groups             []struct {
			Name           string  `json:"name"`
			SecondsPerStep float64 `json:"seconds_per_step"`
		} `json:"groups"`
	}
	migrationJSON struct {
		ProposalID    string     `json:"proposal_id"`
		RequestID     string     `json:"request_id"`
		PreviousNodes []nodeJSON `json:"previous_nodes"`
	}
	decidedFullJSON struct {
		decidedJSON
		Prediction *predictionJSON `json:"prediction"`
		Migration  *migrationJSON  `json:"migration"`
	}
	proposalJSON struct {
		JobID                      string     `json:"job_id"`
		ProposalID                 string     `json:"proposal_id"`
		Reason                     string     `json:"reason"`
		Message                    string     `json:"message"`
		FindingID                  string     `json:"finding_id,omitempty"`
		CurrentNodes               []nodeJSON `json:"current_nodes"`
		Ranks                      []rankJSON `json:"ranks"`
		Nodes                      []nodeJSON `json:"nodes"`
		CurrentCommSecondsPerStep  float64    `json:"current_comm_seconds_per_step"`
		MeasuredCommSecondsPerStep float64    `json:"measured_comm_seconds_per_step,omitempty"`
		ProposedCommSecondsPerStep float64    `json:"proposed_comm_seconds_per_step"`
		GainSecondsPerStep         float64    `json:"gain_seconds_per_step"`
		StepSeconds                float64    `json:"step_seconds"`
		RestartCostSeconds         float64    `json:"restart_cost_seconds"`
		RestartCostSource          string     `json:"restart_cost_source"`
		BreakEvenSeconds           float64    `json:"break_even_seconds"`
		ProposedAt                 string     `json:"proposed_at"`
	}
	tunedGroupJSON struct {
		Name           string  `json:"name"`
		Bytes          int64   `json:"bytes"`
		CallsPerStep   int     `json:"calls_per_step"`
		SecondsPerStep float64 `json:"seconds_per_step"`
		BusBWGBps      float64 `json:"busbw_gbps"`
	}
	tuningJSON struct {
		JobID  string           `json:"job_id"`
		Groups []tunedGroupJSON `json:"groups"`
	}
)

// TestMigrationScenario is issue 6's scenario, end to end on `toposched
// serve`: a job placed across two leaves because nothing else is free; a
// neighbour job sharing both leaves' uplinks; telemetry showing the job's
// all-reduce at 40% of the predicted bus bandwidth; the optimizer
// diagnosing congestion and, once the job holding a same-leaf node
// finishes, proposing a move there; `topoctl migrate accept --wait`; the new
// decision; the GPUs the job left free for the next job.
func TestMigrationScenario(t *testing.T) {
	needBinaries(t)
	t.Parallel()
	dir := t.TempDir()
	// No policies: the shipped leaf-span policy would keep the jobs from
	// spanning the two leaves, which the scenario needs.
	serve, url := serveTwoLeaves(t, dir)
	js := jsConnect(t, url)

	job := func(id, body string) string {
		path := filepath.Join(dir, id+".yaml")
		if err := os.WriteFile(path, []byte("job_id: "+id+"\ngpu_model: A100-SXM4-80GB\n"+body), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	// hold takes gpu-001, the neighbour two GPUs of each of gpu-002 and
	// gpu-003 (its all-reduce crosses the spine), and train what is left:
	// one GPU under each leaf.
	hold := submitWaitDecided(t, url, job("hold", "gpus: 4\ngpus_per_node: 4\n"), "hold")
	neighbour := submitWaitDecided(t, url, job("neighbour", "gpus: 4\ngpus_per_node: 2\nstrategy: ddp\n"+
		"model: {parameters: 2000000000, dtype: bf16}\nstep_compute_seconds: 0.5\n"), "neighbour")
	train := submitWaitDecided(t, url, job("train", "gpus: 2\nstrategy: ddp\n"+
		"model: {parameters: 1000000000, dtype: bf16}\nstep_compute_seconds: 0.5\nrestart_cost_seconds: 120\n"), "train")
	if nodes := nodeNames(hold); nodes != "gpu-001" {
		t.Fatalf("hold on %s, want gpu-001", nodes)
	}
	if nodes := nodeNames(neighbour); nodes != "gpu-002 gpu-003" {
		t.Fatalf("neighbour on %s, want gpu-002 gpu-003", nodes)
	}
	if nodes := nodeNames(train); nodes != "gpu-002 gpu-003" {
		t.Fatalf("train on %s, want one GPU of gpu-002 (leaf-1) and one of gpu-003 (leaf-2)", nodes)
	}
	trainFull := lastDecision(t, js, "train")
	if trainFull.Prediction == nil {
		t.Fatal("train's decision has no prediction")
	}

	// The job reports a step with its data-parallel all-reduce at 40% of
	// the predicted bus bandwidth (2.5 times the predicted time), against
	// the prediction of the optimizer's runtime.tuning for the decision:
	// what a launcher ran with and what telemetry is compared with.
	tuned := tunedDP(t, serve, js, "train")
	bytes, calls := tuned.Bytes, max(tuned.CallsPerStep, 1)
	measured := tuned.SecondsPerStep / 0.4
	predictedBusBW := tuned.BusBWGBps
	telemetry, err := json.Marshal(map[string]any{
		"job_id": "train", "step": 100, "step_seconds": 0.5 + measured, "compute_seconds": 0.5,
		"groups": []map[string]any{{"group": tuned.Name, "collective": "all_reduce", "seconds": measured,
			"busbw_gbps": 0.4 * predictedBusBW, "bytes": bytes, "calls": calls}},
	})
	if err != nil {
		t.Fatal(err)
	}
	natsCLI(t, url, "pub", subjectTelemetry, "--jetstream", string(telemetry))

	if optimizerMigrates {
		// The optimizer names congestion, with the neighbour on a shared
		// uplink as evidence.
		waitFor(t, 30*time.Second, func() (bool, string) {
			mustBeAlive(t, serve)
			for _, m := range readStream(t, js, streamRuntime, subjectDiagnosis) {
				var d struct {
					JobID    string `json:"job_id"`
					Finding  string `json:"finding"`
					Evidence struct {
						SharedLinks []struct {
							Link string   `json:"link"`
							Jobs []string `json:"jobs"`
						} `json:"shared_links"`
					} `json:"evidence"`
				}
				if json.Unmarshal(m, &d) != nil || d.JobID != "train" || d.Finding != "congestion" {
					continue
				}
				for _, l := range d.Evidence.SharedLinks {
					if strings.HasPrefix(l.Link, "uplink:") && strings.Contains(strings.Join(l.Jobs, ","), "neighbour") {
						return true, ""
					}
				}
				return false, fmt.Sprintf("congestion found without the neighbour on a shared uplink: %s", m)
			}
			return false, "no congestion diagnosis for train"
		})
	}

	// The job on the same-leaf node finishes; a placement under one leaf
	// is free now.
	topoctlOK(t, url, "finish", "hold")
	if !optimizerMigrates {
		// Play the optimizer: the proposal it is to make.
		p := proposalJSON{JobID: "train", ProposalID: "e2e-p1", Reason: "congestion",
			Message:                   "dp all-reduce at 40% of the predicted bus bandwidth; uplinks shared with neighbour; gpu-001 is free under leaf-1",
			CurrentNodes:              train.Nodes,
			Ranks:                     []rankJSON{{Rank: 0, Node: "gpu-001", GPU: 0, LocalRank: 0}, {Rank: 1, Node: "gpu-001", GPU: 1, LocalRank: 1}},
			Nodes:                     []nodeJSON{{Node: "gpu-001", GPUs: []int{0, 1}, CUDAVisibleDevices: "0,1"}},
			CurrentCommSecondsPerStep: trainFull.Prediction.CommSecondsPerStep, MeasuredCommSecondsPerStep: measured,
			ProposedCommSecondsPerStep: 0, GainSecondsPerStep: measured, StepSeconds: 0.5 + measured,
			RestartCostSeconds: 120, RestartCostSource: "job", BreakEvenSeconds: 120 * (0.5 + measured) / measured,
			ProposedAt: time.Now().UTC().Format(time.RFC3339Nano)}
		body, err := json.Marshal(p)
		if err != nil {
			t.Fatal(err)
		}
		natsCLI(t, url, "pub", subjectMigration, "--jetstream", string(body))
	}
	var proposal proposalJSON
	waitFor(t, 30*time.Second, func() (bool, string) {
		mustBeAlive(t, serve)
		for _, ev := range readPlacements(t, js) {
			if ev.subject == subjectMigration && ev.jobID == "train" {
				if err := json.Unmarshal(ev.body, &proposal); err != nil {
					t.Fatalf("placement.migration #%d: %v", ev.seq, err)
				}
			}
		}
		return proposal.ProposalID != "", "no placement.migration for train"
	})
	if got := nodeNames(decidedJSON{Nodes: proposal.Nodes}); got != "gpu-001" {
		t.Errorf("proposal moves train to %s, want gpu-001 (leaf-1, now free)", got)
	}
	if proposal.GainSecondsPerStep <= 0 || proposal.RestartCostSeconds != 120 || proposal.RestartCostSource != "job" {
		t.Errorf("proposal gain %v, restart cost %v from %q; want a gain and the job's 120 s",
			proposal.GainSecondsPerStep, proposal.RestartCostSeconds, proposal.RestartCostSource)
	}
	if want := proposal.RestartCostSeconds * proposal.StepSeconds / proposal.GainSecondsPerStep; math.Abs(proposal.BreakEvenSeconds-want) > 1e-6*want {
		t.Errorf("break-even %v s, want restart cost × step / gain = %v s", proposal.BreakEvenSeconds, want)
	}

	if out := topoctlOK(t, url, "migrate", "list"); !strings.Contains(out, "train") || !strings.Contains(out, proposal.ProposalID) || !strings.Contains(out, "open") {
		t.Errorf("migrate list does not show train's open proposal:\n%s", out)
	}
	out := topoctlOK(t, url, "migrate", "accept", "train", "--wait", "--timeout", "30s")
	if !strings.Contains(out, "train: migrated by proposal "+proposal.ProposalID) || !strings.Contains(out, "gpu-001") {
		t.Errorf("migrate accept --wait printed:\n%s", out)
	}

	// The new decision: every rank on gpu-001, the old nodes recorded.
	moved := lastDecision(t, js, "train")
	if moved.Migration == nil || moved.Migration.ProposalID != proposal.ProposalID || nodeNames(moved.decidedJSON) != "gpu-001" {
		t.Fatalf("train's last decision: nodes %s, migration %+v", nodeNames(moved.decidedJSON), moved.Migration)
	}
	if got := nodeNames(decidedJSON{Nodes: moved.Migration.PreviousNodes}); got != "gpu-002 gpu-003" {
		t.Errorf("migration's previous nodes %s, want gpu-002 gpu-003", got)
	}
	// Accepting again is refused: the proposal was applied.
	if r := topoctl(t, url, "migrate", "accept", "train", "--wait", "--timeout", "30s"); r.code == 0 || !strings.Contains(r.stdout, "placement_changed") {
		t.Errorf("second accept: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}

	// The GPUs train left are free: the live view says so, and the next
	// job of four gets every free GPU, those among them.
	view := topoctlOK(t, url, "topology", "show")
	for _, g := range train.gpus() {
		if state := gpuState(view, g); state != "free" {
			t.Errorf("%s/%d after the migration: %q, want free\n%s", g.node, g.gpu, state, view)
		}
	}
	next := submitWaitDecided(t, url, job("next", "gpus: 4\n"), "next")
	for _, g := range train.gpus() {
		if !containsGPU(next.gpus(), g) {
			t.Errorf("next holds %v, without %s/%d that train left", next.gpus(), g.node, g.gpu)
		}
	}
	auditMigrations(t, readPlacements(t, js))
}

// nodeNames lists a decision's nodes, sorted, space separated.
func nodeNames(d decidedJSON) string {
	var names []string
	for _, n := range d.Nodes {
		names = append(names, n.Node)
	}
	for i := range names {
		for j := i + 1; j < len(names); j++ {
			if names[j] < names[i] {
				names[i], names[j] = names[j], names[i]
			}
		}
	}
	return strings.Join(names, " ")
}

func containsGPU(gs []gpuKey, g gpuKey) bool {
	for _, x := range gs {
		if x == g {
			return true
		}
	}
	return false
}

// lastDecision is a job's last placement.decided in the placement stream.
func lastDecision(t *testing.T, js jetstream.JetStream, job string) decidedFullJSON {
	t.Helper()
	var d decidedFullJSON
	for _, ev := range readPlacements(t, js) {
		if ev.subject == subjectDecided && ev.jobID == job {
			d = decidedFullJSON{}
			if err := json.Unmarshal(ev.body, &d); err != nil {
				t.Fatalf("decision #%d: %v", ev.seq, err)
			}
		}
	}
	if d.JobID == "" {
		t.Fatalf("no decision for %s", job)
	}
	return d
}

// tunedDP waits for the optimizer's runtime.tuning of job and returns its
// data-parallel group's prediction.
func tunedDP(t *testing.T, serve *proc, js jetstream.JetStream, job string) tunedGroupJSON {
	t.Helper()
	var tuned tunedGroupJSON
	waitFor(t, 30*time.Second, func() (bool, string) {
		mustBeAlive(t, serve)
		for _, m := range readStream(t, js, streamRuntime, subjectTuning) {
			var tu tuningJSON
			if json.Unmarshal(m, &tu) != nil || tu.JobID != job {
				continue
			}
			for _, g := range tu.Groups {
				if strings.HasPrefix(g.Name, "dp") && g.SecondsPerStep > 0 && g.BusBWGBps > 0 {
					tuned = g
				}
			}
		}
		return tuned.Name != "", "no runtime.tuning with a dp group for " + job
	})
	return tuned
}

// serveTwoLeaves starts `toposched serve` on testdata/two-leaves.yaml
// without policies, on a free loopback port with its data under dir, and
// returns once it serves, with its NATS URL.
func serveTwoLeaves(t *testing.T, dir string) (*proc, string) {
	t.Helper()
	port := freePort(t)
	serve := startServe(t, "serve", testdata(t, "two-leaves.yaml"), port, filepath.Join(dir, "data"), "--policies", "none")
	return serve, fmt.Sprintf("nats://127.0.0.1:%d", port)
}

// readStream returns the bodies of a stream's messages on subject, in
// order; none when the stream does not exist.
func readStream(t *testing.T, js jetstream.JetStream, stream, subject string) [][]byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, stream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil
	}
	if err != nil {
		t.Fatalf("stream %s: %v", stream, err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatalf("stream %s: %v", stream, err)
	}
	var out [][]byte
	for seq := info.State.FirstSeq; info.State.Msgs > 0 && seq <= info.State.LastSeq; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			t.Fatalf("get %s #%d: %v", stream, seq, err)
		}
		if m.Subject == subject {
			out = append(out, m.Data)
		}
	}
	return out
}

// gpuState finds "GPU<i> <state>" under a node in `topoctl topology show`.
func gpuState(view string, g gpuKey) string {
	in := false
	for line := range strings.Lines(view) {
		l := strings.TrimSpace(line)
		if strings.HasPrefix(l, "node ") {
			in = strings.HasPrefix(l, "node "+g.node+":")
			continue
		}
		if rest, ok := strings.CutPrefix(l, fmt.Sprintf("GPU%d ", g.gpu)); in && ok {
			return rest
		}
	}
	return "not shown"
}

// auditMigrations checks the placement log with migrations in it: a job
// decided again only by a migration, whose previous nodes are what it
// held, and no GPU ever in two live placements.
func auditMigrations(t *testing.T, evs []placementEvent) {
	t.Helper()
	live := map[string]decidedJSON{}
	holder := map[gpuKey]string{}
	for _, ev := range evs {
		switch ev.subject {
		case subjectDecided:
			var d decidedFullJSON
			if err := json.Unmarshal(ev.body, &d); err != nil {
				t.Fatalf("decision #%d: %v", ev.seq, err)
			}
			if prev, ok := live[d.JobID]; ok {
				if d.Migration == nil {
					t.Errorf("job %s decided again (#%d) without a migration", d.JobID, ev.seq)
				} else if got, want := nodeNames(decidedJSON{Nodes: d.Migration.PreviousNodes}), nodeNames(prev); got != want {
					t.Errorf("job %s migrated (#%d) from %s, but held %s", d.JobID, ev.seq, got, want)
				}
				for _, g := range prev.gpus() {
					delete(holder, g)
				}
			}
			for _, g := range d.gpus() {
				if other, ok := holder[g]; ok {
					t.Errorf("GPU %s/%d given to %s (#%d) while %s holds it", g.node, g.gpu, d.JobID, ev.seq, other)
				}
				holder[g] = d.JobID
			}
			live[d.JobID] = d.decidedJSON
		case subjectReleased:
			if d, ok := live[ev.jobID]; ok {
				for _, g := range d.gpus() {
					delete(holder, g)
				}
			}
			delete(live, ev.jobID)
		}
	}
}
