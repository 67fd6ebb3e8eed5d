package topology

import (
	"reflect"
	"testing"
)

// healthNode builds a node from nvidia-smi cells: gpu is the GPU matrix,
// nic the GPU-NIC matrix (nil for none).
func healthNode(t *testing.T, gpu, nic [][]string) *Node {
	t.Helper()
	parse := func(m [][]string) [][]Link {
		if m == nil {
			return nil
		}
		out := make([][]Link, len(m))
		for i, row := range m {
			out[i] = make([]Link, len(row))
			for j, s := range row {
				l, err := ParseLink(s)
				if err != nil {
					t.Fatal(err)
				}
				out[i][j] = l
			}
		}
		return out
	}
	n := &Node{Name: "n", GPUPaths: parse(gpu), NICPaths: parse(nic), NVLinkGen: 3}
	for i := range gpu {
		n.GPUs = append(n.GPUs, GPU{Index: i, NUMA: -1})
	}
	if nic != nil {
		for k := range nic[0] {
			n.NICs = append(n.NICs, NIC{Index: k, Name: "mlx5_" + string(rune('0'+k)), NUMA: -1})
		}
	}
	if err := n.Validate(); err != nil {
		t.Fatal(err)
	}
	return n
}

func render(m [][]Link) [][]string {
	out := make([][]string, len(m))
	for i, row := range m {
		out[i] = make([]string, len(row))
		for j, l := range row {
			out[i][j] = l.String()
		}
	}
	return out
}

// nvswitch4 is an NVSwitch node of four GPUs, every pair NV12.
var nvswitch4 = [][]string{
	{"X", "NV12", "NV12", "NV12"},
	{"NV12", "X", "NV12", "NV12"},
	{"NV12", "NV12", "X", "NV12"},
	{"NV12", "NV12", "NV12", "X"},
}

func TestWithHealthNVLinks(t *testing.T) {
	t.Parallel()
	// A DGX-1-like corner: 0-1 NV2, 1-2 NV1, 0-2 NVB, 3 on PCIe only.
	hybrid := [][]string{
		{"X", "NV2", "NVB", "PIX"},
		{"NV2", "X", "NV1", "PXB"},
		{"NVB", "NV1", "X", "SYS"},
		{"PIX", "PXB", "SYS", "X"},
	}
	tests := []struct {
		name   string
		matrix [][]string
		down   map[int]int
		want   [][]string
	}{
		{
			name:   "one link down on an NVSwitch node degrades that GPU's pairs only",
			matrix: nvswitch4,
			down:   map[int]int{2: 1},
			want: [][]string{
				{"X", "NV12", "NV11", "NV12"},
				{"NV12", "X", "NV11", "NV12"},
				{"NV11", "NV11", "X", "NV11"},
				{"NV12", "NV12", "NV11", "X"},
			},
		},
		{
			name:   "down links of both ends add up",
			matrix: nvswitch4,
			down:   map[int]int{0: 2, 3: 1},
			want: [][]string{
				{"X", "NV10", "NV10", "NV9"},
				{"NV10", "X", "NV12", "NV11"},
				{"NV10", "NV12", "X", "NV11"},
				{"NV9", "NV11", "NV11", "X"},
			},
		},
		{
			name:   "every link of a GPU down: its pairs fall back to SYS",
			matrix: nvswitch4,
			down:   map[int]int{1: 12},
			want: [][]string{
				{"X", "SYS", "NV12", "NV12"},
				{"SYS", "X", "SYS", "SYS"},
				{"NV12", "SYS", "X", "NV12"},
				{"NV12", "SYS", "NV12", "X"},
			},
		},
		{
			name:   "NVB with a down end falls back to SYS; PCIe paths stay",
			matrix: hybrid,
			down:   map[int]int{2: 1},
			want: [][]string{
				{"X", "NV2", "SYS", "PIX"},
				{"NV2", "X", "SYS", "PXB"},
				{"SYS", "SYS", "X", "SYS"},
				{"PIX", "PXB", "SYS", "X"},
			},
		},
		{
			name:   "a down link on a GPU without NVLink changes nothing",
			matrix: hybrid,
			down:   map[int]int{3: 4},
			want:   hybrid,
		},
		{
			name:   "unknown positions and zero counts are ignored",
			matrix: nvswitch4,
			down:   map[int]int{-1: 3, 4: 2, 0: 0},
			want:   nvswitch4,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			n := healthNode(t, tt.matrix, nil)
			got := n.WithHealth(tt.down, nil)
			if g := render(got.GPUPaths); !reflect.DeepEqual(g, tt.want) {
				t.Errorf("paths\n got %v\nwant %v", g, tt.want)
			}
			if err := got.Validate(); err != nil {
				t.Errorf("degraded node does not validate: %v", err)
			}
			if g := render(n.GPUPaths); !reflect.DeepEqual(g, tt.matrix) {
				t.Errorf("original changed: %v", g)
			}
			// Healthy again: the reported node's matrix, untouched.
			if back := n.WithHealth(nil, nil); !reflect.DeepEqual(back, n) {
				t.Errorf("nothing down: %+v, want the node as it was", back)
			}
		})
	}
}

func TestWithHealthNICs(t *testing.T) {
	t.Parallel()
	// GPU0 and GPU1 sit under one switch with NIC0; NIC1 is across the
	// socket.
	gpus := [][]string{{"X", "PIX"}, {"PIX", "X"}}
	nics := [][]string{{"PIX", "SYS"}, {"PIX", "SYS"}}
	tests := []struct {
		name string
		down map[int]bool
		want []int // NearestNIC of GPU0, GPU1
	}{
		{"all up", nil, []int{0, 0}},
		{"nearest down: the next one", map[int]bool{0: true}, []int{1, 1}},
		{"the far one down: no change", map[int]bool{1: true}, []int{0, 0}},
		{"both down: none", map[int]bool{0: true, 1: true}, []int{-1, -1}},
		{"up again", map[int]bool{0: false}, []int{0, 0}},
		{"unknown NIC ignored", map[int]bool{7: true, -1: true}, []int{0, 0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			n := healthNode(t, gpus, nics)
			got := n.WithHealth(nil, tt.down)
			for g, want := range tt.want {
				if k := got.NearestNIC(g); k != want {
					t.Errorf("NearestNIC(%d) = %d, want %d", g, k, want)
				}
				if k := n.NearestNIC(g); k != 0 {
					t.Errorf("original NearestNIC(%d) = %d, want 0", g, k)
				}
			}
			if !reflect.DeepEqual(got.GPUPaths, n.GPUPaths) {
				t.Error("a NIC down changed the GPU matrix")
			}
		})
	}
}

// TestWithHealthSharesWhatItKeeps checks the copy shares the matrices
// nothing changed, and never the ones it changed.
func TestWithHealthSharesWhatItKeeps(t *testing.T) {
	t.Parallel()
	n := healthNode(t, nvswitch4, [][]string{{"PIX"}, {"PIX"}, {"SYS"}, {"SYS"}})
	c := n.WithHealth(map[int]int{0: 1}, nil)
	if &c.NICPaths[0][0] != &n.NICPaths[0][0] {
		t.Error("NIC matrix copied though no NIC is down")
	}
	if &c.GPUPaths[0][0] == &n.GPUPaths[0][0] {
		t.Error("GPU matrix shared though a link is down")
	}
	c = n.WithHealth(nil, map[int]bool{0: true})
	if &c.GPUPaths[0][0] != &n.GPUPaths[0][0] || &c.NICPaths[0][0] == &n.NICPaths[0][0] {
		t.Error("wrong matrix copied for a NIC down")
	}
}
