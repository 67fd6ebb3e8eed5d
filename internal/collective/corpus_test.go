package collective

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/toposched/toposched/internal/formats/nccltests"
	"github.com/toposched/toposched/internal/topology"
)

// fixtureMachines are the machines of the nccl-tests reader's own
// fixtures (internal/formats/nccltests/testdata/SOURCES.md), rebuilt from
// what each source says; the files of this package's testdata take
// theirs from Cases.
var fixtureMachines = map[string]func() Placement{
	"aws-p4de-a100_2node-16gpu-efa_all_reduce_awsome-distributed-training.txt": onNodes(with(a100, func(s *NodeSpec) { s.NICs, s.NICGbps, s.Transport = 4, 100, topology.TransportEFA }), 2, 8),
	"a100-2node-16gpu-efa-openmpi-tags_all_reduce_aws-efa-eks.txt":             onNodes(with(a100, func(s *NodeSpec) { s.NICs, s.NICGbps, s.Transport = 4, 100, topology.TransportEFA }), 2, 8),
	// 2x RTX 2080 Ti, PCIe Gen3 through one switch (PIX), P2P not
	// supported (topo -p2p p: NS; the files' names say no-p2p).
	"rtx2080ti-2gpu-pcie-no-p2p_all_gather_autodl-blog.txt":      onNodes(NodeSpec{Name: "rtx2080ti", GPUs: 2, Model: "RTX-2080-Ti", PCIeGen: 3, NoP2P: true}, 1, 2),
	"rtx2080ti-2gpu-pcie-no-p2p_six-collectives_autodl-blog.txt": onNodes(NodeSpec{Name: "rtx2080ti", GPUs: 2, Model: "RTX-2080-Ti", PCIeGen: 3, NoP2P: true}, 1, 2),
	// B200 pods of GKE with GPUDirect RDMA: 2 GPUs of one node (NVLink
	// 5, NV18), and 1 GPU each of 2 nodes over one 400 Gb/s RDMA NIC.
	"b200-1node-2gpu_all_gather-rows-elided_dranet-doc.txt": onNodes(NodeSpec{Name: "b200", GPUs: 2, Model: "B200", NVLinks: 18, NVLinkGen: 5, PCIeGen: 5}, 1, 2),
	"b200-2node-1gpu-each_all_gather_dranet-doc.txt":        onNodes(NodeSpec{Name: "b200", GPUs: 1, Model: "B200", PCIeGen: 5, NICs: 1, NICGbps: 400}, 2, 1),
}

// crossMachine is the placement of a CrossMachines sweep's file, nil for
// another file.
func crossMachine(file string) func() Placement {
	for _, m := range CrossMachines {
		for _, sw := range m.Sweeps {
			if sw.File == file {
				return m.Build
			}
		}
	}
	return nil
}

// TestCorpusCalibrates runs every measurement file of this package's
// testdata and of the nccl-tests reader's through the reader and, where
// the machine is known (Cases, fixtureMachines), through the calibration:
// every file nccl-tests printed reads, and its rows fit to a calibration
// that validates. Files are globbed, so files added later are covered.
func TestCorpusCalibrates(t *testing.T) {
	t.Parallel()
	machines := map[string]Case{}
	for _, c := range Cases {
		machines[c.File] = c
	}
	var files []string
	for _, dir := range []string{"testdata", filepath.Join("..", "formats", "nccltests", "testdata")} {
		m, err := filepath.Glob(filepath.Join(dir, "*.txt"))
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, m...)
	}
	calibrated := 0
	for _, file := range files {
		base := filepath.Base(file)
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		res, err := nccltests.Parse(file, data)
		if err != nil {
			if !strings.HasPrefix(err.Error(), file) {
				t.Errorf("%s: refused without naming the file: %v", base, err)
			}
			// Not nccl-tests output (a table from a web page): the
			// reader's own corpus test tells those apart.
			continue
		}
		var build func() Placement
		c, inCases := machines[base]
		switch {
		case inCases:
			build = c.Build
		case fixtureMachines[base] != nil:
			build = fixtureMachines[base]
		case crossMachine(base) != nil:
			build = crossMachine(base)
		default:
			t.Logf("%s: read (%d rows); no machine known for it, not calibrated", base, len(res.Rows))
			continue
		}
		p := build()
		var samples []Sample
		for _, test := range res.Tests {
			name := test.Collective
			if inCases {
				name = string(c.Collective)
			}
			col, err := ParseCollective(name)
			if err != nil || (test.Ranks > 0 && test.Ranks != len(p.Ranks)) {
				continue // broadcast, reduce; a run on other GPUs
			}
			algo := Auto
			if inCases {
				algo = c.Algorithm
			}
			for _, r := range test.Rows {
				if r.BusBW() > 0 {
					samples = append(samples, Sample{Placement: p, Collective: col, Algorithm: algo, Bytes: r.Bytes, BusBWGBps: r.BusBW(), Source: base + ":" + strconv.Itoa(r.Line)})
				}
			}
		}
		cal, err := FitCalibration(base, samples, nil)
		largest := 0.0
		for _, s := range samples {
			largest = max(largest, s.Bytes)
		}
		switch {
		case err != nil && largest < FitMinBytes && errors.Is(err, ErrNoMeasurement):
			// Its refusal: bandwidth is fitted from 128 MiB up.
			t.Logf("%s: read; its largest message, %g bytes, is below the %d bandwidth is fitted from: %v", base, largest, FitMinBytes, err)
			continue
		case err != nil:
			t.Errorf("%s: %v", base, err)
			continue
		}
		if err := cal.Validate(); err != nil {
			t.Errorf("%s: the fit is refused: %v", base, err)
			continue
		}
		for _, w := range cal.Warnings() {
			t.Logf("%s: warning: %s", base, w)
		}
		calibrated++
	}
	if calibrated == 0 {
		t.Fatal("no file calibrated")
	}
	t.Logf("%d of %d files calibrated", calibrated, len(files))
}
