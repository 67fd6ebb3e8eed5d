package nvsmi

import (
	"os"
	"strings"
	"testing"

	"github.com/toposched/toposched/internal/topology"
)

// The -p2p matrices of the real files read as printed, and a text with
// read and write matrices takes a pair as off where either says so.
func TestParseP2P(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, file, in string
		want           string // the off-diagonal cell GPU0-GPU1, "" for no matrix
	}{
		{name: "ns", file: "rtx2080ti-2gpu-pix-p2p-ns_anthony-hoo-autodl.txt", want: "NS"},
		{name: "gns", file: "rtx5090-2gpu-phb-threadripper-no-p2p_club-3090-issue-1133.txt", want: "GNS"},
		{name: "ok", file: "rtx3090-2gpu-phb-single-socket_club-3090-issue-922.txt", want: "OK"},
		{name: "none", file: "t4-4gpu-2socket-sys-node_nccl-issue-428.txt"},
		{name: "read ok, write off", in: " \tGPU0\tGPU1\n GPU0\tX\tOK\n GPU1\tOK\tX\n\n \tGPU0\tGPU1\n GPU0\tX\tCNS\n GPU1\tCNS\tX\n", want: "CNS"},
		{name: "off then ok", in: "GPU0 GPU1\nGPU0 X TNS\nGPU1 TNS X\nGPU0 GPU1\nGPU0 X OK\nGPU1 OK X\n", want: "TNS"},
		{name: "crlf", in: "\tGPU0\tGPU1\r\nGPU0\tX\tNS\r\nGPU1\tNS\tX\r\n", want: "NS"},
		{name: "unknown", in: "GPU0 GPU1\nGPU0 X U\nGPU1 U X\n", want: "U"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			data := []byte(tc.in)
			if tc.file != "" {
				var err error
				if data, err = os.ReadFile("testdata/" + tc.file); err != nil {
					t.Fatal(err)
				}
			}
			m, err := ParseP2P("in.txt", data)
			if err != nil {
				t.Fatal(err)
			}
			if tc.want == "" {
				if m != nil {
					t.Fatalf("matrix %v, want none", m)
				}
				return
			}
			if len(m) != 2 || m[0][1].String() != tc.want || m[1][0].String() != tc.want || m[0][0] != topology.P2PSelf {
				t.Fatalf("matrix %v, want X/%s", m, tc.want)
			}
		})
	}
}

// A P2P matrix that is there but malformed is refused with the file, the
// line and what is wrong.
func TestParseP2PBadInput(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, in, want string }{
		{"cut", "GPU0 GPU1\nGPU0 X NS\n", "in.txt:3: p2p matrix: expected row GPU1"},
		{"short row", "GPU0 GPU1\nGPU0 X NS\nGPU1 NS\n", "in.txt:3: p2p matrix row GPU1 has 1 cells for 2 GPUs"},
		{"bad cell", "GPU0 GPU1\nGPU0 X NS\nGPU1 YES X\n", `in.txt:3: p2p matrix row GPU1, column GPU0: "YES"`},
		{"self off diagonal", "GPU0 GPU1\nGPU0 X X\nGPU1 X X\n", "in.txt:2: p2p matrix GPU0-GPU1: X is not allowed there"},
		{"sizes differ", "GPU0 GPU1\nGPU0 X NS\nGPU1 NS X\nGPU0\nGPU0 X\n", "in.txt:4: p2p matrix of 1 GPUs after one of 2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			m, err := ParseP2P("in.txt", []byte(tc.in))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, %v; want an error containing %q", m, err, tc.want)
			}
		})
	}
}

func FuzzParseP2P(f *testing.F) {
	for _, file := range inputs(f, true, true) {
		data, err := os.ReadFile(file)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Add([]byte("GPU0 GPU1\nGPU0 X NS\nGPU1 NS X\nGPU0 GPU1\nGPU0 X OK\nGPU1 OK X\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := ParseP2P("fuzz.txt", data)
		if err != nil {
			if m != nil || !strings.Contains(err.Error(), "fuzz.txt:") {
				t.Fatalf("matrix %v with error %v (or the error names no file and line)", m, err)
			}
			return
		}
		for i, row := range m {
			if len(row) != len(m) {
				t.Fatalf("row %d has %d cells for %d GPUs", i, len(row), len(m))
			}
			for j, s := range row {
				if (i == j) != (s == topology.P2PSelf) {
					t.Fatalf("GPU%d-GPU%d is %s", i, j, s)
				}
			}
		}
	})
}
