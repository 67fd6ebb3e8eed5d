package replay

import (
	"fmt"
	"io"
	"os"
	"strings"
)

// ReadAlibabaNodes reads an Alibaba GPU cluster trace v2023 node list
// (openb_node_list_*.csv: sn, cpu_milli, memory_mib, gpu, model) into
// cluster nodes, in file order. Nodes without GPUs are left out and
// counted in the returned note: toposched places GPUs only.
func ReadAlibabaNodes(file string, r io.Reader) ([]NodeSpec, []string, error) {
	t, err := openTable(file, r, "sn", "gpu", "model")
	if err != nil {
		return nil, nil, err
	}
	var nodes []NodeSpec
	cpuOnly := 0
	seen := map[string]int{}
	for t.next() {
		name := t.str("sn")
		if !nodeNamePattern.MatchString(name) {
			t.bad("sn", "expected a node name (letters, digits, '.', '_', '-'), got %q", name)
			continue
		}
		if l, dup := seen[name]; dup {
			t.bad("sn", "node %q already listed on line %d", name, l)
			continue
		}
		seen[name] = t.line
		gpus, ok := t.int("gpu", 0, 256)
		if !ok {
			continue
		}
		if gpus == 0 {
			cpuOnly++
			continue
		}
		model := t.str("model")
		if model == "" {
			t.bad("model", "expected a GPU model for a node with %d GPUs, got nothing", gpus)
			continue
		}
		nodes = append(nodes, NodeSpec{Name: name, GPUs: int(gpus), GPUModel: model, Line: t.line})
	}
	if err := t.err(); err != nil {
		return nil, nil, err
	}
	if len(nodes) == 0 {
		return nil, nil, fmt.Errorf("%s: no node with GPUs", file)
	}
	var notes []string
	if cpuOnly > 0 {
		notes = append(notes, fmt.Sprintf("%d nodes without GPUs left out of the cluster", cpuOnly))
	}
	return nodes, notes, nil
}

// Skip reasons and notes of the Alibaba pod reader.
const (
	SkipCPUOnly = "cpu-only pod (num_gpu 0): toposched places GPUs only"
	// SkipEndsBeforeStart: deletion_time before the pod started.
	SkipEndsBeforeStart = "ends before it starts (deletion_time before scheduled_time or creation_time)"
)

// ReadAlibabaPods reads an Alibaba GPU cluster trace v2023 pod list
// (openb_pod_list_*.csv) into jobs. A pod is one node, so a pod's GPUs are
// on one node (gpus_per_node = num_gpu). Deliberate adaptations, each
// counted in the trace's Skipped or Notes:
//
//   - num_gpu 0 (CPU-only pods) are skipped: toposched places GPUs.
//   - gpu_milli under 1000 (a share of one GPU, for GPU-sharing pods)
//     takes one whole GPU: toposched allocates whole GPUs.
//   - gpu_spec with one model constrains the job to it; with several
//     ("V100M16|V100M32") the constraint is dropped, as a job names at
//     most one model.
//   - The job runs from its arrival (creation_time) for deletion_time −
//     scheduled_time seconds (deletion_time − creation_time when the trace
//     never scheduled it). Pod lists without times (the multigpu
//     variants) arrive one per second in file order and run until the
//     replay ends.
func ReadAlibabaPods(file string, r io.Reader) (*Trace, error) {
	t, err := openTable(file, r, "name", "num_gpu", "gpu_milli")
	if err != nil {
		return nil, err
	}
	tr := &Trace{Kind: KindAlibaba, Source: file}
	timed := t.has("creation_time")
	if timed && !t.has("deletion_time") {
		return nil, fmt.Errorf("%s:1: header: missing column deletion_time (creation_time is there)", file)
	}
	fractional, multiSpec := 0, 0
	seen := map[string]int{}
	for t.next() {
		tr.Records++
		name := t.str("name")
		if !jobIDPattern.MatchString(name) {
			t.bad("name", "expected a pod name (letters, digits, '.', '_', ':', '-'), got %q", name)
			continue
		}
		if l, dup := seen[name]; dup {
			t.bad("name", "pod %q already listed on line %d", name, l)
			continue
		}
		seen[name] = t.line
		gpus, ok1 := t.int("num_gpu", 0, 256)
		milli, ok2 := t.int("gpu_milli", 0, 1000)
		if !ok1 || !ok2 {
			continue
		}
		j := Job{ID: name, GPUs: int(gpus), GPUsPerNode: int(gpus), Line: t.line, Duration: -1, Arrival: float64(tr.Records - 1)}
		if timed {
			c, ok1 := t.int("creation_time", 0, maxSeconds)
			d, ok2 := t.int("deletion_time", 0, maxSeconds)
			if !ok1 || !ok2 {
				continue
			}
			start := c
			if t.str("scheduled_time") != "" {
				s, ok := t.int("scheduled_time", 0, maxSeconds)
				if !ok {
					continue
				}
				start = max(s, c)
			}
			if d < start {
				tr.skip(SkipEndsBeforeStart)
				continue
			}
			j.Arrival, j.Duration = float64(c), float64(d-start)
		}
		if gpus == 0 {
			if milli > 0 {
				t.bad("gpu_milli", "%d for a pod of no GPU (num_gpu 0)", milli)
				continue
			}
			tr.skip(SkipCPUOnly)
			continue
		}
		if milli < 1000 {
			if gpus > 1 {
				t.bad("gpu_milli", "a share of a GPU (%d) with num_gpu %d: shares are of one GPU", milli, gpus)
				continue
			}
			if milli == 0 {
				t.bad("gpu_milli", "0 for a pod of %d GPU", gpus)
				continue
			}
			fractional++
		}
		if spec := t.str("gpu_spec"); spec != "" {
			if strings.Contains(spec, "|") {
				multiSpec++
			} else {
				j.GPUModel = spec
			}
		}
		labels := map[string]string{}
		for _, col := range []string{"qos", "pod_phase"} {
			if v := t.str(col); v != "" {
				labels["trace."+col] = cleanLabel(v)
			}
		}
		if len(labels) > 0 {
			j.Labels = labels
		}
		tr.Jobs = append(tr.Jobs, j)
	}
	if err := t.err(); err != nil {
		return nil, err
	}
	if fractional > 0 {
		tr.Notes = append(tr.Notes, fmt.Sprintf("%d pods asked for a share of one GPU (gpu_milli < 1000): each takes one whole GPU", fractional))
	}
	if multiSpec > 0 {
		tr.Notes = append(tr.Notes, fmt.Sprintf("%d pods accept several GPU models (gpu_spec A|B): no model constraint", multiSpec))
	}
	if !timed {
		tr.Notes = append(tr.Notes, "the pod list has no times: pods arrive one per second in file order and run until the replay ends")
	}
	tr.sortByArrival()
	return tr, nil
}

// LoadAlibabaPods reads a pod list from disk.
func LoadAlibabaPods(path string) (*Trace, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("pod list: %w", err)
	}
	defer func() { _ = f.Close() }() // only read
	return ReadAlibabaPods(path, f)
}

// LoadAlibabaNodes reads a node list from disk.
func LoadAlibabaNodes(path string) ([]NodeSpec, []string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, fmt.Errorf("node list: %w", err)
	}
	defer func() { _ = f.Close() }() // only read
	return ReadAlibabaNodes(path, f)
}
