package optimizer

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/internal/collective"
	"github.com/toposched/toposched/services/optimizer/tuning"
)

// Thresholds of a diagnosis.
const (
	// SlowRatio: communication this many times the prediction, or more,
	// is slower than predicted. Below it the difference is within what
	// the model's validation shows at large messages (median 2.7%,
	// largest 23%) plus jitter.
	SlowRatio = 1.5
	// ComputeBoundFraction: a job whose measured communication is less
	// than this share of its step is compute bound; no setting or move
	// gains it much.
	ComputeBoundFraction = 0.10
)

// diagnose compares telemetry with the job's tuned prediction and finds
// the cause of a slowdown: in order, a degraded part of its placement
// (the store's health agrees), ranks on other NICs than recommended
// (telemetry says so), another live job on a link of its placement
// (congestion), else unexplained.
func (s *Service) diagnose(lj *liveJob, t *events.RuntimeTelemetry) *events.RuntimeDiagnosis {
	tu := lj.tuning
	comm := max(t.StepSeconds-t.ComputeSeconds, 0)
	ev := events.DiagnosisEvidence{
		MeasuredStepSeconds: t.StepSeconds, MeasuredComputeSeconds: t.ComputeSeconds,
		MeasuredCommSeconds: comm, PredictedCommSeconds: tu.PredictedCommSecondsPerStep,
		CommFraction: min(comm/t.StepSeconds, 1),
	}
	ev.Groups = compareGroups(tu, t)
	for _, g := range ev.Groups {
		ev.Ratio = max(ev.Ratio, g.Ratio)
	}
	if len(ev.Groups) == 0 && tu.PredictedCommSecondsPerStep > 0 {
		ev.Ratio = comm / tu.PredictedCommSecondsPerStep
	}
	dg := &events.RuntimeDiagnosis{JobID: t.JobID, Step: t.Step}
	slowest := ""
	if len(ev.Groups) > 0 {
		g := slices.MaxFunc(ev.Groups, func(a, b events.GroupEvidence) int {
			switch {
			case a.Ratio < b.Ratio:
				return -1
			case a.Ratio > b.Ratio:
				return 1
			}
			return 0
		})
		slowest = fmt.Sprintf("%s at %.2fx its predicted time", g.Group, g.Ratio)
		if g.MeasuredBusBWGBps > 0 && g.PredictedBusBWGBps > 0 {
			slowest += fmt.Sprintf(" (bus bandwidth %.0f%% of predicted)", 100*g.MeasuredBusBWGBps/g.PredictedBusBWGBps)
		}
	} else {
		slowest = fmt.Sprintf("communication at %.2fx its prediction", ev.Ratio)
	}
	switch {
	case ev.CommFraction < ComputeBoundFraction:
		dg.Finding = events.FindingComputeBound
		dg.Message = fmt.Sprintf("compute bound: communication is %.0f%% of the step; nothing to tune or move", 100*ev.CommFraction)
	case ev.Ratio < SlowRatio:
		dg.Finding = events.FindingAsPredicted
		dg.Message = fmt.Sprintf("communication as predicted (ratio %.2f)", ev.Ratio)
	default:
		s.explain(lj, t, &ev, dg, slowest)
	}
	dg.Evidence = ev
	return dg
}

// explain finds the cause of a slowdown.
func (s *Service) explain(lj *liveJob, t *events.RuntimeTelemetry, ev *events.DiagnosisEvidence, dg *events.RuntimeDiagnosis, slowest string) {
	if h := s.degraded(lj); len(h) > 0 {
		ev.Health = h
		dg.Finding = events.FindingLinkDegraded
		parts := make([]string, len(h))
		for i, r := range h {
			parts[i] = fmt.Sprintf("%s %s %s (%s)", r.Node, r.Component, r.ID, cmpOr(r.Reason, r.Health))
		}
		dg.Message = fmt.Sprintf("%s; unhealthy parts of its placement: %s", slowest, strings.Join(parts, ", "))
		// The store's effective topology already has the down links
		// taken out: re-predicting on it says what they cost.
		if p, err := s.predictWith(lj, nil); err == nil {
			ev.ExplainedSeconds = p
		}
		return
	}
	if nics := wrongNICs(lj, t); len(nics) > 0 {
		ev.NICs = nics
		dg.Finding = events.FindingNICAffinity
		dg.Message = fmt.Sprintf("%s; %d ranks use another NIC than their GPU's nearest (rank %d on %s: %s, recommended %s)",
			slowest, len(nics), nics[0].Rank, nics[0].Node, nics[0].Reported, nics[0].Recommended)
		return
	}
	if links := s.sharedLinks(lj); len(links) > 0 {
		ev.SharedLinks = links
		seen := map[string]bool{}
		var names []string
		for _, l := range links {
			for _, j := range l.Jobs {
				if !seen[j] {
					seen[j] = true
					names = append(names, j)
				}
			}
		}
		slices.Sort(names)
		ev.NeighbourJobs = names
		dg.Finding = events.FindingCongestion
		ls := make([]string, len(links))
		for i, l := range links {
			ls[i] = l.Link
		}
		dg.Message = fmt.Sprintf("%s; job(s) %s share %s with it", slowest, strings.Join(names, ", "), strings.Join(ls, ", "))
		if p, err := s.predictWith(lj, s.fairShare(links)); err == nil {
			ev.ExplainedSeconds = p
		}
		return
	}
	dg.Finding = events.FindingUnexplained
	dg.Message = slowest + "; no degraded link, NIC mismatch or neighbour on its links is known"
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// compareGroups pairs each reported group with its prediction. A group
// reported by bus bandwidth is compared by bandwidth; by time, by time.
// Groups the tuning does not know (not modelled) are left out.
func compareGroups(tu *events.RuntimeTuning, t *events.RuntimeTelemetry) []events.GroupEvidence {
	type pred struct {
		seconds, busbw, slowest float64
	}
	preds := map[string]*pred{}
	for _, g := range tu.Groups {
		for _, key := range []string{g.Name + "/" + g.Collective, g.Name + "/"} {
			p := preds[key]
			if p == nil {
				p = &pred{}
				preds[key] = p
			}
			p.seconds += g.SecondsPerStep
			if g.SecondsPerStep >= p.slowest {
				p.slowest, p.busbw = g.SecondsPerStep, g.BusBWGBps
			}
		}
	}
	var out []events.GroupEvidence
	for _, g := range t.Groups {
		p := preds[g.Group+"/"+g.Collective]
		if p == nil || p.seconds <= 0 {
			continue
		}
		e := events.GroupEvidence{Group: g.Group, PredictedSeconds: p.seconds, PredictedBusBWGBps: p.busbw, MeasuredBusBWGBps: g.BusBWGBps}
		switch {
		case g.Seconds > 0:
			e.MeasuredSeconds, e.Ratio = g.Seconds, g.Seconds/p.seconds
		case g.BusBWGBps > 0 && p.busbw > 0:
			e.Ratio = p.busbw / g.BusBWGBps
			e.MeasuredSeconds = p.seconds * e.Ratio
		default:
			continue
		}
		out = append(out, e)
	}
	return out
}

// degraded lists the unhealthy parts the store knows on the job's nodes
// that its placement uses: its GPUs, their NVLinks, the NICs its ranks go
// through, the nodes themselves.
func (s *Service) degraded(lj *liveJob) []events.TopologyHealth {
	gpus := map[string]map[string]bool{}
	nics := map[string]map[string]bool{}
	for _, r := range lj.decision.Ranks {
		if gpus[r.Node] == nil {
			gpus[r.Node], nics[r.Node] = map[string]bool{}, map[string]bool{}
		}
		gpus[r.Node][strconv.Itoa(r.GPU)] = true
		if r.NIC != "" {
			nics[r.Node][r.NIC] = true
		}
	}
	var out []events.TopologyHealth
	for _, node := range slices.Sorted(maps.Keys(gpus)) {
		recs := s.health[node]
		for _, key := range slices.Sorted(maps.Keys(recs)) {
			h := recs[key]
			switch h.Component {
			case events.ComponentNode:
			case events.ComponentGPU:
				if !gpus[node][h.ID] {
					continue
				}
			case events.ComponentNVLink:
				gpu, _, _ := strings.Cut(h.ID, "/")
				if !gpus[node][gpu] {
					continue
				}
			case events.ComponentNIC:
				// With no NIC known per rank, any NIC of the node may be
				// one the job goes through.
				if len(nics[node]) > 0 && !nics[node][h.ID] {
					continue
				}
			}
			out = append(out, h)
		}
	}
	return out
}

// wrongNICs lists the ranks whose reported NIC is not the one the tuning
// pinned them to (NCCL_IB_HCA), or, for a rank not pinned, not the
// decision's nearest NIC.
func wrongNICs(lj *liveJob, t *events.RuntimeTelemetry) []events.NICEvidence {
	var out []events.NICEvidence
	for _, r := range t.Ranks {
		if r.NIC == "" || r.Rank < 0 || r.Rank >= len(lj.decision.Ranks) {
			continue
		}
		rp := lj.decision.Ranks[r.Rank]
		want := rp.NIC
		if lj.tuning != nil {
			if hca := lj.tuning.Env.Ranks[strconv.Itoa(r.Rank)]["NCCL_IB_HCA"]; hca != "" {
				want = hca
			}
		}
		want = hcaName(want)
		if want == "" || hcaName(r.NIC) == want {
			continue
		}
		out = append(out, events.NICEvidence{Rank: r.Rank, Node: rp.Node, Recommended: want, Reported: r.NIC})
	}
	return out
}

// hcaName strips NCCL_IB_HCA's exact-match prefix and port: "=mlx5_0:1"
// is mlx5_0.
func hcaName(s string) string {
	s = strings.TrimPrefix(strings.TrimPrefix(s, "^"), "=")
	name, _, _ := strings.Cut(s, ":")
	return name
}

// sharedLinks finds the links of the job's placement that other live jobs
// use too: the uplinks of a leaf both cross (each spans leaves, and has
// nodes below it), and a node's NIC both send through across nodes.
func (s *Service) sharedLinks(lj *liveJob) []events.SharedLink {
	type use struct {
		leaves map[string]bool
		nics   map[string]bool // node:nic
	}
	usage := func(d *events.PlacementDecided) use {
		u := use{leaves: map[string]bool{}, nics: map[string]bool{}}
		nodes := map[string]bool{}
		for _, np := range d.Nodes {
			nodes[np.Node] = true
			if s.fabric != nil {
				if l, ok := s.fabric.LeafOf(np.Node, -1); ok {
					u.leaves[l] = true
				}
			}
		}
		if len(nodes) > 1 {
			for _, r := range d.Ranks {
				if r.NIC != "" {
					u.nics[r.Node+":"+r.NIC] = true
				}
			}
		}
		if len(u.leaves) < 2 {
			u.leaves = map[string]bool{} // under one leaf: no uplink crossed
		}
		return u
	}
	mine := usage(lj.decision)
	shared := map[string][]string{}
	for _, id := range slices.Sorted(maps.Keys(s.live)) {
		other := s.live[id]
		if id == lj.decision.JobID {
			continue
		}
		theirs := usage(other.decision)
		for l := range mine.leaves {
			if theirs.leaves[l] {
				shared["uplink:"+l] = append(shared["uplink:"+l], id)
			}
		}
		for n := range mine.nics {
			if theirs.nics[n] {
				shared["nic:"+n] = append(shared["nic:"+n], id)
			}
		}
	}
	var out []events.SharedLink
	for _, link := range slices.Sorted(maps.Keys(shared)) {
		out = append(out, events.SharedLink{Link: link, Jobs: shared[link]})
	}
	return out
}

// fairShare is the contention of shared links when each of k neighbours
// takes an equal share of a link: k/(k+1) of it is taken.
func (s *Service) fairShare(links []events.SharedLink) collective.Contention {
	snap := s.store.Snapshot()
	c := collective.Contention{}
	for _, l := range links {
		share := float64(len(l.Jobs)) / float64(len(l.Jobs)+1)
		switch {
		case strings.HasPrefix(l.Link, "uplink:"):
			leaf := strings.TrimPrefix(l.Link, "uplink:")
			c["uplink:"+leaf+":up"], c["uplink:"+leaf+":down"] = share, share
		case strings.HasPrefix(l.Link, "nic:"):
			// The model names a NIC by its position in the node's report.
			node, nic, _ := strings.Cut(strings.TrimPrefix(l.Link, "nic:"), ":")
			n, ok := snap.Node(node)
			if !ok || n.Topology == nil {
				continue
			}
			for k, x := range n.Topology.NICs {
				if x.Name == nic {
					key := "nic:" + node + ":" + strconv.Itoa(k)
					c[key+":tx"], c[key+":rx"] = share, share
				}
			}
		}
	}
	return c
}

// predictWith re-predicts the job under its tuned settings on the store's
// current topology with the given contention.
func (s *Service) predictWith(lj *liveJob, cont collective.Contention) (float64, error) {
	phases, err := phasesOf(s.store.Snapshot(), lj.decision, lj.spec)
	if err != nil {
		return 0, err
	}
	plan, err := tuning.Tune(tuning.Input{Phases: phases, Fabric: s.fabric, Bandwidths: s.bandwidths.Load(), Contention: cont})
	if err != nil {
		return 0, err
	}
	return plan.PredictedSeconds, nil
}
