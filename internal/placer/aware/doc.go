// Package aware is the topology-aware placement strategy ("topology-aware",
// the default; blind first fit stays as the baseline) and the exhaustive
// optimum it is measured against ("exhaustive").
//
// Place makes one joint decision over every level: which nodes, which GPUs
// inside them, and which rank runs on which GPU (each rank then uses its
// GPU's nearest NIC, as the cost model routes it). Every candidate is
// scored by the same cost model (Predict, built on collective.EvaluateJob):
// the analysed job's groups, per dimension, with their collectives' bytes
// and calls per step, on the chosen GPUs.
//
// # Stages
//
// place (place.go) is a driver over five stages, one a file, each with
// its input and output types (internal/placer/README.md draws them):
//
//   - walk.go, walkStage: the nodes the job may use (walked), or a Wait
//     when the Filter leaves too few.
//   - single.go, singleStage: the single-node exact choice, for a job one
//     node can hold: the one-node candidates (a shortlist).
//   - multi.go, multiStage: the multi-node choice, the fabric domains that
//     hold the job and the spread over their nodes, and the alternatives.
//   - judge.go, judgeStage: the policies' choice among the shortlist, and
//     the Compact rule; also notWorse, the check against the blind
//     baseline.
//   - search.go, searchStage: the local search on the chosen candidate,
//     whose result is judged again.
//
// options.go holds the strategy's names and defaults, shares.go the exact
// choice of each node's share after the search, predict.go the cost
// model every stage scores with, and exhaustive.go the exhaustive
// optimum. The request and the policies' types are package engine's
// (Options below is engine.Options). The synthetic jobs of the
// benchmarks and tests are internal/fixtures' SyntheticJob.
//
// # Validity
//
// Place first asks blind.Place: a request blind rejects (Never) or cannot
// fit now (Wait) gets blind's verdict and reasons unchanged, so both
// strategies explain themselves alike. A Filter that leaves too few GPUs
// turns a placement into a Wait with blind's reason codes.
//
// # Domain choice
//
// The candidate GPUs are the free (healthy, unheld) GPUs of the requested
// model on nodes the Filter accepts. The job goes into the smallest domain
// that holds it: inside one node, the smallest node-local domain of the
// store (NVLink island, then PCIe switch group, then NUMA node, then the
// node) with enough free GPUs; across nodes, the smallest fabric domain
// (leaf, then pod/spine, then core, then the cluster) whose nodes offer
// enough. Across nodes a node offers its free GPUs in whole units: the
// job's innermost group size (TP when the layout puts TP first, so TP
// groups stay on nodes), or gpus_per_node exactly; when whole units
// do not suffice, single GPUs. Where Options.Compact keeps the tightest
// domain's spread waiting, the job is spread in up to 16 other domains, in
// the same order, and the first that Compact lets start and the judge
// allows is taken (judge.go, elsewhere): on a mixed cluster the tightest
// leaf may be one of slow nodes while a leaf of fast ones is free.
//
// # Large clusters
//
// On a cluster with more than Options.ScopeNodes nodes with free GPUs of
// the job's model (DefaultScopeNodes), a job no node holds does not walk
// every node: the store's free counts per leaf and pod name the domains of
// the smallest level that may hold it, the tightest first, and their nodes
// alone are read, until up to 16 of them (at most four whose free GPUs are
// mostly of one model) are found to offer the job as it will be spread.
// The job is spread in each, and the fastest spread by the cost model is
// the favourite; the alternatives and the local search use those domains'
// nodes; a judge that denies them all gets the whole cluster's candidates.
// Where no leaf or pod holds the job, or 1,024 nodes were read without
// finding one, every node is walked as on a small cluster. Against the
// whole-cluster walk on seeded mixed clusters of 1,536 nodes
// (TestScopedAgainstClusterWalk), the scoped choice was faster by more
// than 2% in 50 of 144 decisions and slower in 1.
//
// # Alternatives across nodes
//
// A job spread over nodes, and a job one node holds whose best one-node
// choice crosses the inter-socket link (SYS, which the cost model shares
// among the node's flows), also gets other spreads scored: for each other
// dimension whose groups move more bytes per rank and step than the
// innermost one (the synthetic jobs' DP all-reduce of 1 GiB against TP's
// eight of 64 MiB), its groups kept whole on nodes and the lighter
// dimension across them (the favourite's GPUs regrouped, or a spread in
// that dimension's units) — but not for a job whose favourite keeps its
// TP groups whole on nodes: TP's collectives are on every layer's critical
// path while DP's all-reduce overlaps the backward pass, which the cost
// model (summing communication) does not see, so TP comes first as the
// design says; and, where a node's share crosses sockets,
// spreads whose nodes offer one socket's free GPUs each. One of them
// replaces the favourite only when faster by 0.5%; for a job of at most
// 16 GPUs the favourite is refined by the local search too and stays
// unless the alternative is still faster by 0.5% after it, so that ties
// keep fewer nodes and groups whole.
//
// # Best fit
//
// Among domains of the same level the one with the fewest free GPUs that
// still fits wins, so big free blocks stay whole: a 1-GPU job goes to the
// node with the fewest free GPUs and, inside it, to the GPU whose own
// island/PCIe group has the fewest free GPUs (a lone GPU before one of a
// free NVLink pair; a broken node before a whole free one). Inside a node
// the subset is grown greedily from each seed by bandwidth to the GPUs
// already taken (then best fit), and the best by bottleneck and total
// bandwidth is kept. Up to Options.Candidates single-node candidates (by
// level and fit) are scored by the cost model; the fastest wins, ties
// (within 0.5%) going to the better fit. On each of those nodes whose free
// GPUs are not all alike (an NVSwitch node's are), the choice is then made
// exactly when affordable: every subset of its free GPUs and every rank
// order on it, twins (GPUs with the same link to every other free GPU and
// the same hole) tried once, or, where that leaves fewer, one order per
// class of ranks the cost cannot tell apart (a group's cost inside a node
// depends on its GPUs, so a TP x DP grid's blocks may be permuted, and the
// positions in every block alike; a job of one group needs its subsets
// only), while those choices fit in Options.NodeExact (2,000 cost-model
// evaluations for the candidates together: up to all 8 GPUs of a node of
// bridged pairs or PCIe switch pairs, 5 of 10 where every GPU differs);
// the heuristic's choice stays unless one is faster by 0.5%,
// or as fast with fewer holes (whole pairs, switches and NUMA nodes kept
// for the next job). Across nodes, nodes are taken
// within the chosen domain leaf by leaf (fullest leaves first), the
// largest offers first, and the remainder from the node whose offer fits
// it most tightly.
//
// # Compute by GPU model
//
// With Options.ComputeReference set (bymodel.go) a candidate's compute is
// the job's on the slowest GPU model it takes, scaled from the reference
// model by internal/gpuspeed (the job's own step_compute_seconds_by_model
// where it gives them), and its predicted step time is that plus its
// communication: in the fastest one-node choice, in best fit within the
// tolerance below, in the blind baseline's check, in a one-GPU job's
// picks (those within the tolerance of the fastest model first on a busy
// cluster, the fastest model's elsewhere; the walk then reads every node)
// and in a judged candidate's cost (step time over the fastest's plus the
// policies' score). Multi-node spreads are still compared by their
// communication alone. Without it compute is the same on every model.
//
// # Best fit within a tolerance
//
// Whole fast nodes are what whole-node jobs wait for, so a job one node
// holds weighs what its placement costs the next jobs against what it
// saves this one (bestFitWithin, single.go). Where its step compute time
// is known (step_compute_seconds, else StepCompute's estimate from its
// model's size at ReferenceFLOPS) and the cluster is busy (at most half
// the GPUs of its model free), the one-node candidates whose predicted
// step time, compute plus communication, is within Options.FitTolerance
// (DefaultFitTolerance, 15%) of the fastest one-node candidate's may be
// taken instead: the one leaving its node the fewest free GPUs (best fit
// across nodes, as Volcano's binpack), on ties the one whose node's free
// GPUs are the less tightly joined (a PCIe box before a whole NVSwitch
// node or NVLink island), then the faster. A 2-GPU data-parallel job
// whose step is 9% slower on a PCIe box's free pair takes the pair and
// keeps the NVSwitch node whole (so does a 4-GPU one, 14% slower under
// one PCIe switch); a 2-GPU tensor-parallel job, 44% slower there, and
// an 8-GPU data-parallel one, 17% slower on a PCIe tree, keep the
// fastest. The blind baseline's check (see Validity) then takes blind's
// GPUs only when the chosen step is longer than blind's by more than the
// tolerance. Without a compute time, on a
// cluster more than half free, or for one GPU, the fastest candidate
// wins as above.
//
// With a forecast of demand (Options.Demand, internal/demand: arrival
// rates by job size and pinned GPU model, the queue, the running jobs'
// expected ends), which the placement service keeps, a tighter fit slower
// than the fastest by more than 0.5% is taken only where the fastest
// node's shape is likely needed before this job ends (fitTrade, trade.go):
// the jobs of MinGPUs or more (more than the node would keep free, and at
// least this job's size) waiting or expected to arrive within the job's
// learned run time outnumber, with probability 0.5 or more, the other
// nodes of that model as free and the running jobs due to free one.
// Otherwise the faster placement is taken. The explanation's FitTrade
// says which way it went and the expected cost to each side. BENCHMARKS.md ("Issue 17: best fit within a tolerance")
// says how the tolerance was chosen.
//
// # Policies
//
// Options.Filter drops nodes before anything else (node policies);
// Options.Judge judges candidate placements (placement policies: deny,
// warn, score). The favourite candidate is judged first; when it is
// allowed and scores nothing, it wins after one judgement. Otherwise the
// first Options.Candidates candidates are judged — the one-node candidates
// in the order above, then one candidate per fitting fabric domain (the
// tightest leaves, then pods, then the cluster) — and, while every one is
// denied, up to 16. The allowed candidate of least cost wins, cost being
// its comm time relative to the fastest judged plus its score, so a score
// of 1 weighs as much as doubling the comm time. When all are denied,
// Place answers Wait with the favourite's deny reasons (Explain says
// PolicyDenied). The local search's result is judged again and kept only
// if allowed. Options.Explain collects the levels tried and the candidates
// judged, for the decision's explanation.
//
// # Rank mapping
//
// Ranks follow the analysed layout (fastest-varying dimension first):
// consecutive ranks get GPUs of the same node, inside the node in a chain
// of best links (NVLink island members together), and nodes come leaf by
// leaf. So TP groups land inside NVLink domains, CP/EP next, DP rings run
// along the fabric (node after node of one leaf before the next leaf), and
// PP stages are contiguous blocks of neighbouring nodes.
//
// # Local search
//
// The mapping is refined on the predicted comm time per step by first-
// improvement local search over (a) rank swaps within a node, (b) swaps of
// a taken GPU with a free one of the same node, (c) rank swaps across nodes
// for jobs of at most 16 GPUs, and (d), for such jobs spread over nodes or
// crossing a node's inter-socket link, without gpus_per_node: a taken GPU
// for a free one of another node the job uses, or for the best-fit GPU of
// one of up to 8 nodes it does not use (nearest fabric domain, then best
// fit), the latter kept only when faster by 0.5%. It stops at a pass
// without improvement, after Options.MaxEvals cost-model evaluations
// (default 200) or after Options.Budget (default 2 ms, counted from the
// scoring of the alternatives where there are some; negative: no
// wall-clock bound, as replays on a virtual clock run it), whichever
// comes first; MaxEvals < 0 turns it off. Then a job of at most 16 GPUs over
// several nodes gets each node's share chosen exactly with the other
// nodes' GPUs as they are (exactShares: every order of that many of the
// node's free GPUs, twins with the same links and NIC paths once, while
// the choices fit in a quarter of Options.NodeExact), kept when faster by
// 0.5%.
//
// # Exhaustive
//
// Exhaustive enumerates every subset of the candidate GPUs (respecting
// gpus_per_node) and every rank order on it, scoring each with Predict,
// and returns the optimum under the cost model. It refuses when the number
// of evaluations, C(free, n) · n!, exceeds ExhaustiveLimit (2e5).
package aware
