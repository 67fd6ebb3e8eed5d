package store

import (
	"fmt"
	"runtime"
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

// BenchmarkFill builds a store of 1k or 10k nodes from scratch and reports
// the heap it holds per GPU.
func BenchmarkFill(b *testing.B) {
	for _, nodes := range []int{1_000, 10_000} {
		reports := benchReports(nodes)
		b.Run(fmt.Sprintf("%dk", nodes/1000), func(b *testing.B) {
			var perGPU float64
			for b.Loop() {
				var before, after runtime.MemStats
				runtime.GC()
				runtime.ReadMemStats(&before)
				s := newStore(b)
				mustUpsert(b, s, reports...)
				runtime.GC()
				runtime.ReadMemStats(&after)
				perGPU = float64(after.HeapAlloc-before.HeapAlloc) / float64(nodes*benchGPUsPerNode)
				runtime.KeepAlive(s)
			}
			b.ReportMetric(perGPU, "heapB/gpu")
		})
	}
}
