// gemm.cu — prefill matmuls on tensor cores: y[m, n] = sum_k x[m, k] * W[n, k], epilogue fused.
//
//   x [M, K] bf16 (row-major), W [N, K] bf16 ([out, in]), fp32 accumulation, any M, N, K.
//
// A CTA computes a 128 x 128 tile of y with 8 warps (2 x 4, 64 x 32 each) issuing
// mma.sync.m16n8k16 (bf16 in, fp32 accumulate). W row-major [N, K] is exactly the "col" B operand
// of mma, so neither operand is transposed. K advances 32 at a time through a 3-stage cp.async
// ring in shared memory; rows are padded to 40 elements (80 bytes) so the eight 16-byte row reads
// of one ldmatrix land in eight different bank groups. Tails in M, N and K are zero-filled loads
// (cp.async with src-size 0) and predicated stores, so any shape is exact.
//
// SwiGLU trick: the CTA's 128 W rows are 64 gate rows j0..j0+63 and the 64 matching up rows
// H+j0..H+j0+63, interleaved in groups of 8 (gate 8, up 8, gate 8, ...). Each warp's n-fragments
// then come in (gate, up) pairs holding the same output columns in the same registers, so
// silu(gate) * up is formed in registers and the [M, 2H] intermediate never exists.
//
// K % 8 != 0 or x / W not 16-byte aligned: the same kernel fills shared memory with ordinary
// element loads instead of cp.async (correct, slower; real shapes never need it).
//
// matmul_bf16 picks the GEMV (gemv.cu) for M <= kGemvMaxRows, this kernel above.
#include <algorithm>

#include "cuda/check.cuh"
#include "cuda/kernel_util.cuh"
#include "cuda/ops.h"
#include "cuda/ptx.cuh"

namespace brrr {
namespace cuda {

namespace {

// Largest M that goes to the GEMV. 16 is the GEMV's limit; the break-even against this kernel is
// to be measured on the H100 (benchmarks/bench_kernels_cuda.py prints both sides at M = 16).
constexpr int kGemvMaxRows = 16;

constexpr int kBM = 128, kBN = 128, kBK = 32, kStages = 3;
constexpr int kThreads = 256;
constexpr int kPitch = kBK + 8;                       // smem row stride in elements (80 bytes)
constexpr int kStageElems = (kBM + kBN) * kPitch;     // A tile then B tile
constexpr size_t kSmemBytes = (size_t)kStages * kStageElems * sizeof(uint16_t);
constexpr int kChunksPerRow = kBK / 8;                // 16-byte chunks per tile row
constexpr int kChunksPerThread = kBM * kChunksPerRow / kThreads;  // per operand per stage
static_assert(kBM == kBN, "one chunk mapping serves both operands");
static_assert(kBM * kChunksPerRow % kThreads == 0, "whole chunks per thread");

struct GemmArgs {
    const bf16* x;
    const bf16* W;
    int M, N, K;
    int width;   // output columns: N, or H = N / 2 for SwiGLU
    int half_n;  // H: first up row of w13 (SwiGLU only)
    bool pair_stores;  // two adjacent outputs may be written as one 4- or 8-byte store
    Epilogue ep;
    EpilogueArgs out;
};

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

// Two adjacent results (row, col) and (row, col + 1) of a plain epilogue.
__device__ __forceinline__ void store_pair(const GemmArgs& p, int row, int col, float v0, float v1) {
    if (row >= p.M || col >= p.width) return;
    const size_t idx = (size_t)row * p.out.ld_out + col;
    if (p.pair_stores && col + 1 < p.width) {
        if (p.ep == Epilogue::StoreBf16) {
            *reinterpret_cast<uint32_t*>(p.out.out_bf16 + idx) = util::pack_bf16x2(v0, v1);
        } else if (p.ep == Epilogue::StoreF32) {
            *reinterpret_cast<float2*>(p.out.out_f32 + idx) = make_float2(v0, v1);
        } else {
            float2* r = reinterpret_cast<float2*>(p.out.residual + idx);
            float2 acc = *r;
            acc.x += v0;
            acc.y += v1;
            *r = acc;
        }
        return;
    }
    util::store_result(p.ep, p.out, idx, v0);
    if (col + 1 < p.width) util::store_result(p.ep, p.out, idx + 1, v1);
}

__device__ __forceinline__ void store_swiglu_pair(const GemmArgs& p, int row, int col, float g0,
                                                  float u0, float g1, float u1) {
    if (row >= p.M || col >= p.width) return;
    const size_t idx = (size_t)row * p.out.ld_out + col;
    if (p.pair_stores && col + 1 < p.width) {
        *reinterpret_cast<uint32_t*>(p.out.out_bf16 + idx) =
            util::pack_bf16x2(util::silu(g0) * u0, util::silu(g1) * u1);
        return;
    }
    util::store_swiglu(p.out, idx, g0, u0);
    if (col + 1 < p.width) util::store_swiglu(p.out, idx + 1, g1, u1);
}

template <bool SWIGLU, bool VEC>
__global__ void __launch_bounds__(kThreads) gemm_kernel(GemmArgs p) {
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
void launch_gemm(const GemmArgs& p, cudaStream_t stream) {
    auto kernel = gemm_kernel<SWIGLU, VEC>;
    // Over the 48 KB default: opt in (per device and cheap, so simply on every launch).
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)kSmemBytes));
    const dim3 grid(CEIL_DIV(p.width, SWIGLU ? kBN / 2 : kBN), CEIL_DIV(p.M, kBM));
    kernel<<<grid, kThreads, kSmemBytes, stream>>>(p);
    CUDA_CHECK_LAUNCH("gemm_kernel");
}

}  // namespace

void gemm_bf16(const bf16* x, const bf16* W, int M, int N, int K, Epilogue ep,
               const EpilogueArgs& args, cudaStream_t stream) {
    GemmArgs p;
    p.out = args;
    p.width = util::check_matmul("gemm_bf16", x, W, M, N, K, ep, p.out);
    if (M == 0) return;
    BRRR_CHECK(CEIL_DIV(M, kBM) <= 65535, "gemm_bf16: M=" << M << " rows exceed the grid limit of "
                                                            << 65535 * kBM);
    p.x = x;
    p.W = W;
    p.M = M;
    p.N = N;
    p.K = K;
    p.half_n = N / 2;
    p.ep = ep;
    const bool even_ld = p.out.ld_out % 2 == 0;
    switch (ep) {
        case Epilogue::StoreBf16:
        case Epilogue::SwiGLU: p.pair_stores = even_ld && util::aligned_to(p.out.out_bf16, 4); break;
        case Epilogue::StoreF32: p.pair_stores = even_ld && util::aligned_to(p.out.out_f32, 8); break;
        case Epilogue::AddResidual: p.pair_stores = even_ld && util::aligned_to(p.out.residual, 8); break;
    }
    const bool vec = K % 8 == 0 && util::aligned_to(x, 16) && util::aligned_to(W, 16);
    const bool swiglu = ep == Epilogue::SwiGLU;
    if (swiglu) {
        if (vec) launch_gemm<true, true>(p, stream);
        else launch_gemm<true, false>(p, stream);
    } else {
        if (vec) launch_gemm<false, true>(p, stream);
        else launch_gemm<false, false>(p, stream);
    }
}

void matmul_bf16(const bf16* x, const bf16* W, int M, int N, int K, Epilogue ep,
                 const EpilogueArgs& args, cudaStream_t stream) {
    if (M <= kGemvMaxRows) {
        gemv_bf16(x, W, M, N, K, ep, args, stream);
    } else {
        gemm_bf16(x, W, M, N, K, ep, args, stream);
    }
}

}  // namespace cuda
}  // namespace brrr
