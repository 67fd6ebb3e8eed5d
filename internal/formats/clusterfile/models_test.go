package clusterfile

import (
	"testing"

	"github.com/toposched/toposched/internal/topology"
)

func TestModels(t *testing.T) {
	t.Parallel()
	tests := []struct {
		model      string
		pair       [2]int
		class      string
		nearestNIC map[int]string
		numa       map[int]int
	}{
		{"dgx-a100", [2]int{0, 7}, "NV12", map[int]string{0: "mlx5_0", 1: "mlx5_1", 4: "mlx5_6", 7: "mlx5_9"}, map[int]int{0: 3, 2: 1, 4: 7, 6: 5}},
		{"dgx-h100", [2]int{1, 6}, "NV18", map[int]string{0: "mlx5_0", 5: "mlx5_5"}, map[int]int{0: 0, 7: 1}},
		{"hgx-h100", [2]int{0, 1}, "NV18", map[int]string{3: "mlx5_3"}, nil},
		{"pcie-8gpu", [2]int{0, 1}, "PIX", map[int]string{0: "mlx5_0", 3: "mlx5_0", 6: "mlx5_1"}, map[int]int{3: 0, 4: 1}},
		{"pcie-8gpu", [2]int{0, 2}, "NODE", nil, nil},
		{"pcie-8gpu", [2]int{0, 4}, "SYS", nil, nil},
	}
	for _, tc := range tests {
		t.Run(tc.model, func(t *testing.T) {
			t.Parallel()
			n, err := Model(tc.model)
			if err != nil {
				t.Fatal(err)
			}
			if got := n.GPUPaths[tc.pair[0]][tc.pair[1]].String(); got != tc.class {
				t.Errorf("GPU%d-GPU%d = %s, want %s", tc.pair[0], tc.pair[1], got, tc.class)
			}
			for g, want := range tc.nearestNIC {
				if k := n.NearestNIC(g); k < 0 || n.NICs[k].Name != want {
					t.Errorf("nearest NIC of GPU%d = %d, want %s", g, k, want)
				}
			}
			for g, want := range tc.numa {
				if n.GPUs[g].NUMA != want {
					t.Errorf("GPU%d NUMA %d, want %d", g, n.GPUs[g].NUMA, want)
				}
			}
		})
	}
	for name := range Models() {
		if _, err := Model(name); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	if _, err := Model("dgx-z9"); err == nil {
		t.Error("unknown model accepted")
	}
}

// The dgx-a100 model matches what a real DGX A100 prints for the rows the
// project has (NVIDIA/nccl issue 1505, nvsmi/testdata/dgx-a100-40gb-8gpu-
// 12nic_nccl-issue-1505.partial.txt: GPU0-3 NV12 to all, PXB to their
// pair's compute NICs, NUMA 3,3,1,1).
func TestDGXA100MatchesRealRows(t *testing.T) {
	t.Parallel()
	n, err := Model("dgx-a100")
	if err != nil {
		t.Fatal(err)
	}
	for g, numa := range []int{3, 3, 1, 1} {
		if n.GPUs[g].NUMA != numa {
			t.Errorf("GPU%d NUMA %d, want %d", g, n.GPUs[g].NUMA, numa)
		}
		for k := range n.NICs {
			want := topology.SYS
			if k/2 == g/2 {
				want = topology.PXB
			}
			if n.NICPaths[g][k].Class != want {
				t.Errorf("GPU%d-NIC%d = %s, want %s", g, k, n.NICPaths[g][k], want)
			}
		}
	}
}
