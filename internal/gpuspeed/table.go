package gpuspeed

import (
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
)

// Spec is one GPU model's peak figures, as its vendor specifies them.
type Spec struct {
	// Name is the model as the table names it.
	Name string
	// TFLOPS is the dense bf16 tensor peak (fp16 with fp32 accumulation
	// where the GPU has no bf16), per GPU.
	TFLOPS float64
	// MemGBps is the memory bandwidth, GB/s, per GPU.
	MemGBps float64
	// Sources are where the figures are from.
	Sources []string
	// match finds the model in a GPU name as discovery and cluster files
	// report it, lower-cased with runs of '-', '_', '/' and spaces made one
	// space ("NVIDIA A100-SXM4-80GB" is "nvidia a100 sxm4 80gb").
	match *regexp.Regexp
}

// Speed is the model's compute speed by the package's rule: the geometric
// mean of its tensor peak and its memory bandwidth.
func (s Spec) Speed() float64 {
	return sqrt(s.TFLOPS * s.MemGBps)
}

// Sources of the table, named once.
const (
	srcT4      = "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/tesla-t4/t4-tensor-core-datasheet-951643.pdf"
	srcV100    = "https://images.nvidia.com/content/technologies/volta/pdf/volta-v100-datasheet-update-us-1165301-r5.pdf"
	srcP100    = "https://images.nvidia.com/content/tesla/pdf/nvidia-tesla-p100-datasheet.pdf"
	srcA100    = "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf"
	srcA30     = "https://www.nvidia.com/content/dam/en-zz/Solutions/data-center/products/a30-gpu/pdf/a30-datasheet.pdf"
	srcA40     = "https://images.nvidia.com/content/Solutions/data-center/a40/nvidia-a40-datasheet.pdf"
	srcA10     = "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a10/pdf/datasheet-new/nvidia-a10-datasheet.pdf"
	srcH100    = "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet"
	srcH200    = "https://www.nvidia.com/en-us/data-center/h200/"
	srcHGX     = "https://www.nvidia.com/en-us/data-center/hgx/"
	srcGB200   = "https://www.nvidia.com/en-us/data-center/gb200-nvl72/"
	srcL40S    = "https://www.nvidia.com/en-us/data-center/l40s/"
	srcL40     = "https://www.nvidia.com/en-us/data-center/l40/"
	srcL4      = "https://www.nvidia.com/en-us/data-center/l4/"
	srcAda     = "https://images.nvidia.com/aem-dam/Solutions/geforce/ada/nvidia-ada-gpu-architecture.pdf"
	srcRTX6KA  = "https://www.nvidia.com/en-us/design-visualization/rtx-6000/"
	srcRTXA6K  = "https://www.nvidia.com/en-us/design-visualization/rtx-a6000/"
	srcQRTX6K  = "https://www.nvidia.com/content/dam/en-zz/Solutions/design-visualization/quadro-product-literature/quadro-rtx-6000-us-nvidia-704093-r4-web.pdf"
	srcBWRTX   = "https://images.nvidia.com/aem-dam/Solutions/geforce/blackwell/nvidia-rtx-blackwell-gpu-architecture.pdf"
	srcGA102   = "https://www.nvidia.com/content/PDF/nvidia-ampere-ga-102-gpu-architecture-whitepaper-v2.pdf"
	srcTuring  = "https://images.nvidia.com/aem-dam/en-zz/Solutions/design-visualization/technologies/turing-architecture/NVIDIA-Turing-Architecture-Whitepaper.pdf"
	srcH800SXM = "https://www.nvidia.cn/data-center/h800/"
)

func spec(name, match string, tflops, memGBps float64, sources ...string) Spec {
	return Spec{Name: name, TFLOPS: tflops, MemGBps: memGBps, Sources: sources, match: regexp.MustCompile(match)}
}

// table lists the models, a more specific name before one it contains
// (GB200 before B200, an H100 PCIe before the H100 SXM, the L40S before
// the L40 before the L4). Where a spec sheet gives one figure for a
// board of several GPUs (HGX B200, GB200 NVL72), the entry is that figure
// over its GPUs; where it gives "with sparsity" only, half of it.
var table = []Spec{
	// GB200 NVL72: 360 PFLOPS bf16 with sparsity and 576 TB/s over 72
	// Blackwell GPUs.
	spec("GB200", `\bgb200\b`, 2500, 8000, srcGB200),
	// HGX B200: 36 PFLOPS bf16 with sparsity, 64 TB/s over 8 GPUs.
	spec("B200", `\bb200\b`, 2250, 8000, srcHGX),
	// HGX B100: 28 PFLOPS bf16 with sparsity, 64 TB/s over 8 GPUs.
	spec("B100", `\bb100\b`, 1750, 8000, srcHGX),
	spec("H200 SXM", `\bh200\b`, 989, 4800, srcH200),
	spec("H100 PCIe", `\bh100\b.*\bpcie\b`, 756, 2000, srcH100),
	spec("H100 NVL", `\bh100 ?nvl\b`, 835, 3900, srcH100),
	spec("H100 SXM", `\bh100\b`, 989, 3350, srcH100),
	// The H800 is the H100 SXM with fewer NVLinks: the same compute and
	// memory.
	spec("H800 SXM", `\bh800\b`, 989, 3350, srcH800SXM, srcH100),
	spec("A100 40GB", `\ba100\b.*\b40gb\b`, 312, 1555, srcA100),
	spec("A100 PCIe 80GB", `\ba100\b.*\bpcie\b`, 312, 1935, srcA100),
	spec("A100 SXM 80GB", `\ba100\b`, 312, 2039, srcA100),
	// The A800 is the A100 with fewer NVLinks: the same compute and
	// memory.
	spec("A800 SXM 80GB", `\ba800\b`, 312, 2039, srcA100),
	spec("A30", `\ba30\b`, 165, 933, srcA30),
	spec("A40", `\ba40\b`, 149.7, 696, srcA40),
	spec("A10", `\ba10\b`, 125, 600, srcA10),
	spec("L40S", `\bl40s\b`, 362.05, 864, srcL40S),
	spec("L40", `\bl40\b`, 181.05, 864, srcL40),
	spec("L4", `\bl4\b`, 121, 300, srcL4),
	spec("T4", `\bt4\b`, 65, 320, srcT4),
	spec("V100 PCIe", `\bv100\b.*\bpcie\b`, 112, 900, srcV100),
	spec("V100 SXM2", `\bv100\b`, 125, 900, srcV100),
	// No tensor cores: the fp16 peak of the SXM2 board.
	spec("P100", `\bp100\b`, 21.2, 732, srcP100),
	spec("RTX 6000 Ada", `\brtx ?6000 ada\b`, 364.2, 960, srcRTX6KA),
	spec("RTX A6000", `\brtx ?a6000\b`, 154.8, 768, srcRTXA6K),
	spec("Quadro RTX 6000", `\brtx ?6000\b`, 130.5, 672, srcQRTX6K, srcTuring),
	spec("RTX 5090", `\brtx ?5090\b`, 209.5, 1792, srcBWRTX),
	spec("RTX 4090", `\brtx ?4090\b`, 165.2, 1008, srcAda),
	spec("RTX 3090", `\brtx ?3090\b`, 71, 936, srcGA102),
	spec("RTX 2080 Ti", `\brtx ?2080 ?ti\b`, 53.8, 616, srcTuring),
}

// Models lists the table's entries, in the order they are matched.
func Models() []Spec {
	return append([]Spec(nil), table...)
}

var separators = regexp.MustCompile(`[-_/\s]+`)

// Lookup finds a GPU model by its name as discovery, a cluster file or a
// user gives it ("NVIDIA H100 80GB HBM3", "A100-SXM4-80GB", "Tesla T4",
// "rtx4090", "a100").
func Lookup(model string) (Spec, bool) {
	if v, ok := lookups.Load(model); ok {
		r := v.(lookup)
		return r.spec, r.ok
	}
	r := lookup{}
	if name := separators.ReplaceAllString(strings.ToLower(strings.TrimSpace(model)), " "); name != "" {
		for _, s := range table {
			if s.match.MatchString(name) {
				r = lookup{s, true}
				break
			}
		}
	}
	// The names a cluster reports are few, and asked on every decision
	// and telemetry; a job's own names are bounded per job but not over
	// jobs, so the cache stops growing at maxLookups.
	if lookupsHeld.Load() < maxLookups {
		if _, loaded := lookups.LoadOrStore(model, r); !loaded {
			lookupsHeld.Add(1)
		}
	}
	return r.spec, r.ok
}

// lookups caches Lookup's answers by the name asked, at most maxLookups.
var (
	lookups     sync.Map
	lookupsHeld atomic.Int64
)

const maxLookups = 4096

type lookup struct {
	spec Spec
	ok   bool
}
