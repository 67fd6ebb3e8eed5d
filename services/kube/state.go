package kube

import (
	"encoding/json"
	"strconv"
	"strings"
	"time"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/events/bus"
)

// What the service knows from the streams: its jobs (those whose id
// starts with JobIDPrefix), what placement said of them, and each node's
// GPUs and holds as the topology stream last gave them. It is rebuilt from
// the streams at start (replayed, then followed: follow), never stored.

// JobIDPrefix starts the id of every job this service submits.
const JobIDPrefix = "k8s:"

// jobState is one job the service submitted, as the streams tell it.
type jobState struct {
	id      string
	gang    string // Gang.Key
	members string // the member pods' fingerprint (jobID's hash)
	attempt int
	decided *events.PlacementDecided
	// pending is placement's latest reason the job waits, "" once decided.
	pending string
	// rejected is placement's or analysis's refusal, "" if none.
	rejected string
	// finished: a jobs.finished or placement.released was seen.
	finished bool
	// failed says why its decision could not be carried out, for a job
	// finished as launch_failed: its pods' claims cannot be met (a
	// selector that fails, a count the decision cannot give), so the same
	// pods are not submitted again.
	failed string
	// carried is set once this replica has carried the decision out
	// (every pod bound), so that a look before its pod cache shows the
	// bindings does not try again.
	carried bool
	// conflictSince is when carrying out its decision first found a
	// decided GPU allocated to another claim (zero: it has not).
	conflictSince time.Time
}

// nodeGPUs is a node's GPUs as its topology.node listed them.
type nodeGPUs struct {
	gpus []events.GPU
}

// apply takes one record of the jobs, placement or topology streams into
// the state; the caller holds mu. It reports the job or node the record
// changed ("" for none) so that the caller can reconcile it.
func (s *Service) apply(r bus.Record) (job, node string) {
	switch r.Name.Domain() {
	case events.DomainJobs, events.DomainPlacement:
		// The ce-subject is the job id: other jobs' events, most of
		// those streams, are passed over without decoding them.
		if !strings.HasPrefix(r.Env.Subject, JobIDPrefix) {
			return "", ""
		}
		return s.applyJob(r), ""
	}
	return "", s.applyTopology(r)
}

// applyJob takes one of this service's jobs' events into the state and
// returns the job's id.
func (s *Service) applyJob(r bus.Record) string {
	var id string
	var apply func(j *jobState)
	switch r.Name {
	case events.NameJobSubmitted:
		if ev, ok := decoded[events.JobSubmitted](s, r); ok {
			id, apply = ev.JobID, func(j *jobState) { s.setGang(j, ev.Labels[LabelGang]) }
		}
	case events.NameJobFinished:
		if ev, ok := decoded[events.JobFinished](s, r); ok {
			id, apply = ev.JobID, func(j *jobState) {
				s.finished(j)
				if ev.Reason == events.ReasonLaunchFailed {
					j.failed = ev.Message
				}
			}
		}
	case events.NamePlacementDecided:
		if ev, ok := decoded[events.PlacementDecided](s, r); ok {
			id, apply = ev.JobID, func(j *jobState) { j.decided, j.pending = ev, "" }
		}
	case events.NamePlacementPending:
		if ev, ok := decoded[events.PlacementPending](s, r); ok {
			id, apply = ev.JobID, func(j *jobState) { j.pending = reasonsText(ev.Reasons) }
		}
	case events.NamePlacementRejected:
		if ev, ok := decoded[events.PlacementRejected](s, r); ok {
			id, apply = ev.JobID, func(j *jobState) { j.rejected = reasonsText(ev.Reasons) }
		}
	case events.NamePlacementReleased:
		if ev, ok := decoded[events.PlacementReleased](s, r); ok {
			id, apply = ev.JobID, s.finished
		}
	}
	if apply == nil || !strings.HasPrefix(id, JobIDPrefix) {
		return ""
	}
	apply(s.job(id))
	return id
}

// decoded reads a record's body as a T.
func decoded[T any](s *Service, r bus.Record) (*T, bool) {
	var ev T
	return &ev, s.decode(r, &ev)
}

// applyTopology takes a node's GPUs, its holds or the fabric into the
// state and returns the node, "" for the fabric.
func (s *Service) applyTopology(r bus.Record) string {
	switch r.Name {
	case events.NameTopologyNode:
		var ev events.TopologyNode
		if !s.decode(r, &ev) {
			return ""
		}
		if ev.Removed {
			delete(s.topo, ev.Name)
		} else {
			s.topo[ev.Name] = &nodeGPUs{gpus: ev.GPUs}
		}
		return ev.Name
	case events.NameTopologyFabric:
		var ev events.TopologyFabric
		if !s.decode(r, &ev) {
			return ""
		}
		if ev.Cluster == FabricCluster {
			key, _ := json.Marshal(ev.Switches)
			s.fabricSeen, s.fabricForeign = string(key), false
		} else {
			// A cluster file's fabric: it describes the switches
			// better than labels do.
			s.fabricForeign = len(ev.Switches) > 0
		}
		return ""
	case events.NameTopologyHeld:
		var ev events.TopologyHeld
		if !s.decode(r, &ev) {
			return ""
		}
		s.heldSeen[ev.Node] = heldKey(ev.GPUs)
		return ev.Node
	}
	return ""
}

// decode reads a record's body; one that does not decode is left alone
// (the services that own the event dead-letter it).
func (s *Service) decode(r bus.Record, v any) bool {
	if err := s.bus.Decode(r.Name, r.Body, v); err != nil {
		s.log.Debug("event skipped", "event", r.Name, "seq", r.Seq, "err", err)
		return false
	}
	return true
}

// job returns the state of a job id, made on first sight; the caller
// holds mu.
func (s *Service) job(id string) *jobState {
	j, ok := s.jobs[id]
	if !ok {
		j = &jobState{id: id}
		j.members, j.attempt = parseJobID(id)
		s.jobs[id] = j
		if j.attempt > s.attempts[j.members] {
			s.attempts[j.members] = j.attempt
		}
	}
	return j
}

// setGang records a job's gang; the caller holds mu.
func (s *Service) setGang(j *jobState, gang string) {
	j.gang = gang
	if gang == "" || j.finished {
		return
	}
	if s.byGang[gang] == nil {
		s.byGang[gang] = map[string]bool{}
	}
	s.byGang[gang][j.id] = true
}

// finished records a job's end; the caller holds mu.
func (s *Service) finished(j *jobState) {
	j.finished = true
	if ids := s.byGang[j.gang]; ids != nil {
		delete(ids, j.id)
		if len(ids) == 0 {
			delete(s.byGang, j.gang)
		}
	}
}

// sources are what the service reads: its jobs' submissions and
// finishes, placement's answers, and the nodes' GPUs and holds.
var sources = []bus.Source{
	{Domain: events.DomainJobs, Names: []events.Name{events.NameJobSubmitted, events.NameJobFinished}},
	{Domain: events.DomainPlacement, Names: []events.Name{events.NamePlacementDecided, events.NamePlacementPending,
		events.NamePlacementRejected, events.NamePlacementReleased}},
	{Domain: events.DomainTopology, Names: []events.Name{events.NameTopologyNode, events.NameTopologyHeld, events.NameTopologyFabric}},
}

// rebuilt takes a record of the rebuild into the state.
func (s *Service) rebuilt(r bus.Record) {
	s.mu.Lock()
	s.apply(r)
	s.mu.Unlock()
}

// followed takes a record read after the rebuild into the state and
// queues what it changed.
func (s *Service) followed(r bus.Record) {
	s.mu.Lock()
	job, node := s.apply(r)
	s.mu.Unlock()
	if job != "" {
		s.queue.Add(jobKey(job))
	}
	if node != "" {
		s.queue.Add(nodeKey(node))
		s.queue.Add(fabricKey)
	}
}

// reasonsText renders placement's reasons for an Event on a pod.
func reasonsText(rs []events.Reason) string {
	parts := make([]string, 0, len(rs))
	for _, r := range rs {
		parts = append(parts, r.Code+": "+r.Message)
	}
	return strings.Join(parts, "; ")
}

// heldKey is a node's holds in one comparable string.
func heldKey(gpus []events.HeldGPU) string {
	var b strings.Builder
	for _, g := range gpus {
		b.WriteString(strconv.Itoa(g.Index))
		b.WriteByte('=')
		b.WriteString(g.By)
		b.WriteByte(';')
	}
	return b.String()
}
