//go:build nvml && cgo

package nvml

import (
	"bytes"
	"encoding/json"
	"os"
	"testing"

	"github.com/toposched/toposched/internal/topology"
)

// TestRealGPU discovers the machine it runs on through the system's NVML:
//
//	TOPOSCHED_REAL_NVML=1 go test -tags nvml -run TestRealGPU -v ./services/discovery/nvml/
//
// Compare its matrix with `nvidia-smi topo -m`.
func TestRealGPU(t *testing.T) {
	if os.Getenv("TOPOSCHED_REAL_NVML") != "1" {
		t.Skip("set TOPOSCHED_REAL_NVML=1 to discover this machine's GPUs through NVML")
	}
	n, err := Discover(Library(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Validate(); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := topology.WriteMatrix(&buf, n, topology.DefaultBandwidths()); err != nil {
		t.Fatal(err)
	}
	t.Logf("node %s: %d GPUs, %d NICs, NVLink gen %d, PCIe gen %d, %d NVSwitches\n%s",
		n.Name, len(n.GPUs), len(n.NICs), n.NVLinkGen, n.PCIeGen, n.NVSwitches, buf.String())
	js, _ := json.MarshalIndent(n.GPUs, "", "  ")
	t.Logf("GPUs: %s", js)
	if len(n.GPUs) == 0 {
		t.Error("NVML lists no GPU")
	}
	for _, g := range n.GPUs {
		if g.UUID == "" || g.BusID == "" {
			t.Errorf("GPU%d lacks a UUID or bus id: %+v", g.Index, g)
		}
	}
}
