package aware

import (
	"fmt"

	"github.com/toposched/toposched/events"
)

// Message sizes of SyntheticJob's groups.
const (
	SyntheticTPBytes = 64 << 20 // all-reduce, 8 calls per step
	SyntheticPPBytes = 32 << 20 // send/recv, 8 calls per step
	SyntheticDPBytes = 1 << 30  // all-reduce, once per step
)

// SyntheticJob is an analysed job of n ranks laid out tp-dp-pp (TP fastest):
// TP groups all-reduce SyntheticTPBytes 8 times a step, PP neighbours
// exchange SyntheticPPBytes 8 times, DP groups all-reduce SyntheticDPBytes
// once. tp and pp of 0 mean 1; tp·pp must divide n. For benchmarks and
// tests, where analysis' sizing from a model is beside the point.
func SyntheticJob(id string, n, tp, pp int) events.JobAnalyzed {
	tp, pp = max(tp, 1), max(pp, 1)
	dp := n / (tp * pp)
	j := events.JobAnalyzed{
		Job:         events.JobSubmitted{JobID: id, GPUs: n},
		Parallelism: events.Parallelism{TP: tp, PP: pp, DP: dp},
		Order:       []string{"tp", "dp", "pp"},
	}
	if dp*tp*pp != n {
		panic(fmt.Sprintf("aware: SyntheticJob: tp %d x pp %d does not divide %d", tp, pp, n))
	}
	rank := func(t, d, p int) int { return t + tp*(d+dp*p) }
	add := func(dim string, size int, c events.Collective, member func(i int) []int, count int) {
		if size < 2 {
			return
		}
		rg := events.RankGroups{Dimension: dim, Size: size, Collectives: []events.Collective{c}}
		for i := range count {
			rg.Members = append(rg.Members, member(i))
		}
		j.Groups = append(j.Groups, rg)
	}
	add("tp", tp, events.Collective{Collective: events.CollectiveAllReduce, Bytes: SyntheticTPBytes, CallsPerStep: 8},
		func(i int) []int {
			d, p := i%dp, i/dp
			m := make([]int, tp)
			for t := range tp {
				m[t] = rank(t, d, p)
			}
			return m
		}, dp*pp)
	add("dp", dp, events.Collective{Collective: events.CollectiveAllReduce, Bytes: SyntheticDPBytes, CallsPerStep: 1},
		func(i int) []int {
			t, p := i%tp, i/tp
			m := make([]int, dp)
			for d := range dp {
				m[d] = rank(t, d, p)
			}
			return m
		}, tp*pp)
	add("pp", pp, events.Collective{Collective: events.CollectiveSendRecv, Bytes: SyntheticPPBytes, CallsPerStep: 8},
		func(i int) []int {
			t, d := i%tp, i/tp
			m := make([]int, pp)
			for p := range pp {
				m[p] = rank(t, d, p)
			}
			return m
		}, tp*dp)
	return j
}
