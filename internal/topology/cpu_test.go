package topology

import "testing"

// CPUs classify as src/graph/topo.cc does (AMD by generation, as Linux
// tells Zen generations apart), and get its inter-socket figures and,
// where the platform publishes one, the socket link's line rate.
func TestCPUKind(t *testing.T) {
	t.Parallel()
	amd := func(family, model int) CPU {
		return CPU{Arch: "x86_64", Vendor: "AuthenticAMD", Family: family, Model: model}
	}
	for _, tc := range []struct {
		name string
		cpu  CPU
		want CPUKind
		gbps float64 // NCCL's
		line float64 // the platform's
	}{
		{"none", CPU{}, CPUUnknown, 0, 0},
		{"x86 without vendor", CPU{Arch: "x86_64"}, CPUUnknown, 0, 0},
		{"broadwell", CPU{Arch: "x86_64", Vendor: "GenuineIntel", Family: 6, Model: 79}, CPUIntelBDW, 6, 0},
		{"skylake", CPU{Arch: "x86_64", Vendor: "GenuineIntel", Family: 6, Model: 0x55}, CPUIntelSKL, 10, 0},
		{"ice lake", CPU{Arch: "x86_64", Vendor: "GenuineIntel", Family: 6, Model: 0x6A}, CPUIntelSKL, 10, 0},
		{"sapphire rapids", CPU{Arch: "x86_64", Vendor: "GenuineIntel", Family: 6, Model: 0x8F}, CPUIntelSRP, 22, 0},
		{"emerald rapids", CPU{Arch: "x86_64", Vendor: "GenuineIntel", Family: 6, Model: 0xCF}, CPUIntelERP, 40, 0},
		{"intel family 15", CPU{Arch: "x86_64", Vendor: "GenuineIntel", Family: 15, Model: 0xCF}, CPUIntelBDW, 6, 0},
		{"amd bulldozer", amd(0x15, 0x01), CPUAMD, 16, 0},
		{"epyc 7001 naples", amd(0x17, 0x01), CPUAMD, 16, 0},
		{"epyc 7002 rome", amd(0x17, 0x31), CPUAMDRome, 16, 128},
		{"zen 2 last range", amd(0x17, 0xAF), CPUAMDRome, 16, 128},
		{"family 0x17 past zen 2", amd(0x17, 0xB0), CPUAMD, 16, 0},
		{"epyc 7003 milan", amd(0x19, 0x01), CPUAMDRome, 16, 128},
		{"zen 3 client", amd(0x19, 0x21), CPUAMDRome, 16, 128},
		{"epyc 9004 genoa", amd(0x19, 0x11), CPUAMDGenoa, 16, 256},
		{"epyc 97x4 bergamo", amd(0x19, 0xA0), CPUAMDGenoa, 16, 256},
		{"family 0x19 past zen 4", amd(0x19, 0xB0), CPUAMD, 16, 0},
		{"epyc 9005 turin", amd(0x1A, 0x02), CPUAMDGenoa, 16, 256},
		{"epyc 9005 turin dense", amd(0x1A, 0x11), CPUAMDGenoa, 16, 256},
		{"zen 5 last range", amd(0x1A, 0x7F), CPUAMDGenoa, 16, 256},
		{"zen 6", amd(0x1A, 0x50), CPUAMD, 16, 0},
		// NCCL's XML: familyid is cpuid's base + ext<<4.
		{"nccl xml rome (143)", amd(143, 49), CPUAMDRome, 16, 128},
		{"nccl xml milan (175)", amd(175, 1), CPUAMDRome, 16, 128},
		{"nccl xml genoa (175)", amd(175, 0x11), CPUAMDGenoa, 16, 256},
		{"nccl xml turin (191)", amd(191, 2), CPUAMDGenoa, 16, 256},
		{"nccl xml naples (143)", amd(143, 1), CPUAMD, 16, 0},
		{"amd without family", amd(0, 0), CPUAMD, 16, 0},
		{"zhaoxin", CPU{Arch: "x86_64", Vendor: "CentaurHauls", Family: 7, Model: 0x3B}, CPUZhaoxin, 6, 0},
		{"zhaoxin yongfeng", CPU{Arch: "x86_64", Vendor: "  Shanghai  ", Family: 7, Model: 0x5B}, CPUZhaoxinYongfeng, 9, 0},
		{"arm64", CPU{Arch: "arm64"}, CPUARM, 6, 0},
		{"aarch64", CPU{Arch: "aarch64"}, CPUARM, 6, 0},
		{"power", CPU{Arch: "ppc64"}, CPUPower, 32, 0},
		{"amd vendor on arm", CPU{Arch: "arm64", Vendor: "AuthenticAMD", Family: 0x1A, Model: 0x02}, CPUARM, 6, 0},
	} {
		k := tc.cpu.Kind()
		if k != tc.want || k.InterSocketGBps() != tc.gbps || k.InterSocketLineGBps() != tc.line {
			t.Errorf("%s %+v: %s at %g GB/s (line %g), want %s at %g (line %g)", tc.name, tc.cpu, k, k.InterSocketGBps(), k.InterSocketLineGBps(), tc.want, tc.gbps, tc.line)
		}
		if isAMD := tc.cpu.Vendor == "AuthenticAMD" && tc.cpu.Arch == "x86_64"; k.AMD() != isAMD {
			t.Errorf("%s: AMD() %v, want %v", tc.name, k.AMD(), isAMD)
		}
	}
}

// Every kind has a name of its own.
func TestCPUKindNames(t *testing.T) {
	t.Parallel()
	seen := map[string]CPUKind{}
	for k := CPUUnknown; k <= CPUAMDGenoa; k++ {
		name := k.String()
		if prev, ok := seen[name]; ok && name != "unknown" || name == "unknown" && k != CPUUnknown {
			t.Errorf("kind %d named %q, as kind %d", k, name, prev)
		}
		seen[name] = k
	}
}
