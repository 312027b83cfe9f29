// gemm_sm80.cu — the prefill GEMM on mma.sync (sm_80 and later; on Hopper only for what TMA cannot
// describe): y[m, n] = sum_k x[m, k] * W[n, k], epilogue fused (gemm_common.cuh).
//
//   x [M, K] bf16 row-major, W [N, K] bf16 ([out, in]), fp32 accumulation, any M, N, K.
//
// A CTA of 8 warps (2 x 4, 64 x 32 outputs each) owns a 128 x 128 tile and issues
// mma.sync.m16n8k16. W row-major [N, K] is exactly the "col" B operand of mma, so neither operand
// is transposed. K advances kGemmSm80TileK at a time through a kGemmSm80Stages-deep cp.async
// ring; rows are padded by 8 elements (80 bytes at k step 32) so the eight 16-byte row reads of
// one ldmatrix land in eight different bank groups.
// Tails in M, N and K are zero-filled loads (cp.async with src-size 0) and predicated stores.
// K % 8 != 0 or x / W not 16-byte aligned (VEC = false): shared memory is filled with ordinary
// element loads instead of cp.async (correct, slower).
// SwiGLU: a tile's 128 W rows are 64 gate rows j0.. and the matching up rows H + j0.., interleaved
// in groups of 8 (b_tile_source_row), so each thread holds the gate and up value of its outputs
// and the [M, 2H] intermediate never exists. AddResidual loads a thread's residual values in
// batches before writing any back (add_residual_pairs), so their round trips overlap.
// Invariants: one CTA per output tile, grid (column tiles, row tiles); every output element is
// written once; the ring's empty commit groups keep cp.async.wait_group arithmetic uniform, and
// no copy is pending when the CTA exits.
#include <algorithm>

#include "cuda/check.cuh"
#include "cuda/gemm_common.cuh"
#include "cuda/kernel_util.cuh"
#include "cuda/launch.cuh"
#include "cuda/ops.h"
#include "cuda/ptx.cuh"
#include "cuda/tuning.h"

namespace brrr {
namespace cuda {

namespace {

constexpr int kBM = 128, kBN = 128;  // fixed by the 2 x 4 warp layout of 64 x 32 outputs each
constexpr int kBK = tuning::kGemmSm80TileK, kStages = tuning::kGemmSm80Stages;
constexpr int kThreads = 256;
constexpr int kPitch = kBK + 8;                       // smem row stride in elements (80 bytes)
constexpr int kStageElems = (kBM + kBN) * kPitch;     // A tile then B tile
constexpr size_t kSmemBytes = (size_t)kStages * kStageElems * sizeof(uint16_t);
constexpr int kChunksPerRow = kBK / 8;                // 16-byte chunks per tile row
constexpr int kChunksPerThread = kBM * kChunksPerRow / kThreads;  // per operand per stage
static_assert(kBM == kBN, "one chunk mapping serves both operands");
static_assert(kBM * kChunksPerRow % kThreads == 0, "whole chunks per thread");
static_assert(kBK % 16 == 0, "whole mma k steps per stage");

// The W row feeding row i (0..kBN-1) of the CTA's B tile; -1 when past the end.
template <bool SWIGLU>
__device__ __forceinline__ int b_tile_source_row(const GemmArgs& p, int tile_col0, int i) {
    if (!SWIGLU) {
        const int n = tile_col0 + i;
        return n < p.N ? n : -1;
    }
    const int col = tile_col0 + 8 * (i / 16) + (i % 8);  // output column j
    if (col >= p.width) return -1;
    return (i % 16) < 8 ? col : p.half_n + col;
}

template <bool SWIGLU, bool VEC>
__global__ void __launch_bounds__(kThreads) gemm_sm80_kernel(GemmArgs p) {
    uint16_t* smem = ptx::dynamic_smem<uint16_t>();
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int warp_m = warp >> 2, warp_n = warp & 3;  // 2 x 4 warps of 64 x 32
    const int m0 = blockIdx.y * kBM;
    const int tile_col0 = blockIdx.x * (SWIGLU ? kBN / 2 : kBN);  // first output column

    // This thread's 16-byte chunks of each tile: same (row, k offset) at every K step.
    const uint16_t* xbits = reinterpret_cast<const uint16_t*>(p.x);
    const uint16_t* wbits = reinterpret_cast<const uint16_t*>(p.W);
    const uint16_t* a_src[kChunksPerThread];
    const uint16_t* b_src[kChunksPerThread];
    bool a_ok[kChunksPerThread], b_ok[kChunksPerThread];
    int chunk_off[kChunksPerThread], chunk_k[kChunksPerThread];
#pragma unroll
    for (int i = 0; i < kChunksPerThread; ++i) {
        const int c = tid + i * kThreads;
        const int row = c / kChunksPerRow, kc = (c % kChunksPerRow) * 8;
        chunk_off[i] = row * kPitch + kc;
        chunk_k[i] = kc;
        a_ok[i] = m0 + row < p.M;
        a_src[i] = xbits + (size_t)(a_ok[i] ? m0 + row : 0) * p.K + kc;
        const int wrow = b_tile_source_row<SWIGLU>(p, tile_col0, row);
        b_ok[i] = wrow >= 0;
        b_src[i] = wbits + (size_t)(b_ok[i] ? wrow : 0) * p.K + kc;
    }

    auto load_stage = [&](int stage, int k0) {
        uint16_t* As = smem + stage * kStageElems;
        uint16_t* Bs = As + kBM * kPitch;
#pragma unroll
        for (int i = 0; i < kChunksPerThread; ++i) {
            const int k = k0 + chunk_k[i];
            if (VEC) {
                // K % 8 == 0 here, so a chunk is either entirely inside K or entirely past it.
                const bool a_in = a_ok[i] && k < p.K, b_in = b_ok[i] && k < p.K;
                ptx::cp_async_16(As + chunk_off[i], a_in ? a_src[i] + k0 : xbits, a_in);
                ptx::cp_async_16(Bs + chunk_off[i], b_in ? b_src[i] + k0 : wbits, b_in);
            } else {
                uint32_t a_words[4], b_words[4];
#pragma unroll
                for (int e = 0; e < 8; e += 2) {
                    const bool in0 = k + e < p.K, in1 = k + e + 1 < p.K;
                    const uint32_t a0 = a_ok[i] && in0 ? a_src[i][k0 + e] : 0u;
                    const uint32_t a1 = a_ok[i] && in1 ? a_src[i][k0 + e + 1] : 0u;
                    const uint32_t b0 = b_ok[i] && in0 ? b_src[i][k0 + e] : 0u;
                    const uint32_t b1 = b_ok[i] && in1 ? b_src[i][k0 + e + 1] : 0u;
                    a_words[e / 2] = a0 | (a1 << 16);
                    b_words[e / 2] = b0 | (b1 << 16);
                }
                *reinterpret_cast<uint4*>(As + chunk_off[i]) =
                    make_uint4(a_words[0], a_words[1], a_words[2], a_words[3]);
                *reinterpret_cast<uint4*>(Bs + chunk_off[i]) =
                    make_uint4(b_words[0], b_words[1], b_words[2], b_words[3]);
            }
        }
    };

    float acc[4][4][4];
#pragma unroll
    for (int mi = 0; mi < 4; ++mi)
#pragma unroll
        for (int ni = 0; ni < 4; ++ni)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[mi][ni][e] = 0.f;

    const int k_tiles = CEIL_DIV(p.K, kBK);
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
        if (s < k_tiles) load_stage(s, s * kBK);
        ptx::cp_async_commit();  // empty groups keep the wait arithmetic uniform
    }

    for (int kt = 0; kt < k_tiles; ++kt) {
        ptx::cp_async_wait<kStages - 2>();  // this thread's part of tile kt has landed
        __syncthreads();                     // everyone's part has; stage (kt - 1) is free
        const int next = kt + kStages - 1;
        if (next < k_tiles) load_stage(next % kStages, next * kBK);
        ptx::cp_async_commit();

        const uint16_t* As = smem + (kt % kStages) * kStageElems;
        const uint16_t* Bs = As + kBM * kPitch;
#pragma unroll
        for (int kk = 0; kk < kBK; kk += 16) {
            uint32_t a[4][4], b[4][2];
#pragma unroll
            for (int mi = 0; mi < 4; ++mi) {
                const int row = warp_m * 64 + mi * 16 + (lane & 15);
                ptx::ldmatrix_x4(a[mi], As + row * kPitch + kk + (lane >> 4) * 8);
            }
#pragma unroll
            for (int nj = 0; nj < 2; ++nj) {
                // Matrices: (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, k 0-7), (n 8-15, k 8-15).
                const int row = warp_n * 32 + nj * 16 + (lane >> 4) * 8 + (lane & 7);
                uint32_t r[4];
                ptx::ldmatrix_x4(r, Bs + row * kPitch + kk + ((lane >> 3) & 1) * 8);
                b[2 * nj][0] = r[0];
                b[2 * nj][1] = r[1];
                b[2 * nj + 1][0] = r[2];
                b[2 * nj + 1][1] = r[3];
            }
#pragma unroll
            for (int mi = 0; mi < 4; ++mi)
#pragma unroll
                for (int ni = 0; ni < 4; ++ni) ptx::mma_bf16_16816(acc[mi][ni], a[mi], b[ni]);
        }
    }
    ptx::cp_async_wait<0>();  // no copy may still target shared memory when the CTA exits

    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int mi = 0; mi < 4; ++mi) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int row = m0 + warp_m * 64 + mi * 16 + g + 8 * h;
            if (SWIGLU) {
#pragma unroll
                for (int pr = 0; pr < 2; ++pr) {
                    const int col = tile_col0 + warp_n * 16 + pr * 8 + 2 * t;
                    const float* gate = acc[mi][2 * pr] + 2 * h;
                    const float* up = acc[mi][2 * pr + 1] + 2 * h;
                    store_swiglu_pair(p, row, col, gate[0], up[0], gate[1], up[1]);
                }
            } else if (p.ep == Epilogue::AddResidual) {
                float2 y[4];
#pragma unroll
                for (int ni = 0; ni < 4; ++ni) y[ni] = make_float2(acc[mi][ni][2 * h], acc[mi][ni][2 * h + 1]);
                add_residual_pairs(p, row, tile_col0 + warp_n * 32 + 2 * t, y);
            } else {
#pragma unroll
                for (int ni = 0; ni < 4; ++ni) {
                    const int col = tile_col0 + warp_n * 32 + ni * 8 + 2 * t;
                    store_pair(p, row, col, acc[mi][ni][2 * h], acc[mi][ni][2 * h + 1]);
                }
            }
        }
    }
}

template <bool SWIGLU, bool VEC>
void launch_sm80_kernel(const GemmArgs& p, cudaStream_t stream) {
    auto kernel = gemm_sm80_kernel<SWIGLU, VEC>;
    allow_dynamic_smem(kernel, kSmemBytes);  // over the 48 KB default
    const dim3 grid(CEIL_DIV(p.width, SWIGLU ? kBN / 2 : kBN), CEIL_DIV(p.M, kBM));
    kernel<<<grid, kThreads, kSmemBytes, stream>>>(p);
    CUDA_CHECK_LAUNCH("gemm_sm80_kernel");
}

}  // namespace

void gemm_sm80(const GemmArgs& p, cudaStream_t stream) {
    BRRR_CHECK(CEIL_DIV(p.M, kBM) <= 65535, "gemm_bf16: M=" << p.M << " rows exceed the grid limit of "
                                                              << 65535 * kBM);
    const bool vec = p.K % 8 == 0 && util::aligned_to(p.x, 16) && util::aligned_to(p.W, 16);
    const bool swiglu = p.ep == Epilogue::SwiGLU;
    if (swiglu) {
        if (vec) launch_sm80_kernel<true, true>(p, stream);
        else launch_sm80_kernel<true, false>(p, stream);
    } else {
        if (vec) launch_sm80_kernel<false, true>(p, stream);
        else launch_sm80_kernel<false, false>(p, stream);
    }
}

}  // namespace cuda
}  // namespace brrr
