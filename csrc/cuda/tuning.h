// tuning.h — every tunable number of the CUDA kernels, and the one runtime switch, in one place.
// Each knob says what it trades; the measurements behind its value are in docs/kernels/.
// Change a value here, rebuild, and run benchmarks/bench_kernels.py and the CUDA tests.
#pragma once

#include <cstddef>

namespace brrr {
namespace cuda {
namespace tuning {

// ---- decode GEMV (gemv.cu) --------------------------------------------------------------------
// Rows from which GemvPath::Auto takes the tensor-core GEMV: below, the CUDA cores stream faster
// (M = 1); from here on their FMAs, not HBM, bind and mma.sync wins.
constexpr int kGemvTensorCoreMinRows = 2;
// 16-byte W loads per lane in flight in the CUDA-core GEMV: more hides more HBM latency but costs
// registers, which can split a grid that fits the GPU at once into two waves.
constexpr int kGemvLoads = 8;
// The same at M = 1, where a warp's two 4 KB rows of the 1B wqkv / w13 fit one round trip; taken
// only where its registers keep the grid in one wave (else kGemvLoads).
constexpr int kGemvM1Loads = 16;

// ---- decode attention (attention_decode.cu) ---------------------------------------------------
// Fewest positions a flash_decode split takes: smaller splits spread a short context over more
// CTAs but add merge work and scratch round trips.
constexpr int kDecodeMinChunk = 64;
// Threads per flash_decode CTA: more warps per chunk shorten it, at the price of a larger
// cross-warp combine (and the kernel's register cap, set for 2 CTAs of 256 per SM).
constexpr int kDecodeThreads = 256;
// flash_decode CTAs per SM the grid is sized for (one wave): more splits a sequence, against
// more merging and a second wave once the registers no longer fit.
constexpr int kDecodeCtasPerSm = 2;
// Head dim from which the kernel after flash_decode (wo) may launch only as its CTAs exit, not
// once their first rows are asked for: before a bf16 wo the late launch measured faster at hd 128
// (Llama-3-8B) and slower at hd 64 (Llama-3.2-1B); why is open. Before a quantized wo GEMV
// (flash_decode's early_trigger, wherever wo runs on the GEMV) the early launch is faster at
// hd 128 too (docs/kernels/attention.md).
constexpr int kDecodeLateTriggerHeadDim = 128;
// flash_decode's tensor-core kernel (serving batches): the CTAs of one split per (sequence, head
// block) from which it replaces the register kernel, and its threads. Its ring of K/V tiles (4 a
// warp where that costs the grid no wave, else 2) is the launcher's (launch_decode_mma_ring).
constexpr int kDecodeMmaMinCtas = 64;
// The same for a bf16 cache of head dim 64: every batch. With its 4-tile ring it took 0.4 us off
// the register kernel's call at one sequence of 128-384 positions in a graphed chain (1B heads),
// level at 1,024-4,096, 16% less at 16,384; at head dim 128 it was 1.01-1.11x slower up to 4,096
// (docs/kernels/attention.md).
constexpr int kDecodeMmaMinCtasHd64 = 1;
// The same for an e4m3 cache, whose tensor-core kernel widens the bytes in registers: at 4
// sequences of 8 KV heads it beat the register kernel by 1.29-1.58x (both shapes), at 2 by
// 0.98-1.20x (docs/kernels/attention.md).
constexpr int kDecodeMmaMinCtasFp8 = 32;
constexpr int kDecodeMmaThreads = 128;

// ---- prefill attention (attention_prefill_sm80.cu, attention_prefill_sm90.cu) -----------------
// The tiles (kPreRows = 128 queries a CTA) follow from the mma / wgmma fragment shapes and shared
// memory; they are constants of attention_common.cuh.
// Prompt segments of at most this many rows (one query tile) share one attention launch when a
// prefill pass has two or more (attention_prefill_segments, the mma.sync kernel): alone each is a
// launch of n_heads CTAs, latency-bound (the tails after a cached prefix).
constexpr int kPrefillShortSegmentRows = 128;

// ---- GEMM (gemm_sm80.cu, gemm_sm90.cu) and the matmul dispatch (matmul.cu) --------------------
// Largest M that matmul_bf16 sends to the GEMV; from M = 17 on the GEMM is as fast or faster.
constexpr int kGemvMaxRows = 16;
// Quantized decode: from this many rows on, gemv_quant_mma (weights dequantized to bf16 in
// registers, tensor cores) instead of gemv_quant (int8 dp4a per row, whose per-row work binds
// from a few rows on).
constexpr int kGemvQuantMmaMinRows = 2;
// Rows one gemv_quant_mma call takes (its limit in ops.h, 8 n8 tiles of x: not a knob).
constexpr int kGemvQuantMmaMaxRows = 64;
// gemv_quant_mma at 9..16 rows: a matrix of a 4- or 5-bit type whose CTAs of two 16-row W tiles
// number at least kGemvQuantMmaTwoTileMinCtas, with rows of at least kGemvQuantMmaTwoTileMinK
// values, runs those (each x load from L1 serves 32 W rows, where the x reads had filled L1's
// wavefronts); fewer CTAs would leave SMs idle, and shorter rows give each warp a single k tile,
// whose latency the 2 CTAs an SM of that form hide worse than 3 of one W tile. H200, 16 rows, same
// run: w13 (896 such CTAs) Q4_K 45.8 against 48.7 us, Q4_0 40.7 against 53.1, the LM heads Q4_K
// 180.0 against 201.0, Q4_0 160.8 against 205.2; wqkv (192) Q4_K 14.6 against 12.7; up to 8 rows
// every matrix was slower; the 1B's w13 (512 CTAs, K = 2048) made a batch-16 step 1.061x slower
// (docs/kernels/gemv.md).
constexpr int kGemvQuantMmaTwoTileMinCtas = 512;
constexpr int kGemvQuantMmaTwoTileMinK = 4096;
// gemv_quant_mma on a short grid (16-row CTAs at most 2 an SM: the 8B's wo and w2) of a 4- or
// 5-bit type runs CTAs of 16 warps and two W tiles at 1-16 rows when those CTAs number at least
// this percentage of the SMs (128 of 132 there). The 1B's short grids (64 such CTAs) keep 8 warps.
constexpr int kGemvQuantMmaShortGridMinFillPct = 90;
// gemv_quant_mma at 1-32 rows on a grid of at least this many 16-row CTAs an SM runs CTAs of 4
// warps: two full waves of them at the 80-register cap (6 an SM), so the last, partly full wave of
// CTAs that each take twice as long stays a small part. H200, CTAs of 4 warps against 8, us: the
// 8B's w13 (13.6 an SM) Q4_K 35.3 against 38.1 at 16 rows, 25.8 against 27.2 at 2; the LM heads
// (60.8) at 16 rows Q4_K 127.5 against 140.5, Q6_K 163.0 against 183.4, and the 1B's Q6_K head
// 83.0 against 102.4; but the 1B's w13 (7.8 an SM, 1.3 waves) Q4_K 22.4 against 17.2 at 16 rows,
// and the 8B's Q6_K w2 (1.9) 26.1 against 23.1; at 24 rows w13 Q4_K 77.2 against 80.2, the LM
// head Q4_K 319.8 against 335.4 (docs/kernels/gemv.md).
constexpr int kGemvQuantMmaWideGridMinCtasPerSm = 12;
// Rows of one engine pass of the tensor-core GEMV (CudaEngine::matmul) over a matrix of several
// parts: a bf16 part goes through gemv_bf16 (16 rows), a w13 of two types is staged through the
// 16-row gate_up_. A matrix of one quantized type takes the kernel's 64 (kGemvQuantMmaMaxRows).
constexpr int kGemvQuantPassRows = 16;
// gemv_quant_in at M <= 2: a matrix of a 32-value type (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1) with more
// than this many output units (a vocabulary-sized LM head) takes the standalone quantizer and the
// ActBlock grid of many small CTAs; every other matrix runs as one wave of CTAs that quantize the
// input themselves. H100, batch 1, the LM head on the fed grid against the ActBlock grid: Q6_K
// heads (Q4_K_M) 0.968x a 1B step, 0.989x 8 of the 8B's layers; Q8_0 1.004x / 1.007x (8B / 1B),
// Q4_0 1.019x, Q4_1 1.017x; docs/kernels/gemv.md has the table.
constexpr int kGemvQuantFusedMaxUnits = 32768;
// A one-row fused-input GEMV whose one wave walks at least this many rounds takes its units from
// counters (QuantGemvInput::counters) instead of a fixed walk. H100, batch 1, same run: 8 of the
// 8B's layers Q4_K_M 0.934x a step (w13 at 7 rounds), Q8_0 level (5 rounds); the 1B's Q4_K_M w13
// walks 4 rounds and was 1.036x fed (633.4 against 610.7 us a step); fed at 2 rounds, wo / w2 /
// wqkv were slower (docs/kernels/gemv.md).
constexpr int kGemvQuantFedMinRounds = 5;
// Off Hopper, quantized matmuls of kGemvMaxRows < M <= this rows run through the tensor-core GEMV
// in even passes (of at most kGemvQuantPassRows rows where the matrix has several parts), each
// re-reading the quantized weights (Q4_K: 0.56 bytes a weight); more rows run the bf16 GEMM on a
// dequantized scratch, which reads the weights once but writes a bf16 copy and reads it back (4
// more bytes a weight) first. The limit is the kernel's.
constexpr int kGemvQuantChunkMaxRows = 64;
// On Hopper the GEMV's rows end here, and gemm_quant takes the rows past them (from 17 rows to 64
// gemv_quant_wgmma comes first, where kGemvQuantWgmmaMinUnits below lets it): it decodes W once
// for a 128-row tile of x whatever M is, where the GEMV's time grows with the rows (every CTA reads
// all M x rows and runs 2 NT mma a chunk), and from 33 rows (NT = 8) it loses on most matrices.
// H200, device time (`benchmarks/lab/gemm_quant_sweep.py --gemv`), GEMV over gemm_quant at 32 / 40
// rows: 8B w13 0.86 / 1.32, wo 0.83 / 1.17, wqkv (in 16-row passes) 0.97 / 1.39; the LM heads stay
// ahead to 48-64. 8 of the 8B's layers Q4_K_M a step at batch 40 / 48 / 64: 0.956x / 0.875x /
// 0.760x of the GEMV's; full 8B Q4_K_M at batch 64 1.39x the tok/s, the 1B 1.30x. At 16 rows
// gemm_quant takes 2.1-3.7x the GEMV's time (w13 124.2 against 35.9 us), and the 8B ran
// 1.44-1.79x slower with it past 16 rows; multi-part matrices on gemm_quant past 16 (no 16-row
// passes) ran 1.02-1.04x slower at 17-32 (docs/kernels/gemv.md).
constexpr int kGemvQuantMaxRowsBesideGemm = 32;
// Quantized matmuls of kGemvQuantMaxRowsBesideGemm < M <= this rows run gemm_quant on Hopper (the
// wgmma GEMM dequantizing each k tile of W in its consumers, once per row tile of x: 128 rows, 256
// past 128), but for those gemv_quant_wgmma takes at up to 64 rows; more rows dequantize the matrix
// into bf16 scratch once for the bf16 GEMM. H100, 8B Q4_K_M prefill of 256 tokens: 0.71x bf16
// against the scratch path's 0.55x; from two 256-row tiles on the scratch wins (2048 tokens: 0.86x
// against gemm_quant's 0.71x; docs/kernels/gemm.md).
constexpr int kGemmQuantMaxRows = 256;
// The same limit for a matrix whose bf16 copy fits in L2 (the 1B's wqkv, wo, w2; the 8B's wo):
// the scratch path's write and read-back of the copy then stay on chip, and one 128-row tile is
// where gemm_quant still wins. H100, 1B Q4_K_M prefill of 256 tokens: every matrix at 256 rows
// 82.7 k tok/s, this rule 95.3 k (separate calls).
constexpr int kGemmQuantMaxRowsInL2 = 128;
// Past those rows a quantized matrix is dequantized to bf16 a slice of output columns at a time
// into the engine's scratch of about the L2 (gemm_dequant_slices), each slice a multiple of this
// many columns (the bf16 GEMM's narrowest tile), then run through gemm_bf16.
constexpr int kDequantSliceCols = 128;
// mma.sync GEMM: k elements per ring stage (a multiple of 16; 32 keeps a padded row at 80 bytes).
constexpr int kGemmSm80TileK = 32;
// mma.sync GEMM: cp.async ring depth (stages in flight hide the global-load latency).
constexpr int kGemmSm80Stages = 3;
// gemv_quant_wgmma takes a decode batch of 17-64 rows (on Hopper, in place of the GEMV up to
// kGemvQuantMaxRowsBesideGemm rows and of gemm_quant past them) where its warpgroups' work items,
// 64-row blocks of W times 1024-k slices, number at least this: the 8B's wqkv (384), w13, w2 and
// LM head, of every kept type; not the 8B's wo (256), whose blocks leave the grid short (0.81-1.01x
// the GEMV at 17-32 rows for the 4- and 5-bit types, Q6_K 0.73x; 0.90-1.17x gemm_quant at 40 / 64).
// H200, against the path it replaces (`benchmarks/lab/gemv_quant_wgmma_sweep.py`;
// docs/kernels/gemm.md, "At 17-64 rows"): at 17-32 rows Q4_K wqkv 1.47-1.71x, w13 1.86-2.17x, w2
// 1.34-1.58x, LM head 1.99-2.22x; at 24 / 32 rows Q6_K 1.03-1.34x; Q8_0 1.21-1.41x, Q4_0 1.11-2.23x,
// Q4_1, Q5_0 and Q5_K 1.23-2.37x; at 40 / 64 rows, every type, wqkv 1.26-1.69x, w13 1.52-2.34x, w2
// 1.25-1.70x, the LM heads 1.53-2.52x. Up to 16 rows the GEMV's single pass stays: there the kernel
// is 0.75-1.07x of it on those matrices (Q8_0's w13 1.13x), and the 16-column form lost.
constexpr int kGemvQuantWgmmaMinUnits = 384;
// wgmma GEMM: ring depth per tile width, as deep as 227 KB of shared memory allows with staging.
constexpr int kGemmSm90Stages256 = 4, kGemmSm90Stages192 = 5, kGemmSm90Stages128 = 6;
// wgmma GEMM on quantized W (gemm_quant, 128-column tiles): ring depth beside the three decoded W
// tiles, for 128-row tiles and for 256-row ones (sm90::quant_tile_rows).
constexpr int kGemmSm90QuantStages = 4, kGemmSm90QuantStages256 = 3;
// wgmma GEMM: tile rows walked before moving one tile column right (L2 reuse of x and W bands).
constexpr int kGemmSm90GroupM = 8;
// wgmma GEMM: 256-column tiles win ties within this ratio (num / den) against narrower ones.
constexpr int kGemmWideTieNum = 21, kGemmWideTieDen = 20;
// wgmma GEMM, AddResidual: L2 is asked for a tile's residual over the last 1 / F of its main loop.
constexpr int kGemmResidualSpread = 4;

// ---- one-shot all-reduce (allreduce.cu) and its switch point (CudaEngine::row_parallel_matmul) --
// Largest residual all-reduce (bytes) that takes the one-shot IPC kernel instead of NCCL, and the
// size of each half of every rank's double-buffered IPC data region. The one-shot kernel has every
// rank read all (N - 1) peers' whole messages over the links behind one cross-GPU barrier: one
// launch and one flag round trip, but (N - 1) x the bytes of a ring's 2 (N - 1) / N. Latency wins
// small messages (batch-1 decode: 16 KB at the 8B shape), link bandwidth large ones (prefill).
// So the switch point is a budget of peer bytes, (N - 1) x message: on 2 H100s the one-shot kernel
// was faster at every size measured, 16 KB to 4 MB (5.2 vs 6.6 us at 16 KB, 24.5 vs 32.9 us at
// 4 MB); on 4 H200s it won to 1 MB (14.4 vs 16.4 us) and lost at 4 MB (45.7 vs 39.2 us)
// (docs/kernels/allreduce.md). 4 MB of peer reads keeps 2 ranks' every measured size on the kernel
// and puts 4 ranks' switch at 1.33 MB, between the two; batch-64 decode (1 MB at the 8B shape)
// takes the kernel at both.
constexpr size_t kAllReduceOneShotMaxPeerBytes = 4 * 1024 * 1024;
inline size_t all_reduce_oneshot_max_bytes(int ranks) {
    return kAllReduceOneShotMaxPeerBytes / (size_t)(ranks > 1 ? ranks - 1 : 1) / 16 * 16;
}
// CTAs and threads of the one-shot kernel, the same for every message: the barrier's invariant
// needs each element handled by the same CTA index on every rank and in every call (allreduce.cu).
// More CTAs spread a large message's loads over more SMs; each pays its own flag round trip.
constexpr int kAllReduceOneShotBlocks = 32;
constexpr int kAllReduceOneShotThreads = 512;
// Largest message (bytes) of all_reduce_ll, the low-latency push form of the one-shot kernel: each
// value crosses the links beside a 4-byte flag, twice the bytes, so it is for the latency-bound
// decode messages (16 KB a row at the 8B shape, 32 KB at the 70B). Each rank's receive slots take
// 2 halves x N senders x 2 x this many bytes.
constexpr size_t kAllReduceLLMaxBytes = 64 * 1024;
// The rows kernel of a 2-rank group's prefill chunks (all_reduce_rows: sum, add and RMSNorm of
// rows_ x dim bf16 parts, reading the peer's part over the links): a fixed grid as above, but
// a bandwidth-bound pass over tens of MB, so about one CTA per SM of an H100 (132), each a row
// at a time. Every CTA must be resident while it spins at the barrier: 128 CTAs of 512 threads
// fit one wave of any GPU of 64 SMs or more.
constexpr int kAllReduceRowsBlocks = 128;
constexpr int kAllReduceRowsThreads = 512;
// Largest group that sums prefill parts with the rows kernel: each rank reads (N - 1) x the part
// over its links, where NCCL's ring moves 2 (N - 1) / N x (equal at 2 ranks).
constexpr int kAllReduceRowsMaxRanks = 2;

// ---- the runtime switch (launch.cuh) -------------------------------------------------------------
// LLAMA_BRRR_PDL=0 launches the decode chain's kernels plainly instead of with programmatic
// dependent launch. A kill-switch, not a knob: PDL is on by default (each kernel's setup overlaps
// its predecessor's tail); the switch isolates PDL when a decode result or a sanitizer run is in
// doubt, and measures what the overlap is worth.
constexpr const char* kPdlEnv = "LLAMA_BRRR_PDL";

}  // namespace tuning
}  // namespace cuda
}  // namespace brrr
