// Package replay drives a cluster and a job trace through the whole
// pipeline — an embedded NATS server, discovery, analysis, placement (with
// its policies) and the optimizer, as `toposched serve` runs them — and
// measures what placement did: `toposched replay`. One difference: the
// optimizer proposes no migrations (optimizer.Config.NoMigrations), since
// nothing in a replay accepts one; a proposal changes no decision until
// it is accepted, and planning them was over a third of a replay's CPU.
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
//     nothing to wait for and no barrier is sent; nor does the replay
//     then wait for each release before the next finish: it sends every
//     finish due before the next arrival and waits for their releases
//     together (a release decides nothing while nobody waits, so the
//     order placement handles them in changes nothing;
//     TestShortcutsChangeNothing).
//
// A job placed when the clock reads t runs until t + its run time (see
// Run time below), so queueing delay is the virtual time between arrival
// and placement,
// exactly as a cluster that decides instantly would see it, independent
// of how fast this machine decides. Placement reads the virtual clock
// too (operator.Deps.PlacementNow), so that its reservation for a
// starving job (--reserve-after: the head of the queue, once it has
// waited that long, gets nodes no later job may take) counts trace time
// as a cluster would; with the reservation on, a finish while jobs wait
// is followed by a barrier, since placement's retry looks at the head's
// wait before the clock may move on, until the head of the queue has
// waited longer than --reserve-after: from then on the retry's answer no
// longer depends on the clock, and only a job that may fit calls for the
// barrier (TestShortcutsChangeNothing, TestReservationSettled). The
// replay runs the reservation as serve does by default (after 5 minutes;
// --reserve-after -1s turns it off). Nor does topology-aware's local search stop on the
// wall clock (serve's 2 ms; placement.Config.SearchBudget): each
// decision is bounded by its cost-model evaluations alone, so a replay
// gives the same figures on an idle machine and a loaded one
// (TestReplayIsDeterministic). Every strategy honours the reservation,
// and the node policies:
// blind and the peers take GPUs only of the nodes placement's node filter
// allows, as topology-aware does, so strategies compare under one queue
// and one set of rules. Under --speed N placement keeps the
// wall clock, so a reservation there comes after the wall time given.
// Topology-aware's wait for a compact placement (--max-stretch, see
// placer.Compact) is topology-aware's own and not the peers': a job
// spread over nodes that it keeps waiting fits by counts, so it calls
// for the barrier after each finish, as any job that may fit does.
//
// Every submitted job ends in exactly one of placed (it ran; its finish
// was sent), pending (still waiting when the trace ended: nothing was
// left running to free GPUs for it) and rejected.
//
// After a finish, the barrier is sent only when a waiting job may fit in
// the GPUs now free, by counts (a no is certain): otherwise placement has
// nothing to decide. Each barrier is a job placement calls impossible, and
// before it does so it catches up with the topology stream: a stream-info
// request when nothing new is stored, else an ordered consumer the server
// keeps for 5 minutes; the replay's own server lifts nats-server's
// default limit of 1,000 consumers per stream, in case a replay makes
// that many.
//
// # Run time
//
// A trace records how long each job ran on whatever GPUs it had; if a
// replay kept that duration whatever it placed, placement could not change
// queueing or completion time. So a job's run time is its trace duration
// times its stretch: its step time on the placement it got over its step
// time on an ideal placement of the same size (Stretch),
//
//	run = duration × (compute + comm) / (compute + comm_ideal)
//
// with the cost model's view of a step: compute, then communication, no
// overlap. comm is the communication per step the job's placement.decided
// predicts; comm_ideal the least the cost model predicts among the
// placements every strategy the placement service runs chooses for the
// job on the empty cluster (computed once per job shape before the
// replay). compute (ComputeSeconds) is the job's step_compute_seconds when
// it has one, which no trace gives; else 6 FLOPs per parameter per token
// (Kaplan et al. 2020) over the step's tokens (global batch × sequence,
// from Shape's model) shared by the job's GPUs at ReferenceFLOPS (an
// A100's bf16 peak at 40% utilisation); else, with no model size, the
// compute share of ComputeShare (80% of the ideal step for 2-8 GPUs, 70%
// for 9-64, 60% above). By default (--compute blind) compute does not
// depend on the GPU model placed on: the trace's durations are taken to
// include the GPUs that ran them, and only what placement decides,
// communication, is scaled. A one-GPU job communicates nothing and keeps
// its duration; so does a job whose decision carries no prediction (the
// summary's notes count them).
//
// With --compute per-model (Config.ComputeReference) the trace's
// durations are taken as measured on a stated reference model
// (--compute-reference, default a100), and compute follows the model a
// job lands on:
//
//	run = duration × (compute_on + comm) / (compute + comm_ideal)
//
// where compute is the job's compute on the reference model, as above,
// and compute_on its compute on the slowest GPU model among its nodes (a
// synchronous step waits for its slowest rank): its own
// step_compute_seconds_by_model for that model where given, else scaled
// by the ratio of the models' speeds in internal/gpuspeed's table
// (sqrt(bf16 TFLOPS × memory GB/s)). So a one-GPU job on a T4 runs 5.5
// times its duration and on an H100 0.44 times it; a job on a model the
// table does not know keeps the reference's compute (the summary's notes
// count them). The every-run-ideal figures keep the trace duration (an
// ideal placement on the reference model) as the ideal run, so a capture
// charged per model counts a faster model's gain too and can pass 100%.
// Placement weighs the same compute in its choice (placement.Config's
// ComputeReference); --compute charge-only charges it with placement
// blind to it, to tell the two apart.
// ReferenceFLOPS and ComputeShare were fixed before any replay with them
// was run, and are not fitted to a trace. The compute from the model's
// size is the placer's own estimate (aware.StepCompute), which
// topology-aware's best fit within a tolerance weighs a slower link
// against: the replay charges the step time placement predicted.
//
// The figures users and papers report follow (Summary.Finished, MultiGPU,
// BySize, over finished jobs): job completion time (arrival to end: mean,
// p50, p90, p99), queueing delay, bounded slowdown against ideal
// (max(JCT, 10 s) / max(duration, 10 s): the job placed ideally the
// moment it arrived), the run's stretch alone, the mean JCT had every run
// been ideal with the waits as they were (where no job waited, the least
// any strategy could reach), GPU-hours and the part of them spent
// communicating, and the makespan, each by job-size bucket (1, 2-4, 5-8,
// 9-32, 33+ GPUs).
//
// With blind first fit among --compare's strategies, each run also gets
// its figures against blind's (Summary.VsBlind, CompareWithBlind): for
// all finished jobs, the multi-GPU ones and each size bucket, its job
// count and mean JCT beside blind's, their ratio, and the capture of the
// every-run-ideal gain,
//
//	capture = (blind − strategy) / (blind − ideal)
//
// where blind and strategy are the bucket's mean JCTs and ideal is
// blind's mean JCT had every run taken its ideal placement's run time
// (its trace duration), blind's waits kept (blind's
// JCTIdealRunMeanSeconds): the gain better placements alone would have
// given blind's own schedule, (blind − ideal) / blind of blind's mean
// (ideal_gain, in the table's row names). A capture of 1 is that gain
// reached; above 1 the strategy's waits were shorter than blind's too (on
// a busy trace its shorter runs free GPUs sooner); below 0 the bucket's
// jobs finished later than under blind. The ratio is undefined where either side
// finished no job of the bucket or blind's mean JCT is 0 (jobs of no
// duration that never waited), the capture also where blind loses less
// than a thousandth of its mean JCT to its placements (one-GPU jobs, which
// keep their durations; a capture of a gain that small is noise):
// summary.json omits them and the table shows "-". The means are over
// the jobs each run finished, which are the same jobs when both runs
// finish the trace (the counts stand beside them).
//
// # Peers
//
// --compare replays the same trace under several of the placement
// service's strategies, each on its own embedded server: topology-aware,
// blind first fit, and what other schedulers would do (internal/placer):
// binpack (Volcano's binpack: the fullest node that fits), spread (the
// Kubernetes scheduler's least-allocated), gpuallocator (NVIDIA
// go-gpuallocator's best-effort pair scores inside nodes taken first fit)
// and random. Every one of them waits and rejects exactly when blind does;
// they differ only in which GPUs they take. Where the placement policies
// deny the placement one finds for a job with tensor-parallel groups, it
// asks once more with each group on one node (one pod a group, in its own
// node order: placer's judged), as its users would run the job.
//
// # Bad input
//
// Records that are well-formed but cannot be replayed are counted by
// reason in the trace's (and summary's) skipped records and left out:
// a duration missing or negative, no GPU, a submission earlier than the
// record above it in the logs kept in submission order (ITP, Helios), a
// pod that ends before it starts (Alibaba). A malformed value (not a
// number, a bad id, a duplicate) is an error naming file:line and the
// column.
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
// cost model). A topology-aware decision is never predicted slower than
// its baseline (aware's notWorse) but where the policies refuse the
// baseline's GPUs, and for best fit within a tolerance: a tighter fit may
// cost more communication while its step time (compute included) stays
// within the tolerance of the fastest, so on a busy trace the mean
// communication can come out above the baseline's while the jobs finish
// sooner.
package replay
