// init.cu — random weights made on the device, and fp32 -> bf16 conversion.
//
//   fill_normal_bf16:    p[i] = bf16(mean + std * z_i),  z_i ~ N(0, 1) from the stream `key`
//   convert_f32_to_bf16: dst[i] = bf16(src[i]) (round to nearest even)
//
// The normals come from a counter, not a stateful generator, by the CPU engine's rule: pair k =
// (z_2k, z_2k+1) is Box-Muller on splitmix64(key + 2k) and splitmix64(key + 2k + 1). Element i
// depends only on (key, i): the same key gives the same weights whatever the grid, the GPU or the
// backend, and an 8B-parameter model fills at memory speed without a byte crossing PCIe.
// The radius is computed in double as on the CPU: u1 goes down to 2^-53, and in fp32 any u1 below
// ~2^-25 rounds log's argument to 0 (a pair in ~3e7 became inf / NaN: a 1B-parameter model drew
// dozens). The angle is fp32 sincospi (accurate, immune to --use_fast_math): rounding 2 * u2 to
// fp32 moves a normal by up to ~3e-6 (times std), one bf16 rounding step in rare cases, a few
// steps for the rare values within ~1e-4 of zero.
#include <cmath>

#include "cuda/check.cuh"
#include "cuda/ops.h"
#include "model.h"

namespace brrr {
namespace cuda {

namespace {

constexpr int kInitThreads = 256;

__global__ void fill_normal_bf16_kernel(bf16* __restrict__ p, size_t n, uint64_t key, float mean,
                                        float std_dev) {
    const size_t n_pairs = (n + 1) / 2;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t k = (size_t)blockIdx.x * blockDim.x + threadIdx.x; k < n_pairs; k += stride) {
        const uint64_t r1 = splitmix64(key + 2 * (uint64_t)k);
        const uint64_t r2 = splitmix64(key + 2 * (uint64_t)k + 1);
        // u1 in (0, 1] with 53 bits, so log(u1) is finite.
        const double u1 = (double)((r1 >> 11) + 1) * 0x1p-53;
        const double u2 = (double)(r2 >> 11) * 0x1p-53;
        const float radius = (float)sqrt(-2.0 * log(u1));
        float s, c;
        sincospif((float)(2.0 * u2), &s, &c);
        p[2 * k] = __float2bfloat16_rn(mean + std_dev * (radius * c));
        if (2 * k + 1 < n) p[2 * k + 1] = __float2bfloat16_rn(mean + std_dev * (radius * s));
    }
}

__global__ void convert_f32_to_bf16_kernel(const float* __restrict__ src, bf16* __restrict__ dst,
                                           size_t n) {
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        dst[i] = __float2bfloat16_rn(src[i]);
}

// Enough blocks to fill every SM many times over, few enough that each thread loops a while.
int grid_for(size_t work_items) {
    const size_t blocks = CEIL_DIV(work_items, (size_t)kInitThreads);
    return (int)(blocks < 65536 ? (blocks > 0 ? blocks : 1) : 65536);
}

}  // namespace

void fill_normal_bf16(bf16* p, size_t n, uint64_t key, float mean, float std, cudaStream_t stream) {
    BRRR_CHECK(std::isfinite(mean) && std::isfinite(std) && std >= 0.f,
               "fill_normal_bf16: mean and std must be finite and std >= 0, got mean=" << mean
                                                                                     << " std=" << std);
    if (n == 0) return;
    fill_normal_bf16_kernel<<<grid_for((n + 1) / 2), kInitThreads, 0, stream>>>(p, n, key, mean, std);
    CUDA_CHECK_LAUNCH();
}

void convert_f32_to_bf16(const float* src, bf16* dst, size_t n, cudaStream_t stream) {
    if (n == 0) return;
    convert_f32_to_bf16_kernel<<<grid_for(n), kInitThreads, 0, stream>>>(src, dst, n);
    CUDA_CHECK_LAUNCH();
}

}  // namespace cuda
}  // namespace brrr
