package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

func run(t *testing.T, args ...string) string {
	t.Helper()
	var out bytes.Buffer
	root := newRoot()
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs(args)
	if err := root.Execute(); err != nil {
		t.Fatalf("topoctl %s: %v\n%s", strings.Join(args, " "), err, out.String())
	}
	return out.String()
}

func TestTopologyOffline(t *testing.T) {
	t.Parallel()
	smi := "../../internal/formats/nvsmi/testdata/a100-sxm-8gpu-nv12-17nic_xuesongtap-blog.txt"
	cluster := "../../deploy/examples/cluster.yaml"
	tests := []struct {
		args []string
		want []string
	}{
		{[]string{"topology", "matrix", "--file", smi}, []string{"GPU0  X", "NV12", "GPU0: NUMA 0, nearest NIC mlx5_2 (NIC0, PXB)", "GPU1: NUMA 0, nearest NIC mlx5_3 (NIC1, PXB)"}},
		{[]string{"topology", "matrix", "dgx-a100-002", "--cluster", cluster, "--bandwidth"}, []string{"NV12/300", "GPU4: NUMA 7"}},
		{[]string{"topology", "show", "--cluster", cluster}, []string{"spine spine-1", "leaf leaf-2", "node pcie-l40s-002: 4 x L40S", "GPU3 free, nearest NIC mlx5_3 (PXB)"}},
	}
	for _, tc := range tests {
		out := run(t, tc.args...)
		for _, w := range tc.want {
			if !strings.Contains(out, w) {
				t.Errorf("topoctl %s: output lacks %q:\n%s", strings.Join(tc.args, " "), w, out)
			}
		}
	}
	var m struct {
		GPUs []struct {
			Index      int    `json:"index"`
			NUMA       int    `json:"numa"`
			NearestNIC string `json:"nearest_nic"`
		} `json:"gpus"`
		NICs   []struct{ Name string } `json:"nics"`
		Matrix [][]string              `json:"matrix"`
	}
	if err := json.Unmarshal([]byte(run(t, "topology", "matrix", "--file", smi, "-o", "json")), &m); err != nil {
		t.Fatal(err)
	}
	if len(m.GPUs) != 8 || len(m.NICs) != 17 || m.Matrix[0][1] != "NV12" || m.Matrix[0][8] != "PXB" || m.GPUs[2].NearestNIC != "mlx5_6" {
		t.Fatalf("json %+v", m)
	}
}
