// matmul.cpp — Y[M, N] = X[M, K] · W[N, K]^T with fp32 X, fp32 or bf16 W, fp32 accumulation.
//
// Both operands are K-contiguous, so every output is a dot product of two rows. The work unit
// is a register tile: MR rows of X against NR rows of W, MR*NR vector accumulators, one pass over
// K that loads each X and W vector once and feeds it to NR (resp. MR) FMAs.
//
// Decode (M <= 8: one row per sequence) is memory-bound: W must be streamed exactly once at full
// bandwidth. Tiles of 8 W rows keep eight independent sequential streams (and FMA chains) in
// flight, X rows pass over a tile two at a time while it sits in cache, and each tile prefetches
// the next one into L2 (bf16 rows of K = 576 are 18 lines, too short for the hardware
// prefetcher: +50% on bf16, see benchmarks/lab/cpu_gemv_01_prefetch.cpp). The threads split N into
// contiguous ranges so each core streams its own part of W.
// Prefill (M > 8) is compute-bound: 4x4 tiles, and each thread owns a block of W rows small
// enough to stay in its L2 while all M rows of X pass over it, so W leaves memory once per call
// rather than once per token.
#include <omp.h>

#include <algorithm>

#include "cpu/kernels.h"
#include "cpu/simd.h"

namespace brrr {
namespace cpu {
namespace {

// Y[i, j] (+)= X[i, :] · W[j, :] for i < MR, j < NR; X rows K apart, Y rows ldy apart.
// With `prefetch`, each K step also asks for `lines_per_step` cache lines of that region (the
// next tile's weights) into L2.
template <int MR, int NR, typename WT>
void tile(const float* X, const WT* W, float* Y, int K, int ldy, bool accumulate,
          const char* prefetch, int lines_per_step) {
    vfloat acc[MR][NR];
    for (int i = 0; i < MR; ++i)
        for (int j = 0; j < NR; ++j) acc[i][j] = vzero();
    int k = 0;
    for (; k + kLanes <= K; k += kLanes) {
        if (prefetch) {
            for (int p = 0; p < lines_per_step; ++p) prefetch_l2(prefetch + (size_t)p * 64);
            prefetch += (size_t)lines_per_step * 64;
        }
        vfloat w[NR];
        for (int j = 0; j < NR; ++j) w[j] = vload(W + (size_t)j * K + k);
        for (int i = 0; i < MR; ++i) {
            vfloat x = vload(X + (size_t)i * K + k);
            for (int j = 0; j < NR; ++j) acc[i][j] = vfma(x, w[j], acc[i][j]);
        }
    }
    for (int i = 0; i < MR; ++i) {
        for (int j = 0; j < NR; ++j) {
            float s = vsum(acc[i][j]);
            for (int kk = k; kk < K; ++kk)
                s += X[(size_t)i * K + kk] * load_scalar(W + (size_t)j * K + kk);
            float& y = Y[(size_t)i * ldy + j];
            y = accumulate ? y + s : s;
        }
    }
}

// Runtime (mr, nr) -> the compiled tile; mr <= MaxMR, nr <= MaxNR.
template <int MR, int MaxNR, typename WT>
void tile_nr(int nr, const float* X, const WT* W, float* Y, int K, int ldy, bool accumulate,
             const char* prefetch, int lines_per_step) {
    if constexpr (MaxNR >= 1) {
        if (nr == MaxNR)
            return tile<MR, MaxNR>(X, W, Y, K, ldy, accumulate, prefetch, lines_per_step);
        tile_nr<MR, MaxNR - 1>(nr, X, W, Y, K, ldy, accumulate, prefetch, lines_per_step);
    }
}
template <int MaxMR, int MaxNR, typename WT>
void tile_any(int mr, int nr, const float* X, const WT* W, float* Y, int K, int ldy,
              bool accumulate, const char* prefetch = nullptr, int lines_per_step = 0) {
    if constexpr (MaxMR >= 1) {
        if (mr == MaxMR)
            return tile_nr<MaxMR, MaxNR>(nr, X, W, Y, K, ldy, accumulate, prefetch, lines_per_step);
        tile_any<MaxMR - 1, MaxNR>(mr, nr, X, W, Y, K, ldy, accumulate, prefetch, lines_per_step);
    }
}

constexpr int kGemvMaxM = 8;   // up to this many X rows (a decode batch) take the GEMV path
constexpr int kGemvRows = 8;   // W rows per decode tile
constexpr int kGemmMR = 4;     // X rows per prefill tile
constexpr int kGemmNR = 4;     // W rows per prefill tile
constexpr int kL2Budget = 256 * 1024;  // bytes of W one prefill block may keep in L2

template <typename WT>
void gemv(const float* X, const WT* W, float* Y, int M, int N, int K, int ldy, bool accumulate) {
    const int n_tiles = CEIL_DIV(N, kGemvRows);
    // The next tile (the rows right after this one) is fetched into L2 over this tile's K loop:
    // the hardware prefetcher alone ramps up too slowly on rows this short.
    const size_t tile_lines = CEIL_DIV((size_t)kGemvRows * K * sizeof(WT), (size_t)64);
    const int lines_per_step = (int)CEIL_DIV(tile_lines, (size_t)std::max(1, K / kLanes));
#pragma omp parallel for schedule(static)
    for (int t = 0; t < n_tiles; ++t) {
        const int n0 = t * kGemvRows;
        const int nr = std::min(kGemvRows, N - n0);
        const WT* rows = W + (size_t)n0 * K;
        const char* next = t + 1 < n_tiles ? reinterpret_cast<const char*>(rows + (size_t)nr * K) : nullptr;
        // Rows of X two at a time; the W tile is still in cache after the first pair.
        for (int m0 = 0; m0 < M; m0 += 2) {
            tile_any<2, kGemvRows>(std::min(2, M - m0), nr, X + (size_t)m0 * K, rows,
                                   Y + (size_t)m0 * ldy + n0, K, ldy, accumulate,
                                   m0 == 0 ? next : nullptr, lines_per_step);
        }
    }
}

template <typename WT>
void gemm(const float* X, const WT* W, float* Y, int M, int N, int K, int ldy, bool accumulate) {
    int block_rows = kL2Budget / (int)(sizeof(WT) * std::max(K, 1));
    block_rows = std::max(kGemmNR, std::min(64, block_rows / kGemmNR * kGemmNR));
    const int n_blocks = CEIL_DIV(N, block_rows);
#pragma omp parallel for schedule(dynamic, 1)
    for (int b = 0; b < n_blocks; ++b) {
        const int n_begin = b * block_rows, n_end = std::min(N, n_begin + block_rows);
        for (int m0 = 0; m0 < M; m0 += kGemmMR) {
            const int mr = std::min(kGemmMR, M - m0);
            for (int n0 = n_begin; n0 < n_end; n0 += kGemmNR) {
                const int nr = std::min(kGemmNR, n_end - n0);
                tile_any<kGemmMR, kGemmNR>(mr, nr, X + (size_t)m0 * K, W + (size_t)n0 * K,
                                           Y + (size_t)m0 * ldy + n0, K, ldy, accumulate);
            }
        }
    }
}

template <typename WT>
void matmul_typed(const float* X, const WT* W, float* Y, int M, int N, int K, int ldy, bool accumulate) {
    if (M <= kGemvMaxM)
        gemv(X, W, Y, M, N, K, ldy, accumulate);
    else
        gemm(X, W, Y, M, N, K, ldy, accumulate);
}

}  // namespace

void matmul(const float* X, const void* W, DType w_dtype, float* Y, int M, int N, int K, int ldy,
            bool accumulate) {
    BRRR_CHECK(M >= 0 && N >= 0 && K >= 0 && ldy >= N,
               "matmul: bad sizes M=" << M << " N=" << N << " K=" << K << " ldy=" << ldy);
    if (M == 0 || N == 0) return;
    switch (w_dtype) {
        case DType::F32:
            return matmul_typed(X, static_cast<const float*>(W), Y, M, N, K, ldy, accumulate);
        case DType::BF16:
            return matmul_typed(X, static_cast<const uint16_t*>(W), Y, M, N, K, ldy, accumulate);
        default:
            BRRR_FAIL("matmul: weight dtype " << dtype_name(w_dtype) << " is not supported on the "
                      "CPU (use f32 or bf16)");
    }
}

}  // namespace cpu
}  // namespace brrr
