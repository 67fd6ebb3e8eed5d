package e2e

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// slurmTuningJSON is runtime.tuning as the runtime stream stores it: the
// parts a launcher applies.
type slurmTuningJSON struct {
	JobID     string    `json:"job_id"`
	DecidedAt time.Time `json:"decided_at"`
	Env       struct {
		All   map[string]string            `json:"all"`
		Nodes map[string]map[string]string `json:"nodes"`
		Ranks map[string]map[string]string `json:"ranks"`
	} `json:"env"`
	Files []struct {
		Node    string `json:"node"`
		Path    string `json:"path"`
		Content string `json:"content"`
	} `json:"files"`
}

// tuningOf reads the last runtime.tuning of a job from the bus.
func tuningOf(t *testing.T, url, id string) slurmTuningJSON {
	t.Helper()
	js := jsConnect(t, url)
	var last *slurmTuningJSON
	for _, m := range readStream(t, js, streamRuntime, subjectTuning) {
		var tu slurmTuningJSON
		if json.Unmarshal(m, &tu) == nil && tu.JobID == id {
			last = &tu
		}
	}
	if last == nil {
		t.Fatalf("no runtime.tuning of %s on the bus", id)
	}
	// What the scenario is for: a file per node and per-rank settings.
	if len(last.Files) == 0 || len(last.Env.Ranks) == 0 {
		t.Fatalf("the runtime.tuning of %s has no file or no per-rank env, nothing to check: %+v", id, *last)
	}
	return *last
}

// tunedRankScript is a rank's command: it writes its NCCL_* and
// TOPOSCHED_* variables (not the e2e marker) and a copy of its
// NCCL_TOPO_FILE into dir.
func tunedRankScript(dir string) string {
	return fmt.Sprintf(`env | grep -E '^(NCCL_|TOPOSCHED_)' | grep -v '^TOPOSCHED_E2E' | sort > %[1]s/env-$RANK; cp "$NCCL_TOPO_FILE" %[1]s/topo-$RANK; echo "$SLURMD_NODENAME" > %[1]s/node-$RANK`, dir)
}

// checkTunedRanks checks what each rank (0..ranks-1) wrote with
// tunedRankScript against the tuning: All's, its node's and its own
// variables, NCCL_TOPO_FILE a temp file in tmp holding its node's file,
// no other NCCL_ variable; and tmp empty, every file removed.
func checkTunedRanks(t *testing.T, tu slurmTuningJSON, ranks int, dir, tmp string) {
	t.Helper()
	for rank := range ranks {
		read := func(name string) string {
			b, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("%s-%d", name, rank)))
			if err != nil {
				t.Fatalf("rank %d wrote no %s: %v", rank, name, err)
			}
			return string(b)
		}
		node := strings.TrimSpace(read("node"))
		want := map[string]string{}
		maps.Copy(want, tu.Env.All)
		maps.Copy(want, tu.Env.Nodes[node])
		maps.Copy(want, tu.Env.Ranks[strconv.Itoa(rank)])
		got := map[string]string{}
		for line := range strings.SplitSeq(strings.TrimSpace(read("env")), "\n") {
			k, v, _ := strings.Cut(line, "=")
			got[k] = v
		}
		var content string
		for _, f := range tu.Files {
			if f.Node == node && f.Path == want["NCCL_TOPO_FILE"] {
				content = f.Content
			}
		}
		if content == "" {
			t.Fatalf("rank %d on %s: the tuning has no file at its NCCL_TOPO_FILE %q", rank, node, want["NCCL_TOPO_FILE"])
		}
		if topo := got["NCCL_TOPO_FILE"]; !strings.HasPrefix(topo, tmp+"/toposched-tuning.") {
			t.Errorf("rank %d: NCCL_TOPO_FILE=%q, want a fresh temp file in %s", rank, topo, tmp)
		}
		if file := read("topo"); file != content {
			t.Errorf("rank %d on %s: NCCL_TOPO_FILE holds %q, want the tuning's %q", rank, node, file, content)
		}
		delete(want, "NCCL_TOPO_FILE")
		delete(got, "NCCL_TOPO_FILE")
		for _, k := range slices.Sorted(maps.Keys(want)) {
			if got[k] != want[k] {
				t.Errorf("rank %d on %s: %s=%q, want the tuning's %q", rank, node, k, got[k], want[k])
			}
		}
		for k, v := range got {
			if _, ok := want[k]; !ok && strings.HasPrefix(k, "NCCL_") {
				t.Errorf("rank %d on %s: %s=%q, which the tuning does not set", rank, node, k, v)
			}
		}
	}
	if left, _ := os.ReadDir(tmp); len(left) != 0 {
		t.Errorf("tuning files left in TMPDIR %s: %v", tmp, left)
	}
}

// TestSlurmRunTuning: the ranks of a job run by topoctl run --slurm, and
// those of a job started by the sbatch script topoctl slurm-args prints,
// get the decision's runtime.tuning as the node agents apply it: the
// variables for all ranks, their node's and their own, and their node's
// NCCL_TOPO_FILE in a temp file of their own, removed once they exit.
func TestSlurmRunTuning(t *testing.T) {
	c := startSlurm(t, []slurmNode{{"n1", topoPairsBySocket}, {"n2", topoPairsBySocket}}, "--index-types")
	// serve's nodes: four GPUs each with PCI bus ids (an NCCL topology
	// XML), which the decision's NCCL topology files need; nvidia-smi
	// topo -m has none.
	xml, err := os.ReadFile(filepath.Join("..", "internal", "formats", "ncclxml", "testdata", "azure-ncv4-a100-4gpu_azhpc-images-topology.xml"))
	if err != nil {
		t.Fatal(err)
	}
	writeSlurmFile(t, filepath.Join(c.Dir, "a100.xml"), string(xml))
	cluster := filepath.Join(c.Dir, "cluster-xml.yaml")
	writeSlurmFile(t, cluster, `name: slurm-e2e
nodes:
  - {name: n1, nccl_xml: a100.xml, gpu_model: H100}
  - {name: n2, nccl_xml: a100.xml, gpu_model: H100}
fabric:
  switches:
    - {name: spine, tier: spine, switches: [leaf-n1, leaf-n2]}
    - {name: leaf-n1, tier: leaf, nodes: [n1]}
    - {name: leaf-n2, tier: leaf, nodes: [n2]}
`)
	s := startSlurmServe(t, c, cluster)
	dir, tmp := t.TempDir(), t.TempDir()
	job := writeSlurmJob(t, dir, "tuned", 4, 2, tunedRankScript(dir))
	// srun passes its environment on (--export=ALL): the ranks' TMPDIR.
	r := runCmd(t, 2*time.Minute, clientEnv(s.url, "SLURM_CONF="+c.Conf, c.marker(), "TMPDIR="+tmp), bins.topoctl,
		"--nats-url", s.url, "run", "--slurm", job)
	if r.code != 0 {
		t.Fatalf("topoctl run --slurm: exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}
	if strings.Contains(r.stderr, "no runtime.tuning") {
		t.Fatalf("topoctl run --slurm started without the tuning:\n%s", r.stderr)
	}
	checkTunedRanks(t, tuningOf(t, s.url, "tuned"), 4, dir, tmp)
	c.waitSqueueEmpty(t)

	// The sbatch script of slurm-args, for a job placed and not run.
	dir, tmp = t.TempDir(), t.TempDir()
	args := writeSlurmJob(t, dir, "args-tuned", 2, 2, tunedRankScript(dir))
	if r := s.topoctl(t, "submit", "--wait", args); r.code != 0 {
		t.Fatalf("topoctl submit args-tuned: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	r = s.topoctl(t, "slurm-args", "args-tuned", "--format", "sbatch")
	if r.code != 0 || strings.Contains(r.stderr, "no runtime.tuning") {
		t.Fatalf("topoctl slurm-args args-tuned: exit %d, without the tuning?\n%s", r.code, r.stderr)
	}
	script := filepath.Join(dir, "args-tuned.sbatch")
	writeSlurmFile(t, script, r.stdout)
	c.sbatch(t, "-o", filepath.Join(dir, "out"), "--export=ALL,TMPDIR="+tmp, script)
	c.waitSqueueEmpty(t)
	checkTunedRanks(t, tuningOf(t, s.url, "args-tuned"), 2, dir, tmp)
}
