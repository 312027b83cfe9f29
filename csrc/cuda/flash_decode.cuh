// flash_decode.cuh — the flash-decoding CTA of attention.cu (its banner says what it computes and
// how) as a device function, so that two kernels run the very same code: flash_decode_kernel, one
// launch per layer, and the attention phase of decode_layers_persistent (decode_persistent.cu). A
// sequence's output must not depend on which of them ran it: a batch-1 decode step (persistent)
// and the same sequence inside a batch (flash_decode) give the same bits.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "common.h"
#include "cuda/kernel_util.cuh"
#include "cuda/launch.cuh"
#include "cuda/ops.h"
#include "cuda/ptx.cuh"

namespace brrr {
namespace cuda {

constexpr int kDecTile = 64;  // KV positions per shared-memory tile

// Shared memory of one decode CTA of THREADS threads, byte offsets (each 16-byte aligned). The
// scores of a tile come in kParts partial sums, one per slice of hd (phase 1 below).
template <int HD, int GMAX, int THREADS>
struct DecodeSmem {
    static constexpr int kParts = THREADS / kDecTile;
    static constexpr int kPitchK = HD + 8;  // K rows are read one per thread: pad across banks
    static constexpr size_t k_off = 0;                                            // bf16 [2][tile][HD+8]
    static constexpr size_t v_off = k_off + 2 * kDecTile * kPitchK * 2;           // bf16 [2][tile][HD]
    static constexpr size_t q_off = v_off + 2 * kDecTile * HD * 2;                // f32 [GMAX][HD]
    static constexpr size_t s_off = q_off + GMAX * HD * 4;                        // f32 [kParts][GMAX][tile]
    static constexpr size_t stat_off = s_off + kParts * GMAX * kDecTile * 4;      // f32 [3][GMAX]
    static constexpr size_t bytes = stat_off + 3 * GMAX * 4;
};

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
    bool early_kv;   // start loading the first tile before the PDL wait
    bool late_trigger;  // let the next kernel launch only as CTAs exit, not once tile 0 is issued
    float scale_log2;
};

// Splits of one decode launch never exceed this: the merge keeps a weight per split and head in
// the score buffer (GMAX x 2 tiles of floats).
constexpr int kDecMaxSplits = 2 * kDecTile;

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
        per = max(kDecTile, CEIL_DIV(CEIL_DIV(len, n), kDecTile) * kDecTile);
        n = max(1, CEIL_DIV(len, per));  // rounding per up may leave the last split empty: drop it
    }
};

// One CTA's work: chunk `split` of sequence b for the query heads of block y (= KV head x head
// block) of THREADS threads, in `smem` (DecodeSmem bytes). GMAX = query heads per CTA (the group,
// or a block of it when the group is larger). flash_decode_kernel runs it with PDL and
// __syncthreads; decode_layers_persistent (decode_persistent.cu) runs it on its consumer warps,
// with their named barrier and no PDL: q and this token's K/V come from other CTAs of the same
// grid there, which is why q is read through L2 (the K/V tiles are cp.async.cg).
template <int HD, int GMAX, int THREADS, bool PDL, typename BlockSync>
__device__ __forceinline__ void flash_decode_block(const DecodeArgs& a, int split, int y, int b, unsigned char* smem,
                                                   BlockSync sync) {
    using L = DecodeSmem<HD, GMAX, THREADS>;
    constexpr int kPitchK = L::kPitchK, kParts = L::kParts, kSlice = HD / kParts;
    constexpr int kWarps = THREADS / 32;
    constexpr int kHeadsPerPass = THREADS / HD;  // phase 3: thread -> (head, d)
    constexpr int kAccHeads = (GMAX + kHeadsPerPass - 1) / kHeadsPerPass;
    constexpr int kStatHeads = (GMAX + kWarps - 1) / kWarps;  // phase 2: warp -> heads

    uint16_t* Ks = reinterpret_cast<uint16_t*>(smem + L::k_off);
    uint16_t* Vs = reinterpret_cast<uint16_t*>(smem + L::v_off);
    float* qs = reinterpret_cast<float*>(smem + L::q_off);
    float* S = reinterpret_cast<float*>(smem + L::s_off);
    float* alpha_s = reinterpret_cast<float*>(smem + L::stat_off);
    float* max_s = alpha_s + GMAX;
    float* sum_s = max_s + GMAX;

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int kvh = y / a.head_blocks, hb = y % a.head_blocks;
    const int n_g = min(GMAX, a.group - hb * GMAX);  // query heads served here
    const int head0 = kvh * a.group + hb * GMAX;     // first of them

    // Positions and slots were written two kernels back at the latest (launch.cuh): read through
    // L2 before the wait. The engine validates positions; here they only must not leave the cache.
    if (PDL && !a.early_kv) pdl_wait();
    const int pos = __ldcg(a.positions + b);
    const int len = pos < 0 ? 0 : min(pos + 1, a.max_seq);
    const DecodeCut cut(len, a.min_chunk, a.n_splits);
    if (split >= cut.n) {  // past the last chunk of this sequence
        if (PDL) pdl_wait();
        return;
    }
    const int c0 = split * cut.per, c1 = min(len, c0 + cut.per);
    const int d = tid % HD;
    const DecodeScratch sc(a, b, HD);
    auto out_at = [&](int g, int dd) -> bf16& { return a.out[((size_t)b * a.n_heads + head0 + g) * HD + dd]; };

    if (c0 >= c1) {  // an empty sequence (position < 0): one split, zeros out
        if (PDL) pdl_wait();
        if (PDL) pdl_launch_dependents();
        for (int i = tid; i < n_g * HD; i += THREADS) out_at(i / HD, i % HD) = __float2bfloat16_rn(0.f);
        return;
    }

    const uint16_t* kbits = reinterpret_cast<const uint16_t*>(a.k_cache);
    const uint16_t* vbits = reinterpret_cast<const uint16_t*>(a.v_cache);
    const size_t slot_base = (size_t)__ldcg(a.slots + b) * a.max_seq;
    // Tile rows p0 + r with lo <= p0 + r < hi into stage; rows at or past end are zero-filled.
    auto load_rows = [&](int stage, int p0, int lo, int hi, int end) {
        uint16_t* Kst = Ks + stage * kDecTile * kPitchK;
        uint16_t* Vst = Vs + stage * kDecTile * HD;
        constexpr int kChunks = kDecTile * HD / 8;
        for (int c = tid; c < kChunks; c += THREADS) {
            const int r = c / (HD / 8), col = (c % (HD / 8)) * 8;
            const int p = p0 + r;
            if (p < lo || p >= hi) continue;
            const bool ok = p < end;
            const size_t off = ((slot_base + (ok ? p : c0)) * a.n_kv_heads + kvh) * HD + col;
            ptx::cp_async_16(Kst + r * kPitchK + col, kbits + off, ok);
            ptx::cp_async_16(Vst + r * HD + col, vbits + off, ok);
        }
    };

    // The first tile: every row but this token's (len - 1, written by the kernel just before) may
    // load before the wait; that row and the zero rows after it join the same cp.async group after
    // it (two copies to one shared address are not ordered, so no row is issued twice).
    const int last = len - 1, tile_end = c0 + kDecTile;
    if (a.early_kv) {
        const bool last_here = last < tile_end;
        load_rows(0, c0, c0, last_here ? last : tile_end, c1);
        if (PDL) pdl_wait();
        if (last_here) load_rows(0, c0, last, tile_end, c1);
    } else {
        load_rows(0, c0, c0, tile_end, c1);
    }
    if (PDL && !a.late_trigger) pdl_launch_dependents();
    ptx::cp_async_commit();

    const uint16_t* qbits = reinterpret_cast<const uint16_t*>(a.q);
    for (int i = tid; i < GMAX * HD; i += THREADS) {
        const int g = i / HD;
        qs[i] = g < n_g ? util::bf16_bits(__ldcg(qbits + ((size_t)b * a.n_heads + head0 + g) * HD + i % HD)) * a.scale_log2
                        : 0.f;
    }

    float run_max[kStatHeads], run_sum[kStatHeads];
#pragma unroll
    for (int j = 0; j < kStatHeads; ++j) run_max[j] = -INFINITY, run_sum[j] = 0.f;
    float acc[kAccHeads];
#pragma unroll
    for (int j = 0; j < kAccHeads; ++j) acc[j] = 0.f;

    const int n_tiles = CEIL_DIV(c1 - c0, kDecTile);
    for (int t = 0; t < n_tiles; ++t) {
        const int stage = t & 1, p0 = c0 + t * kDecTile;
        if (t + 1 < n_tiles) {
            load_rows(stage ^ 1, p0 + kDecTile, p0 + kDecTile, p0 + 2 * kDecTile, c1);
            ptx::cp_async_commit();
            ptx::cp_async_wait<1>();
        } else {
            ptx::cp_async_wait<0>();
        }
        sync();  // tile t (and qs) visible to all

        // Phase 1: scores. Thread -> (position r, slice of hd); a warp covers 32 positions, and
        // with the padded pitch their 16-byte reads fall in distinct bank groups.
        {
            const int r = tid % kDecTile, part = tid / kDecTile;
            const uint16_t* krow = Ks + stage * kDecTile * kPitchK + r * kPitchK + part * kSlice;
            const float* qh = qs + part * kSlice;
            float s[GMAX];
#pragma unroll
            for (int g = 0; g < GMAX; ++g) s[g] = 0.f;
#pragma unroll 2
            for (int c = 0; c < kSlice; c += 8) {
                const uint4 kv = *reinterpret_cast<const uint4*>(krow + c);
                const float k8[8] = {util::bf16_lo(kv.x), util::bf16_hi(kv.x), util::bf16_lo(kv.y),
                                     util::bf16_hi(kv.y), util::bf16_lo(kv.z), util::bf16_hi(kv.z),
                                     util::bf16_lo(kv.w), util::bf16_hi(kv.w)};
#pragma unroll
                for (int g = 0; g < GMAX; ++g) {
                    const float4 qa = *reinterpret_cast<const float4*>(qh + g * HD + c);
                    const float4 qb = *reinterpret_cast<const float4*>(qh + g * HD + c + 4);
                    s[g] += k8[0] * qa.x + k8[1] * qa.y + k8[2] * qa.z + k8[3] * qa.w +
                            k8[4] * qb.x + k8[5] * qb.y + k8[6] * qb.z + k8[7] * qb.w;
                }
            }
#pragma unroll
            for (int g = 0; g < GMAX; ++g) S[(part * GMAX + g) * kDecTile + r] = s[g];
        }
        sync();

        // Phase 2: online softmax per head; S[0] becomes the probabilities of this tile.
#pragma unroll
        for (int j = 0; j < kStatHeads; ++j) {
            const int g = warp + kWarps * j;
            if (g < n_g) {
                float sv[kDecTile / 32];
                float tile_max = -INFINITY;
#pragma unroll
                for (int e = 0; e < kDecTile / 32; ++e) {
                    const int r = lane + 32 * e;
                    float dot = 0.f;
#pragma unroll
                    for (int part = 0; part < kParts; ++part) dot += S[(part * GMAX + g) * kDecTile + r];
                    sv[e] = p0 + r < c1 ? dot : -INFINITY;
                    tile_max = fmaxf(tile_max, sv[e]);
                }
                // Finite: position p0 < c1 is always in the tile.
                const float new_max = fmaxf(run_max[j], util::warp_max(tile_max));
                const float alpha = exp2f(run_max[j] - new_max);
                float tile_sum = 0.f;
#pragma unroll
                for (int e = 0; e < kDecTile / 32; ++e) {
                    const float pe = exp2f(sv[e] - new_max);
                    S[g * kDecTile + lane + 32 * e] = pe;
                    tile_sum += pe;
                }
                run_sum[j] = run_sum[j] * alpha + util::warp_sum(tile_sum);
                run_max[j] = new_max;
                if (lane == 0) alpha_s[g] = alpha;
            }
        }
        sync();

        // Phase 3: acc[g][d] = acc * alpha + sum_r P[g][r] * V[r][d].
        const uint16_t* Vst = Vs + stage * kDecTile * HD;
#pragma unroll
        for (int j = 0; j < kAccHeads; ++j) {
            const int g = tid / HD + j * kHeadsPerPass;
            if (g < n_g) {
                float o = acc[j] * alpha_s[g];
                const float* pg = S + g * kDecTile;
#pragma unroll 4
                for (int r = 0; r < kDecTile; r += 4) {
                    const float4 pv = *reinterpret_cast<const float4*>(pg + r);
                    o += pv.x * util::bf16_bits(Vst[(r + 0) * HD + d]);
                    o += pv.y * util::bf16_bits(Vst[(r + 1) * HD + d]);
                    o += pv.z * util::bf16_bits(Vst[(r + 2) * HD + d]);
                    o += pv.w * util::bf16_bits(Vst[(r + 3) * HD + d]);
                }
                acc[j] = o;
            }
        }
        sync();  // stage and S are rewritten next iteration
    }

    // One chunk: the output is final.
    if (cut.n == 1) {
#pragma unroll
        for (int j = 0; j < kStatHeads; ++j) {
            const int g = warp + kWarps * j;
            if (g < n_g && lane == 0) sum_s[g] = run_sum[j];
        }
        sync();
#pragma unroll
        for (int j = 0; j < kAccHeads; ++j) {
            const int g = tid / HD + j * kHeadsPerPass;
            if (g < n_g) out_at(g, d) = __float2bfloat16_rn(acc[j] / sum_s[g]);
        }
        return;
    }

    // Several chunks: publish this one's partial, count in; the last to arrive merges.
#pragma unroll
    for (int j = 0; j < kStatHeads; ++j) {
        const int g = warp + kWarps * j;
        if (g < n_g && lane == 0) {
            sc.ml(head0 + g, split)[0] = run_max[j];
            sc.ml(head0 + g, split)[1] = run_sum[j];
        }
    }
#pragma unroll
    for (int j = 0; j < kAccHeads; ++j) {
        const int g = tid / HD + j * kHeadsPerPass;
        if (g < n_g) sc.acc(head0 + g, split)[d] = acc[j];
    }
    __shared__ int is_last;
    __threadfence();  // this CTA's partial reaches L2 before it is counted
    sync();
    if (tid == 0) {
        int* counter = sc.counter(y);
        is_last = atomicAdd(counter, 1) + 1 == cut.n;
        if (is_last) *counter = 0;  // every chunk has arrived: nobody else touches it this call
    }
    sync();
    if (!is_last) return;
    __threadfence();

    // Merge: warp -> head, lane -> splits. Split s weighs w_s = 2^(m_s - M) / sum_s' 2^(m_s' - M) l_s'
    // (M the largest max, l the sums); out = sum_s w_s acc_s.
    float* weight = S;  // [GMAX][kDecMaxSplits] (fits: kParts >= 2), the scores are dead
#pragma unroll
    for (int j = 0; j < kStatHeads; ++j) {
        const int g = warp + kWarps * j;
        if (g < n_g) {
            float m[kDecMaxSplits / 32], l[kDecMaxSplits / 32];
            float global_max = -INFINITY;
#pragma unroll
            for (int e = 0; e < kDecMaxSplits / 32; ++e) {
                const int sp = lane + 32 * e;
                m[e] = sp < cut.n ? __ldcg(sc.ml(head0 + g, sp)) : -INFINITY;
                l[e] = sp < cut.n ? __ldcg(sc.ml(head0 + g, sp) + 1) : 0.f;
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
    }
    sync();
    for (int i = tid; i < n_g * HD; i += THREADS) {
        const int g = i / HD, dd = i % HD;
        const float* w = weight + g * kDecMaxSplits;
        float o = 0.f;
#pragma unroll 8
        for (int sp = 0; sp < cut.n; ++sp) o += w[sp] * __ldcg(sc.acc(head0 + g, sp) + dd);
        out_at(g, dd) = __float2bfloat16_rn(o);
    }
}

// Query heads per decode CTA: the GQA group rounded up to a kernel instance, at most 8.
inline int decode_gmax(int group) { return group <= 1 ? 1 : group <= 2 ? 2 : group <= 4 ? 4 : 8; }

// The launch arguments of flash_decode for B sequences (attention.cu): splits from the shapes
// only, since positions live on the device.
DecodeArgs decode_args(const bf16* q, const bf16* k_cache, const bf16* v_cache, const int* slots,
                       const int* positions, bf16* out, float* scratch, int B, int n_heads,
                       int n_kv_heads, int head_dim, int max_seq, int max_splits);

}  // namespace cuda
}  // namespace brrr
