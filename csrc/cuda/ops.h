// ops.h — every CUDA kernel launcher on one screen, one comment line each.
// Shapes are row-major; W is [N, K] (out, in). The residual stream x is fp32; activations that
// feed a matmul are bf16; accumulation is fp32 everywhere. All launchers are asynchronous on
// `stream`, check their launch with CUDA_CHECK_LAUNCH (file:line) and never synchronize.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cpu/quant.h"
#include "model.h"

namespace brrr {
namespace cuda {

using bf16 = __nv_bfloat16;

// What a matmul does with its fp32 result y[m, n] before it leaves the chip.
enum class Epilogue : int {
    StoreBf16 = 0,    // out_bf16[m, n] = y
    StoreF32 = 1,     // out_f32[m, n] = y                       (logits, qkv)
    AddResidual = 2,  // residual_f32[m, n] += y                 (wo, w2)
    SwiGLU = 3,       // out_bf16[m, j] = silu(y[m, j]) * y[m, H + j], j < H = N / 2  (w13)
    RopeKV = 4,       // y = q|k|v of token positions[m]: RoPE on q and k, q -> rope.q_out,
                      // k and v appended to the caches (wqkv; N = (Hq + 2 Hkv) * hd)
};
// Where the RopeKV epilogue (and rope_kv_append) put a token's q, k and v. Rotate-half pairing:
// dim i with i + hd/2, angle positions[m] * inv_freq[i].
// One layer's paged KV cache (model.h, KvPages): k and v [n_blocks * block_size][Hkv][hd] of bf16,
// or of e4m3 bytes when fp8 (model.h KvCacheDtype::Fp8E4m3: unit scale, written round-to-nearest-
// even and saturating, widened exactly where read); position p of slot s is row pages.row(s, p),
// the table on the device; a slot holds max_seq.
struct KvCache {
    void* k = nullptr;
    void* v = nullptr;
    KvPages pages;
    int n_blocks = 0;  // in the pool
    int max_seq = 0;
    bool fp8 = false;
};
struct RopeKVArgs {
    const int* positions = nullptr;   // [M] position of row m in its sequence
    const int* slots = nullptr;       // [M] the sequence's cache slot
    const float* inv_freq = nullptr;  // [hd / 2]
    bf16* q_out = nullptr;            // [M, Hq, hd]
    KvCache kv;                       // this layer's cache
    int n_heads = 0, n_kv_heads = 0, head_dim = 0;
};
// Split-K scratch of gemm_bf16: a GEMM with too few tiles to fill the SMs splits K across CTAs
// and adds the partial sums in a fixed order (the result does not depend on which split ends
// last). Optional: without it a GEMM never splits. Sizes: gemm_split_scratch_floats /
// gemm_split_scratch_counters; the counters are zeroed once, and every call leaves them zero.
struct SplitKScratch {
    float* partials = nullptr;     // [floats]
    size_t floats = 0;
    unsigned* counters = nullptr;  // [n_counters], one per tile
    int n_counters = 0;
};
struct EpilogueArgs {
    bf16* out_bf16 = nullptr;   // [M, N] or [M, N/2] for SwiGLU
    float* out_f32 = nullptr;   // [M, N]; RopeKV on the GEMM path stages y here
    float* residual = nullptr;  // [M, N], updated in place
    int ld_out = 0;             // row stride of the output in elements (0 = packed)
    RopeKVArgs rope;            // RopeKV only
    SplitKScratch split;        // GEMM only, optional
};

// One sequence's sampling parameters: model.h's SamplingParams as is, the layout they have from
// Python on.
using SampleParamsDev = SamplingParams;

// ---- embed.cu / norm.cu ---------------------------------------------------------------------
// Where embed records each row's token for the sampler's repetition penalty: history [max_batch, max_seq] int32 at (slots[m], positions[m]); history == nullptr records nothing.
struct TokenHistory {
    int* history = nullptr;
    const int* slots = nullptr;
    const int* positions = nullptr;
    int max_batch = 0, max_seq = 0;
};
// Which row of a table holding vocabulary rows [offset, offset + rows) of V embeds `tok`: its row, kEmbedOther (another shard's: a zero row), or kEmbedInvalid (tok outside [0, V): NaN in the shard at offset 0, zero in the others).
constexpr int kEmbedOther = -1, kEmbedInvalid = -2;
BRRR_HOST_DEVICE inline int embed_row_of(int tok, int V, int offset, int rows) { return tok < 0 || tok >= V ? (offset == 0 ? kEmbedInvalid : kEmbedOther) : tok - offset >= 0 && tok - offset < rows ? tok - offset : kEmbedOther; }
// Throws unless a table of vocab_rows > 0 rows from row vocab_offset holds a row of [0, V) (embed, embed_quant; rows past V are a last shard's padding).
void check_vocab_shard(const char* op, int V, int vocab_offset, int vocab_rows);
// x[m, :] = table[tokens[m] - vocab_offset, :] as fp32 and the token into `record`; tokens [M], table [vocab_rows, D] bf16, rows [vocab_offset, + vocab_rows) of V (embed_row_of: other shards' tokens give zeros, ids outside [0, V) NaN).
void embed(const int* tokens, const bf16* table, float* x, int M, int D, int V, int vocab_offset, int vocab_rows, const TokenHistory& record, cudaStream_t stream);
// x += residual (when residual != nullptr), then y = x * rsqrt(mean(x^2) + eps) * w; x [M, D] fp32.
void rmsnorm_residual(float* x, const float* residual, const bf16* w, bf16* y, int M, int D, float eps, cudaStream_t stream);
// rmsnorm_residual with a bf16 residual, widened exactly before the add (a tensor-parallel prefill's summed partial products).
void rmsnorm_add_bf16(float* x, const bf16* residual, const bf16* w, bf16* y, int M, int D, float eps, cudaStream_t stream);

// ---- gemv.cu: decode, M <= 16 rows, memory-bound: every weight byte streamed once ------------
// Who does a GEMV's arithmetic: Auto takes the CUDA cores below tuning::kGemvTensorCoreMinRows rows and the tensor cores from there.
enum class GemvPath : int { Auto = 0, CudaCores = 1, TensorCores = 2 };
void gemv_bf16(const bf16* x, const bf16* W, int M, int N, int K, Epilogue ep, const EpilogueArgs& args, cudaStream_t stream, GemvPath path = GemvPath::Auto);
// y = bf16(rmsnorm(x) * norm_w) · W^T, x [M, K] fp32: rows below the tensor-core switch (M = 1) normalize inside the CUDA-core GEMV, more run rmsnorm_residual into xn [M, K] first, then the tensor-core GEMV (M <= 16) or gemm_bf16 (without xn, M <= 16 normalizes inside the CUDA-core GEMV).
void rmsnorm_matmul_bf16(const float* x, const bf16* norm_w, float eps, const bf16* W, int M, int N, int K, Epilogue ep, const EpilogueArgs& args, bf16* xn, cudaStream_t stream);

// ---- gemv_quant.cu: quantized weights in the tiles of qlayout.h (GGML type ids, cpu/quant.h) --
// Activations of a quantized matmul are quant::ActBlock rows [M, K / 32] (the CPU engine's int8 blocks, same rounding).
// xq = the ActBlocks of x [M, K] bf16 (K % 32 == 0).
void quantize_act_bf16(const bf16* x, quant::ActBlock* xq, int M, int K, cudaStream_t stream);
// xq = the ActBlocks of rmsnorm(x) * norm_w in fp32 (never rounded to bf16), x [M, K] fp32: the codes of x * norm_w with each block's scale times the row's rstd (equal up to fp32 rounding).
void rmsnorm_quantize_act(const float* x, const bf16* norm_w, float eps, quant::ActBlock* xq, int M, int K, cudaStream_t stream);
// y = xq . dequant(W)^T, M <= 16, W [N, K] of `type` in qlayout tiles; int8 dot products, fp32 scales and sums; every Epilogue, pairs as gemv_bf16 (SwiGLU rows j, N/2 + j; RopeKV dims i, i + hd/2 of a head); rows batch-invariant bit for bit.
void gemv_quant(int type, const void* W, const quant::ActBlock* xq, int M, int N, int K, Epilogue ep, const EpilogueArgs& args, cudaStream_t stream);
// The input rows of gemv_quant_in: ActBlocks made beforehand (xq), or bf16 rows (x), or fp32 rows normalized as rmsnorm(x_f32) * norm_w (x_f32, norm_w, eps); exactly one of xq, x, x_f32.
struct QuantGemvInput {
    const quant::ActBlock* xq = nullptr;
    const bf16* x = nullptr;
    const float* x_f32 = nullptr;
    const bf16* norm_w = nullptr;
    float eps = 0.f;
    quant::ActBlock* scratch = nullptr;  // [M, K / 32]: where x / x_f32 rows go when M > 2
    // [kGemvQuantCounterWords] device words, zero before the first call, back to zero after each:
    // where given, a one-row grid of many rounds (tuning::kGemvQuantFedMinRounds) hands its units
    // out through them instead of a fixed walk. One stream at a time may use a set.
    unsigned* counters = nullptr;
};
constexpr int kGemvQuantCounterWords = 640;
// gemv_quant on any input: M <= 2 unquantized rows are quantized by the kernel itself (no extra launch, the same bits as the standalone quantizers), more go through quantize_act_bf16 / rmsnorm_quantize_act into in.scratch first, and so do M <= 2 rows of a matrix of a 32-value type with more than tuning::kGemvQuantFusedMaxUnits output units when in.scratch is given.
void gemv_quant_in(int type, const void* W, const QuantGemvInput& in, int M, int N, int K, Epilogue ep, const EpilogueArgs& args, cudaStream_t stream);
// Whether a matrix of two quantized parts (rows of type0, then rows of type1) runs as one gemv_quant_pair: K-quant mixes (Q4_K or Q5_K beside Q6_K, as Q4_K_M / Q5_K_M files give wq | wk and wv), every Epilogue but SwiGLU.
bool gemv_quant_fuses_pair(int type0, int type1, Epilogue ep);
// gemv_quant_in over such a matrix in one launch, M <= 2: rows [0, rows0) of type0 in W0, [rows0, N) of type1 in W1 (RopeKV: whole heads each); each row's result is bit for bit that of gemv_quant_in on its part.
void gemv_quant_pair(int type0, const void* W0, int rows0, int type1, const void* W1, const QuantGemvInput& in, int M, int N, int K, Epilogue ep, const EpilogueArgs& args, cudaStream_t stream);
// The check every quantized-weight op makes first: type is a GGML type with a GPU layout and the row length (named kname in the error, e.g. "K") is whole blocks of it; throws brrr::Error naming op otherwise.
void check_quant_weight(const char* op, int type, int K, const char* kname);
// out [rows, ld_out] bf16 = rows [row0, row0 + rows) of dequant(W) [N, K] rounded to bf16 (prefill feeds slices of W to gemm_bf16).
void dequantize_bf16(int type, const void* W, int N, int K, int row0, int rows, bf16* out, int ld_out, cudaStream_t stream);
// out [N, K] fp32 = dequant(W), exactly the CPU dequantizer's values.
void dequantize_f32(int type, const void* W, int N, int K, float* out, cudaStream_t stream);
// embed on a quantized table [vocab_rows, D] (qlayout tiles): x[m, :] = dequant(its row of tokens[m]) fp32; vocabulary rows and `record` as embed.
void embed_quant(const int* tokens, int type, const void* table, float* x, int M, int D, int V, int vocab_offset, int vocab_rows, const TokenHistory& record, cudaStream_t stream);

// ---- gemv_quant_mma.cu: the quantized GEMV on the tensor cores, for M = 2..64 -----------------
// y = x . bf16(dequant(W))^T, x [M, K] bf16 (M <= 64, one weight pass), W as gemv_quant; exact fp32 dequant rounded to bf16, mma.sync, fp32 sums; every Epilogue, pairs as gemv_bf16; rows bit-identical across batches of 1-64, but on short grids within 1-16 and 17-64, on wide grids within 1-32 and 33-64.
void gemv_quant_mma(int type, const void* W, const bf16* x, int M, int N, int K, Epilogue ep, const EpilogueArgs& args, cudaStream_t stream);

// ---- matmul.cu: the matmul entry points; gemm_sm80.cu / gemm_sm90.cu: the prefill GEMMs -----
// Tensor cores (wgmma on sm_90a, else mma.sync; bf16 -> fp32), any M, N, K. RopeKV is fused on Hopper for head_dim 64 / 128; elsewhere it stages q|k|v in args.out_f32 [M, N] and runs rope_kv_append.
void gemm_bf16(const bf16* x, const bf16* W, int M, int N, int K, Epilogue ep, const EpilogueArgs& args, cudaStream_t stream);
// The split-K scratch that lets any GEMM on a device of `sm_count` SMs split as far as it would.
size_t gemm_split_scratch_floats(int sm_count);
int gemm_split_scratch_counters(int sm_count);
// The engine's choice by shape: the GEMV up to tuning::kGemvMaxRows rows, gemm_bf16 above.
void matmul_bf16(const bf16* x, const bf16* W, int M, int N, int K, Epilogue ep, const EpilogueArgs& args, cudaStream_t stream);
// One row range of a matrix for gemm_quant: rows [row0, row0 + rows), bf16 [rows, K] (type 0) or qlayout tiles of a GGML type.
constexpr int kMaxWeightParts = 3;  // as a Matrix of the engine (wq | wk | wv)
struct GemmWeightPart {
    int type = 0;
    const void* data = nullptr;
    int row0 = 0, rows = 0;
};
// Whether gemm_quant runs here: the wgmma GEMM's device and image (gemm_sm90_available).
bool gemm_quant_available();
// y = x . bf16(dequant(W))^T, any M (prefill): W [N, K] as 1..3 parts covering rows [0, N) in order, each dequantized tile by tile inside the wgmma GEMM (no bf16 copy of W); every Epilogue, split-K as gemm_bf16; equal bit for bit to gemm_bf16 on dequantize_bf16 of the parts. x 16-byte aligned, K % 8 == 0 (K-quant parts: K % 256 == 0, 32-value ones K % 32 == 0).
void gemm_quant(const GemmWeightPart* parts, int n_parts, const bf16* x, int M, int N, int K, Epilogue ep, const EpilogueArgs& args, cudaStream_t stream);
// gemm_quant's product on any GPU without a whole bf16 copy of W: the parts are dequantized into scratch [scratch_elems] bf16 a slice of output columns at a time (dequantize_bf16; a SwiGLU slice holds its gate rows, then its up rows), each slice through gemm_bf16. Slices are multiples of tuning::kDequantSliceCols columns, as wide as scratch allows or narrower where the wave model (gemm_sm90_width) says so; one slice is gemm_bf16 on the whole dequantized W, and so are several, bit for bit without split-K (RopeKV then stages q|k|v in args.out_f32 [M, N] for rope_kv_append). scratch must hold min(N, kDequantSliceCols) columns' rows.
void gemm_dequant_slices(const GemmWeightPart* parts, int n_parts, const bf16* x, int M, int N, int K, Epilogue ep, const EpilogueArgs& args, bf16* scratch, size_t scratch_elems, cudaStream_t stream);
// The slice width (output columns) gemm_dequant_slices cuts a call into: `cols` (N, or N / 2 for SwiGLU) where one slice fits.
int gemm_dequant_slice_cols(int M, int N, int K, Epilogue ep, size_t scratch_elems);
// The two kernels behind gemm_bf16, on one call's argument block (gemm_common.cuh).
struct GemmArgs;
// mma.sync GEMM, any GPU from sm_80, any shape and alignment.
void gemm_sm80(const GemmArgs& p, cudaStream_t stream);
// Whether the wgmma GEMM runs here (a Hopper device and an sm_90a image); sets the device's SM count.
bool gemm_sm90_available(int* sm_count);
// wgmma GEMM with K split `splits` ways (1: none), tile width by the wave model; needs tma_compatible(p).
void gemm_sm90(const GemmArgs& p, int splits, int sm_count, cudaStream_t stream);
// The tile width gemm_sm90 runs an unsplit call of M rows and `width` outputs (N, or N / 2 for SwiGLU) at, and into cost (if not null) the wave model's time for it: waves x tile width.
int gemm_sm90_width(int M, int width, Epilogue ep, int sm_count, long long* cost);
// The same on p.qb's quantized W (128-column tiles, W decoded by the consumers: gemm_sm90_dequant.cuh).
void gemm_sm90_quant(const GemmArgs& p, int splits, int sm_count, cudaStream_t stream);

// ---- gemv_quant_wgmma.cu: decode batches of 17-64 rows on quantized weights (Hopper) ---------
// Whether gemv_quant_wgmma serves this call: every part of a kept quantized type and a multiple of 64 rows, K a multiple of 1024 (at most one slice an SM), M in (tuning::kGemvMaxRows, 64], planes of plane_floats floats enough, and work for the GPU (tuning::kGemvQuantWgmmaMinUnits).
bool gemv_quant_wgmma_takes(const GemmWeightPart* parts, int n_parts, int M, int N, int K, size_t plane_floats);
// The fp32 scratch gemv_quant_wgmma needs: one [M, N] plane per 1024 k.
size_t gemv_quant_wgmma_plane_floats(int M, int N, int K);
// y = x . Wb^T, Wb as gemv_quant_mma decodes W, on wgmma with W in registers (sm_90a; gemm_quant_available), every Epilogue (RopeKV staged in args.out_f32 [M, N] for rope_kv_append); planes [plane_floats] fp32 scratch. Rows are batch-invariant.
void gemv_quant_wgmma(const GemmWeightPart* parts, int n_parts, const bf16* x, int M, int N, int K, Epilogue ep, const EpilogueArgs& args, float* planes, size_t plane_floats, cudaStream_t stream);

// ---- rope.cu: rotate-half RoPE on q and k, k and v appended to the cache ----------------------
// qkv [M, (Hq + 2 Hkv) * hd] fp32 from the QKV matmul; row m is token `positions[m]` of slot
// `slots[m]`. Writes q_out [M, Hq, hd] bf16 and k/v into this layer's paged cache kv. inv_freq
// [hd/2] on the device.
void rope_kv_append(const float* qkv, const int* positions, const int* slots, const float* inv_freq, bf16* q_out, const KvCache& kv, int M, int n_heads, int n_kv_heads, int head_dim, cudaStream_t stream);
// The same with the destinations of an EpilogueArgs (what gemm_bf16 runs where RopeKV is not fused).
void rope_kv_append(const float* qkv, const RopeKVArgs& rope, int M, cudaStream_t stream);

// ---- swiglu.cu -------------------------------------------------------------------------------
// out [M, H] bf16 = silu(gate_up[:, :H]) * gate_up[:, H:], gate_up [M, 2H] fp32 (a w13 run part by part).
void swiglu_f32(const float* gate_up, bf16* out, int M, int H, cudaStream_t stream);

// ---- attention_decode.cu, attention_prefill_sm80.cu, attention_prefill_sm90.cu --------------
// Flash-decoding: one query token per sequence b (q [B, Hq, hd]) over its cached positions
// [0, positions[b]]; split over the KV length into at most `max_splits` chunks, GQA-aware (each
// K/V element read once per KV head), merged by the last chunk to finish. scratch: floats of
// flash_decode_scratch_floats() (the largest B of any call), zeroed once before the first call:
// it holds arrival counters, and every call leaves them zero. early_trigger: the next kernel may
// launch once this one is past its PDL wait at every head dim (else from
// tuning::kDecodeLateTriggerHeadDim on only as its CTAs exit); the engine sets it before a quantized wo.
size_t flash_decode_scratch_floats(int B, int n_heads, int head_dim, int max_splits);
void flash_decode(const bf16* q, const KvCache& kv, const int* slots, const int* positions, bf16* out, float* scratch, int B, int n_heads, int n_kv_heads, int head_dim, int max_splits, bool early_trigger, cudaStream_t stream);
// Causal prefill: T query tokens of slot `slot` at positions start_pos.. over its cache [0, start_pos+t].
// slot_blocks: the slot's table row on the host (the TMA maps of its last block are made there).
// On Hopper TMA-fed wgmma, elsewhere mma.sync; the _mma_sync entry runs the latter on any GPU.
void attention_prefill(const bf16* q, const KvCache& kv, const int32_t* slot_blocks, int slot, int start_pos, int T, bf16* out, int n_heads, int n_kv_heads, int head_dim, cudaStream_t stream);
void attention_prefill_mma_sync(const bf16* q, const KvCache& kv, const int32_t* slot_blocks, int slot, int start_pos, int T, bf16* out, int n_heads, int n_kv_heads, int head_dim, cudaStream_t stream);
// One segment of a batched prefill: q / out rows [row0, row0 + rows) are the tokens of slot `slot`
// at positions start_pos...
struct PrefillSegment {
    int32_t row0, slot, start_pos, rows;
};
// Causal prefill of n segments in one launch (mma.sync, any GPU from sm_80), each as
// attention_prefill over its own rows of q [rows, Hq, hd] and out: for prompt tails too short to
// fill the GPU one launch each. segments: the device copy; host_segments the same on the host and
// host_tables the block table [max_batch][blocks_per_seq] on the host, both for the checks.
void attention_prefill_segments(const bf16* q, const KvCache& kv, const PrefillSegment* segments, const PrefillSegment* host_segments, const int32_t* host_tables, int n_segments, bf16* out, int n_heads, int n_kv_heads, int head_dim, cudaStream_t stream);

// ---- sampling.cu: one token per sequence on the device, no host round trip --------------------
// logits [B, V]; history [max_batch, max_seq] of each slot's tokens, used up to positions[b].
size_t sample_scratch_bytes(int B, int V);
// decode_steps' loop, closed by the sampler: tokens[b] = the sampled token and the decode's
// positions[b] += 1, and the sampler advances its own positions and steps (the arrays it was
// given) by one. Without a feed-back nothing but out_tokens / out_logprobs is written.
struct SampleFeedBack {
    int* tokens = nullptr;  // nullptr: no feed-back
    int* positions = nullptr;
};
void sample_tokens(const float* logits, const int* history, const int* slots, int* positions, const SampleParamsDev* params, uint64_t* steps, int B, int V, int max_seq, void* scratch, int* out_tokens, float* out_logprobs, const SampleFeedBack& feed_back, cudaStream_t stream);
// decode_launch's continued rows: tokens[b] < 0 becomes fed[-1 - tokens[b]] (fed: the previous launch's last-round tokens).
void continue_decode_rows(int* tokens, const int* fed, int B, cudaStream_t stream);

// ---- allreduce.cu: the one-shot all-reduce of tensor parallelism over CUDA IPC (one host) -----
// Every rank's IPC buffer as the kernels see it (allreduce.h opens them): data[r] rank r's two data halves of half_floats each, signals[r] its flags [blocks][kMaxRanks], counters this rank's round per CTA; the group's kernels launch `blocks` CTAs.
struct AllReducePeers {
    static constexpr int kMaxRanks = 8;
    float* data[kMaxRanks] = {};
    unsigned* signals[kMaxRanks] = {};
    uint4* lines[kMaxRanks] = {};  // all_reduce_ll's receive slots: [2 halves][size senders][ll_lines]
    unsigned* counters = nullptr;
    size_t half_floats = 0;
    size_t ll_lines = 0;  // 16-byte lines a sender's slot holds: 2 floats each
    int rank = 0, size = 0, blocks = 0;
};
// out[i] = rank 0's in[i] + rank 1's in[i] + ... in rank order (bit-identical on every rank); count % 4 == 0, count <= half_floats, in and out 16-byte aligned (in == out allowed); every rank calls it with the same count; PDL.
void all_reduce_oneshot(const float* in, float* out, size_t count, const AllReducePeers& peers, cudaStream_t stream);
// all_reduce_oneshot's result by the low-latency protocol: each rank stores its values, each beside the call's round as a flag, straight into every peer's slot for it, and reads its own slots once their flags show the round (no barrier, one crossing of the links); count % 4 == 0, count <= 2 x ll_lines, in and out 16-byte aligned (in == out allowed); the same calls on every rank as all_reduce_oneshot, with which it shares the rounds; PDL.
void all_reduce_ll(const float* in, float* out, size_t count, const AllReducePeers& peers, cudaStream_t stream);
// x[m] += sum over the ranks of part[m] (bf16 [rows, D], fp32 sums in rank order, bit-identical on every rank), then y[m] = bf16(rmsnorm(x[m]) * norm_w) unless norm_w is null; D % 8 == 0, rows x D <= 2 x half_floats, 16-byte aligned, 2 to 4 ranks, the same rows on every rank; PDL.
void all_reduce_rows(const bf16* part, float* x, const bf16* norm_w, bf16* y, int rows, int D, float eps, const AllReducePeers& peers, cudaStream_t stream);
// x[i] += float(partial[i]) (the residual stream takes the ranks' summed bf16 partials of wo / w2 after an NCCL all-reduce); count % 4 == 0, both pointers 16-byte aligned; PDL.
void add_bf16_into_f32(const bf16* partial, float* x, size_t count, cudaStream_t stream);

// ---- init.cu ---------------------------------------------------------------------------------
// p[i] = mean + std * N(0, 1), pair k Box-Muller of splitmix64(key + 2k), splitmix64(key + 2k + 1)
// (the CPU engine's stream): same key, same weights, any GPU or backend.
void fill_normal_bf16(bf16* p, size_t n, uint64_t key, float mean, float std, cudaStream_t stream);
void convert_f32_to_bf16(const float* src, bf16* dst, size_t n, cudaStream_t stream);

}  // namespace cuda
}  // namespace brrr
