// embed.cu — token embedding lookup, and the per-slot token history the sampler's repetition
// penalty reads.
//
//   embed:          x[m, :] = float(table[tokens[m], :])     tokens [M], table [V, D] bf16, x [M, D] f32
//   record_tokens:  history[slots[m] * max_seq + positions[m]] = tokens[m]
//
// One block per row; rows whose D is a multiple of 8 move 16 bytes per thread per step (8 bf16 in,
// two float4 out). The host validates token ids before they reach the device; a bad id that slips
// through anyway turns the row into NaN instead of reading outside the table.
#include <cmath>

#include "cuda/check.cuh"
#include "cuda/ops.h"

namespace brrr {
namespace cuda {

namespace {

constexpr int kEmbedThreads = 128;

__global__ void embed_vec8_kernel(const int* __restrict__ tokens, const bf16* __restrict__ table,
                                  float* __restrict__ x, int V, int D) {
    const int m = blockIdx.x;
    const int tok = tokens[m];
    float* row_out = x + (size_t)m * D;
    const int n_vec = D / 8;
    if (tok < 0 || tok >= V) {
        for (int i = threadIdx.x; i < D; i += blockDim.x) row_out[i] = NAN;
        return;
    }
    const uint4* row_in = reinterpret_cast<const uint4*>(table + (size_t)tok * D);
    float4* out4 = reinterpret_cast<float4*>(row_out);
    for (int i = threadIdx.x; i < n_vec; i += blockDim.x) {
        uint4 packed = row_in[i];
        const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&packed);
        float2 a = __bfloat1622float2(h[0]), b = __bfloat1622float2(h[1]);
        float2 c = __bfloat1622float2(h[2]), d = __bfloat1622float2(h[3]);
        out4[2 * i] = make_float4(a.x, a.y, b.x, b.y);
        out4[2 * i + 1] = make_float4(c.x, c.y, d.x, d.y);
    }
}

__global__ void embed_scalar_kernel(const int* __restrict__ tokens, const bf16* __restrict__ table,
                                    float* __restrict__ x, int V, int D) {
    const int m = blockIdx.x;
    const int tok = tokens[m];
    float* row_out = x + (size_t)m * D;
    const bool valid = tok >= 0 && tok < V;
    for (int i = threadIdx.x; i < D; i += blockDim.x)
        row_out[i] = valid ? __bfloat162float(table[(size_t)tok * D + i]) : NAN;
}

__global__ void record_tokens_kernel(const int* __restrict__ tokens, const int* __restrict__ slots,
                                     const int* __restrict__ positions, int* __restrict__ history,
                                     int M, int max_batch, int max_seq) {
    const int m = blockIdx.x * blockDim.x + threadIdx.x;
    if (m >= M) return;
    const int slot = slots[m], pos = positions[m];
    if (slot < 0 || slot >= max_batch || pos < 0 || pos >= max_seq) return;
    history[(size_t)slot * max_seq + pos] = tokens[m];
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

}  // namespace

void embed(const int* tokens, const bf16* table, float* x, int M, int D, int V,
           cudaStream_t stream) {
    BRRR_CHECK(M >= 0 && D > 0 && V > 0, "embed: bad sizes M=" << M << " D=" << D << " V=" << V);
    if (M == 0) return;
    if (D % 8 == 0 && aligned16(table) && aligned16(x)) {
        embed_vec8_kernel<<<M, kEmbedThreads, 0, stream>>>(tokens, table, x, V, D);
        CUDA_CHECK_LAUNCH("embed_vec8_kernel");
    } else {
        embed_scalar_kernel<<<M, kEmbedThreads, 0, stream>>>(tokens, table, x, V, D);
        CUDA_CHECK_LAUNCH("embed_scalar_kernel");
    }
}

void record_tokens(const int* tokens, const int* slots, const int* positions, int* history, int M,
                   int max_batch, int max_seq, cudaStream_t stream) {
    BRRR_CHECK(M >= 0 && max_batch > 0 && max_seq > 0,
               "record_tokens: bad sizes M=" << M << " max_batch=" << max_batch
                                             << " max_seq=" << max_seq);
    if (M == 0) return;
    constexpr int threads = 128;
    record_tokens_kernel<<<CEIL_DIV(M, threads), threads, 0, stream>>>(
        tokens, slots, positions, history, M, max_batch, max_seq);
    CUDA_CHECK_LAUNCH();
}

}  // namespace cuda
}  // namespace brrr
