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
//
// NCCL tells no AMD generation from another (topo.cc reads family and
// model for Intel and Zhaoxin only; every AMD CPU gets AMD_BW). The model
// splits them by the link between the sockets, which changed with the
// platform: CPUAMDRome is the SP3 platform's xGMI-2 (Rome, Milan),
// CPUAMDGenoa the SP5 platform's xGMI-3 (Genoa, Bergamo, Turin); CPUAMD
// is any other AMD CPU (Naples, whose socket link ran over its PCIe
// PHYs, and families after Turin), priced as NCCL prices it. Every AMD
// kind is AMD to NCCL's rules (AMD).
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
	CPUAMDRome
	CPUAMDGenoa
)

var cpuKindNames = [...]string{"unknown", "intel-bdw", "intel-skl", "intel-srp", "intel-erp", "amd", "zhaoxin", "zhaoxin-yongfeng", "power", "arm", "amd-rome", "amd-genoa"}

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
		return amdKind(c.Family, c.Model)
	case "CentaurHauls", "  Shanghai  ":
		if c.Family == 7 && c.Model == 0x5B {
			return CPUZhaoxinYongfeng
		}
		return CPUZhaoxin
	}
	return CPUUnknown
}

// amdKind is an AMD CPU's kind by its Zen generation, read from family
// and model as Linux reads them (arch/x86/kernel/cpu/amd.c, bsp_init_amd,
// "Figure out Zen generations"): family 0x17 models 0x30-0x4F, 0x60-0x7F,
// 0x90-0x91 and 0xA0-0xAF are Zen 2 (EPYC 7002 Rome: 0x31); family 0x19
// models 0x00-0x0F and 0x20-0x5F Zen 3 (EPYC 7003 Milan: 0x01),
// 0x10-0x1F and 0x60-0xAF Zen 4 (EPYC 9004 Genoa: 0x11, 97x4 Bergamo:
// 0xA0); family 0x1A models 0x00-0x2F, 0x40-0x4F and 0x60-0x7F Zen 5
// (EPYC 9005 Turin: 0x02, Turin dense: 0x11), its other models Zen 6,
// whose socket link the model has no figure for (CPUAMD). Zen 2 and 3
// share the SP3 platform's socket link, Zen 4 and 5 SP5's. The client
// parts of a generation (Ryzen, Threadripper) fall in its kind too; they
// have one socket, so its link is never priced.
//
// NCCL's XML writes the family as cpuid's fields give it, base + ext<<4
// (src/graph/xml.cc, since 2.6.4): 0x8F (143) for 0x17, 0xAF (175) for
// 0x19, 0xBF (191) for 0x1A, where Linux and /proc/cpuinfo add them
// (0xF + ext); both are read. Only a family past 0x1E could be taken for
// the other (0x1F is ext 1 to NCCL, family 0x10); none exists.
func amdKind(family, model int) CPUKind {
	if family > 0xF && family&0xF == 0xF {
		family = 0xF + family>>4
	}
	in := func(lo, hi int) bool { return model >= lo && model <= hi }
	switch family {
	case 0x17:
		if in(0x30, 0x4F) || in(0x60, 0x7F) || in(0x90, 0x91) || in(0xA0, 0xAF) {
			return CPUAMDRome
		}
	case 0x19:
		if in(0x00, 0x0F) || in(0x20, 0x5F) {
			return CPUAMDRome
		}
		if in(0x10, 0x1F) || in(0x60, 0xAF) {
			return CPUAMDGenoa
		}
	case 0x1A:
		if in(0x00, 0x2F) || in(0x40, 0x4F) || in(0x60, 0x7F) {
			return CPUAMDGenoa
		}
	}
	return CPUAMD
}

// AMD reports whether the CPU is an AMD x86 one, of any generation: NCCL's
// AMD rules (its P2P level, its channel search) apply to every one.
func (k CPUKind) AMD() bool { return k == CPUAMD || k == CPUAMDRome || k == CPUAMDGenoa }

// Intel reports whether the CPU is an Intel x86 one.
func (k CPUKind) Intel() bool { return k >= CPUIntelBDW && k <= CPUIntelERP }

// Zhaoxin reports whether the CPU is a Zhaoxin x86 one.
func (k CPUKind) Zhaoxin() bool { return k == CPUZhaoxin || k == CPUZhaoxinYongfeng }

// InterSocketGBps is the bandwidth (GB/s, one direction) NCCL counts on
// the link between two sockets of this kind (topo.h: BDW_QPI_BW 6,
// SKL_QPI_BW 10, SRP_QPI_BW 22, ERP_QPI_BW 40, AMD_BW 16, ZPI_BW 6,
// YONGFENG_ZPI_BW 9, P9_BW 32, ARM_BW 6; NCCL 2.30.7,
// src/graph/topo.h:25-34, topo.cc ncclTopoGetInterCpuBw), 0 for an
// unknown CPU. These are what a transfer gets, not line rates: Skylake's
// UPI is 20.8 GB/s per link, of which P2P traffic through the root
// complexes gets about half. NCCL's graph search counts them; where
// InterSocketLineGBps has a line rate, the cost model prices that
// instead.
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
	case CPUAMD, CPUAMDRome, CPUAMDGenoa:
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

// InterSocketLineGBps is the line rate (GB/s, one direction, all links
// together) of the link between two sockets of this kind, from the
// platform's published figures, 0 where the model has none and prices
// NCCL's InterSocketGBps instead. The link is x16 links of xGMI; a link
// moves 16 lanes x its transfer rate / 8 bytes each way.
//
//   - CPUAMDRome (SP3, xGMI-2: EPYC 7002 Rome, 7003 Milan): 4 links at
//     16 GT/s, 128 GB/s. QCT's QuantaGrid D43K-1U specifications (dual
//     EPYC 7002/7003): "4 AMD xGMI-2 between dual EPYC processors up to
//     16 GT/s". Boards may wire 3 links and give the fourth's lanes to
//     PCIe, and run them up to 18 GT/s (Inspur NF5468A5 white paper
//     V1.1: "up to 3 xGMI links at up to 18 GT/s", 108 GB/s): the two
//     are within 16%.
//   - CPUAMDGenoa (SP5, xGMI-3: EPYC 9004 Genoa and Bergamo, 9005
//     Turin): 4 links at 32 GT/s, 256 GB/s. Lenovo Press LP1852
//     (Configuring AMD xGMI Links on the ThinkSystem SR665 V3): "AMD
//     EPYC 9004 Series Processors support up to four xGMI links with
//     speeds up to 32Gbps", "Four xGMI links can support a maximum
//     theoretical bandwidth of 512 GB/s between sockets" (both ways);
//     H3C UniServer R4950 G6 user guide (Genoa, Bergamo): "four-channel
//     XGMI ... up to 32 Gb/s per channel"; for Turin, Inventec's K905G6
//     datasheet (dual EPYC 9005): "x4 xGMI links", "up to 32 GT/s", and
//     QCT's QuantaGrid D44N-1U (9004/9005): "interconnect 32 GT/s".
//     Three-link boards (LP1852's SR665 V3 option) have 192.
//
// A line rate is not what P2P gets through the root complexes: the cost
// model scales it by the PCIe efficiency, as it scales the GPUs' links.
// On both platforms it is several times a GPU's PCIe x16 (31.5 GB/s Gen4,
// 63 Gen5), so the GPUs' own links, not the sockets', bound a ring.
func (k CPUKind) InterSocketLineGBps() float64 {
	switch k {
	case CPUAMDRome:
		return 4 * 16 * 16 / 8.0
	case CPUAMDGenoa:
		return 4 * 16 * 32 / 8.0
	}
	return 0
}
