package events

import (
	"encoding/json"
	"fmt"
	"slices"
)

// Dimensions are the parallel dimensions a job's layout orders, in the
// default layout (fastest-varying first).
var Dimensions = []string{"tp", "cp", "ep", "dp", "pp"}

// MaxJobGPUs bounds one job: analysis refuses a bigger one before any work,
// and a jobs.analyzed is expanded (see JobAnalyzed's UnmarshalJSON) only up
// to it.
const MaxJobGPUs = 1 << 17

// LayoutGroups lists, for every dimension of degree above 1, its rank
// groups in the layout order (a permutation of Dimensions, fastest-varying
// first). Expert parallelism is carved out of data parallelism: the
// layout's "ep" coordinate indexes experts, its "dp" coordinate the dp/ep
// replicas of each expert shard, and a dp group spans both. Groups are
// listed in Dimensions' order whatever the layout.
//
// The groups follow from the degrees and the order alone, which is why a
// jobs.analyzed on the wire leaves them out (see JobAnalyzed.MarshalJSON).
// p must be resolved (every degree at least 1, ep dividing dp) and order a
// permutation of Dimensions.
func LayoutGroups(p Parallelism, order []string) []RankGroups {
	degree := map[string]int{"tp": p.TP, "cp": p.CP, "ep": p.EP, "dp": p.DP / p.EP, "pp": p.PP}
	pos := map[string]int{}
	sizes := make([]int, len(order))
	for i, d := range order {
		pos[d] = i
		sizes[i] = degree[d]
	}
	dims := []struct {
		name string
		vary []int
	}{
		{"tp", []int{pos["tp"]}},
		{"cp", []int{pos["cp"]}},
		{"ep", []int{pos["ep"]}},
		{"dp", []int{pos["ep"], pos["dp"]}},
		{"pp", []int{pos["pp"]}},
	}
	out := []RankGroups{}
	for _, d := range dims {
		size := 1
		for _, v := range d.vary {
			size *= sizes[v]
		}
		if size == 1 {
			continue
		}
		out = append(out, RankGroups{Dimension: d.name, Size: size, Members: groupsOf(sizes, d.vary)})
	}
	return out
}

// groupsOf partitions all ranks into groups that differ only in the
// coordinates vary. Ranks within a group are ascending; groups are ordered
// by their smallest rank. A group's index is its fixed coordinates read as a
// mixed-radix number (fastest first), and a rank's place in its group its
// varying coordinates read the same way: both orders agree with the ranks',
// so every rank is written straight to its place, in one backing array.
func groupsOf(sizes []int, vary []int) [][]int {
	n := 1
	for _, s := range sizes {
		n *= s
	}
	varies := make([]bool, len(sizes))
	for _, v := range vary {
		varies[v] = true
	}
	// Weights of each coordinate in the group index and in the place.
	gw := make([]int, len(sizes))
	pw := make([]int, len(sizes))
	gsize, size := 1, 1
	for i, s := range sizes {
		if varies[i] {
			pw[i] = size
			size *= s
		} else {
			gw[i] = gsize
			gsize *= s
		}
	}
	all := make([]int, n)
	groups := make([][]int, gsize)
	for g := range groups {
		groups[g] = all[g*size : (g+1)*size : (g+1)*size]
	}
	coord := make([]int, len(sizes))
	for r := range n {
		g, at := 0, 0
		for i, c := range coord {
			g += c * gw[i]
			at += c * pw[i]
		}
		groups[g][at] = r
		// Next rank: increment the mixed-radix coordinates.
		for i := range coord {
			coord[i]++
			if coord[i] < sizes[i] {
				break
			}
			coord[i] = 0
		}
	}
	return groups
}

// jobAnalyzedWire is JobAnalyzed without its JSON methods, so that they
// can encode and decode it field by field.
type jobAnalyzedWire JobAnalyzed

// MarshalJSON writes a jobs.analyzed in its compact form: a group entry's
// members are left out where they follow from the rest of the event (a
// derived dimension's from the parallelism and order, LayoutGroups; a
// custom dimension's from the job's groups of that name, in order). A
// 131,072-GPU job is then a few KB on the wire instead of megabytes,
// whatever its degrees. Members that differ from what would be rebuilt are
// written out, so that what decodes is always what was encoded.
func (a JobAnalyzed) MarshalJSON() ([]byte, error) {
	w := jobAnalyzedWire(a)
	if len(a.Groups) > 0 {
		w.Groups = slices.Clone(a.Groups)
		var derived []RankGroups
		if a.layoutResolves() == nil {
			derived = LayoutGroups(a.Parallelism, a.Order)
		}
		for i := range w.Groups {
			g := &w.Groups[i]
			var want [][]int
			if g.Dimension == DimensionCustom {
				want = a.customMembers(g.Name)
			} else if d := find(derived, g.Dimension); d != nil && d.Size == g.Size {
				want = d.Members
			}
			if want != nil && slices.EqualFunc(g.Members, want, slices.Equal) {
				g.Members = nil
			}
		}
	}
	return json.Marshal(w)
}

// UnmarshalJSON reads a jobs.analyzed, compact or not: a group entry
// without members gets them back as MarshalJSON left them out. It decodes
// with DecodeJSON (numbers as people write them, fields named in errors).
// What cannot be rebuilt (an order that is not a permutation of
// Dimensions, degrees that do not multiply out to the job's GPUs, a custom
// dimension the job has no groups of) is a *DecodeError naming the field.
func (a *JobAnalyzed) UnmarshalJSON(body []byte) error {
	var w jobAnalyzedWire
	if err := DecodeJSON(body, &w); err != nil {
		return err
	}
	*a = JobAnalyzed(w)
	var derived []RankGroups
	for i := range a.Groups {
		g := &a.Groups[i]
		if g.Members != nil {
			continue
		}
		field := fmt.Sprintf("groups[%d]", i)
		if g.Dimension == DimensionCustom {
			g.Members = a.customMembers(g.Name)
			if g.Members == nil {
				return decodeProblem(field+".name", "%s lists no members and the job has no groups named %q", field, g.Name)
			}
			continue
		}
		if derived == nil {
			if err := a.layoutResolves(); err != nil {
				return err
			}
			derived = LayoutGroups(a.Parallelism, a.Order)
		}
		d := find(derived, g.Dimension)
		if d == nil || d.Size != g.Size {
			return decodeProblem(field, "%s (%s, size %d) lists no members, and the parallelism and order give no such groups", field, g.Dimension, g.Size)
		}
		g.Members = d.Members
	}
	return nil
}

// layoutResolves says why a's parallelism and order do not determine its
// groups, or nil when LayoutGroups may build them.
func (a *JobAnalyzed) layoutResolves() error {
	if len(a.Order) != len(Dimensions) {
		return decodeProblem("order", "order must list each of %v once, got %v", Dimensions, a.Order)
	}
	for _, d := range Dimensions {
		if !slices.Contains(a.Order, d) {
			return decodeProblem("order", "order must list each of %v once, got %v", Dimensions, a.Order)
		}
	}
	p := a.Parallelism
	if p.TP < 1 || p.CP < 1 || p.EP < 1 || p.DP < 1 || p.PP < 1 || p.DP%p.EP != 0 {
		return decodeProblem("parallelism", "parallelism %+v is not resolved (every degree at least 1, ep dividing dp)", p)
	}
	if a.Job.GPUs < 1 || a.Job.GPUs > MaxJobGPUs {
		return decodeProblem("job.gpus", "job.gpus = %d is outside 1 to %d", a.Job.GPUs, MaxJobGPUs)
	}
	// Each degree is at most GPUs, so the product of two fits in an int.
	n := 1
	for _, d := range []int{p.TP, p.CP, p.DP, p.PP} {
		if d > a.Job.GPUs {
			n = a.Job.GPUs + 1
			break
		}
		n *= d
		if n > a.Job.GPUs {
			break
		}
	}
	if n != a.Job.GPUs {
		return decodeProblem("parallelism", "tp·cp·dp·pp of %+v is not job.gpus = %d", p, a.Job.GPUs)
	}
	return nil
}

// customMembers is the ranks of the job's explicit groups named name, in
// the job's order; nil when it has none.
func (a *JobAnalyzed) customMembers(name string) [][]int {
	var out [][]int
	for _, g := range a.Job.Groups {
		if g.Name == name {
			out = append(out, g.Ranks)
		}
	}
	return out
}

func find(groups []RankGroups, dimension string) *RankGroups {
	for i := range groups {
		if groups[i].Dimension == dimension {
			return &groups[i]
		}
	}
	return nil
}

func decodeProblem(field, format string, args ...any) *DecodeError {
	return &DecodeError{Problems: []DecodeProblem{{Field: field, Code: DecodeInconsistent, Message: fmt.Sprintf(format, args...)}}}
}
