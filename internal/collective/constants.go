package collective

// Efficiencies: the share of a link's line rate (topology.Bandwidths) a
// large NCCL transfer achieves. One figure per link type, from NCCL
// maintainers' public statements, not fitted to the validation cases:
//
//   - EffNVLink 0.80: "line rate 25 GB/s per NVLink per direction, ~20 GB/s
//     effective with 128B payload" (sjeaugey, NVIDIA/nccl-tests#149), and
//     "450 GB/s is line rate with ~20% protocol overhead" for H100
//     (sjeaugey, NVIDIA/nccl-tests#212).
//   - EffNVLS 0.611: NVLS (in-switch reduction) all-reduce algbw per GPU
//     port line rate: "peak busbw ~480 GB/s (algbw ~275 GB/s)" on 8x H100,
//     275/450 (sjeaugey, NVIDIA/nccl-tests#212).
//   - EffNet 0.96: "peak ~24 GB/s per 200G NIC, 12 GB/s per 100G NIC"
//     (sjeaugey, NVIDIA/nccl-tests#119 and #29): 24/25.
//   - EffPCIe 0.80: PCIe Gen3/4 x16 DMA reaches about 80% of the raw
//     rate after TLP headers and flow control (12-13 GB/s of 15.75 on
//     Gen3, 25-26 of 31.5 on Gen4: the usual p2pBandwidthLatencyTest and
//     bandwidthTest figures). Also used for the inter-socket link.
//
// SHMShare 0.75 is the share of a PCIe P2P path's bandwidth that a pair of
// GPUs gets where P2P is off (topology.Node.P2P) and NCCL moves the data
// through host memory instead (its SHM transport, src/transport/shm.cc,
// chosen when p2pCanConnect in src/transport/p2p.cc refuses the pair; the
// path is rerouted GPU -> CPU -> GPU by addInterStep in
// src/graph/paths.cc): "12GB/s instead of 9 or 6" on PCIe Gen3 (sjeaugey,
// NVIDIA/nccl#406), 9 of 12. The 6 is two GPUs' host traffic on one
// link: GPUs under one PCIe switch (PIX, PXB) share its uplink to the
// host, which the model has as the node's host link.
const SHMShare = 0.75

const (
	EffNVLink = 0.80
	EffNVLS   = 0.611
	EffNet    = 0.96
	EffPCIe   = 0.80
)

// Latencies. A step of an NCCL algorithm costs more than the wire's hop
// latency (topology.Bandwidths.LatencyUS, 0.6 µs over NVLink, 5 µs over
// the network): the Simple protocol's per-step synchronisation. NCCL's
// tuning tables (src/graph/tuning.cc) charge about 3.4 µs per ring step
// over NVLink and 14 µs per step over the network, plus a base latency of
// about 8.4 µs per operation; the model takes those orders:
//
//   - OpLatencyUS 8.4 per collective call (launch and setup);
//   - StepOverheadUS 2.8 per step on top of the hop's latency (0.6 + 2.8
//     = 3.4 µs per NVLink step);
//   - NetStepOverheadUS 6.2 more per network step (5 + 2.8 + 6.2 = 14).
const (
	OpLatencyUS       = 8.4
	StepOverheadUS    = 2.8
	NetStepOverheadUS = 6.2
)

// NVLSMinGen is the NVLink generation from which NVSwitch nodes reduce in
// the switch (NVLink SHARP, third-generation NVSwitch with H100).
const NVLSMinGen = 4
