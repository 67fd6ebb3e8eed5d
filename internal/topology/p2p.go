package topology

import (
	"fmt"
	"strings"
)

// P2PStatus is whether two GPUs of a node can reach each other's memory
// directly (CUDA peer-to-peer), as `nvidia-smi topo -p2p r|w|p|...` and
// NVML's GetP2PStatus report it. NCCL reads the same NVML status
// (src/graph/paths.cc, ncclTopoCheckP2p): a pair whose read or write
// status is not OK gets no P2P transport, and NCCL moves its data through
// host memory (the SHM transport, src/transport/shm.cc) instead.
type P2PStatus uint8

// P2P statuses, as nvidia-smi's legend names them.
const (
	// P2PUnknown is the zero value: the source did not say, or said "U".
	// The cost model takes P2P as available then.
	P2PUnknown P2PStatus = iota
	P2PSelf
	P2POK
	// P2PNotSupported is NS; the rest are the reasons nvidia-smi gives.
	P2PNotSupported
	P2PChipsetNotSupported  // CNS
	P2PGPUNotSupported      // GNS
	P2PTopologyNotSupported // TNS
	P2PDisabledByRegkey     // DRK
)

var p2pNames = [...]string{"U", "X", "OK", "NS", "CNS", "GNS", "TNS", "DRK"}

func (s P2PStatus) String() string {
	if int(s) < len(p2pNames) {
		return p2pNames[s]
	}
	return fmt.Sprintf("P2PStatus(%d)", s)
}

// Off reports whether the status says P2P is not available: any status
// but OK, self and unknown.
func (s P2PStatus) Off() bool { return s >= P2PNotSupported }

// MarshalText renders the status as nvidia-smi prints it.
func (s P2PStatus) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// UnmarshalText reads a status written by MarshalText.
func (s *P2PStatus) UnmarshalText(b []byte) error {
	v, err := ParseP2PStatus(string(b))
	if err != nil {
		return err
	}
	*s = v
	return nil
}

// ParseP2PStatus reads one cell of nvidia-smi's -p2p matrix: X, OK, NS,
// CNS, GNS, TNS, DRK or U.
func ParseP2PStatus(s string) (P2PStatus, error) {
	up := strings.ToUpper(strings.TrimSpace(s))
	for i, n := range p2pNames {
		if up == n {
			return P2PStatus(i), nil
		}
	}
	return P2PUnknown, fmt.Errorf("%q: expected X, OK, NS, CNS, GNS, TNS, DRK or U", s)
}

// P2POff reports whether the node's P2P matrix says GPUs a and b cannot
// use P2P (false where the node has no matrix: P2P is assumed, as NCCL
// assumes it when NVML cannot say).
func (n *Node) P2POff(a, b int) bool {
	if a < 0 || b < 0 || a >= len(n.P2P) || b >= len(n.P2P[a]) {
		return false
	}
	return n.P2P[a][b].Off()
}

// AnyP2POff reports whether some pair of the node's GPUs cannot use P2P.
func (n *Node) AnyP2POff() bool {
	for _, row := range n.P2P {
		for _, s := range row {
			if s.Off() {
				return true
			}
		}
	}
	return false
}

// validateP2P checks the P2P matrix, where there is one, as Validate
// checks the path matrix: square over the GPUs, X exactly on the
// diagonal.
func (n *Node) validateP2P() []error {
	if n.P2P == nil {
		return nil
	}
	var errs []error
	g := len(n.GPUs)
	if len(n.P2P) != g {
		errs = append(errs, fmt.Errorf("p2p matrix has %d rows for %d GPUs", len(n.P2P), g))
	}
	for i, row := range n.P2P {
		if len(row) != g {
			errs = append(errs, fmt.Errorf("p2p matrix row %d has %d columns for %d GPUs", i, len(row), g))
			continue
		}
		for j, s := range row {
			if (i == j) != (s == P2PSelf) {
				errs = append(errs, fmt.Errorf("p2p GPU%d-GPU%d: %s is not allowed there", i, j, s))
			}
		}
	}
	return errs
}
