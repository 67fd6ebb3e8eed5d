package kube

import (
	"errors"
	"os"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/yaml"
)

// newPod is a pod of namespace team-a with the given labels and
// annotations.
func newPod(name string, labels, annotations map[string]string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: name, Labels: labels, Annotations: annotations}}
}

// wantField checks that err is a *FieldError naming field, whose text
// holds each of want.
func wantField(t *testing.T, err error, field string, want ...string) {
	t.Helper()
	var fe *FieldError
	if !errors.As(err, &fe) {
		t.Fatalf("error %v (%T), want a *FieldError naming %s", err, err, field)
	}
	if fe.Field != field {
		t.Fatalf("error names %s, want %s: %v", fe.Field, field, err)
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Fatalf("error %q does not say %q", err, w)
		}
	}
}

type gangCase struct {
	name        string
	pod         *corev1.Pod
	want        Gang
	field       string // the field the error names; "" for none
	errContains string
}

func gangCases() []gangCase {
	long := strings.Repeat("a", 64)
	return []gangCase{
		{name: "lone pod", pod: newPod("p", nil, nil), want: Gang{"team-a", KindPod, "p", 1}},
		{name: "lone pod, gang-size 1", pod: newPod("p", nil, map[string]string{AnnotationGangSize: "1"}), want: Gang{"team-a", KindPod, "p", 1}},
		{name: "lone pod, empty pod-group label", pod: newPod("p", map[string]string{LabelPodGroup: ""}, nil), want: Gang{"team-a", KindPod, "p", 1}},
		{name: "PodGroup", pod: newPod("p", map[string]string{LabelPodGroup: "pg"}, nil), want: Gang{"team-a", KindPodGroup, "pg", 0}},
		{name: "PodGroup, gang-size", pod: newPod("p", map[string]string{LabelPodGroup: "pg"}, map[string]string{AnnotationGangSize: "4"}), want: Gang{"team-a", KindPodGroup, "pg", 4}},
		{name: "PodGroup, gang-size max", pod: newPod("p", map[string]string{LabelPodGroup: "pg"}, map[string]string{AnnotationGangSize: "65536"}), want: Gang{"team-a", KindPodGroup, "pg", MaxGangSize}},
		{name: "JobSet", pod: newPod("js-w-0-0", map[string]string{LabelJobSetName: "js", LabelReplicatedJobName: "w", LabelJobGlobalIndex: "0"}, nil), want: Gang{"team-a", KindJobSet, "js", 0}},
		{name: "JobSet wins over PodGroup", pod: newPod("p", map[string]string{LabelJobSetName: "js", LabelPodGroup: "pg"}, nil), want: Gang{"team-a", KindJobSet, "js", 0}},
		{name: "TrainJob", pod: newPod("t-node-0-0", map[string]string{LabelTrainJobName: "t", LabelJobSetName: "t", LabelReplicatedJobName: "node"}, nil), want: Gang{"team-a", KindTrainJob, "t", 0}},
		{name: "TrainJob without JobSet labels", pod: newPod("t-node-0-0", map[string]string{LabelTrainJobName: "t"}, nil), want: Gang{"team-a", KindTrainJob, "t", 0}},
		{name: "TrainJob's dataset initializer runs alone", pod: newPod("t-dataset-initializer-0-0", map[string]string{LabelTrainJobName: "t", LabelJobSetName: "t", LabelReplicatedJobName: "dataset-initializer"}, nil), want: Gang{"team-a", KindPod, "t-dataset-initializer-0-0", 1}},
		{name: "TrainJob's model initializer runs alone", pod: newPod("t-model-initializer-0-0", map[string]string{LabelTrainJobName: "t", LabelReplicatedJobName: "model-initializer"}, nil), want: Gang{"team-a", KindPod, "t-model-initializer-0-0", 1}},
		{name: "LeaderWorkerSet", pod: newPod("lws-1-1", map[string]string{LabelLWSName: "lws", LabelLWSGroupIndex: "1", LabelLWSWorkerIndex: "1"}, map[string]string{AnnotationLWSSize: "2"}), want: Gang{"team-a", KindLeaderWorkerSet, "lws-1", 2}},
		{name: "LeaderWorkerSet, gang-size overrides", pod: newPod("lws-1", map[string]string{LabelLWSName: "lws", LabelLWSGroupIndex: "1"}, map[string]string{AnnotationLWSSize: "2", AnnotationGangSize: "3"}), want: Gang{"team-a", KindLeaderWorkerSet, "lws-1", 3}},
		{name: "LeaderWorkerSet without size", pod: newPod("lws-0", map[string]string{LabelLWSName: "lws", LabelLWSGroupIndex: "0"}, nil), want: Gang{"team-a", KindLeaderWorkerSet, "lws-0", 0}},
		{name: "PyTorchJob", pod: newPod("pt-worker-0", map[string]string{LabelTrainingJobName: "pt", LabelTrainingReplicaType: "worker", LabelTrainingReplicaIndex: "0"}, nil), want: Gang{"team-a", KindPyTorchJob, "pt", 0}},
		{name: "PyTorchJob wins over PodGroup", pod: newPod("pt-master-0", map[string]string{LabelTrainingJobName: "pt", LabelPodGroup: "pt"}, nil), want: Gang{"team-a", KindPyTorchJob, "pt", 0}},

		{name: "no namespace", pod: &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p"}}, field: "metadata.namespace"},
		{name: "lone pod without a name", pod: newPod("", nil, nil), field: "metadata.name"},
		{name: "TrainJob initializer without a name", pod: newPod("", map[string]string{LabelTrainJobName: "t", LabelReplicatedJobName: "model-initializer"}, nil), field: "metadata.name"},
		{name: "lone pod, gang-size 2", pod: newPod("p", nil, map[string]string{AnnotationGangSize: "2"}), field: annotationField(AnnotationGangSize), errContains: "gang of one"},
		{name: "gang-size 0", pod: newPod("p", map[string]string{LabelPodGroup: "pg"}, map[string]string{AnnotationGangSize: "0"}), field: annotationField(AnnotationGangSize), errContains: "1 to 65536"},
		{name: "gang-size too big", pod: newPod("p", map[string]string{LabelPodGroup: "pg"}, map[string]string{AnnotationGangSize: "65537"}), field: annotationField(AnnotationGangSize)},
		{name: "gang-size negative", pod: newPod("p", map[string]string{LabelPodGroup: "pg"}, map[string]string{AnnotationGangSize: "-1"}), field: annotationField(AnnotationGangSize), errContains: "whole number"},
		{name: "gang-size fraction", pod: newPod("p", map[string]string{LabelPodGroup: "pg"}, map[string]string{AnnotationGangSize: "1.5"}), field: annotationField(AnnotationGangSize)},
		{name: "gang-size leading zero", pod: newPod("p", map[string]string{LabelPodGroup: "pg"}, map[string]string{AnnotationGangSize: "04"}), field: annotationField(AnnotationGangSize), errContains: "leading zeros"},
		{name: "gang-size huge", pod: newPod("p", map[string]string{LabelPodGroup: "pg"}, map[string]string{AnnotationGangSize: "99999999999999999999"}), field: annotationField(AnnotationGangSize)},
		{name: "PodGroup name too long", pod: newPod("p", map[string]string{LabelPodGroup: long}, nil), field: labelField(LabelPodGroup), errContains: "63"},
		{name: "JobSet name not a label value", pod: newPod("p", map[string]string{LabelJobSetName: "a/b"}, nil), field: labelField(LabelJobSetName)},
		{name: "TrainJob name bad", pod: newPod("p", map[string]string{LabelTrainJobName: "-x"}, nil), field: labelField(LabelTrainJobName)},
		{name: "TrainJob's JobSet named otherwise", pod: newPod("p", map[string]string{LabelTrainJobName: "t", LabelJobSetName: "u"}, nil), field: labelField(LabelJobSetName), errContains: "named as the TrainJob"},
		{name: "LeaderWorkerSet without group index", pod: newPod("p", map[string]string{LabelLWSName: "lws"}, nil), field: labelField(LabelLWSGroupIndex), errContains: "group's index"},
		{name: "LeaderWorkerSet group index 01", pod: newPod("p", map[string]string{LabelLWSName: "lws", LabelLWSGroupIndex: "01"}, nil), field: labelField(LabelLWSGroupIndex)},
		{name: "LeaderWorkerSet group index not a number", pod: newPod("p", map[string]string{LabelLWSName: "lws", LabelLWSGroupIndex: "x"}, nil), field: labelField(LabelLWSGroupIndex)},
		{name: "LeaderWorkerSet group index too big", pod: newPod("p", map[string]string{LabelLWSName: "lws", LabelLWSGroupIndex: "2147483648"}, nil), field: labelField(LabelLWSGroupIndex), errContains: "at most"},
		{name: "LeaderWorkerSet size bad", pod: newPod("p", map[string]string{LabelLWSName: "lws", LabelLWSGroupIndex: "0"}, map[string]string{AnnotationLWSSize: "0"}), field: annotationField(AnnotationLWSSize)},
		{name: "PyTorchJob name bad", pod: newPod("p", map[string]string{LabelTrainingJobName: strings.Repeat("x", 70)}, nil), field: labelField(LabelTrainingJobName)},
	}
}

func TestGangOf(t *testing.T) {
	for _, tc := range gangCases() {
		t.Run(tc.name, func(t *testing.T) {
			got, err := GangOf(tc.pod)
			if tc.field != "" {
				wantField(t, err, tc.field, tc.errContains)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Fatalf("GangOf = %+v, want %+v", got, tc.want)
			}
		})
	}
	if _, err := GangOf(nil); err == nil {
		t.Fatal("GangOf(nil) took it")
	}
}

func TestFieldErrorTruncatesAndUnwraps(t *testing.T) {
	inner := errors.New("inner")
	e := &FieldError{Field: "f", Value: strings.Repeat("é", 100), Err: inner}
	if !errors.Is(e, inner) {
		t.Fatal("does not unwrap")
	}
	msg := e.Error()
	if !strings.HasPrefix(msg, `f: "`) || !strings.HasSuffix(msg, `…": inner`) || len(msg) > 100 {
		t.Fatalf("Error() = %q", msg)
	}
}

func TestKeyInjective(t *testing.T) {
	// Pairs a naive "ns/kind/name" join would confuse.
	gangs := []Gang{
		{"a", "JobSet", "b/c", 0}, {"a/JobSet", "b", "c", 0}, {"a", "JobSet/b", "c", 0},
		{"a", "Pod", "x", 0}, {"a", "PodGroup", "x", 0}, {"a%2F", "Pod", "x", 0}, {"a/", "Pod", "x", 0},
		{"", "", "", 0}, {"", "", "/", 0}, {"/", "", "", 0},
	}
	seen := map[string]Gang{}
	for _, g := range gangs {
		k := g.Key()
		if prev, ok := seen[k]; ok {
			t.Fatalf("%+v and %+v have one key %q", prev, g, k)
		}
		seen[k] = g
	}
	if k := (Gang{Namespace: "team-a", Kind: KindJobSet, Name: "llm"}).Key(); k != "team-a/JobSet/llm" {
		t.Fatalf("Key = %q", k)
	}
}

func TestJobID(t *testing.T) {
	long := strings.Repeat("n", 253)
	for _, tc := range []struct {
		g    Gang
		want string // "" for a hashed one
	}{
		{Gang{"team-a", KindJobSet, "llm", 0}, "team-a.jobset.llm"},
		{Gang{"team-a", KindLeaderWorkerSet, "lws-1", 2}, "team-a.leaderworkerset.lws-1"},
		{Gang{"team-a", KindPod, long, 1}, ""},
		{Gang{"team-a", KindPod, "a:b", 1}, ""},
		{Gang{"", KindPod, "p", 1}, ""},
		{Gang{"-x", KindPod, "p", 1}, ""},
	} {
		id := tc.g.JobID()
		if !jobIDPattern.MatchString(id) {
			t.Fatalf("%+v: JobID %q is not a valid job_id", tc.g, id)
		}
		if tc.want != "" && id != tc.want {
			t.Fatalf("%+v: JobID %q, want %q", tc.g, id, tc.want)
		}
		if tc.want == "" && !strings.Contains(id, ":") {
			t.Fatalf("%+v: JobID %q is not hashed", tc.g, id)
		}
	}
	a := Gang{"team-a", KindPod, long + "a", 1}.JobID()
	b := Gang{"team-a", KindPod, long + "b", 1}.JobID()
	if a == b {
		t.Fatalf("two long names have one JobID %q", a)
	}
}

func TestWorkload(t *testing.T) {
	for _, tc := range []struct {
		g    Gang
		gvr  schema.GroupVersionResource
		name string
		ok   bool
	}{
		{Gang{"n", KindPodGroup, "pg", 0}, podGroupResource, "pg", true},
		{Gang{"n", KindPodGroup, "pg", 4}, schema.GroupVersionResource{}, "", false},
		{Gang{"n", KindJobSet, "js", 0}, schema.GroupVersionResource{Group: "jobset.x-k8s.io", Version: "v1alpha2", Resource: "jobsets"}, "js", true},
		{Gang{"n", KindTrainJob, "t", 0}, jobSetResource, "t", true},
		{Gang{"n", KindPyTorchJob, "pt", 0}, schema.GroupVersionResource{Group: "kubeflow.org", Version: "v1", Resource: "pytorchjobs"}, "pt", true},
		{Gang{"n", KindLeaderWorkerSet, "my-lws-12", 0}, schema.GroupVersionResource{Group: "leaderworkerset.x-k8s.io", Version: "v1", Resource: "leaderworkersets"}, "my-lws", true},
		{Gang{"n", KindLeaderWorkerSet, "my-lws-12", 2}, schema.GroupVersionResource{}, "", false},
		{Gang{"n", KindPod, "p", 1}, schema.GroupVersionResource{}, "", false},
		{Gang{"n", KindPod, "p", 0}, schema.GroupVersionResource{}, "", false},
	} {
		gvr, name, ok := tc.g.Workload()
		if gvr != tc.gvr || name != tc.name || ok != tc.ok {
			t.Fatalf("%+v: Workload = %v %q %v, want %v %q %v", tc.g, gvr, name, ok, tc.gvr, tc.name, tc.ok)
		}
	}
}

func TestPodIndex(t *testing.T) {
	js := func(extra map[string]string) map[string]string {
		l := map[string]string{LabelJobSetName: "js", LabelReplicatedJobName: "w"}
		for k, v := range extra {
			l[k] = v
		}
		return l
	}
	pt := func(typ, index string) map[string]string {
		return map[string]string{LabelTrainingJobName: "pt", LabelTrainingReplicaType: typ, LabelTrainingReplicaIndex: index}
	}
	for _, tc := range []struct {
		name  string
		pod   *corev1.Pod
		want  int
		ok    bool
		field string
	}{
		{name: "JobSet of one Job", pod: newPod("p", js(map[string]string{LabelGlobalReplicas: "1", LabelJobGlobalIndex: "0", LabelJobCompletionIndex: "1"}), nil), want: 1, ok: true},
		{name: "JobSet of one Job, index annotation only", pod: newPod("p", js(map[string]string{LabelGlobalReplicas: "1", LabelJobGlobalIndex: "0"}), map[string]string{LabelJobCompletionIndex: "3"}), want: 3, ok: true},
		{name: "JobSet, Jobs not Indexed", pod: newPod("p", js(map[string]string{LabelGlobalReplicas: "4", LabelJobGlobalIndex: "3"}), nil), want: 3, ok: true},
		{name: "JobSet of several Indexed Jobs", pod: newPod("p", js(map[string]string{LabelGlobalReplicas: "2", LabelJobGlobalIndex: "1", LabelJobCompletionIndex: "0"}), nil)},
		{name: "JobSet without a global index", pod: newPod("p", js(map[string]string{LabelJobCompletionIndex: "0"}), nil)},
		{name: "JobSet, toposched.io/rank is not the place", pod: newPod("p", js(nil), map[string]string{AnnotationRank: "8"})},
		{name: "JobSet, bad completion index", pod: newPod("p", js(map[string]string{LabelJobGlobalIndex: "0", LabelJobCompletionIndex: "x"}), nil), field: labelField(LabelJobCompletionIndex)},
		{name: "JobSet, bad completion index annotation", pod: newPod("p", js(map[string]string{LabelJobGlobalIndex: "0"}), map[string]string{LabelJobCompletionIndex: "-1"}), field: annotationField(LabelJobCompletionIndex)},
		{name: "JobSet, bad global index", pod: newPod("p", js(map[string]string{LabelJobGlobalIndex: "1e3"}), nil), field: labelField(LabelJobGlobalIndex)},
		{name: "TrainJob", pod: newPod("p", map[string]string{LabelTrainJobName: "t", LabelJobSetName: "t", LabelGlobalReplicas: "1", LabelJobGlobalIndex: "0", LabelJobCompletionIndex: "2"}, nil), want: 2, ok: true},
		{name: "LeaderWorkerSet leader", pod: newPod("p", map[string]string{LabelLWSName: "l", LabelLWSGroupIndex: "1", LabelLWSWorkerIndex: "0"}, nil), want: 0, ok: true},
		{name: "LeaderWorkerSet worker", pod: newPod("p", map[string]string{LabelLWSName: "l", LabelLWSGroupIndex: "1", LabelLWSWorkerIndex: "3"}, nil), want: 3, ok: true},
		{name: "LeaderWorkerSet without worker index", pod: newPod("p", map[string]string{LabelLWSName: "l", LabelLWSGroupIndex: "1"}, nil)},
		{name: "LeaderWorkerSet bad worker index", pod: newPod("p", map[string]string{LabelLWSName: "l", LabelLWSGroupIndex: "1", LabelLWSWorkerIndex: "+1"}, nil), field: labelField(LabelLWSWorkerIndex)},
		{name: "PyTorchJob master", pod: newPod("p", pt("master", "0"), nil), want: 0, ok: true},
		{name: "PyTorchJob worker", pod: newPod("p", pt("worker", "2"), nil), want: 3, ok: true},
		{name: "PyTorchJob Worker (any case)", pod: newPod("p", pt("Worker", "0"), nil), want: 1, ok: true},
		{name: "PyTorchJob without index", pod: newPod("p", map[string]string{LabelTrainingJobName: "pt", LabelTrainingReplicaType: "worker"}, nil)},
		{name: "PyTorchJob second master", pod: newPod("p", pt("master", "1"), nil), field: labelField(LabelTrainingReplicaIndex)},
		{name: "PyTorchJob unknown type", pod: newPod("p", pt("ps", "0"), nil), field: labelField(LabelTrainingReplicaType)},
		{name: "PodGroup with rank", pod: newPod("p", map[string]string{LabelPodGroup: "pg"}, map[string]string{AnnotationRank: "5"}), want: 5, ok: true},
		{name: "PodGroup of an Indexed Job", pod: newPod("p", map[string]string{LabelPodGroup: "pg", LabelJobCompletionIndex: "6"}, nil), want: 6, ok: true},
		{name: "PodGroup, rank wins over completion index", pod: newPod("p", map[string]string{LabelPodGroup: "pg", LabelJobCompletionIndex: "6"}, map[string]string{AnnotationRank: "12"}), want: 12, ok: true},
		{name: "PodGroup without index", pod: newPod("p", map[string]string{LabelPodGroup: "pg"}, nil)},
		{name: "PodGroup, bad rank", pod: newPod("p", map[string]string{LabelPodGroup: "pg"}, map[string]string{AnnotationRank: "one"}), field: annotationField(AnnotationRank)},
		{name: "lone pod", pod: newPod("p", nil, nil), want: 0, ok: true},
		{name: "lone pod of an Indexed Job", pod: newPod("p", map[string]string{LabelJobCompletionIndex: "3"}, nil), want: 0, ok: true},
		{name: "bad workload label", pod: newPod("p", map[string]string{LabelPodGroup: "-"}, nil), field: labelField(LabelPodGroup)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok, err := PodIndex(tc.pod)
			if tc.field != "" {
				wantField(t, err, tc.field)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want || ok != tc.ok {
				t.Fatalf("PodIndex = %d %v, want %d %v", got, ok, tc.want, tc.ok)
			}
		})
	}
	if _, _, err := PodIndex(nil); err == nil {
		t.Fatal("PodIndex(nil) took it")
	}
}

// jobSetPod is the pod JobSet's controller makes for completion index c of
// global Job g (job index j of replicated job rj) in a JobSet of jobs Jobs.
func jobSetPod(rj string, j, g, c, jobs int) *corev1.Pod {
	name := "js-" + rj + "-" + itoa(j) + "-" + itoa(c)
	return newPod(name, map[string]string{
		LabelJobSetName: "js", LabelReplicatedJobName: rj, LabelJobIndex: itoa(j),
		LabelJobGlobalIndex: itoa(g), LabelGlobalReplicas: itoa(jobs), LabelJobCompletionIndex: itoa(c),
	}, nil)
}

func itoa(i int) string { return strconv.Itoa(i) }

func names(pods []*corev1.Pod) []string {
	out := make([]string, len(pods))
	for i, p := range pods {
		out[i] = p.Name
	}
	return out
}

func TestOrderPods(t *testing.T) {
	ranked := func(name, rank string) *corev1.Pod {
		return newPod(name, map[string]string{LabelPodGroup: "pg"}, map[string]string{AnnotationRank: rank})
	}
	unranked := func(name string) *corev1.Pod { return newPod(name, map[string]string{LabelPodGroup: "pg"}, nil) }
	pt := func(typ, index string) *corev1.Pod {
		return newPod("pt-"+typ+"-"+index, map[string]string{LabelTrainingJobName: "pt", LabelTrainingReplicaType: typ, LabelTrainingReplicaIndex: index}, nil)
	}
	for _, tc := range []struct {
		name    string
		pods    []*corev1.Pod
		want    []string
		errHave []string
	}{
		{name: "empty", pods: nil, want: []string{}},
		{
			// A driver Job of one pod, then two Jobs of two pods: the
			// place depends on the Jobs before, which the keys give.
			name: "JobSet of Jobs of different sizes",
			pods: []*corev1.Pod{
				jobSetPod("workers", 1, 2, 1, 3), jobSetPod("workers", 0, 1, 0, 3), jobSetPod("driver", 0, 0, 0, 3),
				jobSetPod("workers", 1, 2, 0, 3), jobSetPod("workers", 0, 1, 1, 3),
			},
			want: []string{"js-driver-0-0", "js-workers-0-0", "js-workers-0-1", "js-workers-1-0", "js-workers-1-1"},
		},
		{
			name: "JobSet of twelve Jobs sorts by number, not text",
			pods: []*corev1.Pod{jobSetPod("w", 10, 10, 0, 12), jobSetPod("w", 2, 2, 0, 12), jobSetPod("w", 11, 11, 0, 12), jobSetPod("w", 1, 1, 0, 12)},
			want: []string{"js-w-1-0", "js-w-2-0", "js-w-10-0", "js-w-11-0"},
		},
		{
			name: "PyTorchJob",
			pods: []*corev1.Pod{pt("worker", "2"), pt("worker", "0"), pt("master", "0"), pt("worker", "1")},
			want: []string{"pt-master-0", "pt-worker-0", "pt-worker-1", "pt-worker-2"},
		},
		{
			name: "PodGroup: ranked first, the rest by name",
			pods: []*corev1.Pod{unranked("d"), ranked("z", "16"), unranked("b"), ranked("a", "8"), ranked("m", "0")},
			want: []string{"m", "a", "z", "b", "d"},
		},
		{
			name:    "one index twice",
			pods:    []*corev1.Pod{ranked("a", "1"), ranked("b", "0"), ranked("c", "1")},
			errHave: []string{"team-a/a", "team-a/c", "one index (1)"},
		},
		{
			name:    "one JobSet index twice",
			pods:    []*corev1.Pod{jobSetPod("w", 0, 0, 0, 2), jobSetPod("v", 0, 0, 0, 2)},
			errHave: []string{"js-w-0-0", "js-v-0-0", "job-global-index 0, completion index 0"},
		},
		{
			name:    "a bad index names the pod",
			pods:    []*corev1.Pod{ranked("a", "0"), ranked("b", "x")},
			errHave: []string{"team-a/b", "toposched.io/rank"},
		},
		{name: "nil pod", pods: []*corev1.Pod{ranked("a", "0"), nil}, errHave: []string{"pods[1] is nil"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := append([]*corev1.Pod(nil), tc.pods...)
			got, err := OrderPods(tc.pods)
			if tc.errHave != nil {
				if err == nil {
					t.Fatalf("OrderPods = %v, want an error", names(got))
				}
				for _, w := range tc.errHave {
					if !strings.Contains(err.Error(), w) {
						t.Fatalf("error %q does not say %q", err, w)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if g := names(got); strings.Join(g, ",") != strings.Join(tc.want, ",") {
				t.Fatalf("OrderPods = %v, want %v", g, tc.want)
			}
			for i := range in {
				if in[i] != tc.pods[i] {
					t.Fatal("OrderPods changed its argument")
				}
			}
		})
	}
}

// obj reads a YAML object as the dynamic client gives it (integers as
// int64).
func obj(t testing.TB, y string) map[string]any {
	t.Helper()
	j, err := yaml.YAMLToJSON([]byte(y))
	if err != nil {
		t.Fatal(err)
	}
	u := &unstructured.Unstructured{}
	if err := u.UnmarshalJSON(j); err != nil {
		t.Fatal(err)
	}
	return u.Object
}

type sizeCase struct {
	name  string
	kind  string
	obj   string
	want  int
	field string
}

func sizeCases() []sizeCase {
	const head = "apiVersion: v1\n"
	return []sizeCase{
		{name: "PodGroup", kind: KindPodGroup, obj: head + "kind: PodGroup\nspec: {minMember: 4}", want: 4},
		{name: "PodGroup without minMember", kind: KindPodGroup, obj: head + "kind: PodGroup\nspec: {}", field: "spec.minMember"},
		{name: "PodGroup minMember 0", kind: KindPodGroup, obj: head + "kind: PodGroup\nspec: {minMember: 0}", field: "spec.minMember"},
		{name: "PodGroup minMember too big", kind: KindPodGroup, obj: head + "kind: PodGroup\nspec: {minMember: 65537}", field: "spec.minMember"},
		{name: "PodGroup minMember fraction", kind: KindPodGroup, obj: head + "kind: PodGroup\nspec: {minMember: 4.5}", field: "spec.minMember"},
		{name: "PodGroup minMember string", kind: KindPodGroup, obj: head + "kind: PodGroup\nspec: {minMember: \"4\"}", field: "spec.minMember"},
		{name: "wrong kind", kind: KindPodGroup, obj: head + "kind: JobSet\nspec: {minMember: 4}", field: "kind"},

		{name: "JobSet of one Job", kind: KindJobSet, obj: head + "kind: JobSet\nspec:\n  replicatedJobs:\n  - {name: w, replicas: 1, template: {spec: {parallelism: 2, completions: 2}}}", want: 2},
		{name: "JobSet defaults", kind: KindJobSet, obj: head + "kind: JobSet\nspec:\n  replicatedJobs:\n  - {name: w, template: {spec: {}}}", want: 1},
		{name: "JobSet, fewer completions", kind: KindJobSet, obj: head + "kind: JobSet\nspec:\n  replicatedJobs:\n  - {name: w, replicas: 2, template: {spec: {parallelism: 4, completions: 3}}}", want: 6},
		{name: "JobSet of a driver and workers", kind: KindJobSet, obj: head + "kind: JobSet\nspec:\n  replicatedJobs:\n  - {name: driver, template: {spec: {}}}\n  - {name: workers, replicas: 2, template: {spec: {parallelism: 4, completions: 4}}}", want: 9},
		{name: "JobSet, a replicated job of none", kind: KindJobSet, obj: head + "kind: JobSet\nspec:\n  replicatedJobs:\n  - {name: a, replicas: 0, template: {spec: {}}}\n  - {name: b, replicas: 3, template: {spec: {}}}", want: 3},
		{name: "JobSet InOrder of one", kind: KindJobSet, obj: head + "kind: JobSet\nspec:\n  startupPolicy: {startupPolicyOrder: InOrder}\n  replicatedJobs:\n  - {name: w, replicas: 2, template: {spec: {}}}", want: 2},
		{name: "JobSet as encoding/json leaves it", kind: KindJobSet, obj: "", want: 8},
		{name: "JobSet dependsOn", kind: KindJobSet, obj: head + "kind: JobSet\nspec:\n  replicatedJobs:\n  - {name: a, template: {spec: {}}}\n  - {name: b, dependsOn: [{name: a, status: Ready}], template: {spec: {}}}", field: "spec.replicatedJobs[1].dependsOn[0].name"},
		{name: "JobSet InOrder", kind: KindJobSet, obj: head + "kind: JobSet\nspec:\n  startupPolicy: {startupPolicyOrder: InOrder}\n  replicatedJobs:\n  - {name: a, template: {spec: {}}}\n  - {name: b, template: {spec: {}}}", field: "spec.startupPolicy.startupPolicyOrder"},
		{name: "JobSet without replicated jobs", kind: KindJobSet, obj: head + "kind: JobSet\nspec: {}", field: "spec.replicatedJobs"},
		{name: "JobSet of no pods", kind: KindJobSet, obj: head + "kind: JobSet\nspec:\n  replicatedJobs:\n  - {name: w, template: {spec: {parallelism: 0}}}", field: "spec.replicatedJobs"},
		{name: "JobSet replicas negative", kind: KindJobSet, obj: head + "kind: JobSet\nspec:\n  replicatedJobs:\n  - {name: w, replicas: -1, template: {spec: {}}}", field: "spec.replicatedJobs[0].replicas"},
		{name: "JobSet parallelism not a number", kind: KindJobSet, obj: head + "kind: JobSet\nspec:\n  replicatedJobs:\n  - {name: w, template: {spec: {parallelism: many}}}", field: "spec.replicatedJobs[0].template.spec.parallelism"},
		{name: "JobSet too big", kind: KindJobSet, obj: head + "kind: JobSet\nspec:\n  replicatedJobs:\n  - {name: w, replicas: 1000, template: {spec: {parallelism: 1000}}}", field: "spec.replicatedJobs[0]"},
		{name: "JobSet too big in sum", kind: KindJobSet, obj: head + "kind: JobSet\nspec:\n  replicatedJobs:\n  - {name: a, replicas: 65536, template: {spec: {}}}\n  - {name: b, template: {spec: {}}}", field: "spec.replicatedJobs[1]"},
		{name: "JobSet replicated job not an object", kind: KindJobSet, obj: head + "kind: JobSet\nspec:\n  replicatedJobs: [7]", field: "spec.replicatedJobs[0]"},

		{name: "TrainJob's JobSet", kind: KindTrainJob, obj: "file:testdata/trainjob-jobset.yaml", want: 4},
		{name: "TrainJob's JobSet of unlabelled steps", kind: KindTrainJob, obj: head + "kind: JobSet\nspec:\n  replicatedJobs:\n  - {name: model-initializer, template: {spec: {}}}\n  - {name: node, dependsOn: [{name: model-initializer, status: Complete}], template: {spec: {parallelism: 2}}}", want: 2},
		{name: "the same JobSet as a JobSet", kind: KindJobSet, obj: "file:testdata/trainjob-jobset.yaml", field: "spec.replicatedJobs[2].dependsOn[0].name"},
		{name: "TrainJob", kind: KindTrainJob, obj: head + "kind: TrainJob\nspec: {trainer: {numNodes: 3}}", want: 3},
		{name: "TrainJob without numNodes", kind: KindTrainJob, obj: head + "kind: TrainJob\nspec: {runtimeRef: {name: torch-distributed}}", field: "spec.trainer.numNodes"},

		{name: "PyTorchJob", kind: KindPyTorchJob, obj: head + "kind: PyTorchJob\nspec:\n  pytorchReplicaSpecs:\n    Master: {replicas: 1}\n    Worker: {replicas: 3}", want: 4},
		{name: "PyTorchJob default replicas", kind: KindPyTorchJob, obj: head + "kind: PyTorchJob\nspec:\n  pytorchReplicaSpecs:\n    Worker: {template: {}}", want: 1},
		{name: "PyTorchJob without specs", kind: KindPyTorchJob, obj: head + "kind: PyTorchJob\nspec: {}", field: "spec.pytorchReplicaSpecs"},
		{name: "PyTorchJob replicas bad", kind: KindPyTorchJob, obj: head + "kind: PyTorchJob\nspec:\n  pytorchReplicaSpecs:\n    Worker: {replicas: -2}", field: "spec.pytorchReplicaSpecs.Worker.replicas"},
		{name: "PyTorchJob of none", kind: KindPyTorchJob, obj: head + "kind: PyTorchJob\nspec:\n  pytorchReplicaSpecs:\n    Worker: {replicas: 0}", field: "spec.pytorchReplicaSpecs"},
		{name: "PyTorchJob too big", kind: KindPyTorchJob, obj: head + "kind: PyTorchJob\nspec:\n  pytorchReplicaSpecs:\n    Master: {replicas: 1}\n    Worker: {replicas: 65536}", field: "spec.pytorchReplicaSpecs.Worker.replicas"},

		{name: "LeaderWorkerSet", kind: KindLeaderWorkerSet, obj: head + "kind: LeaderWorkerSet\nspec: {replicas: 3, leaderWorkerTemplate: {size: 4}}", want: 4},
		{name: "LeaderWorkerSet default size", kind: KindLeaderWorkerSet, obj: head + "kind: LeaderWorkerSet\nspec: {leaderWorkerTemplate: {}}", want: 1},
		{name: "LeaderWorkerSet LeaderReady of one", kind: KindLeaderWorkerSet, obj: head + "kind: LeaderWorkerSet\nspec: {startupPolicy: LeaderReady, leaderWorkerTemplate: {size: 1}}", want: 1},
		{name: "LeaderWorkerSet LeaderReady", kind: KindLeaderWorkerSet, obj: head + "kind: LeaderWorkerSet\nspec: {startupPolicy: LeaderReady, leaderWorkerTemplate: {size: 2}}", field: "spec.startupPolicy"},
		{name: "LeaderWorkerSet size 0", kind: KindLeaderWorkerSet, obj: head + "kind: LeaderWorkerSet\nspec: {leaderWorkerTemplate: {size: 0}}", field: "spec.leaderWorkerTemplate.size"},

		{name: "Pod", kind: KindPod, obj: head + "kind: Pod\nspec: {}", want: 1},
	}
}

func TestSizeOf(t *testing.T) {
	for _, tc := range sizeCases() {
		t.Run(tc.name, func(t *testing.T) {
			var o map[string]any
			switch {
			case tc.obj == "":
				// encoding/json's numbers are float64.
				o = map[string]any{"kind": "JobSet", "spec": map[string]any{"replicatedJobs": []any{
					map[string]any{"name": "w", "replicas": float64(2), "template": map[string]any{"spec": map[string]any{"parallelism": float64(4)}}},
				}}}
			case strings.HasPrefix(tc.obj, "file:"):
				b, err := os.ReadFile(strings.TrimPrefix(tc.obj, "file:"))
				if err != nil {
					t.Fatal(err)
				}
				o = obj(t, string(b))
			default:
				o = obj(t, tc.obj)
			}
			got, err := SizeOf(tc.kind, o)
			if tc.field != "" {
				wantField(t, err, tc.field)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Fatalf("SizeOf = %d, want %d", got, tc.want)
			}
		})
	}
	if _, err := SizeOf(KindJobSet, nil); err == nil {
		t.Fatal("SizeOf(nil) took it")
	}
	if _, err := SizeOf("Deployment", map[string]any{}); !errors.Is(err, ErrUnknownKind) {
		t.Fatalf("SizeOf of an unknown kind: %v", err)
	}
}

// encodeMap writes a map as key\x00value\x00... for a fuzz input.
func encodeMap(m map[string]string) string {
	var b strings.Builder
	for k, v := range m {
		b.WriteString(k + "\x00" + v + "\x00")
	}
	return b.String()
}

// decodeMap is encodeMap's inverse, for any input.
func decodeMap(s string) map[string]string {
	if s == "" {
		return nil
	}
	m := map[string]string{}
	parts := strings.Split(s, "\x00")
	for i := 0; i+1 < len(parts); i += 2 {
		m[parts[i]] = parts[i+1]
	}
	return m
}

var kinds = map[string]bool{KindPodGroup: true, KindJobSet: true, KindLeaderWorkerSet: true, KindTrainJob: true, KindPyTorchJob: true, KindPod: true}

// FuzzGangOf: GangOf, PodIndex and OrderPods never panic on any pod; a
// gang they accept is well formed, and an error names a field.
func FuzzGangOf(f *testing.F) {
	for _, tc := range gangCases() {
		if tc.pod.Namespace != "" {
			f.Add(tc.pod.Namespace, tc.pod.Name, encodeMap(tc.pod.Labels), encodeMap(tc.pod.Annotations))
		}
	}
	f.Fuzz(func(t *testing.T, ns, name, labels, annotations string) {
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: decodeMap(labels), Annotations: decodeMap(annotations)}}
		g, err := GangOf(pod)
		if err != nil {
			var fe *FieldError
			if !errors.As(err, &fe) || fe.Field == "" {
				t.Fatalf("error %v names no field", err)
			}
		} else {
			if !kinds[g.Kind] || g.Namespace != ns || g.Size < 0 || g.Size > MaxGangSize {
				t.Fatalf("GangOf = %+v", g)
			}
			if _, _, ok := g.Workload(); ok && g.Size != 0 {
				t.Fatalf("%+v names a workload although its size is known", g)
			}
			if id := g.JobID(); !jobIDPattern.MatchString(id) {
				t.Fatalf("JobID %q", id)
			}
		}
		i, ok, err := PodIndex(pod)
		if err == nil && ok && (i < 0 || i > maxIndex+1) {
			t.Fatalf("PodIndex = %d", i)
		}
		if _, err := OrderPods([]*corev1.Pod{pod, pod}); err == nil && ok {
			t.Fatal("a pod with an index twice is ordered")
		}
	})
}

// FuzzSizeOf: SizeOf never panics on any JSON object, and what it returns
// is a gang's size.
func FuzzSizeOf(f *testing.F) {
	for _, tc := range sizeCases() {
		if tc.obj == "" || strings.HasPrefix(tc.obj, "file:") {
			continue
		}
		j, err := yaml.YAMLToJSON([]byte(tc.obj))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(tc.kind, string(j))
	}
	f.Fuzz(func(t *testing.T, kind, body string) {
		u := &unstructured.Unstructured{}
		if u.UnmarshalJSON([]byte(body)) != nil {
			return
		}
		n, err := SizeOf(kind, u.Object)
		if err == nil && (n < 1 || n > MaxGangSize) {
			t.Fatalf("SizeOf = %d", n)
		}
	})
}
