package kube

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/schemas"
)

var update = flag.Bool("update", false, "rewrite testdata/examples.golden")

const examplesDir = "../../deploy/examples/kubernetes"

// exampleFiles are the example manifests, one per workload kind; the test
// fails on one it does not know, so that a new example is tested too.
var exampleFiles = []string{"jobset-tp8-dp2.yaml", "leaderworkerset.yaml", "pod.yaml", "podgroup.yaml", "pytorchjob.yaml"}

// example is what one manifest file makes: its claim templates (GPUs per
// claim), its workload objects by kind and name, and the pods their
// controllers would create.
type example struct {
	gpusPerTemplate map[string]int
	workloads       map[string]map[string]any // "<Kind>/<name>" -> object
	pods            []*corev1.Pod
}

// strict decodes JSON or YAML into v, refusing a field v's type lacks.
func strict(t *testing.T, what string, data []byte, v any) {
	t.Helper()
	if err := yaml.UnmarshalStrict(data, v); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// templateAt decodes the pod template at a path of a workload object
// strictly into a PodTemplateSpec.
func templateAt(t *testing.T, what string, obj map[string]any, path ...string) corev1.PodTemplateSpec {
	t.Helper()
	v, ok, err := unstructured.NestedMap(obj, path...)
	if err != nil || !ok {
		t.Fatalf("%s: no pod template at %s", what, strings.Join(path, "."))
	}
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var tpl corev1.PodTemplateSpec
	strict(t, what+" "+strings.Join(path, "."), b, &tpl)
	return tpl
}

// podFrom is a pod made from a template, with the labels and annotations
// a workload controller adds.
func podFrom(tpl corev1.PodTemplateSpec, name string, labels, annotations map[string]string) *corev1.Pod {
	pod := &corev1.Pod{ObjectMeta: *tpl.ObjectMeta.DeepCopy(), Spec: *tpl.Spec.DeepCopy()}
	pod.Namespace, pod.Name = "team-a", name
	if pod.Labels == nil {
		pod.Labels = map[string]string{}
	}
	if pod.Annotations == nil {
		pod.Annotations = map[string]string{}
	}
	for k, v := range labels {
		pod.Labels[k] = v
	}
	for k, v := range annotations {
		pod.Annotations[k] = v
	}
	return pod
}

func num(t *testing.T, obj map[string]any, def int64, path ...string) int {
	t.Helper()
	n, ok, err := unstructured.NestedInt64(obj, path...)
	if err != nil {
		t.Fatalf("%s: %v", strings.Join(path, "."), err)
	}
	if !ok {
		n = def
	}
	return int(n)
}

var docSeparator = regexp.MustCompile(`(?m)^---\s*$`)

// loadExample reads a manifest and makes the pods of its workloads as
// their controllers would: JobSet's (jobset_types.go labels, an Indexed
// Job's completion index), LeaderWorkerSet's, the training operator's, the
// Job controller's.
func loadExample(t *testing.T, file string) example {
	data, err := os.ReadFile(filepath.Join(examplesDir, file))
	if err != nil {
		t.Fatal(err)
	}
	ex := example{gpusPerTemplate: map[string]int{}, workloads: map[string]map[string]any{}}
	for i, doc := range docSeparator.Split(string(data), -1) {
		if strings.TrimSpace(doc) == "" {
			continue
		}
		what := fmt.Sprintf("%s document %d", file, i)
		j, err := yaml.YAMLToJSON([]byte(doc))
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		u := &unstructured.Unstructured{}
		if err := u.UnmarshalJSON(j); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		obj, name := u.Object, u.GetName()
		switch u.GetKind() {
		case "ResourceClaimTemplate":
			var rct resourcev1.ResourceClaimTemplate
			strict(t, what, []byte(doc), &rct)
			gpus := 0
			for _, r := range rct.Spec.Spec.Devices.Requests {
				if r.Exactly == nil || r.Exactly.DeviceClassName != "gpu.nvidia.com" || r.Exactly.AllocationMode != resourcev1.DeviceAllocationModeExactCount || r.Exactly.Count < 1 {
					t.Fatalf("%s: request %s is not a count of gpu.nvidia.com devices", what, r.Name)
				}
				gpus += int(r.Exactly.Count)
			}
			ex.gpusPerTemplate[name] = gpus
		case "Pod":
			var pod corev1.Pod
			strict(t, what, []byte(doc), &pod)
			pod.Namespace = "team-a"
			ex.pods = append(ex.pods, &pod)
		case "Job":
			var job batchv1.Job
			strict(t, what, []byte(doc), &job)
			n := int(*job.Spec.Parallelism)
			for c := range n {
				ci := strconv.Itoa(c)
				ex.pods = append(ex.pods, podFrom(job.Spec.Template, name+"-"+ci+"-x7k2p",
					map[string]string{batchv1.JobNameLabel: name, batchv1.ControllerUidLabel: "uid", LabelJobCompletionIndex: ci},
					map[string]string{LabelJobCompletionIndex: ci}))
			}
		case KindJobSet:
			ex.workloads[KindJobSet+"/"+name] = obj
			rjs, _, _ := unstructured.NestedSlice(obj, "spec", "replicatedJobs")
			jobs := 0
			for _, r := range rjs {
				jobs += num(t, r.(map[string]any), 1, "replicas")
			}
			global := 0
			for _, r := range rjs {
				rj := r.(map[string]any)
				rjName := rj["name"].(string)
				tpl := templateAt(t, what, rj, "template", "spec", "template")
				replicas := num(t, rj, 1, "replicas")
				// A Job runs min(parallelism, completions) pods at once.
				perJob := num(t, rj, 1, "template", "spec", "parallelism")
				perJob = min(perJob, num(t, rj, int64(perJob), "template", "spec", "completions"))
				for j := range replicas {
					for c := range perJob {
						l := map[string]string{
							LabelJobSetName: name, LabelReplicatedJobName: rjName, LabelJobIndex: strconv.Itoa(j),
							LabelJobGlobalIndex: strconv.Itoa(global), LabelGlobalReplicas: strconv.Itoa(jobs),
							"jobset.sigs.k8s.io/replicatedjob-replicas": strconv.Itoa(replicas),
							LabelJobCompletionIndex:                     strconv.Itoa(c),
						}
						ex.pods = append(ex.pods, podFrom(tpl, fmt.Sprintf("%s-%s-%d-%d-q9z4m", name, rjName, j, c), l, l))
					}
					global++
				}
			}
		case KindLeaderWorkerSet:
			ex.workloads[KindLeaderWorkerSet+"/"+name] = obj
			worker := templateAt(t, what, obj, "spec", "leaderWorkerTemplate", "workerTemplate")
			leader := worker
			if _, ok, _ := unstructured.NestedMap(obj, "spec", "leaderWorkerTemplate", "leaderTemplate"); ok {
				leader = templateAt(t, what, obj, "spec", "leaderWorkerTemplate", "leaderTemplate")
			}
			size := num(t, obj, 1, "spec", "leaderWorkerTemplate", "size")
			for g := range num(t, obj, 1, "spec", "replicas") {
				for w := range size {
					l := map[string]string{LabelLWSName: name, LabelLWSGroupIndex: strconv.Itoa(g), LabelLWSWorkerIndex: strconv.Itoa(w)}
					a := map[string]string{AnnotationLWSSize: strconv.Itoa(size)}
					if w == 0 {
						ex.pods = append(ex.pods, podFrom(leader, fmt.Sprintf("%s-%d", name, g), l, a))
					} else {
						ex.pods = append(ex.pods, podFrom(worker, fmt.Sprintf("%s-%d-%d", name, g, w), l, a))
					}
				}
			}
		case KindPyTorchJob:
			ex.workloads[KindPyTorchJob+"/"+name] = obj
			specs, _, _ := unstructured.NestedMap(obj, "spec", "pytorchReplicaSpecs")
			for _, typ := range slices.Sorted(maps.Keys(specs)) {
				spec := specs[typ].(map[string]any)
				tpl := templateAt(t, what, spec, "template")
				rt := strings.ToLower(typ)
				for i := range num(t, spec, 1, "replicas") {
					l := map[string]string{LabelTrainingJobName: name, LabelTrainingReplicaType: rt, LabelTrainingReplicaIndex: strconv.Itoa(i),
						"training.kubeflow.org/operator-name": "pytorchjob-controller"}
					if rt == "master" {
						l["training.kubeflow.org/job-role"] = "master"
					}
					ex.pods = append(ex.pods, podFrom(tpl, fmt.Sprintf("%s-%s-%d", name, rt, i), l, nil))
				}
			}
		case KindPodGroup:
			ex.workloads[KindPodGroup+"/"+name] = obj
		default:
			t.Fatalf("%s: a %s is no workload the examples show", what, u.GetKind())
		}
	}
	return ex
}

// checkPodSpec checks what every example's pods must have: toposched as
// their scheduler, GPUs through a ResourceClaimTemplate of the file that
// a container uses, and the rank environment read through the downward
// API. It returns the pod's GPUs.
func checkPodSpec(t *testing.T, ex example, pod *corev1.Pod) int {
	t.Helper()
	if pod.Spec.SchedulerName != "toposched" {
		t.Fatalf("pod %s: schedulerName %q", pod.Name, pod.Spec.SchedulerName)
	}
	claims, gpus := map[string]bool{}, 0
	for _, c := range pod.Spec.ResourceClaims {
		if c.ResourceClaimTemplateName == nil {
			t.Fatalf("pod %s: claim %s names no ResourceClaimTemplate", pod.Name, c.Name)
		}
		n, ok := ex.gpusPerTemplate[*c.ResourceClaimTemplateName]
		if !ok {
			t.Fatalf("pod %s: claim %s's template %s is not in the file", pod.Name, c.Name, *c.ResourceClaimTemplateName)
		}
		claims[c.Name], gpus = true, gpus+n
	}
	used := map[string]bool{}
	for _, c := range pod.Spec.Containers {
		for _, rc := range c.Resources.Claims {
			if !claims[rc.Name] {
				t.Fatalf("pod %s: container %s uses claim %s the pod does not have", pod.Name, c.Name, rc.Name)
			}
			used[rc.Name] = true
		}
		read := map[string]bool{}
		for _, e := range c.Env {
			if e.ValueFrom != nil && e.ValueFrom.FieldRef != nil {
				read[e.ValueFrom.FieldRef.FieldPath] = true
			}
		}
		want := []string{AnnotationRank, AnnotationWorldSize, AnnotationLocalRank, AnnotationMasterAddr, AnnotationMasterPort}
		if strings.Contains(strings.Join(append(c.Command, c.Args...), " "), "torchrun") {
			want = append(want, AnnotationNodeRank, AnnotationNprocPerNode)
		}
		for _, a := range want {
			if !read[annotationField(a)] {
				t.Fatalf("pod %s: container %s does not read %s through the downward API", pod.Name, c.Name, a)
			}
		}
	}
	if len(used) != len(claims) || gpus == 0 {
		t.Fatalf("pod %s: claims %v, used %v, %d GPUs", pod.Name, claims, used, gpus)
	}
	return gpus
}

// TestExamples decodes each example manifest strictly (pod templates into
// corev1.PodTemplateSpec, claim templates into resource.k8s.io/v1), makes
// the pods their controllers would, and checks that they form the gangs
// the README says, of the size SizeOf reads from the workload, in rank
// order, with one valid job spec per gang. What they make is compared
// with testdata/examples.golden (go test -update rewrites it).
func TestExamples(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(examplesDir, "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var found []string
	for _, f := range files {
		found = append(found, filepath.Base(f))
	}
	if !slices.Equal(found, exampleFiles) {
		t.Fatalf("examples %v, want %v", found, exampleFiles)
	}
	var report bytes.Buffer
	for _, file := range exampleFiles {
		ex := loadExample(t, file)
		fmt.Fprintf(&report, "# %s\n", file)
		gangs := map[string][]*corev1.Pod{}
		byKey := map[string]Gang{}
		for _, pod := range ex.pods {
			g, err := GangOf(pod)
			if err != nil {
				t.Fatalf("%s: pod %s: %v", file, pod.Name, err)
			}
			gangs[g.Key()] = append(gangs[g.Key()], pod)
			byKey[g.Key()] = g
		}
		for _, key := range slices.Sorted(maps.Keys(gangs)) {
			g, pods := byKey[key], gangs[key]
			size, from := g.Size, "the pods"
			if size == 0 {
				gvr, name, ok := g.Workload()
				if !ok {
					t.Fatalf("%s: gang %s has no size and no workload", file, key)
				}
				kind := g.Kind
				if kind == KindTrainJob {
					kind = KindJobSet
				}
				o, ok := ex.workloads[kind+"/"+name]
				if !ok {
					t.Fatalf("%s: gang %s: no %s %s in the file", file, key, gvr.Resource, name)
				}
				if size, err = SizeOf(g.Kind, o); err != nil {
					t.Fatalf("%s: %v", file, err)
				}
				from = gvr.Resource + "/" + name
			}
			if size != len(pods) {
				t.Fatalf("%s: gang %s waits for %d pods, its workload makes %d", file, key, size, len(pods))
			}
			ordered, err := OrderPods(pods)
			if err != nil {
				t.Fatalf("%s: %v", file, err)
			}
			fmt.Fprintf(&report, "gang %s size %d (from %s) job_id %s\n", key, size, from, g.JobID())
			var first events.JobSubmitted
			gpus := 0
			for i, pod := range ordered {
				n := checkPodSpec(t, ex, pod)
				gpus += n
				index, ok, err := PodIndex(pod)
				if err != nil || !ok || index != i {
					t.Fatalf("%s: pod %s is %d in rank order, PodIndex %d %v %v", file, pod.Name, i, index, ok, err)
				}
				fmt.Fprintf(&report, "  rank %d..%d: pod %s\n", gpus-n, gpus-1, pod.Name)
				job, err := JobSpec(pod)
				if err != nil {
					t.Fatalf("%s: pod %s: %v", file, pod.Name, err)
				}
				if i == 0 {
					first = job
				} else if a, b := mustJSON(t, job), mustJSON(t, first); a != b {
					t.Fatalf("%s: pods of one gang ask for two jobs:\n%s\n%s", file, a, b)
				}
			}
			// The job the service submits: its own fields filled in
			// (gpus_per_node is the service's to choose).
			job := first
			job.JobID, job.Tenant, job.GPUs = g.JobID(), g.Namespace, gpus
			body := mustJSON(t, job)
			if err := schemas.Validate(string(events.NameJobSubmitted), []byte(body)); err != nil {
				t.Fatalf("%s: gang %s: %v\n%s", file, key, err, body)
			}
			if p := job.Parallelism; p == nil || max(p.TP, 1)*max(p.PP, 1)*max(p.DP, 1)*max(p.CP, 1) != gpus {
				t.Fatalf("%s: gang %s of %d GPUs asks for parallelism %+v", file, key, gpus, p)
			}
			fmt.Fprintf(&report, "  job %s\n", body)
		}
	}
	golden := filepath.Join("testdata", "examples.golden")
	if *update {
		if err := os.WriteFile(golden, report.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(report.Bytes(), want) {
		t.Fatalf("examples make\n%s\nwant (%s; go test -update rewrites it)\n%s", report.Bytes(), golden, want)
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
