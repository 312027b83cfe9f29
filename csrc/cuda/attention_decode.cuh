// attention_decode.cuh — flash_decode's kernel and its launch (attention_decode.cu has the design):
// the launch arguments, the scratch layout, the split cut, the merge, and the kernel template
// flash_decode_kernel<HD, GMAX, THREADS>. A header so that the lab (benchmarks/lab/
// cuda_flash_decode_lab.cu) runs the production kernel.
#pragma once

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "cuda/attention_common.cuh"
#include "cuda/check.cuh"
#include "cuda/kernel_util.cuh"
#include "cuda/launch.cuh"
#include "cuda/ops.h"
#include "cuda/ptx.cuh"
#include "cuda/tuning.h"

namespace brrr {
namespace cuda {

// Chunks are whole multiples of this many positions (a CTA's warps cover 64 or more a step).
constexpr int kDecChunkUnit = 64;

struct DecodeArgs {
    const bf16* q;
    KvCache kv;
    const int* slots;
    const int* positions;
    bf16* out;
    float* scratch;  // [B][seq_floats]: the per-sequence layout in attention_decode.cu
    int n_heads, n_kv_heads, group, head_blocks, n_splits, max_splits;
    int min_chunk;   // fewest positions a split takes (tuning::kDecodeMinChunk)
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
// PIECE: the bytes of a lane's 8 elements of a row, 16 (bf16) or 8 (e4m3).
template <int HD, int GMAX, int THREADS, int PIECE = 16>
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
    // The ring kernel's copies (STAGES > 0): per warp, per stage, the K then the V rows of one step,
    // each lane's piece at [kv][r][lane]: [kWarps][STAGES][2][kRows][32] pieces, after the above.
    static constexpr size_t stage_bytes = (size_t)2 * kRows * 32 * PIECE;  // one warp's step
    static constexpr size_t ring_off = (bytes + 15) / 16 * 16;
    static constexpr size_t ring_bytes(int stages) { return (size_t)kWarps * stages * stage_bytes; }
    // Stages that fit `per_warp` bytes of ring, at least 2.
    static constexpr int ring_stages(size_t per_warp) {
        return per_warp / stage_bytes < 2 ? 2 : (int)(per_warp / stage_bytes);
    }
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
// STAGES = 0: each step's rows load straight into registers, one step ahead (small batches, where
// the first rows go out before the PDL wait). STAGES >= 2: the ring kernel (batches, from
// tuning::kDecodeRingMinCtas one-split CTAs on): each lane cp.asyncs its pieces STAGES - 1 steps
// ahead into its warp's ring in shared memory and reads back only what it copied itself, so no
// barrier is needed, and a warp keeps (STAGES - 1) x 2 KB or more in flight instead of one step.
// Piece: a lane's 8 elements of a row, uint4 of bf16 or uint2 of e4m3 (kv.fp8), widened to bf16
// (exactly) as a step reads them, so one body of arithmetic serves both.
template <int HD, int GMAX, int THREADS, int STAGES, typename Piece>
__global__ void __launch_bounds__(THREADS, 512 / THREADS) flash_decode_kernel(DecodeArgs a) {
    static_assert(STAGES == 0 || STAGES >= 2, "the ring needs a stage to fill beside the one read");
    static_assert(sizeof(Piece) == 16 || sizeof(Piece) == 8, "8 elements of bf16 or e4m3");
    constexpr int kElemBytes = sizeof(Piece) / 8;
    using Elem = std::conditional_t<kElemBytes == 1, uint8_t, uint16_t>;
    using L = DecodeLayout<HD, GMAX, THREADS, sizeof(Piece)>;
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

    const int pos = __ldcg(a.positions + b);
    const int len = pos < 0 ? 0 : min(pos + 1, a.kv.max_seq);
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

    const int slot = __ldcg(a.slots + b);
    const int last = len - 1;  // this token's row, written by the kernel just before
    auto step_base = [&](int step) { return c0 + (step * kWarps + warp) * kStepRows; };
    // Rows of a step into registers; rows at or past c1, or without a block (the host checks
    // coverage, so only a broken table), are zeros. which: 0 every row, 1 every row but `last`, 2
    // only `last`.
    auto load_rows = [&](Piece (&dst)[kRows], const void* cache, int base, int which) {
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
            const int p = base + r * kRowsPerLoad + rg;
            if (p >= c1) {
                if (which != 2) dst[r] = Piece{};
                continue;
            }
            if ((which == 1 && p == last) || (which == 2 && p != last)) continue;
            const int64_t row = a.kv.pages.row(slot, p);
            const Elem* row_elems = static_cast<const Elem*>(cache) + (row * a.n_kv_heads + kvh) * HD;
            dst[r] = row < 0 ? Piece{} : __ldcg(reinterpret_cast<const Piece*>(row_elems) + col);
        }
    };

    // The ring: this lane's piece of row r of K (kv 0) or V (kv 1) in stage st of its warp (the
    // register kernel never touches it; one stage keeps its indexing well-formed).
    constexpr int kRingStages = STAGES > 0 ? STAGES : 1;
    Piece* ring = reinterpret_cast<Piece*>(smem + L::ring_off) + (size_t)warp * kRingStages * 2 * kRows * 32;
    auto ring_piece = [&](int st, int kv, int r) { return ring + ((st * 2 + kv) * kRows + r) * 32 + lane; };
    // Copies a step's K and V rows into its stage (rows past c1 or without a block: zeros).
    auto copy_step = [&](int step) {
        const int base = step_base(step), st = step % kRingStages;
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
            const int p = base + r * kRowsPerLoad + rg;
            const int64_t row = p < c1 ? a.kv.pages.row(slot, p) : -1;
            const size_t at = row < 0 ? 0 : ((size_t)(row * a.n_kv_heads + kvh) * HD + col * 8) * kElemBytes;
            const unsigned char* k = static_cast<const unsigned char*>(a.kv.k) + at;
            const unsigned char* v = static_cast<const unsigned char*>(a.kv.v) + at;
            if constexpr (sizeof(Piece) == 16) {
                ptx::cp_async_16(ring_piece(st, 0, r), k, row >= 0);
                ptx::cp_async_16(ring_piece(st, 1, r), v, row >= 0);
            } else {
                ptx::cp_async_8(ring_piece(st, 0, r), k, row >= 0);
                ptx::cp_async_8(ring_piece(st, 1, r), v, row >= 0);
            }
        }
    };

    Piece kr[kRows], vrow[kRows];
    if constexpr (STAGES == 0) {
        const bool any = step_base(0) < c1;
        // Every row but this token's is older than the kernel just before: load them before the wait.
        if (any) {
            load_rows(kr, a.kv.k, step_base(0), 1);
            load_rows(vrow, a.kv.v, step_base(0), 1);
        }
        pdl_wait();
        if (any) {
            load_rows(kr, a.kv.k, step_base(0), 2);
            load_rows(vrow, a.kv.v, step_base(0), 2);
        }
    } else {
        // The copies start after the wait: at batches the attention is long beside the kernel before.
        pdl_wait();
#pragma unroll
        for (int step = 0; step < STAGES - 1; ++step) {
            if (step_base(step) < c1) copy_step(step);
            ptx::cp_async_commit();  // empty groups too: one group per step keeps the count exact
        }
    }
    // From tuning::kDecodeLateTriggerHeadDim on, the next kernel launches only as the CTAs exit.
    if constexpr (HD < tuning::kDecodeLateTriggerHeadDim) pdl_launch_dependents();

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
        if constexpr (STAGES > 0) {
            // The stage refilled here was read into registers at the top of the previous step.
            if (step_base(step + STAGES - 1) < c1) copy_step(step + STAGES - 1);
            ptx::cp_async_commit();
            ptx::cp_async_wait<STAGES - 1>();  // this step's group has landed
            const int st = step % STAGES;
#pragma unroll
            for (int r = 0; r < kRows; ++r) {
                kr[r] = *ring_piece(st, 0, r);
                vrow[r] = *ring_piece(st, 1, r);
            }
        }
        // Scores: this lane's 8 dims of each (head, row), then summed over the row's lanes.
        float vals[kValues];
#pragma unroll
        for (int g = 0; g < GMAX; ++g) {
            const uint4 q = q8[g];
#pragma unroll
            for (int r = 0; r < kRows; ++r) {
                const uint4 k = util::kv8_to_bf16x8(kr[r]);  // unrolled: widened once per row
                vals[g * kRows + r] = util::bf16_lo(k.x) * util::bf16_lo(q.x) + util::bf16_hi(k.x) * util::bf16_hi(q.x) +
                                      util::bf16_lo(k.y) * util::bf16_lo(q.y) + util::bf16_hi(k.y) * util::bf16_hi(q.y) +
                                      util::bf16_lo(k.z) * util::bf16_lo(q.z) + util::bf16_hi(k.z) * util::bf16_hi(q.z) +
                                      util::bf16_lo(k.w) * util::bf16_lo(q.w) + util::bf16_hi(k.w) * util::bf16_hi(q.w);
            }
        }
        if (STAGES == 0 && next < c1) load_rows(kr, a.kv.k, next, 0);  // K of this step is consumed
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
            const uint4 v = util::kv8_to_bf16x8(vrow[r]);
            const float v8[8] = {util::bf16_lo(v.x), util::bf16_hi(v.x), util::bf16_lo(v.y), util::bf16_hi(v.y),
                                 util::bf16_lo(v.z), util::bf16_hi(v.z), util::bf16_lo(v.w), util::bf16_hi(v.w)};
#pragma unroll
            for (int g = 0; g < GMAX; ++g) {
                const float pg = __shfl_sync(kAll, p, score_lane(g, r));
#pragma unroll
                for (int j = 0; j < 8; ++j) acc[g][j] = fmaf(pg, v8[j], acc[g][j]);
            }
        }
        if (STAGES == 0 && next < c1) load_rows(vrow, a.kv.v, next, 0);
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
    if (!util::arrived_last(sc.counter(blockIdx.y), cut.n, tid == 0, /*release=*/true, cta_barrier)) return;
    merge_splits<HD, GMAX, THREADS>(sc, head0, n_g, cut.n, weight, out);
}

// RING_BYTES: 0 for the register kernel, else the ring kernel with that much ring a warp.
// Piece: uint4 for a bf16 cache, uint2 for e4m3.
template <int HD, int GMAX, int THREADS, int RING_BYTES, typename Piece>
inline void launch_decode(const DecodeArgs& a, int B, cudaStream_t stream) {
    using L = DecodeLayout<HD, GMAX, THREADS, sizeof(Piece)>;
    constexpr int kStages = RING_BYTES ? L::ring_stages(RING_BYTES) : 0;
    constexpr size_t kBytes = RING_BYTES ? L::ring_off + L::ring_bytes(kStages) : L::bytes;
    auto kernel = flash_decode_kernel<HD, GMAX, THREADS, kStages, Piece>;
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)kBytes));
    const dim3 grid(a.n_splits, a.n_kv_heads * a.head_blocks, B);
    launch_pdl(kernel, grid, dim3(THREADS), kBytes, stream, a);
    CUDA_CHECK_LAUNCH("flash_decode_kernel");
}

// Query heads per decode CTA: the GQA group rounded up to a kernel instance, at most 4 (a larger
// group takes several head blocks, which read the same K/V rows, the later ones mostly from L2):
// at 8 a lane's accumulators and q alone would take 96 of the 128 registers it may have.
inline int decode_gmax(int group) { return group <= 1 ? 1 : group <= 2 ? 2 : 4; }

// The instance decode_args() sized head_blocks for: both read decode_gmax.
template <int HD, int THREADS, int RING_BYTES, typename Piece = uint4>
inline void launch_decode_group(const DecodeArgs& a, int B, cudaStream_t stream) {
    switch (decode_gmax(a.group)) {
        case 1: launch_decode<HD, 1, THREADS, RING_BYTES, Piece>(a, B, stream); break;
        case 2: launch_decode<HD, 2, THREADS, RING_BYTES, Piece>(a, B, stream); break;
        default: launch_decode<HD, 4, THREADS, RING_BYTES, Piece>(a, B, stream); break;
    }
}

// The instance for the cache's element: uint4 pieces of bf16, or uint2 of e4m3.
template <int HD, int THREADS, int RING_BYTES>
inline void launch_decode_cache(const DecodeArgs& a, int B, cudaStream_t stream) {
    if (a.kv.fp8) launch_decode_group<HD, THREADS, RING_BYTES, uint2>(a, B, stream);
    else launch_decode_group<HD, THREADS, RING_BYTES, uint4>(a, B, stream);
}

// Splits from shapes only (positions are on the device): tuning::kDecodeCtasPerSm CTAs per SM at
// this batch (at least one split), never more than max_splits, kDecMaxSplits or 64-position
// chunks of max_seq.
inline DecodeArgs decode_args(const bf16* q, const KvCache& kv, const int* slots, const int* positions, bf16* out,
                              float* scratch, int B, int n_heads, int n_kv_heads, int head_dim, int max_splits) {
    const int max_seq = kv.max_seq;
    DecodeArgs a;
    a.q = q;
    a.kv = kv;
    a.slots = slots;
    a.positions = positions;
    a.out = out;
    a.scratch = scratch;
    a.n_heads = n_heads;
    a.n_kv_heads = n_kv_heads;
    a.group = n_heads / n_kv_heads;
    a.head_blocks = CEIL_DIV(a.group, decode_gmax(a.group));
    a.max_splits = max_splits;
    const int ctas_per_split = B * n_kv_heads * a.head_blocks;
    // Rounded down: the grid never spills past the CTAs the GPU holds at once.
    const int resident = tuning::kDecodeCtasPerSm * device_facts().sm_count;
    const int want = resident / ctas_per_split;
    a.n_splits = std::max(1, std::min({want, max_splits, kDecMaxSplits, CEIL_DIV(max_seq, kDecChunkUnit)}));
    a.min_chunk = tuning::kDecodeMinChunk;
    a.scale_log2 = kLog2e / std::sqrt((float)head_dim);
    return a;
}

inline void launch_flash_decode(const DecodeArgs& a, int B, int head_dim, cudaStream_t stream) {
    static_assert(tuning::kDecodeThreads == 128 || tuning::kDecodeThreads == 256,
                  "flash_decode_kernel's register cap and merge assume 128 or 256 threads");
    // The ring kernel at batches (it wins from 8 sequences of 8 KV heads on), registers below.
    const bool ring = (int64_t)B * a.n_kv_heads * a.head_blocks >= tuning::kDecodeRingMinCtas;
    constexpr int kRing = tuning::kDecodeRingBytesPerWarp;
    if (head_dim == 64) {
        if (ring) launch_decode_cache<64, tuning::kDecodeThreads, kRing>(a, B, stream);
        else launch_decode_cache<64, tuning::kDecodeThreads, 0>(a, B, stream);
    } else {
        if (ring) launch_decode_cache<128, tuning::kDecodeThreads, kRing>(a, B, stream);
        else launch_decode_cache<128, tuning::kDecodeThreads, 0>(a, B, stream);
    }
}

}  // namespace cuda
}  // namespace brrr
