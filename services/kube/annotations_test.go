package kube

import (
	"encoding/json"
	"errors"
	"reflect"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/schemas"
)

type jobSpecCase struct {
	name        string
	annotations map[string]string
	want        events.JobSubmitted
	field       string // the annotation the error names; "" for none
	errContains string
}

func labelsN(n int, prefix string) map[string]string {
	m := map[string]string{}
	for i := range n {
		m[prefix+strconv.Itoa(i)] = "v"
	}
	return m
}

func with(m map[string]string, kv ...string) map[string]string {
	out := map[string]string{}
	for k, v := range m {
		out[k] = v
	}
	for i := 0; i+1 < len(kv); i += 2 {
		out[kv[i]] = kv[i+1]
	}
	return out
}

func jobSpecCases() []jobSpecCase {
	a := annotationField
	return []jobSpecCase{
		{name: "none", annotations: nil},
		{name: "others' annotations are not read", annotations: map[string]string{"example.com/x": "y", "toposched.example.com/rank": "z"}},
		{
			name: "every annotation",
			annotations: map[string]string{
				AnnotationParallelism:            " tp=8, dp=2 ,pp=1,ep=1,cp=1",
				AnnotationStrategy:               "megatron",
				AnnotationPriority:               "-5",
				AnnotationGPUModel:               "NVIDIA H100 80GB HBM3",
				AnnotationStepComputeSeconds:     "4.2",
				AnnotationLabelPrefix + "team":   "llm",
				AnnotationLabelPrefix + "tier.x": "gold",
				AnnotationJob:                    `{"model": {"layers": 40.0, "dtype": "bf16"}, "layout": "tp-cp-ep-dp-pp", "restart_cost_seconds": 600, "labels": {"app.kubernetes.io/name": "llm", "team": "llm"}}`,
				AnnotationGangSize:               "2",
				AnnotationRank:                   "8", AnnotationWorldSize: "16", AnnotationLocalRank: "0", AnnotationNodeRank: "1",
				AnnotationNprocPerNode: "8", AnnotationMasterAddr: "10.0.0.1", AnnotationMasterPort: "29500",
			},
			want: events.JobSubmitted{
				Priority: -5, GPUModel: "NVIDIA H100 80GB HBM3", Strategy: "megatron", StepComputeSeconds: 4.2,
				Parallelism: &events.Parallelism{TP: 8, DP: 2, PP: 1, EP: 1, CP: 1},
				Labels:      map[string]string{"team": "llm", "tier.x": "gold", "app.kubernetes.io/name": "llm"},
				Model:       &events.Model{Layers: 40, Dtype: "bf16"}, Layout: "tp-cp-ep-dp-pp", RestartCostSeconds: 600,
			},
		},
		{name: "step seconds by model in the job", annotations: map[string]string{AnnotationJob: `{"step_compute_seconds_by_model": {"H100-SXM5-80GB": 0.35}}`},
			want: events.JobSubmitted{StepComputeSecondsByModel: map[string]float64{"H100-SXM5-80GB": 0.35}}},
		{name: "step seconds by model not positive", annotations: map[string]string{AnnotationJob: `{"step_compute_seconds_by_model": {"T4": 0}}`},
			field: a(AnnotationJob), errContains: "step_compute_seconds_by_model"},
		{name: "step seconds in exponent form", annotations: map[string]string{AnnotationStepComputeSeconds: "2e-1"}, want: events.JobSubmitted{StepComputeSeconds: 0.2}},
		{name: "step seconds without a leading digit", annotations: map[string]string{AnnotationStepComputeSeconds: ".5"}, want: events.JobSubmitted{StepComputeSeconds: 0.5}},
		{name: "64 labels", annotations: labelsN(64, AnnotationLabelPrefix+"k"), want: events.JobSubmitted{Labels: labelsN(64, "k")}},
		{name: "empty label value", annotations: map[string]string{AnnotationLabelPrefix + "k": ""}, want: events.JobSubmitted{Labels: map[string]string{"k": ""}}},

		{name: "parallelism empty", annotations: map[string]string{AnnotationParallelism: " "}, field: a(AnnotationParallelism), errContains: "empty"},
		{name: "parallelism trailing comma", annotations: map[string]string{AnnotationParallelism: "tp=8,"}, field: a(AnnotationParallelism), errContains: "dimension=degree"},
		{name: "parallelism without =", annotations: map[string]string{AnnotationParallelism: "tp8"}, field: a(AnnotationParallelism)},
		{name: "parallelism unknown dimension", annotations: map[string]string{AnnotationParallelism: "xp=2"}, field: a(AnnotationParallelism), errContains: "unknown dimension"},
		{name: "parallelism upper case", annotations: map[string]string{AnnotationParallelism: "TP=2"}, field: a(AnnotationParallelism), errContains: "unknown dimension"},
		{name: "parallelism twice", annotations: map[string]string{AnnotationParallelism: "tp=2,tp=4"}, field: a(AnnotationParallelism), errContains: "twice"},
		{name: "parallelism 0", annotations: map[string]string{AnnotationParallelism: "tp=0"}, field: a(AnnotationParallelism), errContains: "1 to 131072"},
		{name: "parallelism negative", annotations: map[string]string{AnnotationParallelism: "dp=-2"}, field: a(AnnotationParallelism)},
		{name: "parallelism too big", annotations: map[string]string{AnnotationParallelism: "dp=131073"}, field: a(AnnotationParallelism)},
		{name: "parallelism fraction", annotations: map[string]string{AnnotationParallelism: "dp=1.5"}, field: a(AnnotationParallelism)},
		{name: "strategy unknown", annotations: map[string]string{AnnotationStrategy: "horovod"}, field: a(AnnotationStrategy), errContains: "strategy: enum"},
		{name: "priority fraction", annotations: map[string]string{AnnotationPriority: "1.5"}, field: a(AnnotationPriority), errContains: "whole number"},
		{name: "priority too big", annotations: map[string]string{AnnotationPriority: "2147483648"}, field: a(AnnotationPriority)},
		{name: "gpu model empty", annotations: map[string]string{AnnotationGPUModel: ""}, field: a(AnnotationGPUModel), errContains: "minLength"},
		{name: "gpu model past the schema", annotations: map[string]string{AnnotationGPUModel: strings.Repeat("x", 1025)}, field: a(AnnotationGPUModel), errContains: "maxLength"},
		{name: "gpu model past the annotation bound", annotations: map[string]string{AnnotationGPUModel: strings.Repeat("x", 4097)}, field: a(AnnotationGPUModel), errContains: "4096 bytes"},
		{name: "step seconds 0", annotations: map[string]string{AnnotationStepComputeSeconds: "0"}, field: a(AnnotationStepComputeSeconds), errContains: "exclusiveMinimum"},
		{name: "step seconds negative", annotations: map[string]string{AnnotationStepComputeSeconds: "-1"}, field: a(AnnotationStepComputeSeconds)},
		{name: "step seconds NaN", annotations: map[string]string{AnnotationStepComputeSeconds: "NaN"}, field: a(AnnotationStepComputeSeconds)},
		{name: "step seconds Inf", annotations: map[string]string{AnnotationStepComputeSeconds: "Inf"}, field: a(AnnotationStepComputeSeconds)},
		{name: "step seconds hexadecimal", annotations: map[string]string{AnnotationStepComputeSeconds: "0x1p2"}, field: a(AnnotationStepComputeSeconds)},
		{name: "step seconds overflow", annotations: map[string]string{AnnotationStepComputeSeconds: "1e400"}, field: a(AnnotationStepComputeSeconds), errContains: "out of range"},
		{name: "step seconds with a unit", annotations: map[string]string{AnnotationStepComputeSeconds: "4s"}, field: a(AnnotationStepComputeSeconds)},
		{name: "label without a key", annotations: map[string]string{AnnotationLabelPrefix: "x"}, field: a(AnnotationLabelPrefix), errContains: "names no label"},
		{name: "label value too long", annotations: map[string]string{AnnotationLabelPrefix + "k": strings.Repeat("v", 1025)}, field: a(AnnotationLabelPrefix + "k"), errContains: "maxLength"},
		{name: "65 labels", annotations: labelsN(65, AnnotationLabelPrefix+"k"), field: a(AnnotationLabelPrefix + "*"), errContains: "at most 64"},
		{name: "64 labels and one more in the job", annotations: with(labelsN(64, AnnotationLabelPrefix+"k"), AnnotationJob, `{"labels": {"other": "x"}}`), field: a(AnnotationLabelPrefix + "*"), errContains: "more than 64"},
		{name: "label both ways, two values", annotations: map[string]string{AnnotationLabelPrefix + "team": "a", AnnotationJob: `{"labels": {"team": "b"}}`}, field: a(AnnotationLabelPrefix + "team"), errContains: "also in toposched.io/job"},

		{name: "job not JSON", annotations: map[string]string{AnnotationJob: `{model:`}, field: a(AnnotationJob), errContains: "json"},
		{name: "job an array", annotations: map[string]string{AnnotationJob: `[]`}, field: a(AnnotationJob), errContains: "want object"},
		{name: "job unknown field", annotations: map[string]string{AnnotationJob: `{"modle": {}}`}, field: a(AnnotationJob), errContains: "modle"},
		{name: "job unknown model field", annotations: map[string]string{AnnotationJob: `{"model": {"layer": 2}}`}, field: a(AnnotationJob), errContains: "model.layer"},
		{name: "job bad model", annotations: map[string]string{AnnotationJob: `{"model": {"layers": 0}}`}, field: a(AnnotationJob), errContains: "model.layers"},
		{name: "job's faults on one line", annotations: map[string]string{AnnotationJob: `{"model": {"layers": 0}, "layout": "x"}`}, field: a(AnnotationJob), errContains: "layout: pattern: 'x' does not match pattern '^(tp|cp|ep|dp|pp)(-(tp|cp|ep|dp|pp)){4}$'; model.layers: minimum"},
		{name: "job fraction", annotations: map[string]string{AnnotationJob: `{"model": {"layers": 2.5}}`}, field: a(AnnotationJob), errContains: "model.layers"},
		{name: "job property twice", annotations: map[string]string{AnnotationJob: `{"layout": "tp-cp-ep-dp-pp", "layout": "pp-cp-ep-dp-tp"}`}, field: a(AnnotationJob), errContains: "duplicate"},
		{name: "job too long", annotations: map[string]string{AnnotationJob: `{"labels": {"k": "` + strings.Repeat("v", 64<<10) + `"}}`}, field: a(AnnotationJob), errContains: "65536 bytes"},
		{name: "job gives parallelism twice", annotations: map[string]string{AnnotationParallelism: "tp=8", AnnotationJob: `{"parallelism": {"tp": 8}}`}, field: a(AnnotationJob), errContains: "also given by toposched.io/parallelism"},
		{name: "job gives strategy twice", annotations: map[string]string{AnnotationStrategy: "ddp", AnnotationJob: `{"strategy": "ddp"}`}, field: a(AnnotationJob), errContains: "strategy: also given"},
		{name: "job sets job_id", annotations: map[string]string{AnnotationJob: `{"job_id": "x"}`}, field: a(AnnotationJob), errContains: "job_id: set by the service"},
		{name: "job sets tenant", annotations: map[string]string{AnnotationJob: `{"tenant": "x"}`}, field: a(AnnotationJob), errContains: "namespace"},
		{name: "job sets gpus", annotations: map[string]string{AnnotationJob: `{"gpus": 8}`}, field: a(AnnotationJob), errContains: "GPU claims"},
		{name: "job sets gpus_per_node", annotations: map[string]string{AnnotationJob: `{"gpus_per_node": 8}`}, field: a(AnnotationJob), errContains: "GPU claims"},
		{name: "job sets command", annotations: map[string]string{AnnotationJob: `{"command": "python"}`}, field: a(AnnotationJob), errContains: "containers' command"},
		{name: "job sets args", annotations: map[string]string{AnnotationJob: `{"args": []}`}, field: a(AnnotationJob), errContains: "containers' args"},
		{name: "job sets env", annotations: map[string]string{AnnotationJob: `{"env": ["A=b"]}`}, field: a(AnnotationJob), errContains: "containers' env"},
		{name: "job sets workdir", annotations: map[string]string{AnnotationJob: `{"workdir": "/w"}`}, field: a(AnnotationJob), errContains: "workingDir"},
		{name: "job sets run_as", annotations: map[string]string{AnnotationJob: `{"run_as": "u"}`}, field: a(AnnotationJob), errContains: "securityContext"},

		{name: "annotation sets gpus", annotations: map[string]string{Prefix + "gpus": "8"}, field: a(Prefix + "gpus"), errContains: "GPU claims"},
		{name: "annotation sets gpus per node", annotations: map[string]string{Prefix + "gpus-per-node": "8"}, field: a(Prefix + "gpus-per-node")},
		{name: "annotation sets the job id", annotations: map[string]string{Prefix + "job-id": "x"}, field: a(Prefix + "job-id"), errContains: "the gang"},
		{name: "annotation sets the tenant", annotations: map[string]string{Prefix + "tenant": "x"}, field: a(Prefix + "tenant")},
		{name: "annotation sets the command", annotations: map[string]string{Prefix + "command": "python"}, field: a(Prefix + "command")},
		{name: "annotation sets run-as", annotations: map[string]string{Prefix + "run-as": "u"}, field: a(Prefix + "run-as"), errContains: "securityContext"},
		{name: "annotation misspelt", annotations: map[string]string{Prefix + "paralelism": "tp=8"}, field: a(Prefix + "paralelism"), errContains: "unknown annotation"},
		{name: "annotation of a job field", annotations: map[string]string{Prefix + "model": "{}"}, field: a(Prefix + "model"), errContains: `write model in toposched.io/job`},
		{name: "the first fault in key order", annotations: map[string]string{AnnotationStrategy: "x", AnnotationPriority: "x"}, field: a(AnnotationPriority)},
	}
}

func TestJobSpec(t *testing.T) {
	for _, tc := range jobSpecCases() {
		t.Run(tc.name, func(t *testing.T) {
			pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "p", Annotations: tc.annotations}}
			got, err := JobSpec(pod)
			if tc.field != "" {
				wantField(t, err, tc.field, tc.errContains)
				var fe *FieldError
				errors.As(err, &fe)
				if v, ok := tc.annotations[strings.TrimSuffix(strings.TrimPrefix(fe.Field, "metadata.annotations['"), "']")]; ok && fe.Value != v {
					t.Fatalf("error quotes %q, want the annotation's value %q", fe.Value, v)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				g, _ := json.Marshal(got)
				w, _ := json.Marshal(tc.want)
				t.Fatalf("JobSpec =\n%s\nwant\n%s", g, w)
			}
		})
	}
	if _, err := JobSpec(nil); err == nil {
		t.Fatal("JobSpec(nil) took it")
	}
}

// Every jobs.submitted field is either read from the annotations, filled
// by the service, or owned by the pod: a field added to the event later
// must be placed in one of them.
func TestEveryJobFieldHasAnOwner(t *testing.T) {
	read := map[string]bool{"labels": true, "model": true, "layout": true, "groups": true, "restart_cost_seconds": true,
		"step_compute_seconds_by_model": true}
	for _, f := range singleAnnotations {
		read[f] = true
	}
	ty := reflect.TypeFor[events.JobSubmitted]()
	for i := range ty.NumField() {
		name, _, _ := strings.Cut(ty.Field(i).Tag.Get("json"), ",")
		if !read[name] && ownerOf(name) == "" {
			t.Errorf("jobs.submitted field %s is neither read from an annotation nor owned", name)
		}
	}
}

func TestParseParallelism(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want events.Parallelism
		ok   bool
	}{
		{"tp=8,dp=2", events.Parallelism{TP: 8, DP: 2}, true},
		{"dp=2,tp=8", events.Parallelism{TP: 8, DP: 2}, true},
		{"cp=2 , ep=4", events.Parallelism{CP: 2, EP: 4}, true},
		{"pp = 4", events.Parallelism{PP: 4}, true},
		{"tp=131072", events.Parallelism{TP: 131072}, true},
		{"", events.Parallelism{}, false},
		{",", events.Parallelism{}, false},
		{"tp=", events.Parallelism{}, false},
		{"=8", events.Parallelism{}, false},
		{"tp=8=8", events.Parallelism{}, false},
		{"tp=+8", events.Parallelism{}, false},
		{"tp=8;dp=2", events.Parallelism{}, false},
	} {
		got, err := ParseParallelism(tc.in)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("ParseParallelism(%q) = %+v, %v", tc.in, got, err)
		}
	}
}

// FuzzJobSpec: JobSpec never panics on any annotations; a job it returns,
// with the fields the service fills, is a valid jobs.submitted, and an
// error names one of the pod's toposched.io/ annotations.
func FuzzJobSpec(f *testing.F) {
	for _, tc := range jobSpecCases() {
		if len(encodeMap(tc.annotations)) < 1<<12 {
			f.Add(encodeMap(tc.annotations))
		}
	}
	f.Fuzz(func(t *testing.T, annotations string) {
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "p", Annotations: decodeMap(annotations)}}
		job, err := JobSpec(pod)
		if err != nil {
			var fe *FieldError
			if !errors.As(err, &fe) {
				t.Fatalf("error %v is no *FieldError", err)
			}
			key, ok := strings.CutPrefix(fe.Field, "metadata.annotations['")
			key = strings.TrimSuffix(key, "']")
			if !ok || !strings.HasPrefix(key, Prefix) {
				t.Fatalf("error names %s, not a toposched.io/ annotation", fe.Field)
			}
			if _, present := pod.Annotations[key]; !present && !strings.HasSuffix(key, "*") {
				t.Fatalf("error names %s, which the pod does not have", key)
			}
			return
		}
		job.JobID, job.Tenant, job.GPUs = "j", "team-a", 1
		body, err := json.Marshal(job)
		if err != nil {
			t.Fatal(err)
		}
		if err := schemas.Validate(string(events.NameJobSubmitted), body); err != nil {
			t.Fatalf("JobSpec gave a job the schema refuses: %v\n%s", err, body)
		}
	})
}

// FuzzParseParallelism: ParseParallelism never panics, and a result it
// accepts has every degree in range and reads back the same.
func FuzzParseParallelism(f *testing.F) {
	for _, s := range []string{"tp=8,dp=2", "tp=8, dp=2 ,pp=1,ep=1,cp=1", "", "tp=0", "xp=2", "tp=2,tp=4", "dp=131073"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		p, err := ParseParallelism(s)
		if err != nil {
			return
		}
		for _, d := range []int{p.TP, p.PP, p.DP, p.EP, p.CP} {
			if d < 0 || d > events.MaxJobGPUs {
				t.Fatalf("ParseParallelism(%q) = %+v", s, p)
			}
		}
		var items []string
		for _, d := range []struct {
			name string
			n    int
		}{{"tp", p.TP}, {"pp", p.PP}, {"dp", p.DP}, {"ep", p.EP}, {"cp", p.CP}} {
			if d.n > 0 {
				items = append(items, d.name+"="+strconv.Itoa(d.n))
			}
		}
		again, err := ParseParallelism(strings.Join(items, ","))
		if err != nil || again != p {
			t.Fatalf("%q read back as %+v, %v", s, again, err)
		}
	})
}
