package store

import (
	"bytes"
	"cmp"
	"math"
	"math/rand/v2"
	"testing"
)

// TestAppendPositionKeepsOrder: keys compare as their positions do, over
// seeded pairs and the extremes, and each byte holds four bits.
func TestAppendPositionKeepsOrder(t *testing.T) {
	rng := rand.New(rand.NewPCG(15, 0))
	edge := []int{math.MinInt64, -1, 0, 1, 255, 256, 4095, 4096, math.MaxInt64}
	for i := range 20000 {
		a, b := int(rng.Int64N(1<<20))-1<<10, int(rng.Int64N(1<<20))-1<<10
		if i < len(edge)*len(edge) {
			a, b = edge[i/len(edge)], edge[i%len(edge)]
		}
		ka, kb := appendPosition(nil, a), appendPosition(nil, b)
		if len(ka) != positionKeyLen {
			t.Fatalf("key of %d has %d bytes, want %d", a, len(ka), positionKeyLen)
		}
		for _, c := range ka {
			if c > 0xf {
				t.Fatalf("key of %d has byte %#x: more than four bits", a, c)
			}
		}
		if got, want := bytes.Compare(ka, kb), cmp.Compare(a, b); got != want {
			t.Fatalf("keys of %d and %d compare %d, positions %d", a, b, got, want)
		}
	}
}
