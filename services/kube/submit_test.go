package kube

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"

	"github.com/toposched/toposched/events"
)

// podsWithUIDs are pods of namespace team-a with the given UIDs.
func podsWithUIDs(uids ...string) []*corev1.Pod {
	out := make([]*corev1.Pod, len(uids))
	for i, u := range uids {
		out[i] = &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "p" + strconv.Itoa(i), UID: types.UID(u)}}
	}
	return out
}

func TestJobIDRoundTrip(t *testing.T) {
	members := fingerprint(Gang{Namespace: "team-a", Kind: KindJobSet, Name: "llama"}, podsWithUIDs("u1", "u2"))
	for _, attempt := range []int{1, 2, 9, 10, 123456} {
		id := jobID(members, attempt)
		gotMembers, gotAttempt := parseJobID(id)
		if gotMembers != members || gotAttempt != attempt {
			t.Errorf("parseJobID(%q) = %q, %d; want %q, %d", id, gotMembers, gotAttempt, members, attempt)
		}
		if !events.ValidJobID(id) {
			t.Errorf("jobID(%q, %d) = %q is not a valid job id", members, attempt, id)
		}
	}
}

// TestParseJobIDNotOurs: an id not of jobID's shape is its own member set
// at attempt 0, so that job() never takes it for an attempt of another.
func TestParseJobIDNotOurs(t *testing.T) {
	for _, id := range []string{
		"k8s:team-a:llama:0123456789ab",  // no attempt
		"k8s:team-a:my-job:0123456789ab", // a '-' in the name is no attempt
		"k8s:team-a:llama:0123456789ab-0",
		"k8s:team-a:llama:0123456789ab-x",
		"k8s:team-a:llama:0123456789ab-",
		"plain",
	} {
		members, attempt := parseJobID(id)
		if members != id || attempt != 0 {
			t.Errorf("parseJobID(%q) = %q, %d; want %q, 0", id, members, attempt, id)
		}
	}
}

func TestFingerprint(t *testing.T) {
	g := Gang{Namespace: "team-a", Kind: KindJobSet, Name: "llama"}
	base := fingerprint(g, podsWithUIDs("u1", "u2", "u3"))
	if !strings.HasPrefix(base, JobIDPrefix+"team-a:llama:") {
		t.Errorf("fingerprint %q does not start with %q", base, JobIDPrefix+"team-a:llama:")
	}
	if got := fingerprint(g, podsWithUIDs("u3", "u1", "u2")); got != base {
		t.Errorf("the same members in another order: %q, want %q", got, base)
	}
	if got := fingerprint(g, podsWithUIDs("u1", "u2", "u4")); got == base {
		t.Errorf("another member set has the same fingerprint %q", got)
	}
	if got := fingerprint(g, podsWithUIDs("u1", "u2")); got == base {
		t.Errorf("a subset of the members has the same fingerprint %q", got)
	}
	// UIDs are joined with a separator: ("u1","u2") is not ("u1u2").
	if a, b := fingerprint(g, podsWithUIDs("u1", "u2")), fingerprint(g, podsWithUIDs("u1u2")); a == b {
		t.Errorf("members (u1, u2) and (u1u2) share fingerprint %q", a)
	}
	for _, other := range []Gang{
		{Namespace: "team-b", Kind: KindJobSet, Name: "llama"},
		{Namespace: "team-a", Kind: KindPodGroup, Name: "llama"},
		{Namespace: "team-a", Kind: KindJobSet, Name: "llama2"},
	} {
		if got := fingerprint(other, podsWithUIDs("u1", "u2", "u3")); got == base {
			t.Errorf("gang %s has the fingerprint of %s: %q", other.Key(), g.Key(), got)
		}
	}
}

// TestFingerprintLongNames: names are cut to keep the id within the
// schema's 128 characters, and the hash keeps ids of names that share
// their first characters apart.
func TestFingerprintLongNames(t *testing.T) {
	ns := strings.Repeat("n", 63) // the longest namespace (a DNS label)
	common := strings.Repeat("a", 40)
	names := []string{
		common + "-one",
		common + "-two",
		common,
		strings.Repeat("b", 39) + "-tail", // cut just after a '-': trimmed
		strings.Repeat("c", 39) + ".tail",
		strings.Repeat("x", 253), // the longest pod name
		"w_1.x",                  // label values may hold '_' and '.'
		"UPPER",
	}
	seen := map[string]string{}
	for _, name := range names {
		for _, kind := range []string{KindPod, KindPodGroup} {
			g := Gang{Namespace: ns, Kind: kind, Name: name}
			members := fingerprint(g, podsWithUIDs("0b8e7c5e-8f1d-4c7a-9a8e-1f2e3d4c5b6a"))
			if prev, dup := seen[members]; dup {
				t.Errorf("gangs %s and %s share the fingerprint %q", prev, g.Key(), members)
			}
			seen[members] = g.Key()
			for _, attempt := range []int{1, 99999} {
				if id := jobID(members, attempt); !events.ValidJobID(id) {
					t.Errorf("gang %s attempt %d: job id %q (%d characters) is not valid", g.Key(), attempt, id, len(id))
				}
			}
			readable := strings.Split(members, ":")[2]
			if len(readable) > 40 || strings.HasSuffix(readable, "-") || strings.HasSuffix(readable, ".") {
				t.Errorf("gang %s: the name in %q is %q, want at most 40 characters ending in neither '-' nor '.'", g.Key(), members, readable)
			}
		}
	}
}

// gangMember is pod index of a JobSet "train" of size pods, as the JobSet
// controller makes it, bound to node unless node is "".
func gangMember(index, size int, uid, node, job string) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: "team-a", Name: fmt.Sprintf("train-workers-%d-0", index), UID: types.UID(uid),
			Labels: map[string]string{
				"jobset.sigs.k8s.io/jobset-name":        "train",
				"jobset.sigs.k8s.io/replicatedjob-name": "workers",
				"jobset.sigs.k8s.io/job-index":          strconv.Itoa(index),
				"jobset.sigs.k8s.io/job-global-index":   strconv.Itoa(index),
			},
			Annotations: map[string]string{AnnotationGangSize: strconv.Itoa(size)},
		},
		Spec: corev1.PodSpec{SchedulerName: DefaultSchedulerName, NodeName: node},
	}
	if job != "" {
		p.Annotations[AnnotationJobID] = job
	}
	return p
}

// gangService is a service whose pod cache holds pods, with the job
// states given, its Events recorded.
func gangService(t *testing.T, pods []*corev1.Pod, jobs ...*jobState) (*Service, *record.FakeRecorder) {
	t.Helper()
	objs := make([]runtime.Object, len(pods))
	for i, p := range pods {
		objs[i] = p
	}
	factory := informers.NewSharedInformerFactory(fake.NewClientset(objs...), 0)
	inf := factory.Core().V1().Pods().Informer()
	if err := inf.AddIndexers(cache.Indexers{indexGang: gangIndex}); err != nil {
		t.Fatal(err)
	}
	factory.Start(t.Context().Done())
	t.Cleanup(factory.Shutdown)
	if !cache.WaitForCacheSync(t.Context().Done(), inf.HasSynced) {
		t.Fatal("pod cache did not sync")
	}
	rec := record.NewFakeRecorder(64)
	s := &Service{pods: inf, rec: rec, jobs: map[string]*jobState{}, attempts: map[string]int{},
		byGang: map[string]map[string]bool{}, said: map[string]string{}}
	for _, j := range jobs {
		s.jobs[j.id] = j
	}
	return s, rec
}

// TestSyncGangWhileBinding: while a decided gang's pods are being bound
// (some bound, the others not yet, in the cache), the ones not yet bound
// are told nothing; a pod that replaces one of a running gang's is told
// it waits for the gang to end.
func TestSyncGangWhileBinding(t *testing.T) {
	members := func(pods ...*corev1.Pod) string {
		g, err := GangOf(pods[0])
		if err != nil {
			t.Fatal(err)
		}
		return fingerprint(g, pods)
	}
	decided := &events.PlacementDecided{}
	for _, tc := range []struct {
		name  string
		pods  func(job string) []*corev1.Pod
		job   func(pods []*corev1.Pod) *jobState
		event string // "" for none
	}{
		{
			name: "the decided job's pods, one bound",
			pods: func(job string) []*corev1.Pod {
				return []*corev1.Pod{gangMember(0, 3, "u0", "node-a", job), gangMember(1, 3, "u1", "", ""), gangMember(2, 3, "u2", "", "")}
			},
			job: func(pods []*corev1.Pod) *jobState {
				return &jobState{members: members(pods...), decided: decided}
			},
		},
		{
			name: "a pod replacing one of a running gang's",
			pods: func(job string) []*corev1.Pod {
				return []*corev1.Pod{gangMember(0, 3, "u0", "node-a", job), gangMember(1, 3, "u1", "node-b", job), gangMember(2, 3, "u3", "", "")}
			},
			job: func(pods []*corev1.Pod) *jobState {
				return &jobState{members: members(pods[0], pods[1], gangMember(2, 3, "u2", "", "")), decided: decided}
			},
			event: "Warning FailedScheduling 2 other pods of the gang are bound already",
		},
		{
			name: "a finished job's pods",
			pods: func(job string) []*corev1.Pod {
				return []*corev1.Pod{gangMember(0, 3, "u0", "node-a", job), gangMember(1, 3, "u1", "", ""), gangMember(2, 3, "u2", "", "")}
			},
			job: func(pods []*corev1.Pod) *jobState {
				return &jobState{members: members(pods...), decided: decided, finished: true}
			},
			event: "Warning FailedScheduling 1 other pods of the gang are bound already",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			probe := tc.pods("")
			j := tc.job(probe)
			j.id = jobID(j.members, 1)
			pods := tc.pods(j.id)
			s, rec := gangService(t, pods, j)
			g, err := GangOf(pods[0])
			if err != nil {
				t.Fatal(err)
			}
			if err := s.syncGang(t.Context(), g.Key()); err != nil {
				t.Fatal(err)
			}
			var got []string
			for len(rec.Events) > 0 {
				got = append(got, <-rec.Events)
			}
			switch {
			case tc.event == "" && len(got) > 0:
				t.Errorf("events %q, want none", got)
			case tc.event != "" && (len(got) == 0 || !strings.HasPrefix(got[0], tc.event)):
				t.Errorf("events %q, want one starting %q", got, tc.event)
			}
		})
	}
}

// afterQueue records what is queued for later.
type afterQueue struct {
	workqueue.TypedRateLimitingInterface[string]
	after map[string]time.Duration
}

func (q *afterQueue) AddAfter(key string, d time.Duration) { q.after[key] = d }

// TestSyncGangWaitGrace: a gang whose pods are not all there yet is told
// so only once its pods have waited waitGrace; before, it is looked at
// again when they will have.
func TestSyncGangWaitGrace(t *testing.T) {
	for _, tc := range []struct {
		name  string
		age   time.Duration
		event string // "" for none
	}{
		{"just created", 0, ""},
		{"waited a while", waitGrace + 2*time.Second, "Normal Waiting waiting for the gang's pods: 2 of 3 exist"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pods := []*corev1.Pod{gangMember(0, 3, "u0", "", ""), gangMember(1, 3, "u1", "", "")}
			for _, p := range pods {
				p.CreationTimestamp = metav1.NewTime(time.Now().Add(-tc.age))
			}
			s, rec := gangService(t, pods)
			q := &afterQueue{after: map[string]time.Duration{}}
			s.queue = q
			g, err := GangOf(pods[0])
			if err != nil {
				t.Fatal(err)
			}
			if err := s.syncGang(t.Context(), g.Key()); err != nil {
				t.Fatal(err)
			}
			var got []string
			for len(rec.Events) > 0 {
				got = append(got, <-rec.Events)
			}
			if tc.event == "" {
				if len(got) > 0 {
					t.Errorf("events %q, want none", got)
				}
				if d, ok := q.after[gangKey(g.Key())]; !ok || d <= 0 || d > waitGrace {
					t.Errorf("the gang is looked at again after %v (queued: %v), want within %v", d, ok, waitGrace)
				}
				return
			}
			if len(got) != len(pods) || !strings.HasPrefix(got[0], tc.event) {
				t.Errorf("events %q, want %q on each pod", got, tc.event)
			}
			if len(q.after) > 0 {
				t.Errorf("looked at again later %v, want not", q.after)
			}
		})
	}
}
