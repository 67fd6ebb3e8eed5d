package slurmconf

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/internal/formats/fabric"
)

// DefaultDeviceFormat is the device file of GPU i: the NVIDIA driver's
// /dev/nvidia<minor>, taking the minor number to be the index.
const DefaultDeviceFormat = "/dev/nvidia%d"

// Options say what gres.conf needs that discovery does not say.
type Options struct {
	// DeviceFormat is the device file of GPU i, a format with one %d;
	// DefaultDeviceFormat when empty.
	DeviceFormat string
	// IndexTypes gives every GPU a type of its own, g<index>, so that a job
	// can ask for exact GPUs (--gres=gpu:g1:1,gpu:g3:1): Slurm 22.05 has
	// no other way to. Plain --gres=gpu:N still works; gpu:<model>:N no
	// longer does.
	IndexTypes bool
	// ThreadsPerCore is the nodes' hardware threads per core (slurm.conf's
	// ThreadsPerCore); 0 means 1. With more than 1, CoresPerNode must be
	// set: Cores= takes Slurm's logical core indices, and a CPU c of a
	// GPU's affinity is core c mod CoresPerNode, Linux's numbering on x86
	// (a core's second threads numbered after every core's first).
	ThreadsPerCore int
	// CoresPerNode is the nodes' cores (slurm.conf's Sockets times
	// CoresPerSocket); 0 when not checked. An affinity CPU at or beyond
	// CoresPerNode times ThreadsPerCore is an error.
	CoresPerNode int
}

// check validates the options.
func (o Options) check() error {
	var errs []error
	if o.DeviceFormat != "" {
		if strings.Count(o.DeviceFormat, "%") != 1 || !strings.Contains(o.DeviceFormat, "%d") {
			errs = append(errs, fmt.Errorf("device format: expected a path with one %%d for the GPU index, such as %s, got %q", DefaultDeviceFormat, o.DeviceFormat))
		} else if f := fmt.Sprintf(o.DeviceFormat, 0); strings.ContainsAny(f, "[], \t\n#\"\\") {
			errs = append(errs, fmt.Errorf("device format: expected a path without '[', ']', ',', '#', quotes, backslashes or white space, got %q", o.DeviceFormat))
		}
	}
	if o.ThreadsPerCore < 0 || o.ThreadsPerCore > 8 {
		errs = append(errs, fmt.Errorf("threads per core: expected 1 to 8, got %d", o.ThreadsPerCore))
	}
	if o.CoresPerNode < 0 || o.CoresPerNode > MaxCPU {
		errs = append(errs, fmt.Errorf("cores per node: expected 1 to %d, got %d", MaxCPU, o.CoresPerNode))
	}
	if o.ThreadsPerCore > 1 && o.CoresPerNode == 0 {
		errs = append(errs, fmt.Errorf("threads per core: %d needs the cores per node, to turn the GPUs' CPUs into Slurm's core indices", o.ThreadsPerCore))
	}
	return errors.Join(errs...)
}

// TypeOf is the GRES type of a GPU model: lower case, each run of
// characters other than letters, digits, '.', '_' and '-' made one '_'
// (NVIDIA H100 80GB HBM3 -> nvidia_h100_80gb_hbm3), as Slurm's AutoDetect
// spells types; "" for "".
func TypeOf(model string) string {
	var b strings.Builder
	under := false
	for _, r := range strings.ToLower(strings.TrimSpace(model)) {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-' {
			b.WriteRune(r)
			under = false
			continue
		}
		if !under {
			b.WriteByte('_')
			under = true
		}
	}
	t := b.String()
	if len(t) > 64 {
		t = t[:64]
	}
	return t
}

// NodeGPUs is what gres.conf says of node's GPUs, in index order: type,
// device file, Cores= from each GPU's CPU affinity (nil where discovery
// did not report one) and Links= from the NVLink counts of the node's path
// matrix (NV# is # links; anything else, or no matrix, 0). Links is
// always given: Slurm orders a node's GPUs by the place of -1 in Links
// when it merges them with what AutoDetect finds, so it pins each GPU to
// its index. The GPUs must be indexed 0 to n-1; a MIG GPU is refused
// (its gres.conf records come from AutoDetect=nvml).
func NodeGPUs(node events.TopologyNode, opts Options) ([]GPU, error) {
	if err := opts.check(); err != nil {
		return nil, err
	}
	return nodeGPUs(node, opts)
}

func nodeGPUs(node events.TopologyNode, opts Options) ([]GPU, error) {
	format := opts.DeviceFormat
	if format == "" {
		format = DefaultDeviceFormat
	}
	gpus := slices.Clone(node.GPUs)
	slices.SortFunc(gpus, func(a, b events.GPU) int { return a.Index - b.Index })
	n := len(gpus)
	if n > MaxGPUsPerNode {
		return nil, fmt.Errorf("node %s: gpus: expected at most %d, got %d", node.Name, MaxGPUsPerNode, n)
	}
	hasPaths := len(node.GPUPaths) == n
	var errs []error
	out := make([]GPU, n)
	for i, g := range gpus {
		if g.Index != i {
			return nil, fmt.Errorf("node %s: gpus: expected indices 0 to %d, got index %d", node.Name, n-1, g.Index)
		}
		if g.MIG {
			errs = append(errs, fmt.Errorf("node %s: gpu %d: mig: a MIG GPU's gres.conf records come from AutoDetect=nvml, not written here", node.Name, i))
			continue
		}
		gpu := GPU{Index: i, File: fmt.Sprintf(format, i), Links: make([]int, n)}
		if opts.IndexTypes {
			gpu.Type = "g" + strconv.Itoa(i)
		} else {
			gpu.Type = TypeOf(firstNonEmpty(g.Model, node.GPUModel))
		}
		if g.CPUAffinity != "" {
			cores, err := coresOf(g.CPUAffinity, opts)
			if err != nil {
				errs = append(errs, fmt.Errorf("node %s: gpu %d: cpu_affinity: %w", node.Name, i, err))
			}
			gpu.Cores = cores
		}
		for j := range gpu.Links {
			switch {
			case j == i:
				gpu.Links[j] = -1
			case hasPaths && len(node.GPUPaths[i]) == n:
				gpu.Links[j] = nvlinks(node.GPUPaths[i][j])
			}
		}
		out[i] = gpu
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return out, nil
}

func firstNonEmpty(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// nvlinks is the number of NVLinks of a path class: # of NV#, else 0.
func nvlinks(class string) int {
	if rest, ok := strings.CutPrefix(class, "NV"); ok {
		if n, err := strconv.Atoi(rest); err == nil && n > 0 && n <= MaxCPU {
			return n
		}
	}
	return 0
}

// coresOf turns a GPU's CPU affinity (Linux CPU numbers) into Slurm's
// logical core indices.
func coresOf(affinity string, opts Options) ([]int, error) {
	cpus, err := ParseCPUList(affinity)
	if err != nil {
		return nil, err
	}
	threads := max(opts.ThreadsPerCore, 1)
	if opts.CoresPerNode == 0 {
		return cpus, nil
	}
	limit := opts.CoresPerNode * threads
	cores := make([]int, 0, len(cpus))
	for _, c := range cpus {
		if c >= limit {
			return nil, fmt.Errorf("expected CPUs below %d (%d cores x %d threads per core), got CPU %d in %q", limit, opts.CoresPerNode, threads, c, abbreviate(affinity))
		}
		cores = append(cores, c%opts.CoresPerNode)
	}
	slices.Sort(cores)
	return slices.Compact(cores), nil
}

// GresValue is the Gres= slurm.conf must give a node with these GPUs
// (gpu:h100:4, or gpu:g0:1,gpu:g1:1 with per-index types): slurmctld
// refuses a node whose gres.conf offers more than its Gres= says.
func GresValue(gpus []GPU) string {
	var parts []string
	count := map[string]int{}
	for _, g := range gpus {
		if count[g.Type] == 0 {
			parts = append(parts, g.Type)
		}
		count[g.Type]++
	}
	for i, t := range parts {
		if t == "" {
			parts[i] = "gpu:" + strconv.Itoa(count[t])
		} else {
			parts[i] = "gpu:" + t + ":" + strconv.Itoa(count[t])
		}
	}
	return strings.Join(parts, ",")
}

// WriteGres renders gres.conf for nodes (removed nodes and nodes without
// GPUs are left out): one line per GPU, nodes whose lines would be the
// same sharing them under one NodeName hostlist, in the nodes' order. A
// comment above each group says the Gres= slurm.conf must give those
// nodes. Every problem found is reported, each naming the node and field.
func WriteGres(nodes []events.TopologyNode, opts Options) ([]byte, error) {
	if err := opts.check(); err != nil {
		return nil, err
	}
	type group struct {
		names []string
		gpus  []GPU
	}
	var groups []*group
	var errs []error
	for _, n := range nodes {
		if n.Removed || len(n.GPUs) == 0 {
			continue
		}
		if !nodeNamePattern.MatchString(n.Name) {
			errs = append(errs, fmt.Errorf("node %q: name: expected a host name (letters, digits, '.', '_', '-')", abbreviate(n.Name)))
			continue
		}
		gpus, err := nodeGPUs(n, opts)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		i := slices.IndexFunc(groups, func(g *group) bool { return sameGPUs(g.gpus, gpus) })
		if i < 0 {
			groups = append(groups, &group{gpus: gpus})
			i = len(groups) - 1
		}
		groups[i].names = append(groups[i].names, n.Name)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	var b bytes.Buffer
	b.WriteString("# gres.conf written by toposched slurm-conf from the cluster's topology.\n")
	b.WriteString("# A GPU's index on its node is its place among the node's lines; Links= gives\n")
	b.WriteString("# its NVLinks to each GPU of the node (-1 itself, 0 none), which cons_tres uses\n")
	b.WriteString("# to give a job well-linked GPUs; Cores= the cores of its NUMA node.\n")
	for _, g := range groups {
		hl := fabric.CompressHostlist(g.names)
		fmt.Fprintf(&b, "\n# slurm.conf: NodeName=%s ... Gres=%s\n", hl, GresValue(g.gpus))
		for _, gpu := range g.gpus {
			fmt.Fprintf(&b, "NodeName=%s Name=gpu", hl)
			if gpu.Type != "" {
				fmt.Fprintf(&b, " Type=%s", gpu.Type)
			}
			fmt.Fprintf(&b, " File=%s", gpu.File)
			if gpu.Cores != nil {
				fmt.Fprintf(&b, " Cores=%s", FormatCPUList(gpu.Cores))
			}
			b.WriteString(" Links=")
			for j, l := range gpu.Links {
				if j > 0 {
					b.WriteByte(',')
				}
				b.WriteString(strconv.Itoa(l))
			}
			b.WriteByte('\n')
		}
	}
	return b.Bytes(), nil
}

// sameGPUs reports whether two nodes' GPUs are described alike.
func sameGPUs(a, b []GPU) bool {
	return slices.EqualFunc(a, b, func(x, y GPU) bool {
		return x.Index == y.Index && x.Type == y.Type && x.File == y.File &&
			slices.Equal(x.Cores, y.Cores) && slices.Equal(x.Links, y.Links)
	})
}
