package placement

import (
	"fmt"
	"io/fs"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"
	"testing/fstest"
	"time"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/events/eventstest"
	"github.com/toposched/toposched/internal/formats/clusterfile"
	"github.com/toposched/toposched/internal/store"
	"github.com/toposched/toposched/policies"
)

// A retry of the queue shares one job's wait with the jobs identical to it
// but for their ids, and decides exactly as a retry that plans every job:
// two services take the same seeded run of submissions, finishes and
// clock moves, one under a policy set whose placement rules cannot see a
// job's id (so it shares waits) and one under the same set plus a rule
// that names the id and never fires (so it plans every job). Every job's
// state and GPUs agree after each step, and the first evaluated the
// policies fewer times.
func TestRetrySharesTwinsWaits(t *testing.T) {
	t.Parallel()
	// Jobs labelled blocked are denied every placement, so they wait,
	// their candidates judged, while anything runs.
	const blocked = `package toposched.placement.blocked
deny contains {"code": "blocked", "msg": "blocked"} if input.job.labels.blocked == "yes"
`
	const namesID = `package toposched.placement.names_id
deny contains {"code": "never", "msg": "never"} if input.job.id == "no job has this id"
`
	sharing := twinsRig(t, fstest.MapFS{"blocked.rego": {Data: []byte(blocked)}})
	planning := twinsRig(t, fstest.MapFS{"blocked.rego": {Data: []byte(blocked)}, "names_id.rego": {Data: []byte(namesID)}})
	if sharing.s.policies.ReadsJobID() || !planning.s.policies.ReadsJobID() {
		t.Fatal("the sets' ReadsJobID: want false for the first, true for the second")
	}
	shapes := []events.JobSubmitted{
		{GPUs: 1}, {GPUs: 4}, {GPUs: 8}, {GPUs: 16}, {GPUs: 24},
		{GPUs: 4, Tenant: "t1"}, {GPUs: 8, Priority: 2}, {GPUs: 4, Labels: map[string]string{"team": "x"}},
		{GPUs: 2, Labels: map[string]string{"blocked": "yes"}}, {GPUs: 8, Labels: map[string]string{"blocked": "yes"}},
	}
	rng := rand.New(rand.NewPCG(7, 51))
	var ids []string
	waitedTwins := false
	for step := range 400 {
		switch k := rng.IntN(10); {
		case k < 6:
			sub := shapes[rng.IntN(len(shapes))]
			sub.JobID = fmt.Sprintf("j%03d", step)
			sub.Labels = maps.Clone(sub.Labels)
			sharing.submit(sub)
			planning.submit(sub)
			ids = append(ids, sub.JobID)
		case k < 9:
			var placed []string
			for _, id := range ids {
				if sharing.job(id).State == store.JobPlaced {
					placed = append(placed, id)
				}
			}
			if len(placed) == 0 {
				continue
			}
			id := placed[rng.IntN(len(placed))]
			sharing.finish(id)
			planning.finish(id)
		default:
			// Past ReserveAfter the head gets nodes held.
			sharing.clock = sharing.clock.Add(4 * time.Minute)
			planning.clock = planning.clock.Add(4 * time.Minute)
		}
		for _, id := range ids {
			a, b := sharing.job(id), planning.job(id)
			if a.State != b.State || !slices.Equal(gpusOfJob(a), gpusOfJob(b)) {
				t.Fatalf("step %d: job %s %s on %v sharing waits, %s on %v planning every job", step, id, a.State, gpusOfJob(a), b.State, gpusOfJob(b))
			}
		}
		waitedTwins = waitedTwins || twinsWaiting(sharing.s.Store().Snapshot())
	}
	if !waitedTwins {
		t.Fatal("no two jobs identical but for their ids waited together: the run tests nothing")
	}
	if sharing.evals >= planning.evals {
		t.Errorf("policy evaluations: %d sharing waits, %d planning every job; want fewer", sharing.evals, planning.evals)
	}
}

// twinsTestRig is a clockedRig that counts the policy evaluations.
type twinsTestRig struct {
	*clockedRig
	evals int
}

func twinsRig(t *testing.T, extra fstest.MapFS) *twinsTestRig {
	t.Helper()
	// The shipped set, and the extra files.
	files := fstest.MapFS{}
	err := fs.WalkDir(policies.Default, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := fs.ReadFile(policies.Default, p)
		files[p] = &fstest.MapFile{Data: data}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	maps.Copy(files, extra)
	set, err := policies.Compile(files, "twins")
	if err != nil {
		t.Fatal(err)
	}
	srv := eventstest.Server(t)
	b := eventstest.Bus(t, srv.ClientURL(), "test")
	r := &twinsTestRig{clockedRig: &clockedRig{t: t, ctx: eventstest.Context(t, 60*time.Second), clock: time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)}}
	// No wall-clock bound on the local search: the two services must
	// decide alike whatever the machine's load (with serve's 2 ms, a
	// loaded CI host stopped one service's search sooner than the
	// other's: the same job on other GPUs).
	s, err := New(Config{Policies: set, SearchBudget: -1}, Deps{Publish: b, Read: b, Consume: b, Subjects: b.Subjects,
		Now: func() time.Time { return r.clock }, ObservePolicyEval: func(time.Duration) { r.evals++ }})
	if err != nil {
		t.Fatal(err)
	}
	r.s = s
	for i, model := range []string{"dgx-a100", "dgx-a100", "dgx-a100", "pcie-8gpu"} {
		m, err := clusterfile.Model(model)
		if err != nil {
			t.Fatal(err)
		}
		m.Name = fmt.Sprintf("n%d", i)
		ev := m.Event()
		if err := s.OnNode(r.ctx, events.Envelope{}, &ev); err != nil {
			t.Fatal(err)
		}
	}
	return r
}

// twinsWaiting reports whether two waiting jobs are identical but for
// their ids.
func twinsWaiting(snap *store.Snapshot) bool {
	var w twins
	seen := map[int]bool{}
	for _, j := range snap.PendingQueue() {
		c := w.class(j)
		if seen[c] {
			return true
		}
		seen[c] = true
	}
	return false
}

func gpusOfJob(j store.Job) []store.GPUKey {
	if j.Decision == nil {
		return nil
	}
	return gpusOf(j.Decision)
}

// Under policies that tell jobs apart by id, a job's wait answers for no
// other: behind a job the policies deny, its twin but for the id is
// placed once GPUs free.
func TestRetryPlansJobsPoliciesTellApart(t *testing.T) {
	t.Parallel()
	r := twinsRig(t, fstest.MapFS{"by_id.rego": {Data: []byte(`package toposched.placement.by_id
deny contains {"code": "by_id", "msg": "not this one"} if startswith(input.job.id, "no-")
`)}})
	r.submit(events.JobSubmitted{JobID: "run", GPUs: 8, GPUsPerNode: 8})
	r.submit(events.JobSubmitted{JobID: "run2", GPUs: 24})
	for _, id := range []string{"no-1", "ok-2"} {
		if j := r.submit(events.JobSubmitted{JobID: id, GPUs: 4}); j.State != store.JobPending {
			t.Fatalf("%s: %s, want pending on a full cluster", id, j.State)
		}
	}
	r.finish("run")
	if j := r.job("no-1"); j.State != store.JobPending {
		t.Errorf("no-1: %s, want pending (denied)", j.State)
	}
	if j := r.job("ok-2"); j.State != store.JobPlaced {
		t.Errorf("ok-2: %s, want placed in the GPUs run freed", j.State)
	}
}

// A job placed in the retry changes what its twins behind it see: a wait
// before it answers for none after it. Here a policy lets jobs labelled
// late start only once the cluster is at least half full, which the job
// between the twins makes it.
func TestRetryPlacementEndsTwinsWait(t *testing.T) {
	t.Parallel()
	r := twinsRig(t, fstest.MapFS{"late.rego": {Data: []byte(`package toposched.placement.late
deny contains {"code": "late", "msg": "the cluster is not half full"} if {
	input.job.labels.late == "yes"
	input.cluster.free_gpus > 16
}
`)}})
	r.submit(events.JobSubmitted{JobID: "run", GPUs: 24})
	r.submit(events.JobSubmitted{JobID: "keep", GPUs: 8, GPUsPerNode: 8})
	late := map[string]string{"late": "yes"}
	for _, sub := range []events.JobSubmitted{{JobID: "l1", GPUs: 4, Labels: late}, {JobID: "x", GPUs: 16}, {JobID: "l2", GPUs: 4, Labels: late}} {
		if j := r.submit(sub); j.State != store.JobPending {
			t.Fatalf("%s: %s, want pending on a full cluster", sub.JobID, j.State)
		}
	}
	r.finish("run")
	for id, want := range map[string]store.JobState{"l1": store.JobPending, "x": store.JobPlaced, "l2": store.JobPlaced} {
		if j := r.job(id); j.State != want {
			t.Errorf("%s: %s, want %s", id, j.State, want)
		}
	}
}

// A job's class is its twins': the same for jobs identical but for their
// ids, another for any other difference, kept per row and forgotten with
// rows that left the queue.
func TestTwinsClasses(t *testing.T) {
	t.Parallel()
	base := events.JobAnalyzed{Job: events.JobSubmitted{JobID: "a", GPUs: 8, Labels: map[string]string{"k": "v"}},
		Parallelism: events.Parallelism{TP: 8, PP: 1, DP: 1}, Order: []string{"tp", "pp", "dp"},
		Groups: []events.RankGroups{{Dimension: "tp", Size: 8, Members: [][]int{{0, 1, 2, 3, 4, 5, 6, 7}}}}}
	variant := func(f func(j *events.JobAnalyzed)) *store.Job {
		j := base
		j.Job.Labels = maps.Clone(base.Job.Labels)
		j.Groups = []events.RankGroups{base.Groups[0]}
		j.Groups[0].Members = [][]int{slices.Clone(base.Groups[0].Members[0])}
		f(&j)
		return &store.Job{ID: j.Job.JobID, Spec: j}
	}
	var tw twins
	first := tw.class(variant(func(*events.JobAnalyzed) {}))
	twin := variant(func(j *events.JobAnalyzed) { j.Job.JobID = "b" })
	if c := tw.class(twin); c != first {
		t.Errorf("a job identical but for its id: class %d, want %d", c, first)
	}
	for _, tc := range []struct {
		name string
		f    func(j *events.JobAnalyzed)
	}{
		{"tenant", func(j *events.JobAnalyzed) { j.Job.Tenant = "t" }},
		{"priority", func(j *events.JobAnalyzed) { j.Job.Priority = 1 }},
		{"gpus per node", func(j *events.JobAnalyzed) { j.Job.GPUsPerNode = 8 }},
		{"gpu model", func(j *events.JobAnalyzed) { j.Job.GPUModel = "H100" }},
		{"a label", func(j *events.JobAnalyzed) { j.Job.Labels["k"] = "w" }},
		{"a step compute time", func(j *events.JobAnalyzed) { j.Job.StepComputeSeconds = 1 }},
		{"the rank order", func(j *events.JobAnalyzed) { j.Order = []string{"dp", "pp", "tp"} }},
		{"a group's members", func(j *events.JobAnalyzed) { j.Groups[0].Members[0][7], j.Groups[0].Members[0][6] = 6, 7 }},
	} {
		if c := tw.class(variant(tc.f)); c == first {
			t.Errorf("a job of another %s: class %d, that of the first", tc.name, c)
		}
	}
	// Rows that left the queue are forgotten once they outnumber it.
	for i := range 100 {
		if c := tw.class(variant(func(j *events.JobAnalyzed) { j.Job.JobID = fmt.Sprint("c", i) })); c != first {
			t.Fatalf("twin c%d: class %d, want %d", i, c, first)
		}
	}
	tw.keep([]*store.Job{twin})
	if _, ok := tw.of[twin]; !ok || len(tw.of) != 1 {
		t.Errorf("%d rows kept for a queue of one (its row kept: %v), want 1", len(tw.of), ok)
	}
}
