package kube

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Gangs become jobs: a gang whose pods all exist, each with its claims
// made, is submitted once per set of member pods (and once more per retry
// of a carry-out that failed part way).

// maxGangPods bounds a gang: larger ones are refused with an Event rather
// than submitted (a decision names every rank).
const maxGangPods = 4096

// syncGang submits a gang once it is whole, or says on its pods why it is
// not submitted.
func (s *Service) syncGang(ctx context.Context, key string) error {
	objs, err := s.pods.GetIndexer().ByIndex(indexGang, key)
	if err != nil {
		return err
	}
	var waiting, live []*corev1.Pod
	for _, o := range objs {
		p := o.(*corev1.Pod)
		if p.DeletionTimestamp != nil || terminal(p) {
			continue
		}
		live = append(live, p)
		if p.Spec.NodeName == "" {
			waiting = append(waiting, p)
		}
	}
	if len(waiting) == 0 {
		return nil
	}
	if len(waiting) < len(live) {
		if s.binding(live) {
			return nil // syncJob is binding them: the others are next
		}
		// Some of the gang run: a pod that replaces one of theirs waits
		// for the gang to end, as its rank cannot join the others.
		s.say(waiting, corev1.EventTypeWarning, "FailedScheduling",
			fmt.Sprintf("%d other pods of the gang are bound already; a gang is placed whole, so this pod waits for them to end", len(live)-len(waiting)))
		return nil
	}
	g, err := GangOf(waiting[0])
	if err != nil {
		s.say(waiting, corev1.EventTypeWarning, "FailedScheduling", err.Error())
		return nil
	}
	size := g.Size
	if size == 0 {
		if size, err = s.workloadSize(ctx, g); err != nil {
			s.say(waiting, corev1.EventTypeWarning, "FailedScheduling", err.Error())
			return nil
		}
	}
	if size > maxGangPods {
		s.say(waiting, corev1.EventTypeWarning, "FailedScheduling", fmt.Sprintf("the gang has %d pods, more than %d", size, maxGangPods))
		return nil
	}
	if len(waiting) < size {
		s.sayWaiting(waiting, key, fmt.Sprintf("waiting for the gang's pods: %d of %d exist", len(waiting), size))
		return nil
	}
	pods, err := OrderPods(waiting)
	if err != nil {
		s.say(waiting, corev1.EventTypeWarning, "FailedScheduling", err.Error())
		return nil
	}
	spec, err := JobSpec(pods[0])
	if err != nil {
		s.say(pods, corev1.EventTypeWarning, "FailedScheduling", err.Error())
		return nil
	}
	perPod := -1
	for _, p := range pods {
		n, wait, err := s.podGPUs(p)
		if err != nil {
			s.say([]*corev1.Pod{p}, corev1.EventTypeWarning, "FailedScheduling", err.Error())
			return nil
		}
		if wait != "" {
			s.sayWaiting([]*corev1.Pod{p}, key, wait)
			return nil
		}
		if perPod >= 0 && n != perPod {
			s.say(pods, corev1.EventTypeWarning, "FailedScheduling", fmt.Sprintf(
				"the gang's pods request different numbers of GPUs (%s: %d, %s: %d); each pod of a gang holds the same number of ranks",
				pods[0].Name, perPod, p.Name, n))
			return nil
		}
		perPod = n
	}
	members := fingerprint(g, pods)
	s.mu.Lock()
	attempt := s.attempts[members]
	if j := s.jobs[jobID(members, attempt)]; attempt > 0 && j != nil {
		switch {
		case j.rejected != "":
			s.mu.Unlock()
			s.say(pods, corev1.EventTypeWarning, "FailedScheduling", "toposched refused the job "+j.id+": "+j.rejected)
			return nil
		case j.failed != "":
			s.mu.Unlock()
			s.say(pods, corev1.EventTypeWarning, "FailedScheduling", j.failed)
			return nil
		case !j.finished:
			s.mu.Unlock()
			return nil // submitted already; syncJob follows it
		}
	}
	attempt++
	id := jobID(members, attempt)
	s.attempts[members] = attempt
	s.setGang(s.job(id), g.Key())
	s.mu.Unlock()

	spec.JobID = id
	spec.Tenant = pods[0].Namespace
	spec.GPUs = perPod * len(pods)
	if perPod > 1 {
		// A pod's ranks share its node; ranks of one GPU each may go
		// anywhere, several pods to a node.
		spec.GPUsPerNode = perPod
	}
	if spec.Labels == nil {
		spec.Labels = map[string]string{}
	}
	spec.Labels[LabelGang] = g.Key()
	if _, err := s.bus.Publish(ctx, &spec); err != nil {
		s.mu.Lock()
		s.attempts[members] = attempt - 1
		s.finished(s.jobs[id])
		delete(s.jobs, id)
		s.mu.Unlock()
		return fmt.Errorf("submit gang %s: %w", g.Key(), err)
	}
	s.log.Info("gang submitted", "job_id", id, "gang", g.Key(), "pods", len(pods), "gpus", spec.GPUs)
	s.say(pods, corev1.EventTypeNormal, "Submitted", fmt.Sprintf("submitted to toposched as job %s (%d pods, %d GPUs)", id, len(pods), spec.GPUs))
	return nil
}

// binding reports whether the gang's live pods, some bound and some not,
// are the member set of a decided job that is not finished: the job being
// carried out, its pods bound one by one as the cache sees it.
func (s *Service) binding(live []*corev1.Pod) bool {
	id := ""
	for _, p := range live {
		if p.Spec.NodeName != "" {
			id = p.Annotations[AnnotationJobID]
			break
		}
	}
	s.mu.Lock()
	j := s.jobs[id]
	ok := j != nil && j.decided != nil && !j.finished
	members := ""
	if ok {
		members = j.members
	}
	s.mu.Unlock()
	if !ok {
		return false
	}
	g, err := GangOf(live[0])
	return err == nil && fingerprint(g, live) == members
}

// terminal reports whether a pod has ended.
func terminal(p *corev1.Pod) bool {
	return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
}

// workloadSize reads a gang's size from its workload object.
func (s *Service) workloadSize(ctx context.Context, g Gang) (int, error) {
	gvr, name, ok := g.Workload()
	if !ok {
		return 0, fmt.Errorf("the size of %s %s is not known: set the annotation toposched.io/gang-size", g.Kind, g.Name)
	}
	if s.dyn == nil {
		return 0, fmt.Errorf("the size of %s %s is in its %s, which this service cannot read: set the annotation toposched.io/gang-size", g.Kind, g.Name, gvr.Resource)
	}
	obj, err := s.dyn.Resource(gvr).Namespace(g.Namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return 0, fmt.Errorf("read %s %s/%s for the gang's size: %w", gvr.Resource, g.Namespace, name, err)
	}
	n, err := SizeOf(g.Kind, obj.Object)
	if err != nil {
		return 0, fmt.Errorf("%s %s/%s: %w", gvr.Resource, g.Namespace, name, err)
	}
	return n, nil
}

// podGPUs counts the GPUs a pod's claims request. wait says what it waits
// for (a claim its template has not made yet); err is a fault of the pod
// or its claims, named by field.
func (s *Service) podGPUs(p *corev1.Pod) (n int, wait string, err error) {
	claims, wait, err := s.podClaims(p)
	if err != nil || wait != "" {
		return 0, wait, err
	}
	for _, c := range claims {
		for i, r := range c.Spec.Devices.Requests {
			field := fmt.Sprintf("resourceclaim %s: spec.devices.requests[%d]", c.Name, i)
			if r.Exactly == nil {
				return 0, "", fmt.Errorf("%s: only exactly requests are supported (firstAvailable is not)", field)
			}
			cls, err := s.class(r.Exactly.DeviceClassName)
			if err != nil {
				return 0, "", fmt.Errorf("%s.exactly.deviceClassName: %w", field, err)
			}
			if err := s.checkSelectors(cls, r.Exactly.Selectors, field+".exactly.selectors"); err != nil {
				return 0, "", err
			}
			if !slices.Contains(s.cfg.GPUClasses, cls.Name) {
				continue
			}
			if r.Exactly.AllocationMode == resourceapi.DeviceAllocationModeAll {
				return 0, "", fmt.Errorf("%s.exactly.allocationMode: All: a GPU request must name its count", field)
			}
			n += int(max(r.Exactly.Count, 1))
		}
	}
	if n == 0 {
		return 0, "", fmt.Errorf("spec.resourceClaims: the pod requests no GPU (no claim of device class %s)", strings.Join(s.cfg.GPUClasses, ", "))
	}
	return n, "", nil
}

// podClaims returns a pod's ResourceClaims, in the order of
// spec.resourceClaims; wait says which one its template has not made yet.
func (s *Service) podClaims(p *corev1.Pod) ([]*resourceapi.ResourceClaim, string, error) {
	var out []*resourceapi.ResourceClaim
	for i, pc := range p.Spec.ResourceClaims {
		name := ""
		switch {
		case pc.ResourceClaimName != nil:
			name = *pc.ResourceClaimName
		case pc.ResourceClaimTemplateName != nil:
			for _, st := range p.Status.ResourceClaimStatuses {
				if st.Name == pc.Name && st.ResourceClaimName != nil {
					name = *st.ResourceClaimName
				}
			}
			if name == "" {
				return nil, fmt.Sprintf("waiting for the claim %q to be made from its template %s", pc.Name, *pc.ResourceClaimTemplateName), nil
			}
		default:
			return nil, "", fmt.Errorf("spec.resourceClaims[%d]: names neither a claim nor a template", i)
		}
		raw, ok, _ := s.claims.GetIndexer().GetByKey(p.Namespace + "/" + name)
		if !ok {
			return nil, fmt.Sprintf("waiting for the resourceclaim %s", name), nil
		}
		out = append(out, raw.(*resourceapi.ResourceClaim))
	}
	return out, "", nil
}

// class returns a DeviceClass by name.
func (s *Service) class(name string) (*resourceapi.DeviceClass, error) {
	raw, ok, _ := s.classes.GetIndexer().GetByKey(name)
	if !ok {
		return nil, fmt.Errorf("no DeviceClass %q", name)
	}
	return raw.(*resourceapi.DeviceClass), nil
}

// fingerprint names a set of member pods: the gang and their UIDs.
func fingerprint(g Gang, pods []*corev1.Pod) string {
	h := sha256.New()
	h.Write([]byte(g.Key()))
	uids := make([]string, 0, len(pods))
	for _, p := range pods {
		uids = append(uids, string(p.UID))
	}
	slices.Sort(uids)
	for _, u := range uids {
		h.Write([]byte{0})
		h.Write([]byte(u))
	}
	name := g.Name
	if len(name) > 40 {
		name = name[:40]
	}
	return JobIDPrefix + g.Namespace + ":" + strings.Trim(name, ".-") + ":" + hex.EncodeToString(h.Sum(nil))[:12]
}

// jobID is the job id of one attempt of a member set.
func jobID(members string, attempt int) string { return members + "-" + strconv.Itoa(attempt) }

// parseJobID is jobID's inverse; attempt 0 for an id not of that shape.
func parseJobID(id string) (members string, attempt int) {
	i := strings.LastIndexByte(id, '-')
	if i < 0 {
		return id, 0
	}
	n, err := strconv.Atoi(id[i+1:])
	if err != nil || n < 1 {
		return id, 0
	}
	return id[:i], n
}

// waitGrace is how long a pod waits for the rest of its gang, or for its
// claims to be made, before an Event says so. Both are there within a
// second or so as a rule; said at once, every count on the way was an
// Event for each pod already there, n²/2 Events for a gang of n pods
// created together (BENCHMARKS.md, issue 47).
const waitGrace = 5 * time.Second

// sayWaiting says msg on those pods that are older than waitGrace, and
// looks at the gang again once the youngest of the others is. A pod's age
// is from its creationTimestamp, which has whole seconds.
func (s *Service) sayWaiting(pods []*corev1.Pod, key, msg string) {
	now := time.Now()
	var old []*corev1.Pod
	var again time.Duration
	for _, p := range pods {
		if left := waitGrace - now.Sub(p.CreationTimestamp.Time); left > 0 {
			again = max(again, min(left, waitGrace))
		} else {
			old = append(old, p)
		}
	}
	s.say(old, corev1.EventTypeNormal, "Waiting", msg)
	if again > 0 {
		s.queue.AddAfter(gangKey(key), again)
	}
}

// say puts an Event on each pod, unless the pod was last told the same.
func (s *Service) say(pods []*corev1.Pod, kind, reason, msg string) {
	for _, p := range pods {
		key := string(p.UID)
		s.mu.Lock()
		same := s.said[key] == reason+msg
		s.said[key] = reason + msg
		s.mu.Unlock()
		if !same {
			s.rec.Event(p, kind, reason, msg)
		}
	}
}
