package main

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/toposched/toposched/events"
)

var update = flag.Bool("update", false, "rewrite the golden files")

func TestWriteLaunchArgs(t *testing.T) {
	t.Parallel()
	decided := func(devices ...string) *events.PlacementDecided {
		d := &events.PlacementDecided{JobID: "ddp", Launch: &events.Launch{MasterAddr: "gpu-001", MasterPort: 29502, SlurmNodelist: "gpu-001,gpu-002",
			MPIRankfile: "rank 0=gpu-001 slot=0\nrank 1=gpu-001 slot=1\nrank 2=gpu-002 slot=0\nrank 3=gpu-002 slot=1\n"}}
		for i, node := range []string{"gpu-001", "gpu-002"} {
			d.Nodes = append(d.Nodes, events.NodePlacement{Node: node, CUDAVisibleDevices: devices[i], GPUs: []int{0, 1},
				SlurmGPUBind: "map_gpu:" + devices[i],
				Torchrun:     []string{"--nnodes=2", "--node_rank=" + string(rune('0'+i)), "--nproc_per_node=2", "--master_addr=gpu-001", "--master_port=29502"}})
			for l := range 2 {
				d.Ranks = append(d.Ranks, events.RankPlacement{Rank: 2*i + l, Node: node, LocalRank: l})
			}
		}
		return d
	}
	job := &events.JobSubmitted{JobID: "ddp", Command: "python3", Args: []string{"train.py", "--name", "it's mine"}, Env: []string{"OMP_NUM_THREADS=1"}}
	jobPort := &events.JobSubmitted{JobID: "ddp", Command: "python3", Args: []string{"train.py"}, Env: []string{"MASTER_PORT=1234"}}
	for _, tc := range []struct {
		name, launcher string
		d              *events.PlacementDecided
		job            *events.JobSubmitted
	}{
		{"torchrun", "torchrun", decided("0,1", "2,3"), job},
		{"torchrun-not-python", "torchrun", decided("0,1", "2,3"), &events.JobSubmitted{JobID: "ddp", Command: "./train.sh", Args: []string{"--fast"}}},
		{"mpirun-same-devices", "mpirun", decided("0,1", "0,1"), job},
		{"mpirun-devices-per-node", "mpirun", decided("0,1", "2,3"), job},
		{"srun", "srun", decided("0,1", "2,3"), job},
		{"srun-no-command", "srun", decided("0,1", "2,3"), nil},
		// The job's own rendezvous port wins over the decision's.
		{"torchrun-job-port", "torchrun", decided("0,1", "2,3"), jobPort},
		{"mpirun-job-port", "mpirun", decided("0,1", "0,1"), jobPort},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var b strings.Builder
			if err := writeLaunchArgs(&b, tc.launcher, tc.d, tc.job, "ddp.rankfile"); err != nil {
				t.Fatal(err)
			}
			golden := filepath.Join("testdata", "launch-args", tc.name+".txt")
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
	t.Run("torchrun needs node blocks", func(t *testing.T) {
		d := decided("0,1", "2,3")
		d.Nodes[1].Torchrun = nil
		if err := writeLaunchArgs(&strings.Builder{}, "torchrun", d, job, ""); err == nil || !strings.Contains(err.Error(), "use mpirun or srun") {
			t.Errorf("err = %v", err)
		}
	})
}
