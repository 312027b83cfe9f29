// gemv.cu — decode matmuls: y[m, n] = sum_k x[m, k] * W[n, k] for M <= 16 rows, epilogue fused.
//
//   x [M, K] bf16, W [N, K] bf16 ([out, in], row-major), fp32 accumulation, y handled per Epilogue.
//
// At batch 1 every weight byte is used exactly once, so the kernel is a memory stream: its time is
// bytes / HBM bandwidth and everything here is about keeping enough 16-byte loads in flight.
//   * Each warp owns a few output columns ("units") and streams their W rows end to end with
//     16-byte loads (8 bf16 per lane, 512 contiguous bytes per warp instruction), about eight
//     loads per lane issued before any math consumes them, bypassing L1.
//   * x (all M rows) is staged in shared memory once per CTA, in K chunks that stay small at
//     M = 16. One x vector read from shared memory feeds every row the warp streams, which is why
//     warps own more rows as M grows: otherwise shared-memory bandwidth, not HBM, would bind.
//   * fp32 accumulators per (m, row) live in registers (M is a template parameter); a butterfly
//     shuffle reduces them across the warp and the epilogue runs on the reduced values.
//   * SwiGLU: a unit is the pair of w13 rows (gate j, up H + j), so silu(g) * u is formed in
//     registers and only [M, H] bf16 leaves the chip.
// K % 8 != 0 or x / W not 16-byte aligned selects a scalar-load variant of the same kernel:
// correct, slower; real model shapes always take the vector path (decided at the launcher).
#include <algorithm>

#include "cuda/check.cuh"
#include "cuda/kernel_util.cuh"
#include "cuda/ops.h"
#include "cuda/ptx.cuh"

namespace brrr {
namespace cuda {

namespace {

constexpr int kMaxRows = 16;             // largest M this kernel takes (the contract in ops.h)
constexpr int kWarps = 4;                // 128 threads: many small CTAs fill the SMs evenly
constexpr int kXChunkBytes = 32 * 1024;  // x slice (all M rows) held in shared memory at once

// Output columns per warp. More columns per warp = more W rows per shared-memory x read.
constexpr int units_per_warp(int M, bool swiglu) {
    return swiglu ? (M >= 4 ? 2 : 1) : (M >= 4 ? 4 : M >= 2 ? 2 : 1);
}

// One CTA: WARPS warps x UNITS output columns each. n_units = output width (N, or H for
// SwiGLU whose up rows start at half_n = H). chunk = x elements per row staged per K step.
template <int M, int UNITS, int WARPS, bool SWIGLU, bool VEC>
__global__ void __launch_bounds__(WARPS * 32)
gemv_kernel(const bf16* __restrict__ x, const bf16* __restrict__ W, int n_units, int half_n, int K,
            int chunk, Epilogue ep, EpilogueArgs args) {
    constexpr int kThreads = WARPS * 32;
    constexpr int R = SWIGLU ? 2 * UNITS : UNITS;  // W rows streamed together
    constexpr int U = R >= 8 ? 1 : 8 / R;          // loads per row in flight: R * U = 8 per lane

    uint16_t* xs = ptx::dynamic_smem<uint16_t>();  // [M][chunk] bf16 bits
    const uint16_t* xbits = reinterpret_cast<const uint16_t*>(x);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int unit0 = (blockIdx.x * WARPS + warp) * UNITS;

    // Columns past the end keep a valid row pointer (row 0) but never load or store.
    const uint16_t* rows[R];
    bool row_ok[R];
#pragma unroll
    for (int u = 0; u < UNITS; ++u) {
        const int col = unit0 + u;
        const bool ok = col < n_units;
        const size_t c = ok ? (size_t)col : 0;
        const uint16_t* wbits = reinterpret_cast<const uint16_t*>(W);
        if (SWIGLU) {
            rows[2 * u] = wbits + c * K;
            rows[2 * u + 1] = wbits + (c + (ok ? half_n : 0)) * K;
            row_ok[2 * u] = row_ok[2 * u + 1] = ok;
        } else {
            rows[u] = wbits + c * K;
            row_ok[u] = ok;
        }
    }

    float acc[M][R];
#pragma unroll
    for (int m = 0; m < M; ++m)
#pragma unroll
        for (int r = 0; r < R; ++r) acc[m][r] = 0.f;

    for (int k0 = 0; k0 < K; k0 += chunk) {
        const int len = min(chunk, K - k0);
        __syncthreads();  // every warp is done with the previous chunk of xs
        if (VEC) {
            const int n8 = len / 8;
            for (int i = threadIdx.x; i < M * n8; i += kThreads) {
                const int m = i / n8, v = i - m * n8;
                reinterpret_cast<uint4*>(xs + (size_t)m * chunk)[v] =
                    __ldg(reinterpret_cast<const uint4*>(xbits + (size_t)m * K + k0) + v);
            }
        } else {
            for (int i = threadIdx.x; i < M * len; i += kThreads) {
                const int m = i / len, k = i - m * len;
                xs[(size_t)m * chunk + k] = __ldg(xbits + (size_t)m * K + k0 + k);
            }
        }
        __syncthreads();

        if (VEC) {
            const int n8 = len / 8;
            const uint4* xs8 = reinterpret_cast<const uint4*>(xs);
            const int chunk8 = chunk / 8;
            for (int v0 = lane; v0 < n8; v0 += 32 * U) {
                uint4 w[R][U];
#pragma unroll
                for (int u = 0; u < U; ++u) {
                    const int v = v0 + 32 * u;
#pragma unroll
                    for (int r = 0; r < R; ++r)
                        w[r][u] = (v < n8 && row_ok[r]) ? ptx::ld_stream_16(rows[r] + k0 + 8 * v)
                                                        : make_uint4(0u, 0u, 0u, 0u);
                }
#pragma unroll
                for (int u = 0; u < U; ++u) {
                    const int v = v0 + 32 * u;
                    if (v < n8) {
#pragma unroll
                        for (int m = 0; m < M; ++m) {
                            const uint4 xv = xs8[m * chunk8 + v];
#pragma unroll
                            for (int r = 0; r < R; ++r) acc[m][r] = util::dot8_bf16(w[r][u], xv, acc[m][r]);
                        }
                    }
                }
            }
        } else {
            for (int k = lane; k < len; k += 32 * U) {
                float w[R][U];
#pragma unroll
                for (int u = 0; u < U; ++u) {
                    const int kk = k + 32 * u;
#pragma unroll
                    for (int r = 0; r < R; ++r)
                        w[r][u] = (kk < len && row_ok[r]) ? util::bf16_bits(__ldg(rows[r] + k0 + kk)) : 0.f;
                }
#pragma unroll
                for (int u = 0; u < U; ++u) {
                    const int kk = k + 32 * u;
                    if (kk < len) {
#pragma unroll
                        for (int m = 0; m < M; ++m) {
                            const float xv = util::bf16_bits(xs[(size_t)m * chunk + kk]);
#pragma unroll
                            for (int r = 0; r < R; ++r) acc[m][r] = fmaf(w[r][u], xv, acc[m][r]);
                        }
                    }
                }
            }
        }
    }

#pragma unroll
    for (int m = 0; m < M; ++m)
#pragma unroll
        for (int r = 0; r < R; ++r) acc[m][r] = util::warp_sum(acc[m][r]);

    // Every lane holds every sum; spread the stores over the lanes.
#pragma unroll
    for (int m = 0; m < M; ++m) {
#pragma unroll
        for (int u = 0; u < UNITS; ++u) {
            const int col = unit0 + u;
            if (lane == (m * UNITS + u) % 32 && col < n_units) {
                const size_t idx = (size_t)m * args.ld_out + col;
                if (SWIGLU) {
                    util::store_swiglu(args, idx, acc[m][2 * u], acc[m][2 * u + 1]);
                } else {
                    util::store_result(ep, args, idx, acc[m][u]);
                }
            }
        }
    }
}

template <int M, bool SWIGLU, bool VEC>
void launch_variant(const bf16* x, const bf16* W, int width, int half_n, int K, int chunk,
                    Epilogue ep, const EpilogueArgs& args, cudaStream_t stream) {
    constexpr int units = units_per_warp(M, SWIGLU);
    const int blocks = CEIL_DIV(width, kWarps * units);
    const size_t smem = (size_t)M * chunk * sizeof(uint16_t);
    auto kernel = gemv_kernel<M, units, kWarps, SWIGLU, VEC>;
    kernel<<<blocks, kWarps * 32, smem, stream>>>(x, W, width, half_n, K, chunk, ep, args);
    CUDA_CHECK_LAUNCH("gemv_kernel");
}

// Runtime M -> template M (1..kMaxRows).
template <int M>
void launch_rows(int rows, bool swiglu, bool vec, const bf16* x, const bf16* W, int width,
                 int half_n, int K, int chunk, Epilogue ep, const EpilogueArgs& args,
                 cudaStream_t stream) {
    if (rows != M) {
        if constexpr (M < kMaxRows)
            launch_rows<M + 1>(rows, swiglu, vec, x, W, width, half_n, K, chunk, ep, args, stream);
        return;
    }
    if (swiglu) {
        if (vec) launch_variant<M, true, true>(x, W, width, half_n, K, chunk, ep, args, stream);
        else launch_variant<M, true, false>(x, W, width, half_n, K, chunk, ep, args, stream);
    } else {
        if (vec) launch_variant<M, false, true>(x, W, width, half_n, K, chunk, ep, args, stream);
        else launch_variant<M, false, false>(x, W, width, half_n, K, chunk, ep, args, stream);
    }
}

}  // namespace

void gemv_bf16(const bf16* x, const bf16* W, int M, int N, int K, Epilogue ep,
               const EpilogueArgs& args_in, cudaStream_t stream) {
    EpilogueArgs args = args_in;
    const int width = util::check_matmul("gemv_bf16", x, W, M, N, K, ep, args);
    BRRR_CHECK(M <= kMaxRows, "gemv_bf16: M=" << M << " rows; the GEMV takes at most " << kMaxRows
                                              << " (use matmul_bf16 or gemm_bf16)");
    if (M == 0) return;
    const bool vec = K % 8 == 0 && util::aligned_to(x, 16) && util::aligned_to(W, 16);
    // Whole rows of x when they fit, else the largest multiple of 256 (one warp-wide vector step).
    const int max_elems = kXChunkBytes / (int)(sizeof(uint16_t) * M);
    const int chunk = K <= max_elems ? K : max_elems / 256 * 256;
    const bool swiglu = ep == Epilogue::SwiGLU;
    launch_rows<1>(M, swiglu, vec, x, W, width, N / 2, K, chunk, ep, args, stream);
}

}  // namespace cuda
}  // namespace brrr
