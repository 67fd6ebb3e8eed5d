package collective

import (
	"math"
	"strings"
	"testing"
	"testing/fstest"
)

// TestCrossCollective runs the transfer over the project's copy: every
// ordered pair of every machine's sweeps is predicted at each size from
// CrossMinBytes, and a sweep's own calibration gives back its large sizes
// (the fit is of the links the sweep is bound by, not of another path).
func TestCrossCollective(t *testing.T) {
	t.Parallel()
	s, err := CrossCollective(TestdataFS())
	if err != nil {
		t.Fatal(err)
	}
	want := 0
	for _, m := range CrossMachines {
		want += len(m.Sweeps) * (len(m.Sweeps) - 1)
	}
	if len(s.Pairs) != want || s.Machines != len(CrossMachines) {
		t.Fatalf("%d pairs of %d machines, want %d of %d", len(s.Pairs), s.Machines, want, len(CrossMachines))
	}
	n := 0
	for _, p := range s.Pairs {
		if p.From == p.To || len(p.Sizes) == 0 || len(p.Fitted) == 0 {
			t.Errorf("%s %s from %s: %+v", p.Case, p.To, p.From, p)
		}
		for _, z := range p.Sizes {
			n++
			if z.Bytes < CrossMinBytes || z.Measured <= 0 || math.Abs(z.Error-(z.Predicted-z.Measured)/z.Measured) > 1e-12 {
				t.Errorf("%s: %+v", z.Source, z)
			}
		}
		t.Logf("%s: %s from %s: median %.1f%% max %.1f%%", p.Case, p.To, p.From, 100*p.Median, 100*p.Max)
	}
	if n != s.Count {
		t.Errorf("count %d, sizes %d", s.Count, n)
	}
	t.Logf("median of the machines' medians %.1f%%; pooled median %.1f%%, max %.1f%% over %d sizes (target %.0f%%)", 100*s.MachineMedian, 100*s.Median, 100*s.Max, s.Count, 100*CrossTarget)
	// No target is asserted: it is missed (BENCHMARKS.md, issue 50). This
	// guards what the model achieves: 15.7% on the one machine first, 17.1%
	// (sizes pooled) with the A3 Mega and A4 node pairs (their notes say
	// why), 11.5% as the median of four machines' medians with the HGX
	// H100 node's five collectives (pooled, its 200 sizes would make it
	// 5.2%), 15.7% over five with the Together H100 node's three ring
	// sweeps (16.6% on it: its note says why), 16.2% over six with the
	// xxrjun cluster's 10-node run (39.7% on it, its sendrecv the most),
	// 15.7% over seven with that cluster's node pair (6.9% on it), 6.9%
	// with the small messages' offset fitted once a call rather than once
	// a step (fitLatency: the Together node 16.6% to 4.8%, A3 Mega 7.3% to
	// 4.2%, A4 77.7% to 61.4%), which meets the target.
	if s.MachineMedian > CrossTarget {
		t.Errorf("median of the machines' medians %.1f%%: above the target %.0f%% (6.9%% when the overhead of a call was fitted)", 100*s.MachineMedian, 100*CrossTarget)
	}
	if len(s.ByMachine) != len(CrossMachines) {
		t.Errorf("%d machines' medians, want %d", len(s.ByMachine), len(CrossMachines))
	}

	// A sweep's own calibration gives back its large sizes within 10%,
	// but for two sweeps whose large sizes the model's shape misses (their
	// machines' notes): the A3 Mega all_reduce's tree pays a fixed ~0.9 ms
	// (+53% at 128 MiB, +25% at 256 MiB), and the A4 all_gather's rows are
	// out of trend (+42% at 256 MiB between two within 1%; -21% at 1 GiB);
	// so are the HGX H100 node's sendrecv rows to 256 MiB (64 and 128 MiB
	// take the same 820 µs: +117% at 128 MiB). The A4 all_gather takes
	// 1-1.8 ms from 1 MiB to 256 MiB (2 MiB slower than 4 MiB, 16 MiB
	// slower than 32 MiB): fitted once a call from its small rows (0.93
	// ms), it is +116% at 256 MiB, where an overhead once a step, which
	// the model's pipeline repeats more often as messages grow, had
	// happened to give +42%. (The Together H100 node's ring sweeps, with
	// their flat ~35-41 µs to 4 MiB, were 13-19% slow at 128 MiB when the
	// fit took that offset once a step; once a call, within 4%.) The xxrjun
	// 10-node run's all_gather and reduce_scatter dip at 256 MiB (+64%
	// and +60% there, +20% and +25% at 512 MiB), its alltoall is -14% at
	// 128 MiB and its all_reduce +10% at 8 GiB (its rows fall from 345
	// GB/s at 1 GiB to 314-321 from 4 GiB).
	selfMax := map[string]float64{
		"hgx-h100_10node-80gpu-8x400g_five-collectives_xxrjun-nccl-tests-cluster.txt all_reduce":     0.11,
		"hgx-h100_10node-80gpu-8x400g_five-collectives_xxrjun-nccl-tests-cluster.txt all_gather":     0.64,
		"hgx-h100_10node-80gpu-8x400g_five-collectives_xxrjun-nccl-tests-cluster.txt reduce_scatter": 0.60,
		"hgx-h100_10node-80gpu-8x400g_five-collectives_xxrjun-nccl-tests-cluster.txt all_to_all":     0.14,
		"hgx-h100-8gpu_single-node_five-collectives_xxrjun-nccl-tests-cluster.txt sendrecv":          1.17,
		"gcp-a3mega-h100_2node-16gpu_all_reduce_create-a3mega-ztan-fork.txt all_reduce":              0.53,
		"gcp-a4-b200_2node-16gpu-roce_all_gather_dranet.txt all_gather":                              1.16,
	}
	for _, m := range CrossMachines {
		p := m.Build()
		for _, sw := range m.Sweeps {
			limit := 0.10
			if l, ok := selfMax[sw.File+" "+string(sw.Collective)]; ok {
				limit = l
			}
			samples, err := crossSamples(TestdataFS(), sw, p)
			if err != nil {
				t.Fatal(err)
			}
			cal, err := FitCalibration("self", samples, nil)
			if err != nil {
				t.Fatal(err)
			}
			for _, s := range samples {
				if s.Bytes < FitMinBytes {
					continue
				}
				r, err := predictWith(s, cal.Bandwidths(nil))
				if err != nil {
					t.Fatal(err)
				}
				if e := (r.BusBWGBps - s.BusBWGBps) / s.BusBWGBps; math.Abs(e) > limit {
					t.Errorf("%s: %s from itself: %+.1f%%, beyond %.0f%%", s.Source, sw.Collective, 100*e, 100*limit)
				}
			}
		}
	}
}

func TestCrossSamples(t *testing.T) {
	t.Parallel()
	head := "./build/all_gather_perf -b 1M -e 256M -f 2 -g 2\n#  Rank  0 Group  0 Pid 1 on h device  0 [0000:01:00] GPU\n#  Rank  1 Group  0 Pid 1 on h device  1 [0000:02:00] GPU\n"
	rows := "     1048576        131072     float    none      -1    181.1    5.79    2.89      0    179.1    5.85    2.93      0\n" +
		"   134217728      16777216     float    none      -1    20235    6.63    3.32      3    19164    7.00    3.50      0\n" +
		"   268435456      33554432     float    none      -1    40096    6.69    3.35      0    35687    7.52    3.76      0\n"
	fsys := fstest.MapFS{"ag.txt": {Data: []byte(head + rows)}}
	p := onNodes(NodeSpec{Name: "g", GPUs: 2, Model: "RTX-2080-Ti", PCIeGen: 3}, 1, 2)()
	got, err := crossSamples(fsys, CrossSweep{File: "ag.txt", Collective: AllGather}, p)
	if err != nil {
		t.Fatal(err)
	}
	// The 128 MiB row's data check found wrong elements: left out.
	if len(got) != 2 || got[0].Bytes != 1<<20 || got[1].Bytes != 256<<20 || got[1].BusBWGBps != 3.76 || got[1].Source != "ag.txt:6" {
		t.Errorf("samples %+v", got)
	}
	for _, tc := range []struct {
		name string
		sw   CrossSweep
		p    Placement
		want []string
	}{
		{"no run of the collective", CrossSweep{File: "ag.txt", Collective: AllReduce}, p, []string{"ag.txt", "no run of all_reduce on 2 ranks"}},
		{"another rank count", CrossSweep{File: "ag.txt", Collective: AllGather}, onNodes(NodeSpec{Name: "g", GPUs: 4, Model: "RTX-2080-Ti", PCIeGen: 3}, 1, 4)(),
			[]string{"no run of all_gather on 4 ranks"}},
		{"no file", CrossSweep{File: "none.txt", Collective: AllGather}, p, []string{"none.txt"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := crossSamples(fsys, tc.sw, tc.p)
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
