package kube

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/dynamic-resource-allocation/cel"

	"github.com/toposched/toposched/events/bus"
)

// Defaults of Config.
const (
	DefaultSchedulerName  = "toposched"
	DefaultGPUDriver      = "gpu.nvidia.com"
	DefaultDedicatedTaint = "toposched.io/dedicated"
	DefaultWorkers        = 16
	DefaultResync         = time.Minute
)

// LabelGang is the job label that names a job's gang (Gang.Key), so that
// a restarted service knows its jobs from the jobs stream alone.
const LabelGang = "toposched.io/gang"

// Config is what the service is told.
type Config struct {
	// SchedulerName picks the pods this service schedules: those whose
	// spec.schedulerName it is.
	SchedulerName string
	// GPUDriver is the DRA driver whose devices are the GPUs of
	// toposched's topology.
	GPUDriver string
	// GPUClasses are the DeviceClasses whose requests are GPUs, each
	// one rank (default: a class named as GPUDriver, as NVIDIA's chart
	// installs it). Requests of other classes (NICs, say) are allocated
	// on the decided node from its free devices.
	GPUClasses []string
	// DedicatedTaint is the taint key of nodes dedicated to toposched's
	// pods, which tolerate it. A node with any other NoSchedule or
	// NoExecute taint is left out: its GPUs are published held.
	DedicatedTaint string
	// Workers is how many gangs, decisions and nodes are worked on at
	// once.
	Workers int
	// Resync is how often every gang, job and node is looked at again,
	// whatever changed.
	Resync time.Duration
	// FabricLabels are the node labels of the fabric's levels, the widest
	// first (nil: DefaultFabricLabels); the tree they make is published
	// as topology.fabric unless a cluster file describes the fabric.
	FabricLabels []string
}

func (c *Config) defaults() {
	if c.SchedulerName == "" {
		c.SchedulerName = DefaultSchedulerName
	}
	if c.GPUDriver == "" {
		c.GPUDriver = DefaultGPUDriver
	}
	if len(c.GPUClasses) == 0 {
		c.GPUClasses = []string{c.GPUDriver}
	}
	if c.DedicatedTaint == "" {
		c.DedicatedTaint = DefaultDedicatedTaint
	}
	if c.Workers <= 0 {
		c.Workers = DefaultWorkers
	}
	if c.Resync <= 0 {
		c.Resync = DefaultResync
	}
	if c.FabricLabels == nil {
		c.FabricLabels = DefaultFabricLabels
	}
}

// Deps are what the service talks to.
type Deps struct {
	Kube kubernetes.Interface
	// Dynamic reads the workload objects that give a gang's size
	// (PodGroup, JobSet, ...); nil: only sizes the pods state are known.
	Dynamic dynamic.Interface
	Bus     *bus.Bus
	Log     *slog.Logger
	// Metrics, if set, is told what the service does.
	Metrics *Metrics
}

// Service is the Kubernetes service: see the package doc.
type Service struct {
	cfg  Config
	kc   kubernetes.Interface
	dyn  dynamic.Interface
	bus  *bus.Bus
	log  *slog.Logger
	rec  record.EventRecorder
	bcst record.EventBroadcaster
	met  *Metrics

	factory informers.SharedInformerFactory
	pods    cache.SharedIndexInformer
	nodes   cache.SharedIndexInformer
	slices  cache.SharedIndexInformer
	claims  cache.SharedIndexInformer
	classes cache.SharedIndexInformer

	queue workqueue.TypedRateLimitingInterface[string]
	ready chan struct{}

	mu   sync.Mutex
	jobs map[string]*jobState
	// attempts is the last attempt submitted for each member set.
	attempts map[string]int
	// byGang are the ids of each gang's jobs not finished.
	byGang map[string]map[string]bool
	topo   map[string]*nodeGPUs
	// heldSeen is each node's holds as the topology stream last gave
	// them (heldKey), so that only a change is published.
	heldSeen map[string]string
	// said is the last Event message given each pod, so that a gang
	// waiting for the same reason is not told again every pass.
	said map[string]string

	// fabricSeen is the switch list of the fabric this service last
	// published or found (JSON); fabricForeign is set while the fabric in
	// force is another source's.
	fabricSeen    string
	fabricForeign bool

	celOnce sync.Once
	cel     *cel.Cache
}

// Index names of the informers.
const (
	indexGang = "gang"
	// indexPool indexes slices and allocated claims by driver and pool.
	indexPool      = "pool"
	indexSliceNode = "node"
)

// New makes the service; Run starts it.
func New(cfg Config, deps Deps) (*Service, error) {
	if deps.Kube == nil || deps.Bus == nil {
		return nil, errors.New("kube: deps: Kube and Bus are required")
	}
	cfg.defaults()
	log := deps.Log
	if log == nil {
		log = slog.Default()
	}
	s := &Service{
		cfg: cfg, kc: deps.Kube, dyn: deps.Dynamic, bus: deps.Bus, log: log.With("component", "kube"), met: deps.Metrics,
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.DefaultTypedControllerRateLimiter[string](),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "toposched-kube"}),
		ready: make(chan struct{}),
		jobs:  map[string]*jobState{}, attempts: map[string]int{}, topo: map[string]*nodeGPUs{},
		heldSeen: map[string]string{}, said: map[string]string{}, byGang: map[string]map[string]bool{},
	}
	s.factory = informers.NewSharedInformerFactory(deps.Kube, 0)
	// Only toposched's pods: a cluster's other pods cost nothing here.
	podFactory := informers.NewSharedInformerFactoryWithOptions(deps.Kube, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("spec.schedulerName", cfg.SchedulerName).String()
		}))
	s.pods = podFactory.Core().V1().Pods().Informer()
	s.nodes = s.factory.Core().V1().Nodes().Informer()
	s.slices = s.factory.Resource().V1().ResourceSlices().Informer()
	s.claims = s.factory.Resource().V1().ResourceClaims().Informer()
	s.classes = s.factory.Resource().V1().DeviceClasses().Informer()
	s.factory = &factories{s.factory, podFactory}
	if err := s.pods.AddIndexers(cache.Indexers{indexGang: gangIndex}); err != nil {
		return nil, fmt.Errorf("kube: pod index: %w", err)
	}
	if err := s.slices.AddIndexers(cache.Indexers{indexSliceNode: sliceNodeIndex, indexPool: slicePoolIndex}); err != nil {
		return nil, fmt.Errorf("kube: slice index: %w", err)
	}
	if err := s.claims.AddIndexers(cache.Indexers{indexPool: claimPoolIndex}); err != nil {
		return nil, fmt.Errorf("kube: claim index: %w", err)
	}
	if s.met != nil {
		depth := s.queue.Len
		s.met.depth.Store(&depth)
	}
	s.bcst = record.NewBroadcaster()
	s.rec = s.bcst.NewRecorder(scheme.Scheme, corev1.EventSource{Component: cfg.SchedulerName})
	return s, nil
}

// factories starts and syncs the two informer factories as one.
type factories struct {
	informers.SharedInformerFactory
	pods informers.SharedInformerFactory
}

func (f *factories) Start(stop <-chan struct{}) {
	f.SharedInformerFactory.Start(stop)
	f.pods.Start(stop)
}

func (f *factories) Shutdown() {
	f.SharedInformerFactory.Shutdown()
	f.pods.Shutdown()
}

// Ready is closed once the caches are synced, the state rebuilt from the
// streams and the workers started.
func (s *Service) Ready() <-chan struct{} { return s.ready }

// Run runs the service until ctx ends.
func (s *Service) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer s.queue.ShutDown()
	s.bcst.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: s.kc.CoreV1().Events("")})
	defer s.bcst.Shutdown()

	s.addHandlers()
	s.factory.Start(ctx.Done())
	defer s.factory.Shutdown()
	for _, inf := range []cache.SharedIndexInformer{s.pods, s.nodes, s.slices, s.claims, s.classes} {
		if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
			return fmt.Errorf("kube: informer caches did not sync: %w", context.Cause(ctx))
		}
	}
	m := &bus.Mirror{Bus: s.bus, Sources: sources}
	if err := m.Rebuild(ctx, s.rebuilt); err != nil {
		return fmt.Errorf("kube: %w", err)
	}
	followReady := make(chan struct{})
	followErr := make(chan error, 1)
	go func() {
		if err := m.Follow(ctx, followReady, s.followed); err != nil {
			followErr <- fmt.Errorf("kube: %w", err)
			return
		}
		followErr <- nil
	}()
	select {
	case <-followReady:
	case err := <-followErr:
		return err
	case <-ctx.Done():
		return nil
	}
	s.enqueueAll()
	var wg sync.WaitGroup
	for range s.cfg.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for s.work(ctx) {
			}
		}()
	}
	close(s.ready)
	// The workers and followers add jobs meanwhile: the count is read
	// under mu like every other use of the map.
	s.mu.Lock()
	known := len(s.jobs)
	s.mu.Unlock()
	s.log.Info("scheduling pods", "scheduler_name", s.cfg.SchedulerName, "jobs_known", known)
	tick := time.NewTicker(s.cfg.Resync)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			s.queue.ShutDown()
			wg.Wait()
			return nil
		case err := <-followErr:
			s.queue.ShutDown()
			wg.Wait()
			return err
		case <-tick.C:
			s.enqueueAll()
		}
	}
}

// Work item keys: what to reconcile.
func gangKey(k string) string { return "gang/" + k }
func jobKey(id string) string { return "job/" + id }
func nodeKey(n string) string { return "node/" + n }

// enqueueAll queues every gang, job and node for a look.
func (s *Service) enqueueAll() {
	for _, k := range s.pods.GetIndexer().ListIndexFuncValues(indexGang) {
		s.queue.Add(gangKey(k))
	}
	s.mu.Lock()
	for id, j := range s.jobs {
		if !j.finished || j.decided != nil {
			s.queue.Add(jobKey(id))
		}
	}
	nodes := make([]string, 0, len(s.topo))
	for n := range s.topo {
		nodes = append(nodes, n)
	}
	s.mu.Unlock()
	for _, n := range nodes {
		s.queue.Add(nodeKey(n))
	}
	s.queue.Add(fabricKey)
	for _, obj := range s.claims.GetStore().List() {
		if c := obj.(*resourceapi.ResourceClaim); c.Annotations[AnnotationJobID] != "" {
			s.queue.Add(claimKey(c.Namespace, c.Name))
		}
	}
}

func claimKey(ns, name string) string { return "claim/" + ns + "/" + name }

// work takes one key off the queue and reconciles it; false once the
// queue is shut down.
func (s *Service) work(ctx context.Context) bool {
	key, quit := s.queue.Get()
	if quit {
		return false
	}
	defer s.queue.Done(key)
	kind, name, _ := strings.Cut(key, "/")
	var err error
	switch kind {
	case "gang":
		err = s.syncGang(ctx, name)
	case "job":
		err = s.syncJob(ctx, name)
	case "node":
		err = s.syncNode(ctx, name)
	case "claim":
		ns, n, _ := strings.Cut(name, "/")
		err = s.syncClaim(ctx, ns, n)
	case "fabric":
		err = s.syncFabric(ctx)
	}
	if err == nil {
		s.queue.Forget(key)
		return true
	}
	if ctx.Err() == nil {
		s.log.Warn("will try again", "key", key, "err", err)
		s.queue.AddRateLimited(key)
	}
	return true
}

// addHandlers queues what each change touches.
func (s *Service) addHandlers() {
	onPod := func(obj any, deleted bool) {
		pod, ok := podOf(obj)
		if !ok {
			return
		}
		if g, err := GangOf(pod); err == nil {
			s.queue.Add(gangKey(g.Key()))
		} else {
			s.queue.Add(gangKey(loneKey(pod)))
		}
		if id := pod.Annotations[AnnotationJobID]; id != "" {
			s.queue.Add(jobKey(id))
		}
		// A pod not bound yet is not tagged with its job: the jobs of
		// its gang are looked at (one deleted takes its job with it).
		keys, _ := gangIndex(pod)
		s.mu.Lock()
		for _, k := range keys {
			for id := range s.byGang[k] {
				s.queue.Add(jobKey(id))
			}
		}
		s.mu.Unlock()
		if deleted {
			s.mu.Lock()
			delete(s.said, string(pod.UID))
			s.mu.Unlock()
		}
	}
	_, _ = s.pods.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { onPod(obj, false) },
		UpdateFunc: func(_, obj any) { onPod(obj, false) },
		DeleteFunc: func(obj any) { onPod(obj, true) },
	})
	onNode := func(obj any) {
		if n, ok := obj.(*corev1.Node); ok {
			s.queue.Add(nodeKey(n.Name))
		} else if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			if n, ok := t.Obj.(*corev1.Node); ok {
				s.queue.Add(nodeKey(n.Name))
			}
		}
		s.queue.Add(fabricKey)
	}
	_, _ = s.nodes.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: onNode, UpdateFunc: func(_, obj any) { onNode(obj) }, DeleteFunc: onNode,
	})
	onSlice := func(obj any) {
		if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = t.Obj
		}
		if sl, ok := obj.(*resourceapi.ResourceSlice); ok && sl.Spec.NodeName != nil {
			s.queue.Add(nodeKey(*sl.Spec.NodeName))
		}
	}
	_, _ = s.slices.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: onSlice, UpdateFunc: func(_, obj any) { onSlice(obj) }, DeleteFunc: onSlice,
	})
	onClaim := func(old, obj any) {
		for _, o := range []any{old, obj} {
			if t, ok := o.(cache.DeletedFinalStateUnknown); ok {
				o = t.Obj
			}
			c, ok := o.(*resourceapi.ResourceClaim)
			if !ok {
				continue
			}
			for _, n := range s.nodesOfClaim(c) {
				s.queue.Add(nodeKey(n))
			}
			if c.Annotations[AnnotationJobID] != "" {
				s.queue.Add(claimKey(c.Namespace, c.Name))
			}
			// A pod waits on its claims being made from their templates.
			for _, ref := range c.OwnerReferences {
				if ref.Kind == "Pod" {
					if raw, ok, _ := s.pods.GetIndexer().GetByKey(c.Namespace + "/" + ref.Name); ok {
						if pod, ok := raw.(*corev1.Pod); ok {
							if g, err := GangOf(pod); err == nil {
								s.queue.Add(gangKey(g.Key()))
							}
						}
					}
				}
			}
		}
	}
	_, _ = s.claims.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) { onClaim(nil, obj) }, UpdateFunc: onClaim, DeleteFunc: func(obj any) { onClaim(nil, obj) },
	})
}

// podOf is the pod of an informer's object, also when it was deleted
// unseen.
func podOf(obj any) (*corev1.Pod, bool) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	pod, ok := obj.(*corev1.Pod)
	return pod, ok
}

// gangIndex indexes pods by their gang's key; a pod whose labels do not
// make a gang is its own, so that its Event still says why.
func gangIndex(obj any) ([]string, error) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return nil, nil
	}
	g, err := GangOf(pod)
	if err != nil {
		return []string{loneKey(pod)}, nil
	}
	return []string{g.Key()}, nil
}

// loneKey is the gang key of a pod whose workload labels are wrong.
func loneKey(pod *corev1.Pod) string {
	return Gang{Namespace: pod.Namespace, Kind: "Pod", Name: pod.Name, Size: 1}.Key()
}

func sliceNodeIndex(obj any) ([]string, error) {
	sl, ok := obj.(*resourceapi.ResourceSlice)
	if !ok || sl.Spec.NodeName == nil {
		return nil, nil
	}
	return []string{*sl.Spec.NodeName}, nil
}

func slicePoolIndex(obj any) ([]string, error) {
	sl, ok := obj.(*resourceapi.ResourceSlice)
	if !ok {
		return nil, nil
	}
	return []string{poolKey(sl.Spec.Driver, sl.Spec.Pool.Name)}, nil
}

// claimPoolIndex indexes allocated claims by the pools of their devices.
func claimPoolIndex(obj any) ([]string, error) {
	c, ok := obj.(*resourceapi.ResourceClaim)
	if !ok || c.Status.Allocation == nil {
		return nil, nil
	}
	var out []string
	for _, r := range c.Status.Allocation.Devices.Results {
		if k := poolKey(r.Driver, r.Pool); !slices.Contains(out, k) {
			out = append(out, k)
		}
	}
	return out, nil
}

func poolKey(driver, pool string) string { return driver + "/" + pool }

// nodesOfClaim are the nodes of an allocated claim's devices' pools.
func (s *Service) nodesOfClaim(c *resourceapi.ResourceClaim) []string {
	keys, _ := claimPoolIndex(c)
	var out []string
	for _, k := range keys {
		objs, _ := s.slices.GetIndexer().ByIndex(indexPool, k)
		for _, o := range objs {
			if sl := o.(*resourceapi.ResourceSlice); sl.Spec.NodeName != nil && !slices.Contains(out, *sl.Spec.NodeName) {
				out = append(out, *sl.Spec.NodeName)
			}
		}
	}
	return out
}
