package topology

import "testing"

// CPUs classify as src/graph/topo.cc does, and get its inter-socket
// figures.
func TestCPUKind(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		cpu  CPU
		want CPUKind
		gbps float64
	}{
		{CPU{}, CPUUnknown, 0},
		{CPU{Arch: "x86_64"}, CPUUnknown, 0},
		{CPU{Arch: "x86_64", Vendor: "GenuineIntel", Family: 6, Model: 79}, CPUIntelBDW, 6},
		{CPU{Arch: "x86_64", Vendor: "GenuineIntel", Family: 6, Model: 0x55}, CPUIntelSKL, 10},
		{CPU{Arch: "x86_64", Vendor: "GenuineIntel", Family: 6, Model: 0x6A}, CPUIntelSKL, 10},
		{CPU{Arch: "x86_64", Vendor: "GenuineIntel", Family: 6, Model: 0x8F}, CPUIntelSRP, 22},
		{CPU{Arch: "x86_64", Vendor: "GenuineIntel", Family: 6, Model: 0xCF}, CPUIntelERP, 40},
		{CPU{Arch: "x86_64", Vendor: "GenuineIntel", Family: 15, Model: 0xCF}, CPUIntelBDW, 6},
		{CPU{Arch: "x86_64", Vendor: "AuthenticAMD", Family: 23, Model: 49}, CPUAMD, 16},
		{CPU{Arch: "x86_64", Vendor: "CentaurHauls", Family: 7, Model: 0x3B}, CPUZhaoxin, 6},
		{CPU{Arch: "x86_64", Vendor: "  Shanghai  ", Family: 7, Model: 0x5B}, CPUZhaoxinYongfeng, 9},
		{CPU{Arch: "arm64"}, CPUARM, 6},
		{CPU{Arch: "aarch64"}, CPUARM, 6},
		{CPU{Arch: "ppc64"}, CPUPower, 32},
	} {
		k := tc.cpu.Kind()
		if k != tc.want || k.InterSocketGBps() != tc.gbps {
			t.Errorf("%+v: %s at %g GB/s, want %s at %g", tc.cpu, k, k.InterSocketGBps(), tc.want, tc.gbps)
		}
	}
}
