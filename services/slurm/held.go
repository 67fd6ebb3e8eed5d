package slurm

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/toposched/toposched/events"
)

// HeldByPrefix starts the By of every GPU this service publishes held, so
// that its holds are told from other publishers' on the topology stream.
const HeldByPrefix = "slurm job "

// holding reports whether Slurm keeps a job's GPUs allocated in state:
// running, suspended, or still completing (its steps being cleaned up).
func holding(state string) bool {
	switch state {
	case "RUNNING", "SUSPENDED", "COMPLETING":
		return true
	}
	return false
}

// endStatus is the jobs.finished status of a Slurm job state that is an
// end, ok false for a state that is not.
func endStatus(state string) (events.JobStatus, bool) {
	switch state {
	case "COMPLETED":
		return events.StatusSucceeded, true
	case "CANCELLED":
		return events.StatusCancelled, true
	case "FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL", "DEADLINE", "OUT_OF_MEMORY":
		return events.StatusFailed, true
	}
	return "", false
}

// Held works out, per node, the GPUs Slurm has given to jobs that are not
// toposched's: those whose ToposchedJob is "" or has no decision in
// decided (a job toposched decided and has not seen finish), placeholders,
// and those a toposched job's Slurm job holds outside its decision
// (placement counts only the decided ones as the job's). Nodes without such GPUs are left
// out. Each node's list is sorted by index; a GPU two jobs share (Slurm's
// --overcommit, shared GRES) is named for the lower job id.
func Held(jobs []Job, decided func(id string) *events.PlacementDecided) map[string][]events.HeldGPU {
	byNode := map[string]map[int]string{}
	sorted := slices.Clone(jobs)
	slices.SortFunc(sorted, func(a, b Job) int { return cmp.Compare(b.ID, a.ID) })
	for _, j := range sorted {
		if !holding(j.State) {
			continue
		}
		var d *events.PlacementDecided
		// A placeholder runs nothing of the job's: released in Slurm
		// and started, the GPUs it holds are Slurm's, not the decision's.
		if j.ToposchedJob != "" && !j.Placeholder {
			d = decided(j.ToposchedJob)
		}
		by := fmt.Sprintf("%s%d (%s)", HeldByPrefix, j.ID, j.User)
		for node, gpus := range j.GPUs {
			for _, g := range gpus {
				if d != nil && decidedOn(d, node, g) {
					continue
				}
				if byNode[node] == nil {
					byNode[node] = map[int]string{}
				}
				byNode[node][g] = by // the lowest id, written last, wins
			}
		}
	}
	out := make(map[string][]events.HeldGPU, len(byNode))
	for node, gpus := range byNode {
		list := make([]events.HeldGPU, 0, len(gpus))
		for idx, by := range gpus {
			list = append(list, events.HeldGPU{Index: idx, By: by})
		}
		slices.SortFunc(list, func(a, b events.HeldGPU) int { return cmp.Compare(a.Index, b.Index) })
		out[node] = list
	}
	return out
}

// decidedOn reports whether a decision gives GPU g of node.
func decidedOn(d *events.PlacementDecided, node string, g int) bool {
	for _, n := range d.Nodes {
		if n.Node == node && slices.Contains(n.GPUs, g) {
			return true
		}
	}
	return false
}

// heldKey is a node's holds in one comparable string.
func heldKey(gpus []events.HeldGPU) string {
	var b strings.Builder
	for _, g := range gpus {
		b.WriteString(strconv.Itoa(g.Index))
		b.WriteByte('=')
		b.WriteString(g.By)
		b.WriteByte(';')
	}
	return b.String()
}

// ourHolds reports whether a node's holds, as the topology stream gives
// them, are this service's (every GPU By HeldByPrefix; an empty list is
// anyone's and so also ours to replace).
func ourHolds(gpus []events.HeldGPU) bool {
	for _, g := range gpus {
		if !strings.HasPrefix(g.By, HeldByPrefix) {
			return false
		}
	}
	return true
}

// mismatch says how a Slurm job's GPUs differ from its decision's, "" when
// they are the same nodes and GPU indices.
func mismatch(d *events.PlacementDecided, j Job) string {
	want := map[string][]int{}
	for _, n := range d.Nodes {
		want[n.Node] = append(want[n.Node], n.GPUs...)
	}
	var diffs []string
	nodes := make([]string, 0, len(want)+len(j.GPUs))
	for n := range want {
		nodes = append(nodes, n)
	}
	for n := range j.GPUs {
		if _, ok := want[n]; !ok {
			nodes = append(nodes, n)
		}
	}
	slices.Sort(nodes)
	for _, n := range nodes {
		w := slices.Sorted(slices.Values(want[n]))
		g := j.GPUs[n]
		if !slices.Equal(w, g) {
			diffs = append(diffs, fmt.Sprintf("%s: decided GPUs %v, Slurm gave %v", n, w, g))
		}
	}
	return strings.Join(diffs, "; ")
}
