package kube

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"

	"github.com/toposched/toposched/events"
)

// Decisions carried out: each pod's claims allocated exactly the decided
// GPUs, then every pod bound, all or nothing. Each step looks at what is
// done already, so a decision is carried out again, after a restart or a
// failed try, without doing anything twice.

// finalizer is the one kube-scheduler puts on a claim it allocates: the
// resourceclaim controller removes it once it has given the claim back.
const finalizer = "resource.kubernetes.io/delete-protection"

// DefaultMasterPort is the rendezvous port when the decision names none.
const DefaultMasterPort = 29500

// conflictPatience is how long a decision waits for its GPUs to be given
// back by claims that hold them (a finished job's, being torn down)
// before it is given up and the gang submitted again.
const conflictPatience = 30 * time.Second

// syncJob follows one job: says why it waits, carries its decision out,
// and finishes it once its pods are gone or ended.
func (s *Service) syncJob(ctx context.Context, id string) error {
	s.mu.Lock()
	j, ok := s.jobs[id]
	if !ok {
		s.mu.Unlock()
		return nil
	}
	st := *j
	s.mu.Unlock()
	pods, whole := s.podsOfJob(&st)
	switch {
	case st.finished:
		// Finished from outside (a cancel) while its decision was being
		// carried out, it may leave claims allocated for pods not bound:
		// no change of theirs comes to say so, so syncClaim is asked.
		s.queueClaims(pods, id)
		return nil
	case st.rejected != "":
		s.say(pods, corev1.EventTypeWarning, "FailedScheduling", "toposched refused the job "+id+": "+st.rejected)
		return nil
	case st.decided == nil:
		if len(pods) == 0 && st.gang != "" {
			return s.finish(ctx, id, events.StatusCancelled, "the gang's pods are gone")
		}
		if st.pending != "" {
			s.say(pods, corev1.EventTypeWarning, "FailedScheduling", "waiting for GPUs: "+st.pending)
		}
		return nil
	}
	if len(pods) == 0 {
		return s.finish(ctx, id, events.StatusCancelled, "the job's pods are gone")
	}
	if done, status, msg := ended(pods); done {
		if !whole && status == events.StatusSucceeded {
			status, msg = events.StatusCancelled, "a pod of the job was deleted while it ran; the others ended"
		}
		return s.finish(ctx, id, status, msg)
	}
	if !whole {
		// Bound, then one of its pods went: the others run on, and the
		// job ends when they have; nothing is carried out again.
		return nil
	}
	if len(pods)*perPodOf(st.decided, len(pods)) != len(st.decided.Ranks) {
		return s.giveUp(ctx, &st, pods, fmt.Sprintf("the decision has %d ranks for %d pods", len(st.decided.Ranks), len(pods)), true)
	}
	if st.carried {
		return nil // the pod cache has yet to show the bindings
	}
	err := s.carryOut(ctx, &st, pods)
	var c *conflictError
	switch {
	case err == nil:
		s.mu.Lock()
		if j := s.jobs[id]; j != nil {
			j.conflictSince, j.carried = time.Time{}, true
		}
		s.mu.Unlock()
		return nil
	case errors.As(err, &c):
		s.mu.Lock()
		since := time.Now()
		if j := s.jobs[id]; j != nil {
			if j.conflictSince.IsZero() {
				j.conflictSince = since
			}
			since = j.conflictSince
		}
		s.mu.Unlock()
		if time.Since(since) < conflictPatience {
			s.say(pods, corev1.EventTypeNormal, "Waiting", "waiting for the decided GPUs to be given back: "+c.Error())
			return err // tried again with backoff
		}
		return s.giveUp(ctx, &st, pods, c.Error(), false)
	case isPermanent(err):
		return s.giveUp(ctx, &st, pods, err.Error(), true)
	}
	return err
}

// queueClaims queues the claims of pods that this service allocated for
// job id, for syncClaim to give back where the job is over.
func (s *Service) queueClaims(pods []*corev1.Pod, id string) {
	for _, p := range pods {
		claims, _, _ := s.podClaims(p)
		for _, c := range claims {
			if c.Annotations[AnnotationJobID] == id {
				s.queue.Add(claimKey(c.Namespace, c.Name))
			}
		}
	}
}

// conflictError says that decided devices are allocated to another claim.
type conflictError struct{ what string }

func (e *conflictError) Error() string { return e.what }

// permanentError is a fault that trying again does not mend.
type permanentError struct{ err error }

func (e *permanentError) Error() string { return e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

func isPermanent(err error) bool {
	var p *permanentError
	return errors.As(err, &p)
}

// perPodOf is the number of ranks each of n pods holds.
func perPodOf(d *events.PlacementDecided, n int) int {
	if n == 0 {
		return 0
	}
	return len(d.Ranks) / n
}

// podsOfJob finds a job's pods: the gang's pods whose set is the job's
// (whole), or else those bound for it that are left (they carry its id).
func (s *Service) podsOfJob(j *jobState) (pods []*corev1.Pod, whole bool) {
	if j.gang == "" {
		return nil, false
	}
	objs, _ := s.pods.GetIndexer().ByIndex(indexGang, j.gang)
	// Members are the gang's pods not bound for another job, ended or
	// being deleted included: only a pod gone, or one made since, changes
	// the set.
	var tagged, members []*corev1.Pod
	for _, o := range objs {
		p := o.(*corev1.Pod)
		if p.Annotations[AnnotationJobID] == j.id {
			tagged = append(tagged, p)
		}
		if p.Spec.NodeName == "" || p.Annotations[AnnotationJobID] == j.id {
			members = append(members, p)
		}
	}
	if len(members) > 0 {
		if g, err := GangOf(members[0]); err == nil && fingerprint(g, members) == j.members {
			ordered, err := OrderPods(members)
			if err == nil {
				return ordered, true
			}
		}
	}
	ordered, err := OrderPods(tagged)
	if err != nil {
		return tagged, false
	}
	return ordered, false
}

// ended reports whether every pod of a job has ended or is being
// deleted, and how the job ended.
func ended(pods []*corev1.Pod) (bool, events.JobStatus, string) {
	failed, deleted := 0, 0
	for _, p := range pods {
		switch {
		case p.Status.Phase == corev1.PodFailed:
			failed++
		case p.Status.Phase == corev1.PodSucceeded:
		case p.DeletionTimestamp != nil:
			deleted++
		default:
			return false, "", ""
		}
	}
	switch {
	case failed > 0:
		return true, events.StatusFailed, fmt.Sprintf("%d of the job's %d pods failed", failed, len(pods))
	case deleted > 0:
		return true, events.StatusCancelled, fmt.Sprintf("%d of the job's %d pods were deleted", deleted, len(pods))
	}
	return true, events.StatusSucceeded, "every pod succeeded"
}

// finish publishes a job's end, so that placement frees its GPUs.
func (s *Service) finish(ctx context.Context, id string, status events.JobStatus, msg string) error {
	return s.finishAs(ctx, id, status, "", msg)
}

// finishAs is finish with a reason (events.Reason*).
func (s *Service) finishAs(ctx context.Context, id string, status events.JobStatus, reason, msg string) error {
	if _, err := s.bus.Publish(ctx, &events.JobFinished{JobID: id, Status: status, Reason: reason, Message: msg}); err != nil {
		return fmt.Errorf("finish job %s: %w", id, err)
	}
	s.mu.Lock()
	if j := s.jobs[id]; j != nil {
		s.finished(j)
		if reason == events.ReasonLaunchFailed {
			j.failed = msg
		}
	}
	s.mu.Unlock()
	s.log.Info("job finished", "job_id", id, "status", status, "message", msg)
	return nil
}

// giveUp undoes what a carry-out did and finishes the job. A conflict
// (decided GPUs another claim kept) submits the gang again; a fault of
// the pods' claims (permanent) does not: it is said on the pods, which
// stay Pending until they change.
func (s *Service) giveUp(ctx context.Context, j *jobState, pods []*corev1.Pod, why string, permanent bool) error {
	s.log.Warn("decision given up", "job_id", j.id, "reason", why, "resubmit", !permanent)
	if err := s.undo(ctx, j, pods); err != nil {
		return err
	}
	s.met.gaveUp(!permanent)
	if permanent {
		msg := "toposched cannot carry out its decision for job " + j.id + ": " + why
		s.say(pods, corev1.EventTypeWarning, "FailedScheduling", msg)
		return s.finishAs(ctx, j.id, events.StatusFailed, events.ReasonLaunchFailed, msg)
	}
	s.say(pods, corev1.EventTypeWarning, "FailedScheduling", "toposched could not carry out its decision ("+why+"); the gang is submitted again")
	if err := s.finishAs(ctx, j.id, events.StatusCancelled, events.ReasonCancelled, "the decision could not be carried out: "+why); err != nil {
		return err
	}
	s.queue.Add(gangKey(j.gang))
	return nil
}

// undo gives back the claims a job's carry-out allocated for pods not
// bound, and deletes the pods it bound (a gang runs whole or not at all;
// their workload's controller makes them again).
func (s *Service) undo(ctx context.Context, j *jobState, pods []*corev1.Pod) error {
	for _, cached := range pods {
		// The cache may lag the bindings this service made: what is
		// undone is read fresh.
		p, err := s.kc.CoreV1().Pods(cached.Namespace).Get(ctx, cached.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) || (err == nil && p.UID != cached.UID) {
			p = cached.DeepCopy()
			p.Spec.NodeName = ""
		} else if err != nil {
			return fmt.Errorf("undo job %s: %w", j.id, err)
		}
		if p.Spec.NodeName != "" && p.Annotations[AnnotationJobID] == j.id {
			s.rec.Event(p, corev1.EventTypeWarning, "Preempted", "deleted: the gang's other pods could not be bound")
			err := s.kc.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &p.UID}})
			if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
				return fmt.Errorf("undo job %s: delete pod %s/%s: %w", j.id, p.Namespace, p.Name, err)
			}
			continue
		}
		claims, _, _ := s.podClaims(p)
		for _, cached := range claims {
			// So may it lag the allocations: a claim the carry-out
			// wrote a moment ago looks free in it.
			c, err := s.kc.ResourceV1().ResourceClaims(cached.Namespace).Get(ctx, cached.Name, metav1.GetOptions{})
			if apierrors.IsNotFound(err) || (err == nil && c.UID != cached.UID) {
				continue
			}
			if err != nil {
				return fmt.Errorf("undo job %s: %w", j.id, err)
			}
			if c.Annotations[AnnotationJobID] == j.id {
				if err := s.deallocate(ctx, c); err != nil {
					return fmt.Errorf("undo job %s: %w", j.id, err)
				}
			}
		}
	}
	return nil
}

// deallocate gives a claim this service allocated back, as kube-
// scheduler's unreserve does: no allocation, no consumers, no finalizer.
func (s *Service) deallocate(ctx context.Context, c *resourceapi.ResourceClaim) error {
	cur := c.DeepCopy()
	if cur.Status.Allocation != nil || len(cur.Status.ReservedFor) > 0 {
		cur.Status.Allocation, cur.Status.ReservedFor = nil, nil
		upd, err := s.kc.ResourceV1().ResourceClaims(c.Namespace).UpdateStatus(ctx, cur, metav1.UpdateOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("deallocate claim %s/%s: %w", c.Namespace, c.Name, err)
		}
		cur = upd
	}
	if !slices.Contains(cur.Finalizers, finalizer) && cur.Annotations[AnnotationJobID] == "" {
		return nil
	}
	cur.Finalizers = slices.DeleteFunc(cur.Finalizers, func(f string) bool { return f == finalizer })
	delete(cur.Annotations, AnnotationJobID)
	if _, err := s.kc.ResourceV1().ResourceClaims(c.Namespace).Update(ctx, cur, metav1.UpdateOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("release claim %s/%s: %w", c.Namespace, c.Name, err)
	}
	return nil
}

// syncClaim gives back a claim this service allocated whose pod is not
// bound and whose job is no longer live: what a carry-out cut short by a
// crash, or a job finished before its pods were bound, leaves behind.
func (s *Service) syncClaim(ctx context.Context, ns, name string) error {
	raw, ok, _ := s.claims.GetIndexer().GetByKey(ns + "/" + name)
	if !ok {
		return nil
	}
	c := raw.(*resourceapi.ResourceClaim)
	if c.Annotations[AnnotationJobID] == "" || c.Status.Allocation == nil {
		return nil
	}
	s.mu.Lock()
	live := s.liveClaim(c)
	s.mu.Unlock()
	if live {
		return nil
	}
	for _, r := range c.Status.ReservedFor {
		if r.Resource != "pods" {
			continue
		}
		if p, ok, _ := s.pods.GetIndexer().GetByKey(ns + "/" + r.Name); ok && p.(*corev1.Pod).Spec.NodeName != "" {
			return nil // a bound pod's: the resourceclaim controller gives it back when the pod ends
		}
	}
	s.log.Info("claim given back", "claim", ns+"/"+name, "job_id", c.Annotations[AnnotationJobID])
	return s.deallocate(ctx, c)
}

// podPlan is what one pod of a decision gets.
type podPlan struct {
	pod   *corev1.Pod
	node  string
	index int // the pod's place in the gang
	ranks []events.RankPlacement
}

// plans splits a decision's ranks among the pods, k consecutive ranks
// each, all on one node.
func plans(d *events.PlacementDecided, pods []*corev1.Pod) ([]podPlan, error) {
	k := perPodOf(d, len(pods))
	byRank := make(map[int]events.RankPlacement, len(d.Ranks))
	for _, r := range d.Ranks {
		byRank[r.Rank] = r
	}
	out := make([]podPlan, len(pods))
	for i, p := range pods {
		pl := podPlan{pod: p, index: i}
		for r := i * k; r < (i+1)*k; r++ {
			rp, ok := byRank[r]
			if !ok {
				return nil, &permanentError{fmt.Errorf("the decision has no rank %d", r)}
			}
			if pl.node == "" {
				pl.node = rp.Node
			} else if rp.Node != pl.node {
				return nil, &permanentError{fmt.Errorf("pod %s's ranks are on two nodes (%s, %s)", p.Name, pl.node, rp.Node)}
			}
			pl.ranks = append(pl.ranks, rp)
		}
		out[i] = pl
	}
	return out, nil
}

// carryOut allocates every pod's claims, then binds every pod.
func (s *Service) carryOut(ctx context.Context, j *jobState, pods []*corev1.Pod) error {
	pls, err := plans(j.decided, pods)
	if err != nil {
		return err
	}
	for _, pl := range pls {
		if pl.pod.Spec.NodeName != "" && pl.pod.Spec.NodeName != pl.node {
			return &permanentError{fmt.Errorf("pod %s is bound to %s, not the decided %s", pl.pod.Name, pl.pod.Spec.NodeName, pl.node)}
		}
	}
	err = eachPod(pls, func(pl podPlan) error {
		if pl.pod.Spec.NodeName != "" {
			return nil
		}
		if err := s.allocate(ctx, j, pl); err != nil {
			return fmt.Errorf("pod %s/%s: %w", pl.pod.Namespace, pl.pod.Name, err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	master := masterAddr(j.decided, pls)
	err = eachPod(pls, func(pl podPlan) error {
		if pl.pod.Spec.NodeName != "" {
			return nil
		}
		b := &corev1.Binding{
			ObjectMeta: metav1.ObjectMeta{Namespace: pl.pod.Namespace, Name: pl.pod.Name, UID: pl.pod.UID,
				Annotations: rankAnnotations(j, pl, master)},
			Target: corev1.ObjectReference{Kind: "Node", Name: pl.node},
		}
		if err := s.kc.CoreV1().Pods(pl.pod.Namespace).Bind(ctx, b, metav1.CreateOptions{}); err != nil {
			if apierrors.IsConflict(err) {
				// Bound already, by a try the pod cache has not
				// caught up with, or by someone else.
				cur, gerr := s.kc.CoreV1().Pods(pl.pod.Namespace).Get(ctx, pl.pod.Name, metav1.GetOptions{})
				if gerr == nil && cur.UID == pl.pod.UID && cur.Spec.NodeName == pl.node {
					return nil
				}
			}
			if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
				return &permanentError{fmt.Errorf("bind pod %s to %s: %w", pl.pod.Name, pl.node, err)}
			}
			return fmt.Errorf("bind pod %s to %s: %w", pl.pod.Name, pl.node, err)
		}
		s.rec.Eventf(pl.pod, corev1.EventTypeNormal, "Scheduled", "Successfully assigned %s/%s to %s (toposched job %s, rank %d)",
			pl.pod.Namespace, pl.pod.Name, pl.node, j.id, pl.ranks[0].Rank)
		return nil
	})
	if err != nil {
		return err
	}
	s.log.Info("gang bound", "job_id", j.id, "pods", len(pods))
	s.met.bound(len(pods), j.decided.DecidedAt)
	return nil
}

// carryOutParallelism bounds the pods of one gang whose claims are
// allocated, or which are bound, at once. Each pod takes two claim writes
// and a binding, one round trip each: one after the other, a 16-pod gang
// took about half a second of round trips on a busy control plane
// (BENCHMARKS.md, issue 47); the client's rate limit still paces them.
const carryOutParallelism = 16

// eachPod runs f for every plan, carryOutParallelism at a time, and
// returns the error of the first plan in the gang's order that failed, as
// a loop over them would have (the others are tried all the same: what
// they did is undone or taken up again as a loop's earlier pods' was).
func eachPod(pls []podPlan, f func(podPlan) error) error {
	if len(pls) == 1 {
		// A lone pod, most jobs on a busy cluster: a goroutine would only
		// add its start and its stack's growth through the client's calls.
		return f(pls[0])
	}
	errs := make([]error, len(pls))
	sem := make(chan struct{}, carryOutParallelism)
	var wg sync.WaitGroup
	for i, pl := range pls {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			errs[i] = f(pl)
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// masterAddr is the rendezvous address: the first pod's DNS name where its
// workload gives it one (hostname and subdomain, as JobSet and
// LeaderWorkerSet set them), else the decision's (rank 0's node).
func masterAddr(d *events.PlacementDecided, pls []podPlan) string {
	p := pls[0].pod
	if p.Spec.Hostname != "" && p.Spec.Subdomain != "" {
		return p.Spec.Hostname + "." + p.Spec.Subdomain + "." + p.Namespace + ".svc"
	}
	if d.Launch != nil && d.Launch.MasterAddr != "" {
		return d.Launch.MasterAddr
	}
	return pls[0].node
}

// rankAnnotations is a pod's rank environment.
func rankAnnotations(j *jobState, pl podPlan, master string) map[string]string {
	port := DefaultMasterPort
	if j.decided.Launch != nil && j.decided.Launch.MasterPort > 0 {
		port = j.decided.Launch.MasterPort
	}
	gpus := make([]string, 0, len(pl.ranks))
	var hcas []string
	for _, r := range pl.ranks {
		gpus = append(gpus, strconv.Itoa(r.GPU))
		if r.NIC != "" && !slices.Contains(hcas, r.NIC) {
			hcas = append(hcas, r.NIC)
		}
	}
	a := map[string]string{
		AnnotationJobID:        j.id,
		AnnotationRank:         strconv.Itoa(pl.ranks[0].Rank),
		AnnotationWorldSize:    strconv.Itoa(len(j.decided.Ranks)),
		AnnotationLocalRank:    strconv.Itoa(pl.ranks[0].LocalRank),
		AnnotationNodeRank:     strconv.Itoa(pl.index),
		AnnotationNprocPerNode: strconv.Itoa(len(pl.ranks)),
		AnnotationMasterAddr:   master,
		AnnotationMasterPort:   strconv.Itoa(port),
		AnnotationGPUs:         strings.Join(gpus, ","),
	}
	if len(hcas) > 0 {
		a[AnnotationIBHCA] = strings.Join(hcas, ",")
	}
	return a
}

// allocate gives one pod's claims exactly its decided GPUs (and, for
// requests of other classes, free devices of the node), unless they have
// them already.
func (s *Service) allocate(ctx context.Context, j *jobState, pl podPlan) error {
	claims, wait, err := s.podClaims(pl.pod)
	if err != nil {
		return &permanentError{err}
	}
	if wait != "" {
		return errors.New(wait)
	}
	s.mu.Lock()
	inv := s.inventoryOf(pl.node)
	s.mu.Unlock()
	want := make(map[structured.DeviceID]bool, len(pl.ranks))
	for _, r := range pl.ranks {
		id, ok := inv.device[r.GPU]
		if !ok {
			return &permanentError{fmt.Errorf("GPU %d of %s has no %s device in the node's ResourceSlices", r.GPU, pl.node, s.cfg.GPUDriver)}
		}
		want[id] = true
	}
	var todo []*resourceapi.ResourceClaim
	for _, c := range claims {
		if c.Status.Allocation == nil {
			todo = append(todo, c)
			continue
		}
		if c.Annotations[AnnotationJobID] != j.id {
			return &permanentError{fmt.Errorf("claim %s is allocated already, not by toposched for this job (a shared claim cannot join a gang)", c.Name)}
		}
		if err := s.reserve(ctx, c, pl.pod); err != nil {
			return err
		}
	}
	if len(todo) == 0 {
		return nil
	}
	// Every device in use is out of the allocator's reach, and so are the
	// node's GPUs other than the decided ones: it can only give those.
	state := structured.AllocatedState{AllocatedDevices: sets.New[structured.DeviceID]()}
	for _, sl := range inv.slices {
		objs, _ := s.claims.GetIndexer().ByIndex(indexPool, poolKey(sl.Spec.Driver, sl.Spec.Pool.Name))
		for _, o := range objs {
			c := o.(*resourceapi.ResourceClaim)
			if slices.ContainsFunc(claims, func(own *resourceapi.ResourceClaim) bool { return own.UID == c.UID }) {
				continue
			}
			for _, r := range c.Status.Allocation.Devices.Results {
				id := structured.MakeDeviceID(r.Driver, r.Pool, r.Device)
				if want[id] {
					return &conflictError{fmt.Sprintf("GPU %s of %s is allocated to claim %s/%s", r.Device, pl.node, c.Namespace, c.Name)}
				}
				state.AllocatedDevices.Insert(id)
			}
		}
	}
	for id := range inv.index {
		if !want[id] {
			state.AllocatedDevices.Insert(id)
		}
	}
	rawNode, ok, _ := s.nodes.GetIndexer().GetByKey(pl.node)
	if !ok {
		return &permanentError{fmt.Errorf("no node %s", pl.node)}
	}
	alloc, err := structured.NewAllocator(ctx, allocatorFeatures, state, classLister{s}, inv.slices, s.celCache())
	if err != nil {
		return &permanentError{fmt.Errorf("DRA allocator: %w", err)}
	}
	results, err := alloc.Allocate(ctx, rawNode.(*corev1.Node), todo)
	if err != nil {
		return &permanentError{fmt.Errorf("the claims cannot be met by the decided GPUs %s: %w", gpuList(pl), err)}
	}
	if len(results) != len(todo) {
		return &permanentError{fmt.Errorf("the claims cannot be met by the decided GPUs %s on %s (their selectors, constraints or counts ask for others)", gpuList(pl), pl.node)}
	}
	for i, c := range todo {
		if err := s.writeAllocation(ctx, j.id, c, &results[i], pl.pod); err != nil {
			return err
		}
	}
	return nil
}

func gpuList(pl podPlan) string {
	out := make([]string, 0, len(pl.ranks))
	for _, r := range pl.ranks {
		out = append(out, strconv.Itoa(r.GPU))
	}
	return "[" + strings.Join(out, " ") + "]"
}

// allocatorFeatures are the DRA features of 1.36 that are on by default
// and that the allocator needs told.
var allocatorFeatures = structured.Features{AdminAccess: true, PrioritizedList: true}

// writeAllocation marks a claim as toposched's (finalizer, job
// annotation), then writes its allocation and its pod as consumer in one
// status update, as kube-scheduler does.
func (s *Service) writeAllocation(ctx context.Context, job string, c *resourceapi.ResourceClaim, res *resourceapi.AllocationResult, pod *corev1.Pod) error {
	claims := s.kc.ResourceV1().ResourceClaims(c.Namespace)
	cur := c.DeepCopy()
	for try := 0; ; try++ {
		if slices.Contains(cur.Finalizers, finalizer) && cur.Annotations[AnnotationJobID] == job {
			break
		}
		if !slices.Contains(cur.Finalizers, finalizer) {
			cur.Finalizers = append(cur.Finalizers, finalizer)
		}
		if cur.Annotations == nil {
			cur.Annotations = map[string]string{}
		}
		cur.Annotations[AnnotationJobID] = job
		upd, err := claims.Update(ctx, cur, metav1.UpdateOptions{})
		if err == nil {
			cur = upd
			break
		}
		if !apierrors.IsConflict(err) || try >= 3 {
			return fmt.Errorf("mark claim %s: %w", c.Name, err)
		}
		if cur, err = claims.Get(ctx, c.Name, metav1.GetOptions{}); err != nil {
			return fmt.Errorf("mark claim %s: %w", c.Name, err)
		}
		if cur.Status.Allocation != nil && cur.Annotations[AnnotationJobID] != job {
			return &conflictError{fmt.Sprintf("claim %s was allocated meanwhile by another scheduler", c.Name)}
		}
	}
	if cur.Status.Allocation == nil {
		cur.Status.Allocation = res
	}
	cur.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: pod.Name, UID: pod.UID}}
	if _, err := claims.UpdateStatus(ctx, cur, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("allocate claim %s: %w", c.Name, err)
	}
	return nil
}

// reserve makes sure an allocated claim of toposched's lists its pod as
// consumer.
func (s *Service) reserve(ctx context.Context, c *resourceapi.ResourceClaim, pod *corev1.Pod) error {
	if slices.ContainsFunc(c.Status.ReservedFor, func(r resourceapi.ResourceClaimConsumerReference) bool { return r.UID == pod.UID }) {
		return nil
	}
	cur := c.DeepCopy()
	cur.Status.ReservedFor = append(cur.Status.ReservedFor, resourceapi.ResourceClaimConsumerReference{Resource: "pods", Name: pod.Name, UID: pod.UID})
	if _, err := s.kc.ResourceV1().ResourceClaims(c.Namespace).UpdateStatus(ctx, cur, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("reserve claim %s: %w", c.Name, err)
	}
	return nil
}

// classLister is the allocator's view of the DeviceClasses.
type classLister struct{ s *Service }

func (l classLister) List() ([]*resourceapi.DeviceClass, error) {
	var out []*resourceapi.DeviceClass
	for _, o := range l.s.classes.GetStore().List() {
		out = append(out, o.(*resourceapi.DeviceClass))
	}
	return out, nil
}

func (l classLister) Get(name string) (*resourceapi.DeviceClass, error) { return l.s.class(name) }

// celCache compiles the claims' and classes' CEL selectors once each.
func (s *Service) celCache() *cel.Cache {
	s.celOnce.Do(func() { s.cel = cel.NewCache(1024, cel.Features{}) })
	return s.cel
}

// checkSelectors compiles the CEL selectors of a request and its class,
// so that one toposched cannot evaluate is refused, naming its field,
// before the gang is submitted.
func (s *Service) checkSelectors(cls *resourceapi.DeviceClass, sels []resourceapi.DeviceSelector, field string) error {
	check := func(sels []resourceapi.DeviceSelector, field string) error {
		for i, sel := range sels {
			if sel.CEL == nil {
				continue
			}
			if res := s.celCache().GetOrCompile(sel.CEL.Expression); res.Error != nil {
				return fmt.Errorf("%s[%d].cel.expression: %s", field, i, res.Error.Detail)
			}
		}
		return nil
	}
	if err := check(cls.Spec.Selectors, "deviceclass "+cls.Name+": spec.selectors"); err != nil {
		return err
	}
	return check(sels, field)
}
