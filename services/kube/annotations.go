package kube

// The job a gang asks for, from annotations on its pods (prefix
// toposched.io/). Users write them in their workload's pod template, so
// every pod of a gang carries the same; the service reads them from one
// pod (JobSpec) and fills in what the cluster says itself: job_id, tenant
// (the namespace), gpus and gpus_per_node (the pods' GPU claims).
//
//	toposched.io/parallelism           tp=8,dp=2,pp=1,ep=1,cp=1 (any of them, each once)
//	toposched.io/strategy              ddp, fsdp, zero1, zero2, zero3, megatron or ps
//	toposched.io/priority              a whole number (higher goes first, may be negative)
//	toposched.io/gpu-model             the GPU model the job requires, e.g. NVIDIA H100 80GB HBM3
//	toposched.io/step-compute-seconds  a positive decimal number
//	toposched.io/label.<key>           one policy label, Labels[<key>]
//	toposched.io/job                   a JSON object of any other jobs.submitted field
//	                                   (model, layout, groups, restart_cost_seconds, labels, ...)
//	toposched.io/gang-size             the number of pods of the gang (GangOf)
//
// Values are checked by the jobs.submitted schema (schemas/v1), the one
// every other way of submitting a job is checked by, so a value is bounded
// and refused alike everywhere; an error names the annotation and, inside
// toposched.io/job, the field. A field given twice (by its own annotation
// and inside toposched.io/job) is refused rather than one silently
// winning. The service writes the rank environment at binding, as the
// annotations listed in BindingAnnotations; JobSpec ignores those.
//
// An unknown toposched.io/ annotation is refused, so that a typo
// (toposched.io/paralelism) is an error on the pod, not a default.

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/schemas"
)

// Prefix is the prefix of toposched's annotations.
const Prefix = "toposched.io/"

// The annotations JobSpec and GangOf read.
const (
	AnnotationParallelism        = Prefix + "parallelism"
	AnnotationStrategy           = Prefix + "strategy"
	AnnotationPriority           = Prefix + "priority"
	AnnotationGPUModel           = Prefix + "gpu-model"
	AnnotationStepComputeSeconds = Prefix + "step-compute-seconds"
	// AnnotationLabelPrefix followed by a key sets that policy label.
	// Kubernetes allows one '/' in an annotation's key, so a label key
	// with a prefix of its own (app.kubernetes.io/name) goes in
	// toposched.io/job's labels instead.
	AnnotationLabelPrefix = Prefix + "label."
	AnnotationJob         = Prefix + "job"
	AnnotationGangSize    = Prefix + "gang-size"
)

// The annotations the service writes on each pod at binding (a Binding's
// annotations are copied onto the pod), which its containers read
// through the downward API, e.g.
// fieldPath: metadata.annotations['toposched.io/rank']. A pod of k GPUs
// holds k consecutive ranks: rank is its first, local-rank 0; torchrun
// takes node-rank (the pod's place) and nproc-per-node (k).
const (
	AnnotationRank         = Prefix + "rank"
	AnnotationWorldSize    = Prefix + "world-size"
	AnnotationLocalRank    = Prefix + "local-rank"
	AnnotationNodeRank     = Prefix + "node-rank"
	AnnotationNprocPerNode = Prefix + "nproc-per-node"
	AnnotationMasterAddr   = Prefix + "master-addr"
	AnnotationMasterPort   = Prefix + "master-port"
	// AnnotationJobID names the toposched job, on a pod bound for it and
	// on a claim the service allocated for it.
	AnnotationJobID = Prefix + "placed-job"
	// AnnotationGPUs are the decided GPUs' indexes on the node, in rank
	// order; AnnotationIBHCA their nearest NICs, for NCCL_IB_HCA, where the
	// topology names them.
	AnnotationGPUs  = Prefix + "gpu-indexes"
	AnnotationIBHCA = Prefix + "nccl-ib-hca"
)

// BindingAnnotations are the annotations the service writes at binding:
// JobSpec passes over them (a bound pod carries them; a user's value is
// overwritten at binding). A service that writes another toposched.io/
// annotation at binding lists it here.
var BindingAnnotations = []string{
	AnnotationRank, AnnotationWorldSize, AnnotationLocalRank, AnnotationNodeRank,
	AnnotationNprocPerNode, AnnotationMasterAddr, AnnotationMasterPort,
	AnnotationJobID, AnnotationGPUs, AnnotationIBHCA,
}

// Bounds on what JobSpec reads, each checked before the value is parsed.
const (
	// maxAnnotationBytes bounds one of the single-value annotations: the
	// longest value the schema takes is a gpu_model or a label value of
	// 1024 characters, up to 4 bytes each.
	maxAnnotationBytes = 4096
	// maxJobBytes bounds toposched.io/job (Kubernetes allows 256 KiB of
	// annotations in all).
	maxJobBytes = 64 << 10
	// maxLabels is the schema's bound on a job's labels (common.schema.json
	// labels.maxProperties).
	maxLabels = 64
)

// ownedByPod are the jobs.submitted fields the pod's containers own, and
// ownedByService those the service fills from the cluster: neither may be
// set by an annotation, as a field of toposched.io/job or as an
// annotation of its own (its name with '-' for '_').
var (
	ownedByPod = map[string]string{
		"command": "the pod's containers' command", "args": "the pod's containers' args",
		"env": "the pod's containers' env", "workdir": "the pod's containers' workingDir",
		"run_as": "the pod's securityContext",
	}
	ownedByService = map[string]string{
		"job_id": "the gang", "tenant": "the namespace",
		"gpus": "the pods' GPU claims", "gpus_per_node": "the pods' GPU claims",
	}
)

// ownerOf says who sets a field the annotations may not, "" for others.
func ownerOf(field string) string {
	if o, ok := ownedByPod[field]; ok {
		return "set by " + o
	}
	if o, ok := ownedByService[field]; ok {
		return "set by the service from " + o
	}
	return ""
}

// singleAnnotations maps the annotations of one field to that field.
var singleAnnotations = map[string]string{
	AnnotationParallelism:        "parallelism",
	AnnotationStrategy:           "strategy",
	AnnotationPriority:           "priority",
	AnnotationGPUModel:           "gpu_model",
	AnnotationStepComputeSeconds: "step_compute_seconds",
}

// JobSpec reads the job fields the annotations give (parallelism,
// strategy, model, priority, gpu model, policy labels,
// step_compute_seconds, ...) from one pod. The service fills job_id,
// tenant, gpus, gpus_per_node itself; an annotation that tries to set
// those, or command/args/env/workdir/run_as (the pod's containers own
// those), is an error. Errors are *FieldError naming the annotation.
func JobSpec(pod *corev1.Pod) (events.JobSubmitted, error) {
	if pod == nil {
		return events.JobSubmitted{}, errors.New("kube: JobSpec(nil)")
	}
	// Fields from their own annotations, and the labels, as JSON values:
	// the schema checks them as it checks any job's.
	fields := map[string]json.RawMessage{}
	from := map[string]string{} // field -> annotation that set it
	labels := map[string]string{}
	labelFrom := map[string]string{}
	var jobBody string
	hasJob := false

	// In a fixed order, so that a pod with several faults always gets
	// the same error; the labels counted before any is checked.
	var keys []string
	nLabels := 0
	for key := range pod.Annotations {
		if strings.HasPrefix(key, Prefix) {
			keys = append(keys, key)
		}
		if strings.HasPrefix(key, AnnotationLabelPrefix) {
			nLabels++
		}
	}
	if nLabels > maxLabels {
		return events.JobSubmitted{}, &FieldError{Field: annotationField(AnnotationLabelPrefix + "*"), Value: strconv.Itoa(nLabels),
			Err: fmt.Errorf("at most %d labels", maxLabels)}
	}
	slices.Sort(keys)
	for _, key := range keys {
		value := pod.Annotations[key]
		fail := func(err error) (events.JobSubmitted, error) {
			return events.JobSubmitted{}, &FieldError{Field: annotationField(key), Value: value, Err: err}
		}
		limit := maxAnnotationBytes
		if key == AnnotationJob {
			limit = maxJobBytes
		}
		if len(value) > limit {
			return fail(fmt.Errorf("longer than %d bytes", limit))
		}
		switch {
		case key == AnnotationJob:
			jobBody, hasJob = value, true
		case key == AnnotationGangSize || slices.Contains(BindingAnnotations, key):
			// GangOf's, and the service's own.
		case strings.HasPrefix(key, AnnotationLabelPrefix):
			k := strings.TrimPrefix(key, AnnotationLabelPrefix)
			if k == "" {
				return fail(errors.New("names no label: toposched.io/label.<key>"))
			}
			if err := checkFragment("labels", map[string]string{k: value}); err != nil {
				return fail(err)
			}
			labels[k], labelFrom[k] = value, key
		default:
			field, ok := singleAnnotations[key]
			if !ok {
				name := strings.ReplaceAll(strings.TrimPrefix(key, Prefix), "-", "_")
				if owner := ownerOf(name); owner != "" {
					return fail(errors.New(owner))
				}
				if isJobField(name) {
					return fail(fmt.Errorf("unknown annotation; write %s in %s, as {%q: ...}", name, AnnotationJob, name))
				}
				return fail(fmt.Errorf("unknown annotation; toposched reads %s", knownAnnotations()))
			}
			raw, err := annotationValue(key, value)
			if err != nil {
				return fail(err)
			}
			if err := checkFragment(field, raw); err != nil {
				return fail(err)
			}
			fields[field], from[field] = raw, key
		}
	}

	var job events.JobSubmitted
	if hasJob {
		var err error
		if job, err = decodeJob(jobBody, from); err != nil {
			return events.JobSubmitted{}, &FieldError{Field: annotationField(AnnotationJob), Value: jobBody, Err: err}
		}
		for k, v := range job.Labels {
			if a, ok := labelFrom[k]; ok && labels[k] != v {
				return events.JobSubmitted{}, &FieldError{Field: annotationField(a), Value: labels[k],
					Err: fmt.Errorf("label %q is also in %s, as %q", k, AnnotationJob, v)}
			}
		}
	}
	// The single fields decode onto the job: each was checked alone, and
	// none is in toposched.io/job (decodeJob refused that).
	body, err := json.Marshal(fields)
	if err != nil {
		return events.JobSubmitted{}, fmt.Errorf("kube: marshal annotations: %w", err)
	}
	if err := events.DecodeJSONStrict(body, &job); err != nil {
		return events.JobSubmitted{}, fmt.Errorf("kube: decode annotations: %w", err)
	}
	if len(labels) > 0 && job.Labels == nil {
		job.Labels = map[string]string{}
	}
	maps.Copy(job.Labels, labels)
	if len(job.Labels) > maxLabels {
		return events.JobSubmitted{}, &FieldError{Field: annotationField(AnnotationLabelPrefix + "*"), Value: strconv.Itoa(len(job.Labels)),
			Err: fmt.Errorf("with %s's labels, more than %d labels", AnnotationJob, maxLabels)}
	}
	return job, nil
}

// isJobField reports whether name is a property of jobs.submitted.
func isJobField(name string) bool {
	t := reflect.TypeFor[events.JobSubmitted]()
	for i := range t.NumField() {
		if tag, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ","); tag == name {
			return true
		}
	}
	return false
}

// knownAnnotations lists the annotations a user writes, for an error.
func knownAnnotations() string {
	known := append(slices.Sorted(maps.Keys(singleAnnotations)), AnnotationLabelPrefix+"<key>", AnnotationJob, AnnotationGangSize)
	return strings.Join(known, ", ")
}

// decimal is a plain decimal number, as people write one in YAML: what
// strconv.ParseFloat takes beyond it (Inf, NaN, hexadecimal, '_') is not
// a number of seconds.
var decimal = regexp.MustCompile(`^(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?$`)

// annotationValue turns one single-value annotation into its field's
// JSON value.
func annotationValue(key, value string) (json.RawMessage, error) {
	switch key {
	case AnnotationParallelism:
		p, err := ParseParallelism(value)
		if err != nil {
			return nil, err
		}
		return json.Marshal(p)
	case AnnotationPriority:
		n, err := strconv.ParseInt(value, 10, 32)
		if err != nil {
			return nil, fmt.Errorf("must be a whole number from %d to %d", math.MinInt32, math.MaxInt32)
		}
		return json.Marshal(n)
	case AnnotationStepComputeSeconds:
		if !decimal.MatchString(value) {
			return nil, errors.New("must be a decimal number of seconds, such as 1.5")
		}
		f, err := strconv.ParseFloat(value, 64)
		if err != nil || math.IsInf(f, 0) {
			return nil, errors.New("out of range")
		}
		return json.Marshal(f)
	default: // strings: strategy, gpu-model
		return json.Marshal(value)
	}
}

// checkFragment validates one field's value against the jobs.submitted
// schema, in a body that is otherwise valid.
func checkFragment(field string, value any) error {
	body, err := json.Marshal(map[string]any{field: value, "job_id": "x", "gpus": 1})
	if err != nil {
		return err
	}
	return oneLine(schemas.Validate(string(events.NameJobSubmitted), body))
}

// schemaError is a schema's ValidationError on one line: it ends up in a
// Kubernetes Event's message, after the annotation's name.
type schemaError struct{ *schemas.ValidationError }

func (e schemaError) Error() string {
	lines := make([]string, len(e.Problems))
	for i, p := range e.Problems {
		lines[i] = p.String()
	}
	return strings.Join(lines, "; ")
}

func (e schemaError) Unwrap() error { return e.ValidationError }

// oneLine puts a *schemas.ValidationError on one line; other errors are
// as they are.
func oneLine(err error) error {
	var verr *schemas.ValidationError
	if errors.As(err, &verr) {
		return schemaError{verr}
	}
	return err
}

// decodeJob reads toposched.io/job: a JSON object of jobs.submitted
// fields, checked against the schema (unknown fields refused), less the
// fields owned by the pod or the service and those an annotation of their
// own gives (from).
func decodeJob(body string, from map[string]string) (events.JobSubmitted, error) {
	var members map[string]json.RawMessage
	if json.Unmarshal([]byte(body), &members) == nil {
		for _, k := range slices.Sorted(maps.Keys(members)) {
			if owner := ownerOf(k); owner != "" {
				return events.JobSubmitted{}, fmt.Errorf("%s: %s", k, owner)
			}
			if a, ok := from[k]; ok {
				return events.JobSubmitted{}, fmt.Errorf("%s: also given by %s", k, a)
			}
		}
	}
	if err := schemas.Validate(string(events.NameJobSubmitted), []byte(body)); err != nil {
		// job_id and gpus are required of a whole job; the service
		// fills them.
		var verr *schemas.ValidationError
		if !errors.As(err, &verr) {
			return events.JobSubmitted{}, err
		}
		var rest []schemas.Problem
		for _, p := range verr.Problems {
			if p.Rule == "required" && (p.Field == "job_id" || p.Field == "gpus") {
				continue
			}
			rest = append(rest, p)
		}
		if len(rest) > 0 {
			return events.JobSubmitted{}, oneLine(&schemas.ValidationError{Problems: rest})
		}
	}
	var job events.JobSubmitted
	if err := events.DecodeJSONStrict([]byte(body), &job); err != nil {
		return events.JobSubmitted{}, err
	}
	return job, nil
}

// ParseParallelism reads toposched.io/parallelism: comma-separated
// dimension=degree items, such as "tp=8,dp=2", each of tp, pp, dp, ep and
// cp at most once, each degree a whole number from 1 to
// events.MaxJobGPUs. Spaces around items are allowed.
func ParseParallelism(s string) (events.Parallelism, error) {
	var p events.Parallelism
	if strings.TrimSpace(s) == "" {
		return p, errors.New("empty: write dimension=degree items such as tp=8,dp=2")
	}
	seen := map[string]bool{}
	for item := range strings.SplitSeq(s, ",") {
		item = strings.TrimSpace(item)
		dim, degree, ok := strings.Cut(item, "=")
		dim, degree = strings.TrimSpace(dim), strings.TrimSpace(degree)
		if !ok || dim == "" || degree == "" {
			return events.Parallelism{}, fmt.Errorf("%q: want dimension=degree, such as tp=8", item)
		}
		var dst *int
		switch dim {
		case "tp":
			dst = &p.TP
		case "pp":
			dst = &p.PP
		case "dp":
			dst = &p.DP
		case "ep":
			dst = &p.EP
		case "cp":
			dst = &p.CP
		default:
			return events.Parallelism{}, fmt.Errorf("%q: unknown dimension %q (tp, pp, dp, ep or cp)", item, dim)
		}
		if seen[dim] {
			return events.Parallelism{}, fmt.Errorf("%q: %s given twice", item, dim)
		}
		seen[dim] = true
		n, err := parseIndex(degree)
		if err != nil || n < 1 || n > events.MaxJobGPUs {
			return events.Parallelism{}, fmt.Errorf("%q: the degree must be a whole number from 1 to %d", item, events.MaxJobGPUs)
		}
		*dst = n
	}
	return p, nil
}
