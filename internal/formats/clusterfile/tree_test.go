package clusterfile

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestWriteTreeGolden(t *testing.T) {
	t.Parallel()
	c, err := LoadCluster(filepath.Join("testdata", "lab.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	state := func(node string, gpu int) string {
		if node == "dgx-a100-001" && gpu < 2 {
			return "used by job-1"
		}
		return "free"
	}
	if err := WriteTree(&buf, c, state); err != nil {
		t.Fatal(err)
	}
	golden := filepath.Join("testdata", "lab.tree.golden")
	if *update {
		if err := os.WriteFile(golden, buf.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if buf.String() != string(want) {
		t.Errorf("tree differs from %s (run with -update):\n%s", golden, buf.String())
	}
}

func TestWriteDot(t *testing.T) {
	t.Parallel()
	c, err := LoadCluster(filepath.Join("testdata", "lab.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	state := func(node string, gpu int) string {
		if node == "dgx-a100-001" && gpu == 0 {
			return "unhealthy (xid 79)"
		}
		return "free"
	}
	if err := WriteDot(&buf, c, state); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for _, want := range []string{
		`graph "lab" {`,
		`"sw:spine-1" -- "sw:leaf-1";`,
		`"gpu:dgx-a100-001/0" [shape=box, style=filled, fillcolor=tomato`,
		`"gpu:dgx-a100-001/7" -- "nvswitch:dgx-a100-001" [label="NV12"`,
		`"gpu:dgx-a100-002/3" -- "nic:dgx-a100-002/mlx5_3" [style=dashed, label="PXB"];`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("dot output lacks %s", want)
		}
	}
	if strings.Count(out, "{") != strings.Count(out, "}") {
		t.Error("unbalanced braces")
	}
}
