// Package pattern turns a submitted job into its communication pattern:
// the resolved parallel degrees, the rank layout, for every parallel
// dimension the groups of ranks that communicate, and what each group sends
// in a training step. It validates what the schema cannot (the arithmetic
// between gpus, the degrees and the model's shape, and explicit groups) and
// returns the reasons an invalid job is rejected for, each naming the
// field (such as "model.heads") and the arithmetic that failed.
//
// # Rank layout
//
// The default layout follows Megatron-LM: the fastest-varying dimension
// first, tp → cp → ep → dp → pp, with expert parallelism carved out of the
// data parallel ranks (ep divides dp). A global rank r has coordinates
//
//	tp_i = r mod tp, cp_i = (r / tp) mod cp, dp_i = (r / (tp·cp)) mod dp,
//	ep_i = dp_i mod ep, pp_i = r / (tp·cp·dp)
//
// and a group of dimension d is the set of ranks that differ only in d. A
// job may name another order in its layout field ("dp-tp-cp-ep-pp"), any
// permutation of the five; dp groups always span the ep and dp coordinates.
//
// # Volumes
//
// Notation: P parameters, L layers, h hidden size, s sequence length, b
// micro-batch size (absent: 1), B global batch size, e bytes per element of
// dtype (fp32 4, bf16 and fp16 2, fp8 1), k top_k (absent: 1), and
// m = B / (b·dp) micro-batches per step on each pipeline. A stage holds L/pp
// layers. Bytes is the message size of one call per rank as nccl-tests
// counts it (the buffer of an all-reduce, the gathered output of an
// all-gather, the input of a reduce-scatter, a rank's whole buffer of an
// all-to-all, one message of a send/recv), so that the cost model applies
// its α-β formulas to it directly.
//
// Data parallel (dp groups), with G = P·e/(tp·pp), a rank's share of the
// gradients and of the parameters:
//
//   - ddp, megatron (and no strategy): one all-reduce of G per step. With
//     gradient bucketing it is several calls of the same total; one logical
//     all-reduce is reported (PyTorch DDP, Li et al. VLDB 2020).
//   - zero1, zero2: reduce-scatter of G and all-gather of the updated
//     parameters, G, once each per step: 2Ψ like DDP (Rajbhandari et al.,
//     "ZeRO", SC'20, §7.2.1). Megatron's distributed optimizer is zero1.
//   - zero3, fsdp: all-gather of G twice (forward and backward) and
//     reduce-scatter of G once: 3Ψ, 1.5× DDP (ZeRO §7.2.2; Zhao et al.,
//     "PyTorch FSDP", VLDB 2023).
//   - ps: parameter servers sharded over the workers themselves (BytePS,
//     Jiang et al. OSDI'20 colocated mode): a push of the gradients and a
//     pull of the parameters, each an all-to-all of G per step. An
//     all-to-all, not a reduce-scatter, since a server sums what arrives
//     rather than reducing in a ring: its cost is set by incast and
//     bisection. ps with tp, pp, cp or ep above 1 is rejected.
//
// Tensor parallel (tp groups): all-reduce of the activations
// b·(s/cp)·h·e, twice in forward and twice in backward per layer per
// micro-batch: 4·(L/pp)·m calls (Narayanan et al., "Efficient Large-Scale
// Language Model Training on GPU Clusters Using Megatron-LM", SC'21, §3.3;
// Shoeybi et al. 2019 §3). With sequence parallelism each all-reduce is an
// all-gather plus a reduce-scatter of the same buffer, the same bus bytes;
// it is reported as the all-reduce. Embedding and logit all-reduces are
// left out.
//
// Pipeline parallel (pp groups, members ordered by stage): a send/recv of
// the activations b·(s/cp)·h·e per micro-batch from each stage to the next
// in forward, and of their gradients back in backward: m calls each way
// (Narayanan et al. §3.3; without the scatter/gather optimization of §4.1,
// which divides the message by tp, and without interleaving, which
// multiplies the calls by the virtual stages).
//
// Context parallel (cp groups): per layer per micro-batch, an all-gather
// of K and V in forward, another in backward, and a reduce-scatter of their
// gradients in backward, each of 2·b·s·(h/tp)·e (each rank contributes its
// s/cp tokens: 2·b·(s/cp)·(h/tp)·e). Megatron-Core runs these as ring
// send/recv overlapped with attention (Liu et al., "Ring Attention", 2023);
// the bus bytes are the same. Gradients are reduced over dp·cp ranks in
// Megatron-Core; here the gradient all-reduce is reported on dp groups
// only.
//
// Expert parallel (ep groups): an all-to-all of the routed tokens
// b·(s/cp)·h·k·e per MoE layer per micro-batch, dispatch and combine in
// forward and again in backward: 4·(L/pp)·m calls (Lepikhin et al.,
// "GShard", 2020; Fedus et al., "Switch Transformer", 2021). Every layer is
// taken to be an MoE layer, and expert parameters are counted in G as if
// dense.
//
// Explicit groups (custom): as the job gives them; those of one name become
// the members of one custom dimension.
//
// A call is latency-bound when its message is under LatencyBoundBytes
// (256 KiB) and bandwidth-bound otherwise: below it NCCL's low-latency
// protocols run and the per-call α term of the cost model dominates.
//
// bytes_per_step_per_rank is the most any rank sends per step with
// bandwidth-optimal algorithms: bytes × calls × nccl-tests' bus factor,
// 2(n-1)/n for all-reduce, (n-1)/n for all-gather, reduce-scatter and
// all-to-all, 1 for broadcast and send/recv (at the sender only: the last
// stage sends nothing forward, the first nothing backward).
// total_bytes_per_step adds it over all ranks. A volume whose inputs the
// model lacks is left out and named in warnings.
//
// # Bounds
//
// A job is bounded before any work on it, each bound with its own reason
// naming the field and the limit: at most MaxGPUs GPUs (too_many_gpus),
// MaxLabels labels of keys up to MaxLabelKeyLength and values up to
// MaxLabelValueLength characters (too_many_labels, label_too_long; the
// schema says the same), MaxGroups explicit groups (too_many_groups) of
// MaxGroupRanks ranks in all (too_many_group_ranks). Then, before the
// groups are built, AnalyzedSize works out the size of the jobs.analyzed
// body from gpus, the degrees and the explicit groups; past
// MaxAnalyzedBytes (one NATS message less its headers) the job is rejected
// with analysed_too_large rather than expanded into an event NATS would
// refuse. A rejection lists at most MaxReasons reasons, the rest counted
// in the last.
package pattern
