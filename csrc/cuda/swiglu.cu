// swiglu.cu — the SwiGLU epilogue as its own kernel, for a w13 whose gate and up rows were stored
// by separate matmuls (a quantized w13 of two storage types):
//
//   gate_up [M, 2H] f32 (gate columns [0, H), up columns [H, 2H)) -> out [M, H] bf16,
//   out[m, j] = bf16(silu(gate[m, j]) * up[m, j]),
//
// through util::store_swiglu, the function the fused GEMV and GEMM epilogues call, so the two
// routes give the same bits for the same fp32 inputs. One thread per output element.
#include "cuda/check.cuh"
#include "cuda/kernel_util.cuh"
#include "cuda/ops.h"

namespace brrr {
namespace cuda {

namespace {

__global__ void swiglu_kernel(const float* __restrict__ gate_up, bf16* __restrict__ out, int M, int H) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)M * H) return;
    const size_t m = i / H, j = i - m * H;
    EpilogueArgs a;
    a.out_bf16 = out;
    util::store_swiglu(a, i, gate_up[m * 2 * H + j], gate_up[m * 2 * H + H + j]);
}

}  // namespace

void swiglu_f32(const float* gate_up, bf16* out, int M, int H, cudaStream_t stream) {
    BRRR_CHECK(gate_up != nullptr && out != nullptr, "swiglu_f32: gate_up and out must be device pointers, got null");
    BRRR_CHECK(M >= 0 && H >= 1, "swiglu_f32: M=" << M << ", H=" << H << " (need M >= 0, H >= 1)");
    if (M == 0) return;
    const size_t n = (size_t)M * H;
    swiglu_kernel<<<(unsigned)CEIL_DIV(n, (size_t)256), 256, 0, stream>>>(gate_up, out, M, H);
    CUDA_CHECK_LAUNCH("swiglu_kernel");
}

}  // namespace cuda
}  // namespace brrr
