package kube

import (
	"errors"
	"fmt"
	"maps"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/events/bus"
)

// decided is a decision of ranks; each entry is "node/gpu" or
// "node/gpu/nic", rank i the i-th.
func decided(id string, ranks ...string) *events.PlacementDecided {
	d := &events.PlacementDecided{JobID: id, Strategy: "ddp", DecidedAt: time.Unix(0, 0).UTC()}
	for i, r := range ranks {
		parts := strings.Split(r, "/")
		gpu, err := strconv.Atoi(parts[1])
		if err != nil {
			panic(err)
		}
		rp := events.RankPlacement{Rank: i, Node: parts[0], GPU: gpu}
		if len(parts) > 2 {
			rp.NIC = parts[2]
		}
		d.Ranks = append(d.Ranks, rp)
	}
	return d
}

func namedPods(names ...string) []*corev1.Pod {
	out := make([]*corev1.Pod, len(names))
	for i, n := range names {
		out[i] = &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: n}}
	}
	return out
}

func TestPlans(t *testing.T) {
	tests := []struct {
		name  string
		d     *events.PlacementDecided
		pods  []*corev1.Pod
		want  []string // per pod: node and GPUs, "node:gpu,gpu"
		fault string   // a permanent error saying this
	}{
		{name: "one rank per pod", d: decided("j", "a/3", "b/0"), pods: namedPods("p0", "p1"), want: []string{"a:3", "b:0"}},
		{name: "k ranks per pod on one node", d: decided("j", "a/0", "a/1", "b/6", "b/7"), pods: namedPods("p0", "p1"), want: []string{"a:0,1", "b:6,7"}},
		{name: "two pods on one node", d: decided("j", "a/0", "a/1", "a/2", "a/3"), pods: namedPods("p0", "p1"), want: []string{"a:0,1", "a:2,3"}},
		{name: "ranks out of order", d: func() *events.PlacementDecided {
			d := decided("j", "a/0", "a/1", "b/2", "b/3")
			d.Ranks[0], d.Ranks[3] = d.Ranks[3], d.Ranks[0]
			return d
		}(), pods: namedPods("p0", "p1"), want: []string{"a:0,1", "b:2,3"}},
		{name: "a pod's ranks on two nodes", d: decided("j", "a/0", "b/0", "b/1", "b/2"), pods: namedPods("p0", "p1"), fault: "pod p0's ranks are on two nodes (a, b)"},
		{name: "a rank missing", d: func() *events.PlacementDecided {
			d := decided("j", "a/0", "a/1", "b/0", "b/1")
			d.Ranks[2].Rank = 7
			return d
		}(), pods: namedPods("p0", "p1"), fault: "the decision has no rank 2"},
		{name: "a rank twice", d: func() *events.PlacementDecided {
			d := decided("j", "a/0", "a/1")
			d.Ranks[1].Rank = 0
			return d
		}(), pods: namedPods("p0", "p1"), fault: "the decision has no rank 1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pls, err := plans(tt.d, tt.pods)
			if tt.fault != "" {
				if err == nil || !isPermanent(err) || !strings.Contains(err.Error(), tt.fault) {
					t.Fatalf("plans: %v, want a permanent error saying %q", err, tt.fault)
				}
				return
			}
			if err != nil {
				t.Fatalf("plans: %v", err)
			}
			if len(pls) != len(tt.pods) {
				t.Fatalf("%d plans for %d pods", len(pls), len(tt.pods))
			}
			for i, pl := range pls {
				if pl.pod != tt.pods[i] || pl.index != i {
					t.Errorf("plan %d is of pod %s at index %d", i, pl.pod.Name, pl.index)
				}
				var gpus []string
				for j, r := range pl.ranks {
					if want := i*len(pl.ranks) + j; r.Rank != want {
						t.Errorf("pod %d's rank %d is %d, want %d", i, j, r.Rank, want)
					}
					gpus = append(gpus, strconv.Itoa(r.GPU))
				}
				if got := pl.node + ":" + strings.Join(gpus, ","); got != tt.want[i] {
					t.Errorf("pod %d gets %s, want %s", i, got, tt.want[i])
				}
			}
		})
	}
}

func TestRankAnnotations(t *testing.T) {
	tests := []struct {
		name   string
		d      *events.PlacementDecided
		pod    int // which pod's plan
		pods   int
		master string
		want   map[string]string
	}{
		{
			name: "first pod, default port, NICs", d: decided("j-1", "a/4/mlx5_2", "a/5/mlx5_2", "a/6/mlx5_3", "a/7/mlx5_3", "b/0/mlx5_0", "b/1/mlx5_0", "b/2/mlx5_1", "b/3/mlx5_1"),
			pod: 0, pods: 2, master: "train-0.train.team-a.svc",
			want: map[string]string{
				AnnotationJobID: "j-1", AnnotationRank: "0", AnnotationWorldSize: "8", AnnotationLocalRank: "0",
				AnnotationNodeRank: "0", AnnotationNprocPerNode: "4", AnnotationMasterAddr: "train-0.train.team-a.svc",
				AnnotationMasterPort: "29500", AnnotationGPUs: "4,5,6,7", AnnotationIBHCA: "mlx5_2,mlx5_3",
			},
		},
		{
			name: "second pod, the decision's port", d: func() *events.PlacementDecided {
				d := decided("j-1", "a/4", "a/5", "b/0/mlx5_0", "b/1/mlx5_0")
				d.Launch = &events.Launch{MasterAddr: "a", MasterPort: 29504}
				return d
			}(),
			pod: 1, pods: 2, master: "a",
			want: map[string]string{
				AnnotationJobID: "j-1", AnnotationRank: "2", AnnotationWorldSize: "4", AnnotationLocalRank: "0",
				AnnotationNodeRank: "1", AnnotationNprocPerNode: "2", AnnotationMasterAddr: "a",
				AnnotationMasterPort: "29504", AnnotationGPUs: "0,1", AnnotationIBHCA: "mlx5_0",
			},
		},
		{
			name: "no NICs known: no HCA", d: decided("j-2", "a/3"),
			pod: 0, pods: 1, master: "a",
			want: map[string]string{
				AnnotationJobID: "j-2", AnnotationRank: "0", AnnotationWorldSize: "1", AnnotationLocalRank: "0",
				AnnotationNodeRank: "0", AnnotationNprocPerNode: "1", AnnotationMasterAddr: "a",
				AnnotationMasterPort: "29500", AnnotationGPUs: "3",
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			names := make([]string, tt.pods)
			for i := range names {
				names[i] = "p" + strconv.Itoa(i)
			}
			pls, err := plans(tt.d, namedPods(names...))
			if err != nil {
				t.Fatal(err)
			}
			j := &jobState{id: tt.d.JobID, decided: tt.d}
			got := rankAnnotations(j, pls[tt.pod], tt.master)
			if !maps.Equal(got, tt.want) {
				t.Errorf("annotations\n got %v\nwant %v", got, tt.want)
			}
			for k := range got {
				if !strings.HasPrefix(k, Prefix) {
					t.Errorf("annotation %s is not toposched's", k)
				}
			}
		})
	}
}

// TestRankAnnotationsAreBindingAnnotations: every annotation written at
// binding is one JobSpec passes over, so that a bound pod's annotations
// never make its gang's next job fail.
func TestRankAnnotationsAreBindingAnnotations(t *testing.T) {
	d := decided("j-1", "a/0/mlx5_0")
	pls, err := plans(d, namedPods("p0"))
	if err != nil {
		t.Fatal(err)
	}
	a := rankAnnotations(&jobState{id: "j-1", decided: d}, pls[0], "a")
	for k := range a {
		found := false
		for _, b := range BindingAnnotations {
			found = found || b == k
		}
		if !found {
			t.Errorf("annotation %s is written at binding but not in BindingAnnotations", k)
		}
	}
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "p0", Annotations: a}}
	if _, err := JobSpec(p); err != nil {
		t.Errorf("JobSpec of a bound pod: %v", err)
	}
}

func TestMasterAddr(t *testing.T) {
	withDNS := func(host, sub string) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "p0"}}
		p.Spec.Hostname, p.Spec.Subdomain = host, sub
		return p
	}
	launch := func(addr string) *events.PlacementDecided {
		d := decided("j", "node-a/0")
		d.Launch = &events.Launch{MasterAddr: addr}
		return d
	}
	tests := []struct {
		name string
		d    *events.PlacementDecided
		pod  *corev1.Pod
		want string
	}{
		{"hostname and subdomain", launch("node-a"), withDNS("train-workers-0-0", "train"), "train-workers-0-0.train.team-a.svc"},
		{"hostname alone: the decision's", launch("node-a"), withDNS("train-workers-0-0", ""), "node-a"},
		{"subdomain alone: the decision's", launch("node-a"), withDNS("", "train"), "node-a"},
		{"no launch: rank 0's node", decided("j", "node-b/0"), withDNS("", ""), "node-b"},
		{"empty launch address: rank 0's node", launch(""), withDNS("", ""), "node-a"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pls, err := plans(tt.d, []*corev1.Pod{tt.pod})
			if err != nil {
				t.Fatal(err)
			}
			if got := masterAddr(tt.d, pls); got != tt.want {
				t.Errorf("masterAddr = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestEnded(t *testing.T) {
	pod := func(phase corev1.PodPhase, deleting bool) *corev1.Pod {
		p := &corev1.Pod{Status: corev1.PodStatus{Phase: phase}}
		if deleting {
			p.DeletionTimestamp = &metav1.Time{Time: time.Unix(1, 0)}
		}
		return p
	}
	var (
		running   = pod(corev1.PodRunning, false)
		pending   = pod(corev1.PodPending, false)
		succeeded = pod(corev1.PodSucceeded, false)
		failed    = pod(corev1.PodFailed, false)
		deleting  = pod(corev1.PodRunning, true)
	)
	tests := []struct {
		name   string
		pods   []*corev1.Pod
		done   bool
		status events.JobStatus
		msg    string
	}{
		{"all succeeded", []*corev1.Pod{succeeded, succeeded}, true, events.StatusSucceeded, "every pod succeeded"},
		{"one failed, the others succeeded", []*corev1.Pod{succeeded, failed, succeeded}, true, events.StatusFailed, "1 of the job's 3 pods failed"},
		{"one failed, one deleted", []*corev1.Pod{failed, deleting}, true, events.StatusFailed, "1 of the job's 2 pods failed"},
		{"one deleted, the other succeeded", []*corev1.Pod{succeeded, deleting}, true, events.StatusCancelled, "1 of the job's 2 pods were deleted"},
		{"all deleted", []*corev1.Pod{deleting, deleting}, true, events.StatusCancelled, "2 of the job's 2 pods were deleted"},
		// A pod that still runs holds its GPUs: the job has not ended.
		{"one succeeded, one running", []*corev1.Pod{succeeded, running}, false, "", ""},
		{"one failed, one running", []*corev1.Pod{failed, running}, false, "", ""},
		{"one deleted, one pending", []*corev1.Pod{deleting, pending}, false, "", ""},
		{"running", []*corev1.Pod{running}, false, "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			done, status, msg := ended(tt.pods)
			if done != tt.done || status != tt.status || msg != tt.msg {
				t.Errorf("ended = %v, %q, %q; want %v, %q, %q", done, status, msg, tt.done, tt.status, tt.msg)
			}
		})
	}
}

func TestPermanentError(t *testing.T) {
	inner := errors.New("inner")
	err := error(&permanentError{inner})
	if !isPermanent(err) || !errors.Is(err, inner) {
		t.Errorf("permanentError: isPermanent %v, Is(inner) %v", isPermanent(err), errors.Is(err, inner))
	}
	if wrapped := errors.Join(errors.New("pod p"), err); !isPermanent(wrapped) {
		t.Error("a wrapped permanentError is not permanent")
	}
	if isPermanent(&conflictError{"x"}) || isPermanent(inner) {
		t.Error("a conflict or a plain error is permanent")
	}
}

// TestUndoReadsClaimsFresh: undo gives back a claim the carry-out
// allocated even where the informer's cache has not seen the allocation
// yet (a carry-out fails a few milliseconds after it wrote the claim).
func TestUndoReadsClaimsFresh(t *testing.T) {
	const job = "k8s:team-a:train:0123456789ab-1"
	pod, stale := lone("train", 2, nil)
	written := stale.DeepCopy()
	written.Finalizers = []string{finalizer}
	written.Annotations = map[string]string{AnnotationJobID: job}
	written.Status.Allocation = allocatedClaim("x", "", "node-a", "gpu-0", "gpu-1").Status.Allocation
	written.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: pod.Name, UID: pod.UID}}
	cs := fake.NewClientset(pod, written)
	s, err := New(Config{}, Deps{Kube: cs, Bus: &bus.Bus{}})
	if err != nil {
		t.Fatal(err)
	}
	add(t, s.pods, pod)
	add(t, s.claims, stale)

	if err := s.undo(t.Context(), &jobState{id: job}, []*corev1.Pod{pod}); err != nil {
		t.Fatalf("undo: %v", err)
	}
	c, err := cs.ResourceV1().ResourceClaims("team-a").Get(t.Context(), stale.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if c.Status.Allocation != nil || len(c.Status.ReservedFor) > 0 || len(c.Finalizers) > 0 || c.Annotations[AnnotationJobID] != "" {
		t.Errorf("claim after undo: allocated %v, reserved for %v, finalizers %v, annotations %v; want it given back",
			allocated(c), c.Status.ReservedFor, c.Finalizers, c.Annotations)
	}
}

// TestEachPod: every plan is tried, no more than carryOutParallelism at
// once, and the error is the first failed plan's in the gang's order, as a
// loop over the plans would have returned it.
func TestEachPod(t *testing.T) {
	for _, tc := range []struct {
		name   string
		pods   int
		failAt map[int]error
		want   int // index whose error is returned, -1 for none
	}{
		{"none fails", 3, nil, -1},
		{"one fails", 4, map[int]error{2: errors.New("two")}, 2},
		{"the earliest of several", 5, map[int]error{4: errors.New("four"), 1: &permanentError{errors.New("one")}, 3: errors.New("three")}, 1},
		{"more pods than run at once", 3*carryOutParallelism + 1, map[int]error{3 * carryOutParallelism: errors.New("last")}, 3 * carryOutParallelism},
		{"no pods", 0, nil, -1},
		{"a lone pod", 1, nil, -1},
		{"a lone pod that fails", 1, map[int]error{0: errors.New("zero")}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pls := make([]podPlan, tc.pods)
			for i := range pls {
				pls[i] = podPlan{pod: &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprint(i)}}, index: i}
			}
			var mu sync.Mutex
			tried := map[int]bool{}
			running, most := 0, 0
			err := eachPod(pls, func(pl podPlan) error {
				mu.Lock()
				tried[pl.index] = true
				running++
				most = max(most, running)
				mu.Unlock()
				defer func() {
					mu.Lock()
					running--
					mu.Unlock()
				}()
				return tc.failAt[pl.index]
			})
			if len(tried) != tc.pods {
				t.Errorf("%d of %d plans tried", len(tried), tc.pods)
			}
			if most > carryOutParallelism {
				t.Errorf("%d plans ran at once, more than %d", most, carryOutParallelism)
			}
			switch {
			case tc.want < 0 && err != nil:
				t.Errorf("error %v, want none", err)
			case tc.want >= 0 && !errors.Is(err, tc.failAt[tc.want]):
				t.Errorf("error %v, want plan %d's %v", err, tc.want, tc.failAt[tc.want])
			}
		})
	}
}
