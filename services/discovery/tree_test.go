package discovery

import (
	"bytes"
	"os"
	"path/filepath"
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
