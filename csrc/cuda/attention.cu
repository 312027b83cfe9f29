// attention.cu — causal softmax attention over the bf16 KV cache, fp32 softmax statistics.
//
//   q [rows, Hq, hd] bf16; one layer's caches k_cache / v_cache [max_batch][max_seq][Hkv][hd] bf16;
//   out [rows, Hq * hd] bf16. The query at position p sees cache positions [0, p]. GQA: query
//   head h reads KV head h / (Hq / Hkv). Scores are scaled by log2(e) / sqrt(hd) so the
//   softmax runs on exp2.
//
// flash_decode (one query per sequence, memory-bound: the KV bytes are the cost):
//   grid (split, KV head x head block, sequence). A CTA streams one chunk of ONE KV head's K/V
//   through shared memory (cp.async, double-buffered, 64 positions per tile) and serves every
//   query head of that group from it, so each K/V byte is read once per token, not once per
//   query head. Online softmax in fp32; each split writes (max, sum, unnormalized acc[hd]) to
//   scratch and a combine kernel merges the splits. Positions live on the device (CUDA-graph
//   replay), so the launcher fixes the number of splits from the shapes alone and each CTA cuts
//   its sequence's actual length into that many chunks; a chunk past the end writes an empty
//   partial (max -inf, sum 0) that the combine weighs by zero. Both kernels are launched with PDL
//   (launch.cuh), so their launch overlaps the tail of the kernel before.
//
// attention_prefill (T new tokens of one sequence, their K/V already in the cache):
//   FlashAttention-2 on tensor cores. A CTA owns 64 queries of one head (4 warps x 16 rows);
//   K/V tiles of 64 positions are double-buffered in shared memory; S = Q K^T and O += P V are
//   mma.sync m16n8k16 (bf16 in, fp32 out); P goes from the S accumulators to the A operand of
//   the second mma in registers (the two layouts coincide). T x T scores never exist. Tiles
//   above the diagonal are never loaded; the query tiles with the most work are scheduled first.
#include <algorithm>
#include <atomic>
#include <cmath>

#include "cuda/check.cuh"
#include "cuda/kernel_util.cuh"
#include "cuda/launch.cuh"
#include "cuda/ops.h"
#include "cuda/ptx.cuh"

namespace brrr {
namespace cuda {

namespace {

constexpr float kLog2e = 1.4426950408889634f;

// ==== flash decode ============================================================================

constexpr int kDecTile = 64;  // KV positions per shared-memory tile
constexpr int kDecThreads = 2 * kDecTile;
constexpr int kDecWarps = kDecThreads / 32;

// Shared memory of one decode CTA, byte offsets (each 16-byte aligned).
template <int HD, int GMAX>
struct DecodeSmem {
    static constexpr int kPitchK = HD + 8;  // K rows are read one per thread: pad across banks
    static constexpr size_t k_off = 0;                                            // bf16 [2][tile][HD+8]
    static constexpr size_t v_off = k_off + 2 * kDecTile * kPitchK * 2;           // bf16 [2][tile][HD]
    static constexpr size_t q_off = v_off + 2 * kDecTile * HD * 2;                // f32 [GMAX][HD]
    static constexpr size_t s_off = q_off + GMAX * HD * 4;                        // f32 [2][GMAX][tile]
    static constexpr size_t stat_off = s_off + 2 * GMAX * kDecTile * 4;           // f32 [3][GMAX]
    static constexpr size_t bytes = stat_off + 3 * GMAX * 4;
};

struct DecodeArgs {
    const bf16* q;
    const bf16* k_cache;
    const bf16* v_cache;
    const int* slots;
    const int* positions;
    bf16* out;
    float* part_ml;   // [B][Hq][n_splits][2] (max in log2 units, sum)
    float* part_acc;  // [B][Hq][n_splits][hd]
    int n_heads, n_kv_heads, group, head_blocks, max_seq, n_splits;
    float scale_log2;
};

// GMAX = query heads per CTA (the group, or a block of it when the group is larger).
template <int HD, int GMAX>
__global__ void __launch_bounds__(kDecThreads) flash_decode_kernel(DecodeArgs a) {
    using L = DecodeSmem<HD, GMAX>;
    constexpr int kPitchK = L::kPitchK;
    constexpr int kHeadsPerPass = kDecThreads / HD;  // phase 3: thread -> (head, d)
    constexpr int kAccHeads = (GMAX + kHeadsPerPass - 1) / kHeadsPerPass;
    constexpr int kStatHeads = (GMAX + kDecWarps - 1) / kDecWarps;  // phase 2: warp -> heads

    unsigned char* smem = ptx::dynamic_smem<unsigned char>();
    uint16_t* Ks = reinterpret_cast<uint16_t*>(smem + L::k_off);
    uint16_t* Vs = reinterpret_cast<uint16_t*>(smem + L::v_off);
    float* qs = reinterpret_cast<float*>(smem + L::q_off);
    float* S = reinterpret_cast<float*>(smem + L::s_off);
    float* alpha_s = reinterpret_cast<float*>(smem + L::stat_off);
    float* max_s = alpha_s + GMAX;
    float* sum_s = max_s + GMAX;

    // Launched with PDL: q, positions and this token's K/V come from the kernels before.
    pdl_wait();
    pdl_launch_dependents();

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int split = blockIdx.x, b = blockIdx.z;
    const int kvh = blockIdx.y / a.head_blocks, hb = blockIdx.y % a.head_blocks;
    const int n_g = min(GMAX, a.group - hb * GMAX);  // query heads served here
    const int head0 = kvh * a.group + hb * GMAX;     // first of them

    // The engine validates positions before upload; here they only must not leave the cache.
    const int pos = a.positions[b];
    const int len = pos < 0 ? 0 : min(pos + 1, a.max_seq);
    const int per_split = CEIL_DIV(CEIL_DIV(len, a.n_splits), kDecTile) * kDecTile;
    const int c0 = split * per_split, c1 = min(len, c0 + per_split);

    const int d = tid % HD;
    auto partial = [&](int g) { return ((size_t)b * a.n_heads + head0 + g) * a.n_splits + split; };

    if (c0 >= c1) {  // nothing to attend to in this chunk
        for (int i = tid; i < n_g * HD; i += kDecThreads) {
            const int g = i / HD;
            if (a.n_splits == 1) {
                a.out[((size_t)b * a.n_heads + head0 + g) * HD + i % HD] = __float2bfloat16_rn(0.f);
            } else {
                a.part_acc[partial(g) * HD + i % HD] = 0.f;
                if (i % HD == 0) {
                    a.part_ml[partial(g) * 2] = -INFINITY;
                    a.part_ml[partial(g) * 2 + 1] = 0.f;
                }
            }
        }
        return;
    }

    const uint16_t* kbits = reinterpret_cast<const uint16_t*>(a.k_cache);
    const uint16_t* vbits = reinterpret_cast<const uint16_t*>(a.v_cache);
    const size_t slot_base = (size_t)a.slots[b] * a.max_seq;
    auto load_tile = [&](int stage, int p0) {
        uint16_t* Kst = Ks + stage * kDecTile * kPitchK;
        uint16_t* Vst = Vs + stage * kDecTile * HD;
        constexpr int kChunks = kDecTile * HD / 8;
        for (int c = tid; c < kChunks; c += kDecThreads) {
            const int r = c / (HD / 8), col = (c % (HD / 8)) * 8;
            const int p = p0 + r;
            const bool ok = p < c1;
            const size_t off = ((slot_base + (ok ? p : c0)) * a.n_kv_heads + kvh) * HD + col;
            ptx::cp_async_16(Kst + r * kPitchK + col, kbits + off, ok);
            ptx::cp_async_16(Vst + r * HD + col, vbits + off, ok);
        }
    };

    const int n_tiles = CEIL_DIV(c1 - c0, kDecTile);
    load_tile(0, c0);
    ptx::cp_async_commit();

    const uint16_t* qbits = reinterpret_cast<const uint16_t*>(a.q);
    for (int i = tid; i < GMAX * HD; i += kDecThreads) {
        const int g = i / HD;
        qs[i] = g < n_g ? util::bf16_bits(qbits[((size_t)b * a.n_heads + head0 + g) * HD + i % HD]) * a.scale_log2
                        : 0.f;
    }

    float run_max[kStatHeads], run_sum[kStatHeads];
#pragma unroll
    for (int j = 0; j < kStatHeads; ++j) run_max[j] = -INFINITY, run_sum[j] = 0.f;
    float acc[kAccHeads];
#pragma unroll
    for (int j = 0; j < kAccHeads; ++j) acc[j] = 0.f;

    for (int t = 0; t < n_tiles; ++t) {
        const int stage = t & 1, p0 = c0 + t * kDecTile;
        if (t + 1 < n_tiles) {
            load_tile(stage ^ 1, p0 + kDecTile);
            ptx::cp_async_commit();
            ptx::cp_async_wait<1>();
        } else {
            ptx::cp_async_wait<0>();
        }
        __syncthreads();  // tile t (and qs) visible to all

        // Phase 1: scores. Thread -> (position r, half of hd); a warp covers 32 positions, and
        // with the padded pitch their 16-byte reads fall in distinct bank groups.
        {
            const int r = tid % kDecTile, half = tid / kDecTile;
            const uint16_t* krow = Ks + stage * kDecTile * kPitchK + r * kPitchK + half * (HD / 2);
            const float* qh = qs + half * (HD / 2);
            float s[GMAX];
#pragma unroll
            for (int g = 0; g < GMAX; ++g) s[g] = 0.f;
#pragma unroll 2
            for (int c = 0; c < HD / 2; c += 8) {
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
            for (int g = 0; g < GMAX; ++g) S[(half * GMAX + g) * kDecTile + r] = s[g];
        }
        __syncthreads();

        // Phase 2: online softmax per head; S[0] becomes the probabilities of this tile.
#pragma unroll
        for (int j = 0; j < kStatHeads; ++j) {
            const int g = warp + kDecWarps * j;
            if (g < n_g) {
                float sv[kDecTile / 32];
                float tile_max = -INFINITY;
#pragma unroll
                for (int e = 0; e < kDecTile / 32; ++e) {
                    const int r = lane + 32 * e;
                    sv[e] = p0 + r < c1 ? S[g * kDecTile + r] + S[(GMAX + g) * kDecTile + r] : -INFINITY;
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
        __syncthreads();

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
        __syncthreads();  // stage and S are rewritten next iteration
    }

#pragma unroll
    for (int j = 0; j < kStatHeads; ++j) {
        const int g = warp + kDecWarps * j;
        if (g < n_g && lane == 0) {
            max_s[g] = run_max[j];
            sum_s[g] = run_sum[j];
        }
    }
    __syncthreads();
#pragma unroll
    for (int j = 0; j < kAccHeads; ++j) {
        const int g = tid / HD + j * kHeadsPerPass;
        if (g < n_g) {
            if (a.n_splits == 1) {
                a.out[((size_t)b * a.n_heads + head0 + g) * HD + d] = __float2bfloat16_rn(acc[j] / sum_s[g]);
            } else {
                a.part_acc[partial(g) * HD + d] = acc[j];
                if (d == 0) {
                    a.part_ml[partial(g) * 2] = max_s[g];
                    a.part_ml[partial(g) * 2 + 1] = sum_s[g];
                }
            }
        }
    }
}

// One CTA per (sequence, query head), one thread per output element: weigh each split by
// 2^(max_s - max) and normalize by the weighted sums.
__global__ void flash_decode_combine_kernel(const float* __restrict__ part_ml,
                                            const float* __restrict__ part_acc, bf16* __restrict__ out,
                                            int n_splits, int head_dim) {
    pdl_wait();
    pdl_launch_dependents();
    const int bh = blockIdx.x, d = threadIdx.x;
    const float* ml = part_ml + (size_t)bh * n_splits * 2;
    float global_max = -INFINITY;
    for (int s = 0; s < n_splits; ++s) global_max = fmaxf(global_max, ml[2 * s]);
    float num = 0.f, den = 0.f;
    if (global_max != -INFINITY) {  // -inf only for an empty sequence (position < 0)
        for (int s = 0; s < n_splits; ++s) {
            const float w = exp2f(ml[2 * s] - global_max);
            den += w * ml[2 * s + 1];
            num += w * part_acc[((size_t)bh * n_splits + s) * head_dim + d];
        }
    }
    out[(size_t)bh * head_dim + d] = __float2bfloat16_rn(den > 0.f ? num / den : 0.f);
}

template <int HD, int GMAX>
void launch_decode(const DecodeArgs& a, int B, cudaStream_t stream) {
    using L = DecodeSmem<HD, GMAX>;
    auto kernel = flash_decode_kernel<HD, GMAX>;
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)L::bytes));
    const dim3 grid(a.n_splits, a.n_kv_heads * a.head_blocks, B);
    launch_pdl(kernel, grid, dim3(kDecThreads), L::bytes, stream, a);
    CUDA_CHECK_LAUNCH("flash_decode_kernel");
}

template <int HD>
void launch_decode_group(const DecodeArgs& a, int gmax, int B, cudaStream_t stream) {
    switch (gmax) {
        case 1: launch_decode<HD, 1>(a, B, stream); break;
        case 2: launch_decode<HD, 2>(a, B, stream); break;
        case 4: launch_decode<HD, 4>(a, B, stream); break;
        default: launch_decode<HD, 8>(a, B, stream); break;
    }
}

// ==== prefill =================================================================================

constexpr int kPreRows = 64;  // queries per CTA: 4 warps x 16
constexpr int kPreKV = 64;    // KV positions per tile
constexpr int kPreThreads = 128;
static_assert(kPreRows == kPreKV, "Q, K and V tiles share one chunk mapping");

template <int HD>
constexpr size_t prefill_smem_bytes() {
    return (size_t)(kPreRows + 2 * kPreKV + 2 * kPreKV) * (HD + 8) * sizeof(uint16_t);
}

struct PrefillArgs {
    const bf16* q;
    const bf16* k_cache;
    const bf16* v_cache;
    bf16* out;
    int slot, start_pos, T, n_heads, n_kv_heads, group, max_seq;
    float scale_log2;
};

template <int HD>
__global__ void __launch_bounds__(kPreThreads) attention_prefill_kernel(PrefillArgs a) {
    constexpr int P = HD + 8;  // padded pitch: ldmatrix rows in distinct bank groups
    constexpr int kKSteps = HD / 16;
    constexpr int kOutFrags = HD / 8;
    uint16_t* Qs = ptx::dynamic_smem<uint16_t>();
    uint16_t* Ks = Qs + kPreRows * P;  // [2][kPreKV][P]
    uint16_t* Vs = Ks + 2 * kPreKV * P;

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t4 = lane & 3;
    const int q_tile = gridDim.x - 1 - blockIdx.x;  // longest rows first
    const int hq = blockIdx.y, kvh = hq / a.group;
    const int q0 = q_tile * kPreRows;
    const int kv_total = a.start_pos + a.T;                       // filled cache positions
    const int kv_end = a.start_pos + min(q0 + kPreRows, a.T);     // what this tile's last row sees
    const int n_tiles = CEIL_DIV(kv_end, kPreKV);
    const size_t slot_base = (size_t)a.slot * a.max_seq;

    const uint16_t* qbits = reinterpret_cast<const uint16_t*>(a.q);
    const uint16_t* kbits = reinterpret_cast<const uint16_t*>(a.k_cache);
    const uint16_t* vbits = reinterpret_cast<const uint16_t*>(a.v_cache);
    constexpr int kChunks = kPreRows * HD / 8;  // 16-byte chunks per tile (Q, K or V)
    for (int c = tid; c < kChunks; c += kPreThreads) {
        const int r = c / (HD / 8), col = (c % (HD / 8)) * 8;
        const bool ok = q0 + r < a.T;
        ptx::cp_async_16(Qs + r * P + col, qbits + ((size_t)(ok ? q0 + r : 0) * a.n_heads + hq) * HD + col, ok);
    }
    auto load_kv = [&](int stage, int p0) {
        uint16_t* Kst = Ks + stage * kPreKV * P;
        uint16_t* Vst = Vs + stage * kPreKV * P;
        for (int c = tid; c < kChunks; c += kPreThreads) {
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

    // This thread's two rows (g and g + 8 of the warp's 16) and their absolute positions.
    const int row_pos[2] = {a.start_pos + q0 + warp * 16 + g, a.start_pos + q0 + warp * 16 + g + 8};
    const int warp_first_pos = a.start_pos + q0 + warp * 16;
    float row_max[2] = {-INFINITY, -INFINITY};
    float row_sum[2] = {0.f, 0.f};  // this thread's share; the quad is summed at the end
    float o[kOutFrags][4];
#pragma unroll
    for (int f = 0; f < kOutFrags; ++f) o[f][0] = o[f][1] = o[f][2] = o[f][3] = 0.f;
    uint32_t qf[kKSteps][4];

    for (int kt = 0; kt < n_tiles; ++kt) {
        const int stage = kt & 1, kv0 = kt * kPreKV;
        if (kt + 1 < n_tiles) {
            load_kv(stage ^ 1, kv0 + kPreKV);
            ptx::cp_async_commit();
            ptx::cp_async_wait<1>();
        } else {
            ptx::cp_async_wait<0>();
        }
        __syncthreads();
        if (kt == 0) {
#pragma unroll
            for (int ks = 0; ks < kKSteps; ++ks)
                ptx::ldmatrix_x4(qf[ks], Qs + (warp * 16 + (lane & 15)) * P + ks * 16 + (lane >> 4) * 8);
        }
        const uint16_t* Kst = Ks + stage * kPreKV * P;
        const uint16_t* Vst = Vs + stage * kPreKV * P;

        // S = Q K^T for the warp's 16 rows x 64 positions.
        float s[kPreKV / 8][4];
#pragma unroll
        for (int f = 0; f < kPreKV / 8; ++f) s[f][0] = s[f][1] = s[f][2] = s[f][3] = 0.f;
#pragma unroll
        for (int ks = 0; ks < kKSteps; ++ks) {
#pragma unroll
            for (int nj = 0; nj < kPreKV / 16; ++nj) {
                uint32_t r[4];
                ptx::ldmatrix_x4(r, Kst + (nj * 16 + (lane >> 4) * 8 + (lane & 7)) * P + ks * 16 + ((lane >> 3) & 1) * 8);
                const uint32_t b0[2] = {r[0], r[1]}, b1[2] = {r[2], r[3]};
                ptx::mma_bf16_16816(s[2 * nj], qf[ks], b0);
                ptx::mma_bf16_16816(s[2 * nj + 1], qf[ks], b1);
            }
        }

        // Scale into log2 units; mask the future (only tiles reaching past the warp's first row).
        const bool diagonal = kv0 + kPreKV - 1 > warp_first_pos;
#pragma unroll
        for (int f = 0; f < kPreKV / 8; ++f) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                s[f][e] *= a.scale_log2;
                if (diagonal && kv0 + f * 8 + 2 * t4 + (e & 1) > row_pos[e >> 1]) s[f][e] = -INFINITY;
            }
        }

        // Online softmax: a row lives in the 4 threads of a quad.
        float alpha[2], base[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            float mx = -INFINITY;
#pragma unroll
            for (int f = 0; f < kPreKV / 8; ++f) mx = fmaxf(mx, fmaxf(s[f][2 * h], s[f][2 * h + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            const float new_max = fmaxf(row_max[h], mx);
            base[h] = new_max == -INFINITY ? 0.f : new_max;  // a fully masked row so far
            alpha[h] = exp2f(row_max[h] - base[h]);
            row_max[h] = new_max;
            row_sum[h] *= alpha[h];
        }
#pragma unroll
        for (int f = 0; f < kPreKV / 8; ++f) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                s[f][e] = exp2f(s[f][e] - base[e >> 1]);
                row_sum[e >> 1] += s[f][e];
            }
        }
#pragma unroll
        for (int f = 0; f < kOutFrags; ++f) {
            o[f][0] *= alpha[0];
            o[f][1] *= alpha[0];
            o[f][2] *= alpha[1];
            o[f][3] *= alpha[1];
        }

        // O += P V: the S accumulators of positions 16j..16j+15 are the A fragment of k-step j.
#pragma unroll
        for (int j = 0; j < kPreKV / 16; ++j) {
            const uint32_t pa[4] = {util::pack_bf16x2(s[2 * j][0], s[2 * j][1]),
                                    util::pack_bf16x2(s[2 * j][2], s[2 * j][3]),
                                    util::pack_bf16x2(s[2 * j + 1][0], s[2 * j + 1][1]),
                                    util::pack_bf16x2(s[2 * j + 1][2], s[2 * j + 1][3])};
#pragma unroll
            for (int i = 0; i < HD / 16; ++i) {
                // Matrices: (pos 0-7, d 0-7), (pos 8-15, d 0-7), (pos 0-7, d 8-15), (pos 8-15, d 8-15).
                uint32_t r[4];
                ptx::ldmatrix_x4_trans(r, Vst + (j * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * P + i * 16 + (lane >> 4) * 8);
                const uint32_t b0[2] = {r[0], r[1]}, b1[2] = {r[2], r[3]};
                ptx::mma_bf16_16816(o[2 * i], pa, b0);
                ptx::mma_bf16_16816(o[2 * i + 1], pa, b1);
            }
        }
        __syncthreads();  // the stage is overwritten by the next iteration's prefetch
    }

#pragma unroll
    for (int h = 0; h < 2; ++h) {
        float l = row_sum[h];
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        const int row = q0 + warp * 16 + g + 8 * h;
        if (row < a.T) {
            const float inv = 1.f / l;
            uint32_t* dst = reinterpret_cast<uint32_t*>(a.out + ((size_t)row * a.n_heads + hq) * HD);
#pragma unroll
            for (int f = 0; f < kOutFrags; ++f)
                dst[(f * 8 + 2 * t4) / 2] = util::pack_bf16x2(o[f][2 * h] * inv, o[f][2 * h + 1] * inv);
        }
    }
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
    return (size_t)B * n_heads * max_splits * (head_dim + 2);
}

void flash_decode(const bf16* q, const bf16* k_cache, const bf16* v_cache, const int* slots,
                  const int* positions, bf16* out, float* scratch, int B, int n_heads,
                  int n_kv_heads, int head_dim, int max_seq, int max_splits, cudaStream_t stream) {
    check_attention_shapes("flash_decode", n_heads, n_kv_heads, head_dim, max_seq);
    BRRR_CHECK(B >= 0 && B <= 65535, "flash_decode: batch B=" << B << " must be in [0, 65535]");
    BRRR_CHECK(max_splits >= 1, "flash_decode: max_splits must be >= 1, got " << max_splits);
    BRRR_CHECK(q && k_cache && v_cache && slots && positions && out,
               "flash_decode: q, k_cache, v_cache, slots, positions and out must be device pointers");
    BRRR_CHECK(util::aligned_to(k_cache, 16) && util::aligned_to(v_cache, 16),
               "flash_decode: k_cache and v_cache must be 16-byte aligned");
    BRRR_CHECK(util::aligned_to(q, 2) && util::aligned_to(out, 2) && util::aligned_to(slots, 4) &&
                   util::aligned_to(positions, 4),
               "flash_decode: q/out (bf16) or slots/positions (int32) are misaligned");
    BRRR_CHECK(max_splits == 1 || scratch != nullptr,
               "flash_decode: max_splits=" << max_splits << " needs the scratch of "
                                           << "flash_decode_scratch_floats(); got null");
    if (B == 0) return;

    const int group = n_heads / n_kv_heads;
    const int gmax = group <= 1 ? 1 : group <= 2 ? 2 : group <= 4 ? 4 : 8;
    DecodeArgs a;
    a.q = q;
    a.k_cache = k_cache;
    a.v_cache = v_cache;
    a.slots = slots;
    a.positions = positions;
    a.out = out;
    a.n_heads = n_heads;
    a.n_kv_heads = n_kv_heads;
    a.group = group;
    a.head_blocks = CEIL_DIV(group, gmax);
    a.max_seq = max_seq;
    a.scale_log2 = kLog2e / std::sqrt((float)head_dim);
    // Splits from shapes only (positions are on the device): about two CTAs per SM at this
    // batch, never more than max_splits or than 64-position chunks of max_seq.
    const int ctas_per_split = B * n_kv_heads * a.head_blocks;
    const int want = CEIL_DIV(2 * device_facts().sm_count, ctas_per_split);
    a.n_splits = std::max(1, std::min({want, max_splits, CEIL_DIV(max_seq, kDecTile)}));
    a.part_ml = scratch;
    a.part_acc = scratch ? scratch + (size_t)B * n_heads * max_splits * 2 : nullptr;

    if (head_dim == 64) launch_decode_group<64>(a, gmax, B, stream);
    else launch_decode_group<128>(a, gmax, B, stream);
    if (a.n_splits > 1) {
        launch_pdl(flash_decode_combine_kernel, dim3(B * n_heads), dim3(head_dim), 0, stream,
                   a.part_ml, a.part_acc, out, a.n_splits, head_dim);
        CUDA_CHECK_LAUNCH("flash_decode_combine_kernel");
    }
}

void attention_prefill(const bf16* q, const bf16* k_cache, const bf16* v_cache, int slot,
                       int start_pos, int T, bf16* out, int n_heads, int n_kv_heads, int head_dim,
                       int max_seq, cudaStream_t stream) {
    check_attention_shapes("attention_prefill", n_heads, n_kv_heads, head_dim, max_seq);
    BRRR_CHECK(T >= 0 && start_pos >= 0 && (int64_t)start_pos + T <= max_seq,
               "attention_prefill: tokens [start_pos, start_pos + T) = [" << start_pos << ", "
                   << (int64_t)start_pos + T << ") must lie in the cache of max_seq=" << max_seq);
    BRRR_CHECK(slot >= 0, "attention_prefill: slot must be >= 0, got " << slot);
    BRRR_CHECK(q && k_cache && v_cache && out,
               "attention_prefill: q, k_cache, v_cache and out must be device pointers");
    BRRR_CHECK(util::aligned_to(q, 16) && util::aligned_to(k_cache, 16) && util::aligned_to(v_cache, 16),
               "attention_prefill: q, k_cache and v_cache must be 16-byte aligned");
    BRRR_CHECK(util::aligned_to(out, 4), "attention_prefill: out must be 4-byte aligned");
    if (T == 0) return;

    PrefillArgs a;
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
    const dim3 grid(CEIL_DIV(T, kPreRows), n_heads);
    if (head_dim == 64) {
        auto kernel = attention_prefill_kernel<64>;
        CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        (int)prefill_smem_bytes<64>()));
        kernel<<<grid, kPreThreads, prefill_smem_bytes<64>(), stream>>>(a);
    } else {
        auto kernel = attention_prefill_kernel<128>;
        CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        (int)prefill_smem_bytes<128>()));
        kernel<<<grid, kPreThreads, prefill_smem_bytes<128>(), stream>>>(a);
    }
    CUDA_CHECK_LAUNCH("attention_prefill_kernel");
}

}  // namespace cuda
}  // namespace brrr
