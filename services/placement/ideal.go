package placement

import (
	"encoding/json"
	"fmt"
	"math"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/internal/placer"
	"github.com/toposched/toposched/internal/placer/aware"
	"github.com/toposched/toposched/internal/placer/outcome"
	"github.com/toposched/toposched/internal/store"
)

// ideals caches jobs' communication per step on an ideal placement (see
// placer.Compact): topology-aware's choice on the cluster with nothing
// running, per job shape, while the topology stays as it was.
type ideals struct {
	version uint64
	empty   *store.Snapshot
	comm    map[string]float64
}

// idealsLimit bounds the cache: shapes are few, but nothing stops a
// stream of jobs from making each one new.
const idealsLimit = 4096

// compact is the Compact rule of the service's state; nil when it is off.
func (s *Service) compact() *placer.Compact {
	if s.maxStretch <= 0 || s.reserveAfter < 0 || s.strategy != placer.StrategyTopologyAware {
		return nil
	}
	return &placer.Compact{MaxStretch: s.maxStretch, Ideal: s.ideal}
}

// ideal is the job's communication per step on an ideal placement, NaN
// when none is found. It runs under s.mu, inside a decision.
func (s *Service) ideal(job events.JobAnalyzed) float64 {
	snap := s.store.Snapshot()
	c := &s.ideals
	if c.empty == nil || c.version != snap.TopologyVersion() || len(c.comm) >= idealsLimit {
		empty, err := s.store.Emptied()
		if err != nil {
			s.log.Warn("ideal placements", "err", err)
			return math.NaN()
		}
		*c = ideals{version: snap.TopologyVersion(), empty: empty.Snapshot(), comm: map[string]float64{}}
	}
	key := idealKey(job)
	if v, ok := c.comm[key]; ok {
		return v
	}
	v := math.NaN()
	opts := aware.Options{Fabric: s.fabric, Bandwidths: s.bandwidths.Load(), Budget: s.searchBudget}
	if r := aware.Place(c.empty, job, opts); r.Verdict == outcome.Placed {
		if p, err := aware.PredictWith(c.empty, job, r.GPUs, opts); err == nil {
			v = p.CommSeconds
		}
	}
	c.comm[key] = v
	return v
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
