// gemv_math.cuh — the per-row arithmetic of the decode GEMV (gemv.cu) that the persistent decode
// kernel (decode_persistent.cu) repeats bit for bit: which W rows a unit streams, the RMSNorm's
// per-thread sum of squares, and the normalized bf16 x the matmul consumes. A batch-1 step runs the
// persistent kernel and the same sequence inside a batch runs gemv.cu, and their outputs must not
// differ, so neither kernel writes this arithmetic itself.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/kernel_util.cuh"

namespace brrr {
namespace cuda {
namespace gemv_math {

// Which W rows a unit (one output column, or one pair) streams.
enum class Pairing { None, SwiGLU, Rope };

// First W row of unit c, and its partner row for paired units: SwiGLU pairs gate j with up
// half_n + j; Rope pairs dim i with dim i + half_n (= hd / 2) of the same head of q|k|v.
__host__ __device__ __forceinline__ int2 unit_rows(Pairing p, int c, int half_n) {
    if (p == Pairing::SwiGLU) return make_int2(c, c + half_n);
    if (p == Pairing::Rope) {
        const int head = c / half_n, i = c - head * half_n;
        const int r0 = head * 2 * half_n + i;
        return make_int2(r0, r0 + half_n);
    }
    return make_int2(c, c);
}

// Thread t's share of sum(x^2) over a row of K fp32 values (K % 4 == 0) when NT threads share the
// row: the 4-float chunks t, t + NT, ... in order. Callers then add the warps' butterfly sums in
// warp order, so a row's sum depends only on NT.
template <int NT, bool L2_ONLY>
__device__ __forceinline__ float row_sq_sum_vec(const float* __restrict__ x, int K, int t) {
    const float4* row = reinterpret_cast<const float4*>(x);
    float sum = 0.f;
    for (int i = t; i < K / 4; i += NT) {
        const float4 v = L2_ONLY ? __ldcg(row + i) : row[i];
        sum += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    }
    return sum;
}

// 1 / RMS of a row from its sum of squares.
__device__ __forceinline__ float row_rstd_from_sum(float total, int K, float eps) {
    return rsqrtf(total / (float)K + eps);
}

// bf16(x * rstd * w) for eight consecutive values: what rmsnorm_residual would have written and
// the matmul consumes (lo, hi: x[k .. k + 7], wp: norm_w[k .. k + 7]).
__device__ __forceinline__ uint4 normalize_x8(float4 lo, float4 hi, uint4 wp, float r) {
    uint4 out;
    out.x = util::pack_bf16x2(lo.x * r * util::bf16_lo(wp.x), lo.y * r * util::bf16_hi(wp.x));
    out.y = util::pack_bf16x2(lo.z * r * util::bf16_lo(wp.y), lo.w * r * util::bf16_hi(wp.y));
    out.z = util::pack_bf16x2(hi.x * r * util::bf16_lo(wp.z), hi.y * r * util::bf16_hi(wp.z));
    out.w = util::pack_bf16x2(hi.z * r * util::bf16_lo(wp.w), hi.w * r * util::bf16_hi(wp.w));
    return out;
}

}  // namespace gemv_math
}  // namespace cuda
}  // namespace brrr
