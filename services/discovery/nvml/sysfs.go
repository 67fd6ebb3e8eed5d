//go:build nvml && cgo

package nvml

import (
	"cmp"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/toposched/toposched/internal/topology"
)

// sysfs reads /sys under a root, "/" in production and a fake tree in
// tests. Symlinks are resolved inside the tree, so a fake tree must use
// relative links, as the kernel does.
type sysfs struct{ root string }

func (s sysfs) path(elem ...string) string {
	return filepath.Join(append([]string{s.root, "sys"}, elem...)...)
}

var pciAddr = regexp.MustCompile(`^[0-9a-f]{4,}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$`)

// pciChain returns where a PCI device sits: the root complex (the
// /sys/devices path up to its pciDDDD:BB element), then every PCI device
// from the root port down to the device itself.
func (s sysfs) pciChain(busID string) ([]string, error) {
	if busID == "" {
		return nil, errors.New("no bus id")
	}
	return s.chainOf(s.path("bus", "pci", "devices", busID))
}

func (s sysfs) chainOf(link string) ([]string, error) {
	dev, err := filepath.EvalSymlinks(link)
	if err != nil {
		return nil, err
	}
	devices, err := filepath.EvalSymlinks(s.path("devices"))
	if err != nil {
		return nil, err
	}
	rel, err := filepath.Rel(devices, dev)
	if err != nil || rel == "." || strings.HasPrefix(rel, "..") {
		return nil, fmt.Errorf("%s is not under %s", dev, devices)
	}
	parts := strings.Split(filepath.ToSlash(rel), "/")
	rc := slices.IndexFunc(parts, func(p string) bool { return strings.HasPrefix(p, "pci") })
	if rc < 0 {
		return nil, fmt.Errorf("%s: no PCI root complex in the path", dev)
	}
	chain := []string{strings.Join(parts[:rc+1], "/")}
	for _, p := range parts[rc+1:] {
		if strings.HasPrefix(p, "pci") {
			// A domain behind a bridge such as Intel VMD
			// (.../0000:00:0e.0/pci10000:00/10000:00:01.0/...).
			continue
		}
		if !pciAddr.MatchString(p) {
			return nil, fmt.Errorf("%s: %q is not a PCI address", dev, p)
		}
		chain = append(chain, p)
	}
	if len(chain) < 2 {
		return nil, fmt.Errorf("%s: a root complex, not a PCI device", dev)
	}
	return chain, nil
}

// readInt reads a sysfs file holding one integer.
func readInt(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(string(b)))
}

// numaOf returns a PCI device's NUMA node, -1 when sysfs does not say.
func (s sysfs) numaOf(devDir string) int {
	n, err := readInt(filepath.Join(devDir, "numa_node"))
	if err != nil || n < 0 {
		return -1
	}
	return n
}

// numaNodes counts the host's NUMA nodes, 0 when sysfs does not say.
func (s sysfs) numaNodes() int {
	ents, err := os.ReadDir(s.path("devices", "system", "node"))
	if err != nil {
		return 0
	}
	n := 0
	for _, e := range ents {
		if rest, ok := strings.CutPrefix(e.Name(), "node"); ok {
			if _, err := strconv.Atoi(rest); err == nil {
				n++
			}
		}
	}
	return n
}

// pciClass classifies the path between two PCI devices from their chains
// (pciChain) and NUMA nodes, in nvidia-smi's terms:
//
//	PIX   both behind one PCIe switch (at most one bridge between them)
//	PXB   behind several switches that meet below the root complex
//	PHB   only the root complex (host bridge) in common
//	NODE  different root complexes of one NUMA node
//	SYS   different NUMA nodes, or NUMA nodes unknown on a NUMA host
//
// numaNodes is the host's NUMA node count: where both devices' nodes are
// unknown (-1) a host with one node makes them NODE, any other SYS.
func pciClass(a, b []string, numaA, numaB, numaNodes int) topology.Class {
	if a[0] != b[0] {
		switch {
		case numaA >= 0 && numaA == numaB:
			return topology.NODE
		case numaA < 0 && numaB < 0 && numaNodes == 1:
			return topology.NODE
		}
		return topology.SYS
	}
	c := 0
	for c < len(a) && c < len(b) && a[c] == b[c] {
		c++
	}
	if c == 1 {
		return topology.PHB
	}
	if c == len(a) || c == len(b) {
		// One device is an ancestor of the other.
		return topology.PIX
	}
	// Bridges below the common ancestor on each side, the devices
	// themselves excluded: one switch's downstream port each is PIX.
	if (len(a)-1-c)+(len(b)-1-c) <= 2 {
		return topology.PIX
	}
	return topology.PXB
}

// rdmaNICs lists the RDMA devices of /sys/class/infiniband, in natural
// name order (mlx5_2 before mlx5_10).
func (s sysfs) rdmaNICs() ([]topology.NIC, [][]string, error) {
	dir := s.path("class", "infiniband")
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, nil, err
	}
	names := make([]string, 0, len(ents))
	for _, e := range ents {
		names = append(names, e.Name())
	}
	slices.SortFunc(names, naturalCompare)
	var nics []topology.NIC
	var chains [][]string
	for _, name := range names {
		nic := topology.NIC{Index: len(nics), Name: name, RDMA: true, NUMA: -1}
		devLink := filepath.Join(dir, name, "device")
		var chain []string
		if dev, err := filepath.EvalSymlinks(devLink); err == nil {
			if base := filepath.Base(dev); pciAddr.MatchString(base) {
				nic.BusID = base
			}
			nic.NUMA = s.numaOf(dev)
			chain, _ = s.chainOf(devLink)
		}
		nic.RateGbps = portRate(filepath.Join(dir, name, "ports"))
		nics = append(nics, nic)
		chains = append(chains, chain)
	}
	return nics, chains, nil
}

// portRate returns the fastest port's rate in Gb/s, from ports/<n>/rate
// ("400 Gb/sec (4X NDR)"), 0 when none says.
func portRate(portsDir string) float64 {
	ents, err := os.ReadDir(portsDir)
	if err != nil {
		return 0
	}
	best := 0.0
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(portsDir, e.Name(), "rate"))
		if err != nil {
			continue
		}
		f := strings.Fields(string(b))
		if len(f) == 0 {
			continue
		}
		if v, err := strconv.ParseFloat(f[0], 64); err == nil && v > best {
			best = v
		}
	}
	return best
}

// naturalCompare orders names by their text, numbers by value.
func naturalCompare(a, b string) int {
	for a != "" && b != "" {
		da, db := digitPrefix(a), digitPrefix(b)
		if da != "" && db != "" {
			na, _ := strconv.ParseUint(da, 10, 64)
			nb, _ := strconv.ParseUint(db, 10, 64)
			if c := cmp.Compare(na, nb); c != 0 {
				return c
			}
			a, b = a[len(da):], b[len(db):]
			continue
		}
		if a[0] != b[0] {
			return cmp.Compare(a[0], b[0])
		}
		a, b = a[1:], b[1:]
	}
	return cmp.Compare(len(a), len(b))
}

func digitPrefix(s string) string {
	i := 0
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		i++
	}
	return s[:i]
}
