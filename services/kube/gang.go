package kube

// Gangs from the workloads users already write. A gang is the pods that
// toposched places as one job (jobs.submitted); it is found from the labels
// that the workload's own controller puts on each pod, so that users keep
// their JobSets, LeaderWorkerSets, PodGroups and Kubeflow jobs and only
// name toposched as their pods' scheduler. Everything here is a pure
// function of a pod or of a workload object's content: no client calls.
//
// Which label wins where a pod carries several (most specific first):
//
//	trainer.kubeflow.org/trainjob-name       TrainJob (it runs as a JobSet of the same name)
//	jobset.sigs.k8s.io/jobset-name           JobSet
//	leaderworkerset.sigs.k8s.io/name         LeaderWorkerSet, one gang per group
//	training.kubeflow.org/job-name           PyTorchJob (training-operator v1)
//	scheduling.x-k8s.io/pod-group            PodGroup (scheduler-plugins coscheduling)
//	none of these                            Pod: a gang of one
//
// The workload labels win over the PodGroup label because Kubeflow's
// operators put a PodGroup label on the pods themselves when they are set
// up for coscheduling (with a PodGroup of the same pods), and only the
// workload's labels say each pod's index.

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation"
)

// Kinds of Gang.Kind.
const (
	KindPodGroup        = "PodGroup"
	KindJobSet          = "JobSet"
	KindLeaderWorkerSet = "LeaderWorkerSet"
	KindTrainJob        = "TrainJob"
	KindPyTorchJob      = "PyTorchJob"
	KindPod             = "Pod"
)

// ErrUnknownKind is SizeOf asked about a kind it does not read.
var ErrUnknownKind = errors.New("unknown kind")

// Labels and annotations the workload controllers put on their pods.
const (
	// LabelPodGroup names the pod's PodGroup (scheduler-plugins
	// coscheduling, apis/scheduling/v1alpha1: PodGroupLabel).
	LabelPodGroup = "scheduling.x-k8s.io/pod-group"

	// JobSet (sigs.k8s.io/jobset api/jobset/v1alpha2/jobset_types.go):
	// each is set as a label and as an annotation on the Jobs and pods.
	LabelJobSetName        = "jobset.sigs.k8s.io/jobset-name"
	LabelReplicatedJobName = "jobset.sigs.k8s.io/replicatedjob-name"
	// LabelJobIndex is the Job's index within its replicated job.
	LabelJobIndex = "jobset.sigs.k8s.io/job-index"
	// LabelJobGlobalIndex is the Job's index over the whole JobSet, 0 to
	// N-1, replicated jobs in their spec's order.
	LabelJobGlobalIndex = "jobset.sigs.k8s.io/job-global-index"
	// LabelGlobalReplicas is the number of Jobs of the whole JobSet.
	LabelGlobalReplicas = "jobset.sigs.k8s.io/global-replicas"

	// LabelJobCompletionIndex is an Indexed Job's pod's index (label since
	// Kubernetes 1.28, annotation before; both are read).
	LabelJobCompletionIndex = batchv1.JobCompletionIndexAnnotation

	// LeaderWorkerSet (sigs.k8s.io/lws api/leaderworkerset/v1).
	LabelLWSName        = "leaderworkerset.sigs.k8s.io/name"
	LabelLWSGroupIndex  = "leaderworkerset.sigs.k8s.io/group-index"
	LabelLWSWorkerIndex = "leaderworkerset.sigs.k8s.io/worker-index"
	// AnnotationLWSSize is the number of pods of one group, leader
	// included (spec.leaderWorkerTemplate.size).
	AnnotationLWSSize = "leaderworkerset.sigs.k8s.io/size"

	// LabelTrainJobName names a Kubeflow Trainer v2 TrainJob's pods.
	LabelTrainJobName = "trainer.kubeflow.org/trainjob-name"
	// LabelTrainJobAncestor marks the replicated jobs of a TrainJob's
	// JobSet by the step they run (kubeflow/trainer pkg/constants).
	LabelTrainJobAncestor = "trainer.kubeflow.org/trainjob-ancestor-step"

	// Kubeflow training-operator v1 (kubeflow/common
	// pkg/apis/common/v1/constants.go); replica types are lower case.
	LabelTrainingJobName      = "training.kubeflow.org/job-name"
	LabelTrainingReplicaType  = "training.kubeflow.org/replica-type"
	LabelTrainingReplicaIndex = "training.kubeflow.org/replica-index"
)

// The steps of a TrainJob that run before its trainer (the values of
// LabelTrainJobAncestor, and the names the runtimes give their replicated
// jobs). The trainer's Jobs depend on them (JobSet dependsOn): they are
// created only once these have finished, so these are never part of the
// trainer's gang.
const (
	trainJobDatasetInitializer = "dataset-initializer"
	trainJobModelInitializer   = "model-initializer"
	trainJobTrainerStep        = "trainer"
)

// MaxGangSize bounds the pods of one gang: toposched.io/gang-size and
// every size SizeOf reads. It is also a bound on the work a bad workload
// object costs.
const MaxGangSize = 1 << 16

// maxIndex bounds an index label (a Job's global index, a completion
// index, a group or worker index): far above any real workload, and low
// enough that arithmetic on it never overflows.
const maxIndex = 1<<31 - 1

// Gang identifies the pods that run as one job.
type Gang struct {
	Namespace string
	// Kind is one of the Kind constants.
	Kind string
	// Name is the workload's name; LeaderWorkerSet: one gang per group,
	// "<lws>-<group index>" (the group's leader pod's name).
	Name string
	// Size is the number of pods the gang waits for, 0 when only the
	// workload object says (then the service reads the object named by
	// Workload and calls SizeOf).
	Size int
}

// Key is unique and injective over (Namespace, Kind, Name): each part is
// path-escaped (so holds no '/') and the parts are joined by '/', as
// "team-a/JobSet/llama".
func (g Gang) Key() string {
	return url.PathEscape(g.Namespace) + "/" + url.PathEscape(g.Kind) + "/" + url.PathEscape(g.Name)
}

// jobIDPattern is the schema's jobId (schemas/v1/common.schema.json).
var jobIDPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$`)

// JobID is a job_id for the gang that the jobs.submitted schema accepts:
// "<namespace>.<kind>.<name>" (kind in lower case), which is injective for
// Kubernetes names (a namespace holds no '.', no name holds ':'). Where
// that is longer than 128 characters, or not a valid job id, it is its
// first 100 characters, ':' and a hash of the whole key, which no
// unhashed id contains.
func (g Gang) JobID() string {
	id := g.Namespace + "." + strings.ToLower(g.Kind) + "." + g.Name
	if !strings.Contains(id, ":") && jobIDPattern.MatchString(id) {
		return id
	}
	sum := sha256.Sum256([]byte(g.Key()))
	prefix := strings.Map(func(r rune) rune {
		switch {
		case r < utf8.RuneSelf && (r == '.' || r == '_' || r == '-' || '0' <= r && r <= '9' || 'a' <= r && r <= 'z' || 'A' <= r && r <= 'Z'):
			return r
		default:
			return '-'
		}
	}, id)
	if len(prefix) > 100 {
		prefix = prefix[:100]
	}
	if prefix == "" || !jobIDPattern.MatchString(prefix[:1]) {
		prefix = "g" + prefix
		prefix = prefix[:min(len(prefix), 100)]
	}
	return prefix + ":" + hex.EncodeToString(sum[:])[:27]
}

// The API resources of the workload objects.
var (
	podGroupResource        = schema.GroupVersionResource{Group: "scheduling.x-k8s.io", Version: "v1alpha1", Resource: "podgroups"}
	jobSetResource          = schema.GroupVersionResource{Group: "jobset.x-k8s.io", Version: "v1alpha2", Resource: "jobsets"}
	leaderWorkerSetResource = schema.GroupVersionResource{Group: "leaderworkerset.x-k8s.io", Version: "v1", Resource: "leaderworkersets"}
	pyTorchJobResource      = schema.GroupVersionResource{Group: "kubeflow.org", Version: "v1", Resource: "pytorchjobs"}
)

// Workload names the object whose spec gives the gang's size: its
// group/version/resource and name, ok false when the pods alone say it
// (Size > 0, or a lone pod).
//
// A TrainJob's is the JobSet that Kubeflow Trainer renders for it, named as
// the TrainJob: the TrainJob's own spec.trainer.numNodes may be absent
// (its runtime's mlPolicy.numNodes applies), while the JobSet holds the
// number of pods the trainer actually creates. A LeaderWorkerSet's is the
// LeaderWorkerSet (only where its pods lack their size annotation).
func (g Gang) Workload() (gvr schema.GroupVersionResource, name string, ok bool) {
	if g.Size > 0 {
		return schema.GroupVersionResource{}, "", false
	}
	switch g.Kind {
	case KindPodGroup:
		return podGroupResource, g.Name, true
	case KindJobSet, KindTrainJob:
		return jobSetResource, g.Name, true
	case KindPyTorchJob:
		return pyTorchJobResource, g.Name, true
	case KindLeaderWorkerSet:
		// Name is "<lws>-<group index>"; the index is digits, so the
		// last '-' ends the set's name.
		if i := strings.LastIndexByte(g.Name, '-'); i > 0 {
			return leaderWorkerSetResource, g.Name[:i], true
		}
	}
	return schema.GroupVersionResource{}, "", false
}

// FieldError names the pod field (or workload object field) at fault, such
// as metadata.annotations['toposched.io/parallelism'], with its value.
type FieldError struct {
	Field string
	Value string
	Err   error
}

// maxErrorValue bounds the value an error quotes: an annotation may be
// 256 KiB, and the error travels in a Kubernetes Event.
const maxErrorValue = 64

func (e *FieldError) Error() string {
	v := e.Value
	if len(v) > maxErrorValue {
		cut := maxErrorValue
		for cut > 0 && !utf8.RuneStart(v[cut]) {
			cut--
		}
		v = v[:cut] + "…"
	}
	return e.Field + ": " + strconv.Quote(v) + ": " + e.Err.Error()
}

func (e *FieldError) Unwrap() error { return e.Err }

// labelField and annotationField are the paths of a pod's label and
// annotation, as the downward API writes them.
func labelField(key string) string      { return "metadata.labels['" + key + "']" }
func annotationField(key string) string { return "metadata.annotations['" + key + "']" }

// workloadName reads the label that names the pod's workload: "" (absent)
// when the label is missing or empty, as coscheduling takes an empty
// pod-group label; an error when it is no valid label value (the API
// server refuses those; a pod built elsewhere may hold anything).
func workloadName(pod *corev1.Pod, key string) (string, error) {
	v := pod.Labels[key]
	if v == "" {
		return "", nil
	}
	if errs := validation.IsValidLabelValue(v); len(errs) > 0 {
		return "", &FieldError{Field: labelField(key), Value: v, Err: errors.New(strings.Join(errs, "; "))}
	}
	return v, nil
}

// GangOf says which gang the pod belongs to, from its workload's labels
// (see the table at the top of this file), its namespace, and its size
// where the pods say it: a LeaderWorkerSet's group size annotation, or
// toposched.io/gang-size, which overrides any other (a positive integer,
// at most MaxGangSize).
func GangOf(pod *corev1.Pod) (Gang, error) {
	if pod == nil {
		return Gang{}, errors.New("kube: GangOf(nil)")
	}
	if pod.Namespace == "" {
		return Gang{}, &FieldError{Field: "metadata.namespace", Value: "", Err: errors.New("a pod has a namespace (the job's tenant)")}
	}
	g := Gang{Namespace: pod.Namespace}
	var err error
	g.Kind, g.Name, g.Size, err = workloadOf(pod)
	if err != nil {
		return Gang{}, err
	}
	if v, ok := pod.Annotations[AnnotationGangSize]; ok {
		n, err := parseCount(v)
		if err != nil {
			return Gang{}, &FieldError{Field: annotationField(AnnotationGangSize), Value: v, Err: err}
		}
		if g.Kind == KindPod && n != 1 {
			return Gang{}, &FieldError{Field: annotationField(AnnotationGangSize), Value: v,
				Err: fmt.Errorf("a pod of no workload is a gang of one; group pods with the %s label", LabelPodGroup)}
		}
		g.Size = n
	}
	return g, nil
}

// workloadOf finds the pod's workload by its labels, in the order of the
// table at the top of this file.
func workloadOf(pod *corev1.Pod) (kind, name string, size int, err error) {
	if name, err = workloadName(pod, LabelTrainJobName); err != nil || name != "" {
		if err != nil {
			return "", "", 0, err
		}
		js, err := workloadName(pod, LabelJobSetName)
		if err != nil {
			return "", "", 0, err
		}
		if js != "" && js != name {
			return "", "", 0, &FieldError{Field: labelField(LabelJobSetName), Value: js,
				Err: fmt.Errorf("a TrainJob's JobSet is named as the TrainJob, %q", name)}
		}
		if isTrainJobInitializer(pod.Labels[LabelReplicatedJobName]) {
			// It runs, and must finish, before the trainer's pods exist.
			return lonePod(pod)
		}
		return KindTrainJob, name, 0, nil
	}
	if name, err = workloadName(pod, LabelJobSetName); err != nil || name != "" {
		return KindJobSet, name, 0, err
	}
	if name, err = workloadName(pod, LabelLWSName); err != nil || name != "" {
		if err != nil {
			return "", "", 0, err
		}
		group, ok, err := indexLabel(pod, LabelLWSGroupIndex)
		if err != nil {
			return "", "", 0, err
		}
		if !ok {
			return "", "", 0, &FieldError{Field: labelField(LabelLWSGroupIndex), Value: "",
				Err: errors.New("a LeaderWorkerSet's pod carries its group's index")}
		}
		if v, ok := pod.Annotations[AnnotationLWSSize]; ok {
			if size, err = parseCount(v); err != nil {
				return "", "", 0, &FieldError{Field: annotationField(AnnotationLWSSize), Value: v, Err: err}
			}
		}
		return KindLeaderWorkerSet, name + "-" + strconv.Itoa(group), size, nil
	}
	if name, err = workloadName(pod, LabelTrainingJobName); err != nil || name != "" {
		return KindPyTorchJob, name, 0, err
	}
	if name, err = workloadName(pod, LabelPodGroup); err != nil || name != "" {
		return KindPodGroup, name, 0, err
	}
	return lonePod(pod)
}

// lonePod is the gang of one pod, named as the pod.
func lonePod(pod *corev1.Pod) (kind, name string, size int, err error) {
	if pod.Name == "" {
		return "", "", 0, &FieldError{Field: "metadata.name", Value: "", Err: errors.New("a pod alone is a gang named as the pod")}
	}
	return KindPod, pod.Name, 1, nil
}

// isTrainJobInitializer reports whether a TrainJob's replicated job is one
// of the steps before its trainer.
func isTrainJobInitializer(replicatedJob string) bool {
	return replicatedJob == trainJobDatasetInitializer || replicatedJob == trainJobModelInitializer
}

// parseCount reads a positive count, at most MaxGangSize, written as
// Kubernetes writes numbers in labels and annotations: plain decimal
// digits, no sign, no leading zero.
func parseCount(s string) (int, error) {
	n, err := parseIndex(s)
	if err != nil {
		return 0, err
	}
	if n < 1 || n > MaxGangSize {
		return 0, fmt.Errorf("must be a whole number from 1 to %d", MaxGangSize)
	}
	return n, nil
}

// parseIndex reads a non-negative index, at most maxIndex, in canonical
// decimal: "01" is refused, since a group "01" and a group "1" would make
// two gangs of one.
func parseIndex(s string) (int, error) {
	if s == "" || len(s) > 10 {
		return 0, errors.New("must be a whole number in decimal")
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, errors.New("must be a whole number in decimal")
		}
	}
	if len(s) > 1 && s[0] == '0' {
		return 0, errors.New("must be a whole number in decimal without leading zeros")
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n > maxIndex {
		return 0, fmt.Errorf("must be at most %d", maxIndex)
	}
	return int(n), nil
}

// indexLabel reads an index label, ok false when it is absent.
func indexLabel(pod *corev1.Pod, key string) (int, bool, error) {
	v, ok := pod.Labels[key]
	if !ok {
		return 0, false, nil
	}
	n, err := parseIndex(v)
	if err != nil {
		return 0, false, &FieldError{Field: labelField(key), Value: v, Err: err}
	}
	return n, true, nil
}

// completionIndex reads an Indexed Job's pod's completion index: the
// label, else the annotation (Kubernetes before 1.28 set only that).
func completionIndex(pod *corev1.Pod) (int, bool, error) {
	if n, ok, err := indexLabel(pod, LabelJobCompletionIndex); ok || err != nil {
		return n, ok, err
	}
	v, ok := pod.Annotations[LabelJobCompletionIndex]
	if !ok {
		return 0, false, nil
	}
	n, err := parseIndex(v)
	if err != nil {
		return 0, false, &FieldError{Field: annotationField(LabelJobCompletionIndex), Value: v, Err: err}
	}
	return n, true, nil
}

// orderKey is a pod's place in its workload's own order: pods sort by
// major, then minor. Only a JobSet's pods have a major (the Job's global
// index); every other workload numbers its pods in minor alone.
type orderKey struct {
	major, minor int
	jobSet       bool
}

// podKey reads the pod's order key, ok false when the pod has none.
// dense is the pod's place in its gang where the key alone says it.
func podKey(pod *corev1.Pod) (key orderKey, dense int, ok, denseOK bool, err error) {
	kind, _, _, err := workloadOf(pod)
	if err != nil {
		return orderKey{}, 0, false, false, err
	}
	switch kind {
	case KindJobSet, KindTrainJob:
		g, gok, err := indexLabel(pod, LabelJobGlobalIndex)
		if err != nil || !gok {
			return orderKey{}, 0, false, false, err
		}
		c, cok, err := completionIndex(pod)
		if err != nil {
			return orderKey{}, 0, false, false, err
		}
		key = orderKey{major: g, minor: c, jobSet: true}
		switch {
		case pod.Labels[LabelGlobalReplicas] == "1":
			// One Job: the completion index is the place (JobSet's
			// PyTorch example passes it to torchrun as the node rank).
			return key, c, true, true, nil
		case !cok:
			// A Job that is not Indexed has one pod here (else two pods
			// share the key and OrderPods says so): the Job's index is
			// the place (JobSet's docs pass it as the node rank).
			return key, g, true, true, nil
		default:
			// Several Jobs of several pods: the place depends on the
			// sizes of the Jobs before this one, which only the JobSet's
			// spec says. The key still orders the gang.
			return key, 0, true, false, nil
		}
	case KindLeaderWorkerSet:
		w, ok, err := indexLabel(pod, LabelLWSWorkerIndex)
		return orderKey{minor: w}, w, ok, ok, err
	case KindPyTorchJob:
		t := pod.Labels[LabelTrainingReplicaType]
		i, ok, err := indexLabel(pod, LabelTrainingReplicaIndex)
		if err != nil || !ok {
			return orderKey{}, 0, false, false, err
		}
		switch {
		case strings.EqualFold(t, "master"):
			if i != 0 {
				return orderKey{}, 0, false, false, &FieldError{Field: labelField(LabelTrainingReplicaIndex), Value: strconv.Itoa(i),
					Err: errors.New("a PyTorchJob has one Master, index 0")}
			}
			return orderKey{}, 0, true, true, nil
		case strings.EqualFold(t, "worker"):
			// The training operator's RANK: the Master is 0, worker i is
			// i+1 (pkg/controller.v1/pytorch/envvar.go).
			return orderKey{minor: i + 1}, i + 1, true, true, nil
		default:
			return orderKey{}, 0, false, false, &FieldError{Field: labelField(LabelTrainingReplicaType), Value: t,
				Err: errors.New("a PyTorchJob's replica type is master or worker")}
		}
	case KindPod:
		// A gang of one, whatever index it has in a Job.
		return orderKey{}, 0, true, true, nil
	default: // PodGroup
		if v, ok := pod.Annotations[AnnotationRank]; ok {
			r, err := parseIndex(v)
			if err != nil {
				return orderKey{}, 0, false, false, &FieldError{Field: annotationField(AnnotationRank), Value: v, Err: err}
			}
			return orderKey{minor: r}, r, true, true, nil
		}
		c, ok, err := completionIndex(pod)
		return orderKey{minor: c}, c, ok, ok, err
	}
}

// PodIndex is the pod's place in its gang from the workload's index labels
// or annotations, ok false when none says it:
//
//   - JobSet, TrainJob: the Job's completion index when the JobSet has one
//     Job (jobset.sigs.k8s.io/global-replicas 1), the Job's global index
//     when the Job is not Indexed. A JobSet of several Indexed Jobs gives
//     none: the place depends on the sizes of the Jobs before the pod's,
//     which only the JobSet's spec says (OrderPods still orders such pods,
//     by the Job's global index, then the completion index).
//   - LeaderWorkerSet: the worker index (the leader's is 0).
//   - PyTorchJob: the Master 0, worker i i+1, as the training operator
//     numbers RANK. (A job of workers alone, elastic, starts at 1.)
//   - PodGroup: toposched.io/rank, else an Indexed Job's completion
//     index. The service writes toposched.io/rank at binding:
//     the pod's first rank, which a pod of k GPUs holds k apart from the
//     next; it orders the pods as their places do.
//   - a lone Pod: 0, the place in its gang of one.
//
// Ranks are positions in OrderPods' order, not these values.
func PodIndex(pod *corev1.Pod) (int, bool, error) {
	if pod == nil {
		return 0, false, errors.New("kube: PodIndex(nil)")
	}
	_, dense, _, ok, err := podKey(pod)
	if err != nil || !ok {
		return 0, false, err
	}
	return dense, true, nil
}

// OrderPods sorts a complete gang's pods into rank order: by the index
// their workload gives them (PodIndex; a JobSet's pods by the Job's global
// index, then the completion index, JobSet's own numbering), and pods
// without one after, by name. Two pods with one index is an error naming
// both. It returns a new slice.
func OrderPods(pods []*corev1.Pod) ([]*corev1.Pod, error) {
	type entry struct {
		pod *corev1.Pod
		key orderKey
		ok  bool
	}
	entries := make([]entry, len(pods))
	for i, pod := range pods {
		if pod == nil {
			return nil, fmt.Errorf("kube: OrderPods: pods[%d] is nil", i)
		}
		key, _, ok, _, err := podKey(pod)
		if err != nil {
			return nil, fmt.Errorf("pod %s/%s: %w", pod.Namespace, pod.Name, err)
		}
		entries[i] = entry{pod: pod, key: key, ok: ok}
	}
	slices.SortStableFunc(entries, func(a, b entry) int {
		switch {
		case a.ok != b.ok:
			if a.ok {
				return -1
			}
			return 1
		case a.ok:
			if c := cmp.Compare(a.key.major, b.key.major); c != 0 {
				return c
			}
			return cmp.Compare(a.key.minor, b.key.minor)
		default:
			return cmp.Or(cmp.Compare(a.pod.Namespace, b.pod.Namespace), cmp.Compare(a.pod.Name, b.pod.Name))
		}
	})
	out := make([]*corev1.Pod, len(entries))
	for i, e := range entries {
		if i > 0 && e.ok && entries[i-1].ok && e.key == entries[i-1].key {
			prev := entries[i-1].pod
			return nil, fmt.Errorf("pods %s/%s and %s/%s have one index (%s)", prev.Namespace, prev.Name, e.pod.Namespace, e.pod.Name, e.key)
		}
		out[i] = e.pod
	}
	return out, nil
}

func (k orderKey) String() string {
	if k.jobSet {
		return fmt.Sprintf("job-global-index %d, completion index %d", k.major, k.minor)
	}
	return strconv.Itoa(k.minor)
}

// maxReplicatedJobs bounds the entries SizeOf reads from one list or map
// of a workload object (JobSet caps replicatedJobs far lower).
const maxReplicatedJobs = 1024

// SizeOf reads the gang size from the workload object's content
// (unstructured.Unstructured.Object) of the gang's kind:
//
//   - PodGroup: spec.minMember.
//   - JobSet: over spec.replicatedJobs, replicas (default 1) × the pods
//     one Job runs at once, template.spec.parallelism (default 1), or
//     completions where fewer.
//   - TrainJob: the same over the JobSet that Kubeflow Trainer renders
//     for it, less the initializer steps (they run, and finish, before
//     the trainer's Jobs are created); or, given the TrainJob itself,
//     spec.trainer.numNodes.
//   - PyTorchJob: the sum of spec.pytorchReplicaSpecs.*.replicas (default
//     1), the training operator's WORLD_SIZE in pods.
//   - LeaderWorkerSet: one group, spec.leaderWorkerTemplate.size (default
//     1).
//   - Pod: 1.
//
// A workload that creates some of a gang's pods only once others run
// cannot be a gang, and is refused naming the field: a JobSet's dependsOn
// between its replicated jobs or startupPolicy InOrder, a
// LeaderWorkerSet's startupPolicy LeaderReady. Every size is at most
// MaxGangSize.
func SizeOf(kind string, obj map[string]any) (int, error) {
	if obj == nil {
		return 0, fmt.Errorf("kube: SizeOf(%s, nil)", kind)
	}
	got, _ := obj["kind"].(string)
	if got != "" && got != kind && (kind != KindTrainJob || got != KindJobSet) {
		return 0, &FieldError{Field: "kind", Value: got, Err: fmt.Errorf("want the %s", kind)}
	}
	switch kind {
	case KindPodGroup:
		n, ok, err := intAt(obj, "spec.minMember", "spec", "minMember")
		if err != nil {
			return 0, err
		}
		if !ok {
			return 0, &FieldError{Field: "spec.minMember", Err: errors.New("a PodGroup says how many pods it waits for")}
		}
		return gangSize("spec.minMember", n)
	case KindJobSet:
		return jobSetSize(obj, false)
	case KindTrainJob:
		if got == KindTrainJob {
			n, ok, err := intAt(obj, "spec.trainer.numNodes", "spec", "trainer", "numNodes")
			if err != nil {
				return 0, err
			}
			if !ok {
				return 0, &FieldError{Field: "spec.trainer.numNodes", Err: errors.New("absent: the runtime gives it; read the TrainJob's JobSet")}
			}
			return gangSize("spec.trainer.numNodes", n)
		}
		return jobSetSize(obj, true)
	case KindPyTorchJob:
		return pyTorchJobSize(obj)
	case KindLeaderWorkerSet:
		n, ok, err := intAt(obj, "spec.leaderWorkerTemplate.size", "spec", "leaderWorkerTemplate", "size")
		if err != nil {
			return 0, err
		}
		if !ok {
			n = 1
		}
		if p, _ := nested(obj, "spec", "startupPolicy").(string); p == "LeaderReady" && n > 1 {
			return 0, &FieldError{Field: "spec.startupPolicy", Value: p,
				Err: errors.New("the workers are created once the leader runs, so the group cannot be placed as one gang: use LeaderCreated")}
		}
		return gangSize("spec.leaderWorkerTemplate.size", n)
	case KindPod:
		return 1, nil
	default:
		return 0, fmt.Errorf("kube: SizeOf: %w %q", ErrUnknownKind, kind)
	}
}

// gangSize checks a size read from a workload object.
func gangSize(field string, n int64) (int, error) {
	if n < 1 || n > MaxGangSize {
		return 0, &FieldError{Field: field, Value: strconv.FormatInt(n, 10), Err: fmt.Errorf("a gang has 1 to %d pods", MaxGangSize)}
	}
	return int(n), nil
}

func jobSetSize(obj map[string]any, trainJob bool) (int, error) {
	list, ok := nested(obj, "spec", "replicatedJobs").([]any)
	if !ok || len(list) == 0 {
		return 0, &FieldError{Field: "spec.replicatedJobs", Err: errors.New("a JobSet has replicated jobs")}
	}
	if len(list) > maxReplicatedJobs {
		return 0, &FieldError{Field: "spec.replicatedJobs", Value: strconv.Itoa(len(list)), Err: fmt.Errorf("more than %d", maxReplicatedJobs)}
	}
	included := map[string]bool{}
	var total, withPods int64
	for i, item := range list {
		field := fmt.Sprintf("spec.replicatedJobs[%d]", i)
		rj, ok := item.(map[string]any)
		if !ok {
			return 0, &FieldError{Field: field, Err: errors.New("must be an object")}
		}
		name, _ := rj["name"].(string)
		if trainJob {
			step, _ := nested(rj, "template", "metadata", "labels", LabelTrainJobAncestor).(string)
			if isTrainJobInitializer(step) || step == "" && isTrainJobInitializer(name) {
				continue
			}
		}
		replicas, ok, err := intAt(rj, field+".replicas", "replicas")
		if err != nil {
			return 0, err
		}
		if !ok {
			replicas = 1 // +kubebuilder:default=1
		}
		parallelism, ok, err := intAt(rj, field+".template.spec.parallelism", "template", "spec", "parallelism")
		if err != nil {
			return 0, err
		}
		if !ok {
			parallelism = 1 // batch/v1 Job's default
		}
		// A Job runs min(parallelism, completions) pods at once.
		completions, ok, err := intAt(rj, field+".template.spec.completions", "template", "spec", "completions")
		if err != nil {
			return 0, err
		}
		if ok && completions < parallelism {
			parallelism = completions
		}
		for _, f := range []struct {
			name string
			n    int64
		}{{".replicas", replicas}, {".template.spec.parallelism", parallelism}} {
			if f.n < 0 || f.n > maxIndex {
				return 0, &FieldError{Field: field + f.name, Value: strconv.FormatInt(f.n, 10), Err: errors.New("out of range")}
			}
		}
		included[name] = true
		if replicas > 0 && parallelism > 0 {
			withPods++
			if replicas > MaxGangSize || parallelism > MaxGangSize || total+replicas*parallelism > MaxGangSize {
				return 0, &FieldError{Field: field, Value: name, Err: fmt.Errorf("the gang would have more than %d pods", MaxGangSize)}
			}
			total += replicas * parallelism
		}
	}
	for i, item := range list {
		rj := item.(map[string]any)
		if name, _ := rj["name"].(string); !included[name] {
			continue
		}
		deps, _ := rj["dependsOn"].([]any)
		for j, d := range deps {
			dep, _ := d.(map[string]any)
			if on, _ := dep["name"].(string); included[on] {
				return 0, &FieldError{Field: fmt.Sprintf("spec.replicatedJobs[%d].dependsOn[%d].name", i, j), Value: on,
					Err: errors.New("its pods are created once the other's run, so the two cannot be placed as one gang")}
			}
		}
	}
	if order, _ := nested(obj, "spec", "startupPolicy", "startupPolicyOrder").(string); order == "InOrder" && withPods > 1 {
		return 0, &FieldError{Field: "spec.startupPolicy.startupPolicyOrder", Value: order,
			Err: errors.New("each replicated job starts once the one before runs, so they cannot be placed as one gang: use AnyOrder")}
	}
	if total == 0 {
		return 0, &FieldError{Field: "spec.replicatedJobs", Err: errors.New("no pods to place")}
	}
	return int(total), nil
}

func pyTorchJobSize(obj map[string]any) (int, error) {
	specs, ok := nested(obj, "spec", "pytorchReplicaSpecs").(map[string]any)
	if !ok || len(specs) == 0 {
		return 0, &FieldError{Field: "spec.pytorchReplicaSpecs", Err: errors.New("a PyTorchJob has replica specs")}
	}
	if len(specs) > maxReplicatedJobs {
		return 0, &FieldError{Field: "spec.pytorchReplicaSpecs", Value: strconv.Itoa(len(specs)), Err: fmt.Errorf("more than %d", maxReplicatedJobs)}
	}
	var total int64
	for _, t := range slices.Sorted(maps.Keys(specs)) {
		field := "spec.pytorchReplicaSpecs." + t + ".replicas"
		spec, ok := specs[t].(map[string]any)
		if !ok {
			return 0, &FieldError{Field: "spec.pytorchReplicaSpecs." + t, Err: errors.New("must be an object")}
		}
		n, ok, err := intAt(spec, field, "replicas")
		if err != nil {
			return 0, err
		}
		if !ok {
			n = 1 // the training operator's default
		}
		if n < 0 || n > MaxGangSize || total+n > MaxGangSize {
			return 0, &FieldError{Field: field, Value: strconv.FormatInt(n, 10), Err: fmt.Errorf("a gang has 1 to %d pods", MaxGangSize)}
		}
		total += n
	}
	return gangSize("spec.pytorchReplicaSpecs", total)
}

// nested is the value at a path of nested objects, nil where there is none.
func nested(obj map[string]any, path ...string) any {
	var v any = obj
	for _, p := range path {
		m, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = m[p]
	}
	return v
}

// intAt reads an integer at a path, ok false when it is absent (or null).
// It takes what decoders leave in unstructured content: int64 (the API
// machinery's JSON decoder), float64 of integral value (encoding/json),
// and int.
func intAt(obj map[string]any, field string, path ...string) (int64, bool, error) {
	switch v := nested(obj, path...).(type) {
	case nil:
		return 0, false, nil
	case int64:
		return v, true, nil
	case int:
		return int64(v), true, nil
	case int32:
		return int64(v), true, nil
	case float64:
		if v != float64(int64(v)) || v > 1<<53 || v < -(1<<53) {
			return 0, false, &FieldError{Field: field, Value: strconv.FormatFloat(v, 'g', -1, 64), Err: errors.New("must be a whole number")}
		}
		return int64(v), true, nil
	default:
		return 0, false, &FieldError{Field: field, Value: fmt.Sprint(v), Err: fmt.Errorf("must be a whole number, not %T", v)}
	}
}
