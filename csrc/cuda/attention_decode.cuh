// attention_decode.cuh — flash_decode's kernels and their launch (attention_decode.cu has the
// design): the launch arguments, the scratch layout, the split cut, the merge, the CTA's end
// (finish_cta), and the kernel templates flash_decode_kernel (CUDA cores, small batches) and
// flash_decode_mma_kernel (tensor cores, serving batches). A header so that the lab
// (benchmarks/lab/cuda_flash_decode_lab.cu) runs the production kernels.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
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
    bool early_trigger;  // the next kernel launches once the first rows are asked for, at every head dim
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
    DecodeCut() = default;
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
    // The tensor-core kernel's per-warp tiles (DecodeMmaLayout) start here.
    static constexpr size_t tiles_off = (bytes + 15) / 16 * 16;
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

// What a CTA of either kernel owns (the grid: split, KV head x head block, sequence): positions
// [c0, c1) of sequence b (len positions) for the n_g query heads from head0, and where their
// output goes.
struct DecodeCta {
    int split, b, kvh, n_g, head0, len, c0, c1;
    DecodeCut cut;
    bf16* out;  // head0's [HD] row of sequence b, then the others of the block
};

// Whether the next kernel may launch once a CTA is past its wait and has asked for its first rows,
// or only as the CTAs exit: from tuning::kDecodeLateTriggerHeadDim on the latter, unless the caller
// asked for early_trigger (before a quantized wo). Both kernels call it at that point.
template <int HD>
__device__ __forceinline__ bool launch_next_early(const DecodeArgs& a) {
    return HD < tuning::kDecodeLateTriggerHeadDim || a.early_trigger;
}

// Fills c; false when the CTA has no positions (a split past its sequence's cut, or an empty
// sequence, whose output it has zeroed), having done its part of the PDL chain.
template <int HD, int GMAX, int THREADS>
__device__ bool start_cta(const DecodeArgs& a, DecodeCta& c) {
    c.split = blockIdx.x, c.b = blockIdx.z;
    c.kvh = blockIdx.y / a.head_blocks;
    const int hb = blockIdx.y % a.head_blocks;
    c.n_g = min(GMAX, a.group - hb * GMAX);
    c.head0 = c.kvh * a.group + hb * GMAX;
    const int pos = __ldcg(a.positions + c.b);
    const int len = c.len = pos < 0 ? 0 : min(pos + 1, a.kv.max_seq);
    c.cut = DecodeCut(len, a.min_chunk, a.n_splits);
    if (c.split >= c.cut.n) {
        pdl_wait();
        return false;
    }
    c.c0 = c.split * c.cut.per, c.c1 = min(len, c.c0 + c.cut.per);
    c.out = a.out + ((size_t)c.b * a.n_heads + c.head0) * HD;
    if (c.c0 >= c.c1) {  // an empty sequence (position < 0): one split, zeros out
        pdl_wait();
        pdl_launch_dependents();
        for (int i = threadIdx.x; i < c.n_g * HD; i += THREADS) c.out[i] = __float2bfloat16_rn(0.f);
        return false;
    }
    return true;
}

// A CTA's end, once each warp has left its (max, sum, acc) of every head in shared memory
// (DecodeLayout's m, l and acc; a warp without rows leaves m = -inf): the warps' partials are
// combined; one split writes its output, several write their partials to scratch and the last to
// arrive merges them.
template <int HD, int GMAX, int THREADS>
__device__ void finish_cta(const DecodeArgs& a, const DecodeCta& c, unsigned char* smem) {
    using L = DecodeLayout<HD, GMAX, THREADS>;
    constexpr int kWarps = L::kWarps;
    const float* warp_m = reinterpret_cast<const float*>(smem + L::m_off);
    const float* warp_l = reinterpret_cast<const float*>(smem + L::l_off);
    const float* warp_acc = reinterpret_cast<const float*>(smem + L::acc_off);
    float* weight = reinterpret_cast<float*>(smem + L::w_off);
    const int tid = threadIdx.x, n_g = c.n_g, head0 = c.head0, split = c.split;
    const DecodeCut& cut = c.cut;
    const DecodeScratch sc(a, c.b, HD);
    bf16* out = c.out;
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

// GMAX = query heads per CTA (the group, or a block of it when the group is larger). Registers
// are capped so that two 256-thread CTAs fit an SM, as the grid assumes.
// Each step's rows load straight into registers, one step ahead; the first rows go out before the
// PDL wait, so a short context's loads overlap the kernel before (small batches; serving batches
// take flash_decode_mma_kernel).
// Piece: a lane's 8 elements of a row, uint4 of bf16 or uint2 of e4m3 (kv.fp8), widened to bf16
// (exactly) as a step reads them, so one body of arithmetic serves both.
template <int HD, int GMAX, int THREADS, typename Piece>
__global__ void __launch_bounds__(THREADS, 512 / THREADS) flash_decode_kernel(DecodeArgs a) {
    static_assert(sizeof(Piece) == 16 || sizeof(Piece) == 8, "8 elements of bf16 or e4m3");
    using Elem = std::conditional_t<sizeof(Piece) == 8, uint8_t, uint16_t>;
    using L = DecodeLayout<HD, GMAX, THREADS>;
    constexpr int kLanesPerRow = L::kLanesPerRow, kRowsPerLoad = L::kRowsPerLoad, kRows = L::kRows;
    constexpr int kValues = L::kValues, kReplicas = L::kReplicas, kStepRows = L::kStepRows, kWarps = L::kWarps;
    constexpr unsigned kAll = 0xffffffffu;

    unsigned char* smem = ptx::dynamic_smem<unsigned char>();
    float* warp_m = reinterpret_cast<float*>(smem + L::m_off);
    float* warp_l = reinterpret_cast<float*>(smem + L::l_off);
    float* warp_acc = reinterpret_cast<float*>(smem + L::acc_off);

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    DecodeCta cta;
    if (!start_cta<HD, GMAX, THREADS>(a, cta)) return;
    const int b = cta.b, kvh = cta.kvh, n_g = cta.n_g, head0 = cta.head0, len = cta.len, c0 = cta.c0, c1 = cta.c1;

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

    Piece kr[kRows], vrow[kRows];
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
    if (launch_next_early<HD>(a)) pdl_launch_dependents();

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
                const uint4 k = util::kv8_to_bf16x8(kr[r]);  // unrolled: widened once per row
                vals[g * kRows + r] = util::bf16_lo(k.x) * util::bf16_lo(q.x) + util::bf16_hi(k.x) * util::bf16_hi(q.x) +
                                      util::bf16_lo(k.y) * util::bf16_lo(q.y) + util::bf16_hi(k.y) * util::bf16_hi(q.y) +
                                      util::bf16_lo(k.z) * util::bf16_lo(q.z) + util::bf16_hi(k.z) * util::bf16_hi(q.z) +
                                      util::bf16_lo(k.w) * util::bf16_lo(q.w) + util::bf16_hi(k.w) * util::bf16_hi(q.w);
            }
        }
        if (next < c1) load_rows(kr, a.kv.k, next, 0);  // K of this step is consumed
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
        if (next < c1) load_rows(vrow, a.kv.v, next, 0);
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
    finish_cta<HD, GMAX, THREADS>(a, cta, smem);
}

// Query heads per decode CTA: the GQA group rounded up to a kernel instance, at most 4 (a larger
// group takes several head blocks, which read the same K/V rows, the later ones mostly from L2):
// at 8 a lane's accumulators and q alone would take 96 of the 128 registers it may have.
inline int decode_gmax(int group) { return group <= 1 ? 1 : group <= 2 ? 2 : 4; }

// The tensor-core kernel (serving batches): a warp takes 16 positions a step and computes
// S = Q K^T and O += P V with mma.sync m16n8k16, the group's query heads as the A rows (GMAX of
// the 16 used; Q's other rows are zeros and their results are dropped). K and V tiles come
// through a per-warp cp.async ring of STAGES steps, [K|V][16][pitch] a stage. The online softmax
// is the prefill kernel's (a row lives in a quad of lanes); the end is finish_cta's.
// An e4m3 cache stays bytes in shared memory: ldmatrix reads them as if they were 16-bit pairs
// and each lane widens its word to fp16 in registers (one conversion instruction a pair, exact),
// so the MMAs run on fp16 (q widened from bf16: exact below fp16's 65504, inf past it; P in fp16
// has more bits than in bf16). The fragments that come out are permutations of the bf16 ones:
//   K (ldmatrix): lane (g, t4) holds dims 4 t4 .. 4 t4 + 3 of position g of a 16-dim block, taken
//     as k = 2 t4, 2 t4 + 1 (b0) and 2 t4 + 8, 2 t4 + 9 (b1); Q's A fragment is loaded in the same
//     order, and a dot product does not depend on the order of its dims;
//   V (ldmatrix.trans): lane (g, t4) holds dims 2 g, 2 g + 1 of positions 2 t4, 2 t4 + 1; one byte
//     permute makes the even dim's pair the B fragment of one n8 tile and the odd dim's of
//     another, so output column n of a block's tile (even, odd) is dim 2 n (+ 1), undone where
//     the warp stores its acc.
// Shared-memory rows are padded by 8 elements (bf16) or 16 bytes (e4m3), so the 8 rows of each
// ldmatrix fall in distinct bank groups.
template <int HD, bool FP8>
struct DecodeMmaLayout {
    static constexpr int kPitchBytes = FP8 ? HD + 16 : (HD + 8) * 2;
    static constexpr size_t copy_bytes = (size_t)2 * 16 * kPitchBytes;  // one stage: K then V
    static constexpr size_t warp_bytes(int stages) { return stages * copy_bytes; }
};

// One warp-step of the tensor-core kernel's online softmax (the prefill kernel's; a head row lives
// in a quad of lanes): the step's scores s (S fragments, positions base + 8 j + 2 t4 + e of head
// row g; those from c1 on masked) update row_max and this lane's share of row_sum (log2 units),
// rescale the acc tiles o, and come out as P's A fragment pa (the S layout is the A layout), fp16
// (F16) or bf16.
template <int HD, bool F16>
__device__ __forceinline__ void decode_softmax_step(float (&s)[2][4], int base, int c1, int t4, float scale_log2,
                                                    float& row_max, float& row_sum, float (&o)[HD / 8][4],
                                                    uint32_t (&pa)[4]) {
    float mx = -INFINITY;
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            if (base + j * 8 + 2 * t4 + e >= c1) s[j][e] = -INFINITY;
            mx = fmaxf(mx, s[j][e]);
        }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float new_max = fmaxf(row_max, mx * scale_log2);  // finite: position `base` is < c1
    const float alpha = exp2f(row_max - new_max);
    row_max = new_max;
    float p[2][2];
    float step_sum = 0.f;
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) step_sum += p[j][e] = exp2f(fmaf(s[j][e], scale_log2, -new_max));
    row_sum = row_sum * alpha + step_sum;
#pragma unroll
    for (int f = 0; f < HD / 8; ++f) o[f][0] *= alpha, o[f][1] *= alpha;
    auto pack = [](float lo, float hi) { return F16 ? util::pack_f16x2(lo, hi) : util::pack_bf16x2(lo, hi); };
    pa[0] = pack(p[0][0], p[0][1]);
    pa[2] = pack(p[1][0], p[1][1]);
    pa[1] = pa[3] = 0u;
}

template <int HD, int GMAX, int THREADS, int STAGES, bool FP8>
__global__ void __launch_bounds__(THREADS) flash_decode_mma_kernel(DecodeArgs a) {
    static_assert(STAGES >= 2 && GMAX <= 8, "a stage to fill beside the one read; head rows g < 8 of the A tile");
    using L = DecodeLayout<HD, GMAX, THREADS>;
    using M = DecodeMmaLayout<HD, FP8>;
    constexpr int kWarps = L::kWarps, PB = M::kPitchBytes;
    constexpr int kPiece = FP8 ? 16 : 8;              // elements a 16-byte copy brings
    constexpr int kPieces = 16 * HD / kPiece / 32;    // per lane, per tile (K or V)
    constexpr size_t kElem = FP8 ? 1 : 2;

    unsigned char* smem = ptx::dynamic_smem<unsigned char>();
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t4 = lane & 3;
    DecodeCta cta;
    if (!start_cta<HD, GMAX, THREADS>(a, cta)) return;
    const int b = cta.b, kvh = cta.kvh, n_g = cta.n_g, head0 = cta.head0, c0 = cta.c0, c1 = cta.c1;

    const int slot = __ldcg(a.slots + b);
    auto step_base = [&](int step) { return c0 + (step * kWarps + warp) * 16; };
    unsigned char* ring = smem + L::tiles_off + (size_t)warp * M::warp_bytes(STAGES);
    // Copies the K and V rows of a step into stage st: lane-strided 16-byte pieces; rows past c1
    // or without a block are zeros (their scores are masked).
    auto copy_step = [&](int step) {
        const int base = step_base(step);
        unsigned char* dst = ring + (step % STAGES) * M::copy_bytes;
#pragma unroll
        for (int i = 0; i < kPieces; ++i) {
            const int c = lane + 32 * i, r = c / (HD / kPiece), col = (c % (HD / kPiece)) * kPiece;
            const int p = base + r;
            const int64_t row = p < c1 ? a.kv.pages.row(slot, p) : -1;
            const size_t at = row < 0 ? 0 : ((size_t)(row * a.n_kv_heads + kvh) * HD + col) * kElem;
            const size_t off = (size_t)r * PB + col * kElem;
            ptx::cp_async_16(dst + off, static_cast<const unsigned char*>(a.kv.k) + at, row >= 0);
            ptx::cp_async_16(dst + 16 * PB + off, static_cast<const unsigned char*>(a.kv.v) + at, row >= 0);
        }
    };

    // The copies start after the wait: at batches the attention is long beside the kernel before.
    pdl_wait();
#pragma unroll
    for (int step = 0; step < STAGES - 1; ++step) {
        if (step_base(step) < c1) copy_step(step);
        ptx::cp_async_commit();
    }
    if (launch_next_early<HD>(a)) pdl_launch_dependents();

    // The MMA's operand type: bf16, or fp16 for an e4m3 cache.
    auto mma = [](float d[4], const uint32_t a4[4], const uint32_t b2[2]) {
        if constexpr (FP8) ptx::mma_f16_16816(d, a4, b2);
        else ptx::mma_bf16_16816(d, a4, b2);
    };
    // Q as the A operand of each 16-dim k-step: row g is head g (zeros past n_g), rows g + 8 zeros.
    // a0 holds k = 2 t4, 2 t4 + 1 and a2 k = 2 t4 + 8, + 9: dims in that order for a bf16 cache,
    // dims 4 t4, 4 t4 + 1 and 4 t4 + 2, + 3 for e4m3 (the K fragment's order, above).
    uint32_t qa[HD / 16][4];
    const uint32_t* qrow = reinterpret_cast<const uint32_t*>(a.q + ((size_t)b * a.n_heads + head0 + g) * HD);
    auto q_pair = [&](int d) {
        const uint32_t w = qrow[d / 2];
        return FP8 ? util::pack_f16x2(util::bf16_lo(w), util::bf16_hi(w)) : w;
    };
#pragma unroll
    for (int ks = 0; ks < HD / 16; ++ks) {
        const int d0 = ks * 16 + (FP8 ? 4 * t4 : 2 * t4), d2 = d0 + (FP8 ? 2 : 8);
        qa[ks][0] = g < n_g ? q_pair(d0) : 0u;
        qa[ks][2] = g < n_g ? q_pair(d2) : 0u;
        qa[ks][1] = qa[ks][3] = 0u;
    }

    float row_max = -INFINITY, row_sum = 0.f;  // head g's, in log2 units; the sum is this lane's share
    // O's n8 tiles: bf16, tile f is dims 8 f .. 8 f + 7; e4m3, tiles 2 j and 2 j + 1 are the even
    // and odd dims of 16-dim block j
    float o[HD / 8][4];
#pragma unroll
    for (int f = 0; f < HD / 8; ++f) o[f][0] = o[f][1] = o[f][2] = o[f][3] = 0.f;
    // This lane's ldmatrix row: matrices 0-3 are (positions 0-7, block 0), (8-15, 0), (0-7, 1),
    // (8-15, 1) of a pair of 16-dim blocks (bf16: of a 16-dim k-step's two 8-dim halves).
    const int lm_row = (lane >> 3 & 1) * 8 + (lane & 7), lm_col = (lane >> 4) * 16;

    for (int step = 0; step_base(step) < c1; ++step) {
        const int base = step_base(step);
        __syncwarp();  // every lane is done with the stage refilled below
        if (step_base(step + STAGES - 1) < c1) copy_step(step + STAGES - 1);
        ptx::cp_async_commit();
        ptx::cp_async_wait<STAGES - 1>();  // this lane's pieces of this step have landed
        __syncwarp();                      // and every other lane's
        const unsigned char* Kt = ring + (step % STAGES) * M::copy_bytes;
        const unsigned char* Vt = Kt + 16 * PB;

        // S = Q K^T: positions 0-7 (n-tile 0) and 8-15 (n-tile 1) of the step.
        float s[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
        if constexpr (FP8) {
#pragma unroll
            for (int j = 0; j < HD / 32; ++j) {
                uint32_t r[4];
                ptx::ldmatrix_x4(r, Kt + lm_row * PB + j * 32 + lm_col);
#pragma unroll
                for (int m = 0; m < 4; ++m) {
                    const uint2 w = util::widen_e4m3x4<true>(r[m]);
                    const uint32_t b2[2] = {w.x, w.y};
                    mma(s[m & 1], qa[2 * j + (m >> 1)], b2);
                }
            }
        } else {
            const uint16_t* K16 = reinterpret_cast<const uint16_t*>(Kt);
            constexpr int P = PB / 2;
#pragma unroll
            for (int ks = 0; ks < HD / 16; ++ks) {
                uint32_t r[4];
                ptx::ldmatrix_x4(r, K16 + ((lane >> 4) * 8 + (lane & 7)) * P + ks * 16 + ((lane >> 3) & 1) * 8);
                const uint32_t b0[2] = {r[0], r[1]}, b1[2] = {r[2], r[3]};
                mma(s[0], qa[ks], b0);
                mma(s[1], qa[ks], b1);
            }
        }
        uint32_t pa[4];
        decode_softmax_step<HD, FP8>(s, base, c1, t4, a.scale_log2, row_max, row_sum, o, pa);

        // O += P V: P's row g as the A operand, V through ldmatrix.trans.
        if constexpr (FP8) {
#pragma unroll
            for (int j = 0; j < HD / 32; ++j) {
                uint32_t r[4];
                ptx::ldmatrix_x4_trans(r, Vt + lm_row * PB + j * 32 + lm_col);
#pragma unroll
                for (int blk = 0; blk < 2; ++blk) {
                    // bytes (even dim, odd dim) of positions 2 t4 and 2 t4 + 1, as (even, even, odd, odd)
                    const uint2 lo = util::widen_e4m3x4<true>(__byte_perm(r[2 * blk], 0, 0x3120));
                    const uint2 hi = util::widen_e4m3x4<true>(__byte_perm(r[2 * blk + 1], 0, 0x3120));
                    const uint32_t even[2] = {lo.x, hi.x}, odd[2] = {lo.y, hi.y};
                    mma(o[4 * j + 2 * blk], pa, even);
                    mma(o[4 * j + 2 * blk + 1], pa, odd);
                }
            }
        } else {
            const uint16_t* V16 = reinterpret_cast<const uint16_t*>(Vt);
            constexpr int P = PB / 2;
#pragma unroll
            for (int i = 0; i < HD / 16; ++i) {
                uint32_t r[4];
                ptx::ldmatrix_x4_trans(r, V16 + ((lane & 7) + ((lane >> 3) & 1) * 8) * P + i * 16 + (lane >> 4) * 8);
                const uint32_t b0[2] = {r[0], r[1]}, b1[2] = {r[2], r[3]};
                mma(o[2 * i], pa, b0);
                mma(o[2 * i + 1], pa, b1);
            }
        }
    }

    // The warp's state into DecodeLayout's slots: row g's sum over its quad, its acc columns.
    row_sum += __shfl_xor_sync(0xffffffffu, row_sum, 1);
    row_sum += __shfl_xor_sync(0xffffffffu, row_sum, 2);
    float* warp_m = reinterpret_cast<float*>(smem + L::m_off);
    float* warp_l = reinterpret_cast<float*>(smem + L::l_off);
    float* warp_acc = reinterpret_cast<float*>(smem + L::acc_off);
    if (g < GMAX) {
        float* acc = warp_acc + (warp * GMAX + g) * HD;
        if constexpr (FP8) {
            // tiles 2 j (even dims) and 2 j + 1 (odd): columns 2 t4, 2 t4 + 1 are dims 4 t4 (+ 1), 4 t4 + 2 (+ 1)
#pragma unroll
            for (int j = 0; j < HD / 16; ++j)
                *reinterpret_cast<float4*>(acc + j * 16 + 4 * t4) =
                    make_float4(o[2 * j][0], o[2 * j + 1][0], o[2 * j][1], o[2 * j + 1][1]);
        } else {
#pragma unroll
            for (int f = 0; f < HD / 8; ++f)
                *reinterpret_cast<float2*>(acc + f * 8 + 2 * t4) = make_float2(o[f][0], o[f][1]);
        }
        if (t4 == 0) warp_m[warp * GMAX + g] = row_max, warp_l[warp * GMAX + g] = row_sum;
    }
    finish_cta<HD, GMAX, THREADS>(a, cta, smem);
}

template <int HD, int GMAX, int THREADS, int STAGES, bool FP8>
constexpr size_t decode_mma_bytes() {
    return DecodeLayout<HD, GMAX, THREADS>::tiles_off +
           (size_t)DecodeLayout<HD, GMAX, THREADS>::kWarps * DecodeMmaLayout<HD, FP8>::warp_bytes(STAGES);
}

template <int HD, int GMAX, int THREADS, int STAGES, bool FP8>
inline void launch_decode_mma(const DecodeArgs& a, int B, cudaStream_t stream) {
    constexpr size_t kBytes = decode_mma_bytes<HD, GMAX, THREADS, STAGES, FP8>();
    auto kernel = flash_decode_mma_kernel<HD, GMAX, THREADS, STAGES, FP8>;
    allow_dynamic_smem(kernel, kBytes);
    const dim3 grid(a.n_splits, a.n_kv_heads * a.head_blocks, B);
    launch_pdl(kernel, grid, dim3(THREADS), kBytes, stream, a);
    CUDA_CHECK_LAUNCH("flash_decode_mma_kernel");
}

// Waves of `ctas` CTAs the tensor-core kernel with a ring of STAGES tiles takes on this GPU.
template <int HD, int GMAX, int THREADS, int STAGES, bool FP8>
inline int64_t decode_mma_waves(int64_t ctas) {
    constexpr size_t kBytes = decode_mma_bytes<HD, GMAX, THREADS, STAGES, FP8>();
    auto kernel = flash_decode_mma_kernel<HD, GMAX, THREADS, STAGES, FP8>;
    allow_dynamic_smem(kernel, kBytes);  // the occupancy of more than 48 KB needs the opt-in first
    const int resident = resident_ctas(kernel, THREADS, kBytes);
    return resident > 0 ? CEIL_DIV(ctas, (int64_t)resident) : INT64_MAX;
}

// The tensor-core kernel with a ring of 4 tiles a warp where its grid takes no more waves than
// with 2, else 2. In a graphed chain the 4-tile ring took 15-32% off a call at head dim 64 and
// 8-32 sequences of 136-384 positions, level at long contexts; a grid it pushes into another wave
// pays for that wave (docs/kernels/attention.md).
template <int HD, int GMAX, int THREADS, bool FP8>
inline void launch_decode_mma_ring(const DecodeArgs& a, int B, cudaStream_t stream) {
    const int64_t ctas = (int64_t)a.n_splits * a.n_kv_heads * a.head_blocks * B;
    if (decode_mma_waves<HD, GMAX, THREADS, 4, FP8>(ctas) <= decode_mma_waves<HD, GMAX, THREADS, 2, FP8>(ctas))
        launch_decode_mma<HD, GMAX, THREADS, 4, FP8>(a, B, stream);
    else
        launch_decode_mma<HD, GMAX, THREADS, 2, FP8>(a, B, stream);
}

// The register kernel. Piece: uint4 for a bf16 cache, uint2 for e4m3.
template <int HD, int GMAX, int THREADS, typename Piece>
inline void launch_decode(const DecodeArgs& a, int B, cudaStream_t stream) {
    using L = DecodeLayout<HD, GMAX, THREADS>;
    auto kernel = flash_decode_kernel<HD, GMAX, THREADS, Piece>;
    allow_dynamic_smem(kernel, L::bytes);
    const dim3 grid(a.n_splits, a.n_kv_heads * a.head_blocks, B);
    launch_pdl(kernel, grid, dim3(THREADS), L::bytes, stream, a);
    CUDA_CHECK_LAUNCH("flash_decode_kernel");
}

// Calls launch(gmax, fp8), both std::integral_constant: the instance for the GQA group
// (decode_gmax heads a CTA, as decode_args() sized head_blocks) and the cache's element.
template <typename Launch>
inline void with_group_and_element(const DecodeArgs& a, Launch&& launch) {
    const int gmax = decode_gmax(a.group);
    const auto by_group = [&](auto fp8) {
        if (gmax == 1) launch(std::integral_constant<int, 1>{}, fp8);
        else if (gmax == 2) launch(std::integral_constant<int, 2>{}, fp8);
        else launch(std::integral_constant<int, 4>{}, fp8);
    };
    if (a.kv.fp8) by_group(std::true_type{});
    else by_group(std::false_type{});
}

// Splits from shapes only (positions are on the device): tuning::kDecodeCtasPerSm CTAs per SM at
// this batch (at least one split), never more than max_splits, kDecMaxSplits or 64-position
// chunks of max_seq.
inline DecodeArgs decode_args(const bf16* q, const KvCache& kv, const int* slots, const int* positions, bf16* out,
                              float* scratch, int B, int n_heads, int n_kv_heads, int head_dim, int max_splits,
                              bool early_trigger) {
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
    a.early_trigger = early_trigger;
    return a;
}

// Tensor cores at serving batches (from 8 sequences of 8 KV heads on, 4 with an e4m3 cache) and at
// every batch for a bf16 cache of head dim 64; registers below. A rule of one CTA is always met,
// so that case compiles no register kernel.
template <int HD>
inline void launch_flash_decode_hd(const DecodeArgs& a, int B, cudaStream_t stream) {
    constexpr int kT = tuning::kDecodeThreads, kMmaT = tuning::kDecodeMmaThreads;
    with_group_and_element(a, [&](auto gmax, auto fp8) {
        constexpr int G = decltype(gmax)::value;
        constexpr bool FP8 = decltype(fp8)::value;
        constexpr int mma_min_ctas = FP8 ? tuning::kDecodeMmaMinCtasFp8
                                     : HD == 64 ? tuning::kDecodeMmaMinCtasHd64
                                                : tuning::kDecodeMmaMinCtas;
        if constexpr (mma_min_ctas > 1) {
            if ((int64_t)B * a.n_kv_heads * a.head_blocks < mma_min_ctas) {
                using Piece = std::conditional_t<FP8, uint2, uint4>;
                launch_decode<HD, G, kT, Piece>(a, B, stream);
                return;
            }
        }
        launch_decode_mma_ring<HD, G, kMmaT, FP8>(a, B, stream);
    });
}

inline void launch_flash_decode(const DecodeArgs& a, int B, int head_dim, cudaStream_t stream) {
    static_assert(tuning::kDecodeThreads == 128 || tuning::kDecodeThreads == 256,
                  "flash_decode_kernel's register cap and merge assume 128 or 256 threads");
    if (head_dim == 64) launch_flash_decode_hd<64>(a, B, stream);
    else launch_flash_decode_hd<128>(a, B, stream);
}

}  // namespace cuda
}  // namespace brrr
