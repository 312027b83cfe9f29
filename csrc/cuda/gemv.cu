// gemv.cu — decode matmuls: y[m, n] = sum_k x[m, k] * W[n, k] for M <= 16 rows, with the input
// RMSNorm and the epilogue fused.
//
//   x [M, K] bf16, or the fp32 residual stream normalized on the fly (rmsnorm_matmul_bf16);
//   W [N, K] bf16 ([out, in], row-major), fp32 accumulation, y handled per Epilogue.
//
// At batch 1 every weight byte is used once, so the kernel is a memory stream: its time is
// bytes / HBM bandwidth, and the design keeps enough 16-byte loads in flight and loses no time
// between kernels. Two forms share the contract (GemvPath in ops.h): the CUDA-core kernel, which
// takes M < tuning::kGemvTensorCoreMinRows, and the tensor-core kernel (mma.sync with W as the A
// operand) from there on, where the CUDA cores' FMAs, not HBM, would bind.
// The CUDA-core kernel:
//   * A warp owns a few output columns ("units") and streams their W rows end to end with 16-byte
//     loads that bypass L1 (512 contiguous bytes per warp instruction), tuning::kGemvLoads per
//     lane in flight, tuning::kGemvM1Loads at M = 1 where the grid still fits the GPU at once.
//   * Launched with PDL (launch.cuh): it lets the next kernel launch before its own wait, and
//     issues the first step's W loads before that wait (weights never depend on the kernel
//     before), so the weight stream starts while the previous kernel drains.
//   * x (all M rows) is staged in shared memory once per CTA, in K chunks (cp.async for plain
//     rows); one x vector read from shared memory feeds every W row the warp streams, which is why
//     warps own more units as M grows. AddResidual reads its residual right after the wait.
//   * Fused RMSNorm: each CTA reduces sum(x^2) of its rows in a fixed order (so a row's result does
//     not depend on M) and stages bf16(x * rstd * norm_w), what rmsnorm_residual would have written.
//   * Paired units: SwiGLU streams gate row j with up row H + j, RopeKV dim i with dim i + hd/2 of
//     one head, so the pair meets in registers and only the epilogue's output leaves the chip.
// Invariants: a row's accumulation order never depends on the other rows; K % 8 != 0 or
// unaligned x / W select a scalar-load instance of the same kernel (correct, slower).
// Measured alternatives and why they lost: docs/kernels/gemv.md.
#include <algorithm>

#include "cuda/check.cuh"
#include "cuda/kernel_util.cuh"
#include "cuda/launch.cuh"
#include "cuda/ops.h"
#include "cuda/ptx.cuh"
#include "cuda/tuning.h"

namespace brrr {
namespace cuda {

namespace {

constexpr int kMaxRows = 16;             // largest M this kernel takes (the contract in ops.h)
constexpr int kWarps = 4;                // 128 threads: many small CTAs fill the SMs evenly
constexpr int kThreads = kWarps * 32;
constexpr int kXChunkBytes = 32 * 1024;  // x slice (all M rows) held in shared memory at once

using util::Pairing;
using util::unit_rows;

// Output columns per warp. More columns per warp = more W rows per shared-memory x read.
constexpr int units_per_warp(int M, Pairing pairing) {
    return pairing != Pairing::None ? (M >= 4 ? 2 : 1) : (M >= 4 ? 4 : M >= 2 ? 2 : 1);
}

struct GemvArgs {
    const bf16* x;        // [M, K] bf16 (NORM = false)
    const float* x_f32;   // [M, K] fp32 residual stream (NORM = true)
    const bf16* norm_w;   // [K] (NORM = true)
    float eps;
    const bf16* W;        // [N, K]
    int n_units;          // output columns, or pairs
    int half_n;           // SwiGLU: offset of the up rows (H); Rope: head_dim / 2
    int M;                // rows of x (the tensor-core kernel; the CUDA-core one has it as a template argument)
    int K, chunk;         // chunk = x elements per row staged per K step
    bool norm_in_smem;    // NORM, whole long rows: x and norm_w copied into shared memory first
    Epilogue ep;
    EpilogueArgs out;
};

// rstd[m] = rsqrt(mean(x[m, :]^2) + eps) for the M rows, into shared memory. Thread t sums the
// 4-float chunks t, t + kThreads, ... of a row; warps are then added in order: a fixed order per
// row, whatever M is.
template <int M, bool VEC>
__device__ void row_rstd(const float* __restrict__ x, int K, float eps, float* rstd) {
    __shared__ float warp_sums[kWarps][M];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float sum[M];
#pragma unroll
    for (int m = 0; m < M; ++m) {
        sum[m] = 0.f;
        if (VEC) {
            const float4* row = reinterpret_cast<const float4*>(x + (size_t)m * K);
            for (int i = threadIdx.x; i < K / 4; i += kThreads) {
                const float4 v = row[i];
                sum[m] += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
            }
        } else {
            for (int k = threadIdx.x; k < K; k += kThreads) sum[m] += x[(size_t)m * K + k] * x[(size_t)m * K + k];
        }
        sum[m] = util::warp_sum(sum[m]);
    }
    if (lane == 0) {
#pragma unroll
        for (int m = 0; m < M; ++m) warp_sums[warp][m] = sum[m];
    }
    __syncthreads();
    if (threadIdx.x < M) {
        float total = 0.f;
#pragma unroll
        for (int w = 0; w < kWarps; ++w) total += warp_sums[w][threadIdx.x];
        rstd[threadIdx.x] = rsqrtf(total / (float)K + eps);
    }
    // The chunk loop starts with a barrier, which publishes rstd.
}

// Eight consecutive normalized x values of row m from k, as the bf16 the matmul consumes:
// bf16(x * rstd * w) exactly as rmsnorm_residual rounds it.
// x_f32 / norm_w: the arguments' arrays, or their shared-memory copies (GemvArgs::norm_in_smem).
__device__ __forceinline__ uint4 normalized_x8(const GemvArgs& a, int m, int k, const float* x_f32, const bf16* norm_w,
                                               const float* rstd) {
    const float4* x4 = reinterpret_cast<const float4*>(x_f32 + (size_t)m * a.K + k);
    const float4 lo = x4[0], hi = x4[1];
    const uint4 wp = *reinterpret_cast<const uint4*>(norm_w + k);
    return util::rmsnorm_bf16x8(lo, hi, rstd[m], wp);
}

// This thread's share of a cp.async copy of `bytes` (a multiple of 16) into shared memory.
__device__ __forceinline__ void copy_to_smem_async(void* dst, const void* src, int bytes) {
    for (int i = threadIdx.x; i < bytes / 16; i += kThreads)
        ptx::cp_async_16(static_cast<char*>(dst) + 16 * i, static_cast<const char*>(src) + 16 * i, true);
    ptx::cp_async_commit();
}

// Stages x[:, k0 : k0 + len) into xs [M][chunk] as the bf16 the matmul consumes (len % 8 == 0).
// Plain rows go by cp.async, every copy of a thread in flight at once and nothing held in
// registers: x comes from L2 after the previous kernel, and a load-store loop would wait out one
// round trip per 16 bytes before issuing the next. Normalized rows are read from x_f32 / norm_w:
// global memory, or for long rows (norm_in_smem) the shared-memory copies cp.async made of them.
template <int M, bool NORM>
__device__ __forceinline__ void stage_x_vec(const GemvArgs& a, uint16_t* xs, int k0, int len, const float* x_f32,
                                            const bf16* norm_w, const float* rstd) {
    if constexpr (!NORM) {
        for (int m = 0; m < M; ++m)
            copy_to_smem_async(xs + (size_t)m * a.chunk, a.x + (size_t)m * a.K + k0, len * (int)sizeof(uint16_t));
        ptx::cp_async_wait<0>();
    } else {
        const int n8 = len / 8, total = M * n8;
        for (int i = threadIdx.x; i < total; i += kThreads) {
            const int m = i / n8, v = i - m * n8;
            reinterpret_cast<uint4*>(xs + (size_t)m * a.chunk)[v] = normalized_x8(a, m, k0 + 8 * v, x_f32, norm_w, rstd);
        }
    }
}

template <bool NORM>
__device__ __forceinline__ uint16_t staged_x1(const GemvArgs& a, int m, int k, const float* rstd) {
    const size_t i = (size_t)m * a.K + k;
    if (!NORM) return reinterpret_cast<const uint16_t*>(a.x)[i];
    const float y = a.x_f32[i] * rstd[m] * __bfloat162float(a.norm_w[k]);
    return __bfloat16_as_ushort(__float2bfloat16_rn(y));
}

// One CTA: WARPS warps x UNITS units each; LOADS 16-byte W loads per lane in flight.
template <int M, int UNITS, Pairing P, bool VEC, bool NORM, int LOADS = tuning::kGemvLoads>
__global__ void __launch_bounds__(kThreads) gemv_kernel(GemvArgs a) {
    constexpr int R = P != Pairing::None ? 2 * UNITS : UNITS;  // W rows streamed together
    constexpr int U = R >= LOADS ? 1 : LOADS / R;               // loads per row in flight: R * U = LOADS per lane
    const int K = a.K, chunk = a.chunk;

    uint16_t* xs = ptx::dynamic_smem<uint16_t>();  // [M][chunk] bf16 bits
    __shared__ float rstd[M];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int unit0 = (blockIdx.x * kWarps + warp) * UNITS;

    // Units past the end keep a valid row pointer (row 0) but never load or store.
    const uint16_t* rows[R];
    bool row_ok[R];
    const uint16_t* wbits = reinterpret_cast<const uint16_t*>(a.W);
#pragma unroll
    for (int u = 0; u < UNITS; ++u) {
        const int col = unit0 + u;
        const bool ok = col < a.n_units;
        const int2 r = unit_rows<P>(ok ? col : 0, a.half_n);
        if (P != Pairing::None) {
            rows[2 * u] = wbits + (size_t)r.x * K;
            rows[2 * u + 1] = wbits + (size_t)r.y * K;
            row_ok[2 * u] = row_ok[2 * u + 1] = ok;
        } else {
            rows[u] = wbits + (size_t)r.x * K;
            row_ok[u] = ok;
        }
    }

    // W[r][u]: the loads of one step, U per row, 32 * 8 * U contiguous elements per row per warp.
    uint4 w[R][U];
    auto load_w = [&](int k0, int v0, int n8) {
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int v = v0 + 32 * u;
#pragma unroll
            for (int r = 0; r < R; ++r)
                w[r][u] = (v < n8 && row_ok[r]) ? ptx::ld_stream_16(rows[r] + k0 + 8 * v) : make_uint4(0u, 0u, 0u, 0u);
        }
    };
    // norm_in_smem: x_f32 [M, K] and norm_w [K] copied into shared memory after the M x chunk
    // staging area; the norm weights never depend on the previous kernel, so their copy starts
    // before the wait.
    float* x_raw = reinterpret_cast<float*>(xs + (size_t)M * chunk);
    bf16* w_raw = reinterpret_cast<bf16*>(x_raw + (size_t)M * K);
    const bool norm_in_smem = NORM && VEC && a.norm_in_smem;
    if (norm_in_smem) copy_to_smem_async(w_raw, a.norm_w, K * (int)sizeof(bf16));
    pdl_launch_dependents();
    // The first step (chunk 0, v0 = lane) loads before the wait; the loop skips its own load once.
    // The loads sit in a branch of their own (lanes with a first step): issued unconditionally,
    // ptxas sinks them past griddepcontrol.wait to their first use and the weight stream no longer
    // overlaps the previous kernel (tests/test_cuda_sass.py checks the order in the binary).
    const int first_n8 = min(chunk, K) / 8;
    bool preloaded = false;
    if (VEC && lane < first_n8) {
        load_w(0, lane, first_n8);
        preloaded = true;
    }
    pdl_wait();
    // AddResidual: the lane that will store (m, u) reads its residual now, so the epilogue is an
    // add and a store instead of an L2 round trip at the end of every warp (the kernel's tail).
    constexpr bool kEarlyResidual = P == Pairing::None && M * UNITS <= 32;
    const bool early_residual = kEarlyResidual && a.ep == Epilogue::AddResidual;
    const int my_m = lane / UNITS, my_u = lane % UNITS;
    float residual = 0.f;
    if (early_residual && my_m < M && unit0 + my_u < a.n_units)
        residual = __ldcg(a.out.residual + (size_t)my_m * a.out.ld_out + unit0 + my_u);

    const float* x_norm = a.x_f32;
    const bf16* w_norm = a.norm_w;
    if (norm_in_smem) {
        copy_to_smem_async(x_raw, a.x_f32, M * K * (int)sizeof(float));
        ptx::cp_async_wait<0>();
        __syncthreads();
        x_norm = x_raw;
        w_norm = w_raw;
    }
    if (NORM) row_rstd<M, VEC>(x_norm, K, a.eps, rstd);

    float acc[M][R];
#pragma unroll
    for (int m = 0; m < M; ++m)
#pragma unroll
        for (int r = 0; r < R; ++r) acc[m][r] = 0.f;

    for (int k0 = 0; k0 < K; k0 += chunk) {
        const int len = min(chunk, K - k0);
        __syncthreads();  // every warp is done with the previous chunk of xs (and rstd is written)
        if (VEC) {
            stage_x_vec<M, NORM>(a, xs, k0, len, x_norm, w_norm, rstd);
        } else {
            for (int i = threadIdx.x; i < M * len; i += kThreads) {
                const int m = i / len, k = i - m * len;
                xs[(size_t)m * chunk + k] = staged_x1<NORM>(a, m, k0 + k, rstd);
            }
        }
        __syncthreads();

        if (VEC) {
            const int n8 = len / 8;
            const uint4* xs8 = reinterpret_cast<const uint4*>(xs);
            const int chunk8 = chunk / 8;
            for (int v0 = lane; v0 < n8; v0 += 32 * U) {
                if (!preloaded) load_w(k0, v0, n8);
                preloaded = false;
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
            if (lane == (m * UNITS + u) % 32 && col < a.n_units) {
                if (P == Pairing::Rope) {
                    const int head = col / a.half_n;
                    util::store_rope_kv(a.out.rope, m, head, col - head * a.half_n, acc[m][2 * u],
                                        acc[m][2 * u + 1]);
                } else if (P == Pairing::SwiGLU) {
                    util::store_swiglu(a.out, (size_t)m * a.out.ld_out + col, acc[m][2 * u], acc[m][2 * u + 1]);
                } else if (early_residual) {
                    a.out.residual[(size_t)m * a.out.ld_out + col] = residual + acc[m][u];
                } else {
                    util::store_result(a.ep, a.out, (size_t)m * a.out.ld_out + col, acc[m][u]);
                }
            }
        }
    }
}

// ---- the tensor-core form (M = 2..16 rows) ----------------------------------------------------
// Above a few rows the FMAs above, not HBM, bind: at M = 16 a warp issues 16 x-vector reads and
// 128 FMAs per 16-byte W load. Here mma.sync m16n8k16 does that arithmetic with W as the A operand
// (16 W rows of a tile) and x as B (its M rows padded to one or two n8 tiles), so the kernel stays
// a weight stream at any M <= 16.
//   * One CTA per 16-row tile; its 8 warps split K, each streaming 512 contiguous bytes of each of
//     the tile's rows per step (8 slices of 32 columns, two 16-byte loads per slice per lane: rows
//     g and g + 8 of the tile, g = lane / 4). The loads go straight into the A fragments: a dot
//     product does not care which k meets which, so a lane's 8 consecutive columns are read as
//     logical k 2t, 2t+1, 2t+8, 2t+9 of one mma and the same of the next, and x is read from
//     shared memory with the same mapping (16 bytes of row g a lane, conflict-free with the row
//     padding).
//   * Paired epilogues keep their pairs in one lane: a SwiGLU tile is gate rows j..j+7 over up rows
//     H+j..H+j+7, a RopeKV tile 8 dims of one head over their rotation partners, so C's rows g and
//     g + 8 (the same lane) are exactly the pair.
//   * The 8 warps' partial tiles are added in shared memory in warp order (deterministic), then
//     warp nt of the CTA stores n8 tile nt. The first step's loads go before the PDL wait.
//   * x comes as plain bf16 rows, staged by cp.async (one L2 round trip a step for all M rows);
//     normalized inputs are written by rmsnorm_residual first (rmsnorm_matmul_bf16 says why).
constexpr int kMmaWarps = 8;
constexpr int kMmaThreads = kMmaWarps * 32;
constexpr int kMmaSlices = 8;                              // 32-column slices a warp loads per step
constexpr int kMmaStepK = kMmaWarps * kMmaSlices * 32;     // 2048 columns of x staged per step
constexpr int kMmaStride = kMmaStepK + 32;                 // x row stride (elements): 64 bytes mod 128

template <int NT>
constexpr size_t mma_smem_bytes() {
    return (size_t)8 * NT * kMmaStride * sizeof(uint16_t) + (size_t)kMmaWarps * NT * 4 * 32 * sizeof(float);
}

// Stages x[:, k0 : k0 + 8 n8) of the M rows into xs (row stride kMmaStride) by cp.async, every
// row's copy in flight at once, zero past K (W is zero there, and 0 * a stale inf would not be).
// Thread t owns the 8 columns 8t: one step.
template <int XROWS>
__device__ __forceinline__ void stage_x_mma(const GemvArgs& a, uint16_t* xs, int k0, int n8) {
    static_assert(kMmaThreads * 8 == kMmaStepK, "one 16-byte column group per thread per step");
    const int v = threadIdx.x;
    const bool in_k = v < n8;
    uint16_t* dst = xs + 8 * v;
#pragma unroll
    for (int m = 0; m < XROWS; ++m)
        if (m < a.M) ptx::cp_async_16(dst + (size_t)m * kMmaStride, a.x + (size_t)m * a.K + (in_k ? k0 + 8 * v : 0), in_k);
    ptx::cp_async_commit();
    ptx::cp_async_wait<0>();
}

template <int NT, Pairing P>
__global__ void __launch_bounds__(kMmaThreads) gemv_mma_kernel(GemvArgs a) {
    constexpr int XROWS = 8 * NT;
    const int K = a.K, M = a.M;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    uint16_t* xs = ptx::dynamic_smem<uint16_t>();                           // [XROWS][kMmaStride]
    float* partial = reinterpret_cast<float*>(xs + (size_t)XROWS * kMmaStride);  // [warp][NT][4][lane]

    // This lane's W rows: tile rows g (lo) and g + 8 (hi); for pairs, unit u's two rows.
    const int u = 8 * blockIdx.x + g;
    int lo, hi;
    bool ok_lo, ok_hi;
    if (P == Pairing::None) {
        lo = 16 * blockIdx.x + g;
        hi = lo + 8;
        ok_lo = lo < a.n_units;
        ok_hi = hi < a.n_units;
    } else {
        const int2 r = unit_rows<P>(u < a.n_units ? u : 0, a.half_n);
        lo = r.x;
        hi = r.y;
        ok_lo = ok_hi = u < a.n_units;
    }
    const uint16_t* wbits = reinterpret_cast<const uint16_t*>(a.W);
    const uint16_t* row_lo = wbits + (size_t)(ok_lo ? lo : 0) * K;
    const uint16_t* row_hi = wbits + (size_t)(ok_hi ? hi : 0) * K;

    // Slice j of this warp in the step at k0: columns k0 + (warp * kMmaSlices + j) * 32 + [0, 32),
    // of which this lane holds 8 from 8t.
    uint4 wl[kMmaSlices], wh[kMmaSlices];
    auto load_w = [&](int k0) {
#pragma unroll
        for (int j = 0; j < kMmaSlices; ++j) {
            const int k = k0 + (warp * kMmaSlices + j) * 32 + 8 * t;
            const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
            wl[j] = ok_lo && k < K ? ptx::ld_stream_16(row_lo + k) : zero;
            wh[j] = ok_hi && k < K ? ptx::ld_stream_16(row_hi + k) : zero;
        }
    };
    // Rows of x past M are zero for every step (x never depends on this before the wait).
    for (int i = threadIdx.x; i < (XROWS - M) * kMmaStride / 8; i += kMmaThreads)
        reinterpret_cast<uint4*>(xs + (size_t)M * kMmaStride)[i] = make_uint4(0u, 0u, 0u, 0u);
    load_w(0);
    bool preloaded = true;
    pdl_wait();
    pdl_launch_dependents();

    float acc[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[nt][i] = 0.f;

    for (int k0 = 0; k0 < K; k0 += kMmaStepK) {
        if (!preloaded) load_w(k0);
        preloaded = false;
        const int n8 = min(kMmaStepK, K - k0) / 8;
        __syncthreads();  // the previous step's reads of xs are done
        stage_x_mma<XROWS>(a, xs, k0, n8);
        __syncthreads();
#pragma unroll
        for (int j = 0; j < kMmaSlices; ++j) {
            const int col = (warp * kMmaSlices + j) * 32;
            if (k0 + col >= K) break;  // the rest of this warp's slices are past K
            const uint32_t a0[4] = {wl[j].x, wh[j].x, wl[j].y, wh[j].y};
            const uint32_t a1[4] = {wl[j].z, wh[j].z, wl[j].w, wh[j].w};
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
                const uint4 xv = *reinterpret_cast<const uint4*>(xs + (size_t)(8 * nt + g) * kMmaStride + col + 8 * t);
                const uint32_t b0[2] = {xv.x, xv.y}, b1[2] = {xv.z, xv.w};
                ptx::mma_bf16_16816(acc[nt], a0, b0);
                ptx::mma_bf16_16816(acc[nt], a1, b1);
            }
        }
    }

    const util::MmaTileRows rows[1] = {{u, lo, hi, ok_lo, ok_hi}};
    util::store_mma_gemv_tiles<P, 1, NT, kMmaWarps>(acc, partial, warp, lane, M, rows, a.half_n, a.ep, a.out);
}

// The x slice per CTA, shrunk where shared memory (not registers or threads) would split a grid
// that fits on the GPU at once into a second, mostly idle wave. Llama-3-8B's w2 at M = 1:
// 1024 CTAs, whole 28 KB rows of x allow 7 CTAs per SM (924 resident), registers allow 8 (1056):
// a 16 KB slice keeps all 1024 streaming together.
int resident_chunk(void (*kernel)(GemvArgs), int M, int chunk, int blocks) {
    auto resident = [&](int c) { return resident_ctas(kernel, kThreads, (size_t)M * c * sizeof(uint16_t)); };
    int result = chunk;
    if (chunk > 256 && resident(256) >= blocks)
        while (result > 256 && resident(result) < blocks) result = std::max(256, result / 2 / 256 * 256);
    return result;
}

// The M = 1 kernel: tuning::kGemvM1Loads W loads per lane in flight, unless their registers
// would split a grid that fits the GPU at once with tuning::kGemvLoads into two waves (Llama-3-8B's
// wqkv, wo and w2: 768-1024 CTAs).
template <int UNITS, Pairing P, bool NORM>
auto pick_m1_kernel(int blocks) {
    const auto deep = gemv_kernel<1, UNITS, P, true, NORM, tuning::kGemvM1Loads>;
    const auto shallow = gemv_kernel<1, UNITS, P, true, NORM, tuning::kGemvLoads>;
    const size_t least_smem = 256 * sizeof(uint16_t);  // the smallest x slice resident_chunk goes to
    return resident_ctas(deep, kThreads, least_smem) < blocks && resident_ctas(shallow, kThreads, least_smem) >= blocks
               ? shallow
               : deep;
}

template <int M, Pairing P, bool VEC, bool NORM>
void launch_variant(GemvArgs a, cudaStream_t stream) {
    constexpr int units = units_per_warp(M, P);
    const int blocks = CEIL_DIV(a.n_units, kWarps * units);
    auto kernel = gemv_kernel<M, units, P, VEC, NORM>;
    if constexpr (M == 1 && VEC) kernel = pick_m1_kernel<units, P, NORM>(blocks);
    a.chunk = resident_chunk(kernel, M, a.chunk, blocks);
    size_t smem = (size_t)M * a.chunk * sizeof(uint16_t);
    // The normalized prologue reads x and norm_w from shared-memory copies where the staging loop
    // would take 4+ round trips per thread (M x K >= 4096: the Llama-3-8B wqkv, w13 and LM head at
    // M = 1; at K = 2048 the loop's two round trips are cheaper), whole rows fit in kXChunkBytes
    // and the copies cost no resident CTA.
    const size_t norm_bytes = (size_t)a.K * (M * sizeof(float) + sizeof(bf16));
    a.norm_in_smem = NORM && VEC && M * a.K >= 4 * 8 * kThreads && a.chunk == a.K &&
                     norm_bytes <= (size_t)kXChunkBytes &&
                     resident_ctas(kernel, kThreads, smem + norm_bytes) >=
                         std::min(blocks, resident_ctas(kernel, kThreads, smem));
    if (a.norm_in_smem) smem += norm_bytes;
    launch_pdl(kernel, dim3(blocks), dim3(kThreads), smem, stream, a);
    CUDA_CHECK_LAUNCH("gemv_kernel");
}

template <int NT, Pairing P>
void launch_mma(const GemvArgs& a, cudaStream_t stream) {
    const auto kernel = gemv_mma_kernel<NT, P>;
    constexpr size_t smem = mma_smem_bytes<NT>();
    allow_dynamic_smem(kernel, smem);
    const int tiles = P == Pairing::None ? CEIL_DIV(a.n_units, 16) : CEIL_DIV(a.n_units, 8);
    launch_pdl(kernel, dim3(tiles), dim3(kMmaThreads), smem, stream, a);
    CUDA_CHECK_LAUNCH("gemv_mma_kernel");
}

template <Pairing P>
void launch_mma_rows(const GemvArgs& a, cudaStream_t stream) {
    if (a.M <= 8) launch_mma<1, P>(a, stream);
    else launch_mma<2, P>(a, stream);
}

template <int M, Pairing P>
void launch_flags(bool vec, bool norm, const GemvArgs& a, cudaStream_t stream) {
    if (vec) {
        if (norm) launch_variant<M, P, true, true>(a, stream);
        else launch_variant<M, P, true, false>(a, stream);
    } else {
        if (norm) launch_variant<M, P, false, true>(a, stream);
        else launch_variant<M, P, false, false>(a, stream);
    }
}

// Runtime M -> template M (1..kMaxRows).
template <int M>
void launch_rows(int rows, Pairing pairing, bool vec, bool norm, const GemvArgs& a, cudaStream_t stream) {
    if (rows != M) {
        if constexpr (M < kMaxRows) launch_rows<M + 1>(rows, pairing, vec, norm, a, stream);
        return;
    }
    switch (pairing) {
        case Pairing::None: launch_flags<M, Pairing::None>(vec, norm, a, stream); break;
        case Pairing::SwiGLU: launch_flags<M, Pairing::SwiGLU>(vec, norm, a, stream); break;
        case Pairing::Rope: launch_flags<M, Pairing::Rope>(vec, norm, a, stream); break;
    }
}

// GemvPath::Auto: from tuning::kGemvTensorCoreMinRows rows on, the tensor cores.
bool takes_tensor_cores(GemvPath path, int M) {
    return path == GemvPath::TensorCores || (path == GemvPath::Auto && M >= tuning::kGemvTensorCoreMinRows);
}

// The shared launcher of gemv_bf16 (x bf16) and the fused-norm path (x_f32 + norm_w).
void launch_gemv(const char* op, const bf16* x, const float* x_f32, const bf16* norm_w, float eps,
                 const bf16* W, int M, int N, int K, Epilogue ep, const EpilogueArgs& args_in,
                 GemvPath path, cudaStream_t stream) {
    const bool norm = x_f32 != nullptr;
    EpilogueArgs args = args_in;
    // check_matmul only looks at x's alignment; the normalized path hands it the fp32 pointer.
    const bf16* x_any = norm ? reinterpret_cast<const bf16*>(x_f32) : x;
    const int width = util::check_matmul(op, x_any, W, M, N, K, ep, args, /*allow_rope=*/true);
    BRRR_CHECK(M <= kMaxRows, op << ": M=" << M << " rows; the GEMV takes at most " << kMaxRows
                                 << " (use matmul_bf16 or gemm_bf16)");
    if (norm) {
        BRRR_CHECK(norm_w != nullptr, op << ": norm_w must be a device pointer, got null");
        BRRR_CHECK(eps > 0.f, op << ": eps must be > 0, got " << eps);
    }
    if (M == 0) return;
    const bool vec = K % 8 == 0 && util::aligned_to(W, 16) &&
                     (norm ? util::aligned_to(x_f32, 16) && util::aligned_to(norm_w, 16)
                           : util::aligned_to(x, 16));
    // Whole rows of x when they fit, else the largest multiple of 256 (one warp-wide vector step).
    const int max_elems = kXChunkBytes / (int)(sizeof(uint16_t) * M);
    GemvArgs a;
    a.M = M;
    a.x = x;
    a.x_f32 = x_f32;
    a.norm_w = norm_w;
    a.eps = eps;
    a.W = W;
    a.n_units = width;
    a.half_n = ep == Epilogue::RopeKV ? args.rope.head_dim / 2 : N / 2;
    a.K = K;
    a.chunk = K <= max_elems ? K : max_elems / 256 * 256;
    a.ep = ep;
    a.out = args;
    a.norm_in_smem = false;  // where it pays, launch_variant decides
    const Pairing pairing = util::pairing_of(ep);
    // The tensor-core form takes plain bf16 rows (rmsnorm_matmul_bf16 normalizes them first), the
    // vector path and, for RopeKV, whole 8-dim groups of a head; elsewhere the CUDA-core form runs
    // whatever was asked.
    const bool mma_fits = !norm && vec && device_facts().major >= 8 && (pairing != Pairing::Rope || a.half_n % 8 == 0);
    if (!(mma_fits && takes_tensor_cores(path, M))) {
        launch_rows<1>(M, pairing, vec, norm, a, stream);
        return;
    }
    switch (pairing) {
        case Pairing::None: launch_mma_rows<Pairing::None>(a, stream); break;
        case Pairing::SwiGLU: launch_mma_rows<Pairing::SwiGLU>(a, stream); break;
        case Pairing::Rope: launch_mma_rows<Pairing::Rope>(a, stream); break;
    }
}

}  // namespace

void gemv_bf16(const bf16* x, const bf16* W, int M, int N, int K, Epilogue ep,
               const EpilogueArgs& args, cudaStream_t stream, GemvPath path) {
    launch_gemv("gemv_bf16", x, nullptr, nullptr, 0.f, W, M, N, K, ep, args, path, stream);
}

void rmsnorm_matmul_bf16(const float* x, const bf16* norm_w, float eps, const bf16* W, int M, int N,
                         int K, Epilogue ep, const EpilogueArgs& args, bf16* xn, cudaStream_t stream) {
    BRRR_CHECK(x != nullptr, "rmsnorm_matmul_bf16: x must be a device pointer, got null");
    // Rows bound for the tensor cores are normalized into xn by their own kernel: normalizing in
    // every CTA, as the CUDA-core GEMV does, re-reads all M fp32 rows per 16 W rows there, which
    // at M = 16 is 2x the weight bytes again through L2. Without an xn scratch they take the fused
    // CUDA-core form.
    const bool fuse = !takes_tensor_cores(GemvPath::Auto, M);
    if (M <= kMaxRows && (fuse || xn == nullptr)) {
        launch_gemv("rmsnorm_matmul_bf16", nullptr, x, norm_w, eps, W, M, N, K, ep, args, GemvPath::Auto, stream);
        return;
    }
    BRRR_CHECK(xn != nullptr, "rmsnorm_matmul_bf16: M=" << M << " > " << kMaxRows
                                                       << " needs the xn scratch [M, K]; got null");
    rmsnorm_residual(const_cast<float*>(x), nullptr, norm_w, xn, M, K, eps, stream);
    if (M <= kMaxRows)
        launch_gemv("rmsnorm_matmul_bf16", xn, nullptr, nullptr, 0.f, W, M, N, K, ep, args, GemvPath::Auto, stream);
    else
        gemm_bf16(xn, W, M, N, K, ep, args, stream);
}

}  // namespace cuda
}  // namespace brrr
