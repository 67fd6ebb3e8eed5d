package collective

import (
	"math"
	"slices"
	"testing"
)

func TestValidateTargets(t *testing.T) {
	t.Parallel()
	s, err := Validate(TestdataFS())
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range s.Rows {
		t.Logf("%-26s %-16s %12.0f large=%v measured %7.2f predicted %7.2f error %+6.1f%%", r.Case, r.Algorithm, r.Bytes, r.Large, r.Measured, r.Predicted, 100*r.Error)
	}
	t.Logf("large: median %.1f%% max %.1f%% (%d); small: median %.1f%% max %.1f%% (%d)",
		100*s.LargeMedian, 100*s.LargeMax, s.LargeCount, 100*s.SmallMedian, 100*s.SmallMax, s.SmallCount)
	if s.LargeMedian > 0.10 || s.LargeMax > 0.25 {
		t.Errorf("large messages: median %.1f%% (target 10%%), max %.1f%% (target 25%%)", 100*s.LargeMedian, 100*s.LargeMax)
	}
	// Small messages have no target; this guards what the model achieves
	// (median 37%, max 142% when written).
	if s.SmallMedian > 0.5 || s.SmallMax > 1.6 {
		t.Errorf("small messages: median %.1f%%, max %.1f%%: worse than when written (37%%, 142%%)", 100*s.SmallMedian, 100*s.SmallMax)
	}
}

func TestSweep(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, data string
		bytes      []float64
		busbw      []float64
	}{
		{"azure two columns", "| Message Size (Bytes) | ND A100 V4 (GB/s) |\n| 524K | 19.24 |\n| 1M | 36.22 |\n| 134M | 174.18 |\n| 8G | 231.58 |\n",
			[]float64{1 << 20, 1 << 27, 1 << 33}, []float64{36.22, 174.18, 231.58}},
		{"torch payload busbw algbw", "| payload |    busbw   |    algbw   |\n| ------: | ---------: | ---------: |\n|  512KiB |  23.94GBps |  13.68GBps |\n|    1MiB |  39.93GBps |  22.82GBps |\n|   16GiB | 482.26GBps | 275.58GBps |\n",
			[]float64{1 << 20, 1 << 34}, []float64{39.93, 482.26}},
		{"not a table", "Out of bounds values : 0 OK\n| GPU | H200 |\n", nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pts := sweep("x.md", []byte(tc.data))
			if len(pts) != len(tc.bytes) {
				t.Fatalf("got %d points %v, want %d", len(pts), pts, len(tc.bytes))
			}
			for i, p := range pts {
				if p.Bytes != tc.bytes[i] || p.BusBW != tc.busbw[i] {
					t.Errorf("point %d: %g bytes %g GB/s, want %g and %g", i, p.Bytes, p.BusBW, tc.bytes[i], tc.busbw[i])
				}
			}
		})
	}
}

// The PCIe-only group is the cases whose GPUs share no NVLink on a node:
// PCIe servers with or without P2P, not an NVSwitch node nor a bridged
// pair; its figure is each row's error under a model calibrated on other
// machines: leave one machine out, or, held out, calibrated on the held-in
// machines.
func TestPCIeOnlyGroup(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		want bool
	}{{"a100-pcie-4gpu-2socket", true}, {"rtx2080ti-2gpu-pix-p2p-ns", true}, {"quadro-rtx6000-8gpu-pcie-tree", true}, {"azure-ndv4-a100-8gpu", false}, {"aws-p5-2node-efa-eks", false}} {
		i := slices.IndexFunc(Cases, func(c Case) bool { return c.Name == tc.name })
		if i < 0 {
			t.Fatalf("no case %s", tc.name)
		}
		if got := pcieOnly(Cases[i].Build()); got != tc.want {
			t.Errorf("%s: PCIe only %v, want %v", tc.name, got, tc.want)
		}
	}
	s, err := Validate(TestdataFS())
	if err != nil {
		t.Fatal(err)
	}
	var errs []float64
	for _, r := range s.Rows {
		if r.Large && r.PCIeOnly {
			if r.LOMOPredicted <= 0 {
				t.Errorf("%s: no prediction from other machines", r.Case)
			}
			errs = append(errs, math.Abs(r.LOMOError))
		}
	}
	med, mx := medianMax(errs)
	if s.PCIe.Rows != len(errs) || s.PCIe.Rows < 2 || s.PCIe.Median != med || s.PCIe.Max != mx {
		t.Errorf("PCIe group %+v, rows give %d, median %v, max %v", s.PCIe, len(errs), med, mx)
	}
}

// Files of one cluster (Case.Cluster) are left out together: a file's
// leave-one-machine-out model is fitted on other machines only, not on
// another run of the same links. Two files of a cluster measure the
// network at half the model's rate, a third machine at its rate: left out
// together, each of the two is predicted from the third alone (+100%);
// left out one by one, from its twin too.
func TestLeaveOneMachineOutByCluster(t *testing.T) {
	t.Parallel()
	p := onNodes(with(a100, func(s *NodeSpec) { s.NICs, s.NICGbps = 8, 200 }), 2, 8)()
	r, err := Predict(p, AllReduce, 8<<30, Options{Algorithm: Auto, Candidates: NCCLAlgorithms})
	if err != nil {
		t.Fatal(err)
	}
	var samples []Sample
	var rows []Row
	for _, m := range []struct {
		file string
		rate float64
	}{{"a", 0.5}, {"b", 0.5}, {"c", 1}} {
		src := m.file + ".txt:1"
		samples = append(samples, Sample{Placement: p, Collective: AllReduce, Algorithm: Auto, Bytes: 8 << 30, BusBWGBps: m.rate * r.BusBWGBps, Source: src})
		rows = append(rows, Row{Case: m.file, Large: true, Bytes: 8 << 30, Measured: m.rate * r.BusBWGBps, Source: src})
	}
	for _, tt := range []struct {
		name      string
		machineOf map[string]string
		machines  int
		check     func(e float64) bool
	}{
		{"one cluster", map[string]string{"a.txt": "x", "b.txt": "x", "c.txt": "c.txt"}, 2, func(e float64) bool { return math.Abs(e-1) < 0.01 }},
		{"three machines", map[string]string{"a.txt": "a.txt", "b.txt": "b.txt", "c.txt": "c.txt"}, 3, func(e float64) bool { return e < 0.9 }},
	} {
		s := Summary{Rows: slices.Clone(rows)}
		if err := s.leaveOneMachineOut(samples, tt.machineOf); err != nil {
			t.Fatal(err)
		}
		if e := s.Rows[0].LOMOError; !tt.check(e) {
			t.Errorf("%s: a's LOMO error %+.1f%%", tt.name, 100*e)
		}
		if s.LOMOMachines != tt.machines || s.LOMOFiles != 3 {
			t.Errorf("%s: %d machines of %d files, want %d of 3", tt.name, s.LOMOMachines, s.LOMOFiles, tt.machines)
		}
	}
}

// A held-out row is predicted by the model calibrated on the held-in
// machines, and fits nothing: the held-in rows' figures are the same with
// the held-out cases or without them.
func TestHeldOutCalibrated(t *testing.T) {
	t.Parallel()
	p := onNodes(with(a100, func(s *NodeSpec) { s.NICs, s.NICGbps = 8, 200 }), 2, 8)()
	r, err := Predict(p, AllReduce, 8<<30, Options{Algorithm: Auto, Candidates: NCCLAlgorithms})
	if err != nil {
		t.Fatal(err)
	}
	sample := func(file string, rate float64) Sample {
		return Sample{Placement: p, Collective: AllReduce, Algorithm: Auto, Bytes: 8 << 30, BusBWGBps: rate * r.BusBWGBps, Source: file + ".txt:1"}
	}
	row := func(x Sample, held bool) Row {
		return Row{Case: x.Source, Large: true, Bytes: x.Bytes, Measured: x.BusBWGBps, Source: x.Source, HeldOut: held}
	}
	in := []Sample{sample("a", 0.5), sample("b", 0.5)}
	out := []Sample{sample("h", 0.25)}
	machineOf := map[string]string{"a.txt": "a.txt", "b.txt": "b.txt"}

	alone := Summary{Rows: []Row{row(in[0], false), row(in[1], false)}}
	if err := alone.leaveOneMachineOut(in, machineOf); err != nil {
		t.Fatal(err)
	}
	both := Summary{Rows: []Row{row(in[0], false), row(in[1], false), row(out[0], true)}}
	if err := both.leaveOneMachineOut(in, machineOf); err != nil {
		t.Fatal(err)
	}
	if err := both.heldOutCalibrated(in, out); err != nil {
		t.Fatal(err)
	}
	for i := range alone.Rows {
		if alone.Rows[i].LOMOPredicted != both.Rows[i].LOMOPredicted {
			t.Errorf("%s: LOMO %v alone, %v beside a held-out case", alone.Rows[i].Case, alone.Rows[i].LOMOPredicted, both.Rows[i].LOMOPredicted)
		}
	}
	// The held-in machines run at half the model's rate; the held-out
	// one, at a quarter, is predicted at their half: +100%.
	if e := both.Rows[2].LOMOError; math.Abs(e-1) > 0.01 || !both.Rows[2].LOMOFitted {
		t.Errorf("held out: error %+.1f%% (fitted %v), want +100%% from the held-in fit", 100*e, both.Rows[2].LOMOFitted)
	}
	if both.HeldOutCalibratedMax != math.Abs(both.Rows[2].LOMOError) {
		t.Errorf("held-out calibrated max %v, row %v", both.HeldOutCalibratedMax, both.Rows[2].LOMOError)
	}
}

// A case's Table reads a benchmark's CSV tables joined in one file: the
// row after its section's line, the field scaled to GB/s.
func TestMeasuredTable(t *testing.T) {
	t.Parallel()
	data := []byte("=== x_2gpu.csv ===\niter,avg_time,tput\n0,1.0,5000000\navg,1.0,6000000\n=== x_4gpu.csv ===\niter,avg_time,tput\navg,2.0,7000000\n")
	for _, tc := range []struct {
		name  string
		table Table
		want  float64
		line  int
		err   bool
	}{
		{"first section", Table{CSV: true, Section: "x_2gpu.csv", Unit: 1e-6}, 6, 4, false},
		{"second section", Table{CSV: true, Section: "x_4gpu.csv", Unit: 1e-6}, 7, 7, false},
		{"no such section", Table{CSV: true, Section: "x_8gpu.csv", Unit: 1e-6}, 0, 0, true},
		{"not split on commas", Table{}, 0, 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, line, err := measured(data, Point{Bytes: 1 << 30, Key: "avg", Col: 2}, tc.table)
			if (err != nil) != tc.err {
				t.Fatalf("error %v, want one: %v", err, tc.err)
			}
			if !tc.err && (math.Abs(got-tc.want) > 1e-9 || line != tc.line) {
				t.Errorf("got %v GB/s on line %d, want %v on %d", got, line, tc.want, tc.line)
			}
		})
	}
}
