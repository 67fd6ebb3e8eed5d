package launcher

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/toposched/toposched/events"
)

func intp(n int) *int { return &n }

// twoNodes is a 4-rank decision, two ranks on each of a and b.
func twoNodes() *events.PlacementDecided {
	return &events.PlacementDecided{
		JobID: "j1",
		Ranks: []events.RankPlacement{
			{Rank: 0, Node: "a", GPU: 2, LocalRank: 0, NUMA: intp(0)},
			{Rank: 1, Node: "a", GPU: 3, LocalRank: 1, NUMA: intp(1)},
			{Rank: 2, Node: "b", GPU: 0, LocalRank: 0},
			{Rank: 3, Node: "b", GPU: 1, LocalRank: 1},
		},
		Nodes: []events.NodePlacement{
			{Node: "a", GPUs: []int{2, 3}, CUDAVisibleDevices: "2,3"},
			{Node: "b", GPUs: []int{0, 1}, CUDAVisibleDevices: "0,1"},
		},
	}
}

func envMap(env []string) map[string]string {
	m := map[string]string{}
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		m[k] = v
	}
	return m
}

func TestMakePlan(t *testing.T) {
	t.Parallel()
	bin := t.TempDir()
	prog := filepath.Join(bin, "train")
	if err := os.WriteFile(prog, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bin, "data.txt"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	tuning := &events.RuntimeTuning{JobID: "j1", Env: events.TuningEnv{
		All:   map[string]string{"NCCL_ALGO": "allreduce:tree", "FROM_TUNING": "all"},
		Nodes: map[string]map[string]string{"a": {"NCCL_TOPO_FILE": "/tmp/toposched/j1/a.xml"}},
		Ranks: map[string]map[string]string{"1": {"NCCL_IB_HCA": "=mlx5_1", "RANK": "99"}},
	}, Files: []events.TuningFile{{Node: "a", Path: "/tmp/toposched/j1/a.xml", Content: "<system/>"}, {Node: "b", Path: "/x", Content: "y"}}}
	base := []string{"PATH=" + bin, "HOME=/home/u", "FROM_TUNING=base"}

	t.Run("environment per rank", func(t *testing.T) {
		t.Parallel()
		job := &events.JobSubmitted{JobID: "j1", GPUs: 4, Command: "train", Args: []string{"--steps", "3"},
			Env: []string{"FROM_TUNING=job", "MASTER_PORT=1234", "EMPTY="}, Workdir: bin}
		p, err := makePlan(planInput{node: "a", gpus: []int{0, 1, 2, 3}, job: job, decision: twoNodes(), tuning: tuning,
			masterAddr: "10.0.0.1", baseEnv: base, numactl: "/usr/bin/numactl", numaNodes: func(n int) bool { return n == 0 },
			telemetryURL: "http://127.0.0.1:9/v1/telemetry", telemetryToken: "t1"})
		if err != nil {
			t.Fatal(err)
		}
		if len(p.ranks) != 2 {
			t.Fatalf("%d ranks planned on a, want 2", len(p.ranks))
		}
		r0, r1 := p.ranks[0], p.ranks[1]
		if want := []string{"/usr/bin/numactl", "--cpunodebind=0", "--membind=0", prog, "--steps", "3"}; !slices.Equal(r0.argv, want) {
			t.Errorf("rank 0 argv %q, want %q", r0.argv, want)
		}
		// NUMA node 1 does not exist here: not bound, and said so.
		if want := []string{prog, "--steps", "3"}; !slices.Equal(r1.argv, want) {
			t.Errorf("rank 1 argv %q, want %q", r1.argv, want)
		}
		if len(p.warnings) != 1 || !strings.Contains(p.warnings[0], "NUMA node 1") {
			t.Errorf("warnings %q", p.warnings)
		}
		e1 := envMap(r1.env)
		for k, v := range map[string]string{
			"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "0",
			"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "1234", "CUDA_VISIBLE_DEVICES": "2,3", "TOPOSCHED_GPU": "3",
			"NCCL_ALGO": "allreduce:tree", "NCCL_TOPO_FILE": "/tmp/toposched/j1/a.xml", "NCCL_IB_HCA": "=mlx5_1",
			"FROM_TUNING": "job", "HOME": "/home/u", "EMPTY": "",
			"TOPOSCHED_TELEMETRY_URL": "http://127.0.0.1:9/v1/telemetry", "TOPOSCHED_TELEMETRY_TOKEN": "t1",
		} {
			if got, ok := e1[k]; !ok || got != v {
				t.Errorf("rank 1: %s=%q (set %v), want %q", k, got, ok, v)
			}
		}
		if envMap(r0.env)["NCCL_IB_HCA"] != "" {
			t.Errorf("rank 0 got rank 1's NCCL_IB_HCA")
		}
		if r0.dir != bin {
			t.Errorf("dir %q, want %q", r0.dir, bin)
		}
		if len(p.files) != 1 || p.files[0].Node != "a" {
			t.Errorf("files %v, want node a's only", p.files)
		}
	})

	t.Run("master port is the decision's on every node", func(t *testing.T) {
		t.Parallel()
		job := &events.JobSubmitted{JobID: "j1", GPUs: 4, Command: prog}
		withPort := twoNodes()
		withPort.Launch = &events.Launch{MasterAddr: "a", MasterPort: 29777}
		for _, tc := range []struct {
			name string
			d    *events.PlacementDecided
			want string
		}{
			{"carried in the decision", withPort, "29777"},
			// Made before decisions carried it: the same rule, rank 0
			// being on a's GPU 2.
			{"an older decision", twoNodes(), "29502"},
		} {
			var ports []string
			for _, node := range []string{"a", "b"} {
				p, err := makePlan(planInput{node: node, job: job, decision: tc.d, masterAddr: "m", baseEnv: base})
				if err != nil {
					t.Fatal(err)
				}
				for _, r := range p.ranks {
					ports = append(ports, envMap(r.env)["MASTER_PORT"])
				}
			}
			if len(ports) != 4 || slices.ContainsFunc(ports, func(p string) bool { return p != tc.want }) {
				t.Errorf("%s: ports %v, want %s for every rank", tc.name, ports, tc.want)
			}
		}
	})

	for _, tc := range []struct {
		name      string
		job       events.JobSubmitted
		node      string
		gpus      []int
		wantField string
		wantErr   string
	}{
		{name: "command not in PATH", job: events.JobSubmitted{Command: "no-such-program"}, wantField: "command",
			wantErr: "command: no-such-program: not found in the PATH of the agent's environment"},
		{name: "command not in the job's PATH", job: events.JobSubmitted{Command: "no-such-program", Env: []string{"PATH=/nowhere"}}, wantField: "command",
			wantErr: "command: no-such-program: not found in the PATH the job's env sets"},
		{name: "command odd", job: events.JobSubmitted{Command: "/no/\"such\"\n"}, wantField: "command", wantErr: `command: "/no/\"such\"\n": no such file or directory`},
		{name: "command NUL", job: events.JobSubmitted{Command: "train\x00x"}, wantField: "command", wantErr: "command: contains a NUL byte"},
		{name: "args NUL", job: events.JobSubmitted{Command: "train", Args: []string{"a", "b", "c", "d\x00"}}, wantField: "args[3]", wantErr: "args[3]: contains a NUL byte"},
		{name: "env NUL", job: events.JobSubmitted{Command: "train", Env: []string{"A=1", "B=\x00"}}, wantField: "env[1]", wantErr: "env[1]: contains a NUL byte"},
		{name: "workdir NUL", job: events.JobSubmitted{Command: "train", Workdir: "/tmp\x00"}, wantField: "workdir", wantErr: "workdir: contains a NUL byte"},
		{name: "workdir relative", job: events.JobSubmitted{Command: "train", Workdir: "srv/train"}, wantField: "workdir", wantErr: "workdir: srv/train: not an absolute path"},
		{name: "workdir dot", job: events.JobSubmitted{Command: "train", Workdir: "."}, wantField: "workdir", wantErr: "not an absolute path"},
		{name: "command path missing", job: events.JobSubmitted{Command: "/no/such/program"}, wantField: "command", wantErr: "no such file"},
		{name: "command not executable", job: events.JobSubmitted{Command: "./data.txt", Workdir: bin}, wantField: "command", wantErr: "permission denied"},
		{name: "command a directory", job: events.JobSubmitted{Command: bin}, wantField: "command", wantErr: "is a directory"},
		{name: "workdir missing", job: events.JobSubmitted{Command: "train", Workdir: "/no/such/dir"}, wantField: "workdir", wantErr: "no such file"},
		{name: "workdir a file", job: events.JobSubmitted{Command: "train", Workdir: prog}, wantField: "workdir", wantErr: "not a directory"},
		{name: "env without =", job: events.JobSubmitted{Command: "train", Env: []string{"A=1", "B"}}, wantField: "env[1]", wantErr: "NAME=value"},
		{name: "env bad name", job: events.JobSubmitted{Command: "train", Env: []string{"1A=1"}}, wantField: "env[0]", wantErr: "NAME=value"},
		{name: "GPU the node lacks", job: events.JobSubmitted{Command: "train"}, gpus: []int{0, 1}, wantField: "ranks[0].gpu", wantErr: "GPU 2 is not one of node a's GPUs"},
		{name: "no rank here", job: events.JobSubmitted{Command: "train"}, node: "c", wantField: "ranks", wantErr: "no rank on node c"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			node := tc.node
			if node == "" {
				node = "a"
			}
			job := tc.job
			job.JobID = "j1"
			_, err := makePlan(planInput{node: node, gpus: tc.gpus, job: &job, decision: twoNodes(), masterAddr: "m", baseEnv: base})
			var le *launchError
			if !errors.As(err, &le) {
				t.Fatalf("err = %v, want a launch error", err)
			}
			if le.field != tc.wantField || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("err = %v (field %q), want field %q and %q", err, le.field, tc.wantField, tc.wantErr)
			}
			// The agent's PATH is its own: the log may have it, the
			// submitter may not.
			if leaked := strings.Contains(err.Error(), bin) && !strings.Contains(fmt.Sprint(tc.job), bin); leaked || strings.Contains(err.Error(), "stat ") {
				t.Errorf("err = %v: names the agent's PATH or its calls", err)
			}
		})
	}
}
