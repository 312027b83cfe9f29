// norm.cu — RMSNorm on the fp32 residual stream, with an optional residual add fused in front.
//
//   x[m, :] += residual[m, :]                       (only when residual != nullptr; x updated in place;
//                                                    residual fp32, or bf16: a tensor-parallel prefill's
//                                                    summed partial products, widened exactly)
//   y[m, :]  = bf16(x[m, :] * rsqrt(mean(x[m, :]^2) + eps) * w)     x [M, D] f32, w [D] bf16, y [M, D] bf16
//
// One block per row. Statistics stay in fp32 and y is rounded to bf16 once, at the end. When D is a
// multiple of 8 every thread moves 16-byte chunks (two float4 of x, eight bf16 of w and y); the
// second pass re-reads x, which the first pass just pulled into L1/L2, instead of holding a
// D-sized row in registers of unknown size. At decode (M = 1 or a few rows) this kernel is pure
// latency, so the block has as many threads as the row has chunks (up to 1024): one load round
// trip per pass instead of a loop.
#include <algorithm>

#include "cuda/check.cuh"
#include "cuda/kernel_util.cuh"
#include "cuda/launch.cuh"
#include "cuda/ops.h"

namespace brrr {
namespace cuda {

namespace {

constexpr int kMaxThreads = 1024;

// Threads for `chunks` units of work: a whole number of warps, at most one unit short of enough.
int threads_for(int chunks) { return std::min(kMaxThreads, std::max(32, CEIL_DIV(chunks, 32) * 32)); }

// Eight residual values at element 8 i, as two float4.
__device__ __forceinline__ void load8(const float* r, int i, float4& a, float4& b) {
    const float4* r4 = reinterpret_cast<const float4*>(r);
    a = r4[2 * i];
    b = r4[2 * i + 1];
}
__device__ __forceinline__ void load8(const bf16* r, int i, float4& a, float4& b) {
    const uint4 raw = reinterpret_cast<const uint4*>(r)[i];
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
    const float2 p0 = __bfloat1622float2(h[0]), p1 = __bfloat1622float2(h[1]);
    const float2 p2 = __bfloat1622float2(h[2]), p3 = __bfloat1622float2(h[3]);
    a = make_float4(p0.x, p0.y, p1.x, p1.y);
    b = make_float4(p2.x, p2.y, p3.x, p3.y);
}
__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(bf16 v) { return __bfloat162float(v); }

template <typename Residual>
__global__ void rmsnorm_vec8_kernel(float* __restrict__ x, const Residual* __restrict__ residual,
                                    const bf16* __restrict__ w, bf16* __restrict__ y, int D,
                                    float eps) {
    pdl_wait();  // launched with PDL: x comes from the kernel before
    pdl_launch_dependents();
    const size_t row = (size_t)blockIdx.x * D;
    float4* x4 = reinterpret_cast<float4*>(x + row);
    const Residual* r = residual ? residual + row : nullptr;
    const uint4* w8 = reinterpret_cast<const uint4*>(w);
    uint4* y8 = reinterpret_cast<uint4*>(y + row);
    const int n_vec = D / 8;

    float sum_sq = 0.f;
    for (int i = threadIdx.x; i < n_vec; i += blockDim.x) {
        float4 a = x4[2 * i], b = x4[2 * i + 1];
        if (r) {
            float4 ra, rb;
            load8(r, i, ra, rb);
            a.x += ra.x; a.y += ra.y; a.z += ra.z; a.w += ra.w;
            b.x += rb.x; b.y += rb.y; b.z += rb.z; b.w += rb.w;
            x4[2 * i] = a;
            x4[2 * i + 1] = b;
        }
        sum_sq += a.x * a.x + a.y * a.y + a.z * a.z + a.w * a.w;
        sum_sq += b.x * b.x + b.y * b.y + b.z * b.z + b.w * b.w;
    }
    const float rstd = rsqrtf(util::block_sum(sum_sq) / (float)D + eps);

    for (int i = threadIdx.x; i < n_vec; i += blockDim.x) {
        const float4 a = x4[2 * i], b = x4[2 * i + 1];
        uint4 wp = w8[i];
        const __nv_bfloat162* wh = reinterpret_cast<const __nv_bfloat162*>(&wp);
        const float2 w0 = __bfloat1622float2(wh[0]), w1 = __bfloat1622float2(wh[1]);
        const float2 w2 = __bfloat1622float2(wh[2]), w3 = __bfloat1622float2(wh[3]);
        uint4 out;
        __nv_bfloat162* oh = reinterpret_cast<__nv_bfloat162*>(&out);
        oh[0] = __floats2bfloat162_rn(a.x * rstd * w0.x, a.y * rstd * w0.y);
        oh[1] = __floats2bfloat162_rn(a.z * rstd * w1.x, a.w * rstd * w1.y);
        oh[2] = __floats2bfloat162_rn(b.x * rstd * w2.x, b.y * rstd * w2.y);
        oh[3] = __floats2bfloat162_rn(b.z * rstd * w3.x, b.w * rstd * w3.y);
        y8[i] = out;
    }
}

template <typename Residual>
__global__ void rmsnorm_scalar_kernel(float* __restrict__ x, const Residual* __restrict__ residual,
                                      const bf16* __restrict__ w, bf16* __restrict__ y, int D,
                                      float eps) {
    pdl_wait();  // launched with PDL: x comes from the kernel before
    pdl_launch_dependents();
    const size_t row = (size_t)blockIdx.x * D;
    float sum_sq = 0.f;
    for (int i = threadIdx.x; i < D; i += blockDim.x) {
        float v = x[row + i];
        if (residual) {
            v += to_float(residual[row + i]);
            x[row + i] = v;
        }
        sum_sq += v * v;
    }
    const float rstd = rsqrtf(util::block_sum(sum_sq) / (float)D + eps);
    for (int i = threadIdx.x; i < D; i += blockDim.x)
        y[row + i] = __float2bfloat16_rn(x[row + i] * rstd * __bfloat162float(w[i]));
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

template <typename Residual>
void launch_rmsnorm(const char* op, float* x, const Residual* residual, const bf16* w, bf16* y, int M, int D,
                    float eps, cudaStream_t stream) {
    BRRR_CHECK(M >= 0 && D > 0, op << ": bad sizes M=" << M << " D=" << D);
    BRRR_CHECK(eps > 0.f, op << ": eps must be > 0, got " << eps);
    if (M == 0) return;
    const bool vec = D % 8 == 0 && aligned16(x) && aligned16(w) && aligned16(y) &&
                     (residual == nullptr || aligned16(residual));
    if (vec) {
        launch_pdl(rmsnorm_vec8_kernel<Residual>, dim3(M), dim3(threads_for(D / 8)), 0, stream, x, residual, w, y,
                   D, eps);
        CUDA_CHECK_LAUNCH("rmsnorm_vec8_kernel");
    } else {
        launch_pdl(rmsnorm_scalar_kernel<Residual>, dim3(M), dim3(threads_for(D)), 0, stream, x, residual, w, y, D,
                   eps);
        CUDA_CHECK_LAUNCH("rmsnorm_scalar_kernel");
    }
}

}  // namespace

void rmsnorm_residual(float* x, const float* residual, const bf16* w, bf16* y, int M, int D, float eps,
                      cudaStream_t stream) {
    launch_rmsnorm("rmsnorm_residual", x, residual, w, y, M, D, eps, stream);
}

void rmsnorm_add_bf16(float* x, const bf16* residual, const bf16* w, bf16* y, int M, int D, float eps,
                      cudaStream_t stream) {
    launch_rmsnorm("rmsnorm_add_bf16", x, residual, w, y, M, D, eps, stream);
}

}  // namespace cuda
}  // namespace brrr
