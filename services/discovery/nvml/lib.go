//go:build nvml && cgo

package nvml

import (
	"errors"
	"fmt"
	"math/bits"
	"strconv"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// ErrNVMLNotAvailable is wrapped by the error Discover and WatchHealth
// return where NVML cannot be used at all: the library is missing ("NVML
// not available: libnvidia-ml.so.1 not found; this node has no NVIDIA
// driver") or the kernel driver is not loaded.
var ErrNVMLNotAvailable = errors.New("NVML not available")

// Library returns the system's NVML (libnvidia-ml.so.1), not yet
// initialised: what production passes to Discover and WatchHealth.
func Library() nvml.Interface { return nvml.New() }

// initLib initialises lib; the caller shuts it down when done.
func initLib(lib nvml.Interface) error {
	if lib == nil {
		return errors.New("nvml: nil library")
	}
	ret := call0(lib.Init)
	switch ret {
	case nvml.SUCCESS:
		return nil
	case nvml.ERROR_LIBRARY_NOT_FOUND:
		return fmt.Errorf("%w: libnvidia-ml.so.1 not found; this node has no NVIDIA driver", ErrNVMLNotAvailable)
	case nvml.ERROR_DRIVER_NOT_LOADED:
		return fmt.Errorf("%w: libnvidia-ml.so.1 is there but the NVIDIA kernel driver is not loaded", ErrNVMLNotAvailable)
	}
	return fmt.Errorf("nvml: init: %w", ret)
}

// unmocked says whether a recovered panic is go-nvml's moq mock complaining
// that a method's Func was not set ("Device.GetNvLinkStateFunc: method is
// nil but Device.GetNvLinkState was just called").
func unmocked(r any) bool {
	s, ok := r.(string)
	return ok && strings.Contains(s, "method is nil but")
}

// call runs one NVML call. An unset mock method reads as
// ERROR_NOT_SUPPORTED, what an older driver answers for a call it lacks;
// any other panic goes on.
func call[T any](f func() (T, nvml.Return)) (v T, ret nvml.Return) {
	defer func() {
		if r := recover(); r != nil {
			if !unmocked(r) {
				panic(r)
			}
			var zero T
			v, ret = zero, nvml.ERROR_NOT_SUPPORTED
		}
	}()
	return f()
}

// call0 is call for calls that return only a Return.
func call0(f func() nvml.Return) (ret nvml.Return) {
	defer func() {
		if r := recover(); r != nil {
			if !unmocked(r) {
				panic(r)
			}
			ret = nvml.ERROR_NOT_SUPPORTED
		}
	}()
	return f()
}

// release is call0 for the calls that give back what NVML handed out
// (Shutdown, EventSetFree): on the way out, a failure leaves nothing to
// do, so their Return is dropped.
func release(f func() nvml.Return) { _ = call0(f) }

// unavailable says whether ret means the call or the feature does not
// exist here, as opposed to failing.
func unavailable(ret nvml.Return) bool {
	return ret == nvml.ERROR_NOT_SUPPORTED || ret == nvml.ERROR_FUNCTION_NOT_FOUND
}

// cString reads a NUL-terminated C char array.
func cString(b []int8) string {
	out := make([]byte, 0, len(b))
	for _, c := range b {
		if c == 0 {
			break
		}
		out = append(out, byte(c))
	}
	return string(out)
}

// pciBusID returns the bus id of a PciInfo in the 0000:00:00.0 form, or ""
// when it has none. NVML writes an 8-digit domain (00000000:07:00.0) in
// BusId, 4 digits in BusIdLegacy; go-nvml's mocks write neither.
func pciBusID(p nvml.PciInfo) string {
	if s := NormalizeBusID(cString(p.BusId[:])); s != "" {
		return s
	}
	return NormalizeBusID(cString(p.BusIdLegacy[:]))
}

// NormalizeBusID returns a PCI address in sysfs's form, lower case with a
// domain of at least four hex digits and no leading zeros beyond them:
// "00000000:07:00.0" and "07:00.0" both become "0000:07:00.0". Input that
// is not a PCI address comes back lower-cased and trimmed.
func NormalizeBusID(s string) string {
	s = strings.ToLower(strings.TrimSpace(s))
	if s == "" {
		return ""
	}
	parts := strings.Split(s, ":")
	var dom, bus, devfn string
	switch len(parts) {
	case 2:
		dom, bus, devfn = "0", parts[0], parts[1]
	case 3:
		dom, bus, devfn = parts[0], parts[1], parts[2]
	default:
		return s
	}
	dev, fn, ok := strings.Cut(devfn, ".")
	if !ok {
		fn = "0"
	}
	d, err1 := strconv.ParseUint(dom, 16, 32)
	b, err2 := strconv.ParseUint(bus, 16, 8)
	v, err3 := strconv.ParseUint(dev, 16, 5)
	f, err4 := strconv.ParseUint(fn, 8, 3)
	if err := errors.Join(err1, err2, err3, err4); err != nil {
		return s
	}
	return fmt.Sprintf("%04x:%02x:%02x.%d", d, b, v, f)
}

// CPUList renders a CPU mask (NVML's cpuSet: bit i of word w is CPU
// w*64+i on a 64-bit host) as a Linux cpulist: "0-31,64-95".
func CPUList(mask []uint) string {
	var b strings.Builder
	start, prev := -1, -1
	flush := func() {
		if start < 0 {
			return
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(start))
		if prev > start {
			b.WriteByte('-')
			b.WriteString(strconv.Itoa(prev))
		}
	}
	for w, word := range mask {
		for word != 0 {
			i := bits.TrailingZeros(word)
			word &^= 1 << i
			cpu := w*bits.UintSize + i
			if cpu != prev+1 || start < 0 {
				flush()
				start = cpu
			}
			prev = cpu
		}
	}
	flush()
	return b.String()
}
