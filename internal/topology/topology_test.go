package topology

import (
	"bytes"
	"reflect"
	"strings"
	"testing"
)

func TestParseLink(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in   string
		want Link
		err  bool
	}{
		{"X", Link{Class: Self}, false},
		{"NV12", Link{Class: NV, NVLinks: 12}, false},
		{"nv4", Link{Class: NV, NVLinks: 4}, false},
		{"NVB", Link{Class: NVB}, false},
		{"PIX", Link{Class: PIX}, false},
		{"PXB", Link{Class: PXB}, false},
		{"PHB", Link{Class: PHB}, false},
		{"NODE", Link{Class: NODE}, false},
		{"SYS", Link{Class: SYS}, false},
		{"SOC", Link{Class: SYS}, false},
		{"NV", Link{}, true},
		{"NV0", Link{}, true},
		{"FOO", Link{}, true},
		{"", Link{}, true},
	}
	for _, tc := range tests {
		got, err := ParseLink(tc.in)
		if (err != nil) != tc.err || got != tc.want {
			t.Errorf("ParseLink(%q) = %v, %v", tc.in, got, err)
		}
		if err == nil && tc.in != "SOC" && !strings.EqualFold(got.String(), tc.in) {
			t.Errorf("%q renders as %q", tc.in, got)
		}
	}
}

func TestClassOrderIsBestFirst(t *testing.T) {
	t.Parallel()
	order := []Class{Self, NV, NVB, PIX, PXB, PHB, NODE, SYS, NET}
	for i := 1; i < len(order); i++ {
		if order[i-1] >= order[i] {
			t.Fatalf("%s must sort before %s", order[i-1], order[i])
		}
	}
}

// Two sockets, two GPUs each; GPU0-1 share a PCIe switch with NIC0.
func sample() *Node {
	l := func(s string) Link {
		v, err := ParseLink(s)
		if err != nil {
			panic(err)
		}
		return v
	}
	rows := [][]string{
		{"X", "PIX", "SYS", "SYS"},
		{"PIX", "X", "SYS", "SYS"},
		{"SYS", "SYS", "X", "NV4"},
		{"SYS", "SYS", "NV4", "X"},
	}
	n := &Node{NVLinkGen: 3, PCIeGen: 4}
	for i, r := range rows {
		n.GPUs = append(n.GPUs, GPU{Index: i, NUMA: i / 2})
		var row []Link
		for _, c := range r {
			row = append(row, l(c))
		}
		n.GPUPaths = append(n.GPUPaths, row)
	}
	n.NICs = []NIC{{Index: 0, Name: "mlx5_0", NUMA: 0}, {Index: 1, Name: "mlx5_1", NUMA: 1}}
	n.NICPaths = [][]Link{{l("PIX"), l("SYS")}, {l("PIX"), l("SYS")}, {l("SYS"), l("PHB")}, {l("SYS"), l("NODE")}}
	return n
}

func TestNodePathsAndNearestNIC(t *testing.T) {
	t.Parallel()
	n := sample()
	if err := n.Validate(); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		a, b int
		gbps float64
	}{
		{0, 1, 31.5}, // PCIe gen 4 x16
		{2, 3, 100},  // 4 NVLink 3 links
		{0, 2, 20.8}, // SMP bound
	}
	for _, tc := range tests {
		if got := n.Path(tc.a, tc.b, nil).BandwidthGBps; got != tc.gbps {
			t.Errorf("GPU%d-GPU%d: %v GB/s, want %v", tc.a, tc.b, got, tc.gbps)
		}
	}
	for g, want := range []int{0, 0, 1, 1} {
		if got := n.NearestNIC(g); got != want {
			t.Errorf("nearest NIC of GPU%d = %d, want %d", g, got, want)
		}
	}
}

func TestValidateFindsBadMatrices(t *testing.T) {
	t.Parallel()
	n := sample()
	n.GPUPaths[0][1] = Link{Class: PXB}
	n.GPUPaths[2][2] = Link{Class: SYS}
	err := n.Validate()
	if err == nil || !strings.Contains(err.Error(), "GPU0-GPU1") || !strings.Contains(err.Error(), "GPU2-GPU2") {
		t.Fatalf("Validate() = %v", err)
	}
}

func TestWriteMatrix(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	if err := WriteMatrix(&buf, sample(), nil); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for _, want := range []string{"GPU0  X     PIX", "NV4", "GPU3: NUMA 1, nearest NIC mlx5_1 (NIC1, NODE)"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	j := sample().JSON()
	if j.Matrix[2][3] != "NV4" || j.Matrix[0][4] != "PIX" || j.GPUs[3].NearestNIC != "mlx5_1" {
		t.Errorf("JSON %+v", j)
	}
}

func TestEventRoundTrip(t *testing.T) {
	t.Parallel()
	n := sample()
	n.Name, n.Source = "s", "sample"
	for i := range n.NICs {
		n.NICs[i].Index = i
	}
	back, err := FromEvent(n.Event())
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back, n) {
		t.Fatalf("round trip:\n%+v\n%+v", back, n)
	}
	ev := n.Event()
	ev.GPUPaths[0][1] = "WAT"
	if _, err := FromEvent(ev); err == nil || !strings.Contains(err.Error(), "gpu_paths: [0][1]") {
		t.Fatalf("bad cell: %v", err)
	}
}

// The P2P matrix and the CPU travel in topology.node: placement prices
// the pairs NCCL moves through host memory only if they arrive.
func TestEventCarriesP2PAndCPU(t *testing.T) {
	t.Parallel()
	n := sample()
	n.Name, n.Source = "s", "sample"
	for i := range n.NICs {
		n.NICs[i].Index = i
	}
	g := len(n.GPUs)
	n.P2P = make([][]P2PStatus, g)
	for i := range g {
		n.P2P[i] = make([]P2PStatus, g)
		for j := range g {
			n.P2P[i][j] = P2PNotSupported
			if i == j {
				n.P2P[i][j] = P2PSelf
			}
		}
	}
	n.CPU = CPU{Arch: "x86_64", Vendor: "GenuineIntel", Family: 6, Model: 85}
	back, err := FromEvent(n.Event())
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back, n) {
		t.Fatalf("round trip:\n%+v\n%+v", back, n)
	}
	ev := n.Event()
	ev.P2P[0][1] = "MAYBE"
	if _, err := FromEvent(ev); err == nil || !strings.Contains(err.Error(), "p2p[0][1]") {
		t.Fatalf("bad cell: %v", err)
	}
}
