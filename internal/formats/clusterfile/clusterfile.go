package clusterfile

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/internal/formats/fabric"
	"github.com/toposched/toposched/internal/topology"
)

// Cluster is a parsed cluster file.
type Cluster struct {
	Name   string                `json:"name"`
	Nodes  []events.TopologyNode `json:"nodes"`
	Fabric events.TopologyFabric `json:"fabric"`
}

// NodeSpec is one node entry of a cluster file.
type NodeSpec struct {
	Name      string            `yaml:"name"`
	GPUs      int               `yaml:"gpus"`
	GPUModel  string            `yaml:"gpu_model"`
	MemoryMiB int               `yaml:"memory_mib"`
	Labels    map[string]string `yaml:"labels"`
	// Count expands the entry into Count nodes named Name-001, Name-002...
	Count int `yaml:"count"`
	// Model names a built-in node model (dgx-a100, dgx-h100, hgx-h100,
	// pcie-8gpu) that gives the node's inner topology.
	Model string `yaml:"model"`
	// NVIDIASMI and NCCLXML name a file (relative to the cluster file)
	// describing the node: `nvidia-smi topo -m` output or NCCL topology
	// XML.
	NVIDIASMI string `yaml:"nvidia_smi"`
	NCCLXML   string `yaml:"nccl_xml"`
	// NVLinks, for an NCCL XML without NVLink, gives every GPU pair that
	// many NVLinks (an NVSwitch board whose model is not known).
	NVLinks int `yaml:"nvlinks"`
}

// SwitchSpec is one fabric switch of a cluster file (see events.Switch).
type SwitchSpec struct {
	Name     string   `yaml:"name"`
	Tier     string   `yaml:"tier"`
	Nodes    []string `yaml:"nodes"`
	Switches []string `yaml:"switches"`
	// LinkGbps is the rate (Gb/s) of each link down to a child; UplinkGbps
	// of each of the Uplinks links up.
	LinkGbps   float64 `yaml:"link_gbps"`
	Uplinks    int     `yaml:"uplinks"`
	UplinkGbps float64 `yaml:"uplink_gbps"`
	// Oversubscription is down over up capacity, at least 1 (0: 1).
	Oversubscription float64 `yaml:"oversubscription"`
	// Rail is the rail a leaf serves in a rail-optimized fabric.
	Rail *int `yaml:"rail"`
	// NVLinks, on a tier: nvlink switch (a multi-node NVLink domain such
	// as a GB200 NVL72 rack), is the NVLinks between any two of its GPUs.
	NVLinks int `yaml:"nvlinks"`
}

// FabricSpec is the fabric section of a cluster file: switches listed in
// the file, or one file to import, named relative to the cluster file: a
// Slurm topology.conf (Slurm) or a Clos table (ClosCSV), read by package
// fabric.
type FabricSpec struct {
	Switches []SwitchSpec `yaml:"switches"`
	Slurm    string       `yaml:"slurm"`
	ClosCSV  string       `yaml:"clos_csv"`
}

type fileSpec struct {
	Name   string     `yaml:"name"`
	Nodes  []NodeSpec `yaml:"nodes"`
	Fabric FabricSpec `yaml:"fabric"`
}

// MaxGPUsPerNode bounds a node entry; no real node is near it.
const MaxGPUsPerNode = 256

var nodeNamePattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$`)

// LoadCluster reads a cluster file from disk.
func LoadCluster(path string) (Cluster, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Cluster{}, fmt.Errorf("cluster file: %w", err)
	}
	return ParseCluster(path, data)
}

// ParseCluster parses a cluster file (YAML or JSON). Errors name the file,
// the line and what was expected; every problem found is reported.
func ParseCluster(file string, data []byte) (Cluster, error) {
	var root yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&root); err != nil {
		if errors.Is(err, io.EOF) {
			return Cluster{}, fmt.Errorf("%s:1: nodes: expected a list of at least one node, the file is empty", file)
		}
		return Cluster{}, fmt.Errorf("%s: %w", file, err)
	}
	var spec fileSpec
	strict := yaml.NewDecoder(bytes.NewReader(data))
	strict.KnownFields(true)
	if err := strict.Decode(&spec); err != nil {
		return Cluster{}, fmt.Errorf("%s: %w", file, err)
	}
	lines := entryLines(&root, "nodes")
	var errs []error
	bad := func(line int, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s:%d: %s", file, line, fmt.Sprintf(format, args...)))
	}
	c := Cluster{Name: spec.Name}
	if c.Name == "" {
		c.Name = "default"
	}
	if len(spec.Nodes) == 0 {
		bad(1, "nodes: expected a list of at least one node")
	}
	seen := map[string]int{}
	for i, ns := range spec.Nodes {
		line := lineAt(lines, i)
		if ns.Count < 0 {
			bad(line, "nodes[%d].count: expected a positive number, got %d", i, ns.Count)
			continue
		}
		names := []string{ns.Name}
		if ns.Count > 0 {
			names = names[:0]
			for k := 1; k <= ns.Count; k++ {
				names = append(names, fmt.Sprintf("%s-%03d", ns.Name, k))
			}
		}
		var topo *topology.Node
		sources := 0
		for _, v := range []string{ns.Model, ns.NVIDIASMI, ns.NCCLXML} {
			if v != "" {
				sources++
			}
		}
		if sources > 1 {
			bad(line, "nodes[%d]: expected at most one of model, nvidia_smi and nccl_xml", i)
		}
		var t *topology.Node
		var err error
		switch {
		case sources > 1:
		case ns.Model != "":
			t, err = Model(ns.Model)
			if err != nil {
				bad(line, "nodes[%d].model: %v", i, err)
			}
		case ns.NVIDIASMI != "" || ns.NCCLXML != "":
			t, err = loadRelative(file, cmp.Or(ns.NVIDIASMI, ns.NCCLXML),
				NodeFileOptions{GPUModel: ns.GPUModel, NVLinks: ns.NVLinks})
			if err != nil {
				bad(line, "nodes[%d]: %v", i, err)
			}
		}
		if t != nil {
			{
				topo = t
				if ns.GPUs == 0 {
					ns.GPUs = len(t.GPUs)
				}
				if ns.GPUModel == "" {
					ns.GPUModel = t.GPUs[0].Model
				}
				if ns.MemoryMiB == 0 {
					ns.MemoryMiB = t.GPUs[0].MemoryMiB
				}
				if ns.GPUs != len(t.GPUs) {
					bad(line, "nodes[%d].gpus: %s has %d GPUs, got %d", i, t.Source, len(t.GPUs), ns.GPUs)
					topo = nil
				}
			}
		}
		if ns.GPUs < 1 || ns.GPUs > MaxGPUsPerNode {
			bad(line, "nodes[%d].gpus: expected 1 to %d GPUs, got %d", i, MaxGPUsPerNode, ns.GPUs)
		}
		for _, name := range names {
			switch {
			case !nodeNamePattern.MatchString(name):
				bad(line, "nodes[%d].name: expected a host name (letters, digits, '.', '_', '-'), got %q", i, name)
				continue
			case seen[name] != 0:
				bad(line, "nodes[%d].name: %q already defined on line %d", i, name, seen[name])
				continue
			}
			seen[name] = line
			node := events.TopologyNode{}
			if topo != nil {
				node = topo.Event()
			}
			node.Name, node.Position, node.GPUModel, node.Labels = name, len(c.Nodes), ns.GPUModel, ns.Labels
			if topo == nil {
				node.GPUs = make([]events.GPU, max(ns.GPUs, 0))
			}
			for g := range node.GPUs {
				node.GPUs[g].Index, node.GPUs[g].Health = g, events.HealthHealthy
				node.GPUs[g].Model = cmp.Or(ns.GPUModel, node.GPUs[g].Model)
				node.GPUs[g].MemoryMiB = cmp.Or(ns.MemoryMiB, node.GPUs[g].MemoryMiB)
			}
			c.Nodes = append(c.Nodes, node)
		}
	}
	c.Fabric = parseFabric(file, &root, spec.Fabric, seen, bad)
	c.Fabric.Cluster = c.Name
	if err := errors.Join(errs...); err != nil {
		return Cluster{}, err
	}
	return c, nil
}

// maxUnknownFabricNodes bounds the names a warning about imported fabric
// nodes that the cluster lacks lists.
const maxUnknownFabricNodes = 5

// parseFabric reads the fabric section: switches listed in the cluster
// file, or a file to import. Nodes of listed switches must be nodes of the
// cluster; an imported file may name others (a Slurm topology.conf also
// lists CPU nodes), which is a warning. The result is checked by
// topology.NewFabric: cycles, tiers, a node below two leaves.
func parseFabric(file string, root *yaml.Node, spec FabricSpec, seen map[string]int, bad func(int, string, ...any)) events.TopologyFabric {
	var fab events.TopologyFabric
	fabricLine := max(keyLine(root, "fabric"), 1)
	var given []string
	for _, g := range []struct {
		key string
		set bool
	}{{"switches", len(spec.Switches) > 0}, {"slurm", spec.Slurm != ""}, {"clos_csv", spec.ClosCSV != ""}} {
		if g.set {
			given = append(given, g.key)
		}
	}
	if len(given) > 1 {
		bad(fabricLine, "fabric: expected one of switches, slurm and clos_csv, got %s", strings.Join(given, " and "))
		return fab
	}
	// prefix leads what NewFabric reports (its lines start "fabric: ").
	prefix := ""
	switch {
	case spec.Slurm != "" || spec.ClosCSV != "":
		key, name, parse := "slurm", spec.Slurm, fabric.ParseSlurm
		if spec.ClosCSV != "" {
			key, name, parse = "clos_csv", spec.ClosCSV, fabric.ParseClosCSV
		}
		field := "fabric." + key // names the fabric's source in errors
		fabricLine = max(keyLine(root, "fabric", key), fabricLine)
		path := name
		if !filepath.IsAbs(path) {
			path = filepath.Join(filepath.Dir(file), path)
		}
		prefix = field + ": " + path + ": "
		data, err := os.ReadFile(path)
		if err != nil {
			bad(fabricLine, "%s: %v", field, err)
			return fab
		}
		if fab, err = parse(path, data); err != nil {
			badLines(bad, fabricLine, field+": ", err)
			return events.TopologyFabric{}
		}
		var unknown []string
		for _, sw := range fab.Switches {
			for _, n := range sw.Nodes {
				if seen[n] == 0 {
					unknown = append(unknown, n)
				}
			}
		}
		if len(unknown) > 0 {
			some := unknown[:min(len(unknown), maxUnknownFabricNodes)]
			more := ""
			if len(unknown) > len(some) {
				more = fmt.Sprintf(" and %d more", len(unknown)-len(some))
			}
			what := fmt.Sprintf("%d nodes that are not nodes", len(unknown))
			if len(unknown) == 1 {
				what = "1 node that is not a node"
			}
			fab.Warnings = append(fab.Warnings, fmt.Sprintf("%s:%d: %s: %s names %s of this cluster: %s%s",
				file, fabricLine, field, path, what, strings.Join(some, ", "), more))
		}
	default:
		if !listedSwitches(file, root, spec.Switches, seen, bad, &fab) {
			return fab
		}
	}
	if len(fab.Switches) == 0 {
		return fab
	}
	if _, err := topology.NewFabric(fab); err != nil {
		badLines(bad, fabricLine, prefix, err)
	}
	return fab
}

// listedSwitches reads the switches of the fabric section into fab and
// reports whether they are well formed, one by one.
func listedSwitches(file string, root *yaml.Node, specs []SwitchSpec, seen map[string]int, bad func(int, string, ...any), fab *events.TopologyFabric) bool {
	swLines := entryLines(root, "fabric", "switches")
	ok := true
	badAt := func(line int, format string, args ...any) {
		ok = false
		bad(line, format, args...)
	}
	switches := map[string]bool{}
	for _, sw := range specs {
		switches[sw.Name] = true
	}
	for i, sw := range specs {
		line := lineAt(swLines, i)
		if sw.Name == "" {
			badAt(line, "fabric.switches[%d].name: expected a name", i)
		}
		switch sw.Tier {
		case "leaf", "spine", "core", "nvlink":
		default:
			badAt(line, "fabric.switches[%d].tier: expected leaf, spine, core or nvlink, got %q", i, sw.Tier)
		}
		for _, n := range sw.Nodes {
			if seen[n] == 0 {
				badAt(line, "fabric.switches[%d].nodes: %q is not a node of this cluster", i, n)
			}
		}
		for _, s := range sw.Switches {
			if !switches[s] {
				badAt(line, "fabric.switches[%d].switches: %q is not a switch of this fabric", i, s)
			}
		}
		for _, r := range []struct {
			key string
			v   float64
		}{{"link_gbps", sw.LinkGbps}, {"uplink_gbps", sw.UplinkGbps}} {
			if r.v < 0 || math.IsNaN(r.v) || math.IsInf(r.v, 0) {
				badAt(line, "fabric.switches[%d].%s: expected a rate in Gb/s of at least 0, got %v", i, r.key, r.v)
			}
		}
		if sw.Uplinks < 0 {
			badAt(line, "fabric.switches[%d].uplinks: expected a number of links of at least 0, got %d", i, sw.Uplinks)
		}
		if o := sw.Oversubscription; o != 0 && !(o >= 1 && !math.IsInf(o, 0)) {
			badAt(line, "fabric.switches[%d].oversubscription: expected a ratio of at least 1 (or 0, not given), got %v", i, o)
		}
		if sw.Rail != nil {
			switch {
			case *sw.Rail < 0:
				badAt(line, "fabric.switches[%d].rail: expected a rail number of at least 0, got %d", i, *sw.Rail)
			case sw.Tier != "leaf":
				badAt(line, "fabric.switches[%d].rail: expected a rail on a leaf only, got rail %d on a %s", i, *sw.Rail, sw.Tier)
			}
		}
		fab.Switches = append(fab.Switches, events.Switch{
			Name: sw.Name, Tier: sw.Tier, Nodes: sw.Nodes, Switches: sw.Switches,
			LinkGbps: sw.LinkGbps, Uplinks: sw.Uplinks, UplinkGbps: sw.UplinkGbps,
			Oversubscription: sw.Oversubscription, Rail: sw.Rail, NVLinks: sw.NVLinks,
		})
	}
	return ok
}

// badLines reports each line of a (joined) error at line, after prefix.
func badLines(bad func(int, string, ...any), line int, prefix string, err error) {
	for l := range strings.SplitSeq(err.Error(), "\n") {
		bad(line, "%s%s", prefix, l)
	}
}

// keyLine returns the line of the key at path, 0 when it is absent.
func keyLine(root *yaml.Node, path ...string) int {
	n := root
	if n.Kind == yaml.DocumentNode && len(n.Content) > 0 {
		n = n.Content[0]
	}
	line := 0
	for _, key := range path {
		if n.Kind != yaml.MappingNode {
			return 0
		}
		var next *yaml.Node
		for i := 0; i+1 < len(n.Content); i += 2 {
			if strings.EqualFold(n.Content[i].Value, key) {
				next, line = n.Content[i+1], n.Content[i].Line
			}
		}
		if next == nil {
			return 0
		}
		n = next
	}
	return line
}

// entryLines finds the line of each item of the sequence at path.
func entryLines(root *yaml.Node, path ...string) []int {
	n := root
	if n.Kind == yaml.DocumentNode && len(n.Content) > 0 {
		n = n.Content[0]
	}
	for _, key := range path {
		if n.Kind != yaml.MappingNode {
			return nil
		}
		var next *yaml.Node
		for i := 0; i+1 < len(n.Content); i += 2 {
			if strings.EqualFold(n.Content[i].Value, key) {
				next = n.Content[i+1]
			}
		}
		if next == nil {
			return nil
		}
		n = next
	}
	var out []int
	for _, item := range n.Content {
		out = append(out, item.Line)
	}
	return out
}

func lineAt(lines []int, i int) int {
	if i < len(lines) {
		return lines[i]
	}
	return 1
}

// loadRelative imports a node description named relative to the cluster
// file.
func loadRelative(clusterFile, path string, opts NodeFileOptions) (*topology.Node, error) {
	if !filepath.IsAbs(path) {
		path = filepath.Join(filepath.Dir(clusterFile), path)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return parseNodeFile(path, data, opts)
}
