// attention_prefill_sm80.cuh — the mma.sync prefill kernel and its launch (attention_prefill_sm80.cu
// has the design). A header so that the lab (benchmarks/lab/cuda_attention_prefill_lab.cu) runs
// the production kernel.
#pragma once

#include <cmath>

#include "cuda/attention_common.cuh"
#include "cuda/check.cuh"
#include "cuda/kernel_util.cuh"
#include "cuda/launch.cuh"
#include "cuda/ops.h"
#include "cuda/ptx.cuh"

namespace brrr {
namespace cuda {

// KV positions per tile: 64, or 32 at hd 128 where the 104 KB of 64 exceed what a CTA may have
// (sm_86/89: 99 KB). An e4m3 cache (FP8) adds the tiles' bytes as copied, [2][K, V][KV][HD].
template <int HD, int KV, bool FP8>
constexpr size_t prefill_smem_bytes() {
    return (size_t)(kPreRows + 4 * KV) * (HD + 8) * sizeof(uint16_t) + (FP8 ? (size_t)4 * KV * HD : 0);
}

// WARPS warps of MT 16-row m-tiles each (4 x 2, 128 queries per CTA). QREG: the Q fragments stay
// in registers for the whole KV loop at hd 64; at hd 128 they would not fit beside two m-tiles'
// accumulators and are re-read from shared memory at every k-step.
// FP8: the cache holds e4m3. A tile's bytes are copied as they are into a staging area; once
// they have landed each thread widens the 16-byte pieces it copied itself into the bf16 tile
// (exactly: every e4m3 value is a bf16 value), so no barrier is added and the MMAs run unchanged.
template <int HD, int KV, bool FP8>
__global__ void __launch_bounds__(kPreThreads) attention_prefill_kernel(PrefillArgs args) {
    constexpr int WARPS = kPreWarps, MT = kPreTiles;
    constexpr bool QREG = HD == 64;
    constexpr int P = HD + 8;  // padded pitch: ldmatrix rows in distinct bank groups
    constexpr int kKSteps = HD / 16, kOutFrags = HD / 8;
    constexpr int kRows = 16 * WARPS * MT, kThreads = 32 * WARPS;
    uint16_t* Qs = ptx::dynamic_smem<uint16_t>();
    uint16_t* Ks = Qs + kRows * P;  // [2][KV][P]
    uint16_t* Vs = Ks + 2 * KV * P;
    uint8_t* K8 = reinterpret_cast<uint8_t*>(Vs + 2 * KV * P);  // FP8: [2][KV][HD]
    uint8_t* V8 = K8 + 2 * KV * HD;

    PrefillArgs a = args;
    if (a.segments) {  // a batched launch: this CTA's segment
        const PrefillSegment sg = a.segments[blockIdx.z];
        a.q += (size_t)sg.row0 * a.n_heads * HD;
        a.out += (size_t)sg.row0 * a.n_heads * HD;
        a.slot = sg.slot;
        a.start_pos = sg.start_pos;
        a.T = sg.rows;
    }
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t4 = lane & 3;
    // The longest query tiles (the last ones) are scheduled first.
    const int q_tile = a.heads_fast ? gridDim.y - 1 - blockIdx.y : gridDim.x - 1 - blockIdx.x;
    const int hq = a.heads_fast ? blockIdx.x : blockIdx.y, kvh = hq / a.group;
    const int q0 = q_tile * kRows;
    if (q0 >= a.T) return;  // a batched launch's tiles past a shorter segment
    const int kv_total = a.start_pos + a.T;                 // filled cache positions
    const int kv_end = a.start_pos + min(q0 + kRows, a.T);  // what this tile's last row sees
    const int n_tiles = CEIL_DIV(kv_end, KV);

    const uint16_t* qbits = reinterpret_cast<const uint16_t*>(a.q);
    for (int c = tid; c < kRows * HD / 8; c += kThreads) {
        const int r = c / (HD / 8), col = (c % (HD / 8)) * 8;
        const bool ok = q0 + r < a.T;
        ptx::cp_async_16(Qs + r * P + col, qbits + ((size_t)(ok ? q0 + r : 0) * a.n_heads + hq) * HD + col, ok);
    }
    // FP8: 16 elements a piece, into the staging area; widen_kv then fills the bf16 tile.
    constexpr int kPiece = FP8 ? 16 : 8;
    // Row r of stage `stage` of the K or V tile a piece is copied to: the bf16 tile itself, or FP8's
    // staging area (unpadded rows of HD bytes).
    auto kv_dst = [&](bool is_v, int stage, int r, int col) -> void* {
        if constexpr (FP8) return (is_v ? V8 : K8) + (stage * KV + r) * HD + col;
        return (is_v ? Vs : Ks) + (stage * KV + r) * P + col;
    };
    auto load_kv = [&](int stage, int p0) {
        const char* kbase = static_cast<const char*>(a.kv.k);
        const char* vbase = static_cast<const char*>(a.kv.v);
        for (int c = tid; c < KV * HD / kPiece; c += kThreads) {
            const int r = c / (HD / kPiece), col = (c % (HD / kPiece)) * kPiece;
            const int p = p0 + r;
            const int64_t row = p < kv_total ? a.kv.pages.row(a.slot, p) : -1;
            const bool ok = row >= 0;  // else zeros (cp.async's zero fill), which masked positions meet
            const size_t off = (((size_t)(ok ? row : 0) * a.n_kv_heads + kvh) * HD + col) * (16 / kPiece);
            ptx::cp_async_16(kv_dst(false, stage, r, col), kbase + off, ok);
            ptx::cp_async_16(kv_dst(true, stage, r, col), vbase + off, ok);
        }
    };
    auto widen_kv = [&](int stage) {
        for (int c = tid; c < KV * HD / kPiece; c += kThreads) {
            const int r = c / (HD / kPiece), col = (c % (HD / kPiece)) * kPiece;
            const uint8_t* src[2] = {K8 + (stage * KV + r) * HD + col, V8 + (stage * KV + r) * HD + col};
            uint16_t* dst[2] = {Ks + (stage * KV + r) * P + col, Vs + (stage * KV + r) * P + col};
#pragma unroll
            for (int kv = 0; kv < 2; ++kv)
                util::widen_e4m3x16<false>(*reinterpret_cast<const uint4*>(src[kv]), reinterpret_cast<uint4*>(dst[kv]));
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
        if constexpr (FP8) widen_kv(stage);  // this thread's own pieces, landed by its wait
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

template <int HD, int KV, bool FP8>
void launch_prefill(const PrefillArgs& a, dim3 grid, cudaStream_t stream) {
    auto kernel = attention_prefill_kernel<HD, KV, FP8>;
    constexpr size_t smem = prefill_smem_bytes<HD, KV, FP8>();
    allow_dynamic_smem(kernel, smem);
    kernel<<<grid, kPreThreads, smem, stream>>>(a);
    CUDA_CHECK_LAUNCH("attention_prefill_kernel");
}


}  // namespace cuda
}  // namespace brrr
