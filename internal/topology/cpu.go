package topology

// CPU is a node's host processor as NCCL's topology XML describes it
// (<cpu arch= vendor= familyid= modelid=>, src/graph/xml.cc reads them from
// /proc/cpuinfo). NCCL decides two things from it: how far apart two GPUs
// may be and still use P2P (src/graph/paths.cc, ncclTopoCheckP2p), and the
// bandwidth it counts on the link between two sockets
// (src/graph/topo.cc, ncclTopoGetInterCpuBw). The zero value is a CPU the
// source did not describe.
type CPU struct {
	// Arch is "x86_64", "arm64" or "ppc64", as NCCL writes it.
	Arch string `json:"arch,omitempty"`
	// Vendor is the x86 vendor string: "GenuineIntel", "AuthenticAMD",
	// "CentaurHauls" or "  Shanghai  " (Zhaoxin).
	Vendor string `json:"vendor,omitempty"`
	Family int    `json:"family,omitempty"`
	Model  int    `json:"model,omitempty"`
}

// CPUKind is a CPU as NCCL tells them apart.
type CPUKind uint8

// CPU kinds. The Intel ones are by model number, as topo.cc splits them:
// Broadwell and older, Skylake (0x55) to Ice Lake, Sapphire Rapids (0x8F)
// and Emerald Rapids (0xCF) on.
const (
	CPUUnknown CPUKind = iota
	CPUIntelBDW
	CPUIntelSKL
	CPUIntelSRP
	CPUIntelERP
	CPUAMD
	CPUZhaoxin
	CPUZhaoxinYongfeng
	CPUPower
	CPUARM
)

var cpuKindNames = [...]string{"unknown", "intel-bdw", "intel-skl", "intel-srp", "intel-erp", "amd", "zhaoxin", "zhaoxin-yongfeng", "power", "arm"}

func (k CPUKind) String() string {
	if int(k) < len(cpuKindNames) {
		return cpuKindNames[k]
	}
	return "unknown"
}

// Kind classifies the CPU as topo.cc's ncclTopoAddCpu does.
func (c CPU) Kind() CPUKind {
	switch c.Arch {
	case "ppc64":
		return CPUPower
	case "arm64", "aarch64":
		return CPUARM
	case "x86_64":
	default:
		return CPUUnknown
	}
	switch c.Vendor {
	case "GenuineIntel":
		switch {
		case c.Family == 6 && c.Model >= 0xCF:
			return CPUIntelERP
		case c.Family == 6 && c.Model >= 0x8F:
			return CPUIntelSRP
		case c.Family == 6 && c.Model >= 0x55:
			return CPUIntelSKL
		}
		return CPUIntelBDW
	case "AuthenticAMD":
		return CPUAMD
	case "CentaurHauls", "  Shanghai  ":
		if c.Family == 7 && c.Model == 0x5B {
			return CPUZhaoxinYongfeng
		}
		return CPUZhaoxin
	}
	return CPUUnknown
}

// Intel reports whether the CPU is an Intel x86 one.
func (k CPUKind) Intel() bool { return k >= CPUIntelBDW && k <= CPUIntelERP }

// Zhaoxin reports whether the CPU is a Zhaoxin x86 one.
func (k CPUKind) Zhaoxin() bool { return k == CPUZhaoxin || k == CPUZhaoxinYongfeng }

// InterSocketGBps is the bandwidth (GB/s, one direction) NCCL counts on
// the link between two sockets of this kind (topo.h: BDW_QPI_BW 6,
// SKL_QPI_BW 10, SRP_QPI_BW 22, ERP_QPI_BW 40, AMD_BW 16, ZPI_BW 6,
// YONGFENG_ZPI_BW 9, P9_BW 32, ARM_BW 6), 0 for an unknown CPU. These
// are what a transfer gets, not line rates: Skylake's UPI is 20.8 GB/s
// per link, of which P2P traffic through the root complexes gets about
// half.
func (k CPUKind) InterSocketGBps() float64 {
	switch k {
	case CPUIntelBDW:
		return 6
	case CPUIntelSKL:
		return 10
	case CPUIntelSRP:
		return 22
	case CPUIntelERP:
		return 40
	case CPUAMD:
		return 16
	case CPUZhaoxin:
		return 6
	case CPUZhaoxinYongfeng:
		return 9
	case CPUPower:
		return 32
	case CPUARM:
		return 6
	}
	return 0
}
