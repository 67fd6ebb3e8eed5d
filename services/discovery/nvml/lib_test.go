//go:build nvml && cgo

package nvml

import (
	"slices"
	"strings"
	"testing"

	"github.com/toposched/toposched/internal/topology"
)

func TestNormalizeBusID(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"00000000:3B:00.0":  "0000:3b:00.0",
		"0000:3b:00.0":      "0000:3b:00.0",
		"3b:00.1":           "0000:3b:00.1",
		"00000001:c1:1f.7 ": "0001:c1:1f.7",
		"10000:01:00.0":     "10000:01:00.0", // VMD domain
		"":                  "",
		"nvswitch":          "nvswitch",
		"0000:zz:00.0":      "0000:zz:00.0",
	} {
		if got := NormalizeBusID(in); got != want {
			t.Errorf("NormalizeBusID(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestCPUList(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		mask []uint
		want string
	}{
		{nil, ""},
		{[]uint{0xFFFFFFFF, 0xFFFFFFFF}, "0-31,64-95"},
		{[]uint{1 << 63, 1}, "63-64"},
		{[]uint{0b1011}, "0-1,3"},
		{[]uint{0, 0, 1 << 5}, "133"},
	} {
		if got := CPUList(tc.mask); got != tc.want {
			t.Errorf("CPUList(%x) = %q, want %q", tc.mask, got, tc.want)
		}
	}
}

func TestPCIClass(t *testing.T) {
	t.Parallel()
	ch := func(s string) []string { return strings.Split(s, "/") }
	for _, tc := range []struct {
		a, b         string
		na, nb, host int
		want         topology.Class
	}{
		{"pci0000:00/rp/usp/dsp1/A", "pci0000:00/rp/usp/dsp2/B", 0, 0, 2, topology.PIX},
		{"pci0000:00/rp/A.0", "pci0000:00/rp/A.1", 0, 0, 2, topology.PIX},
		{"pci0000:00/rp/usp/dsp1/A", "pci0000:00/rp/usp/dsp2/usp2/dsp3/B", 0, 0, 2, topology.PXB},
		{"pci0000:00/rp1/A", "pci0000:00/rp2/B", 0, 0, 2, topology.PHB},
		{"pci0000:00/rp1/A", "pci0000:20/rp2/B", 0, 0, 2, topology.NODE},
		{"pci0000:00/rp1/A", "pci0000:80/rp2/B", 0, 1, 2, topology.SYS},
		{"pci0000:00/rp1/A", "pci0000:80/rp2/B", -1, -1, 1, topology.NODE},
		{"pci0000:00/rp1/A", "pci0000:80/rp2/B", -1, -1, 2, topology.SYS},
		{"pci0000:00/rp1/A", "pci0000:80/rp2/B", 0, -1, 1, topology.SYS},
	} {
		if got := pciClass(ch(tc.a), ch(tc.b), tc.na, tc.nb, tc.host); got != tc.want {
			t.Errorf("%s vs %s: %s, want %s", tc.a, tc.b, got, tc.want)
		}
		if got := pciClass(ch(tc.b), ch(tc.a), tc.nb, tc.na, tc.host); got != tc.want {
			t.Errorf("%s vs %s: %s, want %s (reversed)", tc.b, tc.a, got, tc.want)
		}
	}
}

func TestNaturalOrder(t *testing.T) {
	t.Parallel()
	names := []string{"mlx5_10", "mlx5_2", "mlx5_bond_0", "ibp1s0", "mlx5_1"}
	slices.SortFunc(names, naturalCompare)
	want := []string{"ibp1s0", "mlx5_1", "mlx5_2", "mlx5_10", "mlx5_bond_0"}
	if !slices.Equal(names, want) {
		t.Errorf("%v, want %v", names, want)
	}
}

// A NIC whose sysfs entry has no device link still appears, with unknown
// paths; the rest of the host is unchanged.
func TestNICWithoutDevice(t *testing.T) {
	t.Parallel()
	f := newFakeSys(t, 1)
	f.mkdir("sys/class/infiniband/rxe0/ports/1")
	f.write("sys/class/infiniband/rxe0/ports/1/rate", "10 Gb/sec (4X SDR)")
	nics, chains, err := sysfs{root: f.root}.rdmaNICs()
	if err != nil || len(nics) != 1 || chains[0] != nil {
		t.Fatalf("%+v %v %v", nics, chains, err)
	}
	if want := (topology.NIC{Name: "rxe0", RDMA: true, NUMA: -1, RateGbps: 10}); nics[0] != want {
		t.Errorf("%+v, want %+v", nics[0], want)
	}
}

// Devices behind Intel VMD sit in a domain of their own below a root
// port; the chain skips the domain element.
func TestPCIChainVMD(t *testing.T) {
	t.Parallel()
	f := newFakeSys(t, 1)
	bus := f.pci("pci0000:00/0000:00:0e.0/pci10000:00/10000:00:01.0/10000:01:00.0", 0)
	chain, err := sysfs{root: f.root}.pciChain(bus)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"pci0000:00", "0000:00:0e.0", "10000:00:01.0", "10000:01:00.0"}; !slices.Equal(chain, want) {
		t.Errorf("chain %q, want %q", chain, want)
	}
}
