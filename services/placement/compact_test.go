package placement

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/internal/placer"
	"github.com/toposched/toposched/internal/store"
)

// A 16-GPU job, TP 8, that fits only on the leftovers of eight nodes waits
// for a compact placement (placer.Compact) and starts on two nodes once
// they are free; with --max-stretch off it starts on the leftovers.
func TestCompactPlacementAwaited(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		stretch float64
		nodes   int // what the big job spans when first decided
	}{
		{name: "default", stretch: 0, nodes: 0},
		{name: "off", stretch: -1, nodes: 8},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			nodes := map[string]string{}
			for i := range 8 {
				nodes[fmt.Sprintf("n%d", i)] = "dgx-a100"
			}
			r := newClockedRig(t, Config{MaxStretch: tc.stretch}, nodes)
			submit := r.submit
			for i := range 8 { // six GPUs of every node busy
				if j := submit(events.JobSubmitted{JobID: fmt.Sprintf("x%d", i), GPUs: 6}); j.State != store.JobPlaced {
					t.Fatalf("x%d: %s", i, j.State)
				}
			}
			j := submit(bigTP8Job())
			if tc.nodes > 0 {
				if j.State != store.JobPlaced || len(spanned(j)) != tc.nodes {
					t.Fatalf("big: %s on %v, want placed on %d nodes", j.State, spanned(j), tc.nodes)
				}
				return
			}
			if j.State != store.JobPending || len(j.Reasons) != 1 || j.Reasons[0].Code != placer.CodeCompactAwaited {
				t.Fatalf("big: %s %+v, want pending for %s", j.State, j.Reasons, placer.CodeCompactAwaited)
			}
			r.finish("x0")
			r.finish("x1")
			j = r.job("big")
			if j.State != store.JobPlaced || !slices.Equal(spanned(j), []string{"n0", "n1"}) {
				t.Fatalf("big after n0 and n1 emptied: %s on %v, want placed on n0, n1", j.State, spanned(j))
			}
		})
	}
}

// spanned lists the nodes a placed job's decision names, sorted.
func spanned(j store.Job) []string {
	var out []string
	if j.Decision == nil {
		return nil
	}
	for _, r := range j.Decision.Ranks {
		if !slices.Contains(out, r.Node) {
			out = append(out, r.Node)
		}
	}
	slices.Sort(out)
	return out
}

// A bound below 1 would keep every spread waiting, even the ideal one.
func TestMaxStretchValidated(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		stretch float64
		ok      bool
	}{{0, true}, {-1, true}, {1, true}, {1.5, true}, {0.5, false}, {math.NaN(), false}, {math.Inf(1), false}} {
		err := Config{MaxStretch: tc.stretch}.Validate()
		if (err == nil) != tc.ok || (err != nil && !strings.Contains(err.Error(), "max stretch")) {
			t.Errorf("MaxStretch %v: %v, want ok %v (an error naming max stretch)", tc.stretch, err, tc.ok)
		}
	}
}

// A compute reference must be a GPU model the speed table knows, or
// every candidate's compute would be priced at an unknown pace.
func TestComputeReferenceValidated(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		ref string
		ok  bool
	}{{"", true}, {"a100", true}, {"H100-SXM5-80GB", true}, {"MI300X", false}} {
		err := Config{ComputeReference: tc.ref}.Validate()
		if (err == nil) != tc.ok || (err != nil && !strings.Contains(err.Error(), "compute reference")) {
			t.Errorf("ComputeReference %q: %v, want ok %v (an error naming compute reference)", tc.ref, err, tc.ok)
		}
	}
}
