package store

import (
	"cmp"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/toposched/toposched/events"
)

func newStore(t testing.TB) *Store {
	t.Helper()
	s, err := New()
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// report builds a node report with GPUs 0..count-1.
func report(name string, pos int, model string, count int) events.TopologyNode {
	n := events.TopologyNode{Name: name, Position: pos, GPUModel: model}
	for i := range count {
		n.GPUs = append(n.GPUs, events.GPU{Index: i, UUID: fmt.Sprintf("GPU-%s-%d", name, i)})
	}
	return n
}

func mustUpsert(t testing.TB, s *Store, nodes ...events.TopologyNode) {
	t.Helper()
	for _, n := range nodes {
		if err := s.UpsertNode(n); err != nil {
			t.Fatalf("UpsertNode(%s): %v", n.Name, err)
		}
	}
}

func keys(node string, idx ...int) []GPUKey {
	out := make([]GPUKey, len(idx))
	for i, x := range idx {
		out[i] = GPUKey{node, x}
	}
	return out
}

func gpuKeys(gs []GPU) []GPUKey {
	out := make([]GPUKey, len(gs))
	for i, g := range gs {
		out[i] = g.Key()
	}
	return out
}

func indexes(gs []GPU) []int {
	out := make([]int, len(gs))
	for i, g := range gs {
		out[i] = g.Index
	}
	return out
}

func TestUpsertNode(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	n := report("n1", 3, "A100", 4)
	n.Labels = map[string]string{"rack": "r1"}
	n.GPUs[2].Model = "H100"
	n.GPUs[3].Health = events.HealthUnhealthy
	mustUpsert(t, s, n)
	n.Labels["rack"] = "changed-by-caller" // the store keeps its own copy

	snap := s.Snapshot()
	got, ok := snap.Node("n1")
	want := Node{Name: "n1", Position: 3, GPUModel: "A100", Labels: map[string]string{"rack": "r1"}, GPUCount: 4}
	if !ok || !reflect.DeepEqual(got, want) {
		t.Fatalf("Node = %+v, %v; want %+v", got, ok, want)
	}
	gpus := snap.GPUs("n1")
	if len(gpus) != 4 {
		t.Fatalf("GPUs = %+v", gpus)
	}
	if g := gpus[0]; g.Model != "A100" || !g.Healthy || g.UUID != "GPU-n1-0" || g.NodePosition != 3 {
		t.Errorf("GPU 0 = %+v; want model from node, healthy, position 3", g)
	}
	if gpus[2].Model != "H100" {
		t.Errorf("GPU 2 model = %q, want its own H100", gpus[2].Model)
	}
	if g := gpus[3]; g.Healthy || g.HealthReason == "" {
		t.Errorf("GPU 3 = %+v; want unhealthy with a reason", g)
	}
	if got := indexes(snap.FreeGPUs("n1")); !slices.Equal(got, []int{0, 1, 2}) {
		t.Errorf("FreeGPUs = %v", got)
	}
	if _, ok := snap.Node("nope"); ok {
		t.Error("unknown node found")
	}

	bad := report("n2", 0, "A100", 2)
	bad.GPUs[1].Index = 0
	if err := s.UpsertNode(bad); err == nil {
		t.Error("duplicate GPU index accepted")
	}
	if err := s.UpsertNode(events.TopologyNode{}); err == nil {
		t.Error("nameless node accepted")
	}
}

func TestUpsertNodePreservesAllocations(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		update func(n *events.TopologyNode)
		check  func(t *testing.T, snap *Snapshot)
	}{
		{
			name:   "same report",
			update: func(*events.TopologyNode) {},
		},
		{
			name:   "new uuid and memory",
			update: func(n *events.TopologyNode) { n.GPUs[0].UUID, n.GPUs[0].MemoryMiB = "GPU-new", 81920 },
			check: func(t *testing.T, snap *Snapshot) {
				if g := snap.GPUs("n1")[0]; g.UUID != "GPU-new" || g.MemoryMiB != 81920 {
					t.Errorf("GPU 0 = %+v, want updated details", g)
				}
			},
		},
		{
			name:   "node moved",
			update: func(n *events.TopologyNode) { n.Position = 7 },
			check: func(t *testing.T, snap *Snapshot) {
				for _, g := range snap.GPUs("n1") {
					if g.NodePosition != 7 {
						t.Errorf("GPU %d NodePosition = %d, want 7", g.Index, g.NodePosition)
					}
				}
			},
		},
		{
			name:   "more GPUs",
			update: func(n *events.TopologyNode) { n.GPUs = append(n.GPUs, events.GPU{Index: 4}) },
			check: func(t *testing.T, snap *Snapshot) {
				if got := indexes(snap.FreeGPUs("n1")); !slices.Equal(got, []int{2, 3, 4}) {
					t.Errorf("FreeGPUs = %v, want [2 3 4]", got)
				}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s := newStore(t)
			mustUpsert(t, s, report("n1", 0, "A100", 4))
			if err := s.Allocate("job", keys("n1", 0, 1)); err != nil {
				t.Fatal(err)
			}
			n := report("n1", 0, "A100", 4)
			tt.update(&n)
			mustUpsert(t, s, n)
			snap := s.Snapshot()
			if got := gpuKeys(snap.GPUsOfJob("job")); !slices.Equal(got, keys("n1", 0, 1)) {
				t.Errorf("job holds %v after re-report, want n1/0 n1/1", got)
			}
			for _, g := range snap.GPUsOfJob("job") {
				if !g.Healthy {
					t.Errorf("GPU %s unhealthy after re-report", g.Key())
				}
			}
			if tt.check != nil {
				tt.check(t, snap)
			}
		})
	}
}

func TestUpsertNodeGPUDisappears(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	mustUpsert(t, s, report("n1", 0, "A100", 4))
	if err := s.Allocate("job", keys("n1", 3)); err != nil {
		t.Fatal(err)
	}

	// GPUs 2 (free) and 3 (allocated) vanish from the report.
	mustUpsert(t, s, report("n1", 0, "A100", 2))
	snap := s.Snapshot()
	if got := indexes(snap.GPUs("n1")); !slices.Equal(got, []int{0, 1, 3}) {
		t.Fatalf("GPUs = %v, want [0 1 3]: free GPU 2 deleted, allocated GPU 3 kept", got)
	}
	g3 := snap.GPUs("n1")[2]
	if g3.Healthy || g3.HealthReason != ReasonMissing || g3.JobID != "job" {
		t.Errorf("GPU 3 = %+v, want unhealthy %q held by job", g3, ReasonMissing)
	}
	if got := indexes(snap.FreeGPUs("n1")); !slices.Equal(got, []int{0, 1}) {
		t.Errorf("FreeGPUs = %v", got)
	}
	// A health report does not revive it.
	if err := s.SetHealth(events.TopologyHealth{Node: "n1", Component: events.ComponentGPU, ID: "3", Health: events.HealthHealthy}); err != nil {
		t.Fatal(err)
	}
	if g := s.Snapshot().GPUs("n1")[2]; g.Healthy {
		t.Errorf("missing GPU revived by health report: %+v", g)
	}
	// Nothing new lands on it.
	if err := s.Allocate("other", keys("n1", 3)); !errors.Is(err, ErrConflict) {
		t.Errorf("Allocate on missing GPU: %v, want ErrConflict", err)
	}

	// Released, it is gone for good.
	released, err := s.Release("job")
	if err != nil || !slices.Equal(released, keys("n1", 3)) {
		t.Fatalf("Release = %v, %v", released, err)
	}
	if got := indexes(s.Snapshot().GPUs("n1")); !slices.Equal(got, []int{0, 1}) {
		t.Errorf("GPUs after release = %v, want [0 1]", got)
	}

	// Had it come back before release, it would have been restored.
	s2 := newStore(t)
	mustUpsert(t, s2, report("n1", 0, "A100", 4))
	if err := s2.Allocate("job", keys("n1", 3)); err != nil {
		t.Fatal(err)
	}
	mustUpsert(t, s2, report("n1", 0, "A100", 2), report("n1", 0, "A100", 4))
	if g := s2.Snapshot().GPUs("n1")[3]; !g.Healthy || g.HealthReason != "" || g.JobID != "job" {
		t.Errorf("returned GPU = %+v, want healthy, held by job", g)
	}
}

func TestUpsertNodeRemoved(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	mustUpsert(t, s, report("n1", 0, "A100", 4), report("n2", 1, "A100", 4))
	if err := s.Allocate("job", keys("n1", 1)); err != nil {
		t.Fatal(err)
	}
	mustUpsert(t, s, events.TopologyNode{Name: "n1", Removed: true})
	snap := s.Snapshot()
	if _, ok := snap.Node("n1"); ok {
		t.Error("removed node still listed")
	}
	if got := len(snap.Nodes()); got != 1 {
		t.Errorf("%d nodes, want 1", got)
	}
	gpus := snap.GPUs("n1")
	if len(gpus) != 1 || gpus[0].Index != 1 || gpus[0].Healthy || gpus[0].HealthReason != ReasonNodeRemoved {
		t.Fatalf("GPUs of removed node = %+v, want only allocated GPU 1, unhealthy", gpus)
	}
	if total, healthy := snap.Capacity(""); total != 4 || healthy != 4 {
		t.Errorf("Capacity = %d, %d; want 4, 4 (n2 only)", total, healthy)
	}
	if err := s.SetHealth(events.TopologyHealth{Node: "n1", Component: events.ComponentNode, Health: events.HealthHealthy}); err == nil {
		t.Error("health for removed node accepted")
	}
	if _, err := s.Release("job"); err != nil {
		t.Fatal(err)
	}
	if gpus := s.Snapshot().GPUs("n1"); len(gpus) != 0 {
		t.Errorf("GPUs of removed node after release = %+v", gpus)
	}
	// Removing an unknown node is harmless.
	mustUpsert(t, s, events.TopologyNode{Name: "ghost", Removed: true})
}

func TestSetHealth(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		events  []events.TopologyHealth
		wantErr string
		free    []int // free GPUs of n1 afterwards
		reason  string
	}{
		{
			name:   "gpu unhealthy",
			events: []events.TopologyHealth{{Node: "n1", Component: "gpu", ID: "2", Health: "unhealthy", Reason: "XID 79"}},
			free:   []int{0, 1, 3},
			reason: "XID 79",
		},
		{
			name: "gpu unhealthy then healthy",
			events: []events.TopologyHealth{
				{Node: "n1", Component: "gpu", ID: "2", Health: "unhealthy"},
				{Node: "n1", Component: "gpu", ID: "2", Health: "healthy"},
			},
			free: []int{0, 1, 2, 3},
		},
		{
			name:   "node unhealthy",
			events: []events.TopologyHealth{{Node: "n1", Component: "node", Health: "unhealthy", Reason: "kubelet down"}},
			free:   []int{},
			reason: "kubelet down",
		},
		{
			name: "node back",
			events: []events.TopologyHealth{
				{Node: "n1", Component: "node", Health: "unhealthy"},
				{Node: "n1", Component: "node", Health: "healthy"},
			},
			free: []int{0, 1, 2, 3},
		},
		{
			// A link down changes paths, not whether a GPU is free (see
			// health_test.go).
			name:   "nvlink down leaves the GPUs free",
			events: []events.TopologyHealth{{Node: "n1", Component: "nvlink", ID: "0/1", Health: "unhealthy"}},
			free:   []int{0, 1, 2, 3},
		},
		{
			name:    "nvlink id malformed",
			events:  []events.TopologyHealth{{Node: "n1", Component: "nvlink", ID: "0-1", Health: "unhealthy"}},
			wantErr: `"0-1"`,
			free:    []int{0, 1, 2, 3},
		},
		{
			name:    "nvlink of unknown gpu",
			events:  []events.TopologyHealth{{Node: "n1", Component: "nvlink", ID: "8/0", Health: "unhealthy"}},
			wantErr: "n1/8",
			free:    []int{0, 1, 2, 3},
		},
		{
			name:    "unknown nic",
			events:  []events.TopologyHealth{{Node: "n1", Component: "nic", ID: "mlx5_0", Health: "unhealthy"}},
			wantErr: `"mlx5_0"`,
			free:    []int{0, 1, 2, 3},
		},
		{
			name:    "unknown node",
			events:  []events.TopologyHealth{{Node: "n9", Component: "gpu", ID: "0", Health: "unhealthy"}},
			wantErr: `"n9"`,
			free:    []int{0, 1, 2, 3},
		},
		{
			name:    "unknown gpu",
			events:  []events.TopologyHealth{{Node: "n1", Component: "gpu", ID: "8", Health: "unhealthy"}},
			wantErr: "n1/8",
			free:    []int{0, 1, 2, 3},
		},
		{
			name:    "gpu id not an index",
			events:  []events.TopologyHealth{{Node: "n1", Component: "gpu", ID: "GPU-abc", Health: "unhealthy"}},
			wantErr: "GPU-abc",
			free:    []int{0, 1, 2, 3},
		},
		{
			name:    "unknown component",
			events:  []events.TopologyHealth{{Node: "n1", Component: "psu", Health: "unhealthy"}},
			wantErr: `"psu"`,
			free:    []int{0, 1, 2, 3},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s := newStore(t)
			mustUpsert(t, s, report("n1", 0, "A100", 4))
			var err error
			for _, h := range tt.events {
				if err = s.SetHealth(h); err != nil {
					break
				}
			}
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("SetHealth: %v", err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Fatalf("SetHealth error = %v, want one naming %s", err, tt.wantErr)
			}
			snap := s.Snapshot()
			if got := indexes(snap.FreeGPUs("n1")); !slices.Equal(got, tt.free) {
				t.Errorf("FreeGPUs = %v, want %v", got, tt.free)
			}
			if snap.FreeCount() != len(tt.free) {
				t.Errorf("FreeCount = %d, want %d", snap.FreeCount(), len(tt.free))
			}
			for _, g := range snap.GPUs("n1") {
				if !g.Healthy && g.HealthReason != tt.reason {
					t.Errorf("GPU %d reason %q, want %q", g.Index, g.HealthReason, tt.reason)
				}
				if g.Healthy && g.HealthReason != "" {
					t.Errorf("healthy GPU %d has reason %q", g.Index, g.HealthReason)
				}
			}
		})
	}
}

func TestAllocate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		job      string
		gpus     []GPUKey
		wantErr  string
		conflict bool
	}{
		{name: "free GPUs", job: "new", gpus: keys("n1", 2, 3)},
		{name: "across nodes", job: "new", gpus: append(keys("n2", 0), keys("n1", 2)...)},
		{name: "same set again", job: "held", gpus: keys("n1", 1, 0)},
		{name: "held by another job", job: "new", gpus: keys("n1", 1, 2), wantErr: `n1/1 is held by job "held"`, conflict: true},
		{name: "unhealthy", job: "new", gpus: keys("n2", 3), wantErr: "n2/3 is unhealthy", conflict: true},
		{name: "does not exist", job: "new", gpus: keys("n1", 9), wantErr: "n1/9 does not exist", conflict: true},
		{name: "unknown node", job: "new", gpus: keys("n7", 0), wantErr: "n7/0 does not exist", conflict: true},
		{name: "all problems named", job: "new", gpus: append(keys("n1", 0, 9), keys("n2", 3)...), wantErr: "n1/0 is held", conflict: true},
		{name: "job already holds others", job: "held", gpus: keys("n1", 2), wantErr: "already holds", conflict: true},
		{name: "job holds a subset", job: "held", gpus: keys("n1", 0, 1, 2), wantErr: "already holds", conflict: true},
		{name: "duplicate", job: "new", gpus: keys("n1", 2, 2), wantErr: "twice"},
		{name: "empty", job: "new", wantErr: "no GPUs"},
		{name: "no job id", gpus: keys("n1", 2), wantErr: "empty job id"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s := newStore(t)
			mustUpsert(t, s, report("n1", 0, "A100", 4), report("n2", 1, "A100", 4))
			if err := s.Allocate("held", keys("n1", 0, 1)); err != nil {
				t.Fatal(err)
			}
			if err := s.SetHealth(events.TopologyHealth{Node: "n2", Component: "gpu", ID: "3", Health: "unhealthy", Reason: "ECC"}); err != nil {
				t.Fatal(err)
			}
			before := s.Snapshot()
			err := s.Allocate(tt.job, tt.gpus)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("Allocate: %v", err)
				}
				got := gpuKeys(s.Snapshot().GPUsOfJob(tt.job))
				want := slices.Clone(tt.gpus)
				slices.SortFunc(want, compareKeys)
				if !slices.Equal(got, want) {
					t.Errorf("job holds %v, want %v", got, want)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("Allocate error = %v, want %q", err, tt.wantErr)
			}
			if errors.Is(err, ErrConflict) != tt.conflict {
				t.Errorf("errors.Is(%v, ErrConflict) = %v, want %v", err, !tt.conflict, tt.conflict)
			}
			if tt.name == "all problems named" {
				for _, w := range []string{"n1/9", "n2/3"} {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error %q does not name %s", err, w)
					}
				}
			}
			// Nothing changed.
			after := s.Snapshot()
			for _, n := range []string{"n1", "n2"} {
				if !reflect.DeepEqual(before.GPUs(n), after.GPUs(n)) {
					t.Errorf("failed Allocate changed %s: %+v -> %+v", n, before.GPUs(n), after.GPUs(n))
				}
			}
		})
	}
}

// TestAllocateRace has many jobs race for overlapping GPU sets: for each
// contested GPU exactly one job wins, and no GPU is ever held by two jobs.
func TestAllocateRace(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	mustUpsert(t, s, report("n1", 0, "A100", 8), report("n2", 1, "A100", 8))

	t.Run("one GPU", func(t *testing.T) {
		const racers = 32
		var (
			wg      sync.WaitGroup
			mu      sync.Mutex
			winners []string
		)
		start := make(chan struct{})
		for i := range racers {
			wg.Go(func() {
				job := fmt.Sprintf("one-%d", i)
				<-start
				err := s.Allocate(job, keys("n1", 0))
				switch {
				case err == nil:
					mu.Lock()
					winners = append(winners, job)
					mu.Unlock()
				case !errors.Is(err, ErrConflict):
					t.Errorf("%s: %v, want ErrConflict", job, err)
				}
			})
		}
		close(start)
		wg.Wait()
		if len(winners) != 1 {
			t.Fatalf("winners = %v, want exactly one", winners)
		}
		if g := s.Snapshot().GPUs("n1")[0]; g.JobID != winners[0] {
			t.Errorf("n1/0 held by %q, winner %q", g.JobID, winners[0])
		}
	})

	t.Run("overlapping gangs", func(t *testing.T) {
		// Job i wants 4 GPUs starting at (i*3) mod 15 over n1/1..n2/7, so
		// neighbours overlap. Readers check the invariant while they race.
		var all []GPUKey
		all = append(all, keys("n1", 1, 2, 3, 4, 5, 6, 7)...)
		all = append(all, keys("n2", 0, 1, 2, 3, 4, 5, 6, 7)...)
		const racers = 40
		var (
			wg   sync.WaitGroup
			mu   sync.Mutex
			won  = map[string][]GPUKey{}
			done = make(chan struct{})
		)
		// check verifies a snapshot: every GPU row and the job index agree
		// on who holds it, and a gang is held whole or not at all.
		check := func(snap *Snapshot) {
			for _, n := range []string{"n1", "n2"} {
				for _, g := range snap.GPUs(n) {
					if g.JobID == "" || !strings.HasPrefix(g.JobID, "gang-") {
						continue
					}
					held := snap.GPUsOfJob(g.JobID)
					if len(held) != 4 {
						t.Errorf("%s holds %d GPUs, want all 4 or none", g.JobID, len(held))
					}
					if !slices.ContainsFunc(held, func(h GPU) bool { return h.Key() == g.Key() }) {
						t.Errorf("GPU %s held by %s is missing from the job index", g.Key(), g.JobID)
					}
					for _, h := range held {
						if h.JobID != g.JobID {
							t.Errorf("job index lists %s under %s, row says %q", h.Key(), g.JobID, h.JobID)
						}
					}
				}
			}
		}
		var readers sync.WaitGroup
		readers.Go(func() {
			for {
				select {
				case <-done:
					return
				default:
					check(s.Snapshot())
				}
			}
		})
		start := make(chan struct{})
		for i := range racers {
			wg.Go(func() {
				job := fmt.Sprintf("gang-%d", i)
				want := make([]GPUKey, 4)
				for k := range want {
					want[k] = all[(i*3+k)%len(all)]
				}
				<-start
				err := s.Allocate(job, want)
				if err == nil {
					mu.Lock()
					won[job] = want
					mu.Unlock()
				} else if !errors.Is(err, ErrConflict) {
					t.Errorf("%s: %v", job, err)
				}
			})
		}
		close(start)
		wg.Wait()
		close(done)
		readers.Wait()

		snap := s.Snapshot()
		check(snap)
		owner := map[GPUKey]string{}
		for job, want := range won {
			got := gpuKeys(snap.GPUsOfJob(job))
			slices.SortFunc(want, compareKeys)
			if !slices.Equal(got, want) {
				t.Errorf("%s holds %v, won %v", job, got, want)
			}
			for _, k := range want {
				if prev, ok := owner[k]; ok {
					t.Errorf("GPU %s won by both %s and %s", k, prev, job)
				}
				owner[k] = job
			}
		}
		if len(won) == 0 {
			t.Error("no gang won")
		}
		held := 0
		for _, n := range []string{"n1", "n2"} {
			for _, g := range snap.GPUs(n) {
				if g.JobID != "" && !strings.HasPrefix(g.JobID, "one-") {
					held++
				}
			}
		}
		if held != 4*len(won) {
			t.Errorf("%d GPUs held by gangs, want %d", held, 4*len(won))
		}
	})
}

func TestRelease(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	mustUpsert(t, s, report("n2", 0, "A100", 4), report("n1", 1, "A100", 4))
	gpus := []GPUKey{{"n2", 3}, {"n1", 2}, {"n2", 0}}
	if err := s.Allocate("job", gpus); err != nil {
		t.Fatal(err)
	}
	if got := s.Snapshot().FreeCount(); got != 5 {
		t.Fatalf("FreeCount = %d, want 5", got)
	}
	released, err := s.Release("job")
	if err != nil {
		t.Fatal(err)
	}
	if want := []GPUKey{{"n1", 2}, {"n2", 0}, {"n2", 3}}; !slices.Equal(released, want) {
		t.Errorf("Release = %v, want %v", released, want)
	}
	snap := s.Snapshot()
	if got := snap.FreeCount(); got != 8 {
		t.Errorf("FreeCount after release = %d, want 8", got)
	}
	if got := snap.GPUsOfJob("job"); len(got) != 0 {
		t.Errorf("job still holds %v", got)
	}
	// Released GPUs can be allocated again.
	if err := s.Allocate("next", gpus); err != nil {
		t.Errorf("Allocate after release: %v", err)
	}
	for _, job := range []string{"unknown", "", "job"} {
		got, err := s.Release(job)
		if got != nil || err != nil {
			t.Errorf("Release(%q) = %v, %v; want nil, nil", job, got, err)
		}
	}
	// An unhealthy GPU stays unhealthy, not free, once released.
	if err := s.SetHealth(events.TopologyHealth{Node: "n1", Component: "gpu", ID: "2", Health: "unhealthy"}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Release("next"); err != nil {
		t.Fatal(err)
	}
	if got := indexes(s.Snapshot().FreeGPUs("n1")); !slices.Equal(got, []int{0, 1, 3}) {
		t.Errorf("FreeGPUs(n1) = %v, want [0 1 3]", got)
	}
}

func TestJobs(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	put := func(id string, state JobState, prio int) {
		t.Helper()
		if err := s.UpsertJob(Job{ID: id, State: state, Priority: prio, Seq: 999}); err != nil {
			t.Fatal(err)
		}
	}
	put("a", JobPending, 0)
	put("b", JobPending, 5)
	put("c", JobPending, 0)
	put("d", JobPlaced, 9)
	put("e", JobPending, 5)
	put("f", JobPending, 1)
	put("a", JobPending, 0) // update keeps a's age

	pending := func() []string {
		var ids []string
		for _, j := range s.Snapshot().PendingQueue() {
			ids = append(ids, j.ID)
		}
		return ids
	}
	if got, want := pending(), []string{"b", "e", "f", "a", "c"}; !slices.Equal(got, want) {
		t.Errorf("PendingQueue = %v, want %v", got, want)
	}
	if h, ok := s.Snapshot().PendingHead(); !ok || h.ID != "b" {
		t.Errorf("PendingHead = %+v, %v; want b", h, ok)
	}
	a, ok := s.Snapshot().Job("a")
	if !ok || a.Seq != 1 {
		t.Errorf("Job(a) = %+v, %v; want Seq 1 (assigned by the store, kept on update)", a, ok)
	}

	// Deleting and re-adding makes a job young again; the counter never
	// goes back.
	if err := s.DeleteJob("a"); err != nil {
		t.Fatal(err)
	}
	put("a", JobPending, 0)
	if a, _ := s.Snapshot().Job("a"); a.Seq != 7 {
		t.Errorf("re-added a has Seq %d, want 7", a.Seq)
	}
	if got, want := pending(), []string{"b", "e", "f", "c", "a"}; !slices.Equal(got, want) {
		t.Errorf("PendingQueue = %v, want %v", got, want)
	}

	put("b", JobPlaced, 5)
	if got := s.Snapshot().JobsInState(JobPlaced); len(got) != 2 || got[0].ID != "b" || got[1].ID != "d" {
		t.Errorf("JobsInState(placed) = %+v", got)
	}
	if _, ok := s.Snapshot().Job("zz"); ok {
		t.Error("unknown job found")
	}
	if err := s.DeleteJob("zz"); err != nil {
		t.Errorf("DeleteJob(unknown) = %v", err)
	}
	for _, bad := range []Job{{State: JobPending}, {ID: "x", State: "running"}, {ID: "x"}} {
		if err := s.UpsertJob(bad); err == nil {
			t.Errorf("UpsertJob(%+v) accepted", bad)
		}
	}

	// A job holding GPUs is not deleted.
	mustUpsert(t, s, report("n1", 0, "A100", 2))
	if err := s.Allocate("d", keys("n1", 0)); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteJob("d"); err == nil {
		t.Error("DeleteJob of a job holding GPUs accepted")
	}
	if _, err := s.Release("d"); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteJob("d"); err != nil {
		t.Errorf("DeleteJob after release: %v", err)
	}
}

func TestWatchFree(t *testing.T) {
	t.Parallel()
	s := watchedStore(t)
	mustUpsert(t, s, report("n1", 0, "A100", 4))
	if err := s.Allocate("held", keys("n1", 3)); err != nil {
		t.Fatal(err)
	}

	fired := func(ch <-chan struct{}) bool {
		select {
		case <-ch:
			return true
		case <-time.After(time.Second):
			return false
		}
	}
	quiet := func(ch <-chan struct{}) bool {
		select {
		case <-ch:
			return false
		default:
			return true
		}
	}

	steps := []struct {
		name   string
		do     func() error
		change bool
	}{
		{"allocate", func() error { return s.Allocate("job", keys("n1", 0)) }, true},
		{"release", func() error { _, err := s.Release("job"); return err }, true},
		{"gpu unhealthy", func() error {
			return s.SetHealth(events.TopologyHealth{Node: "n1", Component: "gpu", ID: "1", Health: "unhealthy"})
		}, true},
		{"gpu healthy", func() error {
			return s.SetHealth(events.TopologyHealth{Node: "n1", Component: "gpu", ID: "1", Health: "healthy"})
		}, true},
		{"new node", func() error { return s.UpsertNode(report("n2", 1, "A100", 2)) }, true},
		{"same report", func() error { return s.UpsertNode(report("n1", 0, "A100", 4)) }, false},
		{"job table only", func() error { return s.UpsertJob(Job{ID: "x", State: JobPending}) }, false},
		{"failed allocate", func() error {
			err := s.Allocate("job", keys("n1", 3))
			if err == nil {
				return errors.New("want ErrConflict, got nil")
			}
			if !errors.Is(err, ErrConflict) {
				return fmt.Errorf("want ErrConflict, got %w", err)
			}
			return nil
		}, false},
		{"node removed", func() error { return s.UpsertNode(events.TopologyNode{Name: "n2", Removed: true}) }, true},
	}
	for _, st := range steps {
		ch := s.watchFree()
		if !quiet(ch) {
			t.Fatalf("%s: channel closed before the change", st.name)
		}
		if err := st.do(); err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		if st.change && !fired(ch) {
			t.Errorf("%s: watchFree did not fire", st.name)
		}
		if !st.change && !quiet(ch) {
			t.Errorf("%s: watchFree fired on no change", st.name)
		}
	}

	// A waiter blocked on the channel wakes on release.
	ch := s.watchFree()
	woke := make(chan struct{})
	go func() { <-ch; close(woke) }()
	if _, err := s.Release("held"); err != nil {
		t.Fatal(err)
	}
	if !fired(woke) {
		t.Error("waiter not woken by release")
	}
}

func TestSnapshotIsolation(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	mustUpsert(t, s, report("n1", 0, "A100", 2))
	before := s.Snapshot()
	if err := s.Allocate("job", keys("n1", 0)); err != nil {
		t.Fatal(err)
	}
	mustUpsert(t, s, report("n2", 1, "A100", 2))
	if before.FreeCount() != 2 || len(before.Nodes()) != 1 || len(before.GPUsOfJob("job")) != 0 {
		t.Errorf("old snapshot changed: free %d nodes %d", before.FreeCount(), len(before.Nodes()))
	}
	if after := s.Snapshot(); after.FreeCount() != 3 || len(after.Nodes()) != 2 {
		t.Errorf("new snapshot: free %d nodes %d", after.FreeCount(), len(after.Nodes()))
	}
}

func TestNodesAndCapacity(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	big := report("b", 2, "H100", 8)
	big.GPUs[7].Health = events.HealthUnhealthy
	mixed := report("m", 0, "A100", 4)
	mixed.GPUs[0].Model, mixed.GPUs[1].Model = "H100", "H100"
	mustUpsert(t, s, big, report("a", 2, "A100", 4), mixed, report("z", 1, "", 2))
	snap := s.Snapshot()

	var names []string
	for _, n := range snap.Nodes() {
		names = append(names, n.Name)
	}
	if want := []string{"m", "z", "a", "b"}; !slices.Equal(names, want) {
		t.Errorf("Nodes = %v, want %v (by position, then name)", names, want)
	}

	tests := []struct {
		model                string
		total, healthy, maxN int
	}{
		{"", 18, 17, 8},
		{"H100", 10, 9, 8},
		{"A100", 6, 6, 4},
		{"V100", 0, 0, 0},
	}
	for _, tt := range tests {
		total, healthy := snap.Capacity(tt.model)
		if total != tt.total || healthy != tt.healthy {
			t.Errorf("Capacity(%q) = %d, %d; want %d, %d", tt.model, total, healthy, tt.total, tt.healthy)
		}
		if got := snap.MaxGPUsPerNode(tt.model); got != tt.maxN {
			t.Errorf("MaxGPUsPerNode(%q) = %d, want %d", tt.model, got, tt.maxN)
		}
	}
}

// TestRestore replays allocations onto a topology replayed to its end: the
// rebuilt store must equal the live one.
func TestRestore(t *testing.T) {
	t.Parallel()
	topology := []func(s *Store) error{
		func(s *Store) error { return s.UpsertNode(report("n1", 0, "A100", 4)) },
		func(s *Store) error { return s.UpsertNode(report("n2", 1, "A100", 4)) },
		func(s *Store) error { return s.UpsertNode(report("n3", 2, "A100", 2)) },
	}
	later := []func(s *Store) error{
		// After the allocations: n1/3 vanishes, n1/0 breaks, n3 goes.
		func(s *Store) error { return s.UpsertNode(report("n1", 0, "A100", 3)) },
		func(s *Store) error {
			return s.SetHealth(events.TopologyHealth{Node: "n1", Component: "gpu", ID: "0", Health: "unhealthy", Reason: "XID 79"})
		},
		func(s *Store) error { return s.UpsertNode(events.TopologyNode{Name: "n3", Removed: true}) },
	}
	allocs := map[string][]GPUKey{
		"a": {{"n1", 0}, {"n1", 1}},
		"b": {{"n1", 3}, {"n2", 0}},
		"c": {{"n3", 1}},
	}
	order := []string{"a", "b", "c"}

	live := newStore(t)
	for _, f := range topology {
		if err := f(live); err != nil {
			t.Fatal(err)
		}
	}
	for _, j := range order {
		if err := live.Allocate(j, allocs[j]); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range later {
		if err := f(live); err != nil {
			t.Fatal(err)
		}
	}

	rebuilt := newStore(t)
	for _, f := range append(slices.Clone(topology), later...) {
		if err := f(rebuilt); err != nil {
			t.Fatal(err)
		}
	}
	for _, j := range order {
		if err := rebuilt.Allocate(j, allocs[j]); !errors.Is(err, ErrConflict) {
			t.Errorf("strict Allocate(%s) on the final topology = %v, want ErrConflict", j, err)
		}
		if err := rebuilt.Restore(j, allocs[j]); err != nil {
			t.Fatalf("Restore(%s): %v", j, err)
		}
		if err := rebuilt.Restore(j, allocs[j]); err != nil {
			t.Errorf("Restore(%s) again: %v", j, err)
		}
	}

	// A recreated GPU cannot know its UUID, model or place; the rest must
	// agree.
	type state struct {
		Key          GPUKey
		Healthy      bool
		HealthReason string
		JobID        string
	}
	states := func(gs []GPU) []state {
		out := make([]state, len(gs))
		for i, g := range gs {
			out[i] = state{g.Key(), g.Healthy, g.HealthReason, g.JobID}
		}
		return out
	}
	same := func(stage string) {
		t.Helper()
		ls, rs := live.Snapshot(), rebuilt.Snapshot()
		for _, n := range []string{"n1", "n2", "n3"} {
			if l, r := states(ls.GPUs(n)), states(rs.GPUs(n)); !reflect.DeepEqual(l, r) {
				t.Errorf("%s: GPUs(%s)\nlive    %+v\nrebuilt %+v", stage, n, l, r)
			}
		}
		if ls.FreeCount() != rs.FreeCount() {
			t.Errorf("%s: FreeCount live %d, rebuilt %d", stage, ls.FreeCount(), rs.FreeCount())
		}
	}
	same("after restore")

	// Nothing new lands on the restored GPUs.
	if err := rebuilt.Allocate("x", []GPUKey{{"n1", 1}}); !errors.Is(err, ErrConflict) {
		t.Errorf("Allocate on a restored GPU = %v, want ErrConflict", err)
	}
	// Another job's GPU is still a conflict, and nothing is restored.
	if err := rebuilt.Restore("d", []GPUKey{{"n2", 1}, {"n2", 0}}); !errors.Is(err, ErrConflict) {
		t.Errorf("Restore over job b = %v, want ErrConflict", err)
	}
	if got := rebuilt.Snapshot().GPUsOfJob("d"); len(got) != 0 {
		t.Errorf("failed Restore left %v", got)
	}

	for _, j := range order {
		lk, lerr := live.Release(j)
		rk, rerr := rebuilt.Release(j)
		if lerr != nil || rerr != nil || !slices.Equal(lk, rk) {
			t.Errorf("Release(%s): live %v %v, rebuilt %v %v", j, lk, lerr, rk, rerr)
		}
	}
	same("after release")
}

// PlacedVersion moves with every write of a placed job, and only then.
func TestPlacedVersion(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	version := func() uint64 { return s.Snapshot().PlacedVersion() }
	steps := []struct {
		name  string
		write func() error
		moves bool
	}{
		{"a job waits", func() error { return s.UpsertJob(Job{ID: "a", State: JobPending}) }, false},
		{"it is placed", func() error { return s.UpsertJob(Job{ID: "a", State: JobPlaced}) }, true},
		{"rewritten while placed", func() error { return s.UpsertJob(Job{ID: "a", State: JobPlaced, Priority: 2}) }, true},
		{"another waits", func() error { return s.UpsertJob(Job{ID: "b", State: JobPending}) }, false},
		{"the first finishes", func() error { return s.UpsertJob(Job{ID: "a", State: JobFinished}) }, true},
		{"a finished job is deleted", func() error { return s.DeleteJob("a") }, false},
		{"a placed job is deleted", func() error {
			if err := s.UpsertJob(Job{ID: "c", State: JobPlaced}); err != nil {
				return err
			}
			before := version()
			if err := s.DeleteJob("c"); err != nil {
				return err
			}
			if version() == before {
				return errors.New("deleting a placed job left the version")
			}
			return nil
		}, true},
	}
	for _, st := range steps {
		before := version()
		if err := st.write(); err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		if moved := version() != before; moved != st.moves {
			t.Errorf("%s: version moved %v, want %v", st.name, moved, st.moves)
		}
	}
}

// TestPendingQueueOrder: the queue index yields, on seeded random jobs of
// random priorities (negative ones too) and turns moving in and out of the
// queue, the order of a sort by priority, highest first, then Turn, the
// zero Turn first, then Seq; PendingHead is its first job.
func TestPendingQueueOrder(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(15, 33))
	s := newStore(t)
	states := []JobState{JobPending, JobPending, JobPending, JobPlaced, JobFinished, JobRejected}
	// Turns: none, before and after 1970, equal ones (placement's queue
	// order sets them; see Job.Turn).
	epoch := time.Unix(0, 0)
	turns := []time.Time{{}, {}, epoch, epoch.Add(-time.Hour), epoch.Add(time.Nanosecond), time.Date(2026, 12, 7, 10, 0, 0, 0, time.UTC),
		time.Date(2026, 12, 7, 10, 0, 0, 1, time.UTC), time.Date(2200, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(1700, 1, 1, 0, 0, 0, 0, time.UTC)}
	for i := range 2000 {
		id := fmt.Sprintf("j%d", rng.IntN(300))
		if rng.IntN(10) == 0 {
			if err := s.DeleteJob(id); err != nil {
				t.Fatal(err)
			}
		} else if err := s.UpsertJob(Job{ID: id, State: states[rng.IntN(len(states))], Priority: rng.IntN(7) - 3, Turn: turns[rng.IntN(len(turns))]}); err != nil {
			t.Fatal(err)
		}
		if i%50 != 0 {
			continue
		}
		snap := s.Snapshot()
		want := snap.JobsInState(JobPending)
		slices.SortFunc(want, func(a, b Job) int {
			return cmp.Or(cmp.Compare(b.Priority, a.Priority), a.Turn.Compare(b.Turn), cmp.Compare(a.Seq, b.Seq))
		})
		got := snap.PendingQueue()
		if !slices.EqualFunc(got, want, func(a *Job, b Job) bool { return a.ID == b.ID }) {
			t.Fatalf("step %d: queue %d jobs, want %v", i, len(got), jobIDs(want))
		}
		h, ok := snap.PendingHead()
		if ok != (len(want) > 0) || ok && h.ID != want[0].ID {
			t.Fatalf("step %d: head %q, %v; want the queue's first of %v", i, h.ID, ok, jobIDs(want))
		}
	}
}

func jobIDs(js []Job) []string {
	out := make([]string, len(js))
	for i, j := range js {
		out[i] = j.ID
	}
	return out
}
