// Package replay drives a cluster and a job trace through the whole
// pipeline — an embedded NATS server, discovery, analysis, placement (with
// its policies) and the optimizer, as `toposched serve` runs them — and
// measures what placement did: `toposched replay`.
//
// # Inputs
//
// Readers take a path and never copy a trace (the public traces are for
// research use only): the Alibaba GPU cluster trace v2023 node and pod
// lists (ReadAlibabaNodes, ReadAlibabaPods), the Microsoft ITP and Philly
// job logs (ReadITP, ReadPhilly) and SenseTime Helios (ReadHelios). They
// read columns by header name, validate every field and name file:line
// and the column in errors. Generate draws synthetic traces (Poisson
// arrivals, size mix, log-normal durations) from a seed; SyntheticCluster
// builds rail-optimized clusters of 8-GPU nodes with PCIe pods mixed in.
//
// No trace records parallel degrees or models; Shape assigns them by a
// documented, seeded rule. A job of up to one node's GPUs from a job log
// is put on one node (the logs say larger jobs span nodes); an Alibaba
// pod is always on one node.
//
// # Clocks and queueing
//
// With a speed N, arrivals are submitted at their trace time divided by N
// on the wall clock, and jobs.finished is sent N-times faster than each
// job ran in the trace, counted from its placement. Queueing delays are
// then wall time × N, and include the pipeline's own latency.
//
// As fast as possible (speed max), the replay keeps a virtual clock. It
// takes the next event, an arrival or a planned finish (finishes first at
// equal times, so GPUs freed at t are free for a job arriving at t), sets
// the clock to its time and sends it, then waits until every outcome the
// event causes has been seen before it takes the next event:
//
//   - an arrival causes exactly one outcome, the job's decided, pending or
//     rejected;
//   - a finish causes placement.released and then, while placement still
//     handles it, decisions for waiting jobs that now fit. To know they
//     have all been seen, the replay submits a barrier job (asking for a
//     GPU model no cluster has) and waits for its rejection: placement
//     handles one event at a time, so the barrier's outcome is published
//     after everything the finish caused. Without waiting jobs there is
//     nothing to wait for and no barrier is sent.
//
// A job placed when the clock reads t runs until t + its trace duration,
// so queueing delay is the virtual time between arrival and placement,
// exactly as a cluster that decides instantly would see it, independent
// of how fast this machine decides. Placement's reservation for starving
// jobs counts wall time, which means nothing under a virtual clock, so
// the replay turns it off by default (--reserve-after).
//
// Every submitted job ends in exactly one of placed (it ran; its finish
// was sent), pending (still waiting when the trace ended: nothing was
// left running to free GPUs for it) and rejected.
//
// # Fragmentation
//
// Fragmentation follows Weng et al., "Beware of Fragmentation: Scheduling
// GPU-Sharing Workloads with Fragmentation Gradient Descent" (ATC'23),
// which measures it on this Alibaba trace: the free GPUs a task cannot
// use, in expectation over the target workload. toposched allocates whole
// GPUs, so the study's partial-GPU term is zero, and a node's free GPUs
// are all usable by a job or all fragments for it. For a job class c
// (GPUs, GPUs per node, GPU model) and a node of free f GPUs:
//
//   - c is one node's worth (gpus_per_node = gpus): usable iff the model
//     matches and f ≥ gpus;
//   - c has k GPUs per node (k < gpus) or no per-node rule (k = 1): usable
//     iff the model matches, f ≥ k, and the cluster's matching nodes
//     together have room for c (Σ ⌊f/k⌋·k ≥ gpus).
//
// F(c) is the free GPUs not usable by c; the cluster's fragmentation is
// Σ_c p_c·F(c), with p_c the share of the trace's jobs of class c (the
// study's target workload: the trace's own mix), and fragmentation_mean
// is its ratio to the free GPUs, averaged over the timeline (400 evenly
// spaced points of trace time). CPU and memory are not modelled
// (toposched does not place them). The study's target workload, not the
// jobs waiting at the time, is the reference: for a scheduler that places
// whatever fits, the free GPUs are by construction of no use to any job
// still waiting, so that count says nothing.
//
// # Figures
//
// Decision latency is the wall time from a job's submission to its first
// outcome (through analysis, placement and JetStream). Decisions per
// second counts placement's outcomes for trace jobs (including decisions
// of waiting jobs) over the replay's wall time; under the virtual clock
// events are sent one at a time, so it is a sequential rate — the burst
// mode (--burst) measures throughput under load. Predicted comm time is
// taken from each placement.decided: its prediction and its blind
// baseline (blind first fit on the same cluster state, scored by the same
// cost model).
package replay
