package placer

import (
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/internal/placer/aware"
	"github.com/toposched/toposched/internal/placer/engine"
	"github.com/toposched/toposched/internal/placer/outcome"
	"github.com/toposched/toposched/internal/store"
	"github.com/toposched/toposched/internal/topology"
)

// Ideals finds jobs' communication per step on an ideal placement, the
// Compact rule's yardstick: topology-aware's choice on the store's
// cluster with nothing running (store.Emptied). Answers are kept per job
// shape while the topology, fabric and bandwidths stay as they were. Not
// safe for concurrent use: the placement service calls it under its
// lock.
type Ideals struct {
	Store      *store.Store
	Fabric     *topology.Fabric
	Bandwidths *topology.Bandwidths
	// Budget is topology-aware's local-search budget (Planner.SearchBudget).
	Budget time.Duration

	version uint64
	fabric  *topology.Fabric
	bw      *topology.Bandwidths
	empty   *store.Snapshot
	comm    map[string]float64
}

// idealsLimit bounds the cache: shapes are few, but nothing stops a
// stream of jobs from making each one new.
const idealsLimit = 4096

// Comm is the job's communication per step on an ideal placement, NaN
// when topology-aware cannot place it on the empty cluster.
func (c *Ideals) Comm(job events.JobAnalyzed) float64 {
	if !c.refresh() {
		return math.NaN()
	}
	key := idealKey(job)
	if t, ok := c.comm[key]; ok {
		return t
	}
	t := c.commOn(job, nil)
	c.comm[key] = t
	return t
}

// CommOn is the job's communication per step on topology-aware's choice
// among the given nodes with nothing running on them, NaN when they
// cannot hold it. Answers are kept as Comm's are: a head's hold is made
// again each time its nodes can no longer hold it, mostly over the same
// sets, and each answer is a placement on the emptied cluster (some 45 ms
// at 100k GPUs).
func (c *Ideals) CommOn(job events.JobAnalyzed, nodes map[string]bool) float64 {
	if !c.refresh() {
		return math.NaN()
	}
	key := idealKey(job) + "\x00" + strings.Join(slices.Sorted(maps.Keys(nodes)), ",")
	if t, ok := c.comm[key]; ok {
		return t
	}
	t := c.commOn(job, func(v engine.NodeView) bool { return nodes[v.Node.Name] })
	c.comm[key] = t
	return t
}

// refresh makes the emptied snapshot again when the cluster changed;
// false when the store cannot be emptied.
func (c *Ideals) refresh() bool {
	v := c.Store.Snapshot().TopologyVersion()
	if c.empty == nil || c.version != v || c.fabric != c.Fabric || c.bw != c.Bandwidths || len(c.comm) >= idealsLimit {
		empty, err := c.Store.Emptied()
		if err != nil {
			return false
		}
		c.version, c.fabric, c.bw, c.empty, c.comm = v, c.Fabric, c.Bandwidths, empty.Snapshot(), map[string]float64{}
	}
	return true
}

func (c *Ideals) commOn(job events.JobAnalyzed, filter func(engine.NodeView) bool) float64 {
	opts := engine.Options{Fabric: c.Fabric, Bandwidths: c.Bandwidths, Budget: c.Budget, Filter: filter}
	if r := aware.Place(engine.Request{Snap: c.empty, Job: job, Options: opts}); r.Verdict == outcome.Placed {
		if p, err := aware.PredictWith(c.empty, job, r.GPUs, opts); err == nil {
			return p.CommSeconds
		}
	}
	return math.NaN()
}

// idealKey names what a job's communication on a placement depends on:
// its size, GPU model and shares per node, and its analysed groups.
func idealKey(job events.JobAnalyzed) string {
	b, err := json.Marshal(struct {
		GPUs, GPUsPerNode int
		Model             string
		Order             []string
		Groups            []events.RankGroups
	}{job.Job.GPUs, job.Job.GPUsPerNode, job.Job.GPUModel, job.Order, job.Groups})
	if err != nil {
		return fmt.Sprint(job.Job.GPUs, job.Job.GPUsPerNode, job.Job.GPUModel, job.Job.JobID)
	}
	return string(b)
}
