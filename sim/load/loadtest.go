// Package loadtest measures placement under load, for `toposched load`:
// the decision time of the placement planner on synthetic clusters of 1k,
// 10k and 100k GPUs filled to a given occupancy, and the sustained rate of
// decisions end to end through NATS with every service running.
//
// The clusters are 8-GPU NVSwitch nodes (a built-in discovery model) on a
// rail-optimized leaf/spine fabric: pods of 32 nodes with one leaf per rail
// (8 rails, NIC k of every node on the pod's rail-k leaf, 2:1
// oversubscribed), 16 pods under a core switch, cores under a top switch.
// They are filled with a seeded random mix of jobs (1 to 64 GPUs; jobs of
// up to 8 GPUs take random free GPUs of a random node, larger ones whole
// random nodes), so the free GPUs are fragmented as a busy cluster's are.
package load

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/internal/fixtures"
	"github.com/toposched/toposched/internal/store"
	"github.com/toposched/toposched/internal/topology"
)

// Shape of the synthetic fabric.
const (
	NodeGPUs    = 8
	NodesPerPod = 32
	Rails       = 8
	PodsPerCore = 16
)

// Cluster is a built synthetic cluster: its store, filled, and its fabric.
type Cluster struct {
	GPUs   int
	Nodes  []string
	Model  string // the built-in node model
	Fabric *topology.Fabric
	Event  events.TopologyFabric
	Store  *store.Store
	// Held counts the GPUs the fill allocated; Jobs the jobs it placed.
	Held, Jobs int
	// Build is how long building and filling took.
	Build time.Duration
}

// FabricEvent describes the rail-optimized fabric over nodes (see the
// package doc).
func FabricEvent(nodes []string) events.TopologyFabric {
	return fixtures.RailFabric("load", nodes, fixtures.RailShape{NodesPerPod: NodesPerPod, Rails: Rails, PodsPerCore: PodsPerCore,
		LinkGbps: 400, Uplinks: 16, UplinkGbps: 400, Oversubscription: 2, SpineGbps: 400})
}

// NodeNames names n nodes node-00000, node-00001, ...
func NodeNames(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("node-%05d", i)
	}
	return out
}

// BuildCluster builds a cluster of gpus GPUs (rounded down to whole nodes)
// of the built-in node model and fills it to occupancy with a random job
// mix drawn from seed.
func BuildCluster(gpus int, model string, occupancy float64, seed uint64) (*Cluster, error) {
	start := time.Now()
	nodeEv, err := fixtures.ModelNode(model, "")
	if err != nil {
		return nil, err
	}
	if len(nodeEv.GPUs) != NodeGPUs {
		return nil, fmt.Errorf("node model %s has %d GPUs; the load cluster wants %d", model, len(nodeEv.GPUs), NodeGPUs)
	}
	names := NodeNames(gpus / NodeGPUs)
	if len(names) == 0 {
		return nil, fmt.Errorf("%d GPUs make no node of %d", gpus, NodeGPUs)
	}
	nodes := make([]fixtures.Node, len(names))
	for i, name := range names {
		nodes[i] = fixtures.Node{Event: nodeEv, Name: name}
	}
	fe := FabricEvent(names)
	fab, err := topology.NewFabric(fe)
	if err != nil {
		return nil, err
	}
	st, err := fixtures.NewStore(nodes, fab)
	if err != nil {
		return nil, err
	}
	c := &Cluster{GPUs: len(names) * NodeGPUs, Nodes: names, Model: model, Fabric: fab, Event: fe, Store: st}
	if err := c.fill(occupancy, seed); err != nil {
		return nil, err
	}
	c.Build = time.Since(start)
	return c, nil
}

// fillSizes is the job mix of the fill, with weights.
var fillSizes = []struct{ gpus, weight int }{{1, 20}, {2, 15}, {4, 15}, {8, 25}, {16, 10}, {32, 10}, {64, 5}}

// fill allocates random jobs until occupancy of the GPUs are held.
func (c *Cluster) fill(occupancy float64, seed uint64) error {
	rng := rand.New(rand.NewPCG(seed, uint64(c.GPUs)))
	free := make([][]int, len(c.Nodes)) // free GPU indices per node
	for i := range free {
		free[i] = []int{0, 1, 2, 3, 4, 5, 6, 7}
	}
	whole := make([]int, len(c.Nodes)) // nodes with every GPU free
	for i := range whole {
		whole[i] = i
	}
	totalWeight := 0
	for _, s := range fillSizes {
		totalWeight += s.weight
	}
	target := int(occupancy * float64(c.GPUs))
	for misses := 0; c.Held < target && misses < 1000; {
		w := rng.IntN(totalWeight)
		size := 0
		for _, s := range fillSizes {
			if w < s.weight {
				size = s.gpus
				break
			}
			w -= s.weight
		}
		size = min(size, target-c.Held)
		var keys []store.GPUKey
		if size <= NodeGPUs {
			// A random node with room, then random free GPUs of it.
			var node int
			found := false
			for range 64 {
				node = rng.IntN(len(c.Nodes))
				if len(free[node]) >= size {
					found = true
					break
				}
			}
			if !found {
				misses++
				continue
			}
			rng.Shuffle(len(free[node]), func(i, j int) { free[node][i], free[node][j] = free[node][j], free[node][i] })
			for _, g := range free[node][:size] {
				keys = append(keys, store.GPUKey{Node: c.Nodes[node], Index: g})
			}
			free[node] = free[node][size:]
			slices.Sort(free[node])
		} else {
			// Whole random nodes that are still whole.
			whole = slices.DeleteFunc(whole, func(i int) bool { return len(free[i]) < NodeGPUs })
			if len(whole) < size/NodeGPUs {
				misses++
				continue
			}
			rng.Shuffle(len(whole), func(i, j int) { whole[i], whole[j] = whole[j], whole[i] })
			for _, node := range whole[:size/NodeGPUs] {
				for g := range NodeGPUs {
					keys = append(keys, store.GPUKey{Node: c.Nodes[node], Index: g})
				}
				free[node] = nil
			}
		}
		c.Jobs++
		id := fmt.Sprintf("fill-%d", c.Jobs)
		if err := c.Store.Allocate(id, keys); err != nil {
			return err
		}
		// Recorded as running, as placement records its jobs: a policy
		// denial then waits (a finish could change it) rather than being
		// final.
		if err := c.Store.UpsertJob(store.Job{ID: id, State: store.JobPlaced}); err != nil {
			return err
		}
		c.Held += len(keys)
	}
	return nil
}

// Stats summarises latencies.
type Stats struct {
	N             int
	P50, P99, Max time.Duration
}

// StatsOf sorts d and reads its percentiles.
func StatsOf(d []time.Duration) Stats {
	if len(d) == 0 {
		return Stats{}
	}
	s := slices.Clone(d)
	slices.Sort(s)
	at := func(p int) time.Duration { return s[(len(s)-1)*p/100] }
	return Stats{N: len(s), P50: at(50), P99: at(99), Max: s[len(s)-1]}
}

// Decider makes one decision on a snapshot and returns its verdict
// ("placed", "wait", "never") and whether it failed.
type Decider func(ctx context.Context, snap *store.Snapshot, job events.JobAnalyzed) (string, error)

// TimeDecisions runs decide on the same snapshot until it has made max
// decisions or spent budget (at least min decisions), and returns their
// latencies and the verdict of the last.
func TimeDecisions(ctx context.Context, snap *store.Snapshot, job events.JobAnalyzed, decide Decider, minN, maxN int, budget time.Duration) ([]time.Duration, string, error) {
	var lat []time.Duration
	verdict := ""
	start := time.Now()
	for i := 0; i < maxN && (i < minN || time.Since(start) < budget); i++ {
		if err := ctx.Err(); err != nil {
			return lat, verdict, err
		}
		t0 := time.Now()
		v, err := decide(ctx, snap, job)
		lat = append(lat, time.Since(t0))
		if err != nil {
			return lat, v, err
		}
		verdict = v
	}
	return lat, verdict, nil
}

// FormatSize writes 1024 as 1k, 10000 as 10k, 100000 as 100k.
func FormatSize(n int) string {
	switch {
	case n >= 1000 && n%1000 == 0:
		return fmt.Sprintf("%dk", n/1000)
	case n >= 1000:
		return fmt.Sprintf("%.1fk", float64(n)/1000)
	}
	return fmt.Sprint(n)
}

// FormatDuration prints a latency in ms with 2 significant decimals.
func FormatDuration(d time.Duration) string {
	ms := float64(d.Microseconds()) / 1000
	switch {
	case ms >= 100:
		return fmt.Sprintf("%.0f ms", ms)
	case ms >= 10:
		return fmt.Sprintf("%.1f ms", ms)
	}
	return fmt.Sprintf("%.2f ms", ms)
}

// formatKB prints bytes in KB of 1,000 bytes, one decimal: both tables'
// alloc/decision, so that they compare.
func formatKB(bytes float64) string { return fmt.Sprintf("%.1f KB", bytes/1000) }

// table prints rows aligned under a header.
func table(out io.Writer, header []string, rows [][]string) error {
	width := make([]int, len(header))
	for i, h := range header {
		width[i] = len(h)
	}
	for _, r := range rows {
		for i, c := range r {
			width[i] = max(width[i], len(c))
		}
	}
	var all strings.Builder
	line := func(cells []string) {
		var b strings.Builder
		for i, c := range cells {
			if i > 0 {
				b.WriteString("  ")
			}
			if i == 0 {
				b.WriteString(c + strings.Repeat(" ", width[i]-len(c)))
			} else {
				b.WriteString(strings.Repeat(" ", width[i]-len(c)) + c)
			}
		}
		all.WriteString(strings.TrimRight(b.String(), " "))
		all.WriteString("\n")
	}
	line(header)
	for _, r := range rows {
		line(r)
	}
	_, err := io.WriteString(out, all.String())
	return err
}
