package placer

import (
	"cmp"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/internal/fixtures"
	"github.com/toposched/toposched/internal/placer/outcome"
	"github.com/toposched/toposched/internal/store"
)

// jobsCounterfactual passes over the jobs too small to leave room unasked;
// on seeded clusters (random jobs over 6 nodes, a filter denying some
// nodes, waiting jobs with and without gpus_per_node) it names the jobs a
// plain reading of its rule names: the first job by (GPUs held, id) whose
// end leaves room on allowed nodes, else the largest first.
//
// One Running serves each store's cases.
func TestJobsCounterfactualProperty(t *testing.T) {
	t.Parallel()
	for seed := range uint64(300) {
		cache := &Running{}
		rng := rand.New(rand.NewPCG(seed, 11))
		ns := make([]fixtures.Node, 6)
		free := map[string][]int{}
		for i := range ns {
			name := fmt.Sprintf("n%d", i)
			ns[i].Event = fixtures.MustModelNode(t, "dgx-a100", name)
			free[name] = []int{0, 1, 2, 3, 4, 5, 6, 7}
		}
		st := fixtures.MustStore(t, ns, nil)
		for j := range 2 + rng.IntN(10) {
			var keys []store.GPUKey
			for range 1 + rng.IntN(2) {
				node := fmt.Sprintf("n%d", rng.IntN(6))
				for range 1 + rng.IntN(4) {
					if len(free[node]) == 0 {
						break
					}
					keys = append(keys, store.GPUKey{Node: node, Index: free[node][0]})
					free[node] = free[node][1:]
				}
			}
			if len(keys) == 0 {
				continue
			}
			id := fmt.Sprintf("j%02d", j)
			if err := st.Allocate(id, keys); err != nil {
				t.Fatal(err)
			}
			d := outcome.Decide(id, keys, "test")
			if err := st.UpsertJob(store.Job{ID: id, State: store.JobPlaced, Decision: &d}); err != nil {
				t.Fatal(err)
			}
		}
		denied := map[string]bool{}
		for i := range 6 {
			denied[fmt.Sprintf("n%d", i)] = rng.IntN(4) == 0
		}
		filter := func(n store.Node) bool { return !denied[n.Name] }
		waiting := []events.JobSubmitted{{GPUs: 4 + rng.IntN(20)}, {GPUs: 8 * (1 + rng.IntN(3)), GPUsPerNode: 8}, {GPUs: 4 * (1 + rng.IntN(4)), GPUsPerNode: 4}}
		// Twice: then again once a running job has finished, the cache
		// kept from before.
		for round := range 2 {
			if round == 1 {
				running := st.Snapshot().JobsInState(store.JobPlaced)
				j := running[rng.IntN(len(running))]
				if _, err := st.Release(j.ID); err != nil {
					t.Fatal(err)
				}
				j.State = store.JobFinished
				if err := st.UpsertJob(j); err != nil {
					t.Fatal(err)
				}
			}
			snap := st.Snapshot()
			for _, w := range waiting {
				w.JobID = "w"
				job := events.JobAnalyzed{Job: w}
				got := jobsCounterfactual(snap, job, cache, filter)
				want := plainCounterfactual(snap, w, denied)
				if fmt.Sprint(jobsOf(got)) != fmt.Sprint(want) {
					t.Fatalf("seed %d, round %d, job of %d GPUs (%d per node), denied %v: got %v, want %v", seed, round, w.GPUs, w.GPUsPerNode, denied, jobsOf(got), want)
				}
			}
		}
	}
}

func jobsOf(cs []events.Counterfactual) []string {
	if len(cs) == 0 {
		return nil
	}
	return cs[0].Jobs
}

// plainCounterfactual is jobsCounterfactual's rule without its shortcuts.
func plainCounterfactual(snap *store.Snapshot, w events.JobSubmitted, denied map[string]bool) []string {
	freeAfter := func(gone []store.Job) bool {
		free := map[string]int{}
		for _, d := range snap.DomainsOfKind(store.DomainNode) {
			if !denied[d.Node] {
				free[d.Node] = d.FreeOf("")
			}
		}
		for _, j := range gone {
			for _, np := range j.Decision.Nodes {
				if !denied[np.Node] {
					free[np.Node] += len(np.GPUs)
				}
			}
		}
		if w.GPUsPerNode > 0 {
			nodes := 0
			for _, f := range free {
				nodes += min(f/w.GPUsPerNode, 1)
			}
			return nodes >= w.GPUs/w.GPUsPerNode
		}
		sum := 0
		for _, f := range free {
			sum += f
		}
		return sum >= w.GPUs
	}
	held := func(j store.Job, allowedOnly bool) int {
		n := 0
		for _, np := range j.Decision.Nodes {
			if !allowedOnly || !denied[np.Node] {
				n += len(np.GPUs)
			}
		}
		return n
	}
	jobs := snap.JobsInState(store.JobPlaced)
	slices.SortFunc(jobs, func(a, b store.Job) int {
		return cmp.Or(cmp.Compare(held(a, false), held(b, false)), strings.Compare(a.ID, b.ID))
	})
	for _, j := range jobs {
		if held(j, true) > 0 && freeAfter([]store.Job{j}) {
			return []string{j.ID}
		}
	}
	var gone []store.Job
	var ids []string
	for i := len(jobs) - 1; i >= 0 && len(ids) < maxJobsNamed; i-- {
		if held(jobs[i], true) == 0 {
			continue
		}
		gone = append(gone, jobs[i])
		ids = append(ids, jobs[i].ID)
		if freeAfter(gone) {
			return ids
		}
	}
	return nil
}
