package ncclxml

import (
	"fmt"
	"math/big"
	"regexp"
	"strconv"
	"strings"
)

// busID is a parsed PCI address: domain:bus:device.function.
type busID struct {
	domain      uint32
	bus, dev    uint8
	fn          uint8
	placeholder bool // NCCL's "fffffff:ff:ff.0" for an NVSwitch it cannot see
}

var busIDPattern = regexp.MustCompile(`^([0-9a-fA-F]{1,8}):([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})\.([0-7])$`)

// parseBusID reads a PCI address as NCCL writes it ("0000:07:00.0"); a
// domain of up to eight digits ("00000000:07:00.0", NVML's form) is read
// too. Device numbers above 0x1f do not exist on a real bus: NCCL writes
// "fffffff:ff:ff.0" for an NVSwitch hidden from a VM, and such an address
// is marked as a placeholder.
func parseBusID(s string) (busID, bool) {
	m := busIDPattern.FindStringSubmatch(strings.TrimSpace(s))
	if m == nil {
		return busID{}, false
	}
	d, _ := strconv.ParseUint(m[1], 16, 32)
	b, _ := strconv.ParseUint(m[2], 16, 8)
	v, _ := strconv.ParseUint(m[3], 16, 8)
	f, _ := strconv.ParseUint(m[4], 16, 8)
	id := busID{domain: uint32(d), bus: uint8(b), dev: uint8(v), fn: uint8(f)}
	id.placeholder = id.dev > 0x1f
	return id, true
}

// String is the canonical form: lower case, a domain of at least four
// digits (sysfs's and NVML's form, and NCCL's).
func (b busID) String() string {
	return fmt.Sprintf("%04x:%02x:%02x.%x", b.domain, b.bus, b.dev, b.fn)
}

// rootKey is the bus a device sits on: domain and bus number.
func (b busID) rootKey() uint64 { return uint64(b.domain)<<8 | uint64(b.bus) }

func (b busID) less(o busID) bool {
	if b.domain != o.domain {
		return b.domain < o.domain
	}
	if b.bus != o.bus {
		return b.bus < o.bus
	}
	if b.dev != o.dev {
		return b.dev < o.dev
	}
	return b.fn < o.fn
}

// A CPU mask as NCCL writes it: hex words separated by commas
// ("00000000,00ffffff", "c0c0").
var maskPattern = regexp.MustCompile(`^[0-9a-fA-F]+(,[0-9a-fA-F]+)*$`)

// A Linux cpulist as nvidia-smi and NVML print it: "0-23,48-71".
var cpuListPattern = regexp.MustCompile(`^[0-9]+(-[0-9]+)?(,[0-9]+(-[0-9]+)?)*$`)

// maxCPU bounds the CPU numbers a cpulist may name when it is turned into a
// mask.
const maxCPU = 1 << 16

// affinityMask returns a CPU affinity in NCCL's mask form: a mask comes back
// as it is, a cpulist is converted, anything else gives "" (not known).
func affinityMask(s string) string {
	s = strings.TrimSpace(s)
	switch {
	case s == "":
		return ""
	case maskPattern.MatchString(s):
		return s
	case !cpuListPattern.MatchString(s):
		return ""
	}
	mask := new(big.Int)
	for part := range strings.SplitSeq(s, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		a, err1 := strconv.Atoi(lo)
		b := a
		var err2 error
		if isRange {
			b, err2 = strconv.Atoi(hi)
		}
		if err1 != nil || err2 != nil || a > b || b >= maxCPU {
			return ""
		}
		for c := a; c <= b; c++ {
			mask.SetBit(mask, c, 1)
		}
	}
	hex := mask.Text(16)
	// Words of eight digits from the right, comma separated, as the kernel
	// prints a cpumask.
	if pad := (8 - len(hex)%8) % 8; pad > 0 {
		hex = strings.Repeat("0", pad) + hex
	}
	var words []string
	for i := 0; i < len(hex); i += 8 {
		words = append(words, hex[i:i+8])
	}
	return strings.Join(words, ",")
}
