package nvsmi

// The P2P matrix: `nvidia-smi topo -p2p r|w|n|a|p` prints a header of
// GPU0 .. GPUn-1, one row per GPU of X and statuses (OK, NS, CNS, GNS,
// TNS, DRK, U), then a legend. NCCL takes a pair as P2P-capable only where
// NVML's read and write statuses are both OK (src/graph/paths.cc,
// ncclTopoCheckP2p), so where a text holds several matrices (r and w, or
// a P2P one and p) a pair is off when any of them says so.

import (
	"fmt"
	"strings"

	"github.com/toposched/toposched/internal/topology"
)

// ParseP2P reads every `nvidia-smi topo -p2p` matrix in data and returns
// their combination: a pair is off where any matrix says it is, OK where
// one says OK and none says off, unknown otherwise. It returns nil and no
// error when data holds no such matrix, and an error naming the file and
// line of a matrix that is there but malformed.
func ParseP2P(file string, data []byte) ([][]topology.P2PStatus, error) {
	lines := strings.Split(strings.ReplaceAll(string(data), "\r\n", "\n"), "\n")
	var out [][]topology.P2PStatus
	for i := 0; i < len(lines); i++ {
		g := p2pHeader(lines[i])
		if g == 0 {
			continue
		}
		m, err := p2pRows(file, lines, i+1, g)
		if err != nil {
			return nil, err
		}
		if m == nil {
			continue // a header-like line not followed by P2P rows
		}
		if out != nil && len(out) != g {
			return nil, fmt.Errorf("%s:%d: p2p matrix of %d GPUs after one of %d", file, i+1, g, len(out))
		}
		out = mergeP2P(out, m)
		i += g
	}
	return out, nil
}

// p2pHeader is the GPU count of a P2P matrix's header line (GPU0 GPU1 ...
// and nothing else), 0 for any other line.
func p2pHeader(l string) int {
	f := strings.Fields(l)
	if len(f) == 0 {
		return 0
	}
	for k, s := range f {
		if s != fmt.Sprintf("GPU%d", k) {
			return 0
		}
	}
	return len(f)
}

// p2pRows reads the g rows after a header at lines[from]. It returns nil
// when the first row is not a P2P row (the header was something else),
// and an error when a later row is cut or holds a cell that is no status.
func p2pRows(file string, lines []string, from, g int) ([][]topology.P2PStatus, error) {
	m := make([][]topology.P2PStatus, g)
	for r := range g {
		ln := from + r
		var f []string
		if ln < len(lines) {
			f = strings.Fields(lines[ln])
		}
		if len(f) == 0 || f[0] != fmt.Sprintf("GPU%d", r) {
			if r == 0 {
				return nil, nil
			}
			return nil, fmt.Errorf("%s:%d: p2p matrix: expected row GPU%d, found %q", file, ln+1, r, clip(strings.TrimSpace(lineAt(lines, ln))))
		}
		if len(f)-1 != g {
			if r == 0 && !isStatus(f[1:]) {
				return nil, nil
			}
			return nil, fmt.Errorf("%s:%d: p2p matrix row GPU%d has %d cells for %d GPUs", file, ln+1, r, len(f)-1, g)
		}
		m[r] = make([]topology.P2PStatus, g)
		for c, cell := range f[1:] {
			s, err := topology.ParseP2PStatus(cell)
			if err != nil {
				if r == 0 && c == 0 {
					return nil, nil
				}
				return nil, fmt.Errorf("%s:%d: p2p matrix row GPU%d, column GPU%d: %w", file, ln+1, r, c, err)
			}
			if (r == c) != (s == topology.P2PSelf) {
				return nil, fmt.Errorf("%s:%d: p2p matrix GPU%d-GPU%d: %s is not allowed there", file, ln+1, r, c, s)
			}
			m[r][c] = s
		}
	}
	return m, nil
}

func lineAt(lines []string, i int) string {
	if i < len(lines) {
		return lines[i]
	}
	return "end of input"
}

func isStatus(f []string) bool {
	for _, s := range f {
		if _, err := topology.ParseP2PStatus(s); err != nil {
			return false
		}
	}
	return len(f) > 0
}

// mergeP2P combines two matrices of one machine: off wins, then OK.
func mergeP2P(a, b [][]topology.P2PStatus) [][]topology.P2PStatus {
	if a == nil {
		return b
	}
	for i := range a {
		for j, s := range b[i] {
			switch {
			case a[i][j].Off():
			case s.Off(), a[i][j] == topology.P2PUnknown:
				a[i][j] = s
			}
		}
	}
	return a
}
