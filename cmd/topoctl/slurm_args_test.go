package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/toposched/toposched/events"
)

// slurmDecided is a 2-node decision of 2 ranks per node: GPUs 1,3 of n1
// and 0,2 of n2, NUMA known when numa is set.
func slurmDecided(numa bool) *events.PlacementDecided {
	d := &events.PlacementDecided{JobID: "tp2-dp2", Launch: &events.Launch{MasterAddr: "n1", MasterPort: 29502, SlurmNodelist: "n1,n2"}}
	gpus := map[string][]int{"n1": {3, 1}, "n2": {0, 2}}
	rank := 0
	for _, node := range []string{"n1", "n2"} {
		d.Nodes = append(d.Nodes, events.NodePlacement{Node: node, GPUs: gpus[node], SlurmGPUBind: fmt.Sprintf("map_gpu:%d,%d", gpus[node][0], gpus[node][1])})
		for l, g := range gpus[node] {
			r := events.RankPlacement{Rank: rank, Node: node, GPU: g, LocalRank: l}
			if numa {
				n := g / 2
				r.NUMA = &n
			}
			d.Ranks = append(d.Ranks, r)
			rank++
		}
	}
	return d
}

// slurmUniform is slurmDecided with GPUs 3,1 on both nodes.
func slurmUniform() *events.PlacementDecided {
	d := slurmDecided(false)
	d.Nodes[1].GPUs, d.Nodes[1].SlurmGPUBind = d.Nodes[0].GPUs, d.Nodes[0].SlurmGPUBind
	d.Ranks[2].GPU, d.Ranks[3].GPU = 3, 1
	return d
}

func TestSlurmArgs(t *testing.T) {
	t.Parallel()
	job := &events.JobSubmitted{JobID: "tp2-dp2", Command: "python3", Args: []string{"train.py", "--name", "it's mine"},
		Env: []string{"OMP_NUM_THREADS=1", "NCCL_ALGO=Ring"}, Workdir: "/shared/run"}
	jobPort := &events.JobSubmitted{JobID: "tp2-dp2", Command: "./train.sh", Env: []string{"MASTER_PORT=1234"}}
	for _, tc := range []struct {
		name, format string
		d            *events.PlacementDecided
		job          *events.JobSubmitted
	}{
		{"srun", "srun", slurmDecided(true), job},
		{"srun-numa-unknown", "srun", slurmDecided(false), job},
		{"srun-no-command", "srun", slurmDecided(false), nil},
		// The job's own rendezvous port wins over the decision's.
		{"srun-job-port", "srun", slurmDecided(false), jobPort},
		{"sbatch", "sbatch", slurmDecided(true), job},
		// The same GPUs and binding on every node: one component.
		{"srun-uniform", "srun", slurmUniform(), job},
		{"sbatch-uniform", "sbatch", slurmUniform(), job},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			comps, err := slurmComponents(tc.d, tc.job, nil)
			if err != nil {
				t.Fatal(err)
			}
			var b strings.Builder
			if tc.format == "sbatch" {
				if err := writeSbatch(&b, comps); err != nil {
					t.Fatal(err)
				}
			} else {
				b.WriteString(shellJoin(append([]string{"srun"}, srunArgv(comps)...)) + "\n")
			}
			golden := filepath.Join("testdata", "slurm-args", tc.name+".txt")
			if *update {
				if err := os.MkdirAll(filepath.Dir(golden), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(golden, []byte(b.String()), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatal(err)
			}
			if b.String() != string(want) {
				t.Errorf("got:\n%s\nwant (%s):\n%s", b.String(), golden, want)
			}
		})
	}
}

func TestSlurmArgsRefused(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		edit func(*events.PlacementDecided, *events.JobSubmitted)
		want string
	}{
		{"ranks not in node blocks", func(d *events.PlacementDecided, _ *events.JobSubmitted) {
			d.Ranks[1].Rank, d.Ranks[2].Rank = 2, 1
		}, "rank 2 on node n1 (local rank 1): the ranks are not in node blocks"},
		{"comma in env", func(_ *events.PlacementDecided, j *events.JobSubmitted) {
			j.Env = []string{"A=1", "HOSTS=a,b"}
		}, `env[1] "HOSTS=a,b": a comma cannot pass through srun --export`},
		{"fewer ranks than GPUs", func(d *events.PlacementDecided, _ *events.JobSubmitted) {
			d.Nodes[1].GPUs = append(d.Nodes[1].GPUs, 3)
		}, "node n2: 2 ranks for 3 GPUs"},
		{"no gpu bind", func(d *events.PlacementDecided, _ *events.JobSubmitted) {
			d.Nodes[0].SlurmGPUBind = ""
		}, "node n1: the decision has no slurm_gpu_bind"},
		{"no node", func(d *events.PlacementDecided, _ *events.JobSubmitted) {
			d.Nodes, d.Ranks = nil, nil
		}, "places no node"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			d := slurmDecided(false)
			job := &events.JobSubmitted{JobID: d.JobID, Command: "true"}
			tc.edit(d, job)
			if _, err := slurmComponents(d, job, nil); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %v, want %q", err, tc.want)
			}
		})
	}
}

func TestParseSinfoGres(t *testing.T) {
	t.Parallel()
	out := "n1|gpu:g0:1(S:0),gpu:g1:1(S:0),gpu:g2:1(S:1),gpu:g3:1(S:1)\nn2|gpu:h100:4(S:0-1)\nn2|gpu:h100:4(S:0-1)\nn3|(null)\n|gpu:g0:1\nbroken line\n"
	got := parseSinfoGres(out)
	want := map[string]string{"n1": "g0 g1 g2 g3", "n2": "h100", "n3": ""}
	if len(got) != len(want) {
		t.Errorf("nodes %v, want %v", got, want)
	}
	for node, types := range want {
		if g, ok := got[node]; !ok || strings.Join(g, " ") != types {
			t.Errorf("node %s: types %q (listed %v), want %q", node, g, ok, types)
		}
	}
}

func FuzzParseSinfoGres(f *testing.F) {
	for _, seed := range []string{
		"n1|gpu:g0:1(S:0),gpu:g1:1(S:0)\n",
		"n2|gpu:h100:4(S:0-1)\nn3|(null)\n",
		"|\n\n|x", "gpu:g1:1|gpu:g1:1|", "n1|gpu::1,gpu:(:1,gpu:g9:",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, out string) {
		for node, types := range parseSinfoGres(out) {
			if node == "" || strings.ContainsAny(node, "|\n") {
				t.Fatalf("node %q from %q", node, out)
			}
			for _, ty := range types {
				if ty == "" || strings.ContainsAny(ty, ":,()") {
					t.Fatalf("node %s: type %q from %q", node, ty, out)
				}
			}
		}
	})
}

func TestSinfoGresTypes(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ in, want string }{
		{"gpu:g0:1(S:0),gpu:g1:1(S:0),gpu:g2:1(S:1),gpu:g3:1(S:1)", "g0 g1 g2 g3"},
		{"gpu:g0:1,gpu:g1:1(S:0-1)", "g0 g1"},
		{"gpu:h100:4(S:0-1)", "h100"},
		{"(null)", ""},
	} {
		var got []string
		for _, m := range gresType.FindAllStringSubmatch(tc.in, -1) {
			got = append(got, m[1])
		}
		if strings.Join(got, " ") != tc.want {
			t.Errorf("%q: types %q, want %q", tc.in, got, tc.want)
		}
	}
}
