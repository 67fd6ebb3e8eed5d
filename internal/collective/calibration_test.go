package collective

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"strings"
	"testing"

	"github.com/toposched/toposched/internal/topology"
)

// truth measures with known efficiencies: the samples a cluster whose
// links achieve eff would give.
func truth(t *testing.T, p Placement, eff topology.Efficiency, c Collective, sizes ...float64) []Sample {
	t.Helper()
	bw := (&Calibration{Efficiency: eff}).Bandwidths(nil)
	var out []Sample
	for i, b := range sizes {
		q := p
		q.Bandwidths = bw
		r, err := Predict(q, c, b, Options{Candidates: NCCLAlgorithms})
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, Sample{Placement: p, Collective: c, Algorithm: Auto, Bytes: b, BusBWGBps: r.BusBWGBps, Source: fmt.Sprintf("m.txt:%d", i+1)})
	}
	return out
}

// A sweep of one collective recovers the links' efficiencies, and with
// them predicts the other collectives on the same machine.
func TestFitCalibration(t *testing.T) {
	t.Parallel()
	pcie := BuildNode(NodeSpec{Name: "pcie", GPUs: 8, Model: "L40S", PCIeGen: 4, PCIePath: func(a, b int) topology.Class {
		if a/4 == b/4 {
			return topology.PXB
		}
		return topology.SYS
	}})
	nv := BuildNode(NodeSpec{Name: "nv", GPUs: 8, Model: "A100", NVLinks: 12, NVLinkGen: 3, PCIeGen: 4, NICs: 4, NICGbps: 200})
	nv2 := BuildNode(NodeSpec{Name: "nv2", GPUs: 8, Model: "A100", NVLinks: 12, NVLinkGen: 3, PCIeGen: 4, NICs: 4, NICGbps: 200})
	efa := func(name string) *topology.Node {
		return BuildNode(NodeSpec{Name: name, GPUs: 8, Model: "A100", NVLinks: 12, NVLinkGen: 3, PCIeGen: 4, NICs: 4, NICGbps: 100,
			Transport: topology.TransportEFA})
	}
	for _, tc := range []struct {
		name string
		p    Placement
		eff  topology.Efficiency
		kind string
	}{
		{"PCIe server", Placement{Ranks: NodeRanks(pcie)}, topology.Efficiency{PCIe: 0.55}, "pcie"},
		{"NVSwitch node", Placement{Ranks: NodeRanks(nv)}, topology.Efficiency{NVLink: 0.7}, "nvlink"},
		{"two nodes over the network", Placement{Ranks: NodesRanks([]*topology.Node{nv, nv2}, 8)}, topology.Efficiency{Net: 0.6, OpOverheadUS: 30}, "net"},
		// Faster than NCCL's tables: no call overhead, steps fitted down.
		{"NVSwitch node faster than the tables", Placement{Ranks: NodeRanks(nv2)}, topology.Efficiency{NVLink: 0.75, StepOverheadUS: 0.9}, "nvlink"},
		// EFA NICs are their own kind: fitting them leaves InfiniBand's
		// efficiency as it was.
		{"two nodes over EFA", Placement{Ranks: NodesRanks([]*topology.Node{efa("e1"), efa("e2")}, 8)}, topology.Efficiency{EFA: 0.5}, topology.TransportEFA},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			samples := truth(t, tc.p, tc.eff, AllReduce, 1<<20, 256<<20, 1<<30, 4<<30)
			cal, err := FitCalibration("test", samples, nil)
			if err != nil {
				t.Fatal(err)
			}
			if len(cal.Fits) != 1 || cal.Fits[0].Kind != tc.kind || cal.Fits[0].Samples != 3 {
				t.Fatalf("fits %+v, want one of %s from 3 samples", cal.Fits, tc.kind)
			}
			want := tc.eff.NVLink + tc.eff.PCIe + tc.eff.Net + tc.eff.EFA
			if got := cal.Fits[0].Efficiency; math.Abs(got-want) > 0.01*want {
				t.Errorf("%s efficiency %.4f, want %.4f", tc.kind, got, want)
			}
			// The 1 MiB sample fits the overhead of a call; where the
			// machine has none, or is faster than the tables, the per-step
			// overhead instead.
			wantLat := (&Calibration{Efficiency: tc.eff}).Resolved()
			gotLat := cal.Resolved()
			if cal.Latency == nil || math.Abs(gotLat.OpOverheadUS-wantLat.OpOverheadUS) > 0.05*wantLat.OpOverheadUS ||
				math.Abs(gotLat.StepOverheadUS-wantLat.StepOverheadUS) > 0.05*wantLat.StepOverheadUS {
				t.Errorf("latency %+v: call %.2f us, step %.2f us; want %.2f and %.2f", cal.Latency, gotLat.OpOverheadUS, gotLat.StepOverheadUS, wantLat.OpOverheadUS, wantLat.StepOverheadUS)
			}
			if tc.kind == topology.TransportEFA && cal.Resolved().Net != EffNet {
				t.Errorf("fitting EFA moved the network's efficiency to %.4f", cal.Resolved().Net)
			}
			// The other collectives, never measured.
			for _, c := range []Collective{AllGather, ReduceScatter} {
				meas := truth(t, tc.p, tc.eff, c, 1<<30)[0]
				r, err := predictWith(meas, cal.Bandwidths(nil))
				if err != nil {
					t.Fatal(err)
				}
				if e := math.Abs(r.BusBWGBps-meas.BusBWGBps) / meas.BusBWGBps; e > 0.02 {
					t.Errorf("%s: predicted %.2f GB/s, measured %.2f (%.1f%% off)", c, r.BusBWGBps, meas.BusBWGBps, 100*e)
				}
			}
		})
	}
}

// A fit of several kinds is one answer, whatever order they are visited
// in: a transport still at the network's efficiency (EFA here) is scaled
// from the efficiency its samples were predicted with, not from the
// network's fit of the same round. Go visits a map's keys in a new order
// each time, so repeated fits of one input show any dependence on it.
func TestFitCalibrationOrderFree(t *testing.T) {
	t.Parallel()
	node := func(name, transport string) *topology.Node {
		return BuildNode(NodeSpec{Name: name, GPUs: 8, Model: "A100", NVLinks: 12, NVLinkGen: 3, PCIeGen: 4, NICs: 4, NICGbps: 100,
			Transport: transport})
	}
	ib := Placement{Ranks: NodesRanks([]*topology.Node{node("i1", ""), node("i2", "")}, 8)}
	efa := Placement{Ranks: NodesRanks([]*topology.Node{node("e1", topology.TransportEFA), node("e2", topology.TransportEFA)}, 8)}
	samples := append(truth(t, ib, topology.Efficiency{Net: 0.6}, AllReduce, 256<<20, 1<<30, 4<<30),
		truth(t, efa, topology.Efficiency{EFA: 0.5}, AllReduce, 256<<20, 1<<30, 4<<30)...)
	first, err := FitCalibration("test", samples, nil)
	if err != nil {
		t.Fatal(err)
	}
	for range 40 {
		cal, err := FitCalibration("test", samples, nil)
		if err != nil {
			t.Fatal(err)
		}
		if cal.Efficiency != first.Efficiency {
			t.Fatalf("one input fitted two ways: %+v and %+v", first.Efficiency, cal.Efficiency)
		}
	}
	if got := first.Resolved(); math.Abs(got.Net-0.6) > 0.006 || math.Abs(got.EFA-0.5) > 0.005 {
		t.Errorf("net %.4f, EFA %.4f; want 0.6 and 0.5", got.Net, got.EFA)
	}
}

func TestFitCalibrationRefuses(t *testing.T) {
	t.Parallel()
	pcie := BuildNode(NodeSpec{Name: "pcie", GPUs: 4, PCIeGen: 4})
	p := Placement{Ranks: NodeRanks(pcie)}
	for _, tc := range []struct {
		name    string
		samples []Sample
		want    []string
	}{
		{"above line rate", []Sample{{Placement: p, Collective: AllReduce, Bytes: 1 << 30, BusBWGBps: 230, Source: "nv.txt:26"}},
			[]string{"nv.txt:26", "above", "line rate", "not of this topology"}},
		{"nothing large", []Sample{{Placement: p, Collective: AllReduce, Bytes: 1 << 20, BusBWGBps: 5, Source: "s.txt:3"}},
			[]string{"no measurement of 134217728 bytes or more"}},
		{"negative", []Sample{{Placement: p, Collective: AllReduce, Bytes: 1 << 30, BusBWGBps: -1, Source: "n.txt:4"}},
			[]string{"n.txt:4", "positive"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := FitCalibration("x", tc.samples, nil)
			if err == nil {
				t.Fatal("accepted")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
}

func TestParseCalibration(t *testing.T) {
	t.Parallel()
	good := `{"version": 1, "name": "n", "efficiency": {"pcie": 0.6}}`
	c, err := ParseCalibration("c.json", []byte(good))
	if err != nil || c.Efficiency.PCIe != 0.6 {
		t.Fatalf("%+v %v", c, err)
	}
	for _, tc := range []struct{ name, in, want string }{
		{"syntax", "{\n  \"version\": 1,\n  \"efficiency\": {\"pcie\": 0.6,}\n}", "c.json:3: "},
		{"above line rate", "{\"version\": 1,\n \"efficiency\": {\n  \"nvlink\": 1.5}}", "c.json:3: efficiency.nvlink: 1.5: expected a share of line rate"},
		{"negative", "{\"version\": 1,\n \"efficiency\": {\"net\": -0.2}}", "c.json:2: efficiency.net: -0.2"},
		{"version", `{"version": 2, "efficiency": {}}`, "c.json:1: version: 2: expected 1"},
		{"unknown field", "{\"version\": 1,\n \"efficiency\": {\"pcei\": 0.5}}", `c.json:2: json: unknown field "pcei"`},
		{"cut off", "{\"version\": 1,\n \"efficiency\": {\"pcie\": 0.5", "c.json:2: cut off"},
		{"empty", " \n", "c.json: empty"},
		{"wrong type", "{\"version\": 1,\n\n \"efficiency\": {\"pcie\": \"fast\"}}", "c.json:3: efficiency.pcie: string: expected float64"},
		{"trailing", `{"version": 1, "efficiency": {}} {}`, "data after the JSON object"},
		{"fit kind", "{\"version\": 1, \"efficiency\": {},\n \"fits\": [\n {\"kind\": \"nvlink\", \"efficiency\": 0.8, \"samples\": 1, \"ratio\": 1, \"sources\": []},\n {\"kind\": \"ib\", \"efficiency\": 0.8, \"samples\": 1, \"ratio\": 1, \"sources\": []}]}",
			`c.json:4: fits[1].kind: "ib": expected one of nvlink, nvls, pcie, net`},
		// Issue 46: a set pushed with net 1e-300 predicted 10^297 s a step.
		{"tiny efficiency", "{\"version\": 1,\n \"efficiency\": {\"net\": 1e-300}}", "c.json:2: efficiency.net: 1e-300: below the floor 0.001 of line rate for net links"},
		{"tiny model efficiency", "{\"version\": 1, \"efficiency\": {},\n \"models\": {\n  \"A100\": {\"nvlink\": 0.001}}}",
			"c.json:3: models.A100.nvlink: 0.001: below the floor 0.05 of line rate for nvlink links"},
		{"tiny fit", "{\"version\": 1, \"efficiency\": {\"pcie\": 0.6},\n \"fits\": [\n {\"kind\": \"pcie\", \"efficiency\": 0.0001, \"samples\": 1, \"ratio\": 1, \"sources\": []}]}",
			"c.json:3: fits[0].efficiency: 0.0001: below the floor 0.03 of line rate for pcie links"},
		{"fit disagrees", "{\"version\": 1, \"efficiency\": {\"net\": 0.9},\n \"fits\": [\n {\"kind\": \"net\", \"efficiency\": 0.5, \"samples\": 3, \"ratio\": 0.5, \"sources\": [\"a.txt:9\"]}]}",
			"c.json:3: fits[0].efficiency: 0.5: disagrees with efficiency.net = 0.9, the value in force"},
		{"fit disagrees with a default", "{\"version\": 1, \"efficiency\": {},\n \"fits\": [\n {\"kind\": \"nvls\", \"efficiency\": 0.3, \"samples\": 3, \"ratio\": 0.5, \"sources\": []}]}",
			"c.json:3: fits[0].efficiency: 0.3: disagrees with efficiency.nvls = 0.611 (0: the default)"},
		{"model fit disagrees", "{\"version\": 1, \"efficiency\": {\"nvlink\": 0.7},\n \"models\": {\"H100\": {\"nvlink\": 0.75}},\n \"fits\": [\n {\"kind\": \"nvlink\", \"model\": \"H100\", \"efficiency\": 0.7, \"samples\": 3, \"ratio\": 1, \"sources\": []}]}",
			"c.json:4: fits[0].efficiency: 0.7: disagrees with models.H100.nvlink = 0.75"},
		{"fit of no model entry", "{\"version\": 1, \"efficiency\": {},\n \"fits\": [\n {\"kind\": \"nvlink\", \"model\": \"H100\", \"efficiency\": 0.8, \"samples\": 3, \"ratio\": 1, \"sources\": []}]}",
			`c.json:3: fits[0].model: "H100": no models entry`},
		{"latency disagrees", "{\"version\": 1, \"efficiency\": {\"step_overhead_us\": 4},\n \"latency\": {\"step_overhead_us\": 40, \"samples\": 2, \"sources\": []}}",
			"c.json:2: latency.step_overhead_us: 40: disagrees with efficiency.step_overhead_us = 4"},
		{"model latency disagrees", "{\"version\": 1, \"efficiency\": {}, \"models\": {\"H100\": {\"step_overhead_us\": 4}},\n \"model_latency\": [\n {\"model\": \"H100\", \"step_overhead_us\": 9, \"samples\": 2, \"sources\": []}]}",
			"c.json:3: model_latency[0].step_overhead_us: 9: disagrees with models.H100.step_overhead_us = 4"},
		// A call's overhead (what fitLatency fits): within 0 to 1000 µs, a
		// fit agreeing with the value in force, a fit of one overhead.
		{"negative call overhead", "{\"version\": 1,\n \"efficiency\": {\"op_overhead_us\": -2}}",
			"c.json:2: efficiency.op_overhead_us: -2: expected 0 to 1000"},
		{"call overhead fit disagrees", "{\"version\": 1, \"efficiency\": {\"op_overhead_us\": 30},\n \"latency\": {\"op_overhead_us\": 3, \"samples\": 2, \"sources\": []}}",
			"c.json:2: latency.op_overhead_us: 3: disagrees with efficiency.op_overhead_us = 30"},
		{"call overhead fit of none in force", "{\"version\": 1, \"efficiency\": {},\n \"latency\": {\"op_overhead_us\": 3, \"samples\": 2, \"sources\": []}}",
			"c.json:2: latency.op_overhead_us: 3: disagrees with efficiency.op_overhead_us = 0 (0: the default)"},
		{"a fit of both overheads", "{\"version\": 1, \"efficiency\": {\"op_overhead_us\": 3, \"step_overhead_us\": 3},\n \"latency\": {\"op_overhead_us\": 3, \"step_overhead_us\": 3, \"samples\": 2, \"sources\": []}}",
			"c.json:2: latency: op_overhead_us 3 and step_overhead_us 3: a fit is of one of them"},
		// The online compute calibration's factors: within [0.2, 5], of a
		// model the speed table knows, one a model.
		{"compute factor too high", "{\"version\": 1, \"efficiency\": {},\n \"compute\": [\n {\"model\": \"T4\", \"factor\": 1.2, \"samples\": 9, \"ratio\": 1.1},\n {\"model\": \"H100 SXM\",\n  \"factor\": 7, \"samples\": 9, \"ratio\": 1}]}",
			"c.json:5: compute[1].factor: 7: expected a measured over predicted compute time from 0.2 to 5"},
		{"compute factor too low", "{\"version\": 1, \"efficiency\": {},\n \"compute\": [\n {\"model\": \"T4\", \"factor\": 0.1, \"samples\": 9, \"ratio\": 1}]}",
			"c.json:3: compute[0].factor: 0.1: expected a measured over predicted compute time from 0.2 to 5"},
		{"compute factor 0", "{\"version\": 1, \"efficiency\": {},\n \"compute\": [\n {\"model\": \"T4\", \"samples\": 9, \"ratio\": 1}]}",
			"c.json: compute[0].factor: 0: expected"},
		{"compute model unknown", "{\"version\": 1, \"efficiency\": {},\n \"compute\": [\n {\"model\": \"MI300X\", \"factor\": 1, \"samples\": 9, \"ratio\": 1}]}",
			`c.json:3: compute[0].model: "MI300X": not a GPU model the speed table knows`},
		{"compute model twice", "{\"version\": 1, \"efficiency\": {},\n \"compute\": [\n {\"model\": \"T4\", \"factor\": 1, \"samples\": 9, \"ratio\": 1},\n {\"model\": \"Tesla T4\", \"factor\": 1.1, \"samples\": 9, \"ratio\": 1}]}",
			`c.json:4: compute[1].model: "Tesla T4": the model of compute[0] (T4)`},
		{"compute samples", "{\"version\": 1, \"efficiency\": {},\n \"compute\": [\n {\"model\": \"T4\", \"factor\": 1, \"samples\": -2, \"ratio\": 1}]}",
			"compute[0]: samples -2, ratio 1: expected non-negative numbers"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseCalibration("c.json", []byte(tc.in))
			var errs CalibrationErrors
			if !errors.As(err, &errs) {
				t.Fatalf("error %v (%T), want CalibrationErrors", err, err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q, want %q", err, tc.want)
			}
		})
	}
}

// A calibration file either parses into a set that validates and encodes
// back to one that parses the same, or is refused with reasons that name
// the file.
func FuzzParseCalibration(f *testing.F) {
	for _, seed := range []string{
		`{"version": 1, "name": "n", "efficiency": {"pcie": 0.6}}`,
		"{\"version\": 1,\n \"efficiency\": {\"nvlink\": 1.5}}",
		`{"version": 1, "efficiency": {}, "fits": [{"kind": "net", "efficiency": 0.9, "samples": 3, "ratio": 0.94, "sources": ["a:1"]}]}`,
		`{"version": 1, "efficiency": {"pcie": 0.5`,
		"",
		// The plausibility refusals (issue 46): below a floor, fits or
		// latency disagreeing with the efficiency in force, a fit of a
		// model the set has no entry for.
		`{"version": 1, "efficiency": {"net": 1e-300}}`,
		`{"version": 1, "efficiency": {}, "models": {"A100": {"tcp": 1e-9}}}`,
		`{"version": 1, "efficiency": {"net": 0.9}, "fits": [{"kind": "net", "efficiency": 0.5, "samples": 3, "ratio": 0.5, "sources": ["a:1"]}]}`,
		`{"version": 1, "efficiency": {"net": 0.9}, "fits": [{"kind": "net", "efficiency": 0.9004, "samples": 3, "ratio": 0.94, "sources": ["a:1"]}]}`,
		`{"version": 1, "efficiency": {}, "fits": [{"kind": "nvlink", "model": "H100", "efficiency": 0.8, "samples": 1, "ratio": 1, "sources": []}]}`,
		`{"version": 1, "efficiency": {"step_overhead_us": 4}, "latency": {"step_overhead_us": 40, "samples": 2, "sources": []}}`,
		`{"version": 1, "efficiency": {}, "models": {"H100": {"step_overhead_us": 4}}, "model_latency": [{"model": "H100", "step_overhead_us": 9, "samples": 2, "sources": []}]}`,
		`{"version": 1, "efficiency": {}, "compute": [{"model": "T4", "factor": 1.18, "samples": 12, "ratio": 1.1, "sources": ["telemetry:j@9"]}]}`,
		`{"version": 1, "efficiency": {}, "compute": [{"model": "T4", "factor": 9, "samples": 12, "ratio": 1.1}, {"model": "t4", "factor": 1, "samples": 1, "ratio": 1}]}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := ParseCalibration("f.json", data)
		if err != nil {
			var errs CalibrationErrors
			if !errors.As(err, &errs) || len(errs) == 0 || !strings.HasPrefix(err.Error(), "f.json") {
				t.Fatalf("refusal %v (%T) does not name the file", err, err)
			}
			return
		}
		if err := c.Validate(); err != nil {
			t.Fatalf("parsed but invalid: %v", err)
		}
		again, err := json.Marshal(c)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ParseCalibration("again.json", again); err != nil {
			t.Fatalf("re-encoded set refused: %v\n%s", err, again)
		}
	})
}

// A set fitted per node model applies on nodes of that model only, the
// model's name matched without case or vendor; a bad entry is refused
// with its line.
func TestCalibrationByModel(t *testing.T) {
	t.Parallel()
	a100 := BuildNode(NodeSpec{Name: "a", GPUs: 8, Model: "NVIDIA A100-SXM4-80GB", NVLinks: 12, NVLinkGen: 3, PCIeGen: 4})
	h100 := BuildNode(NodeSpec{Name: "h", GPUs: 8, Model: "H100-SXM", NVLinks: 18, NVLinkGen: 4, PCIeGen: 5})
	c := &Calibration{Version: CalibrationVersion, Models: map[string]topology.Efficiency{"A100-SXM4-80GB": {NVLink: 0.4}}}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	bw := c.Bandwidths(nil)
	for _, tc := range []struct {
		n     *topology.Node
		ratio float64
	}{{a100, 0.4 / EffNVLink}, {h100, 1}} {
		opts := Options{Algorithm: Ring}
		def, err := Predict(Placement{Ranks: NodeRanks(tc.n)}, AllReduce, 1<<32, opts)
		if err != nil {
			t.Fatal(err)
		}
		got, err := Predict(Placement{Ranks: NodeRanks(tc.n), Bandwidths: bw}, AllReduce, 1<<32, opts)
		if err != nil {
			t.Fatal(err)
		}
		if r := got.BusBWGBps / def.BusBWGBps; math.Abs(r-tc.ratio) > 0.01 {
			t.Errorf("%s: busbw %.1f against %.1f by default (x%.3f), want x%.3f", tc.n.GPUs[0].Model, got.BusBWGBps, def.BusBWGBps, r, tc.ratio)
		}
	}
	_, err := ParseCalibration("m.json", []byte("{\"version\": 1, \"efficiency\": {},\n \"models\": {\n  \"A100\": {\"nvlink\": 1.5}}}"))
	if err == nil || !strings.Contains(err.Error(), "m.json:3: models.A100.nvlink: 1.5") {
		t.Errorf("bad model entry: %v", err)
	}
	// ForModel: a fit on one model joins a set of another's.
	fit := &Calibration{Version: CalibrationVersion, Name: "h", Efficiency: topology.Efficiency{NVLink: 0.7, StepOverheadUS: 4},
		Fits: []Fit{{Kind: "nvlink", Efficiency: 0.7, Samples: 3, Ratio: 0.9, Sources: []string{"h.txt:9"}}}}
	both := fit.ForModel("H100-SXM", c)
	if both.Models["A100-SXM4-80GB"].NVLink != 0.4 || both.Models["H100-SXM"].NVLink != 0.7 || both.Models["H100-SXM"].StepOverheadUS != 4 ||
		both.Efficiency.StepOverheadUS != 0 || len(both.Fits) != 1 || both.Fits[0].Model != "H100-SXM" {
		t.Errorf("merged %+v", both)
	}
	if err := both.Validate(); err != nil {
		t.Error(err)
	}
	// The H100 nodes' per-step overhead (4 us) slows their small messages
	// only; the A100 nodes keep the default's.
	bw = both.Bandwidths(nil)
	for _, tc := range []struct {
		n      *topology.Node
		slower bool
	}{{a100, false}, {h100, true}} {
		opts := Options{Algorithm: Ring, Protocol: Simple}
		def, _ := Predict(Placement{Ranks: NodeRanks(tc.n)}, AllReduce, 1<<10, opts)
		got, _ := Predict(Placement{Ranks: NodeRanks(tc.n), Bandwidths: bw}, AllReduce, 1<<10, opts)
		if slower := got.TimeSeconds > def.TimeSeconds*1.05; slower != tc.slower {
			t.Errorf("%s at 1 KiB: %.2f us against %.2f by default, want slower %v", tc.n.GPUs[0].Model, 1e6*got.TimeSeconds, 1e6*def.TimeSeconds, tc.slower)
		}
	}
	if _, err := ParseCalibration("m.json", []byte("{\"version\": 1, \"efficiency\": {},\n \"models\": {\n  \"A100\": {\"step_overhead_us\": -1}}}")); err == nil ||
		!strings.Contains(err.Error(), "m.json:3: models.A100.step_overhead_us: -1") {
		t.Errorf("negative model overhead: %v", err)
	}
	// An online move is the cluster's: the models' entries stay.
	o := NewOnline()
	for range OnlineMinSamples {
		o.Observe(Observation{Kind: "pcie", Ratio: 1.3})
	}
	if next := o.Step(both, "online"); next == nil || len(next.Models) != 2 || next.Models["H100-SXM"].NVLink != 0.7 {
		t.Errorf("online move %+v", next)
	}
}

// Every kind of link has a floor, refused below and accepted at; none is
// above the online calibration's lowest step, so that an online move never
// writes a set the replicas refuse; the real measurements' fits (model
// validate's files) are all above ten times their floor.
func TestCalibrationFloors(t *testing.T) {
	t.Parallel()
	if len(EfficiencyFloors) != len(LinkKinds) {
		t.Fatalf("floors %v, want one per kind of %v", EfficiencyFloors, LinkKinds)
	}
	for i, kind := range LinkKinds {
		floor := EfficiencyFloors[kind]
		if !(floor > 0) || floor > MinEfficiency {
			t.Errorf("%s: floor %g, want above 0 and at most the online step's %g", kind, floor, MinEfficiency)
		}
		for _, tc := range []struct {
			v  float64
			ok bool
		}{{floor / 2, false}, {floor, true}, {-floor, false}, {math.NaN(), false}, {math.Inf(1), false}, {math.Inf(-1), false}, {0, true}, {1, true}} {
			c := &Calibration{Version: CalibrationVersion}
			*shares(&c.Efficiency)[i] = tc.v
			err := c.Validate()
			if (err == nil) != tc.ok {
				t.Errorf("%s %g: %v, want accepted %v", kind, tc.v, err, tc.ok)
			}
			if err != nil && !strings.Contains(err.Error(), "efficiency."+kind) {
				t.Errorf("%s %g: %v does not name the link", kind, tc.v, err)
			}
		}
	}
	for _, c := range Cases {
		data, err := fs.ReadFile(TestdataFS(), c.File)
		if err != nil {
			t.Fatal(err)
		}
		var samples []Sample
		for _, pt := range append(append([]Point{}, c.Large...), c.Small...) {
			meas, line, err := measured(data, pt, c.Table)
			if err != nil {
				t.Fatal(err)
			}
			samples = append(samples, Sample{Placement: c.Build(), Collective: c.Collective, Algorithm: c.Algorithm, Bytes: pt.Bytes, BusBWGBps: meas,
				Source: fmt.Sprintf("%s:%d", c.File, line)})
		}
		cal, err := FitCalibration(c.Name, samples, nil)
		if err != nil {
			continue // no message of 128 MiB or more in the file
		}
		for _, f := range cal.Fits {
			if f.Efficiency < 10*EfficiencyFloors[f.Kind] {
				t.Errorf("%s: fits %s to %.3f, within ten times its floor %g", c.Name, f.Kind, f.Efficiency, EfficiencyFloors[f.Kind])
			}
		}
		if err := cal.Validate(); err != nil {
			t.Errorf("%s: its own fit refused: %v", c.Name, err)
		}
		if w := cal.Warnings(); len(w) > 0 {
			t.Errorf("%s: a healthy machine's fit warns: %v", c.Name, w)
		}
	}
}

// A set far from the documented efficiencies warns, naming the field and
// the factor; one near them does not; an absolute source path warns.
func TestCalibrationWarnings(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		c    Calibration
		want []string
	}{
		{"near the defaults", Calibration{Efficiency: topology.Efficiency{NVLink: 0.7, Net: 0.5, PCIe: 0.3}}, nil},
		{"20 times slower network", Calibration{Efficiency: topology.Efficiency{Net: 0.048},
			Fits: []Fit{{Kind: "net", Efficiency: 0.048, Samples: 3, Ratio: 0.05, Sources: []string{"ar.txt:30", "ar.txt:31", "ar.txt:32"}}}},
			[]string{"efficiency.net = 0.048: 20.0× below the documented 0.96", "fitted from 3 measurements: ar.txt:30, ar.txt:31, ar.txt:32"}},
		{"EFA against the network's default", Calibration{Efficiency: topology.Efficiency{EFA: 0.2}}, []string{"efficiency.efa = 0.2: 4.8× below the documented 0.96"}},
		{"a model's entry", Calibration{Models: map[string]topology.Efficiency{"H100": {NVLS: 0.1}}}, []string{"models.H100.nvls = 0.1: 6.1× below the documented 0.611"}},
		{"absolute source", Calibration{Efficiency: topology.Efficiency{Net: 0.9},
			Fits: []Fit{{Kind: "net", Efficiency: 0.9, Samples: 2, Ratio: 0.94, Sources: []string{"/home/alice/runs/ar.txt:30", "/home/alice/runs/ar.txt:31"}}}},
			[]string{`fits[0].sources: "/home/alice/runs/ar.txt:30" is an absolute path`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.c.Version = CalibrationVersion
			if err := tc.c.Validate(); err != nil {
				t.Fatal(err)
			}
			got := strings.Join(tc.c.Warnings(), "\n")
			if len(tc.want) == 0 && got != "" {
				t.Errorf("warnings %q, want none", got)
			}
			for _, w := range tc.want {
				if !strings.Contains(got, w) {
					t.Errorf("warnings %q lack %q", got, w)
				}
			}
		})
	}
}

// Fits and latency that agree with the efficiency in force within what
// show prints are accepted; the sets FitCalibration, ForModel and Online
// write agree by construction.
func TestCalibrationAgreement(t *testing.T) {
	t.Parallel()
	for _, in := range []string{
		`{"version": 1, "efficiency": {"net": 0.9}, "fits": [{"kind": "net", "efficiency": 0.9004, "samples": 3, "ratio": 0.94, "sources": []}]}`,
		`{"version": 1, "efficiency": {}, "fits": [{"kind": "nvlink", "efficiency": 0.8, "samples": 3, "ratio": 1, "sources": []}]}`,
		`{"version": 1, "efficiency": {"net": 0.7}, "fits": [{"kind": "efa", "efficiency": 0.7, "samples": 3, "ratio": 1, "sources": []}]}`,
		`{"version": 1, "efficiency": {"step_overhead_us": 4.2}, "latency": {"step_overhead_us": 4.204, "samples": 2, "sources": []}}`,
		`{"version": 1, "efficiency": {"op_overhead_us": 31.5}, "latency": {"op_overhead_us": 31.503, "samples": 2, "sources": []}}`,
		`{"version": 1, "efficiency": {}, "models": {"H100": {"op_overhead_us": 12}}, "model_latency": [{"model": "H100", "op_overhead_us": 12, "samples": 2, "sources": []}]}`,
		`{"version": 1, "efficiency": {"nvlink": 0.7}, "models": {"H100": {"pcie": 0.5}}, "fits": [{"kind": "nvlink", "model": "h100", "efficiency": 0.7, "samples": 3, "ratio": 1, "sources": []}]}`,
	} {
		if _, err := ParseCalibration("ok.json", []byte(in)); err != nil {
			t.Errorf("%s: %v", in, err)
		}
	}
	// An EFA fit following the network's efficiency (efa left at 0): an
	// online move of the network drops it rather than write a set that
	// says two things.
	c, err := ParseCalibration("follow.json", []byte(`{"version": 1, "efficiency": {"net": 0.7},
		"fits": [{"kind": "efa", "efficiency": 0.7, "samples": 3, "ratio": 1, "sources": []}, {"kind": "pcie", "efficiency": 0.8, "samples": 3, "ratio": 1, "sources": []}]}`))
	if err != nil {
		t.Fatal(err)
	}
	o := NewOnline()
	for range OnlineMinSamples {
		o.Observe(Observation{Kind: "net", Ratio: 1.3})
	}
	next := o.Step(c, "online")
	if next == nil || next.Efficiency.Net <= 0.7 {
		t.Fatalf("online move %+v", next)
	}
	if err := next.Validate(); err != nil {
		t.Errorf("online move refused: %v", err)
	}
	if kinds := fmt.Sprint(next.Fits); strings.Contains(kinds, "efa") || !strings.Contains(kinds, "pcie") || !strings.Contains(kinds, "net") {
		t.Errorf("online move's fits %s, want pcie and net", kinds)
	}
}

// A fit whose measurements ask for more than line rate stops at 1 and
// says so: the share asked for is kept, AtLineRate names the fit, and a
// set that claims it inconsistently is refused.
func TestFitStopsAtLineRate(t *testing.T) {
	t.Parallel()
	p := onNodes(with(h100, func(s *NodeSpec) { s.NICs, s.NICGbps = 8, 400 }), 2, 8)()
	line := (&Calibration{Efficiency: topology.Efficiency{NVLink: 1, NVLS: 1, PCIe: 1, Net: 1, EFA: 1, TCP: 1}}).Bandwidths(nil)
	var samples []Sample
	for _, b := range []float64{1 << 30, 2 << 30, 4 << 30} {
		s := Sample{Placement: p, Collective: AllReduce, Algorithm: Ring, Bytes: b, Source: fmt.Sprintf("ar.txt:%d", int(b)>>30)}
		r, err := predictWith(s, line)
		if err != nil {
			t.Fatal(err)
		}
		// 1% above what the links carry at line rate at this size: within
		// the 2% a measurement may exceed the bound by, so not refused.
		s.BusBWGBps = 1.01 * r.BusBWGBps
		samples = append(samples, s)
	}
	cal, err := FitCalibration("above", samples, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(cal.Fits) != 1 || cal.Fits[0].Kind != "net" || cal.Fits[0].Efficiency != 1 || math.Abs(cal.Fits[0].AboveLineRate-1.01) > 0.002 {
		t.Fatalf("fits %+v, want net at 1 and 1.01 asked for", cal.Fits)
	}
	if err := cal.Validate(); err != nil {
		t.Fatalf("its own fit refused: %v", err)
	}
	w := strings.Join(cal.AtLineRate(), "\n")
	if !strings.Contains(w, "fits[0] (net) stopped at line rate") || !strings.Contains(w, "asked for 1.010") {
		t.Errorf("at line rate %q: want the fit named", w)
	}
	if len(cal.Warnings()) != 0 {
		t.Errorf("warnings %v: the machine is not at fault", cal.Warnings())
	}
	// Within line rate: nothing said.
	for i := range samples {
		samples[i].BusBWGBps *= 0.9
	}
	within, err := FitCalibration("within", samples, nil)
	if err != nil {
		t.Fatal(err)
	}
	if f := within.Fits[0]; f.AboveLineRate != 0 || f.Efficiency >= 1 || len(within.AtLineRate()) != 0 {
		t.Errorf("within line rate: %+v, %v", f, within.AtLineRate())
	}
	for _, tc := range []struct {
		name string
		json string
		want string
	}{
		{"below 1", `{"version": 1, "efficiency": {"net": 1}, "fits": [{"kind": "net", "efficiency": 1, "samples": 1, "ratio": 1, "sources": [], "above_line_rate": 0.9}]}`,
			"fits[0].above_line_rate: 0.9: expected above 1"},
		{"not at line rate", `{"version": 1, "efficiency": {"net": 0.9}, "fits": [{"kind": "net", "efficiency": 0.9, "samples": 1, "ratio": 1, "sources": [], "above_line_rate": 1.2}]}`,
			"fits[0].above_line_rate: 1.2 with efficiency 0.9"},
	} {
		if _, err := ParseCalibration("c.json", []byte(tc.json)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
}
