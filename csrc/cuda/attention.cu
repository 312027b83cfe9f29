// attention.cu — causal softmax attention over the bf16 KV cache, fp32 softmax statistics.
//
//   q [rows, Hq, hd] bf16; one layer's caches k_cache / v_cache [max_batch][max_seq][Hkv][hd] bf16;
//   out [rows, Hq * hd] bf16. The query at position p sees cache positions [0, p]. GQA: query
//   head h reads KV head h / (Hq / Hkv). Scores are scaled by log2(e) / sqrt(hd) so the
//   softmax runs on exp2.
//
// flash_decode (one query per sequence, memory-bound: the KV bytes are the cost):
//   grid (split, KV head x head block, sequence), one launch. A CTA owns one chunk of ONE KV
//   head's positions and serves every query head of that group from it, so each K/V byte is read
//   once per token, not once per query head. Online softmax in fp32.
//   Inside a CTA each warp owns its own rows: it loads them straight into registers (16 bytes a
//   lane, HD / 8 lanes to a row), scores them for every head of the group, sums each dot product
//   over the row's lanes with a transposing butterfly and keeps its own online softmax; the warps
//   are combined once, at the end, through shared memory. No shared-memory tile and no CTA
//   barrier per 64 positions: the shared-memory tile kernel this replaced (phases for scores,
//   softmax and P V, four CTA barriers a tile) cost about 1.3 us per 64-position tile whatever
//   was in flight. In a graphed decode chain on H100, with the merge below, a layer's attention
//   costs 5.3 us at 256-384 positions (Llama-3-8B heads; the tile kernel 8.1-8.9) and 30.6 us at
//   16384 (45.8); 8B decode went from 175.2 to 178.3 tok/s (runs BR, BT:
//   benchmarks/results/h100-sxm/flash_decode_lab/).
//   Splits: positions live on the device (CUDA-graph replay), so the grid is fixed from the shapes
//   (at most two CTAs per SM, one wave) and each CTA decides on the device how many splits its sequence needs:
//   chunks of at least min_chunk positions, so a short context runs as one chunk per KV head and
//   writes its output directly; the CTAs past the last chunk exit at once. With several chunks,
//   each writes (max, sum, unnormalized acc[hd]) to scratch, counts itself in with an atomic on
//   its (sequence, head block) arrival counter (one acq_rel atomic after the CTA barrier: 1B decode
//   1.009x, 8B 1.003x over a fence in every thread plus a relaxed atomic, run BA), and the last to
//   arrive merges them (merge_splits: the first 8 splits' acc values are loaded while a warp per
//   head computes the split weights, one L2 round trip where the older merge took two; a fold per
//   thread of every split's (max, sum) measured 1.5-2.5x slower at 16-33 splits) and re-arms the
//   counter.
//   Scratch per sequence: [counters Hq int32 | (max, sum) Hq x max_splits x 2 | acc Hq x
//   max_splits x hd], so a sequence's counters sit in one place whatever the batch of a call; they
//   must be zero before the first call (the engine's arena is) and every call leaves them zero.
//   Launched with PDL (launch.cuh): before its wait a CTA already reads positions and slots and
//   loads its first rows, all written two or more kernels back; only this token's K/V row and q
//   come from the kernel just before, and they are loaded after the wait.
//
// attention_prefill (T new tokens of one sequence, their K/V already in the cache), two kernels
// over the same grid (a CTA owns 128 queries of one head; the longest query tiles first):
// On Hopper (attention_prefill_sm90_kernel, sm_90a): FlashAttention-3's layout. A producer
//   warpgroup copies Q once and K/V tiles of 128 positions by TMA into a two-slot ring; two
//   consumer warpgroups of 64 queries each run S = Q K^T and O += P V as warpgroup MMA (P from
//   registers), independently of each other, so one's softmax overlaps the other's MMAs.
//   H100, Llama-3-8B heads: 551 TF/s at 8192 tokens (the mma.sync kernel below: 346).
// Elsewhere (attention_prefill_kernel): FlashAttention-2 on mma.sync. 4 warps x 32 rows, two
//   16-row m-tiles per warp, so each K or V fragment read from shared memory (ldmatrix) feeds four
//   mma.sync m16n8k16 instead of two; with one m-tile per warp shared memory, not the tensor
//   cores, bound the kernel (1.2-1.5x at hd 128, benchmarks/lab/cuda_attention_prefill_lab.cu).
//   K/V tiles of 64 positions are double-buffered in shared memory; P goes from the S
//   accumulators to the A operand of the second mma in registers (the two layouts coincide).
//   T x T scores never exist. Tiles above the diagonal are never loaded, and a warp skips the
//   tiles wholly above its own rows; the longest query tiles are scheduled first.
#include <algorithm>
#include <cmath>

#include "cuda/check.cuh"
#include "cuda/hopper.cuh"
#include "cuda/kernel_util.cuh"
#include "cuda/launch.cuh"
#include "cuda/ops.h"
#include "cuda/ptx.cuh"

namespace brrr {
namespace cuda {

namespace {

constexpr float kLog2e = 1.4426950408889634f;

// ==== flash decode ============================================================================

// Chunks are whole multiples of this many positions (a CTA's warps cover 64 or more a step).
constexpr int kDecChunkUnit = 64;

struct DecodeArgs {
    const bf16* q;
    const bf16* k_cache;
    const bf16* v_cache;
    const int* slots;
    const int* positions;
    bf16* out;
    float* scratch;  // [B][seq_floats]: the per-sequence layout in the banner
    int n_heads, n_kv_heads, group, head_blocks, max_seq, n_splits, max_splits;
    int min_chunk;   // fewest positions a split takes
    int threads;     // per CTA: 128 or 256
    bool early_kv;   // start loading the first rows before the PDL wait
    bool late_trigger;  // let the next kernel launch only as CTAs exit, not once the first rows are asked for
    bool release_count;  // count a finished split with one acq_rel atomic (else fences + atomic)
    float scale_log2;
};

// Splits of one decode launch never exceed this: the merge keeps a weight per split and head in
// shared memory ([GMAX][kDecMaxSplits], merge_splits).
constexpr int kDecMaxSplits = 128;

// Floats of scratch per sequence.
__host__ __device__ inline size_t decode_seq_floats(int n_heads, int head_dim, int max_splits) {
    return (size_t)n_heads * (1 + (size_t)max_splits * (head_dim + 2));
}

// Where sequence b's counters and the (max, sum) / acc partials of its head h, split s live.
struct DecodeScratch {
    float* base;  // sequence b's block
    int n_heads, max_splits, hd;
    __device__ DecodeScratch(const DecodeArgs& a, int b, int head_dim)
        : base(a.scratch + (size_t)b * decode_seq_floats(a.n_heads, head_dim, a.max_splits)),
          n_heads(a.n_heads), max_splits(a.max_splits), hd(head_dim) {}
    __device__ int* counter(int head_block) const { return reinterpret_cast<int*>(base) + head_block; }
    __device__ float* ml(int h, int s) const { return base + n_heads + ((size_t)h * max_splits + s) * 2; }
    __device__ float* acc(int h, int s) const {
        return base + n_heads + (size_t)n_heads * max_splits * 2 + ((size_t)h * max_splits + s) * hd;
    }
};

// How a sequence of len positions is cut: n chunks of `per` positions (the last may be shorter),
// none empty. Every CTA of the sequence computes the same cut from the same len.
struct DecodeCut {
    int n, per;
    __device__ DecodeCut(int len, int min_chunk, int n_splits) {
        n = max(1, min(CEIL_DIV(len, min_chunk), n_splits));
        per = max(kDecChunkUnit, CEIL_DIV(CEIL_DIV(len, n), kDecChunkUnit) * kDecChunkUnit);
        n = max(1, CEIL_DIV(len, per));  // rounding per up may leave the last split empty: drop it
    }
};

// The last split of a (sequence, head block) to arrive merges the partials of all n_splits
// splits. Split s weighs w_s = 2^(m_s - M) / sum_s' 2^(m_s' - M) l_s' (M the largest max, l the
// sums); out = sum_s w_s acc_s. A warp per head computes the weights (lane -> splits) into
// `weight` (shared, [GMAX][kDecMaxSplits]) while every thread already holds the acc values of the
// first kAhead splits for its output elements, so up to kAhead splits cost one L2 round trip.
// out: the first of the n_g heads' [HD] output rows.
template <int HD, int GMAX, int THREADS>
__device__ void merge_splits(const DecodeScratch& sc, int head0, int n_g, int n_splits, float* weight, bf16* out) {
    constexpr int kWarps = THREADS / 32, kElems = CEIL_DIV(GMAX * HD, THREADS), kAhead = 8;
    static_assert(GMAX <= kWarps, "a warp per head");
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    float ahead[kElems][kAhead];
#pragma unroll
    for (int e = 0; e < kElems; ++e) {
        const int i = tid + e * THREADS, g = i / HD, d = i % HD;
#pragma unroll
        for (int sp = 0; sp < kAhead; ++sp)
            ahead[e][sp] = g < n_g && sp < n_splits ? __ldcg(sc.acc(head0 + g, sp) + d) : 0.f;
    }
    if (warp < n_g) {
        const int g = warp;
        float m[kDecMaxSplits / 32], l[kDecMaxSplits / 32];
        float global_max = -INFINITY;
#pragma unroll
        for (int e = 0; e < kDecMaxSplits / 32; ++e) {
            const int sp = lane + 32 * e;
            m[e] = sp < n_splits ? __ldcg(sc.ml(head0 + g, sp)) : -INFINITY;
            l[e] = sp < n_splits ? __ldcg(sc.ml(head0 + g, sp) + 1) : 0.f;
            global_max = fmaxf(global_max, m[e]);
        }
        global_max = util::warp_max(global_max);  // finite: every chunk is non-empty
        float den = 0.f;
#pragma unroll
        for (int e = 0; e < kDecMaxSplits / 32; ++e) {
            m[e] = exp2f(m[e] - global_max);
            den += m[e] * l[e];
        }
        den = util::warp_sum(den);
#pragma unroll
        for (int e = 0; e < kDecMaxSplits / 32; ++e) weight[g * kDecMaxSplits + lane + 32 * e] = m[e] / den;
    }
    __syncthreads();
#pragma unroll
    for (int e = 0; e < kElems; ++e) {
        const int i = tid + e * THREADS, g = i / HD, d = i % HD;
        if (g >= n_g) continue;
        const float* w = weight + g * kDecMaxSplits;
        float o = 0.f;
#pragma unroll
        for (int sp = 0; sp < kAhead; ++sp) o += w[sp] * ahead[e][sp];  // w = 0 past n_splits
#pragma unroll 8
        for (int sp = kAhead; sp < n_splits; ++sp) o += w[sp] * __ldcg(sc.acc(head0 + g, sp) + d);
        out[(size_t)g * HD + d] = __float2bfloat16_rn(o);
    }
}

// A warp's rows: kLanesPerRow = HD / 8 lanes cover a row, so one load instruction covers
// kRowsPerLoad rows; per step a lane holds kRows rows of K and V. Its GMAX x kRows partial dot
// products (8 dims each) are summed over the row's lanes by a transposing butterfly (each
// exchange halves the values a lane holds, so GMAX x kRows sums cost GMAX x kRows - 1 shuffles),
// after which lane c of a row group holds the score of (head, row) number c / kReplicas.
template <int HD, int GMAX, int THREADS>
struct DecodeLayout {
    static constexpr int kWarps = THREADS / 32;
    static constexpr int kLanesPerRow = HD / 8;             // 8 or 16
    static constexpr int kRowsPerLoad = 32 / kLanesPerRow;  // row groups per warp: 4 or 2
    static constexpr int kRows = kLanesPerRow / GMAX < 8 ? kLanesPerRow / GMAX : 8;  // rows per lane per step
    static constexpr int kValues = GMAX * kRows;             // scores a lane sums per step, <= kLanesPerRow
    static constexpr int kReplicas = kLanesPerRow / kValues; // lanes of a row group left with one score
    static constexpr int kStepRows = kRows * kRowsPerLoad;   // positions a warp covers per step
    // Shared memory, byte offsets: each warp's final (max, sum) and acc, the merge's split weights.
    static constexpr size_t m_off = 0;                                       // f32 [kWarps][GMAX]
    static constexpr size_t l_off = m_off + kWarps * GMAX * 4;               // f32 [kWarps][GMAX]
    static constexpr size_t acc_off = l_off + kWarps * GMAX * 4;             // f32 [kWarps][GMAX][HD]
    static constexpr size_t w_off = acc_off + (size_t)kWarps * GMAX * HD * 4;  // f32 [GMAX][kDecMaxSplits]
    static constexpr size_t bytes = w_off + (size_t)GMAX * kDecMaxSplits * 4;
};

// Sums each of V values per lane over aligned groups of LPR lanes; returns the group's sum of
// value (lane % LPR) / (LPR / V). Exchange with offset O: the lane with bit O set keeps the upper
// half of its N values and sends the lower, its partner the reverse (one template level per
// exchange, so every index is a constant and the values stay in registers); once one value is
// left the remaining offsets are a plain butterfly over the replicas.
template <int N, int O, int V>
__device__ __forceinline__ void transpose_exchange(float (&vals)[V], int lane) {
    if constexpr (N > 1) {
        const bool upper = lane & O;
#pragma unroll
        for (int i = 0; i < N / 2; ++i) {
            const float send = upper ? vals[i] : vals[i + N / 2];
            const float keep = upper ? vals[i + N / 2] : vals[i];
            vals[i] = keep + __shfl_xor_sync(0xffffffffu, send, O);
        }
        transpose_exchange<N / 2, O / 2, V>(vals, lane);
    }
}
template <int V, int LPR>
__device__ __forceinline__ float transpose_sum(float (&vals)[V], int lane) {
    static_assert(V >= 1 && (V & (V - 1)) == 0 && V <= LPR, "V: a power of two, at most LPR");
    transpose_exchange<V, LPR / 2, V>(vals, lane);
    float s = vals[0];
#pragma unroll
    for (int o = LPR / V / 2; o >= 1; o /= 2) s += __shfl_xor_sync(0xffffffffu, s, o);
    return s;
}

// GMAX = query heads per CTA (the group, or a block of it when the group is larger). Registers
// are capped so that two 256-thread CTAs fit an SM, as the grid assumes.
template <int HD, int GMAX, int THREADS>
__global__ void __launch_bounds__(THREADS, 512 / THREADS) flash_decode_kernel(DecodeArgs a) {
    using L = DecodeLayout<HD, GMAX, THREADS>;
    constexpr int kLanesPerRow = L::kLanesPerRow, kRowsPerLoad = L::kRowsPerLoad, kRows = L::kRows;
    constexpr int kValues = L::kValues, kReplicas = L::kReplicas, kStepRows = L::kStepRows, kWarps = L::kWarps;
    constexpr unsigned kAll = 0xffffffffu;

    unsigned char* smem = ptx::dynamic_smem<unsigned char>();
    float* warp_m = reinterpret_cast<float*>(smem + L::m_off);
    float* warp_l = reinterpret_cast<float*>(smem + L::l_off);
    float* warp_acc = reinterpret_cast<float*>(smem + L::acc_off);
    float* weight = reinterpret_cast<float*>(smem + L::w_off);

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int split = blockIdx.x, b = blockIdx.z;
    const int kvh = blockIdx.y / a.head_blocks, hb = blockIdx.y % a.head_blocks;
    const int n_g = min(GMAX, a.group - hb * GMAX);
    const int head0 = kvh * a.group + hb * GMAX;

    if (!a.early_kv) pdl_wait();
    const int pos = __ldcg(a.positions + b);
    const int len = pos < 0 ? 0 : min(pos + 1, a.max_seq);
    const DecodeCut cut(len, a.min_chunk, a.n_splits);
    if (split >= cut.n) {
        pdl_wait();
        return;
    }
    const int c0 = split * cut.per, c1 = min(len, c0 + cut.per);
    const DecodeScratch sc(a, b, HD);
    bf16* out = a.out + ((size_t)b * a.n_heads + head0) * HD;

    if (c0 >= c1) {  // an empty sequence (position < 0): one split, zeros out
        pdl_wait();
        pdl_launch_dependents();
        for (int i = tid; i < n_g * HD; i += THREADS) out[i] = __float2bfloat16_rn(0.f);
        return;
    }

    // This lane: row group rg (which of a load's rows), dims [col * 8, col * 8 + 8); after the
    // butterfly it holds the score of head vg, row vr.
    const int rg = lane / kLanesPerRow, col = lane % kLanesPerRow;
    const int vg = (col / kReplicas) / kRows, vr = (col / kReplicas) % kRows;
    // The lane holding head g's row r of this lane's row group, and the first lane of head g.
    auto score_lane = [&](int g, int r) { return rg * kLanesPerRow + (g * kRows + r) * kReplicas; };
    auto head_lane = [&](int g) { return g * kRows * kReplicas; };

    const size_t slot_base = (size_t)__ldcg(a.slots + b) * a.max_seq;
    const int last = len - 1;  // this token's row, written by the kernel just before
    auto step_base = [&](int step) { return c0 + (step * kWarps + warp) * kStepRows; };
    // Rows of a step into registers; rows at or past c1 are zeros. which: 0 every row, 1 every row
    // but `last`, 2 only `last`.
    auto load_rows = [&](uint4 (&dst)[kRows], const bf16* cache, int base, int which) {
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
            const int p = base + r * kRowsPerLoad + rg;
            if (p >= c1) {
                if (which != 2) dst[r] = make_uint4(0, 0, 0, 0);
                continue;
            }
            if ((which == 1 && p == last) || (which == 2 && p != last)) continue;
            dst[r] = __ldcg(reinterpret_cast<const uint4*>(cache + ((slot_base + p) * a.n_kv_heads + kvh) * HD) + col);
        }
    };

    uint4 kr[kRows], vrow[kRows];
    const bool any = step_base(0) < c1;
    if (any) {
        load_rows(kr, a.k_cache, step_base(0), a.early_kv ? 1 : 0);
        load_rows(vrow, a.v_cache, step_base(0), a.early_kv ? 1 : 0);
    }
    if (a.early_kv) {
        pdl_wait();
        if (any) {
            load_rows(kr, a.k_cache, step_base(0), 2);
            load_rows(vrow, a.v_cache, step_base(0), 2);
        }
    }
    if (!a.late_trigger) pdl_launch_dependents();

    // This lane's 8 dims of each query head, kept as bf16 (the scale is applied to the summed
    // score); heads past n_g are zeros.
    uint4 q8[GMAX];
#pragma unroll
    for (int g = 0; g < GMAX; ++g)
        q8[g] = g < n_g ? *(reinterpret_cast<const uint4*>(a.q + ((size_t)b * a.n_heads + head0 + g) * HD) + col)
                        : make_uint4(0, 0, 0, 0);

    float run_max = -INFINITY, run_sum = 0.f;  // of head vg over this warp's rows so far
    float acc[GMAX][8];
#pragma unroll
    for (int g = 0; g < GMAX; ++g)
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[g][j] = 0.f;

    for (int step = 0; step_base(step) < c1; ++step) {
        const int base = step_base(step), next = step_base(step + 1);
        // Scores: this lane's 8 dims of each (head, row), then summed over the row's lanes.
        float vals[kValues];
#pragma unroll
        for (int g = 0; g < GMAX; ++g) {
            const uint4 q = q8[g];
#pragma unroll
            for (int r = 0; r < kRows; ++r) {
                const uint4 k = kr[r];
                vals[g * kRows + r] = util::bf16_lo(k.x) * util::bf16_lo(q.x) + util::bf16_hi(k.x) * util::bf16_hi(q.x) +
                                      util::bf16_lo(k.y) * util::bf16_lo(q.y) + util::bf16_hi(k.y) * util::bf16_hi(q.y) +
                                      util::bf16_lo(k.z) * util::bf16_lo(q.z) + util::bf16_hi(k.z) * util::bf16_hi(q.z) +
                                      util::bf16_lo(k.w) * util::bf16_lo(q.w) + util::bf16_hi(k.w) * util::bf16_hi(q.w);
            }
        }
        if (next < c1) load_rows(kr, a.k_cache, next, 0);  // K of this step is consumed
        float s = transpose_sum<kValues, kLanesPerRow>(vals, lane) * a.scale_log2;
        if (base + vr * kRowsPerLoad + rg >= c1) s = -INFINITY;

        // Online softmax of head vg over the lanes holding its rows (replicas skipped).
        float step_max = s;
#pragma unroll
        for (int o = kReplicas; o < kReplicas * kRows; o *= 2) step_max = fmaxf(step_max, __shfl_xor_sync(kAll, step_max, o));
#pragma unroll
        for (int o = kLanesPerRow; o < 32; o *= 2) step_max = fmaxf(step_max, __shfl_xor_sync(kAll, step_max, o));
        const float new_max = fmaxf(run_max, step_max);  // finite: row `base` is in every head
        const float alpha = exp2f(run_max - new_max);
        const float p = exp2f(s - new_max);
        float step_sum = p;
#pragma unroll
        for (int o = kReplicas; o < kReplicas * kRows; o *= 2) step_sum += __shfl_xor_sync(kAll, step_sum, o);
#pragma unroll
        for (int o = kLanesPerRow; o < 32; o *= 2) step_sum += __shfl_xor_sync(kAll, step_sum, o);
        run_sum = run_sum * alpha + step_sum;
        run_max = new_max;

        // acc[g] = acc[g] * alpha_g + sum_r p[g][r] * V[r] over this lane's rows and dims.
#pragma unroll
        for (int g = 0; g < GMAX; ++g) {
            const float alpha_g = __shfl_sync(kAll, alpha, head_lane(g));
#pragma unroll
            for (int j = 0; j < 8; ++j) acc[g][j] *= alpha_g;
        }
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
            const uint4 v = vrow[r];
            const float v8[8] = {util::bf16_lo(v.x), util::bf16_hi(v.x), util::bf16_lo(v.y), util::bf16_hi(v.y),
                                 util::bf16_lo(v.z), util::bf16_hi(v.z), util::bf16_lo(v.w), util::bf16_hi(v.w)};
#pragma unroll
            for (int g = 0; g < GMAX; ++g) {
                const float pg = __shfl_sync(kAll, p, score_lane(g, r));
#pragma unroll
                for (int j = 0; j < 8; ++j) acc[g][j] = fmaf(pg, v8[j], acc[g][j]);
            }
        }
        if (next < c1) load_rows(vrow, a.v_cache, next, 0);
    }

    // The row groups of a warp hold the same dims: add them, then combine the warps.
#pragma unroll
    for (int g = 0; g < GMAX; ++g)
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
            for (int o = kLanesPerRow; o < 32; o *= 2) acc[g][j] += __shfl_xor_sync(kAll, acc[g][j], o);
    if (rg == 0) {
#pragma unroll
        for (int g = 0; g < GMAX; ++g) {
            float4* dst = reinterpret_cast<float4*>(warp_acc + (warp * GMAX + g) * HD + col * 8);
            dst[0] = make_float4(acc[g][0], acc[g][1], acc[g][2], acc[g][3]);
            dst[1] = make_float4(acc[g][4], acc[g][5], acc[g][6], acc[g][7]);
        }
        if (vr == 0 && col % kReplicas == 0) {
            warp_m[warp * GMAX + vg] = run_max;
            warp_l[warp * GMAX + vg] = run_sum;
        }
    }
    __syncthreads();

    // Warp w weighs 2^(m_w - M); a warp without rows has m = -inf and weighs 0 (warp 0 always has one).
    for (int i = tid; i < n_g * HD; i += THREADS) {
        const int g = i / HD, d = i % HD;
        float m = -INFINITY;
#pragma unroll
        for (int w = 0; w < kWarps; ++w) m = fmaxf(m, warp_m[w * GMAX + g]);
        float l = 0.f, o = 0.f;
#pragma unroll
        for (int w = 0; w < kWarps; ++w) {
            const float e = exp2f(warp_m[w * GMAX + g] - m);
            l += e * warp_l[w * GMAX + g];
            o += e * warp_acc[(w * GMAX + g) * HD + d];
        }
        if (cut.n == 1) {
            out[(size_t)g * HD + d] = __float2bfloat16_rn(o / l);
        } else {
            sc.acc(head0 + g, split)[d] = o;
            if (d == 0) sc.ml(head0 + g, split)[0] = m, sc.ml(head0 + g, split)[1] = l;
        }
    }
    if (cut.n == 1) return;
    const auto cta_barrier = [] { __syncthreads(); };
    if (!util::arrived_last(sc.counter(blockIdx.y), cut.n, tid == 0, a.release_count, cta_barrier)) return;
    merge_splits<HD, GMAX, THREADS>(sc, head0, n_g, cut.n, weight, out);
}

template <int HD, int GMAX, int THREADS>
void launch_decode(const DecodeArgs& a, int B, cudaStream_t stream) {
    using L = DecodeLayout<HD, GMAX, THREADS>;
    auto kernel = flash_decode_kernel<HD, GMAX, THREADS>;
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)L::bytes));
    const dim3 grid(a.n_splits, a.n_kv_heads * a.head_blocks, B);
    launch_pdl(kernel, grid, dim3(THREADS), L::bytes, stream, a);
    CUDA_CHECK_LAUNCH("flash_decode_kernel");
}

// Query heads per decode CTA: the GQA group rounded up to a kernel instance, at most 4 (a larger
// group takes several head blocks, which read the same K/V rows, the later ones mostly from L2):
// at 8 a lane's accumulators and q alone would take 96 of the 128 registers it may have.
inline int decode_gmax(int group) { return group <= 1 ? 1 : group <= 2 ? 2 : 4; }

// The instance decode_args() sized head_blocks for: both read decode_gmax.
template <int HD, int THREADS>
void launch_decode_group(const DecodeArgs& a, int B, cudaStream_t stream) {
    switch (decode_gmax(a.group)) {
        case 1: launch_decode<HD, 1, THREADS>(a, B, stream); break;
        case 2: launch_decode<HD, 2, THREADS>(a, B, stream); break;
        default: launch_decode<HD, 4, THREADS>(a, B, stream); break;
    }
}

// The shipped launch choices; the lab (benchmarks/lab/cuda_flash_decode_lab.cu) varies them.
constexpr int kDecMinChunk = 64;
constexpr int kDecThreads = 256;
constexpr int kDecCtasPerSm = 2;

// Diagnostic switches for benchmarks/lab/decode_variants.sh, read once: LLAMA_BRRR_DECODE_CHUNK=N
// makes N positions the fewest a split takes; LLAMA_BRRR_DECODE_THREADS=128 runs CTAs of 128
// threads instead of 256; LLAMA_BRRR_DECODE_CTAS_PER_SM=N sizes the grid; LLAMA_BRRR_DECODE_EARLY=0
// loads the first K/V rows only after the PDL wait; LLAMA_BRRR_DECODE_LATE_TRIGGER=0/1 overrides
// the trigger choice of decode_args().
int decode_min_chunk() {
    static const int n = env_int("LLAMA_BRRR_DECODE_CHUNK", kDecMinChunk);
    return n >= 1 ? n : kDecMinChunk;
}
int decode_threads() {
    static const int n = env_int("LLAMA_BRRR_DECODE_THREADS", kDecThreads);
    return n == 128 ? 128 : 256;
}
int decode_ctas_per_sm() {
    static const int n = env_int("LLAMA_BRRR_DECODE_CTAS_PER_SM", kDecCtasPerSm);
    return n >= 1 && n <= 8 ? n : kDecCtasPerSm;
}
// When the wo GEMV after flash_decode may launch. Measured end to end on H100 (decode_variants.sh
// 11): at hd 128 letting it launch only as the decode CTAs exit is 1.035x faster (Llama-3-8B),
// at hd 64 0.979x (Llama-3.2-1B). Why is open; the runs of 2026-11-25 ruled out three readings
// (benchmarks/results/h100-sxm/variants/): a wo grid spilling into a second wave beside the decode
// CTAs (half the CTAs lost the same, rows2_table.txt); the decode's loads queueing behind wo's
// 16 MB of early weight loads (wo launched only once the last K/V tile had landed lost the same,
// trigger_landed_table.txt, and so did wo's loads paced over 3.5-14 us, wo_paced_table.txt); the
// merge's round trips (with one chunk and no merge the early launch loses more, 0.941x against
// 0.984x, one_chunk_table.txt).
bool decode_late_trigger(int head_dim) {
    static const int forced = env_int("LLAMA_BRRR_DECODE_LATE_TRIGGER", -1);
    return forced >= 0 ? forced != 0 : head_dim >= 128;
}
// LLAMA_BRRR_DECODE_RELEASE=0 counts finished splits with a fence in every thread and a relaxed
// atomic (the form before 2026-11-25) instead of one acq_rel atomic, read once.
bool decode_release_count() {
    static const bool on = env_flag("LLAMA_BRRR_DECODE_RELEASE", true);
    return on;
}
bool decode_early_kv() {
    static const bool on = env_flag("LLAMA_BRRR_DECODE_EARLY", true);
    return on;
}
// The split count is rounded down, so the grid never spills past the CTAs the GPU holds at once
// (rounding up spilled a second wave at batch 4 and 16: 1B batch 16 1.02x / 1.06x at 128 / 2048
// positions, run BY). LLAMA_BRRR_DECODE_ONE_WAVE=0 rounds up again, read once.
bool decode_one_wave() {
    static const bool on = env_flag("LLAMA_BRRR_DECODE_ONE_WAVE", true);
    return on;
}

// Splits from shapes only (positions are on the device): at most two CTAs per SM at this batch
// (at least one split), never more than max_splits, kDecMaxSplits or 64-position chunks of max_seq.
DecodeArgs decode_args(const bf16* q, const bf16* k_cache, const bf16* v_cache, const int* slots,
                       const int* positions, bf16* out, float* scratch, int B, int n_heads,
                       int n_kv_heads, int head_dim, int max_seq, int max_splits) {
    DecodeArgs a;
    a.q = q;
    a.k_cache = k_cache;
    a.v_cache = v_cache;
    a.slots = slots;
    a.positions = positions;
    a.out = out;
    a.scratch = scratch;
    a.n_heads = n_heads;
    a.n_kv_heads = n_kv_heads;
    a.group = n_heads / n_kv_heads;
    a.head_blocks = CEIL_DIV(a.group, decode_gmax(a.group));
    a.max_seq = max_seq;
    a.max_splits = max_splits;
    const int ctas_per_split = B * n_kv_heads * a.head_blocks;
    const int resident = decode_ctas_per_sm() * device_facts().sm_count;
    const int want = decode_one_wave() ? resident / ctas_per_split : CEIL_DIV(resident, ctas_per_split);
    a.n_splits = std::max(1, std::min({want, max_splits, kDecMaxSplits, CEIL_DIV(max_seq, kDecChunkUnit)}));
    a.min_chunk = decode_min_chunk();
    a.threads = decode_threads();
    a.early_kv = decode_early_kv();
    a.late_trigger = decode_late_trigger(head_dim);
    a.release_count = decode_release_count();
    a.scale_log2 = kLog2e / std::sqrt((float)head_dim);
    return a;
}

void launch_flash_decode(const DecodeArgs& a, int B, int head_dim, cudaStream_t stream) {
    const bool wide = a.threads == 256;
    if (head_dim == 64) wide ? launch_decode_group<64, 256>(a, B, stream) : launch_decode_group<64, 128>(a, B, stream);
    else wide ? launch_decode_group<128, 256>(a, B, stream) : launch_decode_group<128, 128>(a, B, stream);
}

// ==== prefill =================================================================================

constexpr int kPreWarps = 4;
constexpr int kPreTiles = 2;                        // 16-row m-tiles per warp
constexpr int kPreRows = 16 * kPreTiles * kPreWarps;  // queries per CTA: 128
constexpr int kPreThreads = 32 * kPreWarps;

// KV positions per tile: 64, or 32 at hd 128 where the 104 KB of 64 exceed what a CTA may have
// (sm_86/89: 99 KB; 32 measured 0.88-0.94x of 64 on H100).
template <int HD, int KV, int ROWS = kPreRows>
constexpr size_t prefill_smem_bytes() {
    return (size_t)(ROWS + 4 * KV) * (HD + 8) * sizeof(uint16_t);
}

struct PrefillArgs {
    const bf16* q;
    const bf16* k_cache;
    const bf16* v_cache;
    bf16* out;
    int slot, start_pos, T, n_heads, n_kv_heads, group, max_seq;
    float scale_log2;
    bool heads_fast;  // grid x = head, y = query tile (else x = query tile, y = head)
};

// WARPS warps of MT 16-row m-tiles each (the engine: 4 x 2, 128 queries per CTA). QREG: the Q
// fragments stay in registers for the whole KV loop (the engine: at hd 64; at hd 128 they would
// not fit beside two m-tiles' accumulators and are re-read from shared memory at every k-step).
// The lab (benchmarks/lab/attention_prefill_variants.cuh) instantiates the other shapes it measured.
template <int HD, int KV, int WARPS = kPreWarps, int MT = kPreTiles, bool QREG = HD == 64>
__global__ void __launch_bounds__(WARPS * 32) attention_prefill_kernel(PrefillArgs a) {
    constexpr int P = HD + 8;  // padded pitch: ldmatrix rows in distinct bank groups
    constexpr int kKSteps = HD / 16, kOutFrags = HD / 8;
    constexpr int kRows = 16 * WARPS * MT, kThreads = 32 * WARPS;
    uint16_t* Qs = ptx::dynamic_smem<uint16_t>();
    uint16_t* Ks = Qs + kRows * P;  // [2][KV][P]
    uint16_t* Vs = Ks + 2 * KV * P;

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t4 = lane & 3;
    // The longest query tiles (the last ones) are scheduled first.
    const int q_tile = a.heads_fast ? gridDim.y - 1 - blockIdx.y : gridDim.x - 1 - blockIdx.x;
    const int hq = a.heads_fast ? blockIdx.x : blockIdx.y, kvh = hq / a.group;
    const int q0 = q_tile * kRows;
    const int kv_total = a.start_pos + a.T;                 // filled cache positions
    const int kv_end = a.start_pos + min(q0 + kRows, a.T);  // what this tile's last row sees
    const int n_tiles = CEIL_DIV(kv_end, KV);
    const size_t slot_base = (size_t)a.slot * a.max_seq;

    const uint16_t* qbits = reinterpret_cast<const uint16_t*>(a.q);
    const uint16_t* kbits = reinterpret_cast<const uint16_t*>(a.k_cache);
    const uint16_t* vbits = reinterpret_cast<const uint16_t*>(a.v_cache);
    for (int c = tid; c < kRows * HD / 8; c += kThreads) {
        const int r = c / (HD / 8), col = (c % (HD / 8)) * 8;
        const bool ok = q0 + r < a.T;
        ptx::cp_async_16(Qs + r * P + col, qbits + ((size_t)(ok ? q0 + r : 0) * a.n_heads + hq) * HD + col, ok);
    }
    auto load_kv = [&](int stage, int p0) {
        uint16_t* Kst = Ks + stage * KV * P;
        uint16_t* Vst = Vs + stage * KV * P;
        for (int c = tid; c < KV * HD / 8; c += kThreads) {
            const int r = c / (HD / 8), col = (c % (HD / 8)) * 8;
            const int p = p0 + r;
            const bool ok = p < kv_total;
            const size_t off = ((slot_base + (ok ? p : 0)) * a.n_kv_heads + kvh) * HD + col;
            ptx::cp_async_16(Kst + r * P + col, kbits + off, ok);
            ptx::cp_async_16(Vst + r * P + col, vbits + off, ok);
        }
    };
    load_kv(0, 0);
    ptx::cp_async_commit();

    // The warp's 16 * MT rows are contiguous, so the KV tiles past its last row are skipped whole.
    const int warp_row0 = warp * 16 * MT;
    const int warp_first_pos = a.start_pos + q0 + warp_row0;
    const int warp_last_pos = warp_first_pos + 16 * MT - 1;
    int row_pos[MT][2];                    // this thread's rows g and g + 8 of each m-tile
    float row_max[MT][2], row_sum[MT][2];  // max in log2 units; sum is this thread's share
    float o[MT][kOutFrags][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            row_pos[mt][h] = warp_first_pos + mt * 16 + g + 8 * h;
            row_max[mt][h] = -INFINITY;
            row_sum[mt][h] = 0.f;
        }
#pragma unroll
        for (int f = 0; f < kOutFrags; ++f) o[mt][f][0] = o[mt][f][1] = o[mt][f][2] = o[mt][f][3] = 0.f;
    }
    uint32_t qf[QREG ? MT : 1][QREG ? kKSteps : 1][4];  // 1 x 1, unused, when Q is re-read
    auto q_fragment = [&](uint32_t r[4], int mt, int ks) {
        ptx::ldmatrix_x4(r, Qs + (warp_row0 + mt * 16 + (lane & 15)) * P + ks * 16 + (lane >> 4) * 8);
    };

    for (int kt = 0; kt < n_tiles; ++kt) {
        const int stage = kt & 1, kv0 = kt * KV;
        if (kt + 1 < n_tiles) {
            load_kv(stage ^ 1, kv0 + KV);
            ptx::cp_async_commit();
            ptx::cp_async_wait<1>();
        } else {
            ptx::cp_async_wait<0>();
        }
        __syncthreads();
        if (QREG && kt == 0) {
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int ks = 0; ks < kKSteps; ++ks) q_fragment(qf[QREG ? mt : 0][QREG ? ks : 0], mt, ks);
        }
        if (kv0 <= warp_last_pos) {
            const uint16_t* Kst = Ks + stage * KV * P;
            const uint16_t* Vst = Vs + stage * KV * P;

            // S = Q K^T for the warp's rows x KV positions: each K fragment feeds the MT m-tiles.
            float s[MT][KV / 8][4];
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int f = 0; f < KV / 8; ++f) s[mt][f][0] = s[mt][f][1] = s[mt][f][2] = s[mt][f][3] = 0.f;
#pragma unroll
            for (int ks = 0; ks < kKSteps; ++ks) {
                uint32_t qcur[MT][4];
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    if (QREG) {
#pragma unroll
                        for (int e = 0; e < 4; ++e) qcur[mt][e] = qf[QREG ? mt : 0][QREG ? ks : 0][e];
                    } else {
                        q_fragment(qcur[mt], mt, ks);
                    }
                }
#pragma unroll
                for (int nj = 0; nj < KV / 16; ++nj) {
                    uint32_t r[4];
                    ptx::ldmatrix_x4(r, Kst + (nj * 16 + (lane >> 4) * 8 + (lane & 7)) * P + ks * 16 + ((lane >> 3) & 1) * 8);
                    const uint32_t b0[2] = {r[0], r[1]}, b1[2] = {r[2], r[3]};
#pragma unroll
                    for (int mt = 0; mt < MT; ++mt) {
                        ptx::mma_bf16_16816(s[mt][2 * nj], qcur[mt], b0);
                        ptx::mma_bf16_16816(s[mt][2 * nj + 1], qcur[mt], b1);
                    }
                }
            }

            // Mask the future on the tiles that reach past the warp's first row; online softmax
            // (a row lives in the 4 threads of a quad), the scale applied in the exponent's FFMA.
            const bool diagonal = kv0 + KV - 1 > warp_first_pos;
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                if (diagonal) {
#pragma unroll
                    for (int f = 0; f < KV / 8; ++f)
#pragma unroll
                        for (int e = 0; e < 4; ++e)
                            if (kv0 + f * 8 + 2 * t4 + (e & 1) > row_pos[mt][e >> 1]) s[mt][f][e] = -INFINITY;
                }
                float alpha[2], base[2];
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    float mx = -INFINITY;
#pragma unroll
                    for (int f = 0; f < KV / 8; ++f) mx = fmaxf(mx, fmaxf(s[mt][f][2 * h], s[mt][f][2 * h + 1]));
                    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                    const float new_max = fmaxf(row_max[mt][h], mx * a.scale_log2);
                    base[h] = new_max == -INFINITY ? 0.f : new_max;  // a row with nothing seen yet
                    alpha[h] = exp2f(row_max[mt][h] - base[h]);
                    row_max[mt][h] = new_max;
                    row_sum[mt][h] *= alpha[h];
                }
#pragma unroll
                for (int f = 0; f < KV / 8; ++f) {
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        s[mt][f][e] = exp2f(fmaf(s[mt][f][e], a.scale_log2, -base[e >> 1]));
                        row_sum[mt][e >> 1] += s[mt][f][e];
                    }
                }
#pragma unroll
                for (int f = 0; f < kOutFrags; ++f) {
                    o[mt][f][0] *= alpha[0];
                    o[mt][f][1] *= alpha[0];
                    o[mt][f][2] *= alpha[1];
                    o[mt][f][3] *= alpha[1];
                }
            }

            // O += P V: the S accumulators of positions 16j..16j+15 are the A fragment of k-step
            // j (the two layouts coincide); each V fragment feeds the MT m-tiles.
#pragma unroll
            for (int j = 0; j < KV / 16; ++j) {
                uint32_t pa[MT][4];
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    pa[mt][0] = util::pack_bf16x2(s[mt][2 * j][0], s[mt][2 * j][1]);
                    pa[mt][1] = util::pack_bf16x2(s[mt][2 * j][2], s[mt][2 * j][3]);
                    pa[mt][2] = util::pack_bf16x2(s[mt][2 * j + 1][0], s[mt][2 * j + 1][1]);
                    pa[mt][3] = util::pack_bf16x2(s[mt][2 * j + 1][2], s[mt][2 * j + 1][3]);
                }
#pragma unroll
                for (int i = 0; i < HD / 16; ++i) {
                    // Matrices: (pos 0-7, d 0-7), (pos 8-15, d 0-7), (pos 0-7, d 8-15), (pos 8-15, d 8-15).
                    uint32_t r[4];
                    ptx::ldmatrix_x4_trans(r, Vst + (j * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * P + i * 16 + (lane >> 4) * 8);
                    const uint32_t b0[2] = {r[0], r[1]}, b1[2] = {r[2], r[3]};
#pragma unroll
                    for (int mt = 0; mt < MT; ++mt) {
                        ptx::mma_bf16_16816(o[mt][2 * i], pa[mt], b0);
                        ptx::mma_bf16_16816(o[mt][2 * i + 1], pa[mt], b1);
                    }
                }
            }
        }
        __syncthreads();  // the stage is overwritten by the next iteration's prefetch
    }

#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            float l = row_sum[mt][h];
            l += __shfl_xor_sync(0xffffffffu, l, 1);
            l += __shfl_xor_sync(0xffffffffu, l, 2);
            const int row = q0 + warp_row0 + mt * 16 + g + 8 * h;
            if (row < a.T) {
                const float inv = 1.f / l;
                uint32_t* dst = reinterpret_cast<uint32_t*>(a.out + ((size_t)row * a.n_heads + hq) * HD);
#pragma unroll
                for (int f = 0; f < kOutFrags; ++f)
                    dst[(f * 8 + 2 * t4) / 2] = util::pack_bf16x2(o[mt][f][2 * h] * inv, o[mt][f][2 * h + 1] * inv);
            }
        }
    }
}

// ---- prefill on Hopper: TMA-fed warpgroup MMA -----------------------------------------------
//
// 384 threads: warpgroup 0 produces, warpgroups 1 and 2 consume 64 query rows each (128 per CTA,
// the grid of the kernel above). One producer thread issues the TMA copies of Q (once) and of each
// 128-position tile's K and V into a ring of kSm90Stages slots; slot s has a `full` mbarrier that
// completes when its bytes have landed and an `empty` one that completes when the 8 consumer warps
// have released it. Every tile lives in shared memory as TMA's 128-byte swizzle writes it: 64-wide
// column blocks of 128 rows x 128 bytes (hd 128: two of them). Per tile a consumer warpgroup runs
//   S = Q K^T    wgmma m64n128k16 x hd/16 k-steps, Q and K K-major from shared memory
//   softmax      online, fp32, on the S accumulators (a row lives in the 4 threads of a quad)
//   O += P V     wgmma m64n{hd}k16 x 8 k-steps, P from registers (the S accumulators of positions
//                16j..16j+15 are k-step j's A fragment), V MN-major from shared memory
// and the two consumers never wait for each other, so one's softmax overlaps the other's MMAs.
// TMA zero-fills the rows past T and past the filled cache (the maps end there): nothing outside
// is read, and masked positions meet zeros, not stale NaNs. A warpgroup releases the tiles past
// its last row unread. The lab (cuda_attention_prefill_lab.cu, 15) measured this on H100 at
// hd 128: 414 / 551 / 566 TF/s on Llama-3-8B heads at 2048 / 8192 / 16384 tokens, 1.4-1.8x the
// mma.sync kernel; a third ring slot, FlashAttention-3's intra-warpgroup overlap and its ping-pong
// order between the consumers measured no better there (16-19).

constexpr int kSm90Threads = 384;
constexpr int kSm90Stages = 2;
constexpr int kSwRowBytes = 128;                    // one swizzled row: 64 bf16
[[maybe_unused]] constexpr int kSwBlockBytes = kPreRows * kSwRowBytes;  // a 64-wide column block of a 128-row tile

template <int HD>
struct Sm90Layout {
    static constexpr int kTileBytes = kPreRows * HD * 2;  // Q, K or V tile: 128 rows x hd
    static constexpr int kStageBytes = 2 * kTileBytes;     // K, then V
    // Q, the ring, the barriers (q_full, full[], empty[]), and 1 KB to align Q to the swizzle atom.
    static constexpr size_t bytes =
        (size_t)kTileBytes + (size_t)kSm90Stages * kStageBytes + (1 + 2 * kSm90Stages) * sizeof(uint64_t) + 1024;
};

// The online-softmax state of a warpgroup's 64 query rows. This thread holds rows r0 = 16 w + g
// and r1 = r0 + 8 (w the warp in the warpgroup, g = lane / 4) and, in o[4i + e], O[row e / 2]
// [hd column 8i + 2 t4 + e % 2] (the wgmma accumulator layout).
template <int HD>
struct WgRows {
    int row_pos[2];                // cache position of rows r0, r1
    float row_max[2], row_sum[2];  // max in log2 units; sum is this thread's share of the row
    float o[HD / 2];
};

template <int HD>
__device__ __forceinline__ void wg_rows_init(WgRows<HD>& st, int warp_first_pos, int g) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        st.row_pos[h] = warp_first_pos + g + 8 * h;
        st.row_max[h] = -INFINITY;
        st.row_sum[h] = 0.f;
    }
#pragma unroll
    for (int i = 0; i < HD / 2; ++i) st.o[i] = 0.f;
}

// O / l of this thread's rows row0 and row0 + 8 into out, rows past T skipped.
template <int HD>
__device__ __forceinline__ void wg_store_rows(const WgRows<HD>& st, const PrefillArgs& a, int row0, int hq, int t4) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        float l = st.row_sum[h];
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        const int row = row0 + 8 * h;
        if (row < a.T) {
            const float inv = 1.f / l;
            uint32_t* dst = reinterpret_cast<uint32_t*>(a.out + ((size_t)row * a.n_heads + hq) * HD);
#pragma unroll
            for (int i = 0; i < HD / 8; ++i)
                dst[(8 * i + 2 * t4) / 2] = util::pack_bf16x2(st.o[4 * i + 2 * h] * inv, st.o[4 * i + 2 * h + 1] * inv);
        }
    }
}

// S = Q K^T for one 128-position tile: k-step ks reads 16 columns of hd, in column block ks / 4 at
// byte 32 (ks % 4). q_wg is the warpgroup's first Q row in block 0.
template <int HD>
__device__ __forceinline__ void wg_issue_s(float (&s)[64], const unsigned char* q_wg, const unsigned char* Kst) {
#pragma unroll
    for (int ks = 0; ks < HD / 16; ++ks) {
        const int off = (ks >> 2) * kSwBlockBytes + (ks & 3) * 32;
        hopper::wgmma_m64n128k16_bf16(s, hopper::sw128_descriptor(q_wg + off), hopper::sw128_descriptor(Kst + off),
                                      ks > 0);
    }
    hopper::wgmma_commit();
}

// O += P V: k-step j covers positions 16j..16j+15, rows 16j.. of every column block of V.
template <int HD>
__device__ __forceinline__ void wg_issue_pv(float (&o)[HD / 2], const uint32_t (&p)[8][4], const unsigned char* Vst) {
#pragma unroll
    for (int j = 0; j < 8; ++j)
        hopper::wgmma_rs_tb<HD>(o, p[j], hopper::sw128_mn_descriptor(Vst + j * 16 * kSwRowBytes, kSwBlockBytes));
    hopper::wgmma_commit();
}

// The causal mask and the online softmax on a finished S of the tile at kv0: s becomes P (fp32,
// relative to the new row max), the statistics move on, and O is rescaled for the P V to come.
// s[4i + e] is S[row e / 2][position kv0 + 8i + 2 t4 + e % 2].
template <int HD>
__device__ __forceinline__ void wg_softmax(WgRows<HD>& st, float (&s)[64], int kv0, int warp_first_pos, int t4,
                                           float scale_log2) {
    if (kv0 + 127 > warp_first_pos) {
#pragma unroll
        for (int i = 0; i < 16; ++i)
#pragma unroll
            for (int e = 0; e < 4; ++e)
                if (kv0 + 8 * i + 2 * t4 + (e & 1) > st.row_pos[e >> 1]) s[4 * i + e] = -INFINITY;
    }
    float shift[2], alpha[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        float mx = -INFINITY;
#pragma unroll
        for (int i = 0; i < 16; ++i) mx = fmaxf(mx, fmaxf(s[4 * i + 2 * h], s[4 * i + 2 * h + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float new_max = fmaxf(st.row_max[h], mx * scale_log2);
        shift[h] = new_max == -INFINITY ? 0.f : new_max;  // a row with nothing seen yet
        alpha[h] = exp2f(st.row_max[h] - shift[h]);
        st.row_max[h] = new_max;
        st.row_sum[h] *= alpha[h];
    }
#pragma unroll
    for (int i = 0; i < 16; ++i) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            s[4 * i + e] = exp2f(fmaf(s[4 * i + e], scale_log2, -shift[e >> 1]));
            st.row_sum[e >> 1] += s[4 * i + e];
        }
    }
#pragma unroll
    for (int i = 0; i < HD / 8; ++i) {
        st.o[4 * i + 0] *= alpha[0];
        st.o[4 * i + 1] *= alpha[0];
        st.o[4 * i + 2] *= alpha[1];
        st.o[4 * i + 3] *= alpha[1];
    }
}

// One tile start to finish; returns with every wgmma complete, so its slot may be released.
template <int HD>
__device__ __forceinline__ void wg_attend_tile(WgRows<HD>& st, const unsigned char* q_wg, const unsigned char* Kst,
                                               const unsigned char* Vst, int kv0, int warp_first_pos, int t4,
                                               float scale_log2) {
    float s[64];
    uint32_t p[8][4];
    hopper::wgmma_fence();
    wg_issue_s<HD>(s, q_wg, Kst);
    hopper::wgmma_wait<0>();
    hopper::fence_accumulators(s);
    wg_softmax<HD>(st, s, kv0, warp_first_pos, t4, scale_log2);
#pragma unroll
    for (int i = 0; i < 16; ++i) {
        p[i >> 1][(i & 1) * 2 + 0] = util::pack_bf16x2(s[4 * i + 0], s[4 * i + 1]);
        p[i >> 1][(i & 1) * 2 + 1] = util::pack_bf16x2(s[4 * i + 2], s[4 * i + 3]);
    }
    hopper::wgmma_fence();
    wg_issue_pv<HD>(st.o, p, Vst);
    hopper::wgmma_wait<0>();
    hopper::fence_accumulators(st.o);
}

template <int HD>
__global__ void __launch_bounds__(kSm90Threads, 1)
    attention_prefill_sm90_kernel(const __grid_constant__ CUtensorMap q_map, const __grid_constant__ CUtensorMap k_map,
                                  const __grid_constant__ CUtensorMap v_map, PrefillArgs a) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using L = Sm90Layout<HD>;
    constexpr int kBlocks = HD / 64;  // 64-wide column blocks per tile
    // 64K registers per SM: producer 128 x 40 + consumers 256 x 232 = 64512 (the GEMM's split).
    constexpr int kProducerRegs = 40, kConsumerRegs = 232;
    unsigned char* raw = ptx::dynamic_smem<unsigned char>();
    unsigned char* Qs = raw + ((1024 - (ptx::smem_addr(raw) & 1023)) & 1023);
    unsigned char* ring = Qs + L::kTileBytes;
    uint64_t* q_full = reinterpret_cast<uint64_t*>(ring + kSm90Stages * L::kStageBytes);
    uint64_t* full = q_full + 1;
    uint64_t* empty = full + kSm90Stages;
    if (threadIdx.x == 0) {
        hopper::mbarrier_init(q_full, 1);
        for (int s = 0; s < kSm90Stages; ++s) {
            hopper::mbarrier_init(full + s, 1);
            hopper::mbarrier_init(empty + s, 8);
        }
        hopper::fence_barrier_init();
    }
    __syncthreads();

    const int warpgroup = threadIdx.x / 128;
    const int q_tile = a.heads_fast ? gridDim.y - 1 - blockIdx.y : gridDim.x - 1 - blockIdx.x;
    const int hq = a.heads_fast ? blockIdx.x : blockIdx.y, kvh = hq / a.group;
    const int q0 = q_tile * kPreRows;
    const int kv_end = a.start_pos + min(q0 + kPreRows, a.T);
    const int n_tiles = CEIL_DIV(kv_end, kPreRows);

    if (warpgroup == 0) {
        hopper::regs_decrease<kProducerRegs>();
        if (threadIdx.x == 0) {
            hopper::prefetch_tensor_map(&q_map);
            hopper::prefetch_tensor_map(&k_map);
            hopper::prefetch_tensor_map(&v_map);
            hopper::mbarrier_arrive_expect_tx(q_full, L::kTileBytes);
#pragma unroll
            for (int b = 0; b < kBlocks; ++b) hopper::tma_load_2d(Qs + b * kSwBlockBytes, &q_map, hq * HD + 64 * b, q0, q_full);
            int stage = 0;
            uint32_t phase = 0;
            for (int kt = 0; kt < n_tiles; ++kt) {
                hopper::mbarrier_wait(empty + stage, phase ^ 1);
                unsigned char* k = ring + stage * L::kStageBytes;
                unsigned char* v = k + L::kTileBytes;
                hopper::mbarrier_arrive_expect_tx(full + stage, L::kStageBytes);
#pragma unroll
                for (int b = 0; b < kBlocks; ++b) {
                    hopper::tma_load_2d(k + b * kSwBlockBytes, &k_map, kvh * HD + 64 * b, kt * kPreRows, full + stage);
                    hopper::tma_load_2d(v + b * kSwBlockBytes, &v_map, kvh * HD + 64 * b, kt * kPreRows, full + stage);
                }
                if (++stage == kSm90Stages) {
                    stage = 0;
                    phase ^= 1;
                }
            }
        }
    } else {
        hopper::regs_increase<kConsumerRegs>();
        const int consumer = warpgroup - 1;
        const int lane = threadIdx.x & 31, w = (threadIdx.x / 32) & 3, g = lane >> 2, t4 = lane & 3;
        const int wg_first_pos = a.start_pos + q0 + 64 * consumer;
        const int warp_first_pos = wg_first_pos + 16 * w;
        WgRows<HD> st;
        wg_rows_init(st, warp_first_pos, g);
        const unsigned char* q_wg = Qs + 64 * consumer * kSwRowBytes;
        hopper::mbarrier_wait(q_full, 0);
        // The tiles this warpgroup computes start at or before its last row; the later ones are
        // released unread (the other warpgroup needs them).
        const int n_mine = min(n_tiles, (wg_first_pos + 63) / kPreRows + 1);
        // Two loops, not a branch around the MMAs: ptxas serializes every wgmma of a kernel that
        // issues one under a condition (C7520).
        int stage = 0;
        uint32_t phase = 0;
        auto release = [&] {
            if (lane == 0) hopper::mbarrier_arrive(empty + stage);
            if (++stage == kSm90Stages) {
                stage = 0;
                phase ^= 1;
            }
        };
        for (int kt = 0; kt < n_mine; ++kt) {
            hopper::mbarrier_wait(full + stage, phase);
            const unsigned char* k = ring + stage * L::kStageBytes;
            wg_attend_tile<HD>(st, q_wg, k, k + L::kTileBytes, kt * kPreRows, warp_first_pos, t4, a.scale_log2);
            release();
        }
        for (int kt = n_mine; kt < n_tiles; ++kt) {
            hopper::mbarrier_wait(full + stage, phase);
            release();
        }
        wg_store_rows(st, a, q0 + 64 * consumer + 16 * w + g, hq, t4);
    }
#else
    __trap();  // built without sm_90a: the host never launches this (see prefill_sm90_ready)
#endif
}

// The kernel's arguments, with the grid order the launcher picks (see heads_fast).
PrefillArgs prefill_args(const bf16* q, const bf16* k_cache, const bf16* v_cache, int slot,
                         int start_pos, int T, bf16* out, int n_heads, int n_kv_heads, int head_dim,
                         int max_seq) {
    PrefillArgs a{};
    a.q = q;
    a.k_cache = k_cache;
    a.v_cache = v_cache;
    a.out = out;
    a.slot = slot;
    a.start_pos = start_pos;
    a.T = T;
    a.n_heads = n_heads;
    a.n_kv_heads = n_kv_heads;
    a.group = n_heads / n_kv_heads;
    a.max_seq = max_seq;
    a.scale_log2 = kLog2e / std::sqrt((float)head_dim);
    // Heads fastest puts every head's longest query tiles in the first wave (the short ones fill
    // the tail), unless the K/V the first wave reads, every KV head's whole sequence, would not
    // fit in L2; then one head's tiles run together, sharing their K/V (H100, 1B and 8B heads:
    // heads fastest 1.41x at 2048 tokens, 1.06-1.12x at 8192, 0.98x at 512, but 0.94x at 8B
    // 16384 where the K/V is 64 MB; benchmarks/lab/cuda_attention_prefill_lab.cu, 04 and 07).
    const size_t kv_bytes = (size_t)n_kv_heads * (start_pos + T) * head_dim * 2 * sizeof(uint16_t);
    const int q_tiles = CEIL_DIV(T, kPreRows);
    a.heads_fast = kv_bytes <= (size_t)device_facts().l2_bytes && q_tiles <= 65535;  // grid y limit
    return a;
}

dim3 prefill_grid(const PrefillArgs& a) {
    const int q_tiles = CEIL_DIV(a.T, kPreRows);
    return a.heads_fast ? dim3(a.n_heads, q_tiles) : dim3(q_tiles, a.n_heads);
}

template <int HD, int KV>
void launch_prefill(const PrefillArgs& a, dim3 grid, cudaStream_t stream) {
    auto kernel = attention_prefill_kernel<HD, KV>;
    constexpr size_t smem = prefill_smem_bytes<HD, KV>();
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    kernel<<<grid, kPreThreads, smem, stream>>>(a);
    CUDA_CHECK_LAUNCH("attention_prefill_kernel");
}

// Whether this device runs attention_prefill_sm90_kernel (launch.cuh: Hopper and an sm_90a build).
bool prefill_sm90_ready() { return runs_sm90a(attention_prefill_sm90_kernel<128>); }

// Q as [T, Hq * hd]; this slot's K and V as [filled positions, Hkv * hd]; boxes of 64 x 128.
template <int HD>
void launch_prefill_sm90(const PrefillArgs& a, dim3 grid, cudaStream_t stream) {
    const int kv_row = a.n_kv_heads * HD;
    const size_t slot_offset = (size_t)a.slot * a.max_seq * kv_row;
    const int kv_rows = a.start_pos + a.T;
    const CUtensorMap q_map = hopper::make_tensor_map_sw128(a.q, a.T, a.n_heads * HD, kPreRows, "attention_prefill");
    const CUtensorMap k_map =
        hopper::make_tensor_map_sw128(a.k_cache + slot_offset, kv_rows, kv_row, kPreRows, "attention_prefill");
    const CUtensorMap v_map =
        hopper::make_tensor_map_sw128(a.v_cache + slot_offset, kv_rows, kv_row, kPreRows, "attention_prefill");
    auto kernel = attention_prefill_sm90_kernel<HD>;
    constexpr size_t smem = Sm90Layout<HD>::bytes;
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    kernel<<<grid, kSm90Threads, smem, stream>>>(q_map, k_map, v_map, a);
    CUDA_CHECK_LAUNCH("attention_prefill_sm90_kernel");
}

void check_attention_shapes(const char* op, int n_heads, int n_kv_heads, int head_dim, int max_seq) {
    BRRR_CHECK(head_dim == 64 || head_dim == 128,
               op << ": head_dim must be 64 or 128 on the GPU, got " << head_dim);
    BRRR_CHECK(n_heads >= 1 && n_kv_heads >= 1 && n_heads % n_kv_heads == 0,
               op << ": n_heads (" << n_heads << ") must be a positive multiple of n_kv_heads ("
                  << n_kv_heads << ")");
    BRRR_CHECK(n_heads <= 65535, op << ": n_heads=" << n_heads << " exceeds the grid limit 65535");
    BRRR_CHECK(max_seq >= 1, op << ": max_seq must be >= 1, got " << max_seq);
}

}  // namespace

size_t flash_decode_scratch_floats(int B, int n_heads, int head_dim, int max_splits) {
    BRRR_CHECK(B >= 0 && n_heads >= 0 && head_dim >= 0 && max_splits >= 1,
               "flash_decode_scratch_floats: bad sizes B=" << B << " n_heads=" << n_heads
                                                           << " head_dim=" << head_dim
                                                           << " max_splits=" << max_splits);
    return (size_t)B * decode_seq_floats(n_heads, head_dim, max_splits);
}

void flash_decode(const bf16* q, const bf16* k_cache, const bf16* v_cache, const int* slots,
                  const int* positions, bf16* out, float* scratch, int B, int n_heads,
                  int n_kv_heads, int head_dim, int max_seq, int max_splits, cudaStream_t stream) {
    check_attention_shapes("flash_decode", n_heads, n_kv_heads, head_dim, max_seq);
    BRRR_CHECK(B >= 0 && B <= 65535, "flash_decode: batch B=" << B << " must be in [0, 65535]");
    BRRR_CHECK(max_splits >= 1, "flash_decode: max_splits must be >= 1, got " << max_splits);
    BRRR_CHECK(q && k_cache && v_cache && slots && positions && out,
               "flash_decode: q, k_cache, v_cache, slots, positions and out must be device pointers");
    BRRR_CHECK(util::aligned_to(q, 16) && util::aligned_to(k_cache, 16) && util::aligned_to(v_cache, 16),
               "flash_decode: q, k_cache and v_cache must be 16-byte aligned (rows are read 16 bytes a lane)");
    BRRR_CHECK(util::aligned_to(out, 2) && util::aligned_to(slots, 4) && util::aligned_to(positions, 4),
               "flash_decode: out (bf16) or slots/positions (int32) are misaligned");
    BRRR_CHECK(max_splits == 1 || scratch != nullptr,
               "flash_decode: max_splits=" << max_splits << " needs the scratch of "
                                           << "flash_decode_scratch_floats(); got null");
    if (B == 0) return;

    launch_flash_decode(decode_args(q, k_cache, v_cache, slots, positions, out, scratch, B, n_heads,
                                    n_kv_heads, head_dim, max_seq, max_splits),
                        B, head_dim, stream);
}

namespace {

// The checks both entry points make; false when there is nothing to do (T = 0).
bool check_prefill(const char* op, const bf16* q, const bf16* k_cache, const bf16* v_cache, int slot, int start_pos,
                   int T, bf16* out, int n_heads, int n_kv_heads, int head_dim, int max_seq) {
    check_attention_shapes(op, n_heads, n_kv_heads, head_dim, max_seq);
    BRRR_CHECK(T >= 0 && start_pos >= 0 && (int64_t)start_pos + T <= max_seq,
               op << ": tokens [start_pos, start_pos + T) = [" << start_pos << ", " << (int64_t)start_pos + T
                  << ") must lie in the cache of max_seq=" << max_seq);
    BRRR_CHECK(slot >= 0, op << ": slot must be >= 0, got " << slot);
    BRRR_CHECK(q && k_cache && v_cache && out, op << ": q, k_cache, v_cache and out must be device pointers");
    BRRR_CHECK(util::aligned_to(q, 16) && util::aligned_to(k_cache, 16) && util::aligned_to(v_cache, 16),
               op << ": q, k_cache and v_cache must be 16-byte aligned");
    BRRR_CHECK(util::aligned_to(out, 4), op << ": out must be 4-byte aligned");
    return T > 0;
}

void launch_prefill_mma_sync(const PrefillArgs& a, int head_dim, cudaStream_t stream) {
    const dim3 grid = prefill_grid(a);
    const bool kv64_fits = prefill_smem_bytes<128, 64>() <= (size_t)device_facts().smem_optin;
    if (head_dim == 64) launch_prefill<64, 64>(a, grid, stream);
    else if (kv64_fits) launch_prefill<128, 64>(a, grid, stream);
    else launch_prefill<128, 32>(a, grid, stream);
}

}  // namespace

void attention_prefill(const bf16* q, const bf16* k_cache, const bf16* v_cache, int slot,
                       int start_pos, int T, bf16* out, int n_heads, int n_kv_heads, int head_dim,
                       int max_seq, cudaStream_t stream) {
    if (!check_prefill("attention_prefill", q, k_cache, v_cache, slot, start_pos, T, out, n_heads, n_kv_heads,
                       head_dim, max_seq))
        return;
    const PrefillArgs a = prefill_args(q, k_cache, v_cache, slot, start_pos, T, out, n_heads,
                                       n_kv_heads, head_dim, max_seq);
    if (!prefill_sm90_ready()) {
        launch_prefill_mma_sync(a, head_dim, stream);
    } else if (head_dim == 64) {
        launch_prefill_sm90<64>(a, prefill_grid(a), stream);
    } else {
        launch_prefill_sm90<128>(a, prefill_grid(a), stream);
    }
}

void attention_prefill_mma_sync(const bf16* q, const bf16* k_cache, const bf16* v_cache, int slot,
                                int start_pos, int T, bf16* out, int n_heads, int n_kv_heads, int head_dim,
                                int max_seq, cudaStream_t stream) {
    if (!check_prefill("attention_prefill_mma_sync", q, k_cache, v_cache, slot, start_pos, T, out, n_heads,
                       n_kv_heads, head_dim, max_seq))
        return;
    launch_prefill_mma_sync(prefill_args(q, k_cache, v_cache, slot, start_pos, T, out, n_heads, n_kv_heads,
                                         head_dim, max_seq),
                            head_dim, stream);
}

}  // namespace cuda
}  // namespace brrr
