package aware

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/internal/placer/outcome"
)

// BenchmarkPlaceSmall is the decision time of one- and few-GPU jobs (the
// bulk of a busy queue) on a half-full 10k-GPU cluster of DGX H100 nodes,
// with and without an explanation asked for, baseline included as the
// service runs it (PlaceWithBaseline).
func BenchmarkPlaceSmall(b *testing.B) {
	snap := cluster(b, 1280, 0.5)
	for _, n := range []int{1, 2, 8} {
		for _, explain := range []bool{false, true} {
			b.Run(fmt.Sprintf("gpus=10240/job=%d/explain=%v", n, explain), func(b *testing.B) {
				j := SyntheticJob("j", n, min(n, 8), 1)
				b.ReportAllocs()
				for b.Loop() {
					opts := Options{}
					if explain {
						opts.Explain = &Explain{}
					}
					if r, _ := PlaceWithBaseline(snap, j, opts); r.Verdict != outcome.Placed {
						b.Fatal(r.Reasons)
					}
				}
			})
		}
	}
}

var updateDigest = flag.Bool("update-digest", false, "rewrite testdata/decisions.sha256 from the current decisions")

// TestDecisionDigest holds every decision (verdict, GPUs, reasons and the
// explanation) of a seeded mix of clusters and jobs, filters and judges,
// one JSON line per case, to the SHA-256 kept in testdata/decisions.sha256:
// a speed-up must leave every decision as it was. A change that means to
// decide differently rewrites it with -update-digest. To see which cases
// differ, set TOPOSCHED_DECISION_DIGEST=file on both versions and diff the
// files. The local search is bounded by evaluations, not time, so the
// decisions do not depend on the machine's speed.
func TestDecisionDigest(t *testing.T) {
	var out strings.Builder
	for seed := range uint64(6) {
		rng := rand.New(rand.NewPCG(seed, 99))
		var specs []spec
		kinds := []events.TopologyNode{dgx(t, "", "dgx-h100"), dgx(t, "", "pcie-8gpu"), pairs(""),
			{GPUModel: "A100", GPUs: []events.GPU{{Index: 0}, {Index: 1}, {Index: 2}, {Index: 3}, {Index: 4}, {Index: 5}, {Index: 6}, {Index: 7}}}}
		nodes := 24 + rng.IntN(40)
		for i := range nodes {
			sp := spec{name: fmt.Sprintf("n%03d", i), ev: kinds[rng.IntN(len(kinds))]}
			occ := []float64{0.2, 0.5, 0.8}[rng.IntN(3)]
			for g := range len(sp.ev.GPUs) {
				switch {
				case rng.Float64() < occ:
					sp.held = append(sp.held, g)
				case rng.IntN(20) == 0:
					sp.unhealthy = append(sp.unhealthy, g)
				}
			}
			specs = append(specs, sp)
		}
		st := build(t, specs...)
		fab := map[string][]string{}
		for i, sp := range specs {
			fab[sp.name] = []string{fmt.Sprintf("leaf:l%d", i/4), fmt.Sprintf("pod:p%d", i/16)}
		}
		if err := st.UpsertFabric(fab); err != nil {
			t.Fatal(err)
		}
		snap := st.Snapshot()
		for _, n := range []int{1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64} {
			for _, tp := range []int{1, 2, 4, 8} {
				if n%tp != 0 {
					continue
				}
				for variant := range 6 {
					j := SyntheticJob("j", n, tp, 1)
					opts := Options{MaxEvals: 30, Budget: time.Hour, Explain: &Explain{}}
					switch variant {
					case 1:
						j.Job.GPUModel = "H100"
					case 2:
						j.Job.GPUsPerNode = min(n, tp)
					case 3:
						opts.Filter = func(n NodeView) bool { return n.Node.Name[len(n.Node.Name)-1]%3 != 0 }
					case 4:
						opts.Judge = func(c Candidate) Judgement {
							if strings.HasPrefix(c.Domain, "node:") || len(c.GPUs)%3 == 0 {
								return Judgement{Deny: true, Reasons: []events.Reason{{Code: "no", Message: c.Domain}}}
							}
							return Judgement{Score: float64(len(c.Domain)%3) / 4}
						}
					case 5:
						j.Job.GPUModel = "A10"
						opts.Explain = nil
					}
					ours, base := PlaceWithBaseline(snap, j, opts)
					var x any
					if opts.Explain != nil {
						x = opts.Explain
					}
					line, err := json.Marshal([]any{seed, n, tp, variant, ours, base, x})
					if err != nil {
						t.Fatal(err)
					}
					out.Write(line)
					out.WriteByte('\n')
				}
			}
		}
	}
	if path := os.Getenv("TOPOSCHED_DECISION_DIGEST"); path != "" {
		if err := os.WriteFile(path, []byte(out.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	sum := sha256.Sum256([]byte(out.String()))
	got := hex.EncodeToString(sum[:]) + "\n"
	golden := filepath.Join("testdata", "decisions.sha256")
	if *updateDigest {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run with -update-digest to write it)", err)
	}
	if got != string(want) {
		t.Errorf("decisions changed: digest %s, want %s; if that is meant, rerun with -update-digest (TOPOSCHED_DECISION_DIGEST=file writes the cases to diff)",
			strings.TrimSpace(got), strings.TrimSpace(string(want)))
	}
}
