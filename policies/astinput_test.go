package policies

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/toposched/toposched/events"
)

// TestInputValueAsJSON checks, on seeded random inputs, that the inputs
// built as AST are the ones json.Marshal and ast.ValueFromReader built
// before: equal as values and spelled alike (sprintf's %v in a policy's
// message prints the spelling), field order included.
func TestInputValueAsJSON(t *testing.T) {
	rng := rand.New(rand.NewPCG(14, 15))
	for i := range 3000 {
		pin := randomPlacementInput(rng).normal()
		got, err := pin.value()
		if err != nil {
			t.Fatalf("case %d: %v", i, err)
		}
		assertAsJSON(t, fmt.Sprintf("placement case %d", i), pin, got)
		nin := randomNodeInput(rng).normal()
		assertAsJSON(t, fmt.Sprintf("node case %d", i), nin, nin.value())
	}
}

func assertAsJSON(t *testing.T, name string, in any, got ast.Value) {
	t.Helper()
	b, err := json.Marshal(in)
	if err != nil {
		t.Fatalf("%s: marshal: %v", name, err)
	}
	want, err := ast.ValueFromReader(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("%s: parse: %v", name, err)
	}
	if ast.Compare(got, want) != 0 || got.String() != want.String() {
		t.Fatalf("%s:\n got  %s\n want %s", name, got, want)
	}
}

// TestNonFiniteCandidateFailsClosed: json.Marshal refused a NaN or an
// infinite prediction, which denied the candidate; the AST input does too.
func TestNonFiniteCandidateFailsClosed(t *testing.T) {
	s, _, err := Check(t.Context(), Default, "default")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []float64{math.NaN(), math.Inf(1), math.Inf(-1)} {
		in := PlacementInput{Job: Job{ID: "j", GPUs: 1}, Placement: Candidate{Prediction: Prediction{CommSecondsPerStep: f}}}
		r, err := s.EvalPlacement(t.Context(), in)
		if err == nil || len(r.Deny) != 1 || r.Deny[0].Code != CodePolicyError {
			t.Errorf("prediction %v: result %+v, error %v; want a policy_error denial", f, r, err)
		}
	}
}

var inputWords = []string{"", "a", "node-00001", "H100", "NVIDIA A100-SXM4-80GB", "leaf:pod-1/rail-3", "tenant \"x\"", "é✓", "<&>", "\u2028"}

func randomWord(rng *rand.Rand) string { return inputWords[rng.IntN(len(inputWords))] }

func randomWords(rng *rand.Rand) []string {
	if rng.IntN(4) == 0 {
		return nil
	}
	out := make([]string, rng.IntN(4))
	for i := range out {
		out[i] = randomWord(rng)
	}
	return out
}

func randomInt(rng *rand.Rand) int {
	switch rng.IntN(4) {
	case 0:
		return 0
	case 1:
		return rng.IntN(9)
	case 2:
		return -rng.IntN(1000)
	}
	return rng.IntN(1 << 40)
}

// randomFloat covers the magnitudes where encoding/json switches between
// its 'f' and 'e' forms, and exponents of one and of several digits.
func randomFloat(rng *rand.Rand) float64 {
	switch rng.IntN(6) {
	case 0:
		return 0
	case 1:
		return float64(rng.IntN(1000))
	case 2:
		return rng.Float64()
	}
	f := math.Pow(10, float64(rng.IntN(60)-30)) * (1 + rng.Float64())
	if rng.IntN(3) == 0 {
		f = -f
	}
	return f
}

// randomMap is nil a third of the time, else up to three entries.
func randomMap[V any](rng *rand.Rand, key func() string, val func() V) map[string]V {
	if rng.IntN(3) == 0 {
		return nil
	}
	m := map[string]V{}
	for range rng.IntN(4) {
		m[key()] = val()
	}
	return m
}

func randomLabels(rng *rand.Rand) map[string]string {
	return randomMap(rng, func() string { return randomWord(rng) + randomWord(rng) }, func() string { return randomWord(rng) })
}

func randomCounts(rng *rand.Rand) map[string]int {
	return randomMap(rng, func() string { return randomWord(rng) }, func() int { return randomInt(rng) })
}

func randomJob(rng *rand.Rand) Job {
	j := Job{
		ID: randomWord(rng), Tenant: randomWord(rng), Priority: randomInt(rng), GPUs: randomInt(rng),
		GPUsPerNode: randomInt(rng), GPUModel: randomWord(rng), Labels: randomLabels(rng),
		Parallelism: events.Parallelism{TP: rng.IntN(3), PP: rng.IntN(3), DP: rng.IntN(3), EP: rng.IntN(3), CP: rng.IntN(3)},
	}
	for range rng.IntN(3) {
		j.Groups = append(j.Groups, Group{Dimension: randomWord(rng), Name: randomWord(rng), Size: randomInt(rng), Count: randomInt(rng)})
	}
	return j
}

func randomPlacementInput(rng *rand.Rand) PlacementInput {
	in := PlacementInput{Job: randomJob(rng)}
	for range rng.IntN(4) {
		in.Placement.Nodes = append(in.Placement.Nodes, PlacedNode{Name: randomWord(rng), GPUModel: randomWord(rng),
			GPUs: randomInt(rng), GPUsTotal: randomInt(rng), GPUsFree: randomInt(rng)})
	}
	for range rng.IntN(3) {
		g := GroupSpan{NVLinkDomains: randomWords(rng)}
		if rng.IntN(4) > 0 {
			g.Ranks = []int{}
			for range rng.IntN(5) {
				g.Ranks = append(g.Ranks, randomInt(rng))
			}
		}
		in.Placement.TPGroups = append(in.Placement.TPGroups, g)
	}
	in.Placement.Leaves, in.Placement.Pods = randomWords(rng), randomWords(rng)
	in.Placement.Prediction = Prediction{CommSecondsPerStep: randomFloat(rng), CommFraction: randomFloat(rng)}
	in.Cluster = Cluster{FreeGPUs: randomInt(rng), FreeGPUsByModel: randomCounts(rng),
		WholeFreeNodes: randomInt(rng), WholeFreeNodesByModel: randomCounts(rng)}
	return in
}

func randomNodeInput(rng *rand.Rand) NodeInput {
	return NodeInput{
		Job: randomJob(rng).Class(),
		Node: Node{Name: randomWord(rng), Labels: randomLabels(rng), GPUModel: randomWord(rng),
			GPUs: NodeGPUs{Total: randomInt(rng), Free: randomInt(rng)}, Domains: randomWords(rng), Version: randomWord(rng)},
	}
}
