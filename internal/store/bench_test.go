package store

import (
	"fmt"
	"runtime"
	"sync"
	"testing"

	"github.com/toposched/toposched/events"
)

const benchGPUsPerNode = 8

func benchReports(nodes int) []events.TopologyNode {
	out := make([]events.TopologyNode, nodes)
	for i := range out {
		out[i] = report(fmt.Sprintf("node-%05d", i), i, "H100", benchGPUsPerNode)
	}
	return out
}

// BenchmarkUpsertNode measures one node report applied to a full store of
// 1k or 10k nodes: "same" changes nothing (the periodic re-report), "changed"
// flips one GPU's health so a row and the free index are rewritten.
func BenchmarkUpsertNode(b *testing.B) {
	for _, nodes := range []int{1_000, 10_000} {
		reports := benchReports(nodes)
		s := newStore(b)
		mustUpsert(b, s, reports...)
		for _, mode := range []string{"same", "changed"} {
			b.Run(fmt.Sprintf("%dk/%s", nodes/1000, mode), func(b *testing.B) {
				b.ReportAllocs()
				for i := 0; b.Loop(); i++ {
					n := reports[i%nodes]
					if mode == "changed" {
						gpus := make([]events.GPU, len(n.GPUs))
						copy(gpus, n.GPUs)
						if (i/nodes)%2 == 0 {
							gpus[0].Health = events.HealthUnhealthy
						}
						n.GPUs = gpus
					}
					if err := s.UpsertNode(n); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// The cluster of the benchmarks below: nodes of 8 GPUs shaped like a
// DGX A100 (every GPU pair NV12, NUMA nodes of two GPUs, one NIC per GPU
// under its PCIe switch), 16 nodes per leaf (2 leaves per 32 nodes), pods
// of 8 leaves, one core. 1k, 10k and 100k GPUs are 125, 1250 and 12500
// nodes.
//
// Each size builds its store once (cached for the read benchmarks). A
// load of 100k GPUs takes seconds, so b.Loop runs it once; to run every
// benchmark once, at every size:
//
//	go test -run '^$' -bench . -benchtime 1x ./internal/store/
//
// and for steadier read figures, e.g.:
//
//	go test -run '^$' -bench 'Snapshot|FreeGPUs|Domain|Allocate' ./internal/store/
const (
	clusterNodesPerLeaf = 16
	clusterLeavesPerPod = 8
)

var clusterSizes = []struct {
	name string
	gpus int
}{{"1k", 1_000}, {"10k", 10_000}, {"100k", 100_000}}

var (
	dgxPaths = nvswitch(benchGPUsPerNode, 12)
	dgxNUMA  = []int{0, 0, 1, 1, 2, 2, 3, 3}
	dgxNICM  = dgxNICs(benchGPUsPerNode)
)

func clusterNodeName(i int) string { return fmt.Sprintf("node-%05d", i) }

// clusterReport is node i's report; bare leaves out the inner topology
// (matrices, NUMA, NICs). The matrices are shared between reports: the
// store parses them into its own.
func clusterReport(i int, bare bool) events.TopologyNode {
	name := clusterNodeName(i)
	n := report(name, i, "A100", benchGPUsPerNode)
	if bare {
		return n
	}
	n.GPUPaths, n.NICPaths, n.NVLinkGen, n.PCIeGen = dgxPaths, dgxNICM, 3, 4
	for g := range n.GPUs {
		n.GPUs[g].NUMA = &dgxNUMA[g]
		n.GPUs[g].MemoryMiB = 81920
	}
	for k := range benchGPUsPerNode {
		n.NICs = append(n.NICs, events.NIC{Name: fmt.Sprintf("mlx5_%d", k), RateGbps: 200, RDMA: true, NUMA: &dgxNUMA[k]})
	}
	return n
}

func clusterLeaf(i int) string { return fmt.Sprintf("leaf:l%04d", i/clusterNodesPerLeaf) }

// clusterFabric maps every node to its leaf, pod and core, as
// topology.Fabric.Domains would.
func clusterFabric(nodes int) map[string][]string {
	f := make(map[string][]string, nodes)
	for i := range nodes {
		leaf := i / clusterNodesPerLeaf
		f[clusterNodeName(i)] = []string{clusterLeaf(i), fmt.Sprintf("pod:p%03d", leaf/clusterLeavesPerPod), "core:c0"}
	}
	return f
}

// loadCluster fills a new store with a cluster of gpus GPUs; bare and
// noFabric leave out the inner topology and the fabric, fabricFirst gives
// the fabric before the nodes rather than after. Reports are built one at
// a time, so that the heap after a load holds the store alone.
func loadCluster(b *testing.B, gpus int, bare, noFabric, fabricFirst bool) *Store {
	s := newStore(b)
	nodes := gpus / benchGPUsPerNode
	fabric := func() {
		if err := s.UpsertFabric(clusterFabric(nodes)); err != nil {
			b.Fatal(err)
		}
	}
	if !noFabric && fabricFirst {
		fabric()
	}
	for i := range nodes {
		if err := s.UpsertNode(clusterReport(i, bare)); err != nil {
			b.Fatal(err)
		}
	}
	if !noFabric && !fabricFirst {
		fabric()
	}
	return s
}

func heapAlloc() uint64 {
	var m runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// BenchmarkLoad fills a store (UpsertNode for every node, then one
// UpsertFabric) and reports the heap it holds per GPU (HeapAlloc after GC,
// before and after). "bare" nodes have no inner topology and no fabric (the
// store of a plain cluster file), "topology" adds each node's matrices,
// NUMA and NICs (so islands and NUMA domains), "full" adds the fabric
// after the nodes (one transaction rewriting every GPU), "fabricfirst"
// before them (each node's GPUs get their domains as they are inserted).
func BenchmarkLoad(b *testing.B) {
	for _, size := range clusterSizes {
		for _, variant := range []string{"bare", "topology", "full", "fabricfirst"} {
			b.Run(size.name+"/"+variant, func(b *testing.B) {
				bare, noFabric := variant == "bare", variant == "bare" || variant == "topology"
				var perGPU float64
				for b.Loop() {
					b.StopTimer()
					before := heapAlloc()
					b.StartTimer()
					s := loadCluster(b, size.gpus, bare, noFabric, variant == "fabricfirst")
					b.StopTimer()
					perGPU = float64(heapAlloc()-before) / float64(size.gpus)
					runtime.KeepAlive(s)
					b.StartTimer()
				}
				b.ReportMetric(perGPU, "B/GPU")
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(size.gpus), "ns/GPU")
			})
		}
	}
}

var (
	loadedMu sync.Mutex
	loaded   = map[int]*Store{}
)

// loadedCluster returns the full store of a size, built once.
func loadedCluster(b *testing.B, gpus int) *Store {
	loadedMu.Lock()
	defer loadedMu.Unlock()
	if s, ok := loaded[gpus]; ok {
		return s
	}
	s := loadCluster(b, gpus, false, false, false)
	loaded[gpus] = s
	return s
}

// eachSize runs fn as a sub-benchmark per cluster size, with the full
// store of that size, its node count, and the timer reset.
func eachSize(b *testing.B, fn func(b *testing.B, s *Store, nodes int)) {
	for _, size := range clusterSizes {
		b.Run(size.name, func(b *testing.B) {
			s := loadedCluster(b, size.gpus)
			b.ReportAllocs()
			b.ResetTimer()
			fn(b, s, size.gpus/benchGPUsPerNode)
		})
	}
}

var snapSink *Snapshot

func BenchmarkSnapshot(b *testing.B) {
	eachSize(b, func(b *testing.B, s *Store, _ int) {
		for b.Loop() {
			snapSink = s.Snapshot()
		}
	})
}

// BenchmarkFreeGPUsIn reads the free GPUs of one domain: a leaf (128 GPUs)
// and a pod (1024, or all of a smaller cluster) through the domain index,
// an NVLink island (8) and a NUMA node (2) through the primary key's walk
// by node.
func BenchmarkFreeGPUsIn(b *testing.B) {
	for _, kind := range []string{"leaf", "pod", "island", "numa"} {
		b.Run(kind, func(b *testing.B) {
			eachSize(b, func(b *testing.B, s *Store, nodes int) {
				snap := s.Snapshot()
				id := func(i int) string {
					node := (i * 97) % nodes
					switch kind {
					case "leaf":
						return clusterLeaf(node)
					case "pod":
						return fmt.Sprintf("pod:p%03d", node/clusterNodesPerLeaf/clusterLeavesPerPod)
					case "island":
						return "island:" + clusterNodeName(node) + "/0"
					}
					return "numa:" + clusterNodeName(node) + "/1"
				}
				got := 0
				for i := 0; b.Loop(); i++ {
					got += len(snap.FreeGPUsIn(id(i), "A100"))
				}
				if got == 0 {
					b.Fatal("no free GPUs found")
				}
			})
		})
	}
}

// BenchmarkDomain looks one domain's counts up: a leaf, then an island.
func BenchmarkDomain(b *testing.B) {
	eachSize(b, func(b *testing.B, s *Store, nodes int) {
		snap := s.Snapshot()
		ids := make([]string, 0, 2*nodes)
		for i := range nodes {
			ids = append(ids, clusterLeaf(i), "island:"+clusterNodeName(i)+"/0")
		}
		free := 0
		for i := 0; b.Loop(); i++ {
			d, ok := snap.Domain(ids[(i*97)%len(ids)])
			if !ok {
				b.Fatal("domain not found")
			}
			free += d.FreeOf("A100")
		}
	})
}

// BenchmarkDomainsOfKind lists every leaf with its counts.
func BenchmarkDomainsOfKind(b *testing.B) {
	eachSize(b, func(b *testing.B, s *Store, _ int) {
		snap := s.Snapshot()
		for b.Loop() {
			_ = snap.DomainsOfKind(DomainLeaf)
		}
	})
}

// BenchmarkFreeGPUs reads one node's free GPUs.
func BenchmarkFreeGPUs(b *testing.B) {
	eachSize(b, func(b *testing.B, s *Store, nodes int) {
		snap := s.Snapshot()
		names := make([]string, nodes)
		for i := range names {
			names[i] = clusterNodeName(i)
		}
		for i := 0; b.Loop(); i++ {
			if len(snap.FreeGPUs(names[(i*97)%nodes])) != benchGPUsPerNode {
				b.Fatal("node not free")
			}
		}
	})
}

// BenchmarkFreeCount is the O(1) read of the cluster's free GPUs.
func BenchmarkFreeCount(b *testing.B) {
	eachSize(b, func(b *testing.B, s *Store, _ int) {
		snap := s.Snapshot()
		for b.Loop() {
			_ = snap.FreeByModel("A100")
		}
	})
}

// BenchmarkAllocateRelease gives a whole node (8 GPUs) to a job and takes
// it back: two write transactions, each rewriting 8 GPU rows and the 10
// domains they are in (island, 4 NUMA, node, leaf, pod, core, cluster).
func BenchmarkAllocateRelease(b *testing.B) {
	eachSize(b, func(b *testing.B, s *Store, nodes int) {
		gangs := make([][]GPUKey, nodes)
		for i := range gangs {
			gangs[i] = keys(clusterNodeName(i), 0, 1, 2, 3, 4, 5, 6, 7)
		}
		for i := 0; b.Loop(); i++ {
			if err := s.Allocate("bench", gangs[(i*97)%nodes]); err != nil {
				b.Fatal(err)
			}
			if _, err := s.Release("bench"); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkCycle is placement's cycle of one-GPU decisions: 28 in one
// transaction (the mean of a burst's cycles in toposched load --e2e),
// each GPU allocated, then the view the next decision reads taken and
// the cluster's free count read from it; the transaction is aborted, so
// every round starts from the same store. ns/decision is per decision.
func BenchmarkCycle(b *testing.B) {
	const perCycle = 28
	eachSize(b, func(b *testing.B, s *Store, nodes int) {
		round := 0
		for b.Loop() {
			tx := s.Begin()
			for j := range perCycle {
				node := clusterNodeName((round*perCycle + j) * 31 % nodes)
				if err := tx.Allocate(fmt.Sprint("job-", j), keys(node, j%benchGPUsPerNode)); err != nil {
					b.Fatal(err)
				}
				if tx.Snapshot().FreeByModel("") == 0 {
					b.Fatal("no free GPU")
				}
			}
			tx.Abort()
			round++
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*perCycle), "ns/decision")
	})
}
