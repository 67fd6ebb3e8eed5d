package collective

import (
	"fmt"
	"io/fs"
	"math"
	"slices"
	"strconv"

	"github.com/toposched/toposched/internal/formats/nccltests"
	"github.com/toposched/toposched/internal/topology"
)

// CrossMachine is a machine measured with sweeps of two or more
// collectives: the validation of transfer across collectives (issue 50,
// item 4) calibrates the model from one sweep and predicts the others.
type CrossMachine struct {
	Name    string
	Machine string
	// Build makes the placement the sweeps ran on.
	Build  func() Placement
	Sweeps []CrossSweep
	// Note explains an assumption or a miss.
	Note string
}

// CrossSweep is one collective's run in a file of nccl-tests output (a
// file may hold several runs, each named by its command line).
type CrossSweep struct {
	File       string
	Collective Collective
	// Algorithm is what NCCL ran where the source says, else Auto.
	Algorithm Algorithm
}

// CrossMachines are the machines of the testdata with sweeps of two or
// more collectives the model predicts (broadcast and reduce runs are not:
// the model has no cost for them). Every one was looked at while the
// transfer was examined; none is held out (see testdata/SOURCES.md).
//
// The model has no per-collective efficiency: a ring's all_reduce,
// all_gather and reduce_scatter load their links with the same bus
// bandwidth, as nccl-tests defines it (doc/PERFORMANCE.md) and as NCCL's
// own tuner prices them (src/graph/tuning.cc, "Convert bus BW to
// algorithm BW": ratio nRanks/nsteps, nsteps 2(n-1) for all_reduce, n-1
// for the others). What a machine's collectives measure apart is what
// this transfer shows.
var CrossMachines = []CrossMachine{
	// The 2080 Ti pair with P2P off. What NCCL does there (NCCL 2.20.3; the
	// file names no release, CUDA 12.4; the rules below hold from 2.18 to
	// 2.26):
	//   - SHM by default copies with the GPUs' threads, not the copy
	//     engine: NCCL_SHM_USE_CUDA_MEMCPY defaults to 0
	//     (src/transport/shm.cc:41, initCeOperation :416), so each GPU's
	//     kernel stores into and loads from the host buffers; 4 MiB of
	//     Simple buffer, 8 steps of 512 KiB (src/init.cc:543).
	//   - Rings run 2 channels, the search's one doubled
	//     (src/graph/connect.cc:442; an RTX 4090 box on SHM/direct/direct
	//     logs channels 00 and 01, NVIDIA/nccl-tests#307), each with 256
	//     threads plus a sync warp because the ring graph is no faster than
	//     PCI_BW (src/graph/tuning.cc:121, src/enqueue.cc:1574): one thread group
	//     per channel moves each step. On 2 ranks all_gather sends then
	//     receives (src/device/all_gather.h:45,61), never both at once in a
	//     channel; all_reduce sends, receives-reduces-sends, receives
	//     (src/device/all_reduce.h:45,62,78), both at once in its middle
	//     step.
	//   - alltoall is grouped send/recv: the p2p kernel gives the receive
	//     8 warps and the send 9 of each block (finishWorkP2p,
	//     src/enqueue.cc:117; src/device/sendrecv.h:58-90), both running at
	//     once, on 2 p2p channels per peer (src/graph/paths.cc:705,763)
	//     with 128 KiB steps (P2P_PCI_CHUNKSIZE, src/init.cc:549,566).
	//     calcP2pChunkSize (src/enqueue.cc:842, maxSize stepSize*32 on one
	//     node, :904) puts up to 4 MiB on a channel, so up to 8 MiB of
	//     alltoall runs on 1 channel and from 16 MiB on 2: the measured
	//     busbw steps there (3.95 to 4.45 GB/s), which also says NCCL had 2
	//     p2p channels, so 2 ring channels (nChannelsMin 1 needs
	//     p2pnChannels 2, :874).
	// The model's SHM path (routeSHM) loads the host link both ways at
	// once, as alltoall's concurrent send and receive do; how far a
	// channel's turn-taking leaves the rings below that depends on a
	// channel's host copy rate, which NCCL does not document, so it is
	// not modelled and the transfer between rings and alltoall misses by
	// the measured gap.
	{
		Name:    "rtx2080ti-2gpu-pix-p2p-ns",
		Machine: "1 container, 2x GeForce RTX 2080 Ti on one PCIe Gen3 switch (PIX), P2P not supported (topo -p2p p: NS)",
		Build:   onNodes(NodeSpec{Name: "rtx2080ti", GPUs: 2, Model: "RTX-2080-Ti", PCIeGen: 3, NoP2P: true}, 1, 2),
		Sweeps: []CrossSweep{
			{File: "rtx2080ti-2gpu-pix-p2p-ns_six-collectives_anthony-hoo-autodl.txt", Collective: AllReduce, Algorithm: Auto},
			{File: "rtx2080ti-2gpu-pix-p2p-ns_six-collectives_anthony-hoo-autodl.txt", Collective: AllGather, Algorithm: Auto},
			{File: "rtx2080ti-2gpu-pix-p2p-ns_six-collectives_anthony-hoo-autodl.txt", Collective: AllToAll, Algorithm: Auto},
		},
		Note: "P2P off: every collective moves through host memory (NCCL's SHM transport, whose default has the GPUs' own threads store to and load from the host buffers); the three collectives move the same bytes per rank, yet their large-message busbw differ by 23% (all_gather 3.84, all_reduce 4.00, alltoall 4.73 GB/s at 1 GiB). " +
			"NCCL runs them apart: its rings (2 channels, 8 copying warps each on a PCIe-speed graph) have one thread group per channel move a step's data, so a channel's host writes and reads take turns (all_gather on 2 ranks: send, then receive; all_reduce overlaps them in one of its three steps), " +
			"where alltoall's send/recv kernel gives each peer's send and receive their own warps and runs both at once, on 1 channel below 16 MiB and 2 from it (at most 4 MiB a channel), where its busbw steps from 3.95 to 4.45. " +
			"The model prices the host link both ways at once, as alltoall runs (within 3% at 1 GiB); NCCL documents no per-channel copy rate, so the rings' shortfall is not modelled",
	}, {
		Name:    "gcp-a3mega-2node",
		Machine: "2 GCP a3-megagpu-8g x 8x H100 SXM (NV18), 8x 200 Gb/s GPU NICs per VM (GPUDirect-TCPXO); the two sweeps are of two clusters of the machine type",
		Build:   onNodes(with(h100, func(s *NodeSpec) { s.NICs, s.NICGbps, s.Transport = 8, 200, topology.TransportTCP }), 2, 8),
		Sweeps: []CrossSweep{
			{File: "gcp-a3mega-h100_2node-16gpu_all_reduce_create-a3mega-ztan-fork.txt", Collective: AllReduce, Algorithm: Auto},
			{File: "gcp-a3mega-h100_2node-16gpu-tcpxo_all_gather_dstack.txt", Collective: AllGather, Algorithm: Auto},
		},
		Note: "two clusters, over GPUDirect-TCPXO, whose GCP profile loads a tuner plugin (NCCL_TUNER_CONFIG_PATH a3plus_tuner_config.textproto: an algorithm, protocol and channel count per size) and sets 8 MiB buffers, which the model does not read; " +
			"the all_gather's ring is NIC-bound (fitted 0.92 of line rate) and predicts the all_reduce within 3% from 1 GiB, where its tree is NVLink-bound as modelled; " +
			"below, the all_reduce grows at 39 GB/s busbw over 1-16 MiB and its tree pays a fixed ~0.9 ms at every size from 32 MiB (its time less its size over the 185 GB/s algbw it grows at), which no NCCL chunk or step rule found gives: predicted up to 2.6x too fast there",
	},
	{
		Name:    "gcp-a4-2node-roce",
		Machine: "2 GCP a4-highgpu-8g x 8x B200 (NV18, NVLink 5), 8x 400 Gb/s RoCE per VM; the two sweeps are of two clusters of the machine type",
		Build:   onNodes(with(b200, func(s *NodeSpec) { s.NICs, s.NICGbps = 8, 400 }), 2, 8),
		Sweeps: []CrossSweep{
			{File: "gcp-a4-b200_2node-16gpu-roce_all_reduce_dstack.partial.txt", Collective: AllReduce, Algorithm: Auto},
			{File: "gcp-a4-b200_2node-16gpu-roce_all_gather_dranet.txt", Collective: AllGather, Algorithm: Auto},
		},
		Note: "two clusters, by their sources: dstack's all_reduce on VMs dstack provisioned (5 warm-up and 20 timed iterations, no NCCL release printed; NVLS-tree, its algbw 0.91 of the NICs' line rate at 8 GiB) " +
			"and google/dranet's all_gather on GKE pods run by Google's gIB scripts (50 and 100 iterations, NCCL 2.26.6), a ring at 0.65 of the same NICs (260 GB/s busbw) " +
			"that takes 1 ms at 1 MiB and whose rows are out of order (2 MiB slower than 4 MiB); a 2x8 ring all_gather loads each node's NICs with its busbw as the NVLS-tree all_reduce loads them with its algbw (both modelled), " +
			"so 0.65 against 0.91 is the clusters', not the collectives'. The all_reduce's fit stops at line rate: the model's NVLS-tree fills its pipeline too slowly at 128 MiB-2 GiB " +
			"with 2.20.3's one-step chunks; with the 128 KiB chunks and 32 channels of the releases that run on B200 (Tuning226) it fits 0.948, but GCP's RDMA profile sets NCCL_NVLS_CHUNKSIZE to 512 KiB, so which chunk the run used is not known",
	},
	{
		Name:    "hgx-h100-1node-xxrjun",
		Machine: "1 node (cnode3-002), 8x H100 SXM (NV18, NVSwitch), one process per GPU; five collectives in one log, one after another",
		Build:   onNodes(h100, 1, 8),
		Sweeps: []CrossSweep{
			{File: "hgx-h100-8gpu_single-node_five-collectives_xxrjun-nccl-tests-cluster.txt", Collective: AllReduce, Algorithm: Auto},
			{File: "hgx-h100-8gpu_single-node_five-collectives_xxrjun-nccl-tests-cluster.txt", Collective: AllGather, Algorithm: Auto},
			{File: "hgx-h100-8gpu_single-node_five-collectives_xxrjun-nccl-tests-cluster.txt", Collective: ReduceScatter, Algorithm: Auto},
			{File: "hgx-h100-8gpu_single-node_five-collectives_xxrjun-nccl-tests-cluster.txt", Collective: AllToAll, Algorithm: Auto},
			{File: "hgx-h100-8gpu_single-node_five-collectives_xxrjun-nccl-tests-cluster.txt", Collective: SendRecv, Algorithm: Auto},
		},
		Note: "one machine, one run: float64 sweeps from 32 MiB to 16 GiB of each collective. " +
			"Its sendrecv up to 256 MiB is NCCL's p2p channel split, not noise: with 32 p2p channels per peer and 8 ranks NCCL gives a send 4 channels, doubling them while a channel would carry over 16 MiB, " +
			"so 64, 128 and 256 MiB run 16 MiB on each of 4, 8 and 16 channels and take about the same time (820, 826, 896 µs: 20 GB/s a channel) until 512 MiB fills the NVLinks; " +
			"the model has no per-channel rate for p2p (NCCL documents none) and predicts those sizes up to 4x too fast",
	},
	// Public corpus, third batch (issue 50, item 2): machines whose
	// published logs hold sweeps of two or more collectives
	// (testdata/SOURCES.md, "third batch").
	{
		Name:    "together-h100-8gpu-ring",
		Machine: "1 node (gpu-dp-2jvzl-pqq7p), 8x H100 SXM (NV18, NVSwitch), NCCL_ALGO=RING, NVLS off; three collectives of one run directory, one after another",
		Build:   onNodes(h100, 1, 8),
		Sweeps: []CrossSweep{
			{File: "together-h100-8gpu_single-node_all_reduce-ring_together-nccl-tests.txt", Collective: AllReduce, Algorithm: Ring},
			{File: "together-h100-8gpu_single-node_all_gather-ring_together-nccl-tests.txt", Collective: AllGather, Algorithm: Ring},
			{File: "together-h100-8gpu_single-node_reduce_scatter-ring_together-nccl-tests.txt", Collective: ReduceScatter, Algorithm: Ring},
		},
		Note: "the repository's ring config (NCCL_ALGO=RING, NCCL_NVLS_ENABLE=0) run as all_reduce, all_gather and reduce_scatter within minutes on one node (results/20260305_220043); " +
			"every operation takes at least ~35 µs (128 B to 512 KiB), all_gather and reduce_scatter a flat ~41 µs from 1 to 4 MiB, its 7-step and 14-step collectives alike: " +
			"an offset of the call, not of its steps, which the fit takes once a call (20-24 µs over the model's own latency); taken once a step (11-22 µs a step, against 2.8 µs on the HGX H100 node) " +
			"it slowed every size of the other collectives' 7 or 14 steps (all_reduce from all_gather -45% to -65% at 1-16 MiB, 29% median; 8.9% once a call), " +
			"the large sizes alone agree within 2% from the all_reduce",
	},
	{
		Name:    "hgx-h100-10node-xxrjun",
		Machine: "10 nodes (cnode3-002..011) x 8x H100 SXM (NV18, NVSwitch), 8x 400 Gb/s NICs per node, one process per GPU; five collectives in one log, one after another",
		Build:   onNodes(with(h100, func(s *NodeSpec) { s.NICs, s.NICGbps = 8, 400 }), 10, 8),
		Sweeps: []CrossSweep{
			{File: "hgx-h100_10node-80gpu-8x400g_five-collectives_xxrjun-nccl-tests-cluster.txt", Collective: AllReduce, Algorithm: Auto},
			{File: "hgx-h100_10node-80gpu-8x400g_five-collectives_xxrjun-nccl-tests-cluster.txt", Collective: AllGather, Algorithm: Auto},
			{File: "hgx-h100_10node-80gpu-8x400g_five-collectives_xxrjun-nccl-tests-cluster.txt", Collective: ReduceScatter, Algorithm: Auto},
			{File: "hgx-h100_10node-80gpu-8x400g_five-collectives_xxrjun-nccl-tests-cluster.txt", Collective: AllToAll, Algorithm: Auto},
			{File: "hgx-h100_10node-80gpu-8x400g_five-collectives_xxrjun-nccl-tests-cluster.txt", Collective: SendRecv, Algorithm: Auto},
		},
		Note: "one run of the cluster whose single node is hgx-h100-1node-xxrjun: float64 sweeps from 32 MiB to 16 GiB of each collective; " +
			"sendrecv (each of 80 ranks to the next, 10 of the 80 pairs across the network) is a flat 15.2 GB/s from 32 MiB, which the model, pricing a pair across nodes at the fitted NIC rate, puts near 45 (+190% to +215%): " +
			"NCCL gives each network peer ceil(NIC GB/s / 14) channels (NCCL_P2P_PER_CHANNEL_NET_BW, 4 here) and halves them while they times ceil(ranks / 8) exceed its 16 p2p channels (src/graph/paths.cc): 1 channel at 80 ranks, about 14 GB/s, which the model does not price; " +
			"all_gather and reduce_scatter dip at 256 MiB (150 and 146 GB/s, below the 128 MiB rows' 158 and 125-148, then 218 at 512 MiB), rows their own fit misses by +60%",
	},
	{
		Name:    "hgx-h100-2node-xxrjun",
		Machine: "2 nodes (cnode3-002, cnode3-003) of the hgx-h100-10node-xxrjun cluster, 8x H100 SXM (NV18) and 8x 400 Gb/s NICs each, one process per GPU; alltoall and sendrecv in one log",
		Build:   onNodes(with(h100, func(s *NodeSpec) { s.NICs, s.NICGbps = 8, 400 }), 2, 8),
		Sweeps: []CrossSweep{
			{File: "hgx-h100_2node-16gpu-8x400g_alltoall-sendrecv_xxrjun-nccl-tests-cluster.txt", Collective: AllToAll, Algorithm: Auto},
			{File: "hgx-h100_2node-16gpu-8x400g_alltoall-sendrecv_xxrjun-nccl-tests-cluster.txt", Collective: SendRecv, Algorithm: Auto},
		},
		Note: "the repository's pairwise run: float64 sweeps of 4, 8 and 16 GiB only",
	},
}

// CrossMinBytes is the smallest size a transfer predicts: below it
// latency, not the links, decides.
const CrossMinBytes = 1 << 20

// CrossTarget is the target median |error| of the transfer (issue 50).
const CrossTarget = 0.10

// CrossPair is one machine's collective predicted from another's sweep.
type CrossPair struct {
	Case    string     `json:"case"`
	Machine string     `json:"machine"`
	From    Collective `json:"from"`
	To      Collective `json:"to"`
	// Fitted are the efficiencies the from sweep fitted: each kind of
	// link bounding it, and the overhead of a call (µs).
	Fitted       []Fit       `json:"fitted"`
	OpOverheadUS float64     `json:"op_overhead_us"`
	Sizes        []CrossSize `json:"sizes"`
	// Median and Max are the |errors| of Sizes.
	Median float64 `json:"median_abs_error"`
	Max    float64 `json:"max_abs_error"`
}

// CrossSize is one predicted size of the to sweep.
type CrossSize struct {
	Bytes     float64 `json:"bytes"`
	Measured  float64 `json:"measured_busbw_gbps"`
	Predicted float64 `json:"predicted_busbw_gbps"`
	// Error is (predicted - measured) / measured.
	Error     float64 `json:"error"`
	Algorithm string  `json:"algorithm"`
	Protocol  string  `json:"protocol"`
	Source    string  `json:"source"`
}

// CrossSummary is the transfer over every CrossMachines entry.
type CrossSummary struct {
	Pairs []CrossPair `json:"pairs"`
	// Median and Max are the |errors| of every predicted size of every
	// pair; Count how many, Machines over how many machines.
	Median   float64 `json:"median_abs_error"`
	Max      float64 `json:"max_abs_error"`
	Count    int     `json:"count"`
	Machines int     `json:"machines"`
	// ByMachine is each machine's median |error| over its pairs' sizes,
	// in CrossMachines order; MachineMedian the median of those.
	ByMachine     []CrossMachineError `json:"by_machine"`
	MachineMedian float64             `json:"machine_median_abs_error"`
}

// CrossMachineError is one machine's median |error| over every size of
// every pair.
type CrossMachineError struct {
	Case   string  `json:"case"`
	Sizes  int     `json:"sizes"`
	Median float64 `json:"median_abs_error"`
}

// Held is whether the median of the machines' medians meets CrossTarget:
// each machine weighs alike, where the median over sizes would let one
// machine with many collectives (n sweeps make n(n-1) pairs) decide it.
func (s CrossSummary) Held() bool { return s.Count > 0 && s.MachineMedian <= CrossTarget }

// CrossCollective calibrates the model from each sweep of each
// CrossMachines entry in fsys (FitCalibration on every row, as model
// calibrate fits a file) and predicts every other collective of that
// machine at every size from CrossMinBytes.
func CrossCollective(fsys fs.FS) (CrossSummary, error) {
	var out CrossSummary
	var all []float64
	var machineMedians []float64
	for _, m := range CrossMachines {
		var mine []float64
		p := m.Build()
		sweeps := make([][]Sample, len(m.Sweeps))
		for i, sw := range m.Sweeps {
			s, err := crossSamples(fsys, sw, p)
			if err != nil {
				return out, fmt.Errorf("machine %s: %w", m.Name, err)
			}
			sweeps[i] = s
		}
		for i, from := range m.Sweeps {
			cal, err := FitCalibration(m.Name+" "+string(from.Collective), sweeps[i], nil)
			if err != nil {
				return out, fmt.Errorf("machine %s, calibrated from %s: %w", m.Name, from.Collective, err)
			}
			bw := cal.Bandwidths(nil)
			for j, to := range m.Sweeps {
				if j == i {
					continue
				}
				pair := CrossPair{Case: m.Name, Machine: m.Machine, From: from.Collective, To: to.Collective,
					Fitted: cal.Fits, OpOverheadUS: cal.Resolved().OpOverheadUS}
				var errs []float64
				for _, s := range sweeps[j] {
					if s.Bytes < CrossMinBytes {
						continue
					}
					r, err := predictWith(s, bw)
					if err != nil {
						return out, fmt.Errorf("machine %s, %s from %s: %s: %w", m.Name, to.Collective, from.Collective, s.Source, err)
					}
					e := (r.BusBWGBps - s.BusBWGBps) / s.BusBWGBps
					pair.Sizes = append(pair.Sizes, CrossSize{Bytes: s.Bytes, Measured: s.BusBWGBps, Predicted: r.BusBWGBps, Error: e,
						Algorithm: string(r.Algorithm), Protocol: string(r.Protocol), Source: s.Source})
					errs = append(errs, math.Abs(e))
				}
				if len(errs) == 0 {
					return out, fmt.Errorf("machine %s: %s: no size of %d bytes or more", m.Name, to.Collective, CrossMinBytes)
				}
				pair.Median, pair.Max = medianMax(errs)
				all = append(all, errs...)
				mine = append(mine, errs...)
				out.Pairs = append(out.Pairs, pair)
			}
		}
		out.Machines++
		med, _ := medianMax(mine)
		out.ByMachine = append(out.ByMachine, CrossMachineError{Case: m.Name, Sizes: len(mine), Median: med})
		machineMedians = append(machineMedians, med)
	}
	out.MachineMedian, _ = medianMax(machineMedians)
	out.Median, out.Max = medianMax(all)
	out.Count = len(all)
	return out, nil
}

// crossSamples reads a sweep: the first run of its collective in its file
// on the placement's rank count, every row with a bus bandwidth whose data
// check found no wrong element.
func crossSamples(fsys fs.FS, sw CrossSweep, p Placement) ([]Sample, error) {
	data, err := fs.ReadFile(fsys, sw.File)
	if err != nil {
		return nil, err
	}
	res, err := nccltests.Parse(sw.File, data)
	if err != nil {
		return nil, err
	}
	i := slices.IndexFunc(res.Tests, func(t nccltests.Test) bool {
		c, err := ParseCollective(t.Collective)
		return err == nil && c == sw.Collective && (t.Ranks == 0 || t.Ranks == len(p.Ranks))
	})
	if i < 0 {
		return nil, fmt.Errorf("%s: no run of %s on %d ranks", sw.File, sw.Collective, len(p.Ranks))
	}
	t := res.Tests[i]
	var out []Sample
	for _, r := range t.Rows {
		if r.BusBW() <= 0 || (t.WrongColumn == "#wrong" && (r.WrongOut > 0 || r.WrongIn > 0)) {
			continue
		}
		out = append(out, Sample{Placement: p, Collective: sw.Collective, Algorithm: sw.Algorithm, Bytes: r.Bytes, BusBWGBps: r.BusBW(),
			Source: sw.File + ":" + strconv.Itoa(r.Line)})
	}
	return out, nil
}
