package slurmconf

import (
	"cmp"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/toposched/toposched/internal/formats/fabric"
)

// MaxGPUsPerNode is Slurm's bound on the GRES records with File of one
// node (gres.conf(5): "Count is limited in size (currently 1024)").
const MaxGPUsPerNode = 1024

// GPU is one GPU of a node as gres.conf describes it: one Name=gpu record
// with one device file.
type GPU struct {
	// Index is the GPU's GRES index on its node: its place among the
	// node's gpu records in file order, the number CUDA_VISIBLE_DEVICES,
	// --gpu-bind=map_gpu and squeue's gres_detail IDX use.
	Index int
	// Type is "" when the record gives none.
	Type string
	// File is the device file (MultipleFiles' list for a MIG GPU).
	File string
	// Cores are Slurm's logical core indices the GPU is close to; nil when
	// not given.
	Cores []int
	// Links[j] is the number of NVLinks to GPU j, -1 at Index; nil when
	// not given.
	Links []int
	// Line is the gres.conf line the record came from; 0 for a record
	// made from discovery.
	Line int
}

// Gres is a parsed gres.conf: its GPU records, per node.
type Gres struct {
	// Nodes maps each node a line names to its GPUs, in index order:
	// the lines naming it and the lines naming no node, in file order.
	Nodes map[string][]GPU
	// Order lists the nodes of Nodes as the file first names them.
	Order []string
	// Global are the GPUs of the lines that name no node: all the GPUs of
	// a node no line names.
	Global []GPU
	// AutoDetect is the AutoDetect value of the line that gives it alone
	// ("nvml", "off"...); "" when none does.
	AutoDetect string
}

// gresExample is a well-formed gres.conf line, quoted in syntax errors.
const gresExample = "NodeName=n[1-2] Name=gpu File=/dev/nvidia0"

// gresKeys are the keys of a record (after NodeName or Name), lower case.
var gresKeys = []string{"autodetect", "count", "cores", "cpus", "file", "files", "flags", "link", "links", "multiplefiles", "name", "type"}

// gresFlags are the values Flags accepts in Slurm 22.05, lower case.
var gresFlags = []string{"countonly", "one_sharing", "all_sharing", "nvidia_gpu_env", "amd_gpu_env", "intel_gpu_env", "opencl_env", "no_gpu_env"}

// typePattern is what this package accepts as a GRES type: Slurm splits
// gpu:<type>:<count> at ':' and lists at ','.
var typePattern = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,64}$`)

var nodeNamePattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$`)

// gresRecord is one line's GPUs before they are given to nodes.
type gresRecord struct {
	line  int
	nodes []string // nil: every node
	gpus  []GPU    // Index unset
}

// ParseGres reads a gres.conf. file names the file in errors, which say
// the line, the key at fault and what was expected; every problem found is
// reported, joined with errors.Join, in line order.
//
// Lines start with NodeName=<hostlist>, Name=<gres> or AutoDetect=<how>, as
// Slurm requires; keys are case insensitive. Only Name=gpu records are read
// as GPUs (mps, shard, nic records are checked and passed over). A gpu
// record needs File (one device, or a hostlist such as /dev/nvidia[0-3]
// for several) or MultipleFiles (one MIG GPU): without one Slurm discards
// it, and the devices AutoDetect would find are not in the file. Count,
// if given, must equal the number of files. Links may only be given with
// one file; it must have one entry per GPU of each node the line names,
// -1 at the GPU's own index and a count of at least 0 elsewhere, and
// agree with the other GPU's Links about their pair. A device file is
// named once per node, and a node has at most MaxGPUsPerNode GPUs. The
// lines naming no node are every node's: they are checked as the GPUs of a
// node no line names, and a fault of a line is told once, for one node.
func ParseGres(file string, data []byte) (Gres, error) {
	p := &problems{file: file}
	g := Gres{Nodes: map[string][]GPU{}}
	var records []gresRecord
	autoDetectLine := 0
	for _, sl := range fabric.SlurmLines(data, gresExample) {
		if sl.Err != nil {
			p.add(sl.Line, "%v", sl.Err)
			continue
		}
		first := sl.Pairs[0]
		rec := gresRecord{line: sl.Line}
		switch strings.ToLower(first.Key) {
		case "nodename":
			names, err := fabric.ExpandHostlist(first.Value)
			if err != nil {
				p.add(sl.Line, "%s: expected a hostlist such as n[1-4,7], got %q: %v", first.Key, abbreviate(first.Value), err)
				continue
			}
			for _, n := range names {
				if !nodeNamePattern.MatchString(n) {
					p.add(sl.Line, "%s: expected host names (letters, digits, '.', '_', '-'), got %q", first.Key, abbreviate(n))
					names = nil
					break
				}
			}
			if names == nil {
				continue
			}
			rec.nodes = uniqueStrings(names)
		case "name":
		case "autodetect":
			if len(sl.Pairs) == 1 {
				if !checkAutoDetect(p, sl.Line, first) {
					continue
				}
				if autoDetectLine != 0 {
					p.add(sl.Line, "%s: expected it once alone on a line, got it again (first on line %d)", first.Key, autoDetectLine)
					continue
				}
				autoDetectLine, g.AutoDetect = sl.Line, strings.ToLower(first.Value)
				continue
			}
		default:
			p.add(sl.Line, "%s: expected NodeName, Name or AutoDetect at the start of a line, got %q", first.Key, abbreviate(first.Key))
			continue
		}
		if parseGresRecord(p, sl, &rec) {
			records = append(records, rec)
		}
	}

	// Give each record's GPUs to its nodes, in file order.
	for _, r := range records {
		for _, n := range r.nodes {
			if _, ok := g.Nodes[n]; !ok {
				g.Order = append(g.Order, n)
				g.Nodes[n] = nil
			}
		}
	}
	add := func(list []GPU, gpus []GPU) []GPU {
		for _, gpu := range gpus {
			gpu.Index = len(list)
			list = append(list, gpu)
		}
		return list
	}
	for _, r := range records {
		if r.nodes == nil {
			// A line naming no node is every node's, in its place.
			g.Global = add(g.Global, r.gpus)
			for _, n := range g.Order {
				g.Nodes[n] = add(g.Nodes[n], r.gpus)
			}
			continue
		}
		for _, n := range r.nodes {
			g.Nodes[n] = add(g.Nodes[n], r.gpus)
		}
	}
	reported := map[int]bool{} // a line's problem is told for one node
	checkNodeGPUs(p, reported, "", g.Global)
	for _, n := range g.Order {
		checkNodeGPUs(p, reported, n, g.Nodes[n])
	}
	if err := p.err(); err != nil {
		return Gres{}, err
	}
	return g, nil
}

// checkAutoDetect checks an AutoDetect value.
func checkAutoDetect(p *problems, line int, kv fabric.SlurmPair) bool {
	switch strings.ToLower(kv.Value) {
	case "nvml", "rsmi", "oneapi", "off":
		return true
	}
	p.add(line, "%s: expected nvml, rsmi, oneapi or off, got %q", kv.Key, abbreviate(kv.Value))
	return false
}

// parseGresRecord reads the keys after NodeName into rec; it reports
// whether the line is well formed.
func parseGresRecord(p *problems, sl fabric.SlurmLine, rec *gresRecord) bool {
	before := len(p.list)
	vals := map[string]fabric.SlurmPair{} // lower-case key -> pair
	rest := sl.Pairs
	if rec.nodes != nil {
		rest = rest[1:]
	}
	for _, kv := range rest {
		key := strings.ToLower(kv.Key)
		if !slices.Contains(gresKeys, key) {
			p.add(sl.Line, "%s: expected one of AutoDetect, Count, Cores, File, Flags, Links, MultipleFiles, Name and Type, got unknown key %q", kv.Key, kv.Key)
			continue
		}
		// Slurm reads Files as File and Link as Links.
		if alias, ok := map[string]string{"files": "file", "link": "links"}[key]; ok {
			key = alias
		}
		if prev, ok := vals[key]; ok {
			p.add(sl.Line, "%s: expected it once on the line, got it again (as %s)", prev.Key, kv.Key)
			continue
		}
		vals[key] = kv
	}
	name, ok := vals["name"]
	switch {
	case !ok:
		if _, auto := vals["autodetect"]; !auto || len(vals) > 1 {
			p.add(sl.Line, "Name: expected Name=gpu (or another GRES name) on the line, got none")
		}
	case name.Value == "":
		p.add(sl.Line, "%s: expected a GRES name such as gpu, got nothing", name.Key)
	}
	if kv, ok := vals["autodetect"]; ok {
		checkAutoDetect(p, sl.Line, kv)
	}
	if kv, ok := vals["flags"]; ok {
		for f := range strings.SplitSeq(kv.Value, ",") {
			if !slices.Contains(gresFlags, strings.ToLower(f)) {
				p.add(sl.Line, "%s: expected flags among CountOnly, one_sharing, all_sharing, nvidia_gpu_env, amd_gpu_env, intel_gpu_env, opencl_env and no_gpu_env, got %q", kv.Key, abbreviate(f))
			}
		}
	}
	if !strings.EqualFold(name.Value, "gpu") {
		return false // not GPUs: checked, then passed over
	}

	var gpu GPU
	gpu.Line = sl.Line
	if kv, ok := vals["type"]; ok {
		if !typePattern.MatchString(kv.Value) {
			p.add(sl.Line, "%s: expected a type of at most 64 letters, digits, '_', '.' or '-', got %q", kv.Key, abbreviate(kv.Value))
		}
		gpu.Type = kv.Value
	}
	var files []string
	fileKV, hasFile := vals["file"]
	multi, hasMulti := vals["multiplefiles"]
	switch {
	case hasFile && hasMulti:
		p.add(sl.Line, "%s: expected either File or MultipleFiles, got both", multi.Key)
	case hasMulti:
		if multi.Value == "" {
			p.add(sl.Line, "%s: expected the MIG GPU's device files, got nothing", multi.Key)
		}
		files = []string{multi.Value}
	case hasFile:
		names, err := fabric.ExpandHostlist(fileKV.Value)
		if err != nil {
			p.add(sl.Line, "%s: expected device files such as /dev/nvidia[0-3], got %q: %v", fileKV.Key, abbreviate(fileKV.Value), err)
			break
		}
		files = names
	default:
		p.add(sl.Line, "File: expected the GPU's device file (Slurm discards a gpu record without File or MultipleFiles), got none")
	}
	if len(files) > MaxGPUsPerNode {
		p.add(sl.Line, "%s: expected at most %d device files, got %d", fileKV.Key, MaxGPUsPerNode, len(files))
		files = nil
	}
	if kv, ok := vals["count"]; ok && files != nil {
		if n, err := strconv.Atoi(kv.Value); err != nil || n != len(files) {
			p.add(sl.Line, "%s: expected %d, the number of device files, got %q", kv.Key, len(files), abbreviate(kv.Value))
		}
	}
	cores, hasCores := vals["cores"]
	if cpus, ok := vals["cpus"]; ok {
		if hasCores {
			p.add(sl.Line, "%s: expected either Cores or CPUs, got both", cpus.Key)
		}
		cores, hasCores = cpus, true
	}
	if hasCores {
		list, err := ParseCPUList(cores.Value)
		if err != nil {
			p.add(sl.Line, "%s: %v", cores.Key, err)
		}
		gpu.Cores = list
	}
	if kv, ok := vals["links"]; ok {
		if len(files) > 1 {
			p.add(sl.Line, "%s: expected Links only on a line of one device file, got %d files", kv.Key, len(files))
		}
		links, err := parseLinks(kv.Value)
		if err != nil {
			p.add(sl.Line, "%s: %v", kv.Key, err)
		}
		gpu.Links = links
	}
	if len(p.list) > before {
		return false
	}
	for _, f := range files {
		one := gpu
		one.File = f
		rec.gpus = append(rec.gpus, one)
	}
	return true
}

// parseLinks reads a Links value: counts of at least 0 and one -1.
func parseLinks(s string) ([]int, error) {
	var out []int
	self := -1
	for i, part := range strings.Split(s, ",") {
		n, err := strconv.Atoi(part)
		if err != nil || n < -1 || n > MaxCPU {
			return nil, fmt.Errorf("expected NVLink counts such as -1,2,0,0 (-1 for the GPU itself, 0 for none), got %q at place %d", abbreviate(part), i)
		}
		if n == -1 {
			if self >= 0 {
				return nil, fmt.Errorf("expected one -1 (the GPU itself), got -1 at places %d and %d", self, i)
			}
			self = i
		}
		if i >= MaxGPUsPerNode {
			return nil, fmt.Errorf("expected at most %d entries, got more", MaxGPUsPerNode)
		}
		out = append(out, n)
	}
	if self < 0 {
		return nil, fmt.Errorf("expected one -1 (the GPU itself), got none in %q", abbreviate(s))
	}
	return out, nil
}

// checkNodeGPUs checks one node's GPUs together: how many, files named
// once, and Links that agree with the node's GPUs and each other. node is
// "" for the GPUs of the lines that name no node.
func checkNodeGPUs(p *problems, reported map[int]bool, node string, gpus []GPU) {
	add := func(line int, format string, args ...any) {
		if !reported[line] {
			reported[line] = true
			p.add(line, format, args...)
		}
	}
	where := "node " + node
	if node == "" {
		where = "every node (lines without NodeName)"
	}
	if len(gpus) > MaxGPUsPerNode {
		add(gpus[MaxGPUsPerNode].Line, "File: expected at most %d GPUs on %s, got %d", MaxGPUsPerNode, where, len(gpus))
		return
	}
	fileLine := map[string]int{}
	for _, g := range gpus {
		if prev, dup := fileLine[g.File]; dup {
			add(g.Line, "File: expected each device file once on %s, got %s again (first on line %d)", where, g.File, prev)
			continue
		}
		fileLine[g.File] = g.Line
	}
	for _, g := range gpus {
		if g.Links == nil {
			continue
		}
		switch self := slices.Index(g.Links, -1); {
		case len(g.Links) != len(gpus):
			add(g.Line, "Links: expected %d entries, one per GPU of %s, got %d", len(gpus), where, len(g.Links))
			continue
		case self != g.Index:
			add(g.Line, "Links: expected -1 at place %d, this GPU's index on %s (its place among the node's gpu lines), got it at place %d", g.Index, where, self)
			continue
		}
		for j, n := range g.Links {
			o := gpus[j]
			if j == g.Index || o.Links == nil || len(o.Links) != len(gpus) || o.Links[g.Index] == n {
				continue
			}
			if j < g.Index { // report each pair once
				add(g.Line, "Links: expected %d links to GPU %d, as its line %d gives for this pair, got %d", o.Links[g.Index], j, o.Line, n)
			}
		}
	}
}

// uniqueStrings drops repeats, keeping the first.
func uniqueStrings(names []string) []string {
	seen := make(map[string]bool, len(names))
	out := names[:0]
	for _, n := range names {
		if !seen[n] {
			seen[n] = true
			out = append(out, n)
		}
	}
	return out
}

// problems collects errors with their lines, to report them in line order.
type problems struct {
	file string
	list []lineError
}

type lineError struct {
	line, seq int
	msg       string
}

func (p *problems) add(line int, format string, args ...any) {
	p.list = append(p.list, lineError{line: line, seq: len(p.list), msg: fmt.Sprintf(format, args...)})
}

// err joins the problems, in line order, each as "file:line: message".
func (p *problems) err() error {
	if len(p.list) == 0 {
		return nil
	}
	slices.SortFunc(p.list, func(a, b lineError) int {
		return cmp.Or(cmp.Compare(a.line, b.line), cmp.Compare(a.seq, b.seq))
	})
	errs := make([]error, len(p.list))
	for i, e := range p.list {
		errs[i] = fmt.Errorf("%s:%d: %s", p.file, e.line, e.msg)
	}
	return errors.Join(errs...)
}
