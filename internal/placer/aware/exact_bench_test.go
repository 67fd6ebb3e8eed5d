package aware

import (
	"fmt"
	"testing"

	"github.com/toposched/toposched/internal/fixtures"
	"github.com/toposched/toposched/internal/placer/engine"
	"github.com/toposched/toposched/internal/placer/outcome"
)

// BenchmarkExactInNode is the decision time of few-GPU jobs on a
// half-full 10k-GPU cluster of DGX H100 nodes with the exact in-node
// choice at its default budget and without it, side by side.
func BenchmarkExactInNode(b *testing.B) {
	snap := cluster(b, 1280, 0.5)
	for _, n := range []int{2, 3, 4} {
		for _, exact := range []int{0, -1} {
			b.Run(fmt.Sprintf("job=%d/node-exact=%v", n, exact == 0), func(b *testing.B) {
				j := fixtures.SyntheticJob("j", n, 2-n%2, 1)
				for b.Loop() {
					if r := Place(engine.Request{Snap: snap, Job: j, Options: engine.Options{NodeExact: exact}}); r.Verdict != outcome.Placed {
						b.Fatal(r.Reasons)
					}
				}
			})
		}
	}
}
