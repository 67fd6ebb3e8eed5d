package optimizer

import (
	"context"
	"fmt"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/internal/collective"
	"github.com/toposched/toposched/internal/placer/aware"
	"github.com/toposched/toposched/internal/store"
	"github.com/toposched/toposched/internal/topology"
	"github.com/toposched/toposched/services/optimizer/tuning"
)

// NCCLVersion is the oldest NCCL that reads the settings of a tuning
// event: the per-collective NCCL_ALGO and NCCL_PROTO syntax
// ("allreduce:tree") came with NCCL 2.24.
const NCCLVersion = ">=2.24"

// Gradient buckets (DistributedDataParallel's bucket_cap_mb): PyTorch's
// default, and the share of the all-reduce's bandwidth time the latency of
// its bucket calls may take before a larger bucket is recommended.
const (
	DefaultBucketMiB   = 25
	BucketLatencyShare = 0.05
)

// TopoFileDir is where a launcher writes each node's NCCL topology XML
// (NCCL_TOPO_FILE), under a directory per job.
const TopoFileDir = "/tmp/toposched"

// tune works out a live decision's settings and publishes them as
// runtime.tuning. A decision that is no longer live (released since) or
// was replaced is not tuned.
func (s *Service) tune(ctx context.Context, _ events.Envelope, d *events.PlacementDecided) error {
	lj := s.live[d.JobID]
	if lj == nil || !sameDecision(lj.decision, d) {
		return nil
	}
	if err := s.ready(ctx, lj); err != nil {
		return err
	}
	ev, err := s.retune(lj)
	if err != nil {
		// A decision the model cannot read (a GPU its node no longer
		// reports) gets no tuning; nothing a retry would change.
		s.log.WarnContext(ctx, "tuning failed", "job_id", d.JobID, "err", err)
		return nil
	}
	if _, err := s.pub.Publish(ctx, ev); err != nil {
		return err
	}
	algo, proto := ev.Env.All["NCCL_ALGO"], ev.Env.All["NCCL_PROTO"]
	s.log.InfoContext(ctx, "job tuned", "job_id", d.JobID, "recommendations", len(ev.Recommendations), "nccl_algo", algo, "nccl_proto", proto,
		"predicted_comm_s", ev.PredictedCommSecondsPerStep, "default_comm_s", ev.DefaultCommSecondsPerStep)
	return nil
}

// resolver turns a decision's GPUs into cost-model ranks: each node's
// effective topology (its health applied), or, for a node reported without
// paths, its GPUs joined over the host bridge, as placement scores it.
type resolver struct {
	snap  *store.Snapshot
	nodes map[string]*topology.Node
}

func (r *resolver) rank(node string, gpu int) (collective.Rank, error) {
	t, ok := r.nodes[node]
	if !ok {
		n, found := r.snap.Node(node)
		if !found {
			return collective.Rank{}, fmt.Errorf("node %s: no report", node)
		}
		t = n.Effective
		if t == nil {
			t = n.Topology
		}
		if t == nil || t.GPUPaths == nil {
			t = fallbackTopology(n, r.snap.GPUs(node))
		}
		r.nodes[node] = t
	}
	for p, g := range t.GPUs {
		if g.Index == gpu {
			return collective.Rank{Node: t, GPU: p}, nil
		}
	}
	return collective.Rank{}, fmt.Errorf("node %s has no GPU %d in its topology", node, gpu)
}

func fallbackTopology(n store.Node, gpus []store.GPU) *topology.Node {
	tg := make([]topology.GPU, len(gpus))
	for i, g := range gpus {
		tg[i] = topology.GPU{Index: g.Index, Model: g.Model, NUMA: -1}
	}
	return topology.Flat(n.Name, "optimizer fallback (no paths reported)", tg)
}

// modelCollective maps an analysed collective to the cost model's; a
// broadcast moves about what an all-gather of the same buffer does, as
// placement scores it.
func modelCollective(c string) collective.Collective {
	switch c {
	case events.CollectiveAllGather, events.CollectiveBroadcast:
		return collective.AllGather
	case events.CollectiveReduceScatter:
		return collective.ReduceScatter
	case events.CollectiveAllToAll:
		return collective.AllToAll
	case events.CollectiveSendRecv:
		return collective.SendRecv
	}
	return collective.AllReduce
}

func eventCollective(c collective.Collective) string {
	if c == collective.SendRecv {
		return events.CollectiveSendRecv
	}
	return string(c)
}

// phasesOf lists a decided job's phases: per dimension and collective,
// every member of two or more ranks, as placement's prediction groups
// them. A job whose analysis sizes nothing is one all-reduce of
// aware.DefaultBytes over all its ranks, as placement assumed.
func phasesOf(snap *store.Snapshot, d *events.PlacementDecided, spec *events.JobAnalyzed) ([]tuning.Phase, error) {
	res := &resolver{snap: snap, nodes: map[string]*topology.Node{}}
	ranks := make([]collective.Rank, len(d.Ranks))
	for _, r := range d.Ranks {
		if r.Rank < 0 || r.Rank >= len(ranks) {
			return nil, fmt.Errorf("rank %d out of range", r.Rank)
		}
		cr, err := res.rank(r.Node, r.GPU)
		if err != nil {
			return nil, err
		}
		ranks[r.Rank] = cr
	}
	n := len(ranks)
	var out []tuning.Phase
	sized := false
	for _, rg := range spec.Groups {
		name := rg.Dimension
		if rg.Name != "" {
			name = rg.Name
		}
		for _, c := range rg.Collectives {
			if c.Bytes <= 0 {
				continue
			}
			sized = true
			ph := tuning.Phase{Name: name, Collective: modelCollective(c.Collective), Bytes: float64(c.Bytes), Calls: max(c.CallsPerStep, 1)}
			for _, m := range rg.Members {
				if len(m) < 2 || slices.ContainsFunc(m, func(r int) bool { return r < 0 || r >= n }) {
					continue
				}
				member := make([]collective.Rank, len(m))
				for i, r := range m {
					member[i] = ranks[r]
				}
				ph.Members = append(ph.Members, member)
			}
			if len(ph.Members) > 0 {
				out = append(out, ph)
			}
		}
	}
	if !sized && n >= 2 {
		out = append(out, tuning.Phase{Name: "dp", Collective: collective.AllReduce, Members: [][]collective.Rank{ranks}, Bytes: aware.DefaultBytes, Calls: 1})
	}
	return out, nil
}

// Tuning computes the runtime.tuning of a decision on the store's state:
// NCCL algorithm and protocol where the cost model beats NCCL's own
// choice, a gradient bucket size where the latency term shows, and the
// bindings the prediction assumes (each rank's nearest NIC and NUMA node,
// each node's NCCL topology file). See package tuning for the choice.
func Tuning(snap *store.Snapshot, fabric *topology.Fabric, d *events.PlacementDecided, spec *events.JobAnalyzed) (*events.RuntimeTuning, error) {
	return TuningWith(snap, fabric, nil, d, spec)
}

// TuningWith is Tuning with the cost model's link bandwidths bw (nil: the
// defaults; a calibration's).
func TuningWith(snap *store.Snapshot, fabric *topology.Fabric, bw *topology.Bandwidths, d *events.PlacementDecided, spec *events.JobAnalyzed) (*events.RuntimeTuning, error) {
	ev, _, err := tuningPlan(snap, fabric, bw, d, spec)
	return ev, err
}

// retune works out a live job's tuning with the calibration in force and
// keeps it, with its plan, on the job.
func (s *Service) retune(lj *liveJob) (*events.RuntimeTuning, error) {
	bw := s.bandwidths.Load()
	ev, plan, err := tuningPlan(s.store.Snapshot(), s.fabric, bw, lj.decision, lj.spec)
	if err != nil {
		return nil, err
	}
	lj.tuning, lj.plan, lj.tunedWith = ev, plan, bw
	return ev, nil
}

// tuningPlan is TuningWith and the plan behind it.
func tuningPlan(snap *store.Snapshot, fabric *topology.Fabric, bw *topology.Bandwidths, d *events.PlacementDecided, spec *events.JobAnalyzed) (*events.RuntimeTuning, tuning.Plan, error) {
	phases, err := phasesOf(snap, d, spec)
	if err != nil {
		return nil, tuning.Plan{}, fmt.Errorf("job %s: %w", d.JobID, err)
	}
	plan, err := tuning.Tune(tuning.Input{Phases: phases, Fabric: fabric, Bandwidths: bw})
	if err != nil {
		return nil, tuning.Plan{}, fmt.Errorf("job %s: %w", d.JobID, err)
	}
	ev := &events.RuntimeTuning{JobID: d.JobID, DecidedAt: d.DecidedAt, NCCLVersion: NCCLVersion,
		Recommendations:             []events.Recommendation{},
		PredictedCommSecondsPerStep: plan.PredictedSeconds, DefaultCommSecondsPerStep: plan.DefaultSeconds}
	all := map[string]string{}
	algo, proto := plan.Env()
	if algo != "" {
		all["NCCL_ALGO"] = algo
	}
	if proto != "" {
		all["NCCL_PROTO"] = proto
	}
	for _, r := range plan.Phases {
		ph := r.Phase
		ev.Groups = append(ev.Groups, events.TunedGroup{Name: ph.Name, Collective: eventCollective(ph.Collective),
			Members: len(ph.Members), Ranks: len(ph.Members[0]), Bytes: int64(ph.Bytes), CallsPerStep: max(ph.Calls, 1),
			Algorithm: string(r.Chosen.Algorithm), Protocol: string(r.Chosen.Protocol),
			SecondsPerStep: r.ChosenSeconds, BusBWGBps: r.BusBWGBps})
		gain := r.DefaultSeconds - r.ChosenSeconds
		if r.Chosen == r.Default {
			continue
		}
		if gain <= 0 {
			ev.Notes = append(ev.Notes, fmt.Sprintf("%s %s runs %s under the settings, %.3g s per step slower than NCCL's %s: the settings apply to every %s of the job, and its other groups gain more",
				ph.Name, ph.Collective, r.Chosen, -gain, r.Default, ph.Collective))
			continue
		}
		rec := events.Recommendation{Group: ph.Name, Collective: eventCollective(ph.Collective),
			BytesRange: events.ByteRange{Min: int64(r.MinBytes), Max: int64(r.MaxBytes)},
			Algorithm:  string(r.Chosen.Algorithm), Protocol: string(r.Chosen.Protocol), Kind: events.TuningAlgorithm,
			PredictedGainSeconds: gain, Reason: algorithmReason(r, fabric != nil)}
		if r.Chosen.Algorithm != r.Default.Algorithm {
			rec.DefaultAlgorithm = string(r.Default.Algorithm)
			rec.Settings = append(rec.Settings, "NCCL_ALGO")
		}
		if r.Chosen.Protocol != r.Default.Protocol {
			rec.DefaultProtocol = string(r.Default.Protocol)
			rec.Settings = append(rec.Settings, "NCCL_PROTO")
		}
		if len(rec.Settings) == 0 {
			continue
		}
		ev.Recommendations = append(ev.Recommendations, rec)
	}
	if rec, ok := bucketRecommendation(spec, plan); ok {
		all[events.EnvBucketCapMB] = strconv.Itoa(int(rec.BytesRange.Max >> 20))
		ev.Recommendations = append(ev.Recommendations, rec)
	}
	ev.Env.All = nilIfEmpty(all)
	bindings(ev, d)
	ev.Notes = append(ev.Notes, "channels (NCCL_MIN_NCHANNELS, NCCL_MAX_NCHANNELS) left to NCCL: the cost model has no term for them, so no bound is justified")
	if railFabric(fabric, d) {
		ev.Notes = append(ev.Notes, "NCCL_CROSS_NIC left to NCCL: the fabric is rail-optimized, but the cost model does not tell rails apart, so keeping rings on one rail has no predicted gain")
	}
	return ev, plan, nil
}

func algorithmReason(r tuning.PhaseResult, fabric bool) string {
	ph := r.Phase
	why := "NCCL's tuner does not see the fabric between nodes (leaf uplinks and their oversubscription)"
	if !fabric {
		why = "NCCL's tuner and the cost model differ on this placement"
	}
	s := fmt.Sprintf("%s %s of %s over %d group(s) of %d ranks: %s and would run %s, %.4g s per step",
		ph.Name, ph.Collective, formatBytes(ph.Bytes), len(ph.Members), len(ph.Members[0]), why, r.Default, r.DefaultSeconds)
	if r.DefaultBottleneck != "" {
		s += " (bottleneck " + r.DefaultBottleneck + ")"
	}
	s += fmt.Sprintf("; %s takes %.4g s", r.Chosen, r.ChosenSeconds)
	if r.Bottleneck != "" && r.Bottleneck != r.DefaultBottleneck {
		s += " (bottleneck " + r.Bottleneck + ")"
	}
	return s
}

// bucketRecommendation sizes DDP's gradient buckets. DDP all-reduces the
// gradients G in buckets of b bytes, G/b calls, each paying the
// all-reduce's latency term alpha, while the bandwidth term beta·G is the
// same whatever b. The smallest power-of-two MiB b whose calls' latency is
// at most BucketLatencyShare of beta·G hides the latency term while
// keeping buckets small enough to overlap with the backward pass;
// recommended when it saves time over the default 25 MiB.
func bucketRecommendation(spec *events.JobAnalyzed, plan tuning.Plan) (events.Recommendation, bool) {
	switch spec.Job.Strategy {
	case "", events.StrategyDDP, events.StrategyMegatron:
	default:
		return events.Recommendation{}, false
	}
	for _, r := range plan.Phases {
		ph := r.Phase
		if ph.Name != "dp" || ph.Collective != collective.AllReduce || r.Beta <= 0 || r.Alpha <= 0 {
			continue
		}
		g := ph.Bytes
		need := r.Alpha / (BucketLatencyShare * r.Beta)
		mib := 1 << max(0, int(math.Ceil(math.Log2(need/(1<<20)))))
		capMiB := 1 << max(0, int(math.Ceil(math.Log2(g/(1<<20)))))
		mib = min(mib, capMiB)
		if mib <= DefaultBucketMiB {
			return events.Recommendation{}, false
		}
		calls := func(m int) float64 { return math.Ceil(g / float64(m<<20)) }
		gain := (calls(DefaultBucketMiB) - calls(mib)) * r.Alpha
		def := calls(DefaultBucketMiB)*r.Alpha + r.Beta*g
		if gain < tuning.MinGainSeconds || gain < tuning.MinGainFraction*def {
			return events.Recommendation{}, false
		}
		return events.Recommendation{Group: ph.Name, Collective: events.CollectiveAllReduce,
			BytesRange: events.ByteRange{Min: int64(mib) << 20, Max: int64(mib) << 20},
			Algorithm:  string(r.Chosen.Algorithm), Protocol: string(r.Chosen.Protocol), Kind: events.TuningBucket,
			Settings: []string{events.EnvBucketCapMB}, PredictedGainSeconds: gain,
			Reason: fmt.Sprintf("each all-reduce call costs %.3g ms of latency; %d buckets of %d MiB spend %.3g s of latency on %s of gradients against %.3g s of transfer; %d MiB buckets (%.0f calls) keep latency under %.0f%% of it",
				r.Alpha*1e3, int(calls(DefaultBucketMiB)), DefaultBucketMiB, calls(DefaultBucketMiB)*r.Alpha, formatBytes(g), r.Beta*g,
				mib, calls(mib), 100*BucketLatencyShare)}, true
	}
	return events.Recommendation{}, false
}

// bindings puts in the env what the prediction assumes of each rank and
// node: the rank's nearest NIC (the NIC the model routes it through), its
// NUMA node, and each node's topology file. They are bindings, not
// recommendations: on bare metal NCCL finds the same NICs itself, so the
// model predicts no gain from them; they keep a rank on what the
// prediction assumed (inside containers and VMs that hide the PCI tree),
// and they are what the nic_affinity diagnosis compares against.
func bindings(ev *events.RuntimeTuning, d *events.PlacementDecided) {
	nicsOnNode := map[string]map[string]bool{}
	for _, r := range d.Ranks {
		if r.NIC != "" {
			if nicsOnNode[r.Node] == nil {
				nicsOnNode[r.Node] = map[string]bool{}
			}
			nicsOnNode[r.Node][r.NIC] = true
		}
	}
	ranks := map[string]map[string]string{}
	pinned, bound := 0, 0
	for _, r := range d.Ranks {
		env := map[string]string{}
		// One NIC for every rank of a node is no choice to pin.
		if r.NIC != "" && len(nicsOnNode[r.Node]) > 1 {
			env["NCCL_IB_HCA"] = "=" + r.NIC
			pinned++
		}
		if r.NUMA != nil && *r.NUMA >= 0 {
			n := strconv.Itoa(*r.NUMA)
			env[events.EnvNUMANode] = n
			env[events.EnvNumactl] = "--cpunodebind=" + n + " --membind=" + n
			bound++
		}
		if len(env) > 0 {
			ranks[strconv.Itoa(r.Rank)] = env
		}
	}
	if len(ranks) > 0 {
		ev.Env.Ranks = ranks
	}
	if pinned > 0 {
		ev.Notes = append(ev.Notes, fmt.Sprintf("NCCL_IB_HCA pins %d ranks to their GPU's nearest NIC, the one the prediction routes them through", pinned))
	}
	if bound > 0 {
		ev.Notes = append(ev.Notes, fmt.Sprintf("%d ranks bound to their GPU's NUMA node (%s, %s)", bound, events.EnvNUMANode, events.EnvNumactl))
	}
	for _, np := range d.Nodes {
		if np.NCCLTopoXML == "" {
			continue
		}
		path := TopoFileDir + "/" + safeName(d.JobID) + "/" + safeName(np.Node) + ".xml"
		ev.Files = append(ev.Files, events.TuningFile{Node: np.Node, Path: path, Content: np.NCCLTopoXML})
		if ev.Env.Nodes == nil {
			ev.Env.Nodes = map[string]map[string]string{}
		}
		ev.Env.Nodes[np.Node] = map[string]string{"NCCL_TOPO_FILE": path}
	}
}

var unsafeChars = regexp.MustCompile(`[^A-Za-z0-9._-]`)

// safeName makes a job or node name one file name.
func safeName(s string) string {
	s = unsafeChars.ReplaceAllString(s, "_")
	if s == "" || s == "." || s == ".." {
		s = "_" + s
	}
	return s
}

// railFabric reports whether any node of the decision hangs below rail
// leaves.
func railFabric(f *topology.Fabric, d *events.PlacementDecided) bool {
	if f == nil {
		return false
	}
	for _, np := range d.Nodes {
		a, ok0 := f.LeafOf(np.Node, 0)
		b, ok1 := f.LeafOf(np.Node, 1)
		if ok0 && ok1 && a != b {
			return true
		}
	}
	return false
}

func nilIfEmpty(m map[string]string) map[string]string {
	if len(m) == 0 {
		return nil
	}
	return m
}

func formatBytes(b float64) string {
	for _, u := range []struct {
		s string
		m float64
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if b >= u.m {
			return strings.TrimSuffix(strconv.FormatFloat(b/u.m, 'f', 3, 64), ".000") + " " + u.s
		}
	}
	return strconv.FormatFloat(b, 'f', 0, 64) + " B"
}
