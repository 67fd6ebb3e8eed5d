package collective

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/toposched/toposched/internal/topology"
)

func TestTuningFor(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in             string
		tables         string // the release whose tables apply
		nvls, nvlsTree bool
		err            string
	}{
		{in: "", tables: "2.20.3", nvls: true, nvlsTree: true},
		{in: "2.20.3", tables: "2.20.3", nvls: true, nvlsTree: true},
		{in: "v2.21.5", tables: "2.26.6", nvls: true, nvlsTree: true},
		{in: "2.26.2", tables: "2.26.6", nvls: true, nvlsTree: true},
		{in: "2.20.5", tables: "2.20.3", nvls: true, nvlsTree: true},
		{in: "2.18", tables: "2.20.3", nvls: true, nvlsTree: true},
		{in: "2.17.1", tables: "2.20.3", nvls: true},
		{in: "2.16.5", tables: "2.7.5"},
		{in: "2.7.8-1", tables: "2.7.5"},
		{in: "3.0", err: "expected 2.MINOR"},
		{in: "2", err: "expected 2.MINOR"},
		{in: "two.twenty", err: `nccl version "two.twenty"`},
		{in: "2.-1", err: "expected 2.MINOR"},
		{in: "2.20.x", err: "expected 2.MINOR"},
		{in: "2.20.3.1", err: "expected 2.MINOR"},
	} {
		got, err := TuningFor(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("TuningFor(%q): %v, want an error with %q", tc.in, err, tc.err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("TuningFor(%q): %v", tc.in, err)
		}
		base := map[string]*Tuning{"2.7.5": Tuning27, "2.20.3": Tuning220, "2.26.6": Tuning226}[tc.tables]
		if got.HWLat != base.HWLat || got.NVLSLat != base.NVLSLat || got.NVLSTreeChunk != base.NVLSTreeChunk || !slices.Equal(got.LL128, base.LL128) ||
			got.NVLS != tc.nvls || got.NVLSTree != tc.nvlsTree {
			t.Errorf("TuningFor(%q): tables %v, nvls latency %v, nvls-tree chunk %v, LL128 %v, nvls %v, nvls-tree %v; want %s's, %v, %v",
				tc.in, got.HWLat, got.NVLSLat, got.NVLSTreeChunk, got.LL128, got.NVLS, got.NVLSTree, tc.tables, tc.nvls, tc.nvlsTree)
		}
	}
}

// protoNodes are the machines the protocol tests run on.
func protoNodes(nics int, transport string) map[string][]*topology.Node {
	mk := func(s NodeSpec, n int) []*topology.Node {
		var out []*topology.Node
		for i := range n {
			s.Name = fmt.Sprintf("%s-%d", s.Name, i)
			s.NICs, s.NICGbps, s.Transport = nics, 200, transport
			out = append(out, BuildNode(s))
		}
		return out
	}
	pcie := NodeSpec{Name: "rtx", GPUs: 8, Model: "RTX 4090", PCIeGen: 4}
	return map[string][]*topology.Node{
		"a100":  mk(a100, 1),
		"h100":  mk(h100, 1),
		"pcie":  mk(pcie, 1),
		"a100x": mk(a100, 2),
		"h100x": mk(h100, 2),
	}
}

func TestProtocolChoice(t *testing.T) {
	t.Parallel()
	ib, efa, tcp := protoNodes(4, ""), protoNodes(4, topology.TransportEFA), protoNodes(8, topology.TransportTCP)
	for _, tc := range []struct {
		name   string
		nodes  []*topology.Node
		tun    *Tuning
		bytes  float64
		algo   Algorithm
		want   Protocol
		enable []Protocol // what ring may run (nil: not checked)
	}{
		{name: "a100 tiny", nodes: ib["a100"], bytes: 4 << 10, algo: Ring, want: LL, enable: Protocols},
		{name: "a100 large", nodes: ib["a100"], bytes: 1 << 30, algo: Ring, want: Simple},
		{name: "pcie no ll128", nodes: ib["pcie"], bytes: 4 << 10, algo: Ring, want: LL, enable: []Protocol{LL, Simple}},
		{name: "h100 2.7 no ll128", nodes: ib["h100"], tun: Tuning27, bytes: 4 << 10, algo: Ring, want: LL, enable: []Protocol{LL, Simple}},
		{name: "a100 efa simple only", nodes: efa["a100x"], bytes: 4 << 10, algo: Ring, want: Simple, enable: []Protocol{Simple}},
		{name: "h100 efa (p5) all", nodes: efa["h100x"], bytes: 4 << 10, algo: Ring, want: LL, enable: Protocols},
		{name: "h100 tcp no ll", nodes: tcp["h100x"], bytes: 4 << 10, algo: Ring, want: LL128, enable: []Protocol{LL128, Simple}},
		{name: "a100 ib multi", nodes: ib["a100x"], bytes: 1 << 30, algo: Ring, want: Simple, enable: Protocols},
		{name: "nvls simple", nodes: ib["h100"], bytes: 1 << 20, algo: NVLS, want: Simple},
	} {
		p := Placement{Ranks: NodesRanks(tc.nodes, len(tc.nodes[0].GPUs))}
		r, err := Predict(p, AllReduce, tc.bytes, Options{Algorithm: tc.algo, Tuning: tc.tun})
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if r.Protocol != tc.want {
			t.Errorf("%s: protocol %s, want %s", tc.name, r.Protocol, tc.want)
		}
		if tc.enable == nil {
			continue
		}
		for _, pr := range Protocols {
			_, err := Predict(p, AllReduce, tc.bytes, Options{Algorithm: tc.algo, Protocol: pr, Tuning: tc.tun})
			if on := slices.Contains(tc.enable, pr); on != (err == nil) {
				t.Errorf("%s: %s: %v, want enabled %v", tc.name, pr, err, on)
			}
			if err != nil && !errors.Is(err, ErrNotApplicable) {
				t.Errorf("%s: %s: %v, want ErrNotApplicable", tc.name, pr, err)
			}
		}
	}
}

func TestNVLSTree(t *testing.T) {
	t.Parallel()
	ib, tcp := protoNodes(8, ""), protoNodes(8, topology.TransportTCP)
	for _, tc := range []struct {
		name  string
		nodes []*topology.Node
		tun   *Tuning
		want  bool
	}{
		{"h100 over ib", ib["h100x"], nil, true},
		{"h100 one node", ib["h100"], nil, false},
		{"a100 (nvlink 3)", ib["a100x"], nil, false},
		{"h100 over tcpxo", tcp["h100x"], nil, false},
		{"nccl 2.17", ib["h100x"], must(TuningFor("2.17"))(t), false},
	} {
		p := Placement{Ranks: NodesRanks(tc.nodes, 8)}
		if got := slices.Contains(Algorithms(p, AllReduce, tc.tun), NVLSTree); got != tc.want {
			t.Errorf("%s: nvls_tree applies %v, want %v", tc.name, got, tc.want)
		}
		r, err := Predict(p, AllReduce, 1<<32, Options{Algorithm: NVLSTree, Tuning: tc.tun})
		if tc.want != (err == nil) {
			t.Errorf("%s: predict nvls_tree: %v", tc.name, err)
		}
		if err == nil && !strings.HasPrefix(r.Bottleneck, "nic:") {
			// 8 GPUs' NVLS ports out-carry 8 NICs of 200 Gb/s: the network
			// bounds it.
			t.Errorf("%s: bottleneck %s, want a NIC", tc.name, r.Bottleneck)
		}
	}
}

func must[T any](v T, err error) func(*testing.T) T {
	return func(t *testing.T) T {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
}

// TestProtocolProperties checks, on seeded random machines, placements and
// sizes, that NCCL's choice is the fastest protocol it enables, that
// every protocol's prediction is at least its latency-free bandwidth
// bound's, and that a job of one group takes what Predict says (the job
// path scales its flows and steps as the single prediction does).
func TestProtocolProperties(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(14, 15))
	specs := []NodeSpec{a100, h100, {Name: "pcie", GPUs: 8, Model: "L40S", PCIeGen: 4},
		{Name: "v100", GPUs: 8, Model: "V100", NVLinks: 6, NVLinkGen: 2, PCIeGen: 3}}
	transports := []string{"", topology.TransportEFA, topology.TransportTCP}
	colls := []Collective{AllReduce, AllGather, ReduceScatter}
	for i := range 2000 {
		spec := specs[rng.IntN(len(specs))]
		spec.NICs, spec.NICGbps, spec.Transport = 1+rng.IntN(8), 100*float64(1+rng.IntN(4)), transports[rng.IntN(3)]
		nn := 1 + rng.IntN(4)
		var nodes []*topology.Node
		for k := range nn {
			s := spec
			s.Name = fmt.Sprintf("n%d", k)
			nodes = append(nodes, BuildNode(s))
		}
		g := 1 + rng.IntN(8)
		if nn == 1 {
			g = 2 + rng.IntN(7)
		}
		p := Placement{Ranks: NodesRanks(nodes, g)}
		c := colls[rng.IntN(len(colls))]
		bytes := math.Ldexp(1, 8+rng.IntN(27))
		tun := []*Tuning{Tuning27, Tuning220}[rng.IntN(2)]
		label := fmt.Sprintf("case %d: %s %d nodes x %d %s/%q %s %g bytes nccl %s", i, spec.Name, nn, g, spec.Name, spec.Transport, c, bytes, tun.Version)
		for _, a := range Algorithms(p, c, tun) {
			if !slices.Contains(NCCLAlgorithms, a) {
				continue
			}
			auto, err := Predict(p, c, bytes, Options{Algorithm: a, Tuning: tun})
			if err != nil {
				t.Fatalf("%s: %s: %v", label, a, err)
			}
			for _, pr := range Protocols {
				r, err := Predict(p, c, bytes, Options{Algorithm: a, Protocol: pr, Tuning: tun})
				if errors.Is(err, ErrNotApplicable) {
					if pr == auto.Protocol {
						t.Fatalf("%s: %s: chose %s, which does not run: %v", label, a, pr, err)
					}
					continue
				}
				if err != nil {
					t.Fatalf("%s: %s/%s: %v", label, a, pr, err)
				}
				if r.TimeSeconds < auto.TimeSeconds*(1-1e-12) {
					t.Fatalf("%s: %s: chose %s (%g s) over %s (%g s)", label, a, auto.Protocol, auto.TimeSeconds, pr, r.TimeSeconds)
				}
				j, err := EvaluateJob(Job{Tuning: tun, Groups: []Group{{Name: "g", Collective: c, Ranks: p.Ranks, Bytes: bytes, Algorithm: a, Protocol: pr}}})
				if err != nil {
					t.Fatalf("%s: job %s/%s: %v", label, a, pr, err)
				}
				if d := math.Abs(j.CommSeconds - r.TimeSeconds); d > 1e-9*r.TimeSeconds {
					t.Fatalf("%s: %s/%s: job %g s, predict %g s", label, a, pr, j.CommSeconds, r.TimeSeconds)
				}
			}
		}
	}
}

func TestComputeCapability(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		gen   int
		model string
		want  int
	}{
		{3, "", 80}, {4, "", 90}, {0, "NVIDIA A100-PCIE-40GB", 80}, {0, "NVIDIA A10", 86}, {0, "NVIDIA H200", 90},
		{0, "NVIDIA GeForce RTX 4090", 89}, {0, "Tesla V100-SXM2-32GB", 70}, {0, "NVIDIA B200", 100}, {0, "Quadro RTX 6000", 75}, {0, "", 0},
	} {
		n := &topology.Node{NVLinkGen: tc.gen, GPUs: []topology.GPU{{Model: tc.model}}}
		if got := ComputeCapability(n); got != tc.want {
			t.Errorf("ComputeCapability(gen %d, %q) = %d, want %d", tc.gen, tc.model, got, tc.want)
		}
	}
}

func FuzzTuningFor(f *testing.F) {
	for _, s := range []string{"", "2.20.3", "v2.18", "2.7.8-1", "3.0", "2.", "2.-1", "2.99999999999999999999"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		tun, err := TuningFor(s)
		if err != nil {
			if !strings.Contains(err.Error(), "nccl version") {
				t.Fatalf("TuningFor(%q): %v does not name the field", s, err)
			}
			return
		}
		if tun == nil || tun.HWLat[hwNet][rowRing][2] <= 0 {
			t.Fatalf("TuningFor(%q): %+v", s, tun)
		}
	})
}

func FuzzParseProtocol(f *testing.F) {
	for _, s := range []string{"", "LL", "ll128", " Simple ", "auto", "ll64"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		p, err := ParseProtocol(s)
		if err != nil {
			if !strings.Contains(err.Error(), "protocol") {
				t.Fatalf("ParseProtocol(%q): %v", s, err)
			}
			return
		}
		if p != AutoProtocol && !slices.Contains(Protocols, p) {
			t.Fatalf("ParseProtocol(%q) = %q", s, p)
		}
	})
}

// NVLS inside a node takes its table's latency (NCCL 2.20.3: 23 us, no
// base latency), scaled as the other figures with a calibrated per-step
// overhead.
func TestNVLSLatencyIsTheTables(t *testing.T) {
	t.Parallel()
	p := Placement{Ranks: NodeRanks(BuildNode(h100))}
	r, err := Predict(p, AllReduce, 0, Options{Algorithm: NVLS})
	if err != nil {
		t.Fatal(err)
	}
	if math.Abs(r.TimeSeconds-Tuning220.NVLSLat*1e-6) > 1e-12 {
		t.Errorf("NVLS at 0 bytes: %g s, want the table's %g us", r.TimeSeconds, Tuning220.NVLSLat)
	}
	cal := &Calibration{Version: CalibrationVersion, Efficiency: topology.Efficiency{StepOverheadUS: 2 * StepOverheadUS}}
	p.Bandwidths = cal.Bandwidths(nil)
	slow, err := Predict(p, AllReduce, 0, Options{Algorithm: NVLS})
	if err != nil {
		t.Fatal(err)
	}
	if slow.TimeSeconds <= r.TimeSeconds {
		t.Errorf("a doubled per-step overhead gives %g s, not above %g", slow.TimeSeconds, r.TimeSeconds)
	}
}

// A calibrated overhead of a call (topology.Efficiency.OpOverheadUS) adds
// to every call's time once, whatever its algorithm, protocol or size, so
// it moves no choice; a job's step pays it once a call.
func TestCallOverhead(t *testing.T) {
	t.Parallel()
	nodes := []*topology.Node{BuildNode(with(h100, func(s *NodeSpec) { s.NICs, s.NICGbps = 8, 400 })), BuildNode(with(h100, func(s *NodeSpec) { s.Name, s.NICs, s.NICGbps = "h100b", 8, 400 }))}
	plain := Placement{Ranks: NodesRanks(nodes, 8)}
	slow := plain
	slow.Bandwidths = (&Calibration{Version: CalibrationVersion, Efficiency: topology.Efficiency{OpOverheadUS: 40}}).Bandwidths(nil)
	for _, c := range []Collective{AllReduce, AllGather, SendRecv, AllToAll} {
		for _, bytes := range []float64{0, 1 << 20, 1 << 30} {
			a, err := Predict(plain, c, bytes, Options{Candidates: NCCLAlgorithms})
			if err != nil {
				t.Fatal(err)
			}
			b, err := Predict(slow, c, bytes, Options{Candidates: NCCLAlgorithms})
			if err != nil {
				t.Fatal(err)
			}
			if d := b.TimeSeconds - a.TimeSeconds; math.Abs(d-40e-6) > 1e-12 || a.Algorithm != b.Algorithm || a.Protocol != b.Protocol {
				t.Errorf("%s of %g bytes: %s/%s in %g s, with the overhead %s/%s in %g s (+%g s, want +40 us)",
					c, bytes, a.Algorithm, a.Protocol, a.TimeSeconds, b.Algorithm, b.Protocol, b.TimeSeconds, d)
			}
		}
	}
	job := func(bw *topology.Bandwidths) float64 {
		s, err := CommSeconds(Job{Bandwidths: bw, Groups: []Group{{Name: "dp", Collective: AllReduce, Ranks: plain.Ranks, Bytes: 64 << 20, Calls: 3}}})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	if d := job(slow.Bandwidths) - job(nil); math.Abs(d-3*40e-6) > 1e-12 {
		t.Errorf("a step of three calls: +%g s, want three overheads (+120 us)", d)
	}
}
