package collective

// Ramp: how NCCL cuts a collective into channels, loops and chunks, and
// the pipeline fill that follows for a message only a few chunks long.
//
// NCCL runs a collective on nChannels channels (one thread block each);
// each channel moves its share in loops, a loop a chunk per step. A chunk
// is forwarded only once it is whole (Simple protocol: prims_simple.h
// waits for a slice's data and posts it as one step), so a chain of
// stages (a tree's hops, NVLS's scatter, reduce and gather) is a pipeline
// of chunks: with U chunks per channel and stages taking t_1 .. t_k per
// chunk, the last chunk leaves after sum(t_i) + (U-1) max(t_i). The
// bandwidth term is U max(t_i); the fill is (sum(t_i)/max(t_i) - 1) / U of
// it. It only ever adds time and it vanishes as U grows, so a calibration
// fitted at large sizes (FitCalibration, >= FitMinBytes) is left as it
// was, and the ramp applies to whatever efficiency is in force.
//
// Where each number comes from (NVIDIA/nccl, as of releases 2.18-2.20,
// the ones with NVLS-tree; read through the repository's search index):
//
//   - src/include/device.h: NCCL_STEPS 8; src/include/collectives.h:
//     ALLREDUCE_CHUNKSTEPS NCCL_STEPS/2, ALLREDUCE_SLICESTEPS NCCL_STEPS/4;
//     src/init.cc DEFAULT_BUFFSIZE (Simple) 4 MiB. A step is buffSize /
//     NCCL_STEPS = 512 KiB, a ring chunk ALLREDUCE_CHUNKSTEPS steps (2 MiB),
//     any other algorithm's chunk one step (chunkSteps 1).
//   - src/graph/tuning.cc: threadThresholds LL 8 (times nRanks for
//     ring), LL128 8, Simple 64 bytes per thread; maxThreads Simple and LL
//     512, LL128 640.
//   - src/enqueue.cc getAlgoInfo: "while (nBytes < nc*nt*threadThreshold)
//     { if (nc >= 2) nc--; else if ((nt % 128) == 0) nt/=2; else break; }"
//     for ring and tree; NVLS and NVLS-tree run on nvlsChannels ("NVLS
//     should not need more than 16 channels to get peak BW": 16; from the
//     releases that run on Blackwell, 32 on it: NVLS_NCHANNELS_SM100 in
//     src/transport/nvls.cc at v2.26.6-1).
//   - src/enqueue.cc computeColl (the version with ncclDevWorkColl and
//     NCCL_ALGO_NVLS_TREE, 2.19-2.20): the tree Simple chunk halves from
//     one step "while (nBytes / (nChannels*chunkSize) < depth*8 &&
//     chunkSize > 131072)", then "< depth*4 && > 65536", then "< depth &&
//     > 32768"; NVLS caps the chunk at 128 KiB and, with concurrentOps =
//     nChannels*nHeads, drops it to 64 KiB below 64 x concurrentOps x
//     chunk, to 32 KiB below 8x, to 16 KiB below 2x; NVLS-tree drops a one
//     step chunk to 256 KiB below 32 x concurrentOps x chunk, 128 KiB below
//     16x, 64 KiB below 4x, 32 KiB below 1x; on 4 nodes or more it starts
//     at 64 KiB ("nNodes >= 4 ? 65536 : chunkSize"). From 2.21.5 (src/
//     enqueue.cc calcCollChunking) the NVLS-tree chunk starts at
//     comm->nvlsChunkSize, NCCL_NVLS_CHUNKSIZE's default 128 KiB, not one
//     step: four times the loops, a quarter of the fill
//     (Tuning.NVLSTreeChunk).
//   - src/device/all_reduce.h (commit 0e35f5d3902f): a ring loop is
//     nChannels*nRanks*chunkSize and its chunk min(chunkSize,
//     divUp(remaining, nChannels*nRanks)) rounded up to
//     (nthreads-WARP_SIZE)*8 bytes; a tree loop nChannels*chunkSize
//     (runTreeSplit: reduce up and broadcast down by two thread groups at
//     once, so a chunk's path is the tree's depth up, then down); NVLS a
//     loop nChannels*nHeads*chunkSize through three thread groups
//     (scatter, reduce-and-multicast, gather), NVLS-tree through four
//     (scatter, reduce and send up the tree, receive and multicast,
//     gather) with the network tree's levels between.
//
// The ring has no fill: every rank sends its own chunk at the first step,
// every link carries 2(n-1) chunks a loop, and a chunk's 2(n-1) hops are
// no longer than that, so the pipeline is full from the start
// (ringChunking is kept for what NCCL's loops are, not for a cost). LL and
// LL128 forward each 8- or 128-byte line as it lands, so their pipeline
// unit is a line, not a chunk: no fill either. The ramp is Simple's, on
// tree, NVLS and NVLS-tree.
//
// NCCL's channel count comes from its graph search, which the model does
// not run: treeChannels approximates it (see there).

import "math"

// NCCL constants (see above).
const (
	ncclSteps           = 8
	simpleBuffBytes     = 4 << 20
	simpleStepBytes     = simpleBuffBytes / ncclSteps
	allReduceChunkSteps = ncclSteps / 2
	allReduceSliceSteps = ncclSteps / 4
	warpSize            = 32
	// NVLSChannels is nvlsChannels, the channels NVLS and NVLS-tree run
	// on (NCCL_NVLS_NCHANNELS' default, 2.17-2.20; on Hopper after, and
	// Tuning.NVLSChannelsSM100 on Blackwell).
	NVLSChannels = 16
)

// threadThreshold and maxThreads are tuning.cc's, by protocol (LL,
// LL128, Simple); ring LL's threshold is multiplied by nRanks.
var (
	threadThreshold = [3]float64{8, 8, 64}
	maxThreads      = [3]int{512, 640, 512}
)

// Chunking is how NCCL runs one collective: the channels it uses, a
// chunk's bytes (per channel and step; per head for NVLS), the bytes one
// loop of every channel moves, and how many loops the message takes.
type Chunking struct {
	Channels   int
	ChunkBytes float64
	LoopBytes  float64
	Loops      int
}

// channelsFor is getAlgoInfo's channel reduction for ring and tree: the
// channels (of nc) and threads a message of S bytes gets.
func channelsFor(a Algorithm, p Protocol, S float64, nc, nRanks int) (int, int) {
	pi := p.index()
	nt := maxThreads[pi]
	th := threadThreshold[pi]
	if a == Ring && p == LL {
		th *= float64(nRanks)
	}
	for S < float64(nc)*float64(nt)*th {
		if nc >= 2 {
			nc--
		} else if nt%128 == 0 {
			nt /= 2
		} else {
			break
		}
	}
	return nc, nt
}

// ringChunking is a ring all-reduce's loops with Simple (runRing): chunks
// of ALLREDUCE_CHUNKSTEPS steps, a loop nChannels*nRanks chunks, the
// chunk of a short message cut to its share.
func ringChunking(S float64, nc, nRanks int) Chunking {
	nc, nt := channelsFor(Ring, Simple, S, nc, nRanks)
	nt += warpSize // Simple's extra warp for synchronisation
	chunk := float64(simpleStepBytes * allReduceChunkSteps)
	loop := float64(nc*nRanks) * chunk
	loops := max(1, int(math.Ceil(S/loop)))
	if S < loop {
		real := math.Ceil(S / float64(nc*nRanks))
		grain := float64((nt - warpSize) * 8)
		chunk = math.Ceil(real/grain) * grain
	}
	return Chunking{Channels: nc, ChunkBytes: chunk, LoopBytes: loop, Loops: loops}
}

// treeChunking is a tree all-reduce's chunks with Simple (computeColl's
// halving by the tree's depth, then runTreeSplit's loops).
func treeChunking(S float64, nc, depth int) Chunking {
	nc, nt := channelsFor(Tree, Simple, S, nc, 0)
	nt += 4 * warpSize // the tree's split thread groups
	chunk := int64(simpleStepBytes)
	b := int64(S)
	per := func() int64 { return b / (int64(nc) * chunk) }
	for per() < int64(depth)*8 && chunk > 131072 {
		chunk /= 2
	}
	for per() < int64(depth)*4 && chunk > 65536 {
		chunk /= 2
	}
	for per() < int64(depth) && chunk > 32768 {
		chunk /= 2
	}
	c := float64(chunk)
	loop := float64(nc) * c
	if loop > S {
		// runTreeSplit: one loop, the chunk cut to the message's share in
		// grains of (nthreads - 2 warps) x 64 bytes.
		grain := float64((nt - 2*warpSize) * 64)
		c = math.Ceil(S/(float64(nc)*grain)) * grain
		loop = float64(nc) * c
	}
	return Chunking{Channels: nc, ChunkBytes: c, LoopBytes: loop, Loops: max(1, int(math.Ceil(S/loop)))}
}

// nvlsChunking is NVLS's (tree false) or NVLS-tree's chunks for S bytes
// on nc channels of heads heads (the node's ranks); an NVLS-tree's chunk
// starts at first (nvlsTreeChunk; 0: one Simple step).
func nvlsChunking(S float64, nc, heads int, first float64, tree bool) Chunking {
	ops := float64(nc * heads)
	chunk := float64(simpleStepBytes)
	if tree && first > 0 {
		chunk = first
	}
	if !tree {
		chunk = min(chunk, 131072)
		for _, r := range []struct{ below, over, to float64 }{{64, 65536, 65536}, {8, 32768, 32768}, {2, 16384, 16384}} {
			if S < r.below*ops*chunk && chunk > r.over {
				chunk = r.to
			}
		}
	} else {
		for _, r := range []struct{ below, over, to float64 }{{32, 262144, 262144}, {16, 131072, 131072}, {4, 65536, 65536}, {1, 32768, 32768}} {
			if S < r.below*ops*chunk && chunk > r.over {
				chunk = r.to
			}
		}
	}
	loop := ops * chunk
	return Chunking{Channels: nc, ChunkBytes: chunk, LoopBytes: loop, Loops: max(1, int(math.Ceil(S/loop)))}
}

// nvlsTreeChunk is the chunk an NVLS-tree starts from: the release's
// (Tuning.NVLSTreeChunk; 0: one Simple step), at most 64 KiB on 4 nodes
// or more (NCCL_NVLS_TREE_MAXCHUNKSIZE's default, "nNodes >= 4 ? 65536 :
// chunkSize", src/enqueue.cc in 2.18-2.20 and from 2.21 on).
func (m *model) nvlsTreeChunk() float64 {
	c := m.tuning.NVLSTreeChunk
	if c <= 0 {
		c = simpleStepBytes
	}
	if len(m.nodes) >= 4 {
		c = min(c, 65536)
	}
	return c
}

// treeDepth is NCCL's tree depth: the chain inside a node and log2 of
// the nodes (src/graph/connect.cc: nRanks/nNodes - 1 + log2i(nNodes)).
func treeDepth(ranks, nodes int) int {
	return ranks/max(nodes, 1) - 1 + log2i(nodes)
}

func log2i(n int) int {
	l := 0
	for n > 1 {
		n >>= 1
		l++
	}
	return l
}

// treeChannels approximates the channels NCCL's search gives a tree: a
// ring per NIC across nodes (the fewest any node's ranks use), inside a
// node one per 40 GB/s of a GPU's NVLink (search.cc's first speed), at
// least one; doubled, as NCCL's communicator runs twice the ring graph's
// channels (nChannels = ringGraph.nChannels*2).
func (m *model) treeChannels() int {
	rings := 0
	if len(m.nodes) > 1 {
		for _, nd := range m.nodes {
			if k := len(nd.nics); rings == 0 || k < rings {
				rings = k
			}
		}
	} else {
		// The slowest of the ranks' GPUs, whatever their order.
		nd := m.nodes[0]
		for i, r := range nd.ranks {
			k := 0
			if g := m.ranks[r].gpu; g < len(nd.nvPort) {
				k = int(nd.nvPort[g] / 40)
			}
			if i == 0 || k < rings {
				rings = k
			}
		}
	}
	return 2 * max(rings, 1)
}

// pipe is one pipeline's stages, as link ids (each stage's time is its
// link's load over its capacity), and the chunks each channel pushes
// through it.
type pipe struct {
	from, to int32 // ph.pipeIDs[from:to]
	units    float64
}

// addPipe records the links appended to ph.pipeIDs since from as one
// pipeline's stages, with its units. A build whose protocol has no ramp
// (a job's group on LL or LL128) records none. The stages are appended
// in place so that a warm phase does not allocate.
func (ps *phases) addPipe(ph *phase, from int, units float64) {
	if ps.scaled && !ps.sc.ramp || units <= 0 || len(ph.pipeIDs)-from < 2 {
		ph.pipeIDs = ph.pipeIDs[:from]
		return
	}
	ph.pipes = append(ph.pipes, pipe{from: int32(from), to: int32(len(ph.pipeIDs)), units: units})
}

// fill is a phase's ramp: the largest of its pipelines' (sum of stage
// times / bottleneck time - 1) / units, from the measured loads.
func (m *model) fill(ph *phase) float64 {
	if len(ph.pipes) == 0 || ph.mx <= 0 {
		return 0
	}
	r := m.root()
	var worst float64
	for _, p := range ph.pipes {
		var sum float64
		for _, id := range ph.pipeIDs[p.from:p.to] {
			if c := r.capOf(id); c > 0 {
				sum += ph.load[id] / (c * 1e9)
			}
		}
		worst = max(worst, (sum/ph.mx-1)/p.units)
	}
	return max(worst, 0)
}
